#include <pscoro/summary.hpp>

#include <pscoro/data_formats.hpp>
#include <pscoro/error.hpp>

#include "metrics/cluster_view.hpp"
#include "summary.pb.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <filesystem>
#include <vector>

namespace pscoro {
namespace {

double seconds_since_epoch(std::chrono::system_clock::time_point t) {
  return std::chrono::duration<double>(t.time_since_epoch()).count();
}

std::string hostname() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "localhost";
  return name;
}

// TF's names: "<logdir>/events.out.tfevents.%010d.<host>" + ".<pid>.<uid>" (summary_ops_v2 adds them
// so that writers of one machine never share a file) + the suffix.
std::string event_file_name(const std::string& logdir, std::int64_t seconds, const std::string& suffix) {
  static std::atomic<std::uint64_t> writers{0};
  return (std::filesystem::path(logdir) / fmt::format("events.out.tfevents.{:010}.{}.{}.{}{}", seconds, hostname(),
                                                      ::getpid(), writers.fetch_add(1) + 1, suffix))
      .string();
}

// TF's default histogram buckets (tsl/lib/histogram/histogram.cc): limits growing by 10% from
// 1e-12 to 1e20, mirrored for negative values, with 0 between and ±DBL_MAX at the ends.
const std::vector<double>& default_bucket_limits() {
  static const std::vector<double> limits = [] {
    std::vector<double> positive;
    for (double v = 1.0e-12; v < 1.0e20; v *= 1.1) positive.push_back(v);
    positive.push_back(DBL_MAX);
    std::vector<double> all;
    all.reserve(2 * positive.size() + 1);
    for (auto it = positive.rbegin(); it != positive.rend(); ++it) all.push_back(-*it);
    all.push_back(0.0);
    all.insert(all.end(), positive.begin(), positive.end());
    return all;
  }();
  return limits;
}

template <class T>
void fill_histogram(tf::HistogramProto& proto, std::span<const T> values) {
  const auto& limits = default_bucket_limits();
  std::vector<double> counts(limits.size(), 0.0);
  double min = DBL_MAX, max = -DBL_MAX, num = 0, sum = 0, sum_squares = 0;
  for (const T raw : values) {
    const double v = static_cast<double>(raw);
    if (std::isnan(v)) continue;
    // As TF: bucket b holds limits[b-1] <= v < limits[b]; DBL_MAX and +inf go to the last one.
    const auto b = std::min<std::size_t>(
        static_cast<std::size_t>(std::upper_bound(limits.begin(), limits.end(), v) - limits.begin()),
        limits.size() - 1);
    counts[b] += 1.0;
    min = std::min(min, v);
    max = std::max(max, v);
    num += 1.0;
    sum += v;
    sum_squares += v * v;
  }
  proto.set_min(min);
  proto.set_max(max);
  proto.set_num(num);
  proto.set_sum(sum);
  proto.set_sum_squares(sum_squares);
  // TF's EncodeToProto: a run of empty buckets becomes one, at the run's last limit.
  for (std::size_t i = 0; i < counts.size();) {
    double end = limits[i];
    const double count = counts[i];
    ++i;
    if (count <= 0.0) {
      while (i < counts.size() && counts[i] <= 0.0) end = limits[i++];
    }
    proto.add_bucket_limit(end);
    proto.add_bucket(count);
  }
}

// An event of now at `step` with one summary value, tagged `tag`, for the caller to fill.
tf::Event event_with_value(std::string_view tag, std::int64_t step) {
  tf::Event event;
  event.set_wall_time(seconds_since_epoch(std::chrono::system_clock::now()));
  event.set_step(step);
  event.mutable_summary()->add_value()->set_tag(std::string(tag));
  return event;
}

}  // namespace

struct summary_writer::state {
  state(std::string file, summary_writer_options o)
      : options(std::move(o)), path(std::move(file)), records(path), last_flush(std::chrono::steady_clock::now()) {}

  void write(tf::Event& event) {
    if (closed) throw error(errc::failed_precondition, fmt::format("{}: the summary writer is closed", path));
    records.write(event.SerializeAsString());
    ++pending;
    // As TF's SummaryFileWriter: flushed when the queue is full or the last flush is old.
    if (pending > options.max_queue || std::chrono::steady_clock::now() - last_flush >= options.flush_interval) {
      flush();
    }
  }

  void flush() {
    if (closed || pending == 0) return;
    records.flush();
    pending = 0;
    last_flush = std::chrono::steady_clock::now();
  }

  summary_writer_options options;
  std::string path;
  tfrecord_writer records;
  std::size_t pending = 0;
  std::chrono::steady_clock::time_point last_flush;
  bool closed = false;
};

summary_writer::summary_writer(const std::string& logdir, summary_writer_options options) {
  std::error_code ec;
  std::filesystem::create_directories(logdir, ec);
  if (ec) throw error(errc::unavailable, fmt::format("{}: cannot create the log directory: {}", logdir, ec.message()));
  const auto now = std::chrono::system_clock::now();
  const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(now.time_since_epoch()).count();
  auto file = event_file_name(logdir, seconds, options.filename_suffix);
  state_ = std::make_unique<state>(std::move(file), std::move(options));
  // TF's EventsWriter starts every file with its version, at whole seconds, and flushes it at
  // once: a reader knows the file for an event file before any summary arrives.
  tf::Event first;
  first.set_wall_time(static_cast<double>(seconds));
  first.set_file_version("brain.Event:2");
  first.mutable_source_metadata()->set_writer("pscoro");
  state_->write(first);
  state_->flush();
}

summary_writer::~summary_writer() {
  if (!state_) return;
  try {
    close();
  } catch (const std::exception&) {
    // Quietly, as documented: close() is the call that reports.
  }
}

summary_writer::summary_writer(summary_writer&&) noexcept = default;
summary_writer& summary_writer::operator=(summary_writer&&) noexcept = default;

void summary_writer::scalar(std::string_view tag, double value, std::int64_t step) {
  auto event = event_with_value(tag, step);
  event.mutable_summary()->mutable_value(0)->set_simple_value(static_cast<float>(value));
  state_->write(event);
  // The page draws the curves of what the program writes (as float, as TensorBoard would).
  metrics::process_view().record_scalar(tag, step, static_cast<float>(value));
}

void summary_writer::histogram(std::string_view tag, std::span<const double> values, std::int64_t step) {
  auto event = event_with_value(tag, step);
  fill_histogram(*event.mutable_summary()->mutable_value(0)->mutable_histo(), values);
  state_->write(event);
}

void summary_writer::histogram(std::string_view tag, std::span<const float> values, std::int64_t step) {
  auto event = event_with_value(tag, step);
  fill_histogram(*event.mutable_summary()->mutable_value(0)->mutable_histo(), values);
  state_->write(event);
}

void summary_writer::flush() { state_->flush(); }

void summary_writer::close() {
  if (state_->closed) return;
  state_->flush();
  state_->closed = true;
  state_->records.close();
}

const std::string& summary_writer::path() const noexcept { return state_->path; }

}  // namespace pscoro

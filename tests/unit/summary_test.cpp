// TensorBoard event files: TF's name, the version record first, scalars and histograms back as
// written (read through pscoro's own TFRecord reader and TF's protos), flushing as TF does.
#include "test_support.hpp"

#include <pscoro/data_formats.hpp>
#include <pscoro/error.hpp>
#include <pscoro/summary.hpp>

#include "summary.pb.h"

#include <unistd.h>

#include <cfloat>
#include <filesystem>
#include <regex>

using namespace pscoro;

namespace {

// A log directory removed at the end of the test.
struct scratch_dir {
  std::filesystem::path dir = std::filesystem::temp_directory_path() /
                              ("pscoro-summary-" + std::to_string(::getpid()) + "-" + std::to_string(counter()++));
  ~scratch_dir() { std::filesystem::remove_all(dir); }
  static int& counter() {
    static int n = 0;
    return n;
  }
};

std::vector<tf::Event> read_events(const std::string& path) {
  std::vector<tf::Event> events;
  auto records = tfrecord({path}).make_iterator();
  while (auto record = records.next()) {
    tf::Event event;
    REQUIRE(event.ParseFromString(*record));
    events.push_back(std::move(event));
  }
  return events;
}

// The code of the pscoro error `f` throws.
template <class F>
std::error_code code_of(F f) {
  try {
    f();
  } catch (const error& e) {
    return e.code();
  }
  FAIL("no error");
  return {};
}

}  // namespace

TEST_CASE("an event file is named as TF 2 names it and starts with its version") {
  scratch_dir logs;
  const auto before = std::chrono::duration_cast<std::chrono::seconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  summary_writer writer((logs.dir / "train").string());
  const std::filesystem::path path = writer.path();
  CHECK(path.parent_path() == logs.dir / "train");
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const std::regex name(R"(events\.out\.tfevents\.(\d{10})\.(.+)\.(\d+)\.(\d+)\.v2)");
  std::smatch m;
  const auto file = path.filename().string();
  REQUIRE_MESSAGE(std::regex_match(file, m, name), file);
  CHECK(std::stoll(m[1]) >= before);
  CHECK(m[2] == std::string(host));
  CHECK(std::stoll(m[3]) == ::getpid());

  // The version record is on disk at once, before any summary.
  const auto events = read_events(writer.path());
  REQUIRE(events.size() == 1);
  CHECK(events[0].file_version() == "brain.Event:2");
  CHECK(events[0].wall_time() == static_cast<double>(std::stoll(m[1])));
  CHECK(events[0].step() == 0);
}

TEST_CASE("two writers of one process in one second write two files") {
  scratch_dir logs;
  summary_writer a(logs.dir.string());
  summary_writer b(logs.dir.string());
  CHECK(a.path() != b.path());
}

TEST_CASE("scalars come back with their tags, steps and values as float32") {
  scratch_dir logs;
  summary_writer writer(logs.dir.string());
  writer.scalar("train/loss", 0.5, 1);
  writer.scalar("train/loss", 0.25, 2);
  writer.scalar("train/learning_rate", 0.1, 2);
  writer.close();
  const auto events = read_events(writer.path());
  REQUIRE(events.size() == 4);
  const struct {
    const char* tag;
    std::int64_t step;
    float value;
  } expected[] = {{"train/loss", 1, 0.5f}, {"train/loss", 2, 0.25f}, {"train/learning_rate", 2, 0.1f}};
  for (std::size_t i = 0; i < 3; ++i) {
    const auto& e = events[i + 1];
    CHECK(e.step() == expected[i].step);
    CHECK(e.wall_time() >= events[0].wall_time());
    REQUIRE(e.summary().value_size() == 1);
    CHECK(e.summary().value(0).tag() == expected[i].tag);
    CHECK(e.summary().value(0).simple_value() == expected[i].value);
  }
}

TEST_CASE("events wait for max_queue before they reach the file, and flush() pushes them") {
  scratch_dir logs;
  summary_writer writer(logs.dir.string(), {.max_queue = 3, .flush_interval = std::chrono::hours(1)});
  writer.scalar("a", 1, 1);
  writer.scalar("a", 2, 2);
  writer.scalar("a", 3, 3);
  CHECK(read_events(writer.path()).size() == 1);
  writer.scalar("a", 4, 4);  // a fourth pending event: more than max_queue
  CHECK(read_events(writer.path()).size() == 5);
  writer.scalar("a", 5, 5);
  CHECK(read_events(writer.path()).size() == 5);
  writer.flush();
  CHECK(read_events(writer.path()).size() == 6);
}

TEST_CASE("a histogram has TF's statistics and buckets, empty runs merged") {
  scratch_dir logs;
  summary_writer writer(logs.dir.string());
  const std::vector<double> values{1.0, 1.0, -2.0, 0.0, 1e-20, std::nan(""), 3.5};
  writer.histogram("weights", values, 7);
  writer.close();
  const auto events = read_events(writer.path());
  REQUIRE(events.size() == 2);
  CHECK(events[1].step() == 7);
  const auto& h = events[1].summary().value(0).histo();
  CHECK(events[1].summary().value(0).tag() == "weights");
  CHECK(h.num() == 6);  // the NaN is left out
  CHECK(h.min() == -2.0);
  CHECK(h.max() == 3.5);
  CHECK(h.sum() == doctest::Approx(3.5 + 1e-20));
  CHECK(h.sum_squares() == doctest::Approx(1 + 1 + 4 + 12.25));
  REQUIRE(h.bucket_size() == h.bucket_limit_size());
  // Every value lies in its bucket: [previous limit, limit); the counts add up; no two empty
  // buckets follow each other (TF merges them); the last limit is DBL_MAX.
  double total = 0;
  for (int i = 0; i < h.bucket_size(); ++i) {
    total += h.bucket(i);
    if (i > 0) {
      CHECK(h.bucket_limit(i) > h.bucket_limit(i - 1));
      CHECK_FALSE((h.bucket(i) == 0 && h.bucket(i - 1) == 0));
    }
  }
  CHECK(total == 6);
  CHECK(h.bucket_limit(h.bucket_limit_size() - 1) == DBL_MAX);
  const auto count_in = [&](double v) {
    for (int i = 0; i < h.bucket_size(); ++i) {
      const double low = i == 0 ? -DBL_MAX : h.bucket_limit(i - 1);
      if (low <= v && v < h.bucket_limit(i)) return h.bucket(i);
    }
    return -1.0;
  };
  CHECK(count_in(1.0) == 2);
  CHECK(count_in(-2.0) == 1);
  CHECK(count_in(3.5) == 1);
  // 0 and 1e-20 share the bucket that starts at 0 and ends at 1e-12, TF's smallest limit.
  CHECK(count_in(0.0) == 2);
  // 1.0 is in (1.1^k 1e-12, 1.1^(k+1) 1e-12]: a bucket 10% wide.
  for (int i = 1; i < h.bucket_size(); ++i) {
    if (h.bucket(i) == 2 && h.bucket_limit(i) > 1.0 && h.bucket_limit(i) < 2.0) {
      CHECK(h.bucket_limit(i) / h.bucket_limit(i - 1) == doctest::Approx(1.1));
    }
  }
}

TEST_CASE("float histograms are the same as double ones") {
  scratch_dir logs;
  summary_writer writer(logs.dir.string());
  const std::vector<float> f{0.5f, -0.25f, 8.0f};
  const std::vector<double> d{0.5, -0.25, 8.0};
  writer.histogram("f", f, 1);
  writer.histogram("d", d, 1);
  writer.close();
  const auto events = read_events(writer.path());
  REQUIRE(events.size() == 3);
  CHECK(events[1].summary().value(0).histo().SerializeAsString() ==
        events[2].summary().value(0).histo().SerializeAsString());
}

TEST_CASE("a closed writer refuses to write; a directory it cannot make is unavailable") {
  scratch_dir logs;
  summary_writer writer(logs.dir.string());
  writer.close();
  CHECK(code_of([&] { writer.scalar("a", 1, 1); }) == errc::failed_precondition);
  CHECK_NOTHROW(writer.close());
  const auto file = (logs.dir / "a-file").string();
  { tfrecord_writer(file).close(); }
  CHECK(code_of([&] { summary_writer(file + "/logs"); }) == errc::unavailable);
}

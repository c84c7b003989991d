#include "common/environment.hpp"

#include <pscoro/log.hpp>
#include <pscoro/metrics.hpp>
#include <pscoro/progress.hpp>

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <vector>

namespace pscoro {
namespace {

// Keras's way: "42s", "3:07", "1:02:03". Clamped to 10^12 s (a huge total at a tiny rate), where
// rounding into a long long would be out of range; NaN counts as 0.
std::string format_duration(double seconds) {
  const double bounded = seconds > 0 ? std::min(seconds, 1e12) : 0.0;
  const auto s = static_cast<long long>(std::llround(bounded));
  if (s < 60) return fmt::format("{}s", s);
  if (s < 3600) return fmt::format("{}:{:02}", s / 60, s % 60);
  return fmt::format("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60);
}

constexpr std::size_t bar_width = 30;

// Keras's bar: "[=========>....................]".
std::string bar(std::int64_t step, std::int64_t total) {
  const auto filled = static_cast<std::size_t>(
      static_cast<double>(bar_width) * static_cast<double>(std::clamp<std::int64_t>(step, 0, total)) /
      static_cast<double>(total));
  std::string out = "[";
  if (filled > 0) {
    out.append(filled - 1, '=');
    out += step < total ? '>' : '=';
  }
  out.append(bar_width - filled, '.');
  out += ']';
  return out;
}

// Whether a reporter publishes its step now: one at a time, or the gauges would add up the steps
// of two loops.
std::atomic<bool> step_published{false};

// Whether the automatic style redraws: stdout is a terminal, or a pipe the launcher relays to its
// own terminal (PSCORO_PROGRESS_TTY=1). JSON lines never get a redrawn line between them.
bool redraw_by_default() {
  if (log_format_is_json()) return false;
  if (::isatty(::fileno(stdout)) == 1) return true;
  try {
    return common::flag_from_environment("PSCORO_PROGRESS_TTY", "stdout ends at a terminal").value_or(false);
  } catch (const std::exception&) {
    return false;  // a typo costs the bar, not the training
  }
}

}  // namespace

struct progress::published {
  metrics::gauge step;
  metrics::gauge total;
  // As of the last update: the mean loss of the report's window (NaN: none yet) and the steps per
  // second since the report started. Doubles: read through a collector, not gauges of int64.
  std::atomic<double> loss{std::nan("")};
  std::atomic<double> steps_per_second{0};
  std::vector<metrics::registry::registration> registered;  // last: goes before what it lists
  ~published() {
    registered.clear();
    step_published.store(false);
  }
};

progress::progress(std::int64_t total, progress_options options)
    : total_(total), options_(std::move(options)), step_(options_.initial_step) {
  if (!options_.clock) options_.clock = [] { return std::chrono::steady_clock::now(); };
  switch (options_.output_style) {
    case progress_options::style::redraw: redraw_ = true; break;
    case progress_options::style::lines: redraw_ = false; break;
    case progress_options::style::automatic: redraw_ = !options_.output && redraw_by_default(); break;
  }
  if (!options_.output) {
    options_.output = [](std::string_view text) {
      // A whole line is output like a result (a JSON object with PSCORO_LOG_FORMAT=json); a
      // redrawn one goes out as it is.
      if (text.size() > 1 && text.back() == '\n' && text.front() != '\r') {
        print_line(text.substr(0, text.size() - 1));
        return;
      }
      std::fwrite(text.data(), 1, text.size(), stdout);
      std::fflush(stdout);
    };
  }
  start_ = now();
  if (!step_published.exchange(true)) {
    published_ = std::make_shared<published>();
    published_->step.set(step_);
    published_->total.set(total_);
    auto& r = metrics::process_registry();
    published_->registered.push_back(
        r.add("pscoro_progress_step", "Steps done, as the program's progress report counts them.", {}, published_->step));
    published_->registered.push_back(r.add("pscoro_progress_total_steps",
                                           "Steps the program's progress report expects in all (0: unknown).", {},
                                           published_->total));
    published_->registered.push_back(r.add_collector([shown = std::weak_ptr<published>(published_)] {
      std::vector<metrics::sample> out;
      const auto p = shown.lock();
      if (!p) return out;
      out.push_back({"pscoro_progress_steps_per_second", "Steps per second since the progress report started.",
                     metrics::metric_type::gauge, {}, p->steps_per_second.load(std::memory_order_relaxed)});
      const double loss = p->loss.load(std::memory_order_relaxed);
      if (!std::isnan(loss)) {
        out.push_back({"pscoro_progress_loss", "The mean loss of the progress report's last steps.",
                       metrics::metric_type::gauge, {}, loss});
      }
      return out;
    }));
  }
}

std::chrono::steady_clock::time_point progress::now() const { return options_.clock(); }

void progress::update(std::int64_t step, std::optional<double> loss) {
  step_ = step;
  if (loss) {
    losses_.push_back(*loss);
    while (losses_.size() > std::max<std::size_t>(options_.loss_window, 1)) losses_.pop_front();
  }
  if (published_) {
    published_->step.set(step);
    published_->steps_per_second.store(steps_per_second(), std::memory_order_relaxed);
    if (const auto mean = average_loss()) published_->loss.store(*mean, std::memory_order_relaxed);
  }
  const bool last = total_ > 0 && step >= total_;
  if (redraw_) {
    const auto t = now();
    if (last || drawn_width_ == 0 || t - last_redraw_ >= options_.redraw_interval) {
      last_redraw_ = t;
      print(true);
    }
  } else if (last || (options_.print_every > 0 && step % options_.print_every == 0)) {
    print(false);
  }
}

void progress::interrupt() {
  if (!redraw_ || drawn_width_ == 0) return;
  options_.output("\n");
  drawn_width_ = 0;
}

void progress::finish() {
  if (printed_step_ != step_) print(redraw_);
  interrupt();
}

double progress::steps_per_second() const {
  const double seconds = std::chrono::duration<double>(now() - start_).count();
  if (seconds <= 0) return 0;
  return static_cast<double>(step_ - options_.initial_step) / seconds;
}

std::optional<double> progress::average_loss() const {
  if (losses_.empty()) return std::nullopt;
  return std::accumulate(losses_.begin(), losses_.end(), 0.0) / static_cast<double>(losses_.size());
}

std::optional<std::chrono::duration<double>> progress::eta() const {
  const double rate = steps_per_second();
  if (total_ <= 0 || rate <= 0) return std::nullopt;
  return std::chrono::duration<double>(static_cast<double>(std::max<std::int64_t>(total_ - step_, 0)) / rate);
}

std::string progress::text() const {
  std::string out = total_ > 0 ? fmt::format("step {}/{}", step_, total_) : fmt::format("step {}", step_);
  if (const auto loss = average_loss()) out += fmt::format(" loss {:.4f}", *loss);
  out += fmt::format(" {:.1f} steps/s", steps_per_second());
  if (total_ > 0 && step_ >= total_) {
    out += " done in " + format_duration(std::chrono::duration<double>(now() - start_).count());
  } else if (const auto left = eta()) {
    out += " ETA " + format_duration(left->count());
  }
  return out;
}

void progress::print(bool redraw) {
  printed_step_ = step_;
  if (!redraw) {
    options_.output(options_.label + text() + "\n");
    return;
  }
  std::string line = options_.label;
  if (total_ > 0) line += bar(step_, total_) + " ";
  line += text();
  const std::size_t width = line.size();
  // Spaces over what is left of a longer previous line.
  if (width < drawn_width_) line.append(drawn_width_ - width, ' ');
  options_.output("\r" + line);
  drawn_width_ = width;
}

}  // namespace pscoro

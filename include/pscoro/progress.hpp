// A progress report for training loops, as Keras prints one: steps done of the total, steps per
// second, the time left and the loss averaged over the last steps.
//
// On a terminal it redraws one line (`\r`, Keras's progress bar); when the output is a pipe or a
// file it prints a plain line every few steps instead (through print_line: a JSON record under
// PSCORO_LOG_FORMAT=json), which logs and scripts can read. PSCORO_PROGRESS_TTY=1 says that stdout,
// a pipe, ends at a terminal (pscoro-launch sets it for the chief when its own stdout is one). A
// plain line:
//
//   chief: step 500/3000 loss 0.6123 812.3 steps/s ETA 3s
#pragma once

#include <pscoro/config.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace pscoro {

struct progress_options {
  enum class style {
    automatic,  ///< redraw when stdout is a terminal (or PSCORO_PROGRESS_TTY=1), output is not
                ///< replaced and the log format is text; else lines
    redraw,     ///< one line redrawn in place
    lines,      ///< a line every print_every steps
  };
  /// Steps done before this run (a resumed run): the rate counts only the steps of this run.
  std::int64_t initial_step = 0;
  /// Starts every line ("chief: ").
  std::string label;
  /// Lines style: a line every this many steps, and at the last one.
  std::int64_t print_every = 100;
  /// Redraw style: at most one redraw per interval, and always the last step.
  std::chrono::milliseconds redraw_interval{100};
  /// The loss shown is the mean of the last this many losses.
  std::size_t loss_window = 100;
  style output_style = style::automatic;
  /// Where the text goes (default: stdout, flushed each time; whole lines through print_line).
  std::function<void(std::string_view)> output{};
  /// The time (default: std::chrono::steady_clock::now); tests pass their own.
  std::function<std::chrono::steady_clock::time_point()> clock{};
};

/// Reports a loop of `total` steps (0: unknown, shown without ETA or bar). Use from one thread.
/// The first reporter of a process that is alive also sets the gauges pscoro_progress_step and
/// pscoro_progress_total_steps in metrics::process_registry(), where the chief's page reads the job's
/// step, rate and ETA.
///
///   pscoro::progress bar(steps, {.label = "chief: ", .print_every = 500});
///   for (...) bar.update(step + 1, loss);
///   bar.finish();
class PSCORO_API progress {
 public:
  explicit progress(std::int64_t total, progress_options options = {});

  /// `step` steps are done (counting initial_step), the last one's loss `loss` if it has one;
  /// prints if it is time to.
  void update(std::int64_t step, std::optional<double> loss = std::nullopt);
  /// Ends a redrawn line, so that other output starts on a line of its own (the next update
  /// draws a fresh one). Nothing happens in the lines style.
  void interrupt();
  /// Prints the last step if it was not printed yet, and ends a redrawn line.
  void finish();

  /// Steps of this run per second since the reporter was made (0 before time passed).
  [[nodiscard]] double steps_per_second() const;
  /// The mean of the last loss_window losses; none before the first.
  [[nodiscard]] std::optional<double> average_loss() const;
  /// Time left at the current rate; none when the total or the rate is unknown.
  [[nodiscard]] std::optional<std::chrono::duration<double>> eta() const;
  /// The report as it would print now, without label, `\r` or line break.
  [[nodiscard]] std::string text() const;

 private:
  void print(bool redraw);
  [[nodiscard]] std::chrono::steady_clock::time_point now() const;

  std::int64_t total_;
  progress_options options_;
  bool redraw_;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_redraw_{};
  std::int64_t step_ = 0;
  std::int64_t printed_step_ = -1;
  std::deque<double> losses_;
  std::size_t drawn_width_ = 0;  // redraw style: characters of the line on screen, 0 if none
  struct published;
  std::shared_ptr<published> published_;  // the gauges, when this reporter is the process's first
};

}  // namespace pscoro

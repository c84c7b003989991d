// TensorBoard event files: the curves of a training run (TF's tf.summary.create_file_writer).
//
// A summary_writer writes one file in its log directory, named as TF 2 names its own,
// `events.out.tfevents.<seconds>.<hostname>.<pid>.<n>.v2`: TFRecord framing around TF's `Event`
// protos, the first one `file_version: "brain.Event:2"`. `tensorboard --logdir DIR` shows what it
// wrote; nothing of TensorFlow is needed to write it.
#pragma once

#include <pscoro/config.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

namespace pscoro {

/// TF's create_file_writer arguments, with TF's defaults.
struct summary_writer_options {
  /// Events held before they are flushed to the file (TF's max_queue).
  std::size_t max_queue = 10;
  /// A write flushes when the last flush is older than this (TF's flush_millis); there is no
  /// background thread, so a writer that stops writing keeps its events until flush() or close().
  std::chrono::milliseconds flush_interval{120'000};
  /// Ends the file name (TF's filename_suffix).
  std::string filename_suffix = ".v2";
};

/// Writes scalars and histograms for TensorBoard into one new event file under `logdir`
/// (created if missing). Use it from one thread at a time, as a std::ofstream. Throws
/// errc::unavailable when the directory or the file cannot be written.
///
///   pscoro::summary_writer summaries(logdir);
///   summaries.scalar("train/loss", loss, step);
class PSCORO_API summary_writer {
 public:
  explicit summary_writer(const std::string& logdir, summary_writer_options options = {});
  /// Flushes and closes, quietly (close() reports a failure).
  ~summary_writer();
  summary_writer(summary_writer&&) noexcept;
  summary_writer& operator=(summary_writer&&) noexcept;

  /// `value` of the curve `tag` (slashes group curves: "train/loss") at `step`, as TF's
  /// `simple_value` (a float32, as TensorBoard stores it).
  void scalar(std::string_view tag, double value, std::int64_t step);
  /// The distribution of `values` at `step`, in TF's default buckets (powers of 1.1 from 1e-12 to
  /// 1e20, both signs, and zero), empty runs of buckets merged as TF does. NaNs are left out.
  void histogram(std::string_view tag, std::span<const double> values, std::int64_t step);
  void histogram(std::string_view tag, std::span<const float> values, std::int64_t step);

  /// Pushes every event written so far to the file, where TensorBoard sees it.
  void flush();
  /// Flushes and closes the file; later writes throw errc::failed_precondition. A moved-from
  /// writer may only be assigned to or destroyed.
  void close();
  /// The event file's path.
  [[nodiscard]] const std::string& path() const noexcept;

 private:
  struct state;
  std::unique_ptr<state> state_;
};

}  // namespace pscoro

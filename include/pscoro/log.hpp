// pscoro's own log lines, and the hooks a host program uses to take them over.
//
// Every task logs what happens to it (peers lost and back, sessions, refused connections) as lines
// on stderr: `2026-11-23T21:52:21.123Z INFO [ps:0] message`, ISO-8601 UTC time with milliseconds,
// the level, the task (`chief:0`, `ps:1`, `worker:0`; `-` until the process has a role) and the
// message. PSCORO_LOG_LEVEL (debug, info, warning, error; default info) drops what is below it;
// PSCORO_LOG_FORMAT=json makes each line one JSON object instead. A program with a logger of its
// own routes the records there with set_log_sink: pscoro then writes nothing on stderr. A program's
// own output (its results, progress lines) goes through print_line, in the same format, so that
// every line of a run has the same shape: time, level, task, then the text.
#pragma once

#include <pscoro/config.hpp>

#include <chrono>
#include <functional>
#include <string>
#include <string_view>

namespace pscoro {

enum class log_level { debug, info, warning, error };

/// "DEBUG", "INFO", "WARNING" or "ERROR", as the lines print it.
PSCORO_API std::string_view to_string(log_level level) noexcept;

/// One log line of pscoro, before it is formatted. The views are valid during the sink's call only.
struct log_record {
  log_level level;
  std::string_view task;  ///< "ps:0", "chief:0"; empty until the process has a role
  std::chrono::system_clock::time_point time;
  std::string_view message;
};

/// Receives every record at or above the level threshold.
using log_sink = std::function<void(const log_record&)>;

/// Sends every later record to `sink` instead of stderr; an empty sink restores stderr.
///
/// Servers log from several threads, so the sink is called under pscoro's log lock: calls never
/// overlap, and once set_log_sink returns the previous sink is not running and never called again
/// (its logger may go). The sink must therefore not call set_log_sink or anything that logs
/// through pscoro, and should return quickly. An exception it throws is dropped.
///
///   pscoro::set_log_sink([&](const pscoro::log_record& r) { my_logger.log(r.level, r.task, r.message); });
PSCORO_API void set_log_sink(log_sink sink);

/// Drops records below `level` from now on (PSCORO_LOG_LEVEL sets the level a process starts with).
PSCORO_API void set_log_level(log_level level) noexcept;
/// The current threshold.
PSCORO_API log_level current_log_level() noexcept;

/// The line pscoro writes on stderr for `record` (its format by PSCORO_LOG_FORMAT), without the
/// final line break: a sink that only wants to prefix or redirect the lines formats with this.
PSCORO_API std::string format_log_line(const log_record& record);

/// Whether PSCORO_LOG_FORMAT asks for JSON lines.
PSCORO_API bool log_format_is_json() noexcept;

/// Writes one line of the program's own output (a result, a progress line, the port a server got)
/// on stdout, or on stderr from warning up, and flushes it, in the log format: the line a log_record
/// of this time, level and this process's task gives, text or JSON, so that every line of a run has
/// one shape (`2026-11-23T21:52:21.123Z INFO [chief:0] chief: test accuracy 0.8231 on 10000 images`).
/// It is the program's output, not a log record: no level threshold drops it and no sink takes it.
///
///   pscoro::print_line(fmt::format("chief: test accuracy {:.4f} on {} images", accuracy, n));
PSCORO_API void print_line(std::string_view text, log_level level = log_level::info);

}  // namespace pscoro

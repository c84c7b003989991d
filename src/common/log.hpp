// The library's logging calls: formatted only when their level is enabled, then handed to the
// process's sink (stderr unless a host program set one; <pscoro/log.hpp> says the line format and
// the environment variables).
#pragma once

#include <pscoro/log.hpp>

#include <fmt/format.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace pscoro::log {

using level = log_level;

bool enabled(level l) noexcept;
void write(level l, std::string_view message);
/// Names this process's task in every line ("ps:0"); empty until a role is known.
void set_task(std::string task);
/// The same, unless the process already has a task: a program that runs a server and then a
/// chief (or a test running a whole cluster in one process) keeps the first role's name.
void set_task_if_unset(std::string task);
/// The same, only while the process's task is `was`: a worker given its index by the chief
/// (elastic admission) renames its lines, unless the process had another name.
void rename_task(std::string_view was, std::string task);
/// The line for `record` in text or JSON (format_log_line picks by PSCORO_LOG_FORMAT).
std::string format_line(const log_record& record, bool json);

/// A warning or an error this process logged, kept for its page.
struct problem {
  log_level level;
  std::string task;
  std::chrono::system_clock::time_point time;
  std::string message;
};
/// How many warnings and errors recent_problems() keeps.
inline constexpr std::size_t kept_problems = 32;
/// The last kept_problems warnings and errors logged (whatever the sink), oldest first, and in
/// `logged` how many were logged in all. Thread-safe.
std::vector<problem> recent_problems(std::uint64_t* logged = nullptr);

template <class... Args>
void debug(fmt::format_string<Args...> f, Args&&... args) {
  if (enabled(level::debug)) write(level::debug, fmt::format(f, std::forward<Args>(args)...));
}
template <class... Args>
void info(fmt::format_string<Args...> f, Args&&... args) {
  if (enabled(level::info)) write(level::info, fmt::format(f, std::forward<Args>(args)...));
}
template <class... Args>
void warning(fmt::format_string<Args...> f, Args&&... args) {
  if (enabled(level::warning)) write(level::warning, fmt::format(f, std::forward<Args>(args)...));
}
template <class... Args>
void error(fmt::format_string<Args...> f, Args&&... args) {
  if (enabled(level::error)) write(level::error, fmt::format(f, std::forward<Args>(args)...));
}

/// Lets a message that may repeat fast (a failing accept, a flood of refused peers) through at most
/// `burst` times per interval, counting the ones held back. Use on one thread.
class throttle {
 public:
  throttle(std::size_t burst, std::chrono::steady_clock::duration interval) : burst_(burst), interval_(interval) {}

  /// Whether to log now; if so, `held_back` is how many were not logged since the last one.
  bool allow(std::size_t& held_back) {
    const auto now = std::chrono::steady_clock::now();
    if (now - window_start_ >= interval_) {
      window_start_ = now;
      used_ = 0;
    }
    if (used_ >= burst_) {
      ++held_back_;
      return false;
    }
    ++used_;
    held_back = std::exchange(held_back_, 0);
    return true;
  }

 private:
  std::size_t burst_;
  std::chrono::steady_clock::duration interval_;
  std::chrono::steady_clock::time_point window_start_{};
  std::size_t used_ = 0;
  std::size_t held_back_ = 0;
};

}  // namespace pscoro::log

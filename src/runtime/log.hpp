// Process log lines on stderr: "<time> <level> [<task>] message". Level from PSCORO_LOG_LEVEL
// (debug, info, warning, error; default info).
#pragma once

#include <fmt/format.h>

#include <string_view>

namespace pscoro::log {

enum class level { debug, info, warning, error };

bool enabled(level l) noexcept;
void write(level l, std::string_view message);
/// Names this process's task in every line ("ps:0"); empty until a role is known.
void set_task(std::string task);

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

}  // namespace pscoro::log

#include "runtime/log.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

namespace pscoro::log {
namespace {

level threshold_from_environment() {
  const char* value = std::getenv("PSCORO_LOG_LEVEL");
  const std::string_view text = value ? value : "";
  if (text == "debug") return level::debug;
  if (text == "warning") return level::warning;
  if (text == "error") return level::error;
  return level::info;
}

// Read on first use, so a program may set PSCORO_LOG_LEVEL early in main.
level threshold() {
  static const level value = threshold_from_environment();
  return value;
}
// Several io_contexts may share a process (tests, the in-process cluster): lines stay whole.
std::mutex output_mutex;
std::string task_label;

}  // namespace

bool enabled(level l) noexcept { return l >= threshold(); }

void set_task(std::string task) {
  std::lock_guard lock(output_mutex);
  task_label = std::move(task);
}

void write(level l, std::string_view message) {
  static constexpr std::string_view names[] = {"DEBUG", "INFO", "WARNING", "ERROR"};
  const auto now = std::chrono::system_clock::now();
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count();
  std::lock_guard lock(output_mutex);
  const std::string line =
      task_label.empty()
          ? fmt::format("{}.{:03} {} {}\n", ms / 1000, ms % 1000, names[static_cast<int>(l)], message)
          : fmt::format("{}.{:03} {} [{}] {}\n", ms / 1000, ms % 1000, names[static_cast<int>(l)],
                        task_label, message);
  std::fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace pscoro::log

#include "common/log.hpp"

#include "common/environment.hpp"

#include <pscoro/error.hpp>

#include <nlohmann/json.hpp>

#include <atomic>
#include <cstdio>
#include <ctime>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

namespace pscoro {
namespace {

struct environment_settings {
  log_level threshold = log_level::info;
  bool json = false;
  std::vector<std::string> complaints;  // bad values, logged as warnings once settings are known
};

environment_settings read_environment() {
  environment_settings s;
  // A typo must not silently change what is logged, but it cannot stop the program either (the
  // first log line may come from deep inside a server): it is warned about, and the default kept.
  try {
    if (const auto index = common::choice_from_environment("PSCORO_LOG_FORMAT", {"text", "json"})) {
      s.json = *index == 1;
    }
  } catch (const error& e) {
    s.complaints.push_back(fmt::format("{}; writing text lines", e.what()));
  }
  try {
    if (const auto index =
            common::choice_from_environment("PSCORO_LOG_LEVEL", {"debug", "info", "warning", "error"})) {
      s.threshold = static_cast<log_level>(*index);
    }
  } catch (const error& e) {
    s.complaints.push_back(fmt::format("{}; logging at info", e.what()));
  }
  return s;
}

// Read on first use, so a program may set the variables early in main.
const environment_settings& settings() {
  static const environment_settings value = read_environment();
  return value;
}

constexpr int from_environment = -1;
std::atomic<int> threshold_set{from_environment};

// Several threads log (servers, the in-process clusters of the tests, a host's own threads): one
// lock keeps each line whole and calls the sink one record at a time. Never destroyed, so a line
// logged while statics are destroyed at exit still finds it.
struct output_state {
  std::mutex mutex;
  std::string task;
  log_sink sink;
  bool complained = false;
  // The page's "recent warnings and errors": a ring, so a flood of warnings costs no memory.
  std::deque<log::problem> problems;
  std::uint64_t problems_logged = 0;
};
output_state& output() {
  static auto* state = new output_state;
  return *state;
}

std::string iso8601_utc(std::chrono::system_clock::time_point time) {
  const auto ms = std::chrono::floor<std::chrono::milliseconds>(time).time_since_epoch().count();
  const auto seconds = static_cast<std::time_t>(ms >= 0 ? ms / 1000 : (ms - 999) / 1000);
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  return fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z", utc.tm_year + 1900, utc.tm_mon + 1, utc.tm_mday,
                     utc.tm_hour, utc.tm_min, utc.tm_sec, ms - static_cast<std::int64_t>(seconds) * 1000);
}

}  // namespace

namespace log {
std::string format_line(const log_record& r, bool json) {
  if (json) {
    // Messages may carry bytes a peer sent: invalid UTF-8 becomes U+FFFD, so every line parses.
    const nlohmann::ordered_json line = {{"time", iso8601_utc(r.time)},
                                         {"level", to_string(r.level)},
                                         {"task", r.task},
                                         {"message", r.message}};
    return line.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  }
  // One record, one line: a line break in a message (bytes a peer sent, say) is written as \n or
  // \r, so that nothing can pass for a line of its own.
  std::string message(r.message);
  if (message.find_first_of("\r\n") != std::string::npos) {
    std::string escaped;
    escaped.reserve(message.size() + 8);
    for (const char c : message) {
      if (c == '\n') {
        escaped += "\\n";
      } else if (c == '\r') {
        escaped += "\\r";
      } else {
        escaped += c;
      }
    }
    message = std::move(escaped);
  }
  return fmt::format("{} {} [{}] {}", iso8601_utc(r.time), to_string(r.level), r.task.empty() ? "-" : r.task,
                     message);
}
}  // namespace log

namespace {

// With the lock held.
void emit(output_state& out, const log_record& r, bool json) {
  if (r.level >= log_level::warning) {
    if (out.problems.size() >= log::kept_problems) out.problems.pop_front();
    // A message may be long (bytes a peer sent): the page needs its start.
    out.problems.push_back({r.level, std::string(r.task), r.time, std::string(r.message.substr(0, 1000))});
    ++out.problems_logged;
  }
  if (out.sink) {
    try {
      out.sink(r);
    } catch (...) {
      // A failing host logger must not fail the network code that logged.
    }
    return;
  }
  std::string line = log::format_line(r, json);
  line += '\n';
  std::fwrite(line.data(), 1, line.size(), stderr);
}

// With the lock held: the bad settings are said once, before the first line or when the process
// learns its role, whichever comes first (a program that never logs still hears of a typo).
void complain_once(output_state& out, const environment_settings& s) {
  if (std::exchange(out.complained, true)) return;
  const auto now = std::chrono::system_clock::now();
  for (const auto& complaint : s.complaints) emit(out, {log_level::warning, out.task, now, complaint}, s.json);
}

}  // namespace

std::string_view to_string(log_level level) noexcept {
  switch (level) {
    case log_level::debug: return "DEBUG";
    case log_level::info: return "INFO";
    case log_level::warning: return "WARNING";
    case log_level::error: return "ERROR";
  }
  return "UNKNOWN";
}

void set_log_sink(log_sink sink) {
  auto& out = output();
  log_sink previous;
  {
    std::lock_guard lock(out.mutex);
    previous = std::exchange(out.sink, std::move(sink));
  }
  // Destroyed outside the lock: its captures may log through a logger of their own.
}

void set_log_level(log_level level) noexcept { threshold_set.store(static_cast<int>(level)); }

log_level current_log_level() noexcept {
  const int set = threshold_set.load();
  return set == from_environment ? settings().threshold : static_cast<log_level>(set);
}

std::string format_log_line(const log_record& record) { return log::format_line(record, settings().json); }

bool log_format_is_json() noexcept { return settings().json; }

void print_line(std::string_view text, log_level level) {
  const auto now = std::chrono::system_clock::now();
  const auto& s = settings();
  auto& out = output();
  std::lock_guard lock(out.mutex);
  complain_once(out, s);
  std::string line = log::format_line({level, out.task, now, text}, s.json);
  line += '\n';
  std::FILE* stream = level >= log_level::warning ? stderr : stdout;
  std::fwrite(line.data(), 1, line.size(), stream);
  std::fflush(stream);
}

namespace log {

bool enabled(level l) noexcept { return l >= current_log_level(); }

void set_task(std::string task) {
  const auto& s = settings();
  auto& out = output();
  std::lock_guard lock(out.mutex);
  out.task = std::move(task);
  complain_once(out, s);
}

void set_task_if_unset(std::string task) {
  const auto& s = settings();
  auto& out = output();
  std::lock_guard lock(out.mutex);
  if (out.task.empty()) out.task = std::move(task);
  complain_once(out, s);
}

void rename_task(std::string_view was, std::string task) {
  auto& out = output();
  std::lock_guard lock(out.mutex);
  if (out.task == was) out.task = std::move(task);
}

std::vector<problem> recent_problems(std::uint64_t* logged) {
  auto& out = output();
  std::lock_guard lock(out.mutex);
  if (logged) *logged = out.problems_logged;
  return {out.problems.begin(), out.problems.end()};
}

void write(level l, std::string_view message) {
  const auto now = std::chrono::system_clock::now();
  const auto& s = settings();
  auto& out = output();
  std::lock_guard lock(out.mutex);
  complain_once(out, s);
  emit(out, {l, out.task, now, message}, s.json);
}

}  // namespace log
}  // namespace pscoro

// Log lines: their text and JSON forms, the sink a host program sets (from many threads at once),
// the level threshold, and the environment switches' parsing.
#include "test_support.hpp"

#include <pscoro/error.hpp>
#include <pscoro/log.hpp>

#include "common/environment.hpp"
#include "common/log.hpp"

#include <nlohmann/json.hpp>

#include <atomic>
#include <cstdlib>
#include <regex>
#include <thread>
#include <vector>

using namespace pscoro;

namespace {

// 2026-11-23T21:52:21.123Z
std::chrono::system_clock::time_point sample_time() {
  return std::chrono::system_clock::time_point(std::chrono::milliseconds(1'795'470'741'123));
}

struct captured {
  log_level level;
  std::string task;
  std::chrono::system_clock::time_point time;
  std::string message;
};

// Routes pscoro's records into a vector for one test, and back to stderr at its end.
struct capture_sink {
  std::vector<captured> records;
  capture_sink() {
    set_log_sink([this](const log_record& r) {
      records.push_back({r.level, std::string(r.task), r.time, std::string(r.message)});
    });
  }
  ~capture_sink() { set_log_sink({}); }
};

// Restores the level a test changes.
struct level_guard {
  log_level saved = current_log_level();
  ~level_guard() { set_log_level(saved); }
};

}  // namespace

TEST_CASE("a text line has the UTC time with milliseconds, the level, the task and the message") {
  const log_record r{log_level::warning, "ps:1", sample_time(), "lost worker:0: reset"};
  CHECK(log::format_line(r, false) == "2026-11-23T21:52:21.123Z WARNING [ps:1] lost worker:0: reset");
}

TEST_CASE("a line break in a message is written escaped: one record is one line") {
  const log_record r{log_level::warning, "ps:0", sample_time(), "refused 'x\n2026-11-23T00:00:00.000Z INFO [ps:0] ok\r'"};
  CHECK(log::format_line(r, false) ==
        "2026-11-23T21:52:21.123Z WARNING [ps:0] refused 'x\\n2026-11-23T00:00:00.000Z INFO [ps:0] ok\\r'");
}

TEST_CASE("a line of a process without a role says so with '-'") {
  const log_record r{log_level::info, "", sample_time(), "starting"};
  CHECK(log::format_line(r, false) == "2026-11-23T21:52:21.123Z INFO [-] starting");
}

TEST_CASE("milliseconds keep their leading zeros and times before 1970 stay in order") {
  const log_record r{log_level::debug, "chief:0", std::chrono::system_clock::time_point(std::chrono::milliseconds(7)),
                     "m"};
  CHECK(log::format_line(r, false) == "1970-01-01T00:00:00.007Z DEBUG [chief:0] m");
  const log_record before{log_level::debug, "chief:0",
                          std::chrono::system_clock::time_point(std::chrono::milliseconds(-1)), "m"};
  CHECK(log::format_line(before, false) == "1969-12-31T23:59:59.999Z DEBUG [chief:0] m");
}

TEST_CASE("a JSON line is one object whose strings are escaped, invalid UTF-8 included") {
  const std::string message = "a \"quoted\" \\ name\nwith a tab\t, a bell \x07 and a bad byte \xff";
  const log_record r{log_level::error, "worker:2", sample_time(), message};
  const auto line = log::format_line(r, true);
  CHECK_MESSAGE(line.find('\n') == std::string::npos, line);
  const auto parsed = nlohmann::json::parse(line);
  CHECK(parsed.size() == 4);
  CHECK(parsed["time"] == "2026-11-23T21:52:21.123Z");
  CHECK(parsed["level"] == "ERROR");
  CHECK(parsed["task"] == "worker:2");
  CHECK(parsed["message"] == "a \"quoted\" \\ name\nwith a tab\t, a bell \x07 and a bad byte \xef\xbf\xbd");
  CHECK_MESSAGE(line.starts_with(R"({"time":"2026-11-23T21:52:21.123Z","level":"ERROR","task":"worker:2",)"), line);
}

TEST_CASE("a sink receives each record with its level, task, time and message") {
  level_guard guard;
  set_log_level(log_level::info);
  capture_sink sink;
  log::set_task("ps:3");
  const auto before = std::chrono::system_clock::now();
  log::info("serving {} variables", 2);
  log::debug("not at info");
  const auto after = std::chrono::system_clock::now();
  REQUIRE(sink.records.size() == 1);
  const auto& r = sink.records[0];
  CHECK(r.level == log_level::info);
  CHECK(r.task == "ps:3");
  CHECK(r.message == "serving 2 variables");
  CHECK(r.time >= before);
  CHECK(r.time <= after);
}

TEST_CASE("the first role a process names stays when the chief names its own") {
  capture_sink sink;
  log::set_task("worker:1");
  log::set_task_if_unset("chief:0");
  log::warning("w");
  log::set_task("");
  log::set_task_if_unset("chief:0");
  log::warning("c");
  REQUIRE(sink.records.size() == 2);
  CHECK(sink.records[0].task == "worker:1");
  CHECK(sink.records[1].task == "chief:0");
}

TEST_CASE("set_log_level drops what is below it") {
  level_guard guard;
  capture_sink sink;
  set_log_level(log_level::error);
  log::warning("dropped");
  log::error("kept");
  set_log_level(log_level::debug);
  log::debug("kept too");
  REQUIRE(sink.records.size() == 2);
  CHECK(sink.records[0].message == "kept");
  CHECK(sink.records[1].message == "kept too");
}

TEST_CASE("threads logging at once reach the sink one record at a time, none lost") {
  level_guard guard;
  set_log_level(log_level::info);
  std::atomic<int> inside{0};
  std::atomic<bool> overlapped{false};
  std::size_t count = 0;  // only touched by the sink: the log lock guards it
  set_log_sink([&](const log_record&) {
    if (inside.fetch_add(1) != 0) overlapped = true;
    ++count;
    inside.fetch_sub(1);
  });
  constexpr int threads = 4, lines = 2000;
  {
    std::vector<std::jthread> loggers;
    for (int t = 0; t < threads; ++t) {
      loggers.emplace_back([t] {
        for (int i = 0; i < lines; ++i) log::info("thread {} line {}", t, i);
      });
    }
  }
  set_log_sink({});
  CHECK(count == std::size_t{threads * lines});
  CHECK_FALSE(overlapped.load());
  log::info("after the sink was removed: on stderr");
  CHECK(count == std::size_t{threads * lines});
}

TEST_CASE("a sink that throws does not fail the code that logged") {
  set_log_sink([](const log_record&) { throw std::runtime_error("the host logger is broken"); });
  CHECK_NOTHROW(log::error("still fine"));
  set_log_sink({});
}

TEST_CASE("the lines a sink formats with format_log_line are pscoro's own") {
  const log_record r{log_level::info, "chief:0", sample_time(), "m"};
  // PSCORO_LOG_FORMAT is unset in the test environment: text.
  CHECK(format_log_line(r) == "2026-11-23T21:52:21.123Z INFO [chief:0] m");
  CHECK(to_string(log_level::debug) == "DEBUG");
}

TEST_CASE("print_line writes a program's line on stdout in the log format, whatever the level threshold and sink") {
  level_guard level;
  set_log_level(log_level::error);
  capture_sink sink;
  // PSCORO_LOG_FORMAT is unset in the test environment: text, with time, level and task (this
  // process's, which other tests may have set) before the line.
  const auto out = pscoro::testing::stdout_of([] { print_line("chief: test accuracy 0.8231 on 10000 images"); });
  CAPTURE(out);
  CHECK(std::regex_match(out, std::regex(R"(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z INFO \[[^\]]+\] )"
                                         R"(chief: test accuracy 0\.8231 on 10000 images\n)")));
  CHECK(sink.records.empty());
  CHECK_FALSE(log_format_is_json());
}

TEST_CASE("an environment choice is matched without case, and a bad one names the choices") {
  ::setenv("PSCORO_TEST_CHOICE", "Warning", 1);
  CHECK(common::choice_from_environment("PSCORO_TEST_CHOICE", {"debug", "info", "warning"}) == std::size_t{2});
  ::setenv("PSCORO_TEST_CHOICE", "", 1);
  CHECK_FALSE(common::choice_from_environment("PSCORO_TEST_CHOICE", {"debug"}).has_value());
  ::setenv("PSCORO_TEST_CHOICE", "verbose", 1);
  try {
    (void)common::choice_from_environment("PSCORO_TEST_CHOICE", {"debug", "info"});
    FAIL("no error");
  } catch (const error& e) {
    CHECK(e.code() == errc::invalid_argument);
    CHECK(std::string(e.what()) == "PSCORO_TEST_CHOICE is 'verbose': use one of debug, info");
  }
  ::unsetenv("PSCORO_TEST_CHOICE");
}

// What the tests of damaged files need besides doctest: the log lines a call writes.
#pragma once

#include <pscoro/log.hpp>

#include <mutex>
#include <string>
#include <vector>

namespace pscoro::testing {

/// pscoro's log messages while it lives (it is the process's log sink; stderr is again after).
class captured_log {
 public:
  captured_log() {
    set_log_sink([this](const log_record& r) {
      const std::lock_guard lock(mutex_);
      messages_.emplace_back(r.message);
    });
  }
  ~captured_log() { set_log_sink({}); }
  captured_log(const captured_log&) = delete;
  captured_log& operator=(const captured_log&) = delete;

  /// Every message so far, one a line.
  std::string text() const {
    const std::lock_guard lock(mutex_);
    std::string out;
    for (const auto& m : messages_) out += m + "\n";
    return out;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<std::string> messages_;
};

}  // namespace pscoro::testing

// Files that are not what a setting expects, for the tests that must see them refused: a FIFO
// where a regular file belongs, a call that must not block in open(2) on it, and the log lines a
// call writes.
#pragma once

#include <pscoro/log.hpp>

#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>
#include <future>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace pscoro::testing {

/// A FIFO at `path` for a scope, removed at its end.
class scoped_fifo {
 public:
  explicit scoped_fifo(std::string path) : path_(std::move(path)) {
    if (::mkfifo(path_.c_str(), 0600) != 0) {
      throw std::runtime_error("mkfifo " + path_ + ": " + std::strerror(errno));
    }
  }
  ~scoped_fifo() { ::unlink(path_.c_str()); }
  scoped_fifo(const scoped_fifo&) = delete;
  scoped_fifo& operator=(const scoped_fifo&) = delete;
  const std::string& path() const noexcept { return path_; }

 private:
  std::string path_;
};

/// What `f()` throws (null: nothing), run on a thread of its own, where `f` must not block on the
/// FIFO `fifo`. One that has not returned after a minute is taken to wait in open(2) for the
/// FIFO's other end: the check fails, and the other end is opened and closed until `f` returns
/// (an open for reading then sees end of file), so the test ends instead of hanging.
template <class F>
std::exception_ptr thrown_without_blocking_on(const std::string& fifo, F f) {
  std::packaged_task<void()> task(std::move(f));
  auto done = task.get_future();
  std::thread runner(std::move(task));
  if (done.wait_for(std::chrono::minutes(1)) != std::future_status::ready) {
    FAIL_CHECK("blocked for a minute, in open(2) on the FIFO " << fifo);
    while (done.wait_for(std::chrono::milliseconds(100)) != std::future_status::ready) {
      const int fd = ::open(fifo.c_str(), O_RDWR | O_NONBLOCK);  // both ends: never blocks
      if (fd >= 0) ::close(fd);
    }
  }
  runner.join();
  try {
    done.get();
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}

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

// Error codes and exceptions of pscoro.
//
// Every failure pscoro reports is a std::error_code of pscoro::errc (TF's tf.errors.* family), so
// callers classify failures by code, never by message text. A failure that happened in another
// process arrives as a remote_error, which also names the task it came from.
#pragma once

#include <pscoro/config.hpp>

#include <string>
#include <system_error>

namespace pscoro {

/// Failure classes, numbered like TensorFlow's / gRPC's status codes where they overlap.
enum class errc {
  cancelled = 1,            ///< the closure was cancelled (an earlier closure failed)
  unknown = 2,              ///< a worker function threw something that is not a pscoro error
  invalid_argument = 3,     ///< bad configuration, shape or dtype mismatch, bad argument
  deadline_exceeded = 4,    ///< a peer did not answer in time (e.g. handshake deadline)
  not_found = 5,            ///< unknown worker function or variable
  already_exists = 6,       ///< a variable with that name already exists
  permission_denied = 7,    ///< the peer's role may not do that (an evaluator opening a session)
  resource_exhausted = 8,   ///< the closure queue is full and the caller cannot wait; a server is at a limit
  failed_precondition = 9,  ///< the call is not valid in the current state
  aborted = 10,             ///< the coordinator session it belongs to has ended (a newer chief took over)
  out_of_range = 11,        ///< a dataset iterator has no more elements (TF: OutOfRangeError)
  internal = 13,            ///< an invariant of pscoro itself broke (a bug: please report it)
  unavailable = 14,         ///< a peer cannot be reached or its connection was lost
  data_loss = 15,           ///< corrupt input data: bad checksum, truncated record, bad magic
  unauthenticated = 16,     ///< a peer did not prove the cluster secret (or this task has none)
  protocol_error = 100,     ///< a peer sent bytes that are not pscoro's protocol
};

/// The category of errc values; its name is "pscoro".
PSCORO_API const std::error_category& error_category() noexcept;

inline std::error_code make_error_code(errc e) noexcept {
  return {static_cast<int>(e), error_category()};
}

/// A pscoro failure raised in this process. what() is exactly the message (no code suffix).
class PSCORO_API error : public std::system_error {
 public:
  error(errc code, const std::string& what) : error(make_error_code(code), what) {}
  error(std::error_code code, const std::string& what) : std::system_error(code), what_(what) {}

  const char* what() const noexcept override { return what_.c_str(); }

 private:
  std::string what_;
};

/// A failure that happened in another task: the code, the task ("worker:1") and its message.
class PSCORO_API remote_error : public error {
 public:
  remote_error(std::error_code code, std::string origin_task, std::string message)
      : error(code, origin_task.empty() ? message : message + " [on " + origin_task + "]"),
        origin_task_(std::move(origin_task)),
        message_(std::move(message)) {}

  /// The task the failure came from, as "<job>:<index>".
  const std::string& origin_task() const noexcept { return origin_task_; }
  /// The message as the remote task wrote it.
  const std::string& remote_message() const noexcept { return message_; }

 private:
  std::string origin_task_;
  std::string message_;
};

}  // namespace pscoro

template <>
struct std::is_error_code_enum<pscoro::errc> : std::true_type {};

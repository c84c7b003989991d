// Failures on the wire: every response and refusing Welcome carries a Status (a pscoro::errc code,
// a message, the task it happened on), made here from an exception or a code, and turned back into
// a remote_error on the side that reads it.
#pragma once

#include <pscoro/error.hpp>

#include "pscoro.pb.h"

#include <exception>
#include <string>
#include <string_view>

namespace pscoro::wire {

/// The status of `failure`, which happened on task `origin` ("ps:0"; empty when the reader knows
/// best, as a connection that does not know its task) while running `what` ("worker function 'f'";
/// empty: the request itself failed). The code: a remote_error keeps its code and its origin task
/// (a worker forwarding a ps failure names the ps); a pscoro::error keeps its code;
/// std::bad_alloc is resource_exhausted; std::invalid_argument is invalid_argument; anything else is
/// unknown; no exception at all (a null `failure`) is internal. The message is the failure's own,
/// after "<what> failed: " for a pscoro error ("<what> on <origin> failed: " for a remote one) or
/// "<what> raised: " for any other exception.
///
///   catch (...) { *response.mutable_status() = status_of(std::current_exception(), "worker:0"); }
Status status_of(std::exception_ptr failure, const std::string& origin, std::string_view what = {});

/// A status message for `code` and `message`, and the error it describes.
void set_status(Status& status, std::error_code code, const std::string& message, const std::string& origin);

/// Throws a remote_error for a non-ok status; `origin` is used when the status names none.
void throw_if_error(const Status& status, const std::string& origin);

}  // namespace pscoro::wire

#include "wire/status.hpp"

#include <fmt/format.h>

#include <new>
#include <stdexcept>

namespace pscoro::wire {

Status status_of(std::exception_ptr failure, const std::string& origin, std::string_view what) {
  const auto message = [&](std::string_view verb, std::string_view text) {
    return what.empty() ? std::string(text) : fmt::format("{} {}: {}", what, verb, text);
  };
  Status status;
  if (!failure) {
    // Rethrowing nothing is undefined behaviour; reporting nothing as success would hide the bug.
    set_status(status, make_error_code(errc::internal), message("failed", "no exception to report"), origin);
    return status;
  }
  try {
    std::rethrow_exception(std::move(failure));
  } catch (const remote_error& e) {
    // It happened further away: the reader classifies it by where it came from.
    set_status(status, e.code(),
               what.empty() ? e.remote_message() : fmt::format("{} on {} failed: {}", what, origin, e.remote_message()),
               e.origin_task().empty() ? origin : e.origin_task());
  } catch (const error& e) {
    set_status(status, e.code(), message("failed", e.what()), origin);
  } catch (const std::bad_alloc& e) {
    // However the limits are set, the machine may have less free memory than they assume.
    set_status(status, make_error_code(errc::resource_exhausted),
               message("raised", fmt::format("out of memory ({})", e.what())), origin);
  } catch (const std::invalid_argument& e) {
    // Not std::out_of_range as errc::out_of_range: that code means "the data is exhausted" to a
    // loop over an iterator, which an .at() past the end must not look like.
    set_status(status, make_error_code(errc::invalid_argument), message("raised", e.what()), origin);
  } catch (const std::exception& e) {
    set_status(status, make_error_code(errc::unknown), message("raised", e.what()), origin);
  } catch (...) {
    set_status(status, make_error_code(errc::unknown), message("raised", "an exception that is not a std::exception"),
               origin);
  }
  return status;
}

void set_status(Status& status, std::error_code code, const std::string& message, const std::string& origin) {
  status.set_code(code.category() == error_category() ? code.value() : static_cast<int>(errc::unknown));
  status.set_message(message);
  status.set_origin_task(origin);
}

void throw_if_error(const Status& status, const std::string& origin) {
  if (status.code() == 0) return;
  throw remote_error(make_error_code(static_cast<errc>(status.code())),
                     status.origin_task().empty() ? origin : status.origin_task(), status.message());
}

}  // namespace pscoro::wire

// Small text helpers for messages.
#pragma once

#include <fmt/format.h>

#include <exception>
#include <iterator>
#include <string>
#include <string_view>

namespace pscoro::common {

/// The elements of `items`, each formatted with "{}", separated by `separator`. (fmt::join is
/// avoided: g++ 12 at -O3 reports a false -Wstringop-overflow inside it.)
template <class Range>
std::string join(const Range& items, std::string_view separator) {
  std::string out;
  bool first = true;
  for (const auto& item : items) {
    if (!first) out += separator;
    first = false;
    fmt::format_to(std::back_inserter(out), "{}", item);
  }
  return out;
}

/// What `failure` says (its what()), for a message; `fallback` for an exception of no std type.
inline std::string what_of(const std::exception_ptr& failure, std::string_view fallback = "unknown error") {
  try {
    std::rethrow_exception(failure);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
  }
  return std::string(fallback);
}

}  // namespace pscoro::common

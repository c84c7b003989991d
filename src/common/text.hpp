// Small text helpers for messages.
#pragma once

#include <fmt/format.h>

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

}  // namespace pscoro::common

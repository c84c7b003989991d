#include "common/environment.hpp"

#include <pscoro/error.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>

namespace pscoro::common {

std::string environment(const char* name) {
  const char* value = std::getenv(name);
  return value ? value : "";
}

std::optional<bool> flag_from_environment(const char* name, std::string_view yes_means) {
  const auto value = environment(name);
  if (value.empty()) return std::nullopt;
  if (value == "1" || value == "true" || value == "yes") return true;
  if (value == "0" || value == "false" || value == "no") return false;
  throw error(errc::invalid_argument, fmt::format("{} is '{}': use 1 ({}) or 0", name, value, yes_means));
}

std::optional<std::size_t> choice_from_environment(const char* name, std::initializer_list<std::string_view> choices) {
  const auto value = environment(name);
  if (value.empty()) return std::nullopt;
  const auto same = [](std::string_view a, std::string_view b) {
    return std::equal(a.begin(), a.end(), b.begin(), b.end(), [](char x, char y) {
      return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
    });
  };
  std::size_t index = 0;
  std::string listed;  // not fmt::join: g++ 12 -O3 warns inside fmt 9 on a join of string_views
  for (const auto choice : choices) {
    if (same(value, choice)) return index;
    ++index;
    listed += listed.empty() ? "" : ", ";
    listed += choice;
  }
  throw error(errc::invalid_argument, fmt::format("{} is '{}': use one of {}", name, value, listed));
}

}  // namespace pscoro::common

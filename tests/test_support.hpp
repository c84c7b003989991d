// What every pscoro test includes: doctest (with real iostreams, so std::error_code prints) and
// small helpers.
#pragma once

#include <ostream>
#include <string>
#include <string_view>

#include <doctest/doctest.h>

inline bool contains(const std::string& text, std::string_view part) {
  return text.find(part) != std::string::npos;
}

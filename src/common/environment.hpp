// Settings read from the process's environment, one way for every variable.
#pragma once

#include <cstddef>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>

namespace pscoro::common {

/// The value of environment variable `name`, "" when it is unset.
std::string environment(const char* name);

/// A yes/no environment variable: 1/true/yes or 0/false/no; none when unset or empty. Throws
/// errc::invalid_argument naming the variable, its value and what 1 means (`yes_means`)
/// otherwise: a typo in a switch is an error, not a silent default.
std::optional<bool> flag_from_environment(const char* name, std::string_view yes_means);

/// A variable that names one of `choices` (compared without regard to ASCII case): the index of
/// that choice; none when unset or empty. Throws errc::invalid_argument naming the variable, its
/// value and the choices otherwise.
std::optional<std::size_t> choice_from_environment(const char* name, std::initializer_list<std::string_view> choices);

}  // namespace pscoro::common

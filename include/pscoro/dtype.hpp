// Element types of tensors and variables, and their mapping to C++ types.
#pragma once

#include <pscoro/config.hpp>

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

namespace pscoro {

/// The element type of a tensor. Values are part of the wire protocol: never renumber them.
enum class dtype : std::uint8_t {
  float32 = 1,
  float64 = 2,
  int32 = 3,
  int64 = 4,
};

/// Bytes per element of `t`, or 0 for a value that is not a dtype (e.g. decoded from the wire).
constexpr std::size_t size_of(dtype t) noexcept {
  switch (t) {
    case dtype::float32: return 4;
    case dtype::float64: return 8;
    case dtype::int32: return 4;
    case dtype::int64: return 8;
  }
  return 0;
}

/// TF's name of `t` ("float32"), or "invalid".
constexpr std::string_view name_of(dtype t) noexcept {
  switch (t) {
    case dtype::float32: return "float32";
    case dtype::float64: return "float64";
    case dtype::int32: return "int32";
    case dtype::int64: return "int64";
  }
  return "invalid";
}

/// True for the values the enum names; wire input must pass this before use.
constexpr bool is_valid(dtype t) noexcept { return size_of(t) != 0; }

namespace detail {

/// Throws errc::invalid_argument: a `what` ("tensor", "variable") of dtype `got`, named `name` when
/// it has one, where one of `expected` was needed ("expected a float32 variable, got 'w' of int32").
[[noreturn]] PSCORO_API void throw_dtype_mismatch(dtype expected, std::string_view what, dtype got,
                                                 std::string_view name = {});

}  // namespace detail

template <class T>
inline constexpr bool is_element_type_v =
    std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, std::int32_t> ||
    std::is_same_v<T, std::int64_t>;

/// The dtype of element type T: `dtype_of<float> == dtype::float32`.
template <class T>
  requires is_element_type_v<T>
inline constexpr dtype dtype_of = std::is_same_v<T, float>          ? dtype::float32
                                  : std::is_same_v<T, double>       ? dtype::float64
                                  : std::is_same_v<T, std::int32_t> ? dtype::int32
                                                                    : dtype::int64;

/// Calls `f(T{})` with the C++ element type of `t`; `t` must be valid.
template <class F>
decltype(auto) visit_dtype(dtype t, F&& f) {
  switch (t) {
    case dtype::float32: return f(float{});
    case dtype::float64: return f(double{});
    case dtype::int32: return f(std::int32_t{});
    case dtype::int64: break;
  }
  return f(std::int64_t{});
}

}  // namespace pscoro

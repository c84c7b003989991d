// Copying many rows of one size: common sizes become compile-time constants, so each copy is a few
// moves rather than a call to memcpy (a lookup of a million 4-byte rows is a million copies).
#pragma once

#include <cstddef>
#include <type_traits>

namespace pscoro::runtime {

/// Calls f(size) with `row_bytes` as a std::integral_constant when it is 4, 8, 16, 32 or 64 bytes
/// (one float to 16 floats), else as a plain std::size_t.
template <class F>
void with_row_size(std::size_t row_bytes, F&& f) {
  switch (row_bytes) {
    case 4: return f(std::integral_constant<std::size_t, 4>{});
    case 8: return f(std::integral_constant<std::size_t, 8>{});
    case 16: return f(std::integral_constant<std::size_t, 16>{});
    case 32: return f(std::integral_constant<std::size_t, 32>{});
    case 64: return f(std::integral_constant<std::size_t, 64>{});
    default: return f(row_bytes);
  }
}

}  // namespace pscoro::runtime

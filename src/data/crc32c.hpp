// CRC-32C (Castagnoli), as TFRecord files use it. Debian has no crc32c library package, so this is
// the usual table-driven form, with the SSE4.2 instruction when the CPU has it.
#pragma once

#include <cstddef>
#include <cstdint>

namespace pscoro::data {

/// The CRC-32C of `size` bytes at `data`.
std::uint32_t crc32c(const void* data, std::size_t size) noexcept;
/// The CRC-32C of the bytes whose CRC-32C is `crc` followed by `size` bytes at `data`:
/// crc32c_extend(crc32c(a), b) == crc32c(a + b), and crc32c_extend(0, ...) == crc32c(...).
std::uint32_t crc32c_extend(std::uint32_t crc, const void* data, std::size_t size) noexcept;
/// The same without the CPU instruction (what machines without SSE4.2 run; tested on every machine).
std::uint32_t crc32c_portable(const void* data, std::size_t size) noexcept;

/// TFRecord's masked CRC: rotated and offset, so a CRC stored inside CRC'd data stays random-looking.
inline std::uint32_t masked_crc32c(const void* data, std::size_t size) noexcept {
  const std::uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

}  // namespace pscoro::data

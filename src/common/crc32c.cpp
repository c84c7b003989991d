#include "common/crc32c.hpp"

#include <isa-l/crc.h>

#include <algorithm>

namespace pscoro::common {

std::uint32_t crc32c_extend(std::uint32_t crc, const void* data, std::size_t size) noexcept {
  // ISA-L keeps the register without the standard's inversions, and takes an int length: a buffer
  // past 2 GiB goes in pieces.
  constexpr std::size_t piece = std::size_t{1} << 30;
  auto* p = static_cast<unsigned char*>(const_cast<void*>(data));  // ISA-L only reads it
  std::uint32_t state = ~crc;
  while (size > 0) {
    const std::size_t n = std::min(size, piece);
    state = crc32_iscsi(p, static_cast<int>(n), state);
    p += n;
    size -= n;
  }
  return ~state;
}

std::uint32_t crc32c(const void* data, std::size_t size) noexcept { return crc32c_extend(0, data, size); }

}  // namespace pscoro::common

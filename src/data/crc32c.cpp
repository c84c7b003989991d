#include "data/crc32c.hpp"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace pscoro::data {

namespace {

constexpr std::uint32_t polynomial = 0x82f63b78u;  // Castagnoli, reflected

// Slicing-by-8 tables: table[k][b] is the CRC of byte b followed by k zero bytes.
constexpr std::array<std::array<std::uint32_t, 256>, 8> make_tables() {
  std::array<std::array<std::uint32_t, 256>, 8> t{};
  for (std::uint32_t b = 0; b < 256; ++b) {
    std::uint32_t crc = b;
    for (int i = 0; i < 8; ++i) crc = (crc >> 1) ^ ((crc & 1) ? polynomial : 0);
    t[0][b] = crc;
  }
  for (std::size_t k = 1; k < 8; ++k) {
    for (std::size_t b = 0; b < 256; ++b) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xff];
  }
  return t;
}
constexpr auto tables = make_tables();

std::uint32_t crc32c_table(std::uint32_t crc, const unsigned char* p, std::size_t n) noexcept {
  while (n >= 8) {
    std::uint64_t word;
    std::memcpy(&word, p, 8);  // little-endian hosts only (x86-64, aarch64)
    word ^= crc;
    crc = tables[7][word & 0xff] ^ tables[6][(word >> 8) & 0xff] ^ tables[5][(word >> 16) & 0xff] ^
          tables[4][(word >> 24) & 0xff] ^ tables[3][(word >> 32) & 0xff] ^ tables[2][(word >> 40) & 0xff] ^
          tables[1][(word >> 48) & 0xff] ^ tables[0][word >> 56];
    p += 8;
    n -= 8;
  }
  while (n--) crc = (crc >> 8) ^ tables[0][(crc ^ *p++) & 0xff];
  return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) std::uint32_t crc32c_sse42(std::uint32_t crc, const unsigned char* p,
                                                               std::size_t n) noexcept {
  std::uint64_t c = crc;
  while (n >= 8) {
    std::uint64_t word;
    std::memcpy(&word, p, 8);
    c = _mm_crc32_u64(c, word);
    p += 8;
    n -= 8;
  }
  auto c32 = static_cast<std::uint32_t>(c);
  while (n--) c32 = _mm_crc32_u8(c32, *p++);
  return c32;
}
#endif

}  // namespace

std::uint32_t crc32c_extend(std::uint32_t crc, const void* data, std::size_t size) noexcept {
  const auto* p = static_cast<const unsigned char*>(data);
#if defined(__x86_64__)
  static const bool hardware = __builtin_cpu_supports("sse4.2");
  if (hardware) return ~crc32c_sse42(~crc, p, size);
#endif
  return ~crc32c_table(~crc, p, size);
}

std::uint32_t crc32c(const void* data, std::size_t size) noexcept { return crc32c_extend(0, data, size); }

std::uint32_t crc32c_portable(const void* data, std::size_t size) noexcept {
  return ~crc32c_table(~0u, static_cast<const unsigned char*>(data), size);
}

}  // namespace pscoro::data

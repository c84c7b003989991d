// Reads gzipped IDX files (MNIST / Fashion-MNIST format) into xtensor arrays. Every failure names
// the file and what was wrong with it.
#pragma once

#include <pscoro/detail/xtensor.hpp>

#include <fmt/format.h>
#include <zlib.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace examples {

/// The unsigned-byte tensor stored in the gzipped IDX file `path` (type code 0x08 only).
inline xt::xarray<std::uint8_t> read_idx_gz(const std::string& path) {
  std::unique_ptr<gzFile_s, decltype(&gzclose)> file(gzopen(path.c_str(), "rb"), &gzclose);
  if (!file) throw std::runtime_error(fmt::format("{}: cannot open", path));
  auto read_exact = [&](void* out, std::size_t n, std::string_view what) {
    const int got = gzread(file.get(), out, static_cast<unsigned>(n));
    if (got != static_cast<int>(n)) {
      throw std::runtime_error(fmt::format("{}: truncated while reading {} ({} of {} bytes)", path, what,
                                           got < 0 ? 0 : got, n));
    }
  };
  unsigned char magic[4];
  read_exact(magic, 4, "the magic number");
  if (magic[0] != 0 || magic[1] != 0 || magic[2] != 0x08) {
    throw std::runtime_error(fmt::format("{}: not an unsigned-byte IDX file (magic {:02x}{:02x}{:02x}{:02x})", path,
                                         magic[0], magic[1], magic[2], magic[3]));
  }
  const int rank = magic[3];
  if (rank < 1 || rank > 4) throw std::runtime_error(fmt::format("{}: unsupported rank {}", path, rank));
  std::vector<std::size_t> shape(rank);
  std::size_t total = 1;
  for (auto& dim : shape) {
    unsigned char be[4];
    read_exact(be, 4, "the dimensions");
    dim = (std::size_t{be[0]} << 24) | (std::size_t{be[1]} << 16) | (std::size_t{be[2]} << 8) | be[3];
    total *= dim;
  }
  if (total > (std::size_t{1} << 31)) throw std::runtime_error(fmt::format("{}: implausibly large ({} bytes)", path, total));
  xt::xarray<std::uint8_t> data = xt::xarray<std::uint8_t>::from_shape(shape);
  read_exact(data.data(), total, "the data");
  return data;
}

}  // namespace examples

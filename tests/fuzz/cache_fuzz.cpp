// The dataset cache file reader (dataset::cache(filename)): a file is read as a cache of strings
// and as one of (float array, int64, string) tuples. Byte 0 of the input, bit 0 clear: the rest is
// the file. Set: the rest is a block size (one byte: 1 to 256) and the data, framed here in blocks
// with valid checksums, so that the fuzzer reaches the decoder behind them (it cannot forge a
// CRC-32C). A bad file must be errc::data_loss (errc::invalid_argument: a cache of the other
// element type) from the first read that needs its bytes; nothing may be allocated beyond what the
// file holds. A file that reads to its end must be exactly what the writer writes for those
// elements, in blocks of its size: whatever the reader accepts, every byte of it was checked.
#include "temp_file.hpp"

#include <pscoro/dataset.hpp>
#include <pscoro/error.hpp>

#include "common/crc32c.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <tuple>
#include <vector>

namespace {

[[noreturn]] void broken(const std::string& what) {
  std::fprintf(stderr, "fuzz invariant broken: %s\n", what.c_str());
  std::abort();
}

// `data` as a cache file in blocks of `block_size`, as docs/design.md ("Datasets") describes it.
std::string framed(std::string_view data, std::uint32_t block_size) {
  std::string out = "PSCACHE2";
  out.append(reinterpret_cast<const char*>(&block_size), sizeof block_size);
  const std::uint32_t header_crc = pscoro::common::crc32c(out.data(), out.size());
  out.append(reinterpret_cast<const char*>(&header_crc), sizeof header_crc);
  std::uint64_t index = 0;
  for (std::size_t at = 0; at < data.size(); at += block_size, ++index) {
    const std::size_t n = std::min<std::size_t>(block_size, data.size() - at);
    out.append(data.substr(at, n));
    const std::uint32_t crc = pscoro::common::crc32c_extend(pscoro::common::crc32c(&index, sizeof index),
                                                            data.data() + at, n);
    out.append(reinterpret_cast<const char*>(&crc), sizeof crc);
  }
  return out;
}

template <class T>
void read_back(const std::string& path, std::string_view file) {
  using codec = pscoro::detail::cache_codec<T>;
  std::vector<T> elements;
  try {
    pscoro::detail::cache_file_reader in(path, codec::signature());
    while (in.next_element()) elements.push_back(codec::read(in));
  } catch (const pscoro::error& e) {
    const auto code = e.code();
    if (code != pscoro::errc::data_loss && code != pscoro::errc::invalid_argument) {
      broken(std::string("cache reader: not data_loss: ") + e.what());
    }
    return;
  }
  // Read to the end: written again in blocks of the file's size, the file must be the same.
  std::uint32_t block_size = 0;
  std::memcpy(&block_size, file.data() + 8, sizeof block_size);
  static pscoro::fuzz::temp_file again("again.cache");
  {
    pscoro::detail::cache_file_writer out(again.path(), codec::signature(), block_size);
    for (const auto& e : elements) {
      out.begin_element();
      codec::write(out, e);
    }
    out.commit();
  }
  std::ifstream written(again.path(), std::ios::binary);
  const std::string bytes{std::istreambuf_iterator<char>(written), std::istreambuf_iterator<char>()};
  if (bytes != file) broken("a cache file read to its end is not what the writer writes for its elements");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static pscoro::fuzz::temp_file file("input.cache");
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::string bytes;
  if ((data[0] & 1) != 0) {
    if (rest.empty()) return 0;
    bytes = framed(rest.substr(1), static_cast<std::uint32_t>(static_cast<unsigned char>(rest[0])) + 1);
  } else {
    bytes = rest;
  }
  const auto& path = file.write(bytes);
  read_back<std::string>(path, bytes);
  read_back<std::tuple<xt::xarray<float>, std::int64_t, std::string>>(path, bytes);
  return 0;
}

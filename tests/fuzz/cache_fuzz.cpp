// The dataset cache file reader (dataset::cache(filename)): the input is the file, read as a cache
// of strings and as one of (float array, int64, string) tuples. A bad file must be errc::data_loss
// (errc::invalid_argument: a cache of the other element type) from the first read that needs its
// bytes; nothing may be allocated beyond what the file holds. A file that reads to its end must be
// exactly what the writer writes for those elements, in blocks of its size: whatever the reader
// accepts, every byte of it was checked.
#include "temp_file.hpp"

#include <pscoro/dataset.hpp>
#include <pscoro/error.hpp>

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

template <class T>
void read_back(const std::string& path, std::string_view input) {
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
  // Read to the end: written again in blocks of the input's size, the file must be the input.
  std::uint32_t block_size = 0;
  std::memcpy(&block_size, input.data() + 8, sizeof block_size);
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
  if (bytes != input) broken("a cache file read to its end is not what the writer writes for its elements");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static pscoro::fuzz::temp_file file("input.cache");
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const auto& path = file.write(input);
  read_back<std::string>(path, input);
  read_back<std::tuple<xt::xarray<float>, std::int64_t, std::string>>(path, input);
  return 0;
}

// The IDX reader (MNIST's format): pscoro::idx over a file holding the input (byte 0, bit 0 set:
// the rest gzipped), every row read. A bad header or length must be errc::data_loss, from
// make_iterator() for a bad header; nothing may be allocated
// beyond what the file holds (a lying gzipped header fails as truncated).
#include "temp_file.hpp"

#include <pscoro/data_formats.hpp>
#include <pscoro/error.hpp>

#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace {

[[noreturn]] void broken(const std::string& what) {
  std::fprintf(stderr, "fuzz invariant broken: %s\n", what.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static pscoro::fuzz::temp_file file("input.idx");
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  const auto& path = file.path();
  if (data[0] & 1) {
    gzFile out = gzopen(path.c_str(), "wb1");
    if (!out) broken("gzopen");
    if (!rest.empty()) gzwrite(out, rest.data(), static_cast<unsigned>(rest.size()));
    gzclose(out);
  } else {
    file.write(rest);
  }
  try {
    auto rows = pscoro::idx<double>(path).make_iterator();
    // A header may legally claim 2^32 - 1 rows of no elements each: read a bounded number.
    for (int i = 0; i < 4096 && rows.next(); ++i) {
    }
  } catch (const pscoro::error& e) {
    if (e.code() != pscoro::errc::data_loss) broken(std::string("idx: not data_loss: ") + e.what());
  }
  return 0;
}

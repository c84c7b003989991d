// The TFRecord reader and the tf.train.Example parser: pscoro::tfrecord over a file holding the
// input (byte 0, bit 0 set: the rest gzip-compressed first, so the fuzzer reaches the records of
// GZIP files too), every record parsed as an Example. Corruption must be errc::data_loss, an
// unparsable Example errc::invalid_argument, and a record must never be allocated larger than the
// file could hold.
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

std::string gzip(std::string_view bytes) {
  z_stream z{};
  if (deflateInit2(&z, 1, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) broken("deflateInit2");
  std::string out(deflateBound(&z, static_cast<uLong>(bytes.size())) + 32, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes.data()));
  z.avail_in = static_cast<uInt>(bytes.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  if (deflate(&z, Z_FINISH) != Z_STREAM_END) broken("deflate");
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static pscoro::fuzz::temp_file file("input.tfrecord");
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  const auto& path = file.write(data[0] & 1 ? gzip(rest) : std::string(rest));
  try {
    auto records = pscoro::tfrecord({path}).make_iterator();
    while (auto record = records.next()) {
      try {
        const auto example = pscoro::parse_tf_example(*record);
        // What parses serializes and parses again to the same features.
        const auto again = pscoro::parse_tf_example(pscoro::serialize_tf_example(example));
        if (again.features != example.features) broken("an Example does not round-trip");
      } catch (const pscoro::error& e) {
        if (e.code() != pscoro::errc::invalid_argument) broken(std::string("parse_tf_example: ") + e.what());
      }
    }
  } catch (const pscoro::error& e) {
    if (e.code() != pscoro::errc::data_loss) broken(std::string("tfrecord: not data_loss: ") + e.what());
  }
  return 0;
}

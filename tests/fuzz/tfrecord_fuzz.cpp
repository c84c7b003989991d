// The TFRecord reader and the tf.train.Example parsers: pscoro::tfrecord over a file holding the
// input (byte 0, bit 0 set: the rest gzip-compressed first, so the fuzzer reaches the records of
// GZIP files too), every record parsed as an Example by parse_tf_example (protobuf) and by
// tf_example_parser (by hand, against a small spec). Corruption must be errc::data_loss, an
// unparsable Example errc::invalid_argument, a record must never be allocated larger than the
// file could hold, and where protobuf parses a record the fast parser must read what protobuf's
// values imply for the spec (tests/tf_example_reference.hpp).
#include "temp_file.hpp"
#include "tf_example_reference.hpp"

#include <pscoro/data_formats.hpp>
#include <pscoro/error.hpp>

#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

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

// A spec of the seeds' features ("label", "x", "id"; "w" only with its default) and every kind of
// feature: fixed and variable length, with and without a default.
const pscoro::tf_example_parser& fast_parser() {
  using pscoro::tf_feature_type;
  static const pscoro::tf_example_parser parser({
      {"label", tf_feature_type::int64, 1, std::nullopt},
      {"x", tf_feature_type::float32, std::nullopt, std::nullopt},
      {"id", tf_feature_type::bytes, std::nullopt, std::nullopt},
      {"w", tf_feature_type::float32, 2, pscoro::tf_example::feature(std::vector<float>{1.5f})},
      {"s", tf_feature_type::bytes, 1, pscoro::tf_example::feature(std::vector<std::string>{"none"})},
  });
  return parser;
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
      std::optional<pscoro::tf_example> example;
      try {
        example = pscoro::parse_tf_example(*record);
        // What parses serializes and parses again to the same features.
        const auto again = pscoro::parse_tf_example(pscoro::serialize_tf_example(*example));
        if (again.features != example->features) broken("an Example does not round-trip");
      } catch (const pscoro::error& e) {
        if (e.code() != pscoro::errc::invalid_argument) broken(std::string("parse_tf_example: ") + e.what());
      }
      // The record in a block of its own size: ASan sees a read past it.
      const std::unique_ptr<char[]> copy(new char[std::max<std::size_t>(record->size(), 1)]);
      std::memcpy(copy.get(), record->data(), record->size());
      std::optional<pscoro::testing::tf_columns> fast;
      pscoro::tf_example_batch batch;
      try {
        fast_parser().parse(std::string_view(copy.get(), record->size()), batch);
        fast = pscoro::testing::batch_columns(batch, fast_parser().features(), 0);
      } catch (const pscoro::error& e) {
        if (e.code() != pscoro::errc::invalid_argument) broken(std::string("tf_example_parser: ") + e.what());
        if (batch.size() != 0) broken("tf_example_parser failed and kept the example");
      }
      if (example && !pscoro::testing::agrees_with_protobuf(*example, fast_parser().features(), fast)) {
        broken("tf_example_parser and parse_tf_example disagree");
      }
    }
  } catch (const pscoro::error& e) {
    if (e.code() != pscoro::errc::data_loss) broken(std::string("tfrecord: not data_loss: ") + e.what());
  }
  return 0;
}

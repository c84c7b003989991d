// Datasets read from files in the formats training data is actually in: text lines, CSV,
// libsvm/svmlight, Criteo TSV, IDX (MNIST, Fashion-MNIST; gzipped or not) and TFRecord files of
// tf.train.Example (GZIP or not), which this header also writes.
//
//   auto rows = pscoro::csv<float>({"train.csv"}, {.header = true});         // xt::xarray<float> per row
//   auto clicks = pscoro::criteo_tsv({"day_0.tsv"});                        // criteo_example per line
//   auto images = pscoro::idx<float>("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz");
//
// Files are read in the order given, streaming (nothing reads a whole file into memory except
// IDX headers). Bad data is a pscoro::error naming the file and the line (text formats) or byte
// offset (binary formats): errc::not_found for a missing file, errc::data_loss for a corrupt or
// truncated binary file, errc::invalid_argument for an unparsable field. Never a silently wrong
// element.
#pragma once

#include <pscoro/config.hpp>

#include <pscoro/dataset.hpp>

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace pscoro {

/// The lines of `paths`, file after file, without their line ends ("\n" or "\r\n").
PSCORO_API dataset<std::string> text_lines(std::vector<std::string> paths);

struct csv_options {
  char delimiter = ',';
  bool header = false;                ///< skip each file's first line
  std::optional<double> empty_value{};  ///< the value of an empty field; none: an empty field is an error
};

namespace detail {
/// The fields of CSV rows (RFC 4180 quoting), with where they came from.
struct csv_row {
  std::vector<std::string> fields;
  const std::string* file;
  std::uint64_t line;
};
PSCORO_API dataset<csv_row> csv_rows(std::vector<std::string> paths, csv_options options);
/// Parses `field` (column `column` of `row`) as a number; throws errc::invalid_argument naming the
/// file, line and column.
PSCORO_API double csv_number(const csv_row& row, std::size_t column, const csv_options& options);
}  // namespace detail

/// Rows of numeric CSV files as 1-D arrays of T. Every row must have as many columns as the first.
template <class T>
dataset<xt::xarray<T>> csv(std::vector<std::string> paths, csv_options options = {}) {
  return detail::csv_rows(std::move(paths), options).map([options](const detail::csv_row& row) {
    xt::xarray<T> out = xt::xarray<T>::from_shape({row.fields.size()});
    for (std::size_t i = 0; i < row.fields.size(); ++i) out(i) = static_cast<T>(detail::csv_number(row, i, options));
    return out;
  });
}

/// One line of a libsvm / svmlight file: "label index:value ..." (a "qid:n" token and a "# comment"
/// are allowed and ignored). Indices are kept as written and must increase along the line.
struct libsvm_example {
  double label = 0;
  std::vector<std::int64_t> indices;
  std::vector<float> values;
};
PSCORO_API dataset<libsvm_example> libsvm(std::vector<std::string> paths);

/// One line of Criteo's click logs: label, 13 integer features, 26 categorical features (8 hex
/// digits), tab-separated; an empty field is missing.
struct criteo_example {
  static constexpr std::size_t integer_features = 13;
  static constexpr std::size_t categorical_features = 26;
  float label = 0;
  std::array<std::optional<std::int64_t>, integer_features> integers;
  std::array<std::optional<std::uint32_t>, categorical_features> categories;
};
PSCORO_API dataset<criteo_example> criteo_tsv(std::vector<std::string> paths);
/// Parses one Criteo TSV line; throws errc::invalid_argument naming the field (1-based) and why.
PSCORO_API criteo_example parse_criteo_line(std::string_view line);

namespace data {
class file_reader;  // src/data/file_reader.hpp
}  // namespace data

namespace detail {
/// An IDX file's rows, streamed: element type code (0x08 ubyte ... 0x0E double), dimensions, and the
/// raw big-endian bytes of one row (a slice along axis 0) at a time.
class PSCORO_API idx_reader {
 public:
  explicit idx_reader(std::string path);
  ~idx_reader();
  idx_reader(const idx_reader&) = delete;
  idx_reader& operator=(const idx_reader&) = delete;

  std::uint8_t type_code() const noexcept { return type_; }
  const std::vector<std::size_t>& shape() const noexcept { return shape_; }
  /// Reads the next row into `out` (resized); false after the last row.
  bool read_row(std::vector<std::byte>& out);
  /// Element `i` of a row read by read_row, converted to double.
  double element(const std::vector<std::byte>& row, std::size_t i) const noexcept;

 private:
  void read_header();

  std::string path_;
  std::unique_ptr<data::file_reader> file_;
  std::uint8_t type_ = 0;
  std::vector<std::size_t> shape_;
  std::size_t row_bytes_ = 0;
  std::size_t rows_read_ = 0;
  std::uint64_t offset_ = 0;
};


/// Converts the `count` big-endian elements of IDX type `type` at `row` to T: one switch a row,
/// then a loop the compiler vectorises (per element, the switch cost more than the conversion).
template <class T>
void decode_idx_elements(std::uint8_t type, const std::byte* row, std::size_t count, T* out) noexcept {
  const auto* p = reinterpret_cast<const unsigned char*>(row);
  auto be = [p](std::size_t i, std::size_t size) {
    std::uint64_t v = 0;
    for (std::size_t b = 0; b < size; ++b) v = (v << 8) | p[i * size + b];
    return v;
  };
  switch (type) {
    case 0x08: for (std::size_t i = 0; i < count; ++i) out[i] = static_cast<T>(p[i]); break;
    case 0x09: for (std::size_t i = 0; i < count; ++i) out[i] = static_cast<T>(static_cast<std::int8_t>(p[i])); break;
    case 0x0B: for (std::size_t i = 0; i < count; ++i) out[i] = static_cast<T>(static_cast<std::int16_t>(be(i, 2))); break;
    case 0x0C: for (std::size_t i = 0; i < count; ++i) out[i] = static_cast<T>(static_cast<std::int32_t>(be(i, 4))); break;
    case 0x0D:
      for (std::size_t i = 0; i < count; ++i) out[i] = static_cast<T>(std::bit_cast<float>(static_cast<std::uint32_t>(be(i, 4))));
      break;
    case 0x0E: for (std::size_t i = 0; i < count; ++i) out[i] = static_cast<T>(std::bit_cast<double>(be(i, 8))); break;
    default: break;  // the reader refuses other types when it reads the header
  }
}
}  // namespace detail

/// The rows (slices along axis 0) of the IDX file `path`, gzipped or not, converted to T: for
/// Fashion-MNIST's images, 28x28 arrays; for its labels, scalars (0-d arrays). make_iterator()
/// opens the file and checks its header (magic, element type, dimensions, and for an uncompressed
/// file its length): a bad one is errc::data_loss (errc::not_found if it cannot be opened) there,
/// not rows later. Every pass decompresses and decodes the file again: to do that once, cache()
/// what a pass reads (after shard, so a worker keeps only its share), or read_idx the whole file.
template <class T>
dataset<xt::xarray<T>> idx(std::string path) {
  auto description = "IDX file '" + path + "'";
  return dataset<xt::xarray<T>>([path]() {
    // Opened, and its header checked, by make_iterator(): a bad file fails before the first step.
    auto reader = std::make_shared<detail::idx_reader>(path);
    return detail::make_source<xt::xarray<T>>(
        [reader, row = std::vector<std::byte>()]() mutable -> std::optional<xt::xarray<T>> {
          if (!reader->read_row(row)) return std::nullopt;
          const std::vector<std::size_t> shape(reader->shape().begin() + 1, reader->shape().end());
          xt::xarray<T> out = xt::xarray<T>::from_shape(shape);
          detail::decode_idx_elements(reader->type_code(), row.data(), out.size(), out.data());
          return out;
        });
  }, std::move(description));
}

/// The whole IDX file `path` (gzipped or not) as one array of T, its shape the file's: one pass
/// of decompressing and decoding, for data that fits in memory and is read many times (a test
/// set evaluated after every checkpoint). Errors as idx(); the array grows as rows arrive, so a
/// gzipped file whose header lies about its size fails as truncated, not as an allocation.
template <class T>
xt::xarray<T> read_idx(const std::string& path) {
  detail::idx_reader reader(path);
  const auto& shape = reader.shape();
  std::size_t per_row = 1;
  for (std::size_t i = 1; i < shape.size(); ++i) per_row *= shape[i];  // the reader checked for overflow
  std::vector<T> values;
  std::vector<std::byte> row;
  while (reader.read_row(row)) {
    const std::size_t at = values.size();
    values.resize(at + per_row);
    detail::decode_idx_elements(reader.type_code(), row.data(), per_row, values.data() + at);
  }
  xt::xarray<T> out = xt::xarray<T>::from_shape(shape);
  std::copy(values.begin(), values.end(), out.data());
  return out;
}

/// The records of TFRecord files, GZIP-compressed or not (detected per file). Each record's length
/// and data are checked against their masked CRC-32C: a mismatch or a record cut short is
/// errc::data_loss naming the file and the record's byte offset (in the uncompressed stream).
PSCORO_API dataset<std::string> tfrecord(std::vector<std::string> paths);

enum class tfrecord_compression { none, gzip };

/// Writes TFRecord files that TF (and tfrecord()) read. Throws errc::unavailable when the file
/// cannot be written. close() flushes and reports a failed write; the destructor closes quietly.
class PSCORO_API tfrecord_writer {
 public:
  explicit tfrecord_writer(std::string path, tfrecord_compression compression = tfrecord_compression::none);
  ~tfrecord_writer();
  tfrecord_writer(const tfrecord_writer&) = delete;
  tfrecord_writer& operator=(const tfrecord_writer&) = delete;

  void write(std::string_view record);
  /// Pushes the records written so far to the file, where a reader sees them whole (with gzip, a
  /// sync point: the compressed stream decodes up to here).
  void flush();
  void close();

 private:
  void put(const void* data, std::size_t size);
  std::string path_;
  void* file_ = nullptr;  // gzFile (level 0 writes a plain file)
};

/// A tf.train.Example: named features, each a list of byte strings, floats or int64s.
struct PSCORO_API tf_example {
  using feature = std::variant<std::vector<std::string>, std::vector<float>, std::vector<std::int64_t>>;
  std::map<std::string, feature, std::less<>> features;

  /// The values of feature `name`; throws errc::invalid_argument naming it when it is missing or
  /// holds another kind.
  const std::vector<float>& floats(std::string_view name) const;
  const std::vector<std::int64_t>& int64s(std::string_view name) const;
  const std::vector<std::string>& bytes(std::string_view name) const;
};

/// Parses a serialized tf.train.Example; throws errc::invalid_argument when it is not one.
PSCORO_API tf_example parse_tf_example(std::string_view serialized);
/// Serializes `example` as TF does (keys in order).
PSCORO_API std::string serialize_tf_example(const tf_example& example);

/// The kind of a tf.train.Feature's values.
enum class tf_feature_type { bytes, float32, int64 };

/// What tf_example_parser reads of one feature: TF's FixedLenFeature (`length` set) or
/// VarLenFeature (`length` empty).
struct tf_feature_spec {
  std::string name;
  tf_feature_type type = tf_feature_type::float32;
  /// Values per example of a fixed-length feature (the element count of TF's FixedLenFeature
  /// shape); std::nullopt for a variable-length one, which takes any number, none when missing.
  std::optional<std::size_t> length;
  /// A fixed-length feature's values when an example lacks it: `*length` values of `type`, or one
  /// value repeated; std::nullopt makes the feature required. Variable-length features have none.
  std::optional<tf_example::feature> default_value;
};

namespace detail {
// One feature's values in a tf_example_batch.
struct tf_example_column {
  tf_feature_type type = tf_feature_type::float32;
  std::vector<float> floats;
  std::vector<std::int64_t> int64s;
  std::string bytes;                    // the byte strings back to back
  std::vector<std::size_t> bytes_ends;  // where each one ends in `bytes`
  std::vector<std::size_t> row_splits{0};
  int seen = 0;  // the parser's state for the example being parsed: the kind of list read last
};
}  // namespace detail

/// Examples parsed by tf_example_parser, column by column in the spec's order (as TF's
/// ParseExample returns them): feature f's values of all examples one after another, example k's
/// from row_splits(f)[k] to row_splits(f)[k + 1] (k * length for a fixed-length feature). clear()
/// keeps the memory: a batch reused for the next records allocates nothing once it has grown.
class PSCORO_API tf_example_batch {
 public:
  /// Examples in the batch.
  std::size_t size() const noexcept { return size_; }
  void clear() noexcept;

  /// Where each example's values start in feature `f`'s column: size() + 1 offsets.
  std::span<const std::size_t> row_splits(std::size_t f) const;
  /// Feature `f`'s values, of all examples or of example `k`; throws errc::invalid_argument when
  /// the spec gives it another type (or `f` or `k` is out of range).
  std::span<const float> floats(std::size_t f) const;
  std::span<const float> floats(std::size_t f, std::size_t k) const;
  std::span<const std::int64_t> int64s(std::size_t f) const;
  std::span<const std::int64_t> int64s(std::size_t f, std::size_t k) const;
  /// Value `i` (counted over the whole column, as row_splits are) of bytes feature `f`.
  std::string_view bytes(std::size_t f, std::size_t i) const;

 private:
  friend class tf_example_parser;
  using column = detail::tf_example_column;
  const column& at(std::size_t f, tf_feature_type type) const;
  std::vector<column> columns_;
  std::size_t size_ = 0;
};

/// A tf.train.Example parser for one feature spec, reading the serialized bytes straight into a
/// tf_example_batch as TF's fast ParseExample does: no message is built, features the spec does not
/// name are skipped unread. Where protobuf would parse a record (parse_tf_example) it gives the
/// same values: features in any order, packed or unpacked lists, unknown fields skipped, a repeated
/// key's last entry winning; a Feature with no list counts as missing (TF). Thread-safe (const).
///
///   pscoro::tf_example_parser parser({{"label", pscoro::tf_feature_type::int64, 1, std::nullopt},
///                                     {"C1", pscoro::tf_feature_type::bytes, std::nullopt, std::nullopt}});
///   pscoro::tf_example_batch batch;
///   for (const auto& record : records) parser.parse(record, batch);
class PSCORO_API tf_example_parser {
 public:
  /// Throws errc::invalid_argument for an empty or repeated name, or a default value of another
  /// type or count (or on a variable-length feature).
  explicit tf_example_parser(std::vector<tf_feature_spec> features);

  const std::vector<tf_feature_spec>& features() const noexcept { return features_; }

  /// Appends the example `serialized` to `batch` (which must be empty or filled by a parser of the
  /// same spec). Throws errc::invalid_argument naming the feature and what is wrong (a malformed
  /// record, a missing required feature, another type, a wrong value count) and leaves `batch` as
  /// it was.
  void parse(std::string_view serialized, tf_example_batch& batch) const;
  /// The examples `serialized`, in one batch.
  [[nodiscard]] tf_example_batch parse(std::span<const std::string> serialized) const;

 private:
  std::size_t find(std::string_view name) const noexcept;
  std::vector<tf_feature_spec> features_;
  struct name_slot {
    std::uint64_t prefix = 0;  // the name's first 8 bytes (zero-padded): most names compare in one go
    std::uint32_t size = 0;
    std::uint32_t feature = 0;  // index + 1; 0: empty
  };
  std::vector<name_slot> slots_;  // open addressing over the names
};

}  // namespace pscoro

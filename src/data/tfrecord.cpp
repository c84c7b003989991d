#include <pscoro/data_formats.hpp>

#include "common/crc32c.hpp"
#include "data/file_reader.hpp"
#include "example.pb.h"
#include "metrics/library.hpp"

#include <fmt/format.h>
#include <google/protobuf/arena.h>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace pscoro {

namespace {

std::uint64_t load_le64(const unsigned char* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
std::uint32_t load_le32(const unsigned char* p) {
  return std::uint32_t{p[0]} | (std::uint32_t{p[1]} << 8) | (std::uint32_t{p[2]} << 16) | (std::uint32_t{p[3]} << 24);
}

// Whether a file starts with a TFRecord header (a length, then its masked CRC-32C): a plain file
// whose first record's length starts with gzip's magic (1f 8b: a length of 35,615 + k * 65,536
// bytes) is not gzip.
bool starts_with_record(std::span<const unsigned char> first) {
  return first.size() >= 12 && common::masked_crc32c(first.data(), 8) == load_le32(first.data() + 8);
}

// Records of one file after another.
class record_reader {
 public:
  explicit record_reader(std::shared_ptr<const std::vector<std::string>> paths) : paths_(std::move(paths)) {}
  ~record_reader() { close(); }
  record_reader(const record_reader&) = delete;
  record_reader& operator=(const record_reader&) = delete;

  std::optional<std::string> next() {
    while (true) {
      if (!file_) {
        if (next_file_ >= paths_->size()) return std::nullopt;
        path_ = &(*paths_)[next_file_++];
        file_ = std::make_unique<data::file_reader>(*path_, starts_with_record);  // plain or gzip
        offset_ = 0;
      }
      unsigned char header[12];
      const std::size_t got = read(header, sizeof header);
      if (got == 0) {
        close();
        continue;
      }
      const std::uint64_t start = offset_;
      if (got < sizeof header) corrupt(start, fmt::format("truncated record header ({} of 12 bytes)", got));
      const std::uint64_t length = load_le64(header);
      if (common::masked_crc32c(header, 8) != load_le32(header + 8)) corrupt(start, "the length's checksum does not match");
      if (length > (std::uint64_t{1} << 32)) corrupt(start, fmt::format("implausible record length {}", length));
      // Grown as the bytes arrive (doubling, so a large record costs amortized linear copying): a
      // file whose length field says 4 GiB, with a checksum to match, fails as truncated instead of
      // allocating and zeroing 4 GiB first.
      std::string record;
      std::size_t body = 0;
      while (body < length) {
        record.resize(std::min<std::uint64_t>(length, std::max<std::size_t>(std::size_t{1} << 20, 2 * record.size())));
        const std::size_t want = record.size() - body;
        const std::size_t got = read(record.data() + body, want);
        body += got;
        if (got < want) break;
      }
      if (body < length) corrupt(start, fmt::format("truncated record ({} of {} bytes)", body, length));
      unsigned char footer[4];
      if (read(footer, 4) < 4) corrupt(start, "truncated record (no data checksum)");
      if (common::masked_crc32c(record.data(), record.size()) != load_le32(footer)) {
        corrupt(start, "the data's checksum does not match");
      }
      offset_ = start + 12 + length + 4;
      return record;
    }
  }

 private:
  std::size_t read(void* out, std::size_t n) {
    const std::size_t got = file_->read(out, n);
    metrics::dataset_bytes_read().inc(got);
    return got;
  }

  [[noreturn]] void corrupt(std::uint64_t at, const std::string& what) {
    throw error(errc::data_loss, fmt::format("{}: corrupt TFRecord at byte {}: {}", *path_, at, what));
  }

  void close() { file_.reset(); }

  std::shared_ptr<const std::vector<std::string>> paths_;
  std::size_t next_file_ = 0;
  const std::string* path_ = nullptr;
  std::unique_ptr<data::file_reader> file_;
  std::uint64_t offset_ = 0;
};

template <class V>
const V& feature_as(const tf_example& example, std::string_view name, std::string_view kind) {
  const auto it = example.features.find(name);
  if (it == example.features.end()) {
    throw error(errc::invalid_argument, fmt::format("the example has no feature '{}'", name));
  }
  if (const auto* values = std::get_if<V>(&it->second)) return *values;
  throw error(errc::invalid_argument, fmt::format("feature '{}' is not a {} list", name, kind));
}

}  // namespace

dataset<std::string> tfrecord(std::vector<std::string> paths) {
  auto description = data::describe_files("TFRecord", paths);
  auto shared = std::make_shared<const std::vector<std::string>>(std::move(paths));
  return dataset<std::string>(
      [shared]() {
        return detail::make_source<std::string>(
            [reader = std::make_shared<record_reader>(shared)]() { return reader->next(); });
      },
      std::move(description));
}

tfrecord_writer::tfrecord_writer(std::string path, tfrecord_compression compression) : path_(std::move(path)) {
  // Level 0 without gzip framing is a plain file ("wT": transparent write).
  file_ = gzopen(path_.c_str(), compression == tfrecord_compression::gzip ? "wb6" : "wT");
  if (!file_) throw error(errc::unavailable, fmt::format("{}: cannot write: {}", path_, std::strerror(errno)));
}

tfrecord_writer::~tfrecord_writer() {
  if (file_) gzclose(static_cast<gzFile>(file_));
}

void tfrecord_writer::put(const void* data, std::size_t size) {
  if (!file_) throw error(errc::failed_precondition, fmt::format("{}: the writer is closed", path_));
  if (size && gzwrite(static_cast<gzFile>(file_), data, static_cast<unsigned>(size)) != static_cast<int>(size)) {
    int code = 0;
    throw error(errc::unavailable, fmt::format("{}: write failed: {}", path_, gzerror(static_cast<gzFile>(file_), &code)));
  }
}

void tfrecord_writer::write(std::string_view record) {
  unsigned char header[12];
  const std::uint64_t length = record.size();
  for (int i = 0; i < 8; ++i) header[i] = static_cast<unsigned char>(length >> (8 * i));
  const std::uint32_t length_crc = common::masked_crc32c(header, 8);
  for (int i = 0; i < 4; ++i) header[8 + i] = static_cast<unsigned char>(length_crc >> (8 * i));
  unsigned char footer[4];
  const std::uint32_t data_crc = common::masked_crc32c(record.data(), record.size());
  for (int i = 0; i < 4; ++i) footer[i] = static_cast<unsigned char>(data_crc >> (8 * i));
  put(header, sizeof header);
  put(record.data(), record.size());
  put(footer, sizeof footer);
}

void tfrecord_writer::flush() {
  if (!file_) throw error(errc::failed_precondition, fmt::format("{}: the writer is closed", path_));
  if (gzflush(static_cast<gzFile>(file_), Z_SYNC_FLUSH) != Z_OK) {
    int code = 0;
    throw error(errc::unavailable, fmt::format("{}: flush failed: {}", path_, gzerror(static_cast<gzFile>(file_), &code)));
  }
}

void tfrecord_writer::close() {
  if (!file_) return;
  const int status = gzclose(static_cast<gzFile>(file_));
  file_ = nullptr;
  if (status != Z_OK) throw error(errc::unavailable, fmt::format("{}: closing failed (zlib status {})", path_, status));
}

const std::vector<float>& tf_example::floats(std::string_view name) const {
  return feature_as<std::vector<float>>(*this, name, "float");
}
const std::vector<std::int64_t>& tf_example::int64s(std::string_view name) const {
  return feature_as<std::vector<std::int64_t>>(*this, name, "int64");
}
const std::vector<std::string>& tf_example::bytes(std::string_view name) const {
  return feature_as<std::vector<std::string>>(*this, name, "bytes");
}

tf_example parse_tf_example(std::string_view serialized) {
  // The parsed message lives in an arena reused by this thread: one reset per record instead of a
  // malloc and free per feature, key and list.
  thread_local google::protobuf::Arena arena;
  struct reset_on_exit {
    ~reset_on_exit() { arena.Reset(); }
  } reset;
  auto& message = *google::protobuf::Arena::CreateMessage<tf::Example>(&arena);
  if (!message.ParseFromArray(serialized.data(), static_cast<int>(serialized.size()))) {
    throw error(errc::invalid_argument,
                fmt::format("a {}-byte record is not a serialized tf.train.Example", serialized.size()));
  }
  tf_example out;
  for (const auto& [name, feature] : message.features().feature()) {
    switch (feature.kind_case()) {
      case tf::Feature::kBytesList:
        out.features.emplace(name, std::vector<std::string>(feature.bytes_list().value().begin(),
                                                            feature.bytes_list().value().end()));
        break;
      case tf::Feature::kFloatList:
        out.features.emplace(name, std::vector<float>(feature.float_list().value().begin(),
                                                      feature.float_list().value().end()));
        break;
      case tf::Feature::kInt64List:
        out.features.emplace(name, std::vector<std::int64_t>(feature.int64_list().value().begin(),
                                                             feature.int64_list().value().end()));
        break;
      case tf::Feature::KIND_NOT_SET:
        out.features.emplace(name, std::vector<std::string>{});  // TF reads an empty feature as empty
        break;
    }
  }
  return out;
}

std::string serialize_tf_example(const tf_example& example) {
  tf::Example message;
  auto& features = *message.mutable_features()->mutable_feature();
  for (const auto& [name, values] : example.features) {
    auto& feature = features[name];
    if (const auto* b = std::get_if<std::vector<std::string>>(&values)) {
      for (const auto& v : *b) feature.mutable_bytes_list()->add_value(v);
      if (b->empty()) feature.mutable_bytes_list();
    } else if (const auto* f = std::get_if<std::vector<float>>(&values)) {
      feature.mutable_float_list()->mutable_value()->Add(f->begin(), f->end());
    } else {
      const auto& i = std::get<std::vector<std::int64_t>>(values);
      feature.mutable_int64_list()->mutable_value()->Add(i.begin(), i.end());
    }
  }
  std::string out;
  {
    // Deterministic: map entries in key order, so equal examples serialize to equal bytes.
    google::protobuf::io::StringOutputStream stream(&out);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    message.SerializeToCodedStream(&coded);
  }  // the coded stream flushes into `out` when it goes
  return out;
}

}  // namespace pscoro

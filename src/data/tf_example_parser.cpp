// tf_example_parser: tf.train.Example's wire format walked by hand against a feature spec, the
// values written straight into a tf_example_batch (TF's example_proto_fast_parsing.cc does the
// same). Where protobuf parses a record, this reads the same values (docs/design.md, "A fast
// tf.Example parser"): the messages it walks are
//   Example  { Features features = 1; }
//   Features { map<string, Feature> feature = 1; }   an entry: { string key = 1; Feature value = 2; }
//   Feature  { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2; Int64List int64_list = 3; } }
//   BytesList { repeated bytes value = 1; }  FloatList { repeated float value = 1 [packed]; }
//   Int64List { repeated int64 value = 1 [packed]; }
// with protobuf's rules for what is not in them: a field of another number, or of the right number
// but another wire type, is unknown and skipped; a repeated message field merges (two Features
// fields in an Example, two values in one map entry); a oneof set again to another list starts
// over; a map key's last entry replaces the ones before it.
#include <pscoro/data_formats.hpp>

#include <pscoro/error.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <type_traits>

namespace pscoro {

namespace {

using byte = unsigned char;

constexpr std::uint32_t tag_of(std::uint32_t field, std::uint32_t wire_type) { return field << 3 | wire_type; }
enum wire_type : std::uint32_t { varint = 0, fixed64 = 1, length_delimited = 2, start_group = 3, end_group = 4, fixed32 = 5 };

// Deeper than protobuf's own limit (100): a record protobuf parses never fails here for nesting.
constexpr int max_group_depth = 200;

std::string_view type_name(tf_feature_type type) {
  switch (type) {
    case tf_feature_type::bytes: return "bytes";
    case tf_feature_type::float32: return "float";
    case tf_feature_type::int64: return "int64";
  }
  return "?";
}

// The oneof field number of a feature type's list: bytes_list 1, float_list 2, int64_list 3.
int kind_of(tf_feature_type type) { return static_cast<int>(type) + 1; }

std::uint64_t fnv1a(std::string_view s) noexcept {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (const char c : s) h = (h ^ static_cast<byte>(c)) * 0x100000001b3ULL;
  return h;
}

std::uint64_t prefix_of(std::string_view s) noexcept {
  std::uint64_t out = 0;
  if (!s.empty()) std::memcpy(&out, s.data(), std::min<std::size_t>(s.size(), 8));  // "" may have no data()
  return out;
}

// A cursor over one record, which throws naming the record, the feature being read (if any) and
// the byte offset when the bytes are not what protobuf would parse.
class wire_reader {
 public:
  explicit wire_reader(std::string_view record) noexcept
      : begin_(reinterpret_cast<const byte*>(record.data())), size_(record.size()) {}

  const byte* begin() const noexcept { return begin_; }
  const byte* end() const noexcept { return begin_ + size_; }
  std::string_view feature;  // the feature whose entry is being read, for errors

  [[noreturn]] void fail(const byte* at, std::string_view what) const {
    throw error(errc::invalid_argument,
                fmt::format("a {}-byte record is not a serialized tf.train.Example: {}{} at byte {}", size_,
                            feature.empty() ? "" : fmt::format("feature '{}': ", feature), what, at - begin_));
  }

  std::uint64_t read_varint(const byte*& p, const byte* end) const {
    if (p < end && *p < 0x80) return *p++;
    const byte* start = p;
    std::uint64_t value = 0;
    for (unsigned shift = 0; shift < 64; shift += 7) {  // 10 bytes at most; bits past 64 dropped
      if (p == end) fail(start, "truncated varint");
      const std::uint64_t b = *p++;
      value |= (b & 0x7f) << shift;
      if (b < 0x80) return value;
    }
    fail(start, "varint longer than 10 bytes");
  }

  std::uint32_t read_tag(const byte*& p, const byte* end) const {
    // One byte: fields 1 to 15 of a valid wire type (all of tf.train.Example's).
    if (p < end && *p < 0x80 && *p >= 0x08 && (*p & 7) <= fixed32) return *p++;
    return read_long_tag(p, end);
  }

  std::uint32_t read_long_tag(const byte*& p, const byte* end) const {
    const byte* start = p;
    const std::uint64_t tag = read_varint(p, end);
    if (tag > 0xffffffffu || (tag >> 3) == 0) fail(start, fmt::format("invalid field tag {}", tag));
    if ((tag & 7) > fixed32) fail(start, fmt::format("invalid wire type {} (field {})", tag & 7, tag >> 3));
    return static_cast<std::uint32_t>(tag);
  }

  // The bytes of a length-delimited field whose length is at `p`, which moves past them.
  std::string_view read_bytes(const byte*& p, const byte* end) const {
    const byte* start = p;
    const std::uint64_t length = read_varint(p, end);
    if (length > static_cast<std::uint64_t>(end - p)) {  // no arithmetic on `length`: it may be huge
      fail(start, fmt::format("length {} runs past the end ({} bytes left)", length, end - p));
    }
    const std::string_view out(reinterpret_cast<const char*>(p), static_cast<std::size_t>(length));
    p += length;
    return out;
  }

  // Moves `p` past the value of a field with tag `tag` (read already).
  void skip(std::uint32_t tag, const byte*& p, const byte* end, int depth = 0) const {
    switch (tag & 7) {
      case varint: (void)read_varint(p, end); return;
      case fixed64: return skip_fixed(p, end, 8);
      case length_delimited: (void)read_bytes(p, end); return;
      case fixed32: return skip_fixed(p, end, 4);
      case start_group: {
        if (depth >= max_group_depth) fail(p, "groups nested too deep");
        while (true) {
          if (p == end) fail(p, fmt::format("group {} has no end", tag >> 3));
          const std::uint32_t inner = read_tag(p, end);
          if ((inner & 7) == end_group) {
            if ((inner >> 3) != (tag >> 3)) fail(p, fmt::format("group {} ends as group {}", tag >> 3, inner >> 3));
            return;
          }
          skip(inner, p, end, depth + 1);
        }
      }
      default: fail(p, fmt::format("unexpected end of group {}", tag >> 3));
    }
  }

  const byte* as_bytes(std::string_view s) const noexcept { return reinterpret_cast<const byte*>(s.data()); }

 private:
  void skip_fixed(const byte*& p, const byte* end, std::size_t n) const {
    if (static_cast<std::size_t>(end - p) < n) fail(p, fmt::format("truncated {}-byte value", n));
    p += n;
  }

  const byte* begin_;
  std::size_t size_;
};

}  // namespace

// ---- the batch ----

void tf_example_batch::clear() noexcept {
  for (auto& c : columns_) {
    c.floats.clear();
    c.int64s.clear();
    c.bytes.clear();
    c.bytes_ends.clear();
    c.row_splits.assign(1, 0);
    c.seen = 0;
  }
  size_ = 0;
}

const tf_example_batch::column& tf_example_batch::at(std::size_t f, tf_feature_type type) const {
  if (f >= columns_.size()) {
    throw error(errc::invalid_argument, fmt::format("feature {} of a batch of {} features", f, columns_.size()));
  }
  const auto& c = columns_[f];
  if (c.type != type) {
    throw error(errc::invalid_argument,
                fmt::format("feature {} of the batch holds {} values, not {}", f, type_name(c.type), type_name(type)));
  }
  return c;
}

std::span<const std::size_t> tf_example_batch::row_splits(std::size_t f) const {
  if (f >= columns_.size()) {
    throw error(errc::invalid_argument, fmt::format("feature {} of a batch of {} features", f, columns_.size()));
  }
  return columns_[f].row_splits;
}

namespace {
template <class T>
std::span<const T> example_values(std::span<const T> all, std::span<const std::size_t> splits, std::size_t k) {
  if (k >= splits.size() - 1) {  // splits holds size() + 1 >= 1 offsets
    throw error(errc::invalid_argument, fmt::format("example {} of a batch of {}", k, splits.size() - 1));
  }
  return all.subspan(splits[k], splits[k + 1] - splits[k]);
}
}  // namespace

std::span<const float> tf_example_batch::floats(std::size_t f) const { return at(f, tf_feature_type::float32).floats; }
std::span<const float> tf_example_batch::floats(std::size_t f, std::size_t k) const {
  const auto& c = at(f, tf_feature_type::float32);
  return example_values<float>(c.floats, c.row_splits, k);
}
std::span<const std::int64_t> tf_example_batch::int64s(std::size_t f) const {
  return at(f, tf_feature_type::int64).int64s;
}
std::span<const std::int64_t> tf_example_batch::int64s(std::size_t f, std::size_t k) const {
  const auto& c = at(f, tf_feature_type::int64);
  return example_values<std::int64_t>(c.int64s, c.row_splits, k);
}
std::string_view tf_example_batch::bytes(std::size_t f, std::size_t i) const {
  const auto& c = at(f, tf_feature_type::bytes);
  if (i >= c.bytes_ends.size()) {
    throw error(errc::invalid_argument, fmt::format("value {} of feature {}, which holds {}", i, f, c.bytes_ends.size()));
  }
  const std::size_t begin = i == 0 ? 0 : c.bytes_ends[i - 1];
  return std::string_view(c.bytes).substr(begin, c.bytes_ends[i] - begin);
}

// ---- the parser ----

namespace {

using column = detail::tf_example_column;

std::size_t value_count(const column& c) noexcept {
  switch (c.type) {
    case tf_feature_type::bytes: return c.bytes_ends.size();
    case tf_feature_type::float32: return c.floats.size();
    case tf_feature_type::int64: return c.int64s.size();
  }
  return 0;
}

// Drops the values of the example being parsed.
void truncate(column& c) noexcept {
  const std::size_t begin = c.row_splits.back();
  if (value_count(c) == begin) return;
  switch (c.type) {
    case tf_feature_type::bytes:
      c.bytes_ends.resize(begin);
      c.bytes.resize(begin == 0 ? 0 : c.bytes_ends[begin - 1]);
      break;
    case tf_feature_type::float32: c.floats.resize(begin); break;
    case tf_feature_type::int64: c.int64s.resize(begin); break;
  }
}

void append_bytes(column& c, std::string_view value) {
  c.bytes.append(value);
  c.bytes_ends.push_back(c.bytes.size());
}

// The values of a BytesList, FloatList or Int64List (`list`, the field's bytes) appended to `c`.
void read_list(const wire_reader& r, std::string_view list, column& c) {
  const byte* p = r.as_bytes(list);
  const byte* const end = p + list.size();
  while (p < end) {
    const std::uint32_t tag = r.read_tag(p, end);
    switch (c.type) {
      case tf_feature_type::bytes:
        if (tag == tag_of(1, length_delimited)) {
          append_bytes(c, r.read_bytes(p, end));
          continue;
        }
        break;
      case tf_feature_type::float32:
        if (tag == tag_of(1, length_delimited)) {
          const byte* start = p;
          const std::string_view packed = r.read_bytes(p, end);
          if (packed.size() % 4 != 0) r.fail(start, fmt::format("packed floats of {} bytes", packed.size()));
          const std::size_t n = c.floats.size();
          c.floats.resize(n + packed.size() / 4);
          static_assert(std::endian::native == std::endian::little, "floats are read as stored: little-endian");
          if (!packed.empty()) std::memcpy(c.floats.data() + n, packed.data(), packed.size());
          continue;
        }
        if (tag == tag_of(1, fixed32)) {
          if (end - p < 4) r.fail(p, "truncated float");
          float v;
          std::memcpy(&v, p, 4);
          p += 4;
          c.floats.push_back(v);
          continue;
        }
        break;
      case tf_feature_type::int64:
        if (tag == tag_of(1, length_delimited)) {
          const std::string_view packed = r.read_bytes(p, end);
          const byte* q = r.as_bytes(packed);
          const byte* const packed_end = q + packed.size();
          while (q < packed_end) c.int64s.push_back(static_cast<std::int64_t>(r.read_varint(q, packed_end)));
          continue;
        }
        if (tag == tag_of(1, varint)) {
          c.int64s.push_back(static_cast<std::int64_t>(r.read_varint(p, end)));
          continue;
        }
        break;
    }
    r.skip(tag, p, end);
  }
}

// A Feature message merged into what `c` holds of this example: a list of the kind seen last
// appends, another kind starts over (protobuf's oneof).
void read_feature(const wire_reader& r, std::string_view feature, column& c) {
  const byte* p = r.as_bytes(feature);
  const byte* const end = p + feature.size();
  while (p < end) {
    const std::uint32_t tag = r.read_tag(p, end);
    if ((tag & 7) != length_delimited || (tag >> 3) < 1 || (tag >> 3) > 3) {
      r.skip(tag, p, end);
      continue;
    }
    const std::string_view list = r.read_bytes(p, end);
    const int kind = static_cast<int>(tag >> 3);
    if (kind != c.seen) {
      truncate(c);
      c.seen = kind;
    }
    // A list of another type than the spec's is not read: unless a later list replaces it, the
    // example fails with the type named.
    if (kind == kind_of(c.type)) read_list(r, list, c);
  }
}

}  // namespace

tf_example_parser::tf_example_parser(std::vector<tf_feature_spec> features) : features_(std::move(features)) {
  if (features_.size() >= 0xffffffffu) throw error(errc::invalid_argument, "too many features");
  std::size_t capacity = 8;
  while (capacity < 2 * features_.size()) capacity *= 2;
  slots_.assign(capacity, name_slot{});
  for (std::size_t i = 0; i < features_.size(); ++i) {
    auto& spec = features_[i];
    if (spec.name.empty()) throw error(errc::invalid_argument, fmt::format("feature {} of the spec has no name", i));
    if (find(spec.name) != features_.size()) {
      throw error(errc::invalid_argument, fmt::format("feature '{}' is in the spec twice", spec.name));
    }
    if (spec.default_value) {
      if (!spec.length) {
        throw error(errc::invalid_argument,
                    fmt::format("feature '{}' has variable length: it takes no default value", spec.name));
      }
      const bool matches = std::visit(
          [&](auto& values) {
            using V = typename std::decay_t<decltype(values)>::value_type;
            const tf_feature_type type = std::is_same_v<V, float>          ? tf_feature_type::float32
                                         : std::is_same_v<V, std::int64_t> ? tf_feature_type::int64
                                                                           : tf_feature_type::bytes;
            if (type != spec.type) return false;
            if (values.size() == 1 && *spec.length != 1) values.assign(*spec.length, V(values[0]));
            return values.size() == *spec.length;
          },
          *spec.default_value);
      if (!matches) {
        throw error(errc::invalid_argument,
                    fmt::format("feature '{}': the default value is not {} or one {} value", spec.name,
                                *spec.length, type_name(spec.type)));
      }
    }
    if (spec.name.size() > 0xffffffffu) throw error(errc::invalid_argument, "a feature name of 4 GiB or more");
    std::size_t slot = fnv1a(spec.name) & (slots_.size() - 1);
    while (slots_[slot].feature != 0) slot = (slot + 1) & (slots_.size() - 1);
    slots_[slot] = {prefix_of(spec.name), static_cast<std::uint32_t>(spec.name.size()), static_cast<std::uint32_t>(i + 1)};
  }
}

std::size_t tf_example_parser::find(std::string_view name) const noexcept {
  const std::size_t mask = slots_.size() - 1;
  const std::uint64_t prefix = prefix_of(name);
  for (std::size_t slot = fnv1a(name) & mask;; slot = (slot + 1) & mask) {
    const name_slot& entry = slots_[slot];
    if (entry.feature == 0) return features_.size();
    if (entry.prefix == prefix && entry.size == name.size() &&
        (name.size() <= 8 || std::memcmp(features_[entry.feature - 1].name.data() + 8, name.data() + 8, name.size() - 8) == 0)) {
      return entry.feature - 1;
    }
  }
}

void tf_example_parser::parse(std::string_view serialized, tf_example_batch& batch) const {
  auto& columns = batch.columns_;
  if (columns.empty() && batch.size_ == 0) {
    columns.resize(features_.size());
    for (std::size_t f = 0; f < features_.size(); ++f) columns[f].type = features_[f].type;
  }
  if (columns.size() != features_.size() ||
      !std::equal(columns.begin(), columns.end(), features_.begin(),
                  [](const column& c, const tf_feature_spec& s) { return c.type == s.type; })) {
    throw error(errc::invalid_argument, "the batch holds the examples of another feature spec");
  }
  wire_reader r(serialized);
  try {
    const byte* p = r.begin();
    const byte* const end = r.end();
    while (p < end) {
      const std::uint32_t tag = r.read_tag(p, end);
      if (tag != tag_of(1, length_delimited)) {  // Example.features
        r.skip(tag, p, end);
        continue;
      }
      const std::string_view features = r.read_bytes(p, end);
      const byte* q = r.as_bytes(features);
      const byte* const features_end = q + features.size();
      while (q < features_end) {
        const std::uint32_t entry_tag = r.read_tag(q, features_end);
        if (entry_tag != tag_of(1, length_delimited)) {  // Features.feature, a map entry
          r.skip(entry_tag, q, features_end);
          continue;
        }
        const std::string_view entry = r.read_bytes(q, features_end);
        const byte* const entry_begin = r.as_bytes(entry);
        const byte* const entry_end = entry_begin + entry.size();
        // What serializers write: the key, then the value, nothing else.
        std::string_view key, value;
        bool key_then_value = false;
        if (entry_begin < entry_end && *entry_begin == tag_of(1, length_delimited)) {
          const byte* e = entry_begin + 1;
          key = r.read_bytes(e, entry_end);
          if (e < entry_end && *e == tag_of(2, length_delimited)) {
            ++e;
            value = r.read_bytes(e, entry_end);
            key_then_value = e == entry_end;
          }
        }
        if (!key_then_value) {  // the key first (the last one wins; none is ""), wherever it is
          key = {};
          for (const byte* e = entry_begin; e < entry_end;) {
            const std::uint32_t field = r.read_tag(e, entry_end);
            if (field == tag_of(1, length_delimited)) {
              key = r.read_bytes(e, entry_end);
            } else {
              r.skip(field, e, entry_end);
            }
          }
        }
        const std::size_t f = find(key);
        if (f == features_.size()) continue;  // not in the spec: its value is never read
        auto& c = columns[f];
        truncate(c);  // the entry replaces any entry of the same key before it
        c.seen = 0;   // an entry without a value, or with an empty Feature, is missing (TF)
        r.feature = features_[f].name;
        if (key_then_value) {
          read_feature(r, value, c);
        } else {
          for (const byte* e = entry_begin; e < entry_end;) {  // every value, merged
            const std::uint32_t field = r.read_tag(e, entry_end);
            if (field == tag_of(2, length_delimited)) {
              read_feature(r, r.read_bytes(e, entry_end), c);
            } else {
              r.skip(field, e, entry_end);
            }
          }
        }
        r.feature = {};
      }
    }
    for (std::size_t f = 0; f < features_.size(); ++f) {
      auto& c = columns[f];
      const auto& spec = features_[f];
      if (c.seen == 0) {
        if (spec.length) {
          if (!spec.default_value) {
            throw error(errc::invalid_argument,
                        fmt::format("the example has no feature '{}', which the spec requires", spec.name));
          }
          std::visit(
              [&](const auto& values) {
                using V = typename std::decay_t<decltype(values)>::value_type;
                if constexpr (std::is_same_v<V, float>) {
                  c.floats.insert(c.floats.end(), values.begin(), values.end());
                } else if constexpr (std::is_same_v<V, std::int64_t>) {
                  c.int64s.insert(c.int64s.end(), values.begin(), values.end());
                } else {
                  for (const auto& v : values) append_bytes(c, v);
                }
              },
              *spec.default_value);
        }
      } else if (c.seen != kind_of(spec.type)) {
        throw error(errc::invalid_argument,
                    fmt::format("feature '{}' is a {} list, the spec wants {}", spec.name,
                                type_name(static_cast<tf_feature_type>(c.seen - 1)), type_name(spec.type)));
      } else if (spec.length && value_count(c) - c.row_splits.back() != *spec.length) {
        throw error(errc::invalid_argument,
                    fmt::format("feature '{}' has {} {} values, the spec wants {}", spec.name,
                                value_count(c) - c.row_splits.back(), type_name(spec.type), *spec.length));
      }
    }
  } catch (...) {
    for (auto& c : columns) {
      truncate(c);
      c.seen = 0;
    }
    throw;
  }
  for (auto& c : columns) {
    c.row_splits.push_back(value_count(c));
    c.seen = 0;
  }
  ++batch.size_;
}

tf_example_batch tf_example_parser::parse(std::span<const std::string> serialized) const {
  tf_example_batch batch;
  for (const auto& record : serialized) parse(record, batch);
  return batch;
}

}  // namespace pscoro

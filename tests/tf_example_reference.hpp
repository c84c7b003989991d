// What tf_example_parser must read of a record, derived from protobuf's parse of it
// (parse_tf_example): shared by the unit tests and the tfrecord fuzz target.
#pragma once

#include <pscoro/data_formats.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace pscoro::testing {

/// A protobuf wire writer, for records protobuf's serializer never writes.
namespace wire {

inline std::string varint(std::uint64_t v) {
  std::string out;
  for (; v >= 0x80; v >>= 7) out += static_cast<char>((v & 0x7f) | 0x80);
  out += static_cast<char>(v);
  return out;
}
inline std::string tag(std::uint32_t field, std::uint32_t wire_type) { return varint(field << 3 | wire_type); }
inline std::string len_field(std::uint32_t field, std::string_view bytes) {
  return tag(field, 2) + varint(bytes.size()) + std::string(bytes);
}
inline std::string varint_field(std::uint32_t field, std::uint64_t v) { return tag(field, 0) + varint(v); }
inline std::string float_bytes(float f) {
  std::string out(4, '\0');
  std::memcpy(out.data(), &f, 4);
  return out;
}

}  // namespace wire

/// One example's values as a batch holds them, per feature of the spec.
using tf_columns = std::vector<tf_example::feature>;

inline std::size_t value_count_of(const tf_example::feature& values) {
  return std::visit([](const auto& v) { return v.size(); }, values);
}

/// What the spec reads of `example`: its values, or std::nullopt when the spec rejects it.
inline std::optional<tf_columns> spec_values(const tf_example& example, const std::vector<tf_feature_spec>& spec) {
  tf_columns out;
  for (const auto& s : spec) {
    const auto it = example.features.find(s.name);
    if (it == example.features.end()) {
      if (s.length && !s.default_value) return std::nullopt;
      if (s.default_value) {
        out.push_back(*s.default_value);
      } else {
        switch (s.type) {
          case tf_feature_type::bytes: out.emplace_back(std::vector<std::string>{}); break;
          case tf_feature_type::float32: out.emplace_back(std::vector<float>{}); break;
          case tf_feature_type::int64: out.emplace_back(std::vector<std::int64_t>{}); break;
        }
      }
      continue;
    }
    if (it->second.index() != static_cast<std::size_t>(s.type)) return std::nullopt;
    if (s.length && value_count_of(it->second) != *s.length) return std::nullopt;
    out.push_back(it->second);
  }
  return out;
}

/// Example `k` of `batch`, feature by feature.
inline tf_columns batch_columns(const tf_example_batch& batch, const std::vector<tf_feature_spec>& spec, std::size_t k) {
  tf_columns out;
  for (std::size_t f = 0; f < spec.size(); ++f) {
    switch (spec[f].type) {
      case tf_feature_type::bytes: {
        std::vector<std::string> v;
        const auto splits = batch.row_splits(f);
        for (std::size_t i = splits[k]; i < splits[k + 1]; ++i) v.emplace_back(batch.bytes(f, i));
        out.emplace_back(std::move(v));
        break;
      }
      case tf_feature_type::float32: {
        const auto v = batch.floats(f, k);
        out.emplace_back(std::vector<float>(v.begin(), v.end()));
        break;
      }
      case tf_feature_type::int64: {
        const auto v = batch.int64s(f, k);
        out.emplace_back(std::vector<std::int64_t>(v.begin(), v.end()));
        break;
      }
    }
  }
  return out;
}

/// Equal values, floats compared by their bits (a NaN read from a record equals itself).
inline bool same_columns(const std::optional<tf_columns>& a, const std::optional<tf_columns>& b) {
  if (a.has_value() != b.has_value()) return false;
  if (!a) return true;
  if (a->size() != b->size()) return false;
  for (std::size_t i = 0; i < a->size(); ++i) {
    const auto* fa = std::get_if<std::vector<float>>(&(*a)[i]);
    const auto* fb = std::get_if<std::vector<float>>(&(*b)[i]);
    if (fa && fb) {
      if (fa->size() != fb->size() || (!fa->empty() && std::memcmp(fa->data(), fb->data(), 4 * fa->size()) != 0)) return false;
    } else if ((*a)[i] != (*b)[i]) {
      return false;
    }
  }
  return true;
}

/// Whether the fast parser's outcome on a record (`fast`: what it read, std::nullopt when it
/// failed) is what protobuf's parse of it, `slow`, implies. A Feature with no list reaches
/// parse_tf_example as an empty bytes list and the fast parser as a missing feature (TF's rule),
/// so a spec feature that protobuf gives as an empty bytes list may be either.
inline bool agrees_with_protobuf(const tf_example& slow, const std::vector<tf_feature_spec>& spec,
                                 const std::optional<tf_columns>& fast) {
  std::vector<std::string> ambiguous;
  for (const auto& s : spec) {
    const auto it = slow.features.find(s.name);
    if (it != slow.features.end() && it->second.index() == 0 && value_count_of(it->second) == 0) {
      ambiguous.push_back(s.name);
    }
  }
  const std::size_t subsets = ambiguous.size() <= 10 ? std::size_t{1} << ambiguous.size() : 2;
  for (std::size_t mask = 0; mask < subsets; ++mask) {
    tf_example variant = slow;
    for (std::size_t i = 0; i < ambiguous.size(); ++i) {
      if (subsets == 2 ? mask == 1 : (mask >> i) & 1) variant.features.erase(ambiguous[i]);
    }
    if (same_columns(spec_values(variant, spec), fast)) return true;
  }
  return false;
}

}  // namespace pscoro::testing

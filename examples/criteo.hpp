// Criteo-format click data with a known ground truth, for the CTR example.
//
// A line is Criteo's TSV: label, 13 integer features, 26 categorical features (8 hex digits),
// tab-separated, an empty field for a missing value. The generator draws line i from a seed alone
// (any line without the ones before it), and its labels come from a logistic model it knows, so
// the best AUC any model can reach on its data is known: the AUC of the true probabilities. Lines
// are parsed by pscoro's own Criteo reader (pscoro::parse_criteo_line, pscoro::criteo_tsv).
//
// The truth: logit = bias + sum_j c_j * log1p(I_j) + sum_f w_f(C_f), categorical values drawn per
// field from a Zipf law over its vocabulary (10 to 10,000 values), ~5% of categoricals and ~10% of
// integers missing (contributing 0).
#pragma once

#include <pscoro/data_formats.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace examples::criteo {

inline constexpr std::size_t integer_features = 13;
inline constexpr std::size_t categorical_features = 26;

inline std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
inline std::uint64_t hash(std::uint64_t seed, std::uint64_t a, std::uint64_t b = 0) {
  return mix64(mix64(seed ^ mix64(a + 0x9e3779b97f4a7c15ULL)) + b * 0xd1b54a32d192ed03ULL);
}
inline double uniform01(std::uint64_t bits) { return static_cast<double>(bits >> 11) * 0x1.0p-53; }
inline double normal(std::uint64_t bits_a, std::uint64_t bits_b) {
  return std::sqrt(-2.0 * std::log(1.0 - uniform01(bits_a))) * std::cos(6.283185307179586 * uniform01(bits_b));
}

class generator {
 public:
  explicit generator(std::uint64_t seed) : seed_(seed) {
    static constexpr std::array<std::size_t, 6> vocabularies{10, 50, 200, 1000, 3000, 10000};
    bias_ = -1.3;
    for (std::size_t j = 0; j < integer_features; ++j) {
      coefficient_[j] = 0.25 * normal(hash(seed, 1, j), hash(seed, 2, j));
      mean_[j] = std::exp(5.0 * uniform01(hash(seed, 3, j)));
    }
    for (std::size_t f = 0; f < categorical_features; ++f) {
      auto& field = fields_[f];
      const std::size_t size = vocabularies[(f * 7) % vocabularies.size()];
      // Frequent values matter more than rare ones, as in real logs; large vocabularies carry a
      // little less signal per value.
      field.scale = 0.5 / std::sqrt(1.0 + std::log10(static_cast<double>(size)));
      field.cumulative.resize(size);
      double total = 0;
      for (std::size_t r = 0; r < size; ++r) field.cumulative[r] = total += std::pow(double(r + 1), -1.2);
      for (auto& c : field.cumulative) c /= total;
    }
  }

  /// Line `index` of the stream, and the truth's probability that its label is 1.
  std::string line(std::uint64_t index, double* probability = nullptr) const {
    const std::uint64_t key = hash(seed_, 100, index);
    double logit = bias_;
    std::string out;
    out.reserve(200);
    char buffer[24];
    std::string features;
    for (std::size_t j = 0; j < integer_features; ++j) {
      features += '\t';
      if (uniform01(hash(key, 200, j)) < 0.10) continue;
      // Geometric counts with a per-feature mean.
      const double u = uniform01(hash(key, 300, j));
      const auto count = static_cast<std::int64_t>(std::floor(std::log(1.0 - u) / std::log(1.0 - 1.0 / (1.0 + mean_[j]))));
      logit += coefficient_[j] * std::log1p(static_cast<double>(count));
      std::snprintf(buffer, sizeof buffer, "%lld", static_cast<long long>(count));
      features += buffer;
    }
    for (std::size_t f = 0; f < categorical_features; ++f) {
      features += '\t';
      if (uniform01(hash(key, 400, f)) < 0.05) continue;
      const auto& field = fields_[f];
      const double u = uniform01(hash(key, 500, f));
      const auto rank = static_cast<std::size_t>(std::lower_bound(field.cumulative.begin(), field.cumulative.end(), u) -
                                                 field.cumulative.begin());
      const std::size_t r = std::min(rank, field.cumulative.size() - 1);
      logit += field.scale * normal(hash(seed_, 600 + f, r), hash(seed_, 700 + f, r));
      std::snprintf(buffer, sizeof buffer, "%08x", static_cast<unsigned>(hash(seed_, 800 + f, r) & 0xffffffffu));
      features += buffer;
    }
    const double p = 1.0 / (1.0 + std::exp(-logit));
    if (probability) *probability = p;
    out += uniform01(hash(key, 900)) < p ? '1' : '0';
    out += features;
    return out;
  }

 private:
  struct field {
    std::vector<double> cumulative;  // Zipf CDF over the vocabulary
    double scale = 0;
  };
  std::uint64_t seed_;
  double bias_;
  std::array<double, integer_features> coefficient_{};
  std::array<double, integer_features> mean_{};
  std::array<field, categorical_features> fields_;
};

/// Writes lines [0, lines) of `data` as Criteo TSV (if `tsv_path`) and as a TFRecord file of
/// tf.train.Example (if `tfrecord_path`): "label" int64, "I1".."I13" int64, "C1".."C26" the hex
/// text; a missing value is an empty list.
inline void write_files(const generator& data, std::int64_t lines, const std::string& tsv_path,
                        const std::string& tfrecord_path, bool gzip) {
  std::FILE* tsv = nullptr;
  if (!tsv_path.empty() && !(tsv = std::fopen(tsv_path.c_str(), "w"))) throw std::runtime_error("cannot write " + tsv_path);
  std::optional<pscoro::tfrecord_writer> records;
  if (!tfrecord_path.empty()) {
    records.emplace(tfrecord_path, gzip ? pscoro::tfrecord_compression::gzip : pscoro::tfrecord_compression::none);
  }
  for (std::int64_t i = 0; i < lines; ++i) {
    const std::string line = data.line(static_cast<std::uint64_t>(i));
    if (tsv) std::fprintf(tsv, "%s\n", line.c_str());
    if (!records) continue;
    const auto parsed = pscoro::parse_criteo_line(line);
    pscoro::tf_example example;
    example.features["label"] = std::vector<std::int64_t>{static_cast<std::int64_t>(parsed.label)};
    for (std::size_t j = 0; j < integer_features; ++j) {
      std::vector<std::int64_t> value;
      if (parsed.integers[j]) value.push_back(*parsed.integers[j]);
      example.features[fmt::format("I{}", j + 1)] = std::move(value);
    }
    for (std::size_t f = 0; f < categorical_features; ++f) {
      std::vector<std::string> value;
      if (parsed.categories[f]) value.push_back(fmt::format("{:08x}", *parsed.categories[f]));
      example.features[fmt::format("C{}", f + 1)] = std::move(value);
    }
    records->write(pscoro::serialize_tf_example(example));
  }
  if (tsv && std::fclose(tsv) != 0) throw std::runtime_error("cannot write " + tsv_path);
  if (records) records->close();
}

}  // namespace examples::criteo

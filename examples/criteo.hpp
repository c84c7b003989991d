// Criteo-format click data with a known ground truth, for the CTR and DLRM examples.
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
//
// A second form, raw_id_generator (ctr --ids raw), writes the categoricals as raw 64-bit ids (16
// hex digits) from vocabularies of up to 10 million values that drift along the stream, as logs
// keyed by user and item ids do; the example reads it with its own parser (parse_raw_line). Its
// ids past the 100 most frequent values of a field live 100,000 lines whatever their frequency, or,
// with id_lifetime::frequency (ctr --id-lifetime frequency), in proportion to their frequency: 100,000
// lines x max(1, 10,000 / rank), so the popular ones live for millions of lines and the tail churns.
#pragma once

#include <pscoro/data_formats.hpp>
#include <pscoro/dataset.hpp>
#include <pscoro/error.hpp>
#include <pscoro/per_worker.hpp>

#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <limits>
#include <memory>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
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

// The truth's bias: about 30% of the lines are clicks.
inline constexpr double truth_bias = -1.3;

// The 13 integer features and their part of the truth, the same in both generators: geometric
// counts with a per-feature mean, ~10% missing, each adding c_j * log1p(count) to the logit.
class integer_truth {
 public:
  explicit integer_truth(std::uint64_t seed) {
    for (std::size_t j = 0; j < integer_features; ++j) {
      coefficient_[j] = 0.25 * normal(hash(seed, 1, j), hash(seed, 2, j));
      mean_[j] = std::exp(5.0 * uniform01(hash(seed, 3, j)));
    }
  }

  /// Appends the integer fields of the line of key `key` to `features` (each after a tab) and adds
  /// their part to `logit`.
  void append(std::uint64_t key, std::string& features, double& logit) const {
    char buffer[24];
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
  }

 private:
  std::array<double, integer_features> coefficient_{};
  std::array<double, integer_features> mean_{};
};

/// The two forms of the categorical values (ctr --ids): Criteo's own, 8 hex digits (32-bit hashes
/// of the values), or raw 64-bit ids.
enum class id_form { criteo, raw };

/// How long a raw id lives (ctr --id-lifetime): 100,000 lines whatever its frequency, or longer the
/// more frequent it is (raw_id_generator::lifetime_of).
enum class id_lifetime { fixed, frequency };

/// Criteo's own form of the data (ctr --ids criteo, the default): each categorical value is 8 hex
/// digits, a 32-bit hash of the value, from vocabularies that never change.
class generator {
 public:
  static constexpr id_form form = id_form::criteo;

  explicit generator(std::uint64_t seed) : seed_(seed), integers_(seed) {
    static constexpr std::array<std::size_t, 6> vocabularies{10, 50, 200, 1000, 3000, 10000};
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

  std::uint64_t seed() const noexcept { return seed_; }

  /// Line `index` of the stream, and the truth's probability that its label is 1.
  std::string line(std::uint64_t index, double* probability = nullptr) const {
    const std::uint64_t key = hash(seed_, 100, index);
    double logit = truth_bias;
    std::string out;
    out.reserve(200);
    char buffer[24];
    std::string features;
    integers_.append(key, features, logit);
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
  integer_truth integers_;
  std::array<field, categorical_features> fields_;
};

/// The raw-id form of the data (ctr --ids raw): each categorical value is a raw 64-bit id written as
/// 16 hex digits, as in logs keyed by user, item and ad ids, with vocabularies like theirs:
/// - from 3 to 10,000,000 values per field, 8 fields with millions, drawn under a Zipf law (exponent
///   1.05 from 100,000 values up: a long tail, most of the values a run sees in such a field it sees
///   once; 1.2 below);
/// - drift: beyond its 100 most frequent values, a field's value of each rank is a new id every
///   100,000 lines (each rank at a phase of its own), so ids appear, are seen for a while and are
///   never seen again: the rows of a table that forgets nothing only grow. With
///   id_lifetime::frequency a rank's id lives lifetime_of(rank) lines instead, 100,000 x max(1,
///   10,000 / rank): rank 100 10M lines, 1,000 1M, 10,000 and beyond 100,000 as with fixed;
/// - the truth: logit = bias + the integers' part (as in Criteo's form) + sum_f s_f * w(id), w ~ N(0, 1)
///   drawn from the id, so a new id has a weight of its own to learn.
/// The integers and the missing values are those of Criteo's form of the same seed and line.
///
/// Why id_lifetime::frequency: with fixed lifetimes an id of rank 1,000 in a 10M-value field is seen
/// ~6 times in its life, and in 1M lines only ~13k ids of all fields are seen 50 times or more
/// (RESULTS.md, 2026-11-29 13:38); in logs keyed by users and items the popular ones live for days,
/// longer than the rest. A life in proportion to the rate (exponent 1, near the Zipf laws' 1.05 and
/// 1.2) up to rank 10,000 keeps the ranks a run can learn for a run's length and longer (rank 1,000 of
/// that field: 1M lines, ~60 sightings in them) while the ranks past 10,000, a third of a 10M-value
/// field's occurrences and nearly all of its ids, churn as before, and ranks 1,000 to 10,000 are
/// still replaced once to ten times in 1M lines. Vocabularies, Zipf laws and the truth are those of
/// fixed; so are the ids of a rank's first generation.
class raw_id_generator {
 public:
  static constexpr id_form form = id_form::raw;
  static constexpr std::uint64_t stable_ranks = 100;
  static constexpr std::uint64_t lifetime = 100'000;  // lines an id of a rank past stable_ranks lives
  // id_lifetime::frequency: ranks below this one live lifetime x (this / rank) lines.
  static constexpr std::uint64_t long_lived_ranks = 10'000;

  explicit raw_id_generator(std::uint64_t seed, id_lifetime lifetimes = id_lifetime::fixed)
      : seed_(seed), lifetimes_(lifetimes), integers_(seed) {
    static constexpr std::array<std::uint64_t, categorical_features> vocabularies{
        10,      3'000'000, 300,    100'000, 30,        10'000'000, 1'000,  300'000, 3,
        2'000'000, 3'000,  1'000'000, 100,  5'000'000, 30'000,    10,       500'000, 10'000,
        4'000'000, 300,    50,     1'000'000, 3'000,  100,       8'000'000, 30'000};
    for (std::size_t f = 0; f < categorical_features; ++f) {
      auto& field = fields_[f];
      field.size = vocabularies[f];
      field.exponent = field.size >= 100'000 ? 1.05 : 1.2;
      field.tail = std::pow(static_cast<double>(field.size) + 1, 1 - field.exponent) - 1;
      field.scale = 0.5 / std::sqrt(1.0 + std::log10(static_cast<double>(field.size)));
    }
  }

  std::uint64_t seed() const noexcept { return seed_; }
  id_lifetime lifetimes() const noexcept { return lifetimes_; }

  /// Lines an id of rank `rank` (at least stable_ranks) lives.
  std::uint64_t lifetime_of(std::uint64_t rank) const noexcept {
    if (lifetimes_ == id_lifetime::fixed || rank >= long_lived_ranks) return lifetime;
    return lifetime * long_lived_ranks / rank;  // exact in integers: the same ids on every host
  }

  /// The id of rank `rank` (0: the most frequent) of field `field` at line `index`.
  std::uint64_t id(std::size_t field, std::uint64_t rank, std::uint64_t index) const {
    if (rank < stable_ranks) return hash(seed_, 1000 + field, rank);
    const std::uint64_t life = lifetime_of(rank);
    const std::uint64_t generation = (index + hash(seed_, 2000 + field, rank) % life) / life;
    return hash(seed_, 1000 + field, rank + (generation << 32));  // ranks < 2^32: one id per (rank, generation)
  }

  /// Line `index` of the stream, and the truth's probability that its label is 1.
  std::string line(std::uint64_t index, double* probability = nullptr) const {
    const std::uint64_t key = hash(seed_, 100, index);
    double logit = truth_bias;
    std::string out;
    out.reserve(520);
    char buffer[24];
    std::string features;
    integers_.append(key, features, logit);
    for (std::size_t f = 0; f < categorical_features; ++f) {
      features += '\t';
      if (uniform01(hash(key, 400, f)) < 0.05) continue;
      const auto& field = fields_[f];
      // The inverse of the continuous power law's CDF over [1, size + 1), floored to a rank: no
      // table of millions of cumulative weights.
      const double u = uniform01(hash(key, 500, f));
      const double x = std::pow(1 + u * field.tail, 1 / (1 - field.exponent));
      const auto rank = std::min(static_cast<std::uint64_t>(x) - 1, field.size - 1);
      const std::uint64_t value = id(f, rank, index);
      logit += field.scale * normal(hash(seed_, 4000, value), hash(seed_, 4001, value));
      std::snprintf(buffer, sizeof buffer, "%016llx", static_cast<unsigned long long>(value));
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
    std::uint64_t size = 0;  // ranks
    double exponent = 0;     // of the Zipf law
    double tail = 0;         // (size + 1)^(1 - exponent) - 1, for the inverse CDF
    double scale = 0;        // of the ids' weights
  };
  std::uint64_t seed_;
  id_lifetime lifetimes_;
  integer_truth integers_;
  std::array<field, categorical_features> fields_;
};

/// A line of the raw-id form: Criteo's line with 64-bit categorical values. pscoro's Criteo reader
/// (parse_criteo_line) reads Criteo's own 32-bit form; this one is the example's.
struct raw_example {
  float label = 0;
  std::array<std::optional<std::int64_t>, integer_features> integers;
  std::array<std::optional<std::uint64_t>, categorical_features> categories;
};

/// Parses one line of the raw-id form; throws errc::invalid_argument naming the field (1-based) and
/// why, as parse_criteo_line does.
inline raw_example parse_raw_line(std::string_view line) {
  raw_example out;
  std::size_t field = 0;
  std::size_t begin = 0;
  const auto fail = [&](const std::string& what) {
    throw pscoro::error(pscoro::errc::invalid_argument, fmt::format("field {}: {}", field, what));
  };
  const auto next = [&]() -> std::string_view {
    ++field;
    if (begin > line.size()) fail(fmt::format("missing: the line has {} fields, Criteo has 40", field - 1));
    const std::size_t end = std::min(line.find('\t', begin), line.size());
    const auto text = line.substr(begin, end - begin);
    begin = end + 1;
    return text;
  };
  const auto label = next();
  if (label != "0" && label != "1") fail(fmt::format("the label must be 0 or 1, not '{}'", label));
  out.label = label == "1" ? 1.0f : 0.0f;
  for (auto& value : out.integers) {
    const auto text = next();
    if (text.empty()) continue;
    std::int64_t v = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (ec != std::errc{} || end != text.data() + text.size()) fail(fmt::format("'{}' is not an integer", text));
    value = v;
  }
  for (auto& value : out.categories) {
    const auto text = next();
    if (text.empty()) continue;
    std::uint64_t v = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v, 16);
    if (text.size() != 16 || ec != std::errc{} || end != text.data() + text.size()) {
      fail(fmt::format("'{}' is not 16 hex digits", text));
    }
    value = v;
  }
  if (begin <= line.size()) fail("more than the 40 fields of a Criteo line");
  return out;
}

/// `example` as a tf.train.Example: "label" int64, "I1".."I13" int64, "C1".."C26" the 8 hex digits
/// as bytes; a missing value is an empty list (what TF's Criteo pipelines write).
inline pscoro::tf_example to_tf_example(const pscoro::criteo_example& example) {
  pscoro::tf_example out;
  out.features["label"] = std::vector<std::int64_t>{static_cast<std::int64_t>(example.label)};
  for (std::size_t j = 0; j < integer_features; ++j) {
    std::vector<std::int64_t> value;
    if (example.integers[j]) value.push_back(*example.integers[j]);
    out.features[fmt::format("I{}", j + 1)] = std::move(value);
  }
  for (std::size_t f = 0; f < categorical_features; ++f) {
    std::vector<std::string> value;
    if (example.categories[f]) value.push_back(fmt::format("{:08x}", *example.categories[f]));
    out.features[fmt::format("C{}", f + 1)] = std::move(value);
  }
  return out;
}

/// The feature spec of to_tf_example's records: "label" one int64, "I1".."I13" int64 and
/// "C1".."C26" bytes, each of those holding one value or none.
inline std::vector<pscoro::tf_feature_spec> tf_example_spec() {
  std::vector<pscoro::tf_feature_spec> spec{{"label", pscoro::tf_feature_type::int64, 1, std::nullopt}};
  for (std::size_t j = 0; j < integer_features; ++j) {
    spec.push_back({fmt::format("I{}", j + 1), pscoro::tf_feature_type::int64, std::nullopt, std::nullopt});
  }
  for (std::size_t f = 0; f < categorical_features; ++f) {
    spec.push_back({fmt::format("C{}", f + 1), pscoro::tf_feature_type::bytes, std::nullopt, std::nullopt});
  }
  return spec;
}

/// The inverse of to_tf_example, reading records with pscoro::tf_example_parser: one batch,
/// reused for every record, so a record costs no allocation. Throws errc::invalid_argument naming
/// the feature that is missing, of another kind, holds more than one value, or is not 8 hex digits.
class tf_example_reader {
 public:
  pscoro::criteo_example operator()(std::string_view record) {
    batch_.clear();
    parser_.parse(record, batch_);
    return example(batch_, 0);
  }

  /// Example `k` of a batch that tf_example_spec()'s parser filled.
  static pscoro::criteo_example example(const pscoro::tf_example_batch& batch, std::size_t k) {
    static const auto spec = tf_example_spec();
    pscoro::criteo_example out;
    const std::int64_t label = batch.int64s(0, k)[0];  // fixed length 1
    if (label != 0 && label != 1) throw pscoro::error(pscoro::errc::invalid_argument, "feature \"label\" must be one 0 or 1");
    out.label = static_cast<float>(label);
    const auto at_most_one = [&](std::size_t f, std::size_t count) {
      if (count > 1) {
        throw pscoro::error(pscoro::errc::invalid_argument,
                            fmt::format("feature \"{}\" must hold one value or none, got {}", spec[f].name, count));
      }
      return count == 1;
    };
    for (std::size_t j = 0; j < integer_features; ++j) {
      const auto value = batch.int64s(1 + j, k);
      if (at_most_one(1 + j, value.size())) out.integers[j] = value[0];
    }
    for (std::size_t f = 0; f < categorical_features; ++f) {
      const std::size_t column = 1 + integer_features + f;
      const auto splits = batch.row_splits(column);
      if (!at_most_one(column, splits[k + 1] - splits[k])) continue;
      const std::string_view text = batch.bytes(column, splits[k]);
      std::uint32_t category = 0;
      const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), category, 16);
      if (ec != std::errc{} || end != text.data() + text.size() || text.size() != 8) {
        throw pscoro::error(pscoro::errc::invalid_argument,
                            fmt::format("feature \"{}\" must be 8 hex digits, got \"{}\"", spec[column].name, text));
      }
      out.categories[f] = category;
    }
    return out;
  }

 private:
  pscoro::tf_example_parser parser_{tf_example_spec()};
  pscoro::tf_example_batch batch_;
};

/// The forms the training data is written in.
enum class file_format { tsv, tfrecord, tfrecord_gzip };

inline std::string_view name_of(file_format format) {
  switch (format) {
    case file_format::tsv: return "tsv";
    case file_format::tfrecord: return "tfrecord";
    case file_format::tfrecord_gzip: return "tfrecord-gzip";
  }
  return "?";
}

/// Where write_training_data puts `examples` lines of seed `seed` in `files` files of `format`: a
/// directory of its own under `root`, so runs with other parameters never mix their files (raw ids
/// of frequency lifetimes: "-raw-ids-frequency-lifetimes"; the fixed ones keep their old name).
inline std::filesystem::path training_data_dir(const std::filesystem::path& root, std::uint64_t seed,
                                               std::int64_t examples, std::size_t files, file_format format,
                                               id_form ids = id_form::criteo,
                                               id_lifetime lifetimes = id_lifetime::fixed) {
  const std::string_view form = ids == id_form::criteo                ? ""
                                : lifetimes == id_lifetime::frequency ? "-raw-ids-frequency-lifetimes"
                                                                      : "-raw-ids";
  return root / fmt::format("seed-{}-examples-{}-files-{}-{}{}", seed, examples, files, name_of(format), form);
}

/// The lifetimes of a generator's ids: raw_id_generator's own, Criteo's form's never change.
template <class Generator>
id_lifetime lifetimes_of(const Generator& data) {
  if constexpr (Generator::form == id_form::raw) {
    return data.lifetimes();
  } else {
    return id_lifetime::fixed;
  }
}

/// The training files in `dir`, TF's naming ("train-00003-of-00008.tsv").
inline std::vector<std::string> training_files(const std::filesystem::path& dir, std::size_t files,
                                               file_format format) {
  const std::string_view ext = format == file_format::tsv ? "tsv" : "tfrecord";
  std::vector<std::string> out;
  for (std::size_t i = 0; i < files; ++i) out.push_back((dir / fmt::format("train-{:05}-of-{:05}.{}", i, files, ext)).string());
  return out;
}

/// Writes lines [0, examples) of `data` (a generator or a raw_id_generator), split into `files`
/// consecutive parts, as Criteo TSV files or as TFRecord files of to_tf_example (GZIP-compressed or
/// not), into training_data_dir(root, ...), which it returns. Files are written in parallel into a
/// temporary directory renamed into place at the end: the directory exists only when complete, and
/// a second call with the same parameters finds it and writes nothing. The raw-id form is written
/// as TSV only (errc::invalid_argument otherwise): tf_example_reader reads Criteo's 8 hex digits.
template <class Generator>
std::filesystem::path write_training_data(const Generator& data, const std::filesystem::path& root,
                                          std::int64_t examples, std::size_t files, file_format format) {
  namespace fs = std::filesystem;
  if (Generator::form == id_form::raw && format != file_format::tsv) {
    throw pscoro::error(pscoro::errc::invalid_argument, "the raw-id form of the data is written as TSV only");
  }
  const auto dir = training_data_dir(root, data.seed(), examples, files, format, Generator::form, lifetimes_of(data));
  if (fs::is_directory(dir)) return dir;
  fs::create_directories(root);
  const fs::path staging = dir.string() + fmt::format(".tmp-{}", ::getpid());
  fs::remove_all(staging);
  fs::create_directory(staging);
  const auto paths = training_files(staging, files, format);

  auto write_part = [&](std::size_t part) {
    const auto first = static_cast<std::int64_t>(static_cast<std::uint64_t>(examples) * part / files);
    const auto last = static_cast<std::int64_t>(static_cast<std::uint64_t>(examples) * (part + 1) / files);
    const auto& path = paths[part];
    if (format == file_format::tsv) {
      std::unique_ptr<std::FILE, int (*)(std::FILE*)> text(std::fopen(path.c_str(), "w"), &std::fclose);
      if (!text) throw std::runtime_error("cannot write " + path);
      for (std::int64_t i = first; i < last; ++i) {
        if (std::fprintf(text.get(), "%s\n", data.line(static_cast<std::uint64_t>(i)).c_str()) < 0) {
          throw std::runtime_error("cannot write " + path);
        }
      }
      if (std::fclose(text.release()) != 0) throw std::runtime_error("cannot write " + path);
      return;
    }
    pscoro::tfrecord_writer writer(path, format == file_format::tfrecord_gzip ? pscoro::tfrecord_compression::gzip
                                                                              : pscoro::tfrecord_compression::none);
    for (std::int64_t i = first; i < last; ++i) {
      const auto example = pscoro::parse_criteo_line(data.line(static_cast<std::uint64_t>(i)));
      writer.write(pscoro::serialize_tf_example(to_tf_example(example)));
    }
    writer.close();
  };
  // One thread per core, each taking the next file; the first failure wins.
  std::atomic<std::size_t> next{0};
  std::vector<std::exception_ptr> failures(files);
  {
    std::vector<std::jthread> threads;
    const std::size_t cores = std::max(1u, std::thread::hardware_concurrency());
    for (std::size_t t = 0; t < std::min(cores, files); ++t) {
      threads.emplace_back([&] {
        for (std::size_t part; (part = next++) < files;) {
          try {
            write_part(part);
          } catch (...) {
            failures[part] = std::current_exception();
          }
        }
      });
    }
  }
  for (const auto& failure : failures) {
    if (failure) {
      fs::remove_all(staging);
      std::rethrow_exception(failure);
    }
  }
  std::error_code ec;
  fs::rename(staging, dir, ec);
  if (ec) {
    fs::remove_all(staging);
    if (!fs::is_directory(dir)) throw fs::filesystem_error("cannot create", dir, ec);  // else: another writer won
  }
  return dir;
}

/// The row of categorical feature `field`'s value (or of "missing" in that field) in a hashed
/// embedding table of `rows` rows: one table for all 26 fields, the field salting the hash.
inline std::int64_t hashed_row(std::size_t field, const std::optional<std::uint64_t>& value, std::size_t rows) {
  const std::uint64_t key = value ? *value : (std::uint64_t{1} << 32) + field;
  return static_cast<std::int64_t>(hash(0xC7, field, key) % rows);
}

/// The id a model looks a field's value up with: with `rows` > 0 its row in a hashed table of that
/// many rows (hashed_row); with 0 the value itself, the key of the field's own hash table.
struct id_mapping {
  std::size_t rows = 0;

  std::int64_t operator()(std::size_t field, const std::optional<std::uint64_t>& value) const {
    if (rows > 0) return hashed_row(field, value, rows);
    // A missing value is INT64_MIN (no 32-bit value is, and a raw id, a 64-bit hash, is with odds of
    // 2^-64).
    return value ? std::bit_cast<std::int64_t>(*value) : std::numeric_limits<std::int64_t>::min();
  }
};

/// A worker's training examples: its share of the training files in `dir` (by file), read from
/// TSV or TFRecord, the file order and the examples shuffled (a buffer of `shuffle_buffer`),
/// repeated forever: the chief decides how many steps to take.
inline pscoro::dataset<pscoro::criteo_example> training_examples(const std::filesystem::path& dir, std::size_t files,
                                                                 file_format format, std::size_t shuffle_buffer,
                                                                 std::uint64_t seed, pscoro::input_context context) {
  auto shuffled_files = pscoro::from_values(training_files(dir, files, format))
                            .shard(context.num_workers, context.worker_index)
                            .shuffle(files, seed);
  auto examples = format == file_format::tsv
                      ? shuffled_files.flat_map([](std::string path) { return pscoro::criteo_tsv({std::move(path)}); })
                      : shuffled_files.flat_map([](std::string path) {
                          // A reader per file: its batch is reused record after record.
                          return pscoro::tfrecord({std::move(path)})
                              .map([reader = std::make_shared<tf_example_reader>()](const std::string& record) {
                                return (*reader)(record);
                              });
                        });
  return examples.shuffle(shuffle_buffer, seed).repeat();
}

/// A worker's raw-id training examples. Every worker reads all the files in order and takes every
/// num_workers-th line (sharding by line, not by file), so that all workers move through the
/// stream's time together, as a job training on a log in time order does: the drift of the ids and
/// a table's eviction clock then agree. Shuffled within `shuffle_buffer` lines, repeated forever.
inline pscoro::dataset<raw_example> raw_training_examples(const std::filesystem::path& dir, std::size_t files,
                                                          std::size_t shuffle_buffer, std::uint64_t seed,
                                                          pscoro::input_context context) {
  return pscoro::text_lines(training_files(dir, files, file_format::tsv))
      .shard(context.num_workers, context.worker_index)
      .map([](const std::string& line) { return parse_raw_line(line); })
      .shuffle(shuffle_buffer, seed)
      .repeat();
}

/// A test set: examples and the truth's probability for each (their AUC is the best any model can
/// reach).
template <class Example>
struct basic_test_set {
  std::vector<Example> examples;
  std::vector<double> truth;
};
using test_set = basic_test_set<pscoro::criteo_example>;

/// `count` fresh lines of the generator, far beyond any training line.
inline test_set make_test_set(const generator& data, std::size_t count) {
  test_set out;
  out.examples.reserve(count);
  out.truth.resize(count);
  for (std::size_t i = 0; i < count; ++i) {
    out.examples.push_back(pscoro::parse_criteo_line(data.line((std::uint64_t{1} << 40) + i, &out.truth[i])));
  }
  return out;
}

/// The raw-id test set: the `count` lines after the first `first` (the training lines), the
/// stream's next day: its ids drift on from the training's, as a model's next day's do.
inline basic_test_set<raw_example> make_test_set(const raw_id_generator& data, std::size_t count, std::uint64_t first) {
  basic_test_set<raw_example> out;
  out.examples.reserve(count);
  out.truth.resize(count);
  for (std::size_t i = 0; i < count; ++i) out.examples.push_back(parse_raw_line(data.line(first + i, &out.truth[i])));
  return out;
}

/// Area under the ROC curve by the rank-sum formula, ties sharing their average rank.
inline double auc(const std::vector<double>& scores, const std::vector<float>& labels) {
  std::vector<std::size_t> order(scores.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::sort(order.begin(), order.end(), [&](auto a, auto b) { return scores[a] < scores[b]; });
  double positive_ranks = 0, positives = 0;
  for (std::size_t i = 0; i < order.size();) {
    std::size_t j = i;
    while (j < order.size() && scores[order[j]] == scores[order[i]]) ++j;
    const double rank = (static_cast<double>(i + 1) + static_cast<double>(j)) / 2;
    for (std::size_t k = i; k < j; ++k) {
      if (labels[order[k]] > 0.5f) {
        positive_ranks += rank;
        positives += 1;
      }
    }
    i = j;
  }
  const double negatives = static_cast<double>(scores.size()) - positives;
  return (positive_ranks - positives * (positives + 1) / 2) / (positives * negatives);
}

}  // namespace examples::criteo

// tf_example_parser against protobuf: records written by hand in every form protobuf reads
// (packed or not, fields in any order, unknown fields, repeated keys, merged messages) parse to
// what parse_tf_example reads, and malformed ones fail with a message, never reading past the
// record (each is parsed from a buffer of exactly its size, which ASan guards).
#include "test_support.hpp"
#include "tf_example_reference.hpp"

#include <pscoro/data_formats.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <variant>
#include <vector>

using namespace pscoro;

namespace tfex {

// A record in hex, for failure messages.
std::string hex(std::string_view bytes) {
  std::string out;
  for (const char c : bytes) out += fmt::format("{:02x} ", static_cast<unsigned char>(c));
  return out;
}

using namespace pscoro::testing::wire;

// How a random record is written.
struct writing {
  bool packed = true;
  bool key_last = false;   // the entry's value before its key
  bool unknowns = false;   // unknown fields at every level
  bool split_lists = false;  // a list in two parts (two list fields, or two values in the entry)
};

std::string unknown_fields(std::mt19937_64& rng) {
  switch (rng() % 5) {
    case 0: return varint_field(7, rng());
    case 1: return tag(9, 1) + std::string(8, 'x');
    case 2: return tag(10, 5) + std::string(4, 'y');
    case 3: return len_field(11, "unknown bytes");
    default: return tag(12, 3) + varint_field(1, 5) + len_field(2, "in a group") + tag(12, 4);  // a group
  }
}

std::string list_message(const tf_example::feature& values, const writing& w, std::size_t from, std::size_t to) {
  std::string out;
  std::visit(
      [&](const auto& v) {
        using V = typename std::decay_t<decltype(v)>::value_type;
        if constexpr (std::is_same_v<V, std::string>) {
          for (std::size_t i = from; i < to; ++i) out += len_field(1, v[i]);
        } else if constexpr (std::is_same_v<V, float>) {
          if (w.packed) {
            std::string packed;
            for (std::size_t i = from; i < to; ++i) packed += float_bytes(v[i]);
            if (to > from) out += len_field(1, packed);
          } else {
            for (std::size_t i = from; i < to; ++i) out += tag(1, 5) + float_bytes(v[i]);
          }
        } else {
          if (w.packed) {
            std::string packed;
            for (std::size_t i = from; i < to; ++i) packed += varint(static_cast<std::uint64_t>(v[i]));
            if (to > from) out += len_field(1, packed);
          } else {
            for (std::size_t i = from; i < to; ++i) out += varint_field(1, static_cast<std::uint64_t>(v[i]));
          }
        }
      },
      values);
  return out;
}

std::size_t size_of(const tf_example::feature& values) { return testing::value_count_of(values); }

// A Feature holding `values` (a list field of the variant's kind; in two if split).
std::string feature_message(const tf_example::feature& values, const writing& w, std::mt19937_64& rng) {
  const auto field = static_cast<std::uint32_t>(values.index() + 1);
  const std::size_t n = size_of(values);
  std::string out;
  if (w.unknowns) out += unknown_fields(rng);
  if (w.split_lists && n >= 2) {
    out += len_field(field, list_message(values, w, 0, n / 2));
    if (w.unknowns) out += unknown_fields(rng);
    out += len_field(field, list_message(values, w, n / 2, n));
  } else {
    std::string list = list_message(values, w, 0, n);
    if (w.unknowns) list += unknown_fields(rng);
    out += len_field(field, list);
  }
  return out;
}

std::string entry_message(std::string_view key, const std::string& feature, const writing& w, std::mt19937_64& rng) {
  std::string k = len_field(1, key), v = len_field(2, feature);
  if (w.unknowns) k += unknown_fields(rng);
  return w.key_last ? v + k : k + v;
}

// `example` written as `w` says, its entries in a random order, some in a second Features field,
// some after an entry of the same key that they replace.
std::string write_example(const tf_example& example, const writing& w, std::mt19937_64& rng) {
  // (rank, entry): a key's entries share a rank, so the stable sort keeps their order (the last
  // one wins).
  std::vector<std::pair<std::uint64_t, std::string>> ranked;
  for (const auto& [name, values] : example.features) {
    const std::uint64_t rank = rng() % 4;
    if (w.unknowns && rng() % 4 == 0) {  // an earlier entry of the same key, of another kind
      ranked.emplace_back(rank, entry_message(name, len_field(values.index() == 1 ? 3 : 2, ""), w, rng));
    }
    ranked.emplace_back(rank, entry_message(name, feature_message(values, w, rng), w, rng));
  }
  std::stable_sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::string> entries;
  for (auto& r : ranked) entries.push_back(std::move(r.second));
  std::string first, second;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    auto& part = (w.unknowns && i >= entries.size() / 2) ? second : first;
    part += len_field(1, entries[i]);
    if (w.unknowns) part += unknown_fields(rng);
  }
  std::string out = len_field(1, first);
  if (w.unknowns) out = unknown_fields(rng) + out + unknown_fields(rng) + len_field(1, second);
  return out;
}

// The record in a heap block of exactly its size: a read past it is an ASan error.
struct exact_copy {
  explicit exact_copy(std::string_view s) : bytes(new char[std::max<std::size_t>(s.size(), 1)]), size(s.size()) {
    if (!s.empty()) std::memcpy(bytes.get(), s.data(), s.size());
  }
  std::string_view view() const { return {bytes.get(), size}; }
  std::unique_ptr<char[]> bytes;
  std::size_t size;
};

// Parses `record` both ways. Where protobuf parses it, the fast parser gives the values the spec
// reads of protobuf's (or fails exactly when the spec rejects them); where protobuf does not, the
// fast parser may read it only if what it reads is sound. Returns whether the fast parser read it.
bool check_same(std::string_view record, const tf_example_parser& parser) {
  const exact_copy copy(record);
  const auto& spec = parser.features();
  std::optional<tf_example> slow;
  try {
    slow = parse_tf_example(copy.view());
  } catch (const error& e) {
    CHECK(e.code() == errc::invalid_argument);
  }
  tf_example_batch batch;
  std::optional<std::string> fast_error;
  try {
    parser.parse(copy.view(), batch);
  } catch (const error& e) {
    CHECK(e.code() == errc::invalid_argument);
    fast_error = e.what();
  }
  CHECK(batch.size() == (fast_error ? 0u : 1u));
  if (slow) {
    std::optional<testing::tf_columns> fast;
    if (!fast_error) fast = testing::batch_columns(batch, spec, 0);
    CHECK_MESSAGE(testing::agrees_with_protobuf(*slow, spec, fast), fast_error.value_or("the fast parser read it"));
  }
  return !fast_error;
}

// ---- CTR-like records ----

std::vector<tf_feature_spec> ctr_spec() {
  std::vector<tf_feature_spec> spec{{"label", tf_feature_type::int64, 1, std::nullopt}};
  for (int j = 1; j <= 13; ++j) spec.push_back({"I" + std::to_string(j), tf_feature_type::int64, std::nullopt, std::nullopt});
  for (int f = 1; f <= 26; ++f) spec.push_back({"C" + std::to_string(f), tf_feature_type::bytes, std::nullopt, std::nullopt});
  spec.push_back({"dense", tf_feature_type::float32, 3, tf_example::feature(std::vector<float>{0.5f})});
  spec.push_back({"weight", tf_feature_type::float32, 1, tf_example::feature(std::vector<float>{1.0f})});
  return spec;
}

tf_example random_ctr_example(std::mt19937_64& rng) {
  tf_example e;
  e.features["label"] = std::vector<std::int64_t>{static_cast<std::int64_t>(rng() % 2)};
  for (int j = 1; j <= 13; ++j) {
    std::vector<std::int64_t> v;
    if (rng() % 10) v.push_back(static_cast<std::int64_t>(rng() % 3 == 0 ? rng() : rng() % 1000) * (rng() % 7 ? 1 : -1));
    e.features["I" + std::to_string(j)] = v;
  }
  for (int f = 1; f <= 26; ++f) {
    std::vector<std::string> v;
    for (std::size_t n = rng() % 20 ? 1 : rng() % 3; n > 0; --n) v.push_back(std::to_string(rng() % 100000000));
    e.features["C" + std::to_string(f)] = v;
  }
  if (rng() % 2) e.features["dense"] = std::vector<float>{float(rng() % 100) / 7, -1.5f, 1e30f};
  if (rng() % 3 == 0) e.features["weight"] = std::vector<float>{2.0f};
  if (rng() % 2) e.features["not_in_spec"] = std::vector<std::string>{"skipped", "unread"};
  return e;
}

}  // namespace tfex

TEST_CASE("the fast parser reads random CTR records as protobuf does, however they are written") {
  const tf_example_parser parser(tfex::ctr_spec());
  std::mt19937_64 rng(20261124);
  std::vector<std::string> records;
  std::vector<tf_example> examples;
  for (int i = 0; i < 200; ++i) {
    const tf_example e = tfex::random_ctr_example(rng);
    const tfex::writing w{rng() % 2 == 0, rng() % 3 == 0, rng() % 2 == 0, rng() % 3 == 0};
    const std::string record = i % 5 == 0 ? serialize_tf_example(e) : tfex::write_example(e, w, rng);
    CHECK(tfex::check_same(record, parser));
    CHECK(parse_tf_example(record).features == e.features);  // the writer wrote what it meant to
    records.push_back(record);
    examples.push_back(e);
  }
  // All of them in one batch, column by column.
  const auto batch = parser.parse(records);
  REQUIRE(batch.size() == records.size());
  CHECK(batch.row_splits(0).back() == records.size());  // label: one each
  for (std::size_t k = 0; k < records.size(); ++k) {
    CHECK(testing::batch_columns(batch, parser.features(), k) == *testing::spec_values(examples[k], parser.features()));
  }
  CHECK(batch.floats(40).size() == 3 * records.size());  // "dense", default or not
}

TEST_CASE("every prefix of a record fails cleanly or reads as protobuf reads it") {
  const tf_example_parser parser(tfex::ctr_spec());
  std::mt19937_64 rng(7);
  for (int i = 0; i < 3; ++i) {
    const std::string record =
        tfex::write_example(tfex::random_ctr_example(rng), {i == 0, i == 1, true, i == 2}, rng);
    for (std::size_t n = 0; n < record.size(); ++n) tfex::check_same(std::string_view(record).substr(0, n), parser);
  }
}

TEST_CASE("malformed records fail naming what is wrong and where") {
  const tf_example_parser parser({{"label", tf_feature_type::int64, 1, std::nullopt},
                                  {"x", tf_feature_type::float32, std::nullopt, std::nullopt}});
  tf_example_batch batch;
  const std::string good =
      tfex::len_field(1, tfex::len_field(1, tfex::len_field(1, "label") +
                                                tfex::len_field(2, tfex::len_field(3, tfex::varint_field(1, 1)))));
  parser.parse(good, batch);
  REQUIRE(batch.size() == 1);
  const auto fails = [&](std::string_view record, std::string_view part) {
    CAPTURE(part);
    const tfex::exact_copy copy(record);
    const auto e = error_thrown_by([&] { parser.parse(copy.view(), batch); });
    CHECK(e.code() == errc::invalid_argument);
    CHECK(contains(e.what(), part));
    CHECK(batch.size() == 1);  // as it was
    CHECK(batch.int64s(0).size() == 1);
    CHECK(batch.floats(1).empty());
  };
  const auto features = [](std::string_view entries) { return tfex::len_field(1, entries); };
  const auto entry = [](std::string_view key, std::string_view feature) {
    return tfex::len_field(1, tfex::len_field(1, key) + tfex::len_field(2, feature));
  };
  fails("\x0a", "a 1-byte record is not a serialized tf.train.Example: truncated varint at byte 1");
  fails("\x0a\xff", "truncated varint at byte 1");
  fails("\x0a\x05" "abc", "length 5 runs past the end (3 bytes left) at byte 1");
  fails("\x0a" + tfex::varint(~std::uint64_t{0}) + "abc", "length 18446744073709551615 runs past the end (3 bytes left)");
  fails("\x0a" + tfex::varint(std::uint64_t{1} << 63) + "a", "runs past the end");
  fails("\x0a" + std::string(10, '\xff') + "\x01", "varint longer than 10 bytes at byte 1");
  fails(std::string("\x0e") + "abc", "invalid wire type 6 (field 1) at byte 0");
  fails(std::string("\x0f") + "abc", "invalid wire type 7");
  fails(std::string("\x02\x00", 2), "invalid field tag 2");
  fails(std::string("\x0c"), "unexpected end of group 1");
  fails(std::string("\x13\x08\x01"), "group 2 has no end");
  fails(std::string("\x13\x1c"), "group 2 ends as group 3");
  fails(std::string("\x11\x01\x02"), "truncated 8-byte value");
  // Inside a feature the spec reads, the message names it.
  fails(features(entry("x", tfex::len_field(2, tfex::len_field(1, "abcde")))) + good,
        "feature 'x': packed floats of 5 bytes at byte");
  fails(features(entry("x", tfex::len_field(2, tfex::tag(1, 5) + "ab"))) + good, "feature 'x': truncated float");
  fails(features(entry("label", tfex::len_field(3, tfex::len_field(1, "\x80")))),
        "feature 'label': truncated varint at byte 17");
  // What the spec rejects.
  fails("", "the example has no feature 'label', which the spec requires");
  fails(features(entry("label", tfex::len_field(3, tfex::varint_field(1, 1) + tfex::varint_field(1, 0)))),
        "feature 'label' has 2 int64 values, the spec wants 1");
  fails(features(entry("label", tfex::len_field(3, ""))), "feature 'label' has 0 int64 values, the spec wants 1");
  fails(features(entry("label", tfex::len_field(2, tfex::len_field(1, tfex::float_bytes(1))))),
        "feature 'label' is a float list, the spec wants int64");
  fails(good + features(entry("x", tfex::len_field(1, tfex::len_field(1, "s")))), "feature 'x' is a bytes list, the spec wants float");
  // Each fails in protobuf too.
  for (const std::string& bad : {std::string("\x0a\x05" "abc"), std::string("\x0e" "abc"), std::string("\x13\x1c"),
                                features(entry("x", tfex::len_field(2, tfex::len_field(1, "abcde"))))}) {
    CHECK(error_thrown_by([&] { (void)parse_tf_example(bad); }).code() == errc::invalid_argument);
  }
}

TEST_CASE("fields protobuf does not know, or knows with another wire type, are skipped as protobuf skips them") {
  const tf_example_parser parser({{"a", tf_feature_type::float32, std::nullopt, std::nullopt},
                                  {"b", tf_feature_type::int64, std::nullopt, std::nullopt}});
  const auto entry = [](std::string_view key, std::string_view feature) {
    return tfex::len_field(1, tfex::len_field(1, key) + tfex::len_field(2, feature));
  };
  const std::string a = entry("a", tfex::len_field(2, tfex::tag(1, 5) + tfex::float_bytes(2.5f) +
                                                         tfex::varint_field(1, 3)));  // a varint float: unknown
  const std::string b = entry("b", tfex::len_field(3, tfex::tag(1, 5) + "abcd" + tfex::varint_field(1, 9)));
  for (const std::string& record : {
           tfex::len_field(1, a + b),
           tfex::varint_field(1, 5) + tfex::len_field(1, a + b),            // Example.features as a varint
           tfex::len_field(1, tfex::varint_field(1, 3) + a + b),            // a map entry as a varint
           tfex::len_field(1, a) + tfex::len_field(1, b),                   // Features merged
           tfex::len_field(1, entry("a", tfex::len_field(3, "")) + a + b),  // a's first entry replaced
           tfex::len_field(1, tfex::len_field(1, tfex::len_field(2, tfex::len_field(2, tfex::len_field(1, tfex::float_bytes(1)))) +
                                                    tfex::len_field(1, "a")) + b),  // the key after the value
       }) {
    const std::string bytes = tfex::hex(record);
    CAPTURE(bytes);
    CHECK(tfex::check_same(record, parser));
    tf_example_batch batch;
    parser.parse(record, batch);
    CHECK(batch.int64s(1, 0).size() == 1);
    CHECK(batch.int64s(1, 0)[0] == 9);
  }
  // Two values in one entry merge; a list of another kind in between starts the Feature over.
  const std::string merged = tfex::len_field(
      1, tfex::len_field(1, tfex::len_field(1, "a") + tfex::len_field(2, tfex::len_field(2, tfex::tag(1, 5) + tfex::float_bytes(1))) +
                                tfex::len_field(2, tfex::len_field(2, tfex::tag(1, 5) + tfex::float_bytes(2)))));
  CHECK(tfex::check_same(merged, parser));
  tf_example_batch batch;
  parser.parse(merged, batch);
  CHECK(std::vector<float>(batch.floats(0).begin(), batch.floats(0).end()) == std::vector<float>{1, 2});
  const std::string restarted = tfex::len_field(
      1, tfex::len_field(1, tfex::len_field(1, "a") + tfex::len_field(2, tfex::len_field(2, tfex::tag(1, 5) + tfex::float_bytes(1))) +
                                tfex::len_field(2, tfex::len_field(3, tfex::varint_field(1, 4)) +
                                                       tfex::len_field(2, tfex::tag(1, 5) + tfex::float_bytes(3)))));
  CHECK(tfex::check_same(restarted, parser));
  parser.parse(restarted, batch);
  CHECK(batch.floats(0, 1).size() == 1);
  CHECK(batch.floats(0, 1)[0] == 3.0f);
  // Varints of 10 bytes: the bits past 64 are dropped, as protobuf drops them.
  const std::string wide = tfex::len_field(
      1, tfex::len_field(1, tfex::len_field(1, "b") + tfex::len_field(2, tfex::len_field(3, tfex::tag(1, 0) + std::string(9, '\xff') + "\x7f"))));
  CHECK(tfex::check_same(wide, parser));
  // An entry with no key is the key "" (not in the spec); one with no value an empty Feature.
  const std::string keyless = tfex::len_field(1, tfex::len_field(1, tfex::len_field(2, tfex::len_field(3, tfex::varint_field(1, 4)))) +
                                                     tfex::len_field(1, tfex::len_field(1, "b")) + tfex::len_field(1, ""));
  CHECK(tfex::check_same(keyless, parser));
  tf_example_batch keyless_batch;
  parser.parse(keyless, keyless_batch);
  CHECK(keyless_batch.int64s(1).empty());
  // A NaN is read as stored.
  const std::string nan = tfex::len_field(
      1, tfex::len_field(1, tfex::len_field(1, "a") + tfex::len_field(2, tfex::len_field(2, tfex::len_field(1, std::string("\x01\x00\xc0\x7f", 4))))));
  CHECK(tfex::check_same(nan, parser));
}

TEST_CASE("a missing feature takes its default, and a Feature with no list counts as missing") {
  const tf_example_parser parser({{"f", tf_feature_type::float32, 2, tf_example::feature(std::vector<float>{7})},
                                  {"s", tf_feature_type::bytes, 1, tf_example::feature(std::vector<std::string>{"none"})},
                                  {"v", tf_feature_type::int64, std::nullopt, std::nullopt}});
  CHECK(std::get<std::vector<float>>(*parser.features()[0].default_value) == std::vector<float>{7, 7});
  tf_example_batch batch;
  parser.parse("", batch);
  // "s" with an empty Feature (protobuf reads an empty bytes list; TF, and this parser, no feature).
  parser.parse(tfex::len_field(1, tfex::len_field(1, tfex::len_field(1, "s") + tfex::len_field(2, ""))), batch);
  REQUIRE(batch.size() == 2);
  CHECK(tfex::check_same(tfex::len_field(1, tfex::len_field(1, tfex::len_field(1, "f") + tfex::len_field(2, ""))), parser));
  CHECK(std::vector<float>(batch.floats(0).begin(), batch.floats(0).end()) == std::vector<float>{7, 7, 7, 7});
  CHECK(batch.bytes(1, 0) == "none");
  CHECK(batch.bytes(1, 1) == "none");
  CHECK(batch.int64s(2).empty());
  CHECK(std::vector<std::size_t>(batch.row_splits(2).begin(), batch.row_splits(2).end()) == std::vector<std::size_t>{0, 0, 0});
  // clear() empties the batch for the next records; a parser of another spec cannot add to it.
  batch.clear();
  CHECK(batch.size() == 0);
  CHECK(batch.floats(0).empty());
  parser.parse("", batch);
  CHECK(batch.size() == 1);
  const tf_example_parser other({{"f", tf_feature_type::int64, std::nullopt, std::nullopt}});
  CHECK(contains(error_thrown_by([&] { other.parse("", batch); }).what(), "the batch holds the examples of another feature spec"));
  CHECK(contains(error_thrown_by([&] { (void)batch.int64s(0); }).what(), "feature 0 of the batch holds float values, not int64"));
  CHECK(contains(error_thrown_by([&] { (void)batch.floats(0, 1); }).what(), "example 1 of a batch of 1"));
  CHECK(contains(error_thrown_by([&] { (void)batch.floats(0, ~std::size_t{0}); }).what(), "of a batch of 1"));
  CHECK(contains(error_thrown_by([&] { (void)batch.bytes(1, 1); }).what(), "value 1 of feature 1, which holds 1"));
}

TEST_CASE("a spec the parser cannot honour is refused at construction") {
  using spec = std::vector<tf_feature_spec>;
  const auto refused = [](spec s) { return std::string(error_thrown_by([&] { tf_example_parser p(std::move(s)); }).what()); };
  CHECK(contains(refused(spec{{"a", tf_feature_type::int64, 1, std::nullopt}, {"a", tf_feature_type::bytes, std::nullopt, std::nullopt}}),
                 "feature 'a' is in the spec twice"));
  CHECK(contains(refused(spec{{"", tf_feature_type::int64, 1, std::nullopt}}), "feature 0 of the spec has no name"));
  CHECK(contains(refused(spec{{"a", tf_feature_type::int64, 3, tf_example::feature(std::vector<std::int64_t>{1, 2})}}),
                 "feature 'a': the default value is not 3 or one int64 value"));
  CHECK(contains(refused(spec{{"a", tf_feature_type::int64, 1, tf_example::feature(std::vector<float>{1})}}),
                 "the default value is not 1 or one int64 value"));
  CHECK(contains(refused(spec{{"a", tf_feature_type::int64, std::nullopt, tf_example::feature(std::vector<std::int64_t>{1})}}),
                 "feature 'a' has variable length: it takes no default value"));
}

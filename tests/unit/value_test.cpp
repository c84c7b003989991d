// Tensors, xtensor conversions and the codecs that carry worker-function arguments.
#include "test_support.hpp"

#include <pscoro/sparse_ids.hpp>
#include <pscoro/variable.hpp>
#include <pscoro/worker_function.hpp>
#include <pscoro/xtensor.hpp>

#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

using namespace pscoro;

TEST_CASE_TEMPLATE("an xarray survives the trip through a tensor", T, float, double, std::int32_t, std::int64_t) {
  const xt::xarray<T> original{{1, 2, 3}, {4, 5, 6}};
  const tensor t = to_tensor(original);
  CHECK(t.type() == dtype_of<T>);
  CHECK(t.shape() == shape_type{2, 3});
  CHECK(t.size_bytes() == 6 * sizeof(T));
  const auto back = to_xarray<T>(t);
  CHECK((back == original));
  // An expression is evaluated once, into a tensor of its own.
  const tensor sum = to_tensor(original + original);
  CHECK(sum.data<T>()[5] == T(12));
}

TEST_CASE_TEMPLATE("reading a tensor as the wrong element type names both types", T, float, double) {
  const tensor t = to_tensor(xt::xarray<std::int32_t>{1, 2});
  const std::string expected = "expected a " + std::string(name_of(dtype_of<T>)) + " tensor, got int32";
  CHECK_THROWS_WITH_AS((void)to_xarray<T>(t), expected.c_str(), error);
}

TEST_CASE("a scalar tensor has one element and an empty shape") {
  const tensor t = to_tensor(xt::xarray<double>(3.5));
  CHECK(t.shape().empty());
  CHECK(t.size() == 1);
  CHECK(to_xarray<double>(t)() == 3.5);
}

TEST_CASE("a shared byte buffer views another owner's bytes and keeps that owner alive") {
  auto owner = std::make_shared<std::vector<float>>(std::vector<float>{1.0f, 2.0f, 3.0f});
  const std::weak_ptr<std::vector<float>> watch = owner;
  auto* data = reinterpret_cast<std::byte*>(owner->data());
  tensor t(dtype::float32, {3}, byte_buffer::share(std::move(owner), data, 3 * sizeof(float)));
  CHECK(t.bytes().data() == data);  // no copy
  const tensor copy = t;
  t = tensor();
  CHECK(!watch.expired());  // a copy still holds it
  CHECK(copy.data<float>()[2] == 3.0f);
  const byte_buffer part = copy.bytes().slice(sizeof(float), sizeof(float));
  CHECK(part.data() == data + sizeof(float));
}

// The THPeligible line of the mapping of /proc/self/smaps that holds `address` (empty: none).
std::string huge_page_eligibility(const void* address) {
  std::ifstream smaps("/proc/self/smaps");
  const auto at = reinterpret_cast<std::uintptr_t>(address);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    std::uintptr_t begin = 0, end = 0;
    // A mapping's first line is "begin-end perms ..."; the lines after it are "Key: value".
    if (std::sscanf(line.c_str(), "%" SCNxPTR "-%" SCNxPTR, &begin, &end) == 2) {
      inside = begin <= at && at < end;
    } else if (inside && line.rfind("THPeligible:", 0) == 0) {
      return line;
    }
  }
  return {};
}

TEST_CASE("a byte buffer is aligned to a cache line, and a large one is advised huge pages") {
  for (const std::size_t size : {std::size_t{1}, std::size_t{100}, std::size_t{1} << 20, std::size_t{8} << 20}) {
    const byte_buffer buffer(size);
    CHECK_MESSAGE(reinterpret_cast<std::uintptr_t>(buffer.data()) % 64 == 0, size, " bytes at ",
                  static_cast<const void*>(buffer.data()));
  }
  std::ifstream setting("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string modes;
  std::getline(setting, modes);
  if (modes.empty() || modes.find("[never]") != std::string::npos) return;  // no THP here: nothing to advise
  const byte_buffer large(8 << 20);
  // The middle of 8 MiB is inside a whole huge page, which is advised.
  const std::string eligible = huge_page_eligibility(large.data() + (4 << 20));
  CHECK_MESSAGE(eligible.find('1') != std::string::npos, "THP setting '", modes, "', smaps says '", eligible, "'");
}

TEST_CASE("integers are range-checked in both directions") {
  CHECK(std::get<std::int64_t>(codec<std::uint8_t>::encode(200)) == 200);
  CHECK_THROWS_WITH_AS(codec<std::uint64_t>::encode(std::numeric_limits<std::uint64_t>::max()),
                       doctest::Contains("does not fit in int64"), error);
  CHECK(codec<std::int8_t>::decode(value(std::int64_t{-128}), {}) == -128);
  CHECK_THROWS_WITH_AS((void)codec<std::int8_t>::decode(value(std::int64_t{300}), {}),
                       doctest::Contains("integer 300 is out of range"), error);
  CHECK_THROWS_WITH_AS((void)codec<std::uint32_t>::decode(value(std::int64_t{-1}), {}),
                       doctest::Contains("integer -1 is out of range"), error);
}

TEST_CASE("a value of another kind is refused with both kinds named") {
  CHECK_THROWS_WITH_AS((void)codec<std::string>::decode(value(2.5), {}), "expected string, got float64", error);
  CHECK_THROWS_WITH_AS((void)codec<bool>::decode(value(std::string("yes")), {}), "expected bool, got string", error);
  CHECK_THROWS_WITH_AS((void)codec<xt::xarray<float>>::decode(value(std::int64_t{1}), {}),
                       "expected tensor, got int64", error);
  const variable_ref ref{"w", dtype::float64, {3}, 1};
  CHECK_THROWS_WITH_AS((void)codec<variable<float>>::decode(value(ref), {}),
                       "expected a float32 variable, got 'w' of float64", error);
  CHECK(describe(value(ref)) == "variable 'w' <float64>[3]");
  CHECK(describe(value(to_tensor(xt::xarray<float>{{1, 2}}))) == "tensor<float32>[1, 2]");
}

TEST_CASE("a worker function's signature names its wire types") {
  const worker_function<double(variable<float>, std::int64_t, std::string, xt::xarray<float>)> f{"f"};
  CHECK(f.signature() == "float64(variable,int64,string,xarray)");
  CHECK(worker_function<void()>{"g"}.signature() == "void()");
}

namespace {

struct step_result {
  double loss = 0;
  std::int64_t examples = 0;
  std::vector<std::string> notes;
};

}  // namespace

template <>
struct pscoro::codec<step_result>
    : pscoro::member_codec<step_result, &step_result::loss, &step_result::examples, &step_result::notes> {
  static constexpr std::string_view name = "step_result";
};

struct unnamed_pair {
  double a = 0;
  std::string b;
};
template <>
struct pscoro::codec<unnamed_pair> : pscoro::member_codec<unnamed_pair, &unnamed_pair::a, &unnamed_pair::b> {};

namespace {

// encode, then decode as T: what a worker function's argument or result goes through.
template <class T>
T round_trip(const T& x) {
  return codec<T>::decode(codec<T>::encode(x), {});
}

}  // namespace

TEST_CASE("tuples, pairs, vectors, maps, optionals and structs travel as lists and come back equal") {
  const std::tuple<double, std::int64_t, std::string> t{0.5, 7, "seven"};
  CHECK(round_trip(t) == t);
  const std::pair<std::string, bool> p{"ok", true};
  CHECK(round_trip(p) == p);
  const std::vector<std::int64_t> v{3, 1, 2};
  CHECK(round_trip(v) == v);
  CHECK(round_trip(std::vector<double>{}).empty());
  const std::map<std::string, double> m{{"accuracy", 0.83}, {"loss", 0.41}};
  CHECK(round_trip(m) == m);
  CHECK(round_trip(std::optional<std::int64_t>{}) == std::nullopt);
  CHECK(round_trip(std::optional<std::int64_t>{4}) == 4);
  // Nested, with a tensor inside.
  const std::vector<std::tuple<std::string, xt::xarray<float>>> nested{{"w", xt::xarray<float>{1, 2}}};
  const auto back = round_trip(nested);
  REQUIRE(back.size() == 1);
  CHECK(std::get<0>(back[0]) == "w");
  CHECK((std::get<1>(back[0]) == xt::xarray<float>{1, 2}));
  const step_result r{0.25, 128, {"warm-up"}};
  const auto got = round_trip(r);
  CHECK(got.loss == 0.25);
  CHECK(got.examples == 128);
  CHECK(got.notes == std::vector<std::string>{"warm-up"});
}

TEST_CASE("structured types name their parts in signatures") {
  const worker_function<std::tuple<double, double>(std::vector<std::int64_t>, std::optional<std::string>,
                                                   std::map<std::string, double>, std::pair<bool, double>)>
      f{"f"};
  CHECK(f.signature() ==
        "tuple<float64,float64>(vector<int64>,optional<string>,map<string,float64>,pair<bool,float64>)");
  CHECK(worker_function<step_result(unnamed_pair)>{"g"}.signature() == "step_result({float64,string})");
}

TEST_CASE("a structured value of the wrong shape is refused, naming the item") {
  // Aliases: a comma inside a macro's argument splits it.
  using number_text = std::tuple<double, std::string>;
  using counts = std::map<std::string, double>;
  const auto t = codec<std::tuple<double, std::int64_t>>::encode({1.5, 2});
  CHECK_THROWS_WITH_AS((void)codec<number_text>::decode(value(t), {}),
                       "item 1 of tuple<float64,string>: expected string, got int64", error);
  CHECK_THROWS_WITH_AS((void)codec<std::tuple<double>>::decode(value(t), {}),
                       "expected tuple<float64> (1 values), got a list of 2", error);
  CHECK_THROWS_WITH_AS((void)codec<std::vector<double>>::decode(value(2.5), {}),
                       "expected vector<float64>, got float64", error);
  CHECK_THROWS_WITH_AS((void)codec<std::optional<double>>::decode(value(t), {}),
                       "expected optional<float64> (none or one value), got a list of 2", error);
  CHECK_THROWS_WITH_AS((void)codec<counts>::decode(codec<std::vector<std::string>>::encode({"a", "b", "a", "c"}), {}),
                       "item 1 of map<string,float64>: expected float64, got string", error);
  const value twice = value_list{{std::string("k"), 1.0, std::string("k"), 2.0}};
  CHECK_THROWS_WITH_AS((void)codec<counts>::decode(value(twice), {}),
                       "map<string,float64>: key 'k' appears twice", error);
  CHECK_THROWS_WITH_AS((void)codec<step_result>::decode(value(t), {}),
                       "expected step_result (3 values), got a list of 2", error);
  CHECK(describe(t) == "a list of 2");
}

TEST_CASE("sparse ids travel as three tensors and come back equal, however many ids") {
  using ids32 = sparse_ids<std::int32_t, double>;
  const ids32 batch{.rows = {0, 0, 2}, .ids = {7, -1, 3}, .weights = {0.5, 1, 2}, .dense_rows = 4};
  const auto back = round_trip(batch);
  CHECK(back.rows == batch.rows);
  CHECK(back.ids == batch.ids);
  CHECK(back.weights == batch.weights);
  CHECK(back.dense_rows == 4);
  // More ids than max_value_items: one value per part, not per id.
  sparse_ids<std::int64_t> many;
  many.ids.assign(max_value_items + 1, 5);
  many.rows.assign(many.ids.size(), 0);
  many.dense_rows = 1;
  CHECK(std::get<value_list>(codec<sparse_ids<std::int64_t>>::encode(many)).items.size() == 4);
  CHECK(round_trip(many).ids == many.ids);
  CHECK(round_trip(sparse_ids<std::int64_t>{}).ids.empty());
  CHECK(worker_function<void(ids32)>{"f"}.signature() == "void(sparse_ids)");
}

TEST_CASE("sparse ids of another id type or shape are refused, naming the part") {
  const auto encoded = codec<sparse_ids<std::int64_t>>::encode({.rows = {0}, .ids = {1}, .dense_rows = 1});
  using ids32 = sparse_ids<std::int32_t>;
  CHECK_THROWS_WITH_AS((void)codec<ids32>::decode(value(encoded), {}),
                       "item 1 of sparse_ids (ids) must be a 1-D int32 tensor, got int64 of shape [1]", error);
  auto list = std::get<value_list>(encoded);
  list.items[0] = tensor::uninitialized(dtype::int64, {1, 1});
  CHECK_THROWS_WITH_AS((void)codec<sparse_ids<std::int64_t>>::decode(value(list), {}),
                       "item 0 of sparse_ids (rows) must be a 1-D int64 tensor, got int64 of shape [1, 1]", error);
  list.items[0] = 2.5;
  CHECK_THROWS_WITH_AS((void)codec<sparse_ids<std::int64_t>>::decode(value(list), {}),
                       "item 0 of sparse_ids: expected tensor, got float64", error);
  CHECK_THROWS_WITH_AS((void)codec<sparse_ids<std::int64_t>>::decode(value(std::int64_t{3}), {}),
                       "expected sparse_ids, got int64", error);
}


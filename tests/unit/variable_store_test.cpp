// What a ps holds, without a ps: the bytes variables and slots count against the limits, what a
// request is refused for before anything changes, and what removing a variable gives back.
#include "test_support.hpp"

#include "ps/variable_store.hpp"

#include <pscoro/error.hpp>

using namespace pscoro;
using ps::slot_plan;
using ps::stored_variable;
using ps::variable_store;

namespace {

stored_variable floats(shape_type shape, std::string slot_of = {}) {
  const auto bytes = num_elements(shape) * sizeof(float);
  return stored_variable{dtype::float32, std::move(shape), byte_buffer(bytes), std::move(slot_of), 0.0};
}

constexpr std::uint64_t unlimited = std::uint64_t{1} << 40;

}  // namespace

TEST_CASE("a variable store counts values and bookkeeping, and removing a variable gives back its slots' too") {
  variable_store store("ps:0", unlimited, unlimited);
  store.hold("w", floats({100, 4}));
  const auto one = store.held_bytes();
  CHECK(one > 100 * 4 * sizeof(float));  // the name, the shape and the map's node count too
  CHECK(one < 100 * 4 * sizeof(float) + 1024);
  store.hold("w/adagrad/accumulator", floats({100, 4}, "w"));
  store.hold("v", floats({3}));
  CHECK(store.size() == 3);
  REQUIRE(store.slots_of("w").size() == 1);
  CHECK(store.slots_of("w")[0].first == "w/adagrad/accumulator");
  store.remove("w");
  CHECK(store.size() == 1);
  CHECK(store.contains("v"));
  CHECK(!store.contains("w/adagrad/accumulator"));
  store.remove("v");
  CHECK(store.held_bytes() == 0);
}

TEST_CASE("a variable store refuses a variable over the per-variable limit or past the total") {
  variable_store store("ps:1", 10'000, 4'000);
  const auto per_variable =
      error_thrown_by([&] { store.check_room("create of 'big'", "", "big", dtype::float32, {1001}, 0); });
  CHECK(per_variable.code() == errc::resource_exhausted);
  CHECK(contains(per_variable.what(),
                 "create of 'big': float32 [1001] takes 3.9 KiB (4004 bytes), more than the "
                 "3.9 KiB (4000 bytes) ps:1 allows per variable"));
  // 2 x 3.9 KB fit; a third does not.
  for (const char* name : {"a", "b"}) {
    store.check_room("create", "", name, dtype::float32, {1000}, 0);
    store.hold(name, floats({1000}));
  }
  const auto total = error_thrown_by([&] { store.check_room("create of 'c'", "", "c", dtype::float32, {1000}, 0); });
  CHECK(total.code() == errc::resource_exhausted);
  CHECK(contains(total.what(), "past its limit of 9.8 KiB (10000 bytes) (server_options::max_ps_bytes raises it)"));
  CHECK(store.size() == 2);  // a refusal holds nothing
  // A shape whose byte size overflows 64 bits is an invalid argument, not a huge allocation.
  const auto overflow = error_thrown_by([&] {
    store.check_room("create of 'x'", "", "x", dtype::float64, {std::uint64_t{1} << 62, 4}, 0);
  });
  CHECK(overflow.code() == errc::invalid_argument);
  CHECK(contains(overflow.what(), "does not fit in 64 bits"));
}

TEST_CASE("a variable store checks an optimizer's slots together, counting the ones a step creates first") {
  variable_store store("ps:0", 10'000, 10'000);
  auto& w = store.hold("w", floats({500}));  // ~2.3 KB held
  const std::vector<slot_plan> two{{"w/adam/m", dtype::float32, {500}, 0.0}, {"w/adam/v", dtype::float32, {500}, 0.0}};
  store.check_slots("apply_gradient of 'w'", "w", w, two);  // 3 x 2 KB fit
  const std::vector<slot_plan> four{
      two[0], two[1], {"w/x/a", dtype::float32, {500}, 0.0}, {"w/x/b", dtype::float32, {500}, 0.0}};
  const auto full = error_thrown_by([&] { store.check_slots("apply_gradient of 'w'", "w", w, four); });
  CHECK(full.code() == errc::resource_exhausted);
  CHECK(contains(full.what(), "slot 'w/x/b' of 'w', float32 [500]"));
  CHECK(contains(full.what(), "(counting the slots this step creates before it)"));
  store.hold("w/adam/m", floats({500}, "w"));
  const std::vector<slot_plan> other_shape{{"w/adam/m", dtype::float32, {250}, 0.0}};
  const auto mismatch = error_thrown_by([&] { store.check_slots("apply_gradient of 'w'", "w", w, other_shape); });
  CHECK(mismatch.code() == errc::invalid_argument);
  CHECK(contains(mismatch.what(), "slot 'w/adam/m' of float32 [500] exists as float32 [500]"));
}

TEST_CASE("a variable store finds a variable only as the caller thinks it is") {
  variable_store store("ps:2", unlimited, unlimited);
  store.hold("w", floats({4, 2}));
  CHECK(&store.find(variable_ref{"w", dtype::float32, {4, 2}, 0}, "read") == store.find(std::string("w")));
  const auto missing = error_thrown_by([&] { store.find(variable_ref{"v", dtype::float32, {4, 2}, 0}, "read"); });
  CHECK(missing.code() == errc::not_found);
  CHECK(contains(missing.what(), "read: variable 'v' does not exist on ps:2"));
  const auto other = error_thrown_by([&] { store.find(variable_ref{"w", dtype::float64, {8}, 0}, "update"); });
  CHECK(other.code() == errc::invalid_argument);
  CHECK(contains(other.what(), "update: the handle says 'w' is float64 [8] but ps:2 holds it as float32 [4, 2]"));
  store.clear();
  CHECK(store.size() == 0);
  CHECK(store.held_bytes() == 0);
}

TEST_CASE("row ids and row ranges are checked against the variable's rows") {
  const auto w = floats({3, 2});
  const tensor good = detail::vector_tensor(std::vector<std::int64_t>{0, 2, 2});
  CHECK(ps::row_ids(good, w, "sparse_read", "w").size() == 3);
  const tensor past = detail::vector_tensor(std::vector<std::int64_t>{0, 3});
  CHECK(contains(error_thrown_by([&] { ps::row_ids(past, w, "sparse_read", "w"); }).what(),
                 "sparse_read of 'w': id 3 (position 1) is out of range [0, 3)"));
  const tensor negative = detail::vector_tensor(std::vector<std::int64_t>{-1});
  CHECK(error_thrown_by([&] { ps::row_ids(negative, w, "scatter_add", "w"); }).code() == errc::invalid_argument);
  const tensor narrow = detail::vector_tensor(std::vector<std::int32_t>{0});
  CHECK(contains(error_thrown_by([&] { ps::row_ids(narrow, w, "scatter_add", "w"); }).what(),
                 "ids must be a 1-D int64 tensor, got int32 [1]"));
  ps::check_rows(1, 3, w, "read", "w");
  CHECK(contains(error_thrown_by([&] { ps::check_rows(2, 4, w, "read", "w"); }).what(),
                 "read of 'w': rows [2, 4) are not within [0, 3)"));
  CHECK(contains(error_thrown_by([&] { ps::check_rows(0, 0, floats({}), "read", "s"); }).what(),
                 "a scalar variable has no rows"));
}

// The row operations' planning, without a ps: slices as Python takes them, and a sparse lookup
// planned as TF plans it (unique ids, then per entry its output row and its unique index).
#include "test_support.hpp"

#include "client/sharded.hpp"

#include <pscoro/error.hpp>
#include <pscoro/partitioners.hpp>

#include <limits>
#include <optional>
#include <vector>

using namespace pscoro;
using detail::slice_rows;

namespace {

// A float table of `rows` x 2 in `shards` shards, laid out as TF's "div" partition.
std::shared_ptr<const detail::sharded_layout> planned_table(std::size_t rows, std::size_t shards) {
  sharded_variable_ref ref{"t", dtype::float32, {rows, 2}, {}};
  const auto offsets = div_offsets(rows, shards);
  for (std::size_t s = 0; s < shards; ++s) {
    ref.shards.push_back({"t/part_" + std::to_string(s), dtype::float32, {offsets[s + 1] - offsets[s], 2}, 0});
  }
  return detail::make_layout(std::move(ref));
}

}  // namespace

TEST_CASE("slice_rows selects rows as Python's slices do, without overflow") {
  using rows = std::vector<std::int64_t>;
  constexpr auto none = std::nullopt;
  constexpr auto min = std::numeric_limits<std::int64_t>::min();
  constexpr auto max = std::numeric_limits<std::int64_t>::max();
  // Expected: Python's list(range(7))[begin:end:step].
  CHECK(slice_rows(7, none, none, 1) == rows{0, 1, 2, 3, 4, 5, 6});
  CHECK(slice_rows(7, none, none, -1) == rows{6, 5, 4, 3, 2, 1, 0});
  CHECK(slice_rows(7, 2, 5, 1) == rows{2, 3, 4});
  CHECK(slice_rows(7, -3, none, 1) == rows{4, 5, 6});
  CHECK(slice_rows(7, none, -2, 1) == rows{0, 1, 2, 3, 4});
  CHECK(slice_rows(7, 5, 1, -1) == rows{5, 4, 3, 2});
  CHECK(slice_rows(7, -1, -8, -1) == rows{6, 5, 4, 3, 2, 1, 0});
  CHECK(slice_rows(7, -100, 100, 2) == rows{0, 2, 4, 6});
  CHECK(slice_rows(7, 100, -100, -3) == rows{6, 3, 0});
  CHECK(slice_rows(7, 6, 0, -2) == rows{6, 4, 2});
  CHECK(slice_rows(7, 3, 3, 1).empty());
  CHECK(slice_rows(7, 1, 6, 4) == rows{1, 5});
  CHECK(slice_rows(7, none, none, max) == rows{0});
  CHECK(slice_rows(7, none, none, min) == rows{6});
  CHECK(slice_rows(7, 0, min, -1) == rows{0});
  CHECK(slice_rows(7, min, max, 3) == rows{0, 3, 6});
  CHECK(slice_rows(0, none, none, -1).empty());
  CHECK_THROWS_WITH_AS((void)slice_rows(7, none, none, 0), "slice step cannot be zero", error);
}

TEST_CASE("a sparse lookup is planned as TF plans it: unique ids in first-seen order, each entry's row and id") {
  const auto layout = planned_table(10, 3);
  const sparse_ids<std::int64_t> batch{.rows = {0, 0, 1, 1, 2, 3, 3}, .ids = {7, 2, 7, 9, 2, 7, 7}, .dense_rows = 4};
  const auto plan = detail::plan_sparse_lookup(*layout, detail::to_sparse_batch(batch), {}, "test");
  CHECK(plan.distinct_ids == std::vector<std::int64_t>{7, 2, 9});
  CHECK(plan.distinct == std::vector<std::size_t>{0, 1, 0, 2, 1, 0, 0});
  CHECK(plan.rows == std::vector<std::size_t>{0, 0, 1, 1, 2, 3, 3});
  CHECK(plan.weights.empty());

  // The safe plan drops what TF prunes, and one default_id entry fills each row left empty.
  const sparse_ids<std::int64_t> pruned{
      .rows = {0, 0, 2, 2}, .ids = {-1, 5, 6, 8}, .weights = {1.0f, 0.0f, 2.0f, -1.0f}, .dense_rows = 4};
  detail::sparse_request safe;
  safe.safe = true;
  safe.default_id = 3;
  const auto safe_plan = detail::plan_sparse_lookup(*layout, detail::to_sparse_batch(pruned), safe, "test");
  CHECK(safe_plan.distinct_ids == std::vector<std::int64_t>{3, 6});
  CHECK(safe_plan.rows == std::vector<std::size_t>{0, 1, 2, 3});
  CHECK(safe_plan.distinct == std::vector<std::size_t>{0, 0, 1, 0});
  CHECK(safe_plan.weights == std::vector<double>{1.0, 1.0, 2.0, 1.0});
}

TEST_CASE("a planned lookup names the variable, the bad id and its position, and the row count") {
  const auto layout = planned_table(10, 3);
  const sparse_ids<std::int64_t> batch{.rows = {0, 1}, .ids = {3, 10}, .dense_rows = 2};
  CHECK_THROWS_WITH_AS(detail::plan_sparse_lookup(*layout, detail::to_sparse_batch(batch), {}, "lookup"),
                       "lookup of 't': id 10 (position 1) is out of range [0, 10)", error);
}

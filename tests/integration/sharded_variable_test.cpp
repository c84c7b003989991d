// Sharded variables on a real in-process cluster: every operation against the same operation on a
// dense variable, over uneven shards; lookups in input order; bad ids that change nothing;
// initializers that do not depend on the number of shards.
#include "local_cluster.hpp"
#include "test_support.hpp"

#include <pscoro/sharded_variable.hpp>
#include <pscoro/strategy.hpp>

#include <xtensor/xview.hpp>

#include <pscoro/detail/parallel.hpp>

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <vector>
#include <optional>
#include <limits>

using namespace pscoro;
using pscoro::testing::code_of;
using pscoro::testing::failure_of;
using pscoro::testing::local_cluster;
using pscoro::testing::message_of;

namespace {

const worker_function<double(sharded_variable<float>, std::int64_t)> bump_row{"test.bump_row"};

void bind_test_functions(server& s) {
  // Adds 1 to every element of row `id`, then returns the sum of that row as the worker reads it.
  s.bind(bump_row, [](sharded_variable<float> table, std::int64_t id) -> asio::awaitable<double> {
    const xt::xarray<std::int64_t> ids{id};
    xt::xarray<float> ones = xt::zeros<float>({std::size_t{1}, table.shape()[1]});
    ones.fill(1.0f);
    co_await table.scatter_add(ids, ones);
    const auto row = co_await table.sparse_read(ids);
    co_return static_cast<double>(xt::sum(row)());
  });
}

template <class T>
xt::xarray<T> iota_rows(std::size_t rows, std::size_t columns) {
  xt::xarray<T> out = xt::zeros<T>({rows, columns});
  for (std::size_t i = 0; i < rows; ++i) {
    for (std::size_t j = 0; j < columns; ++j) out(i, j) = static_cast<T>(1 + i * columns + j) / T(4);
  }
  return out;
}

// The rows `ids` of `table` (a dense copy), as a lookup must return them.
xt::xarray<float> rows_of_table(const xt::xarray<float>& table, const std::vector<std::int64_t>& ids) {
  xt::xarray<float> out = xt::zeros<float>({ids.size(), table.shape()[1]});
  for (std::size_t k = 0; k < ids.size(); ++k) {
    for (std::size_t j = 0; j < table.shape()[1]; ++j) out(k, j) = table(static_cast<std::size_t>(ids[k]), j);
  }
  return out;
}

// Looks `ids` up in `table` and checks the rows against `initial`'s (a coroutine of its own, so
// several can be in flight at once).
asio::awaitable<void> check_lookup(sharded_variable<float> table, const xt::xarray<float>& initial,
                                   std::vector<std::int64_t> ids) {
  const auto id_array = xt::adapt(ids);
  const auto rows = co_await table.embedding_lookup(id_array);
  CHECK_MESSAGE((rows == rows_of_table(initial, ids)), ids.size(), " ids, first ", ids.empty() ? -1 : ids[0]);
}

}  // namespace

// 3 shards: ids are grouped by shard in one pass; 9: counted first (src/client/sharded.cpp,
// one_pass_max_shards).
TEST_CASE("lookups of sorted, unsorted and repeated ids, small and large, alone and at once, return their rows") {
  for (const std::int64_t shards : {3, 9}) {
    CAPTURE(shards);
    local_cluster cluster(2, 1);
    cluster.run_chief(
        [shards](parameter_server_strategy& strategy, cluster_coordinator&) -> asio::awaitable<void> {
          // Shards of ~6,700 (or ~2,200) rows of 4 floats: a reply of a few thousand rows is larger
          // than the transport's read buffer, so direct receives land partly through the socket.
          const auto initial = iota_rows<float>(20011, 4);
          auto table = co_await strategy.scope().create_sharded_variable("lookup_paths", initial);
          REQUIRE(table.num_shards() == static_cast<std::size_t>(shards));
          auto one_shard = co_await strategy.scope().create_variable("lookup_one", initial);
          std::vector<std::int64_t> all(20011);
          std::iota(all.begin(), all.end(), 0);
          std::vector<std::int64_t> shuffled = all;
          std::mt19937_64 random(5);
          std::shuffle(shuffled.begin(), shuffled.end(), random);
          std::vector<std::int64_t> repeated;  // unsorted, every id several times
          std::uniform_int_distribution<std::int64_t> pick(0, 999);
          for (int k = 0; k < 30000; ++k) repeated.push_back(pick(random) * 20);
          std::vector<std::int64_t> sorted_repeats = repeated;
          std::sort(sorted_repeats.begin(), sorted_repeats.end());
          std::vector<std::int64_t> few;  // ~100 ids per shard of ~6,700 rows, two of them repeated
          std::uniform_int_distribution<std::int64_t> any(0, 20010);
          for (int k = 0; k < 300; ++k) few.push_back(any(random));
          few.push_back(few[7]);
          few.push_back(few[100]);
          // Half the rows, distinct, then 300 of them again: the first thousands of a shard's ids
          // do not repeat, so its repeats are asked as they are (with 3 shards: ~3,400 ids over
          // ~6,700 rows each).
          std::vector<std::int64_t> late_repeats(shuffled.begin(), shuffled.begin() + 10005);
          for (int k = 0; k < 300; ++k) late_repeats.push_back(late_repeats[static_cast<std::size_t>(k) * 31]);
          std::vector<std::int64_t> borders;
          const auto offsets = div_offsets(20011, static_cast<std::size_t>(shards));
          for (std::size_t i = 1; i + 1 < offsets.size(); ++i) {
            borders.push_back(static_cast<std::int64_t>(offsets[i]) - 1);
            borders.push_back(static_cast<std::int64_t>(offsets[i]));
          }
          // Repeats in unsorted ids are found by a reply index per row (ids >= rows / 8 per shard), a
          // bit per row (>= rows / 256) or a hash table (fewer), or not looked for when a shard's
          // first 2,048 ids hardly repeat: src/client/sharded.cpp, plan_part.
          const std::vector<std::vector<std::int64_t>> cases{
              all,                                   // sorted, distinct: each shard's reply lands in place
              shuffled,                              // unsorted, distinct: the first ids do not repeat, asked as they are
              repeated,                              // unsorted, repeats (index per row)
              sorted_repeats,                        // sorted, repeats
              few,                                   // unsorted, a few repeats (bit per row)
              late_repeats,                          // unsorted, repeats not looked for (3 shards)
              borders,                               // sorted, either side of every shard border
              {20010, 0, 20010, 3, 3, 6671},         // small, unsorted, repeats (hash table)
              {7},
              {},
          };
          for (int pass = 0; pass < 2; ++pass) {  // the second pass reuses the first's buffers
            for (const auto& ids : cases) co_await check_lookup(table, initial, ids);
          }
          // One shard: distinct ids, sorted or not, are received straight into the result.
          for (const auto& ids : cases) {
            const auto id_array = xt::adapt(ids);
            CHECK((co_await one_shard.embedding_lookup(id_array) == rows_of_table(initial, ids)));
          }
          // Lookups in flight at once each get their own buffers.
          co_await detail::run_all(cases.size(), [&](std::size_t i) { return check_lookup(table, initial, cases[i]); });
          // The ids are read when the lookup is called: changing or freeing them before the await
          // changes nothing.
          {
            auto changing = std::make_unique<xt::xarray<std::int64_t>>(xt::xarray<std::int64_t>{20010, 6671, 3});
            auto pending = table.embedding_lookup(*changing);
            (*changing)(0) = 0;
            changing.reset();
            const auto looked = co_await std::move(pending);
            CHECK((looked == rows_of_table(initial, {20010, 6671, 3})));
          }
          // Ids of rank 2 keep their shape.
          const xt::xarray<std::int64_t> grid{{20010, 1}, {1, 6671}};
          const auto looked_up = co_await table.embedding_lookup(grid);
          CHECK(looked_up.shape() == std::vector<std::size_t>{2, 2, 4});
          CHECK((xt::view(looked_up, 1, 1) == xt::view(initial, 6671)));
          // A bad id is found wherever it is, sorted or not, and nothing is sent.
          const xt::xarray<std::int64_t> sorted_bad{0, 5, 20011};
          const xt::xarray<std::int64_t> unsorted_bad{9, 2, -3, 4};
          auto e = co_await failure_of(table.embedding_lookup(sorted_bad));
          CHECK(message_of(e) == "embedding_lookup of 'lookup_paths': id 20011 (position 2) is out of range [0, 20011)");
          e = co_await failure_of(table.sparse_read(unsorted_bad));
          CHECK(message_of(e) == "sparse_read of 'lookup_paths': id -3 (position 2) is out of range [0, 20011)");
        },
        {}, {}, fixed_shards_partitioner{shards});
  }
}

// 3 shards: ids and rows are grouped by shard in one pass; 9: counted first (src/client/sharded.cpp,
// one_pass_max_shards).
TEST_CASE("scatters of sorted, unsorted and repeated ids, at once, equal the same scatters on a dense variable") {
  for (const std::int64_t shards : {3, 9}) {
    CAPTURE(shards);
    local_cluster cluster(2, 1);
    cluster.run_chief(
        [shards](parameter_server_strategy& strategy, cluster_coordinator&) -> asio::awaitable<void> {
          auto initial = iota_rows<float>(5003, 2);
          auto table = co_await strategy.scope().create_sharded_variable("scatter_paths", initial);
          REQUIRE(table.num_shards() == static_cast<std::size_t>(shards));
          std::mt19937_64 random(9);
          std::uniform_int_distribution<std::int64_t> pick(0, 5002);
          std::vector<std::int64_t> ids;
          for (int k = 0; k < 4000; ++k) ids.push_back(pick(random));
          std::vector<std::int64_t> sorted_ids = ids;
          std::sort(sorted_ids.begin(), sorted_ids.end());
          xt::xarray<float> rows = xt::zeros<float>({ids.size(), std::size_t{2}});
          for (std::size_t k = 0; k < ids.size(); ++k) rows(k, 0) = rows(k, 1) = static_cast<float>(k % 7) + 1;
          // Two scatters in flight at once: each holds its own per-shard buffers until it is sent.
          const auto id_array = xt::adapt(ids);
          const auto sorted_array = xt::adapt(sorted_ids);
          auto first = table.scatter_add(id_array, rows);
          auto second = table.scatter_add(sorted_array, rows);
          co_await std::move(first);
          co_await std::move(second);
          co_await table.scatter_add(id_array, rows);  // reuses the buffers
          for (int pass = 0; pass < 2; ++pass) {
            for (std::size_t k = 0; k < ids.size(); ++k) {
              const auto& id = pass == 0 ? ids : sorted_ids;
              for (std::size_t j = 0; j < 2; ++j) initial(static_cast<std::size_t>(id[k]), j) += rows(k, j);
            }
          }
          for (std::size_t k = 0; k < ids.size(); ++k) {
            for (std::size_t j = 0; j < 2; ++j) initial(static_cast<std::size_t>(ids[k]), j) += rows(k, j);
          }
          CHECK((co_await table.read() == initial));
          // An empty scatter sends nothing and changes nothing.
          const std::vector<std::int64_t> none;
          const xt::xarray<float> no_rows = xt::zeros<float>({std::size_t{0}, std::size_t{2}});
          const auto no_ids = xt::adapt(none);
          co_await table.scatter_add(no_ids, no_rows);
          CHECK((co_await table.read() == initial));
          // Ids and rows are read when the scatter is called: changing them before the await
          // changes nothing.
          std::vector<std::int64_t> changing_ids{5002, 0, 17};
          xt::xarray<float> changing_rows = xt::ones<float>({std::size_t{3}, std::size_t{2}});
          const auto changing_array = xt::adapt(changing_ids);
          auto pending = table.scatter_add(changing_array, changing_rows);
          changing_ids[0] = 1;
          changing_rows.fill(100.0F);
          co_await std::move(pending);
          for (const std::size_t id : {5002, 0, 17}) {
            for (std::size_t j = 0; j < 2; ++j) initial(id, j) += 1.0F;
          }
          CHECK((co_await table.read() == initial));
        },
        {}, {}, fixed_shards_partitioner{shards});
  }
}

TEST_CASE_TEMPLATE("every sharded operation equals the same operation on a dense variable", T, float, double) {
  local_cluster cluster(2, 1);
  cluster.run_chief(
      [](parameter_server_strategy& strategy, cluster_coordinator&) -> asio::awaitable<void> {
        auto scope = strategy.scope();
        const auto initial = iota_rows<T>(13, 3);
        auto dense = co_await scope.create_variable("dense", initial);
        auto sharded = co_await scope.create_sharded_variable("sharded", initial);
        // 13 rows in 3 shards: TF's "div" layout 5, 4, 4, placed round robin after "dense" (ps:0).
        REQUIRE(sharded.num_shards() == 3);
        CHECK(sharded.offsets() == std::vector<std::size_t>{0, 5, 9, 13});
        const auto shards = sharded.shards();
        CHECK(shards[0].handle.name() == "sharded/part_0");
        CHECK(shards[2].handle.name() == "sharded/part_2");
        CHECK(shards[1].handle.shape() == shape_type{4, 3});
        CHECK(shards[0].handle.ps_task() == 1);
        CHECK(shards[1].handle.ps_task() == 0);
        CHECK(shards[2].handle.ps_task() == 1);
        CHECK(shards[2].offset == 9);
        CHECK((co_await sharded.read() == initial));
        const xt::xarray<T> middle_rows = xt::view(initial, xt::range(5, 9));
        CHECK((co_await shards[1].handle.read() == middle_rows));

        auto same = [&]() -> asio::awaitable<bool> {
          const auto a = co_await dense.read();
          const auto b = co_await sharded.read();
          co_return a == b;
        };
        const xt::xarray<T> delta = iota_rows<T>(13, 3) * T(0.5);  // evaluated here, not in co_await
        co_await dense.assign_add(delta);
        co_await sharded.assign_add(delta);
        CHECK(co_await same());
        co_await dense.assign_sub(initial);
        co_await sharded.assign_sub(initial);
        CHECK(co_await same());

        // Ids over every shard, repeated, unsorted; one row per id.
        const xt::xarray<std::int64_t> ids{12, 0, 5, 12, 4, 9, 8, 0, 12};
        xt::xarray<T> rows = xt::zeros<T>({ids.size(), std::size_t{3}});
        for (std::size_t k = 0; k < ids.size(); ++k) {
          for (std::size_t j = 0; j < 3; ++j) rows(k, j) = static_cast<T>(k + 1) - static_cast<T>(j) / T(2);
        }
        // Operands are named arrays, not expressions: g++ 12 destroys temporaries of a co_await
        // full-expression before the call has used them (clang does not).
        const xt::xarray<T> quarter = rows * T(0.25), shifted = rows + T(3), lowered = rows - T(2),
                            negated = rows * T(-1);
        co_await dense.scatter_add(ids, rows);
        co_await sharded.scatter_add(ids, rows);
        CHECK(co_await same());
        co_await dense.scatter_sub(ids, quarter);
        co_await sharded.scatter_sub(ids, quarter);
        CHECK(co_await same());
        co_await dense.scatter_mul(ids, rows);
        co_await sharded.scatter_mul(ids, rows);
        CHECK(co_await same());
        co_await dense.scatter_div(ids, shifted);
        co_await sharded.scatter_div(ids, shifted);
        CHECK(co_await same());
        co_await dense.scatter_min(ids, lowered);
        co_await sharded.scatter_min(ids, lowered);
        CHECK(co_await same());
        co_await dense.scatter_max(ids, negated);
        co_await sharded.scatter_max(ids, negated);
        CHECK(co_await same());
        co_await dense.scatter_update(ids, rows);
        co_await sharded.scatter_update(ids, rows);
        CHECK(co_await same());
        // scatter_update with a repeated id keeps the last row, as applied in order.
        const auto now = co_await sharded.read();
        CHECK(now(12, 0) == rows(8, 0));

        CHECK((co_await dense.sparse_read(ids) == co_await sharded.sparse_read(ids)));
        const xt::xarray<std::int64_t> grid{{3, 11}, {11, 6}};
        const auto looked_up = co_await sharded.embedding_lookup(grid);
        CHECK(looked_up.shape() == std::vector<std::size_t>{2, 2, 3});
        CHECK((looked_up == co_await dense.embedding_lookup(grid)));
      },
      {}, {}, fixed_shards_partitioner{3});
}

TEST_CASE("large replies are gathered as they are sent, their rows right before and after an update") {
  local_cluster cluster(2, 1);
  cluster.run_chief(
      [](parameter_server_strategy& strategy, cluster_coordinator&) -> asio::awaitable<void> {
        // 3 shards of ~100k rows of 4 floats; a lookup of every row makes replies of ~1.6 MB, past
        // the 1 MiB of work from which a ps fills a reply as it sends it (docs/design.md).
        const auto initial = iota_rows<float>(300007, 4);
        auto table = co_await strategy.scope().create_sharded_variable("streamed", initial);
        std::vector<std::int64_t> ids(300007);
        std::iota(ids.begin(), ids.end(), 0);
        std::mt19937_64 random(11);
        std::shuffle(ids.begin(), ids.end(), random);
        ids.insert(ids.end(), ids.begin(), ids.begin() + 1000);  // repeats too
        const auto id_array = xt::adapt(ids);
        // (That an update sent after a lookup waits for its last gathered row is tested step by step
        // in tests/unit/ps_kernel_pool_test.cpp: a lookup and an update in flight at once on several
        // ps have no order between them.)
        const auto rows = co_await table.embedding_lookup(id_array);
        CHECK((rows == rows_of_table(initial, ids)));
        const xt::xarray<float> ones = xt::ones<float>({ids.size(), std::size_t{4}});
        co_await table.scatter_add(id_array, ones);
        // Once more, after the update: repeated ids were added twice.
        xt::xarray<float> updated = initial;
        for (const auto id : ids) xt::view(updated, id) += 1.0f;
        const auto again = co_await table.embedding_lookup(id_array);
        CHECK((again == rows_of_table(updated, ids)));
      },
      {}, {}, fixed_shards_partitioner{3});
}

TEST_CASE("lookups return rows in input order, duplicates included") {
  local_cluster cluster(2, 1);
  cluster.run_chief(
      [](parameter_server_strategy& strategy, cluster_coordinator&) -> asio::awaitable<void> {
        const auto initial = iota_rows<float>(11, 2);
        auto table = co_await strategy.scope().create_sharded_variable("table", initial);
        REQUIRE(table.num_shards() == 4);
        const std::vector<std::int64_t> order{10, 0, 7, 7, 3, 10, 1};
        const auto order_ids = xt::adapt(order);
        const auto rows = co_await table.sparse_read(order_ids);
        REQUIRE(rows.shape() == std::vector<std::size_t>{7, 2});
        for (std::size_t k = 0; k < order.size(); ++k) {
          CHECK(rows(k, 0) == initial(order[k], 0));
          CHECK(rows(k, 1) == initial(order[k], 1));
        }
        const std::vector<std::int64_t> none;
        const auto no_ids = xt::adapt(none);
        const auto nothing = co_await table.sparse_read(no_ids);
        const std::vector<std::size_t> no_rows{0, 2};
        CHECK(nothing.shape() == no_rows);
      },
      {}, {}, fixed_shards_partitioner{4});
}

TEST_CASE("an id out of range names the id and the row count and changes nothing") {
  local_cluster cluster(2, 1);
  cluster.run_chief(
      [](parameter_server_strategy& strategy, cluster_coordinator&) -> asio::awaitable<void> {
        const auto initial = iota_rows<float>(10, 2);
        auto scope = strategy.scope();
        auto table = co_await scope.create_sharded_variable("table", initial);
        auto dense = co_await scope.create_variable("dense", initial);
        const xt::xarray<std::int64_t> too_big{1, 9, 10};
        const xt::xarray<std::int64_t> negative{-1};
        const xt::xarray<float> three_rows = xt::ones<float>({3, 2});
        const xt::xarray<float> one_row = xt::ones<float>({1, 2});
        auto e = co_await failure_of(table.scatter_add(too_big, three_rows));
        CHECK(code_of(e) == errc::invalid_argument);
        CHECK(message_of(e) == "scatter_add of 'table': id 10 (position 2) is out of range [0, 10)");
        e = co_await failure_of(table.scatter_update(negative, one_row));
        CHECK(message_of(e) == "scatter_update of 'table': id -1 (position 0) is out of range [0, 10)");
        e = co_await failure_of(table.embedding_lookup(too_big));
        CHECK(message_of(e) == "embedding_lookup of 'table': id 10 (position 2) is out of range [0, 10)");
        e = co_await failure_of(table.apply_sparse_gradient(optimizers::sgd{}, too_big, three_rows));
        CHECK(code_of(e) == errc::invalid_argument);
        // A dense variable's ids are checked the same way.
        e = co_await failure_of(dense.scatter_sub(too_big, three_rows));
        CHECK(message_of(e) == "scatter_sub of 'dense': id 10 (position 2) is out of range [0, 10)");
        // Rows that do not match the ids, a dense value of the wrong shape, ids of rank 2.
        e = co_await failure_of(table.scatter_add(too_big, one_row));
        CHECK(message_of(e) == "scatter_add of 'table': 3 ids need float32 rows of shape [3, 2], got float32 [1, 2]");
        const xt::xarray<float> wrong_shape = xt::ones<float>({2, 10});
        e = co_await failure_of(table.assign(wrong_shape));
        CHECK(message_of(e) == "assign to 'table': the value is float32 [2, 10] but the variable is float32 [10, 2]");
        const xt::xarray<std::int64_t> matrix{{1, 2}};
        e = co_await failure_of(table.sparse_read(matrix));
        CHECK(message_of(e) == "sparse_read: indices must be 1D Tensor for sparse operations. Received shape: [1, 2]");
        CHECK((co_await table.read() == initial));
        CHECK((co_await dense.read() == initial));
      },
      {}, {}, fixed_shards_partitioner{3});
}

TEST_CASE("an integer division by zero is refused before anything changes") {
  local_cluster cluster(1, 1);
  cluster.run_chief([](parameter_server_strategy& strategy, cluster_coordinator&) -> asio::awaitable<void> {
    const xt::xarray<std::int32_t> initial{{8, 9}, {10, 11}, {-7, 3}};
    auto v = co_await strategy.scope().create_variable("counts", initial);
    const xt::xarray<std::int64_t> ids{0, 1};
    const xt::xarray<std::int32_t> divisors{{2, 3}, {0, 1}};
    auto e = co_await failure_of(v.scatter_div(ids, divisors));
    CHECK(code_of(e) == errc::invalid_argument);
    CHECK(contains(message_of(e), "integer division by zero"));
    CHECK((co_await v.read() == initial));
    const xt::xarray<std::int64_t> last{2};
    const xt::xarray<std::int32_t> minus_one{{-1, 2}};
    co_await v.scatter_div(last, minus_one);
    const xt::xarray<std::int32_t> expected{{8, 9}, {10, 11}, {7, 1}};
    CHECK((co_await v.read() == expected));
  });
}

TEST_CASE("a partitioner's answer is clamped to the row count, 0 is refused, scalars never split") {
  local_cluster cluster(2, 1);
  cluster.run_chief(
      [](parameter_server_strategy& strategy, cluster_coordinator&) -> asio::awaitable<void> {
        auto scope = strategy.scope();
        xt::xarray<double> three_rows = xt::zeros<double>({3, 1});
        three_rows.fill(1.5);
        auto clamped = co_await scope.create_sharded_variable("clamped", three_rows);
        CHECK(clamped.num_shards() == 3);
        const xt::xarray<double> scalar(4.0);
        auto single = co_await scope.create_sharded_variable("scalar", scalar);
        CHECK(single.num_shards() == 1);
        CHECK(single.shards()[0].handle.name() == "scalar");
        CHECK((co_await single.read())() == 4.0);
        const xt::xarray<double> zero_rows = xt::zeros<double>({0, 4});
        auto empty = co_await scope.create_sharded_variable("empty", zero_rows);
        CHECK(empty.num_shards() == 1);
        const auto empty_value = co_await empty.read();
        CHECK(empty_value.shape() == zero_rows.shape());
      },
      {}, {}, [](std::span<const std::size_t> shape, dtype) -> std::size_t { return shape.size() == 1 ? 0 : 7; });

  local_cluster refusing(1, 1);
  refusing.run_chief(
      [](parameter_server_strategy& strategy, cluster_coordinator&) -> asio::awaitable<void> {
        const xt::xarray<float> v{1.0f, 2.0f};
        auto e = co_await failure_of(strategy.scope().create_sharded_variable("v", v));
        CHECK(code_of(e) == errc::invalid_argument);
        CHECK(message_of(e) ==
              "variable_partitioner must return a non-zero number of shards, got 0 for 'v' float32 [2]");
      },
      {}, {}, [](std::span<const std::size_t>, dtype) -> std::size_t { return 0; });
}

TEST_CASE("a sharded variable exists whole or not at all: when a shard fails, the ones created are removed") {
  local_cluster cluster(2, 1);
  cluster.run_chief(
      [](parameter_server_strategy& strategy, cluster_coordinator&) -> asio::awaitable<void> {
        auto scope = strategy.scope();
        // Round robin: "t/part_1" goes to ps:0; then t's shard 0 to ps:1 and shard 1 to ps:0, where its
        // name is taken; the next variable goes to ps:1 again.
        const xt::xarray<float> small{1.0f, 2.0f};
        auto squatter = co_await scope.create_variable("t/part_1", small);
        CHECK(squatter.ps_task() == 0);
        const xt::xarray<float> table = xt::zeros<float>({4, 2});
        auto e = co_await failure_of(scope.create_sharded_variable("t", table));
        CHECK(code_of(e) == errc::already_exists);
        CHECK(contains(message_of(e), "t/part_1"));
        // Shard 0 was created on ps:1 and removed again: its name is free there.
        const xt::xarray<float> other{5.0f};
        auto reused = co_await scope.create_variable("t/part_0", other);
        CHECK(reused.ps_task() == 1);
        CHECK((co_await reused.read() == other));
        CHECK((co_await squatter.read() == small));  // the variable that was in the way is untouched
      },
      {}, {}, [](std::span<const std::size_t>, dtype) -> std::size_t { return 2; });
}

TEST_CASE("read_rows slices a sharded variable as Python slices the dense one") {
  local_cluster cluster(2, 1);
  cluster.run_chief(
      [](parameter_server_strategy& strategy, cluster_coordinator&) -> asio::awaitable<void> {
        const auto dense = iota_rows<float>(10, 3);
        auto table = co_await strategy.scope().create_sharded_variable("sliced", dense);
        REQUIRE(table.num_shards() == 3);  // rows 0-3, 4-6, 7-9
        const xt::xarray<float> middle = xt::view(dense, xt::range(2, 8), xt::all());
        CHECK((co_await table.read_rows(2, 8) == middle));
        const xt::xarray<float> last_two = xt::view(dense, xt::range(8, 10), xt::all());
        CHECK((co_await table.read_rows(-2, std::nullopt) == last_two));
        const xt::xarray<float> backwards = xt::view(dense, xt::keep(9, 6, 3, 0), xt::all());  // Python's [::-3]
        CHECK((co_await table.read_rows(std::nullopt, std::nullopt, -3) == backwards));
        const auto empty = co_await table.read_rows(5, 5);
        CHECK(empty.shape() == std::vector<std::size_t>{0, 3});
        auto e = co_await failure_of(table.read_rows(0, 3, 0));
        CHECK(code_of(e) == errc::invalid_argument);
        CHECK(message_of(e) == "read_rows of 'sliced': slice step cannot be zero");
        const xt::xarray<float> scalar(2.0f);
        auto single = co_await strategy.scope().create_sharded_variable("single", scalar);
        e = co_await failure_of(single.read_rows(0, 1));
        CHECK(message_of(e) == "read_rows of 'single': a scalar variable has no rows");
        // A dense variable slices alike.
        auto plain = co_await strategy.scope().create_variable("plain", dense);
        CHECK((co_await plain.read_rows(2, 8) == middle));
      },
      {}, {}, [](std::span<const std::size_t>, dtype) -> std::size_t { return 3; });
}

TEST_CASE("a sharded variable is a worker-function argument") {
  local_cluster cluster(2, 2, bind_test_functions);
  cluster.run_chief(
      [](parameter_server_strategy& strategy, cluster_coordinator& coordinator) -> asio::awaitable<void> {
        const xt::xarray<float> zeros = xt::zeros<float>({9, 4});
        auto table = co_await strategy.scope().create_sharded_variable("table", zeros);
        REQUIRE(table.num_shards() == 2);
        std::vector<remote_value<double>> sums;
        for (int i = 0; i < 6; ++i) sums.push_back(coordinator.schedule(bump_row, table, std::int64_t{7}));
        co_await coordinator.join();
        const auto value = co_await table.read();
        CHECK(xt::sum(value)() == doctest::Approx(6 * 4));
        CHECK(value(7, 3) == 6.0f);
        CHECK(value(6, 0) == 0.0f);
      },
      {}, {}, fixed_shards_partitioner{2});
}

TEST_CASE("a layout that is not TF's div partition is refused") {
  const variable_ref a{"t/part_0", dtype::float32, {2, 3}, 0};
  const variable_ref b{"t/part_1", dtype::float32, {3, 3}, 1};
  CHECK_THROWS_WITH_AS(sharded_variable<float>(sharded_variable_ref{"t", dtype::float32, {5, 3}, {a, b}}, nullptr),
                       "the shards of 't' are not TF's \"div\" partition of 5 rows into 2 shards", error);
  CHECK_THROWS_WITH_AS(sharded_variable<float>(sharded_variable_ref{"t", dtype::float32, {6, 3}, {b, a}}, nullptr),
                       "the shards of 't' hold 5 rows but its shape [6, 3] has 6", error);
  const variable_ref c{"t/part_1", dtype::float32, {2, 4}, 1};
  CHECK_THROWS_AS(sharded_variable<float>(sharded_variable_ref{"t", dtype::float32, {4, 3}, {a, c}}, nullptr), error);
  CHECK_THROWS_WITH_AS(sharded_variable<double>(sharded_variable_ref{"t", dtype::float32, {4, 3}, {a, a}}, nullptr),
                       "expected a float64 variable, got 't' of float32", error);
  CHECK_THROWS_AS(sharded_variable<float>(sharded_variable_ref{"t", dtype::float32, {}, {}}, nullptr), error);
}

TEST_CASE("initializers give the same values whatever the number of shards") {
  const std::vector<initializer> inits{initializers::random_uniform{-1, 2, 5}, initializers::random_normal{1, 3, 5},
                                       initializers::truncated_normal{0, 1, 5}, initializers::glorot_uniform{5},
                                       initializers::constant{2.5}, initializers::ones{}};
  std::vector<std::vector<xt::xarray<float>>> by_shards;
  for (const std::size_t shards : {1, 2, 3, 5}) {
    local_cluster cluster(3, 1);
    auto& values = by_shards.emplace_back();
    cluster.run_chief(
        [&](parameter_server_strategy& strategy, cluster_coordinator&) -> asio::awaitable<void> {
          for (std::size_t i = 0; i < inits.size(); ++i) {
            // Named, not a braced list in the co_await expression: g++ 12 cannot compile that.
            const shape_type shape{37, 4};
            auto v = co_await strategy.scope().create_sharded_variable<float>("v" + std::to_string(i), shape, inits[i]);
            CHECK(v.num_shards() == shards);
            values.push_back(co_await v.read());
          }
        },
        {}, {}, fixed_shards_partitioner{static_cast<std::int64_t>(shards)});
  }
  for (std::size_t s = 1; s < by_shards.size(); ++s) {
    for (std::size_t i = 0; i < inits.size(); ++i) CHECK((by_shards[s][i] == by_shards[0][i]));
  }
  const auto& v = by_shards[0];
  CHECK(xt::amin(v[0])() >= -1.0f);
  CHECK(xt::amax(v[0])() < 2.0f);
  CHECK(xt::amin(v[2])() >= -2.0f);
  CHECK(xt::amax(v[2])() <= 2.0f);
  const float glorot_limit = std::sqrt(6.0f / (37 + 4));
  CHECK(xt::amax(xt::abs(v[3]))() <= glorot_limit);
  CHECK(xt::amax(xt::abs(v[3]))() > glorot_limit * 0.8f);
  CHECK((v[4] == xt::xarray<float>(2.5f * xt::ones<float>({37, 4}))));
  CHECK((v[5] == xt::xarray<float>(xt::ones<float>({37, 4}))));
  // Values are random, not a copy of one draw.
  CHECK(std::set<float>(v[1].begin(), v[1].end()).size() == 37 * 4);
}

TEST_CASE("initializer statistics match their distributions; names and seeds give different values") {
  local_cluster cluster(2, 1);
  cluster.run_chief(
      [](parameter_server_strategy& strategy, cluster_coordinator&) -> asio::awaitable<void> {
        auto scope = strategy.scope();
        const shape_type shape{20000, 5};
        const shape_type three{3};
        const shape_type long_vector{100000};
        auto normal = co_await scope.create_sharded_variable<double>("normal", shape,
                                                                     initializers::random_normal{1.0, 2.0, 11});
        const auto n = co_await normal.read();
        const double mean = xt::mean(n)();
        const double stddev = std::sqrt(xt::mean(xt::square(n - mean))());
        // 100,000 draws: the sample mean is within 0.03 (5 standard errors) and the deviation within 2%.
        CHECK(std::abs(mean - 1.0) < 0.03);
        CHECK(std::abs(stddev - 2.0) < 0.04);
        auto uniform = co_await scope.create_variable<double>("uniform", long_vector, initializers::random_uniform{0, 1, 11});
        const double uniform_mean = xt::mean(co_await uniform.read())();
        CHECK(std::abs(uniform_mean - 0.5) < 0.005);
        auto other_name = co_await scope.create_sharded_variable<double>("other", shape,
                                                                         initializers::random_normal{1.0, 2.0, 11});
        auto other_seed = co_await scope.create_sharded_variable<double>("normal2", shape,
                                                                         initializers::random_normal{1.0, 2.0, 12});
        CHECK((co_await other_name.read() != n));
        CHECK((co_await other_seed.read() != n));
        // Bad parameters are refused by the ps, which creates nothing.
        auto e = co_await failure_of(scope.create_variable<double>("bad", three, initializers::random_uniform{2, 1}));
        CHECK(code_of(e) == errc::invalid_argument);
        CHECK(contains(message_of(e), "random_uniform initializer: minval 2 is above maxval 1"));
        e = co_await failure_of(scope.create_variable<std::int32_t>("bad", three, initializers::random_normal{}));
        CHECK(contains(message_of(e), "random_normal initializer needs a float32 or float64 variable, not int32"));
        auto ok = co_await scope.create_variable<std::int32_t>("bad", three, initializers::constant{7});
        const xt::xarray<std::int32_t> sevens{7, 7, 7};
        CHECK((co_await ok.read() == sevens));
      },
      {}, {}, min_size_partitioner{64 << 10, 2});
}

namespace {

// What a shard initializer was asked for.
struct shard_request {
  shape_type full_shape, offset, shape;
  std::size_t index, count;
};

// Element (i, j) of the whole [rows, 4] table the shard initializers below fill: 10 i + j.
xt::xarray<float> expected_table(std::size_t rows) {
  xt::xarray<float> out = xt::zeros<float>({rows, std::size_t{4}});
  for (std::size_t i = 0; i < rows; ++i) {
    for (std::size_t j = 0; j < 4; ++j) out(i, j) = static_cast<float>(10 * i + j);
  }
  return out;
}

// The rows of expected_table that shard `s` covers, computed from the shard's place alone.
xt::xarray<float> table_shard(const shard_info& s) {
  xt::xarray<float> out = xt::zeros<float>(s.shape);
  for (std::size_t i = 0; i < s.shape[0]; ++i) {
    for (std::size_t j = 0; j < s.shape[1]; ++j) out(i, j) = static_cast<float>(10 * (s.offset[0] + i) + j);
  }
  return out;
}

}  // namespace

TEST_CASE("a shard initializer is asked for one shard at a time and its values land in their shards") {
  local_cluster cluster(2, 1);
  cluster.run_chief(
      [](parameter_server_strategy& strategy, cluster_coordinator&) -> asio::awaitable<void> {
        auto scope = strategy.scope();
        std::vector<shard_request> asked;
        const auto init = [&asked](const shard_info& s) {
          asked.push_back({s.full_shape, s.offset, s.shape, s.index, s.count});
          return table_shard(s);
        };
        const shape_type shape{10, 4};
        auto table = co_await scope.create_sharded_variable<float>("table", shape, init);
        // 10 rows in 3 shards (TF's div: 4, 3, 3), each asked for once, in order, never the whole.
        REQUIRE(asked.size() == 3);
        const std::vector<std::size_t> rows{4, 3, 3}, starts{0, 4, 7};
        for (std::size_t i = 0; i < 3; ++i) {
          CAPTURE(i);
          CHECK(asked[i].full_shape == shape);
          CHECK(asked[i].offset == shape_type{starts[i], 0});
          CHECK(asked[i].shape == shape_type{rows[i], 4});
          CHECK(asked[i].index == i);
          CHECK(asked[i].count == 3);
        }
        // Read back whole and shard by shard.
        const auto whole = expected_table(10);
        CHECK((co_await table.read() == whole));
        for (const auto& shard : table.shards()) {
          const auto part = co_await shard.handle.read();
          CHECK((part == xt::xarray<float>(xt::view(whole, xt::range(shard.offset, shard.offset + part.shape()[0])))));
        }
        // A dense variable is its own one shard; a callable may also return a pscoro::tensor.
        asked.clear();
        const shape_type small{3, 4};
        auto dense = co_await scope.create_variable<float>("dense", small, init);
        REQUIRE(asked.size() == 1);
        CHECK(asked[0].offset == shape_type{0, 0});
        CHECK(asked[0].shape == small);
        CHECK(asked[0].count == 1);
        CHECK((co_await dense.read() == expected_table(3)));
        const auto as_tensor = [](const shard_info& s) { return to_tensor(table_shard(s)); };
        auto from_tensor = co_await scope.create_sharded_variable<float>("from_tensor", shape, as_tensor);
        CHECK((co_await from_tensor.read() == whole));
      },
      {}, {}, fixed_shards_partitioner{3});
}

TEST_CASE("a shard initializer returning a wrong shape or dtype, or throwing, creates nothing and says which shard") {
  local_cluster cluster(2, 1);
  cluster.run_chief(
      [](parameter_server_strategy& strategy, cluster_coordinator&) -> asio::awaitable<void> {
        auto scope = strategy.scope();
        const shape_type shape{10, 4};
        const auto wrong_shape = [](const shard_info& s) {
          return s.index == 1 ? xt::xarray<float>(xt::zeros<float>({2, 4})) : table_shard(s);
        };
        auto e = co_await failure_of(scope.create_sharded_variable<float>("t", shape, wrong_shape));
        REQUIRE(e);
        CHECK(code_of(e) == errc::invalid_argument);
        CHECK(message_of(e) ==
              "the initializer of 't' returned float32 [2, 4] for shard 1 of 3 (offset [4, 0]), which is float32 [3, 4]");
        const auto wrong_dtype = [](const shard_info& s) { return xt::xarray<double>(xt::zeros<double>(s.shape)); };
        e = co_await failure_of(scope.create_sharded_variable<float>("t", shape, wrong_dtype));
        REQUIRE(e);
        CHECK(code_of(e) == errc::invalid_argument);
        CHECK(message_of(e) ==
              "the initializer of 't' returned float64 [4, 4] for shard 0 of 3 (offset [0, 0]), which is float32 [4, 4]");
        const auto throws = [](const shard_info& s) {
          if (s.index == 2) throw error(errc::out_of_range, "no data for the last shard");
          return table_shard(s);
        };
        e = co_await failure_of(scope.create_sharded_variable<float>("t", shape, throws));
        REQUIRE(e);
        CHECK(code_of(e) == errc::out_of_range);
        // Shards 0 (and 1) were created before each failure and removed: the names are free.
        auto t = co_await scope.create_sharded_variable<float>("t", shape, [](const shard_info& s) { return table_shard(s); });
        CHECK((co_await t.read() == expected_table(10)));
      },
      {}, {}, fixed_shards_partitioner{3});
}

namespace {

xt::xarray<float> filled_rows(const shape_type& shape, float x) {
  xt::xarray<float> out(shape);
  out.fill(x);
  return out;
}

bool all_equal_to(const xt::xarray<float>& a, float x) {
  return std::all_of(a.begin(), a.end(), [x](float e) { return e == x; });
}

}  // namespace

TEST_CASE("assigns of arrays, temporaries and expressions land whole; reads and assigns in flight keep their order") {
  local_cluster cluster(2, 1);
  cluster.run_chief(
      [](parameter_server_strategy& strategy, cluster_coordinator&) -> asio::awaitable<void> {
        // 256 KiB per shard: large enough for the ps's buffer pool, so the assigns after the first
        // are received into the storage the ones before replaced.
        const shape_type shape{512, 256};
        auto v = co_await strategy.scope().create_sharded_variable<float>("big", shape, initializers::zeros{});
        REQUIRE(v.num_shards() == 2);
        for (int k = 1; k <= 3; ++k) {
          const float x = static_cast<float>(k);
          const auto sent = filled_rows(shape, x);  // sent from its own storage
          co_await v.assign(sent);
          const auto read_1 = co_await v.read();
          CHECK(all_equal_to(read_1, x));
          co_await v.assign(filled_rows(shape, x + 10));  // a temporary: moved in, never viewed
          const auto read_2 = co_await v.read();
          CHECK(all_equal_to(read_2, x + 10));
          const auto doubled = sent * 2.0f;  // an expression: evaluated once
          co_await v.assign_add(doubled);
          const auto read_3 = co_await v.read();
          CHECK(all_equal_to(read_3, 3 * x + 10));
          co_await v.assign_sub(xt::xtensor<float, 2>(sent));  // another container type, moved in
          const auto read_4 = co_await v.read();
          CHECK(all_equal_to(read_4, 2 * x + 10));
        }

        // Id expressions with a scalar are evaluated to their own shape (xt::eval made them 4-D).
        const xt::xarray<std::int64_t> ids{0, 300};
        const auto next_ids = ids + std::int64_t{1};
        const auto rows = co_await v.sparse_read(next_ids);
        CHECK(rows.dimension() == 2);
        CHECK(rows.shape()[0] == 2);
        CHECK(all_equal_to(rows, 16));

        // Reads and assigns started together are served in the order they were started.
        std::vector<xt::xarray<float>> values, seen;
        for (int i = 0; i < 6; ++i) {
          values.push_back(filled_rows(shape, static_cast<float>(100 + i)));
          seen.push_back(filled_rows(shape, -1));
        }
        co_await detail::run_all(6, [&](std::size_t i) { return i % 2 ? v.assign(values[i]) : v.read(seen[i]); });
        CHECK(all_equal_to(seen[0], 16));
        CHECK(all_equal_to(seen[2], 101));
        CHECK(all_equal_to(seen[4], 103));
        const auto read_5 = co_await v.read();
        CHECK(all_equal_to(read_5, 105));
      },
      {}, {}, fixed_shards_partitioner{2});
}

// TF's VariablePartitioningTest.testColocateWith: with a partitioner of 2, a variable made in
// colocate_vars_with(v1's first shard) is whole, on that shard's ps.
TEST_CASE("colocate_vars_with puts a variable whole on the other's ps, and the round robin does not move") {
  local_cluster cluster(3, 1);
  cluster.run_chief(
      [](parameter_server_strategy& strategy, cluster_coordinator&) -> asio::awaitable<void> {
        const xt::xarray<float> four = {0, 1, 2, 3};
        const xt::xarray<float> two = {4, 5};
        auto scope = strategy.scope();
        auto v1 = co_await scope.create_sharded_variable("v1", four);
        REQUIRE(v1.num_shards() == 2);
        const auto first = v1.shards()[0].handle;
        auto colocated = scope.colocate_vars_with(first);
        auto v2 = co_await colocated.create_sharded_variable("v2", two);  // never partitioned
        CHECK(v2.num_shards() == 1);
        CHECK(v2.ref().shards[0].ps_task == first.ps_task());
        CHECK((co_await v2.read() == two));
        auto v3 = co_await colocated.create_variable("v3", two);
        CHECK(v3.ps_task() == first.ps_task());
        // v1's shards took ps 0 and 1; the colocated ones took no turn: the next is ps 2.
        auto v4 = co_await scope.create_variable("v4", two);
        CHECK(v4.ps_task() == 2);
        // A hash table's buckets go to every ps: it cannot be colocated.
        pscoro::hash_table_options table;
        table.dim = 2;
        const auto refused = co_await failure_of(colocated.create_hash_table<float>("t", table));
        CHECK(code_of(refused) == errc::invalid_argument);
        CHECK_MESSAGE(contains(message_of(refused), "'t' cannot be colocated"), message_of(refused));
      },
      {}, {}, fixed_shards_partitioner{2});
}

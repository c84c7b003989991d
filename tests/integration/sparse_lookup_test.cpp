// embedding_lookup_sparse and safe_embedding_lookup_sparse: TF's expected values (sharded_variable_test's
// testEmbeddingLookup, embedding_ops' docstrings and SafeEmbeddingLookupSparseTest) on a real
// in-process cluster, over uneven shards and a dense variable; what the lookups ask the ps, seen
// through a recording variable_io; bad input refused before anything is sent.
#include "local_cluster.hpp"
#include "test_support.hpp"

#include <pscoro/sharded_variable.hpp>
#include <pscoro/sparse_ids.hpp>
#include <pscoro/strategy.hpp>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/use_future.hpp>

#include <xtensor/xadapt.hpp>
#include <xtensor/xio.hpp>
#include <xtensor/xview.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <span>
#include <sstream>
#include <string>
#include <vector>

using namespace pscoro;
using pscoro::testing::code_of;
using pscoro::testing::failure_of;
using pscoro::testing::local_cluster;
using pscoro::testing::message_of;

namespace {

const worker_function<std::vector<double>(sharded_variable<float>, sparse_ids<std::int64_t>)> pool_on_worker{
    "test.pool_on_worker"};

void bind_sparse_functions(server& s) {
  // Sums each row's weighted rows of `batch` on the worker, through the worker's own connections to the ps.
  s.bind(pool_on_worker,
         [](sharded_variable<float> table, sparse_ids<std::int64_t> batch) -> asio::awaitable<std::vector<double>> {
           const auto pooled = co_await table.embedding_lookup_sparse(batch, combiner::sum);
           co_return std::vector<double>(pooled.begin(), pooled.end());
         });
}

template <class T>
std::string text_of(const xt::xarray<T>& a) {
  std::ostringstream out;
  out << a;
  return out.str();
}

// Elementwise within TF's assertAllClose tolerances, and the same shape.
template <class T>
void check_close(const xt::xarray<T>& got, const xt::xarray<T>& expected) {
  REQUIRE_MESSAGE(got.shape() == expected.shape(), "got " << text_of(got) << "\nexpected " << text_of(expected));
  CHECK_MESSAGE(xt::allclose(got, expected, 1e-6, 1e-6), "got " << text_of(got) << "\nexpected " << text_of(expected));
}

// Row i of a table, as an array.
template <class T>
xt::xarray<T> row_of(const xt::xarray<T>& table, std::size_t i) {
  return xt::view(table, i, xt::all());
}

// Rows stacked into a [n, columns] array.
template <class T>
xt::xarray<T> stack_rows(const std::vector<xt::xarray<T>>& rows) {
  xt::xarray<T> out = xt::zeros<T>({rows.size(), rows.front().size()});
  for (std::size_t i = 0; i < rows.size(); ++i) xt::view(out, i, xt::all()) = rows[i];
  return out;
}

// Row i of `rows` divided by divisors[i].
template <class T>
xt::xarray<T> divide_rows(xt::xarray<T> rows, const std::vector<T>& divisors) {
  for (std::size_t i = 0; i < divisors.size(); ++i) xt::view(rows, i, xt::all()) /= divisors[i];
  return rows;
}

// TF's SafeEmbeddingLookupSparseTest._ids_and_weights_2d. Each row is a case:
//   0: several valid ids and one invalid id, weighted mean;  1: all ids invalid (nothing left);
//   2: no ids to begin with;  3: a single id;  4: every weight <= 0.
// (TF: indices [0,0] [0,1] [0,2] [1,0] [3,0] [4,0] [4,1], dense_shape [5, 4].)
const sparse_ids<std::int64_t> tf_safe_ids{
    .rows = {0, 0, 0, 1, 3, 4, 4}, .ids = {0, 1, -1, -1, 2, 0, 1}, .weights = {1.0f, 2.0f, 1.0f, 1.0f, 3.0f, 0.0f, -0.5f}, .dense_rows = 5};

template <class T>
xt::xarray<T> vocabulary_of_four() {
  xt::xarray<T> out = xt::zeros<T>({4, 4});
  for (std::size_t i = 0; i < 4; ++i) {
    for (std::size_t j = 0; j < 4; ++j) out(i, j) = static_cast<T>(i * 4 + j + 1) / T(8) - T(1);
  }
  return out;
}

// A variable_io over an in-memory table that records what each shard is asked for: the seam
// between a handle and the ps, so a test sees exactly which rows would travel.
class recording_io : public detail::variable_io {
 public:
  recording_io(xt::xarray<float> table, const sharded_variable_ref& ref) : table_(std::move(table)) {
    std::size_t offset = 0;
    for (const auto& shard : ref.shards) {
      offsets_[shard.name] = offset;
      offset += shard.shape[0];
    }
  }

  /// Per shard name, the ids of each gather it received, in order.
  std::map<std::string, std::vector<std::vector<std::int64_t>>> gathers;

  /// The reply goes into `into` when that has its size, its arrival told in uneven pieces (the
  /// first byte, then every row and a half and a byte), as a connection tells it: rows arrive cut
  /// anywhere, and what has not arrived yet is NaN (a caller that read it would be seen). Else
  /// into a fresh tensor, nothing told.
  asio::awaitable<tensor> gather(variable_ref variable, tensor ids, byte_buffer into, arrival_handler on_arrival) override {
    const auto* asked = ids.data<std::int64_t>();
    gathers[variable.name].emplace_back(asked, asked + ids.size());
    const std::size_t columns = table_.shape()[1];
    const std::size_t row_bytes = columns * sizeof(float);
    shape_type shape{ids.size(), columns};
    tensor rows = tensor::uninitialized(dtype::float32, shape);
    for (std::size_t k = 0; k < ids.size(); ++k) {
      for (std::size_t j = 0; j < columns; ++j) {
        rows.mutable_data<float>()[k * columns + j] = table_(offsets_.at(variable.name) + static_cast<std::size_t>(asked[k]), j);
      }
    }
    if (into.size() != rows.size_bytes()) co_return rows;
    tensor out(dtype::float32, std::move(shape), std::move(into));
    std::fill_n(out.mutable_data<float>(), out.size(), std::numeric_limits<float>::quiet_NaN());
    const std::span<const std::byte> sent(rows.bytes().data(), rows.size_bytes());
    std::byte* arrived = out.bytes().data();
    std::size_t told = 0;
    const auto arrive = [&](std::size_t upto) {
      std::memcpy(arrived + told, sent.data() + told, upto - told);
      told = upto;
      if (on_arrival) on_arrival({arrived, told});
    };
    for (std::size_t step = 1; told + step < sent.size(); step = row_bytes * 3 / 2 + 1) arrive(told + step);
    if (told < sent.size()) arrive(sent.size());
    co_return out;
  }

  // A lookup uses nothing else.
  asio::awaitable<tensor> read(variable_ref, byte_buffer) override { throw unused(); }
  asio::awaitable<void> update(variable_ref, update_op, tensor) override { throw unused(); }
  asio::awaitable<void> scatter(variable_ref, update_op, tensor, tensor) override { throw unused(); }
  asio::awaitable<void> apply_gradient(variable_ref, optimizer, tensor, std::optional<tensor>) override { throw unused(); }
  asio::awaitable<tensor> read_rows(variable_ref, std::uint64_t, std::uint64_t, byte_buffer) override { throw unused(); }
  asio::awaitable<void> update_rows(variable_ref, update_op, std::uint64_t, tensor) override { throw unused(); }
  asio::awaitable<std::vector<slot_info>> list_slots(variable_ref) override { throw unused(); }
  asio::awaitable<void> create_slot(variable_ref, variable_ref, double) override { throw unused(); }
  asio::awaitable<std::vector<tensor>> hash_lookup(int, std::vector<table_ids>, bool, std::vector<rows_target>) override {
    throw unused();
  }
  asio::awaitable<void> hash_apply_gradients(int, std::vector<table_ids>, optimizer) override { throw unused(); }
  asio::awaitable<std::uint64_t> advance_clock(int, hash_table_ref, std::uint64_t) override { throw unused(); }
  asio::awaitable<table_export> hash_export(int, hash_table_ref, std::uint32_t, std::uint64_t, table_save) override {
    throw unused();
  }
  asio::awaitable<void> hash_import(int, hash_table_ref, table_import) override { throw unused(); }

 private:
  static error unused() { return error(errc::internal, "a lookup called an operation it does not need"); }

  xt::xarray<float> table_;
  std::map<std::string, std::size_t> offsets_;
};

// `rows` rows of `columns` floats (row i: i, 10 i, 100 i...) in TF's div layout over `shards`
// shards, served by a recording_io.
struct recorded_table {
  recorded_table(std::size_t rows, std::size_t shards, std::size_t columns = 2)
      : value(xt::zeros<float>({rows, columns})) {
    for (std::size_t i = 0; i < rows; ++i) {
      float scale = 1;
      for (std::size_t j = 0; j < columns; ++j, scale *= 10) value(i, j) = static_cast<float>(i) * scale;
    }
    sharded_variable_ref ref{"t", dtype::float32, {rows, columns}, {}};
    const auto offsets = div_offsets(rows, shards);
    for (std::size_t s = 0; s < shards; ++s) {
      ref.shards.push_back({"t/part_" + std::to_string(s), dtype::float32, {offsets[s + 1] - offsets[s], columns}, 0});
    }
    io = std::make_shared<recording_io>(value, ref);
    handle = sharded_variable<float>(ref, io);
  }

  xt::xarray<float> value;
  std::shared_ptr<recording_io> io;
  sharded_variable<float> handle;
};

// Runs `lookup` on a fresh executor; rethrows its failure.
template <class Awaitable>
auto run(Awaitable lookup) {
  asio::io_context io;
  auto result = asio::co_spawn(io, std::move(lookup), asio::use_future);
  io.run();
  return result.get();
}

// The failure of `lookup`, run on a fresh executor (none: a null exception_ptr).
template <class Awaitable>
std::exception_ptr failure_of_run(Awaitable lookup) {
  try {
    run(std::move(lookup));
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}

}  // namespace

TEST_CASE_TEMPLATE("TF's testEmbeddingLookup: embedding_lookup, embedding_lookup_sparse, safe_embedding_lookup_sparse",
                   T, float, double) {
  local_cluster cluster(2, 1);
  cluster.run_chief(
      [](parameter_server_strategy& strategy, cluster_coordinator&) -> asio::awaitable<void> {
        // TF's ShardedVariable of [[1, 2], [3, 4]], [[5, 6], [7, 8]], [[9, 10]].
        const xt::xarray<T> value{{1, 2}, {3, 4}, {5, 6}, {7, 8}, {9, 10}};
        auto sv = co_await strategy.scope().create_sharded_variable("sv", value);
        REQUIRE(sv.offsets() == std::vector<std::size_t>{0, 2, 4, 5});

        const xt::xarray<std::int64_t> ids{0, 3, 4};
        const xt::xarray<T> looked_up{{1, 2}, {7, 8}, {9, 10}};
        CHECK((co_await sv.embedding_lookup(ids) == looked_up));

        // indices [[0, 0], [0, 1], [1, 0], [2, 2]], values [0, 3, 4, 1], dense_shape [3, 3]; no weights.
        const sparse_ids<std::int64_t> sp_ids{.rows = {0, 0, 1, 2}, .ids = {0, 3, 4, 1}, .dense_rows = 3};
        const xt::xarray<T> sparse_expected{{4, 5}, {9, 10}, {3, 4}};
        check_close(co_await sv.embedding_lookup_sparse(sp_ids), sparse_expected);

        // Same indices, values [0, -1, 4, 1], weights [1, 1, -1, 1].
        const sparse_ids<std::int64_t> safe_ids{
            .rows = {0, 0, 1, 2}, .ids = {0, -1, 4, 1}, .weights = {1.0f, 1.0f, -1.0f, 1.0f}, .dense_rows = 3};
        const xt::xarray<T> safe_expected{{1, 2}, {0, 0}, {3, 4}};
        check_close(co_await sv.safe_embedding_lookup_sparse(safe_ids), safe_expected);
        // With default_id 3, row 1 (left empty) is row 3 (docs/api.md's example).
        const xt::xarray<T> defaulted{{1, 2}, {7, 8}, {3, 4}};
        check_close(co_await sv.safe_embedding_lookup_sparse(safe_ids, combiner::mean, 3), defaulted);
      },
      {}, {}, fixed_shards_partitioner{3});
}

TEST_CASE_TEMPLATE("combiners weigh each id's row as TF's embedding_lookup_sparse does", T, float, double) {
  local_cluster cluster(2, 1);
  cluster.run_chief(
      [](parameter_server_strategy& strategy, cluster_coordinator&) -> asio::awaitable<void> {
        auto scope = strategy.scope();
        // TF's docstring (embedding_lookup_sparse_v2): params [[1, 2], [3, 4], [5, 6], [7, 8]];
        // indices [[0, 0], [0, 1], [1, 0], [2, 0]], values [0, 1, 3, 2].
        const xt::xarray<T> params{{1, 2}, {3, 4}, {5, 6}, {7, 8}};
        auto sharded = co_await scope.create_sharded_variable("params", params);
        auto dense = co_await scope.create_variable("dense_params", params);
        REQUIRE(sharded.num_shards() == 3);
        sparse_ids<std::int32_t, double> batch{.rows = {0, 0, 1, 2}, .ids = {0, 1, 3, 2}, .dense_rows = 3};
        const xt::xarray<T> sum{{4, 6}, {7, 8}, {5, 6}};
        check_close(co_await sharded.embedding_lookup_sparse(batch, combiner::sum), sum);
        const xt::xarray<T> unweighted_sqrtn = divide_rows(sum, {std::sqrt(T(2)), T(1), T(1)});
        check_close(co_await sharded.embedding_lookup_sparse(batch, combiner::sqrtn), unweighted_sqrtn);

        // The same with weights [0.1, 1.0, 0.5, 2.0]: TF's "sum" gives [[3.1, 4.2], [3.5, 4], [10, 12]].
        batch.weights = {0.1, 1.0, 0.5, 2.0};
        const xt::xarray<T> weighted_sum{{3.1, 4.2}, {3.5, 4}, {10, 12}};
        check_close(co_await sharded.embedding_lookup_sparse(batch, combiner::sum), weighted_sum);
        const xt::xarray<T> weighted_mean = divide_rows(weighted_sum, {T(1.1), T(0.5), T(2)});
        check_close(co_await sharded.embedding_lookup_sparse(batch, combiner::mean), weighted_mean);
        check_close(co_await sharded.embedding_lookup_sparse(batch), weighted_mean);  // mean is the default
        const xt::xarray<T> weighted_sqrtn = divide_rows(weighted_sum, {std::sqrt(T(1.01)), T(0.5), T(2)});
        check_close(co_await sharded.embedding_lookup_sparse(batch, combiner::sqrtn), weighted_sqrtn);
        // A dense variable is one shard: the same results.
        check_close(co_await dense.embedding_lookup_sparse(batch, combiner::sqrtn), weighted_sqrtn);

        // TF's docstring example with "mean": [0, 0]: id 1, weight 2; [0, 1]: id 3, weight 0.5;
        // [1, 0]: id 0, weight 1; [2, 3]: id 1, weight 3. Rows 3 and 5 have no ids here: zeros
        // (TF would give no row 5 at all: its segment sums stop at the last row named).
        const sparse_ids<std::int64_t> doc{
            .rows = {0, 0, 1, 2, 4}, .ids = {1, 3, 0, 1, 2}, .weights = {2.0f, 0.5f, 1.0f, 3.0f, 1.0f}, .dense_rows = 6};
        const std::vector<xt::xarray<T>> doc_rows{(row_of(params, 1) * T(2) + row_of(params, 3) * T(0.5)) / T(2.5),
                                                  row_of(params, 0),
                                                  row_of(params, 1),
                                                  xt::zeros<T>({2}),
                                                  row_of(params, 2),
                                                  xt::zeros<T>({2})};
        const auto doc_expected = stack_rows(doc_rows);  // named: not a temporary of a co_await expression
        check_close(co_await sharded.embedding_lookup_sparse(doc), doc_expected);

        // Weights that add up to 0: TF's div_no_nan gives 0, not NaN.
        const sparse_ids<std::int64_t> cancelling{.rows = {0, 0}, .ids = {1, 2}, .weights = {1.0f, -1.0f}, .dense_rows = 1};
        const xt::xarray<T> zero_row = xt::zeros<T>({1, 2});
        check_close(co_await sharded.embedding_lookup_sparse(cancelling), zero_row);

        // CSR input names the same entries.
        const std::vector<std::size_t> splits{0, 2, 3, 4};
        const auto from_splits = sparse_ids<std::int32_t, double>::from_row_splits(splits, {0, 1, 3, 2}, {0.1, 1.0, 0.5, 2.0});
        CHECK(from_splits.rows == batch.rows);
        CHECK(from_splits.dense_rows == 3);
        check_close(co_await sharded.embedding_lookup_sparse(from_splits, combiner::sum), weighted_sum);
      },
      {}, {}, fixed_shards_partitioner{3});
}

TEST_CASE_TEMPLATE("the safe lookup drops ids < 0 and weights <= 0 as TF does; empty rows take default_id or zeros", T,
                   float, double) {
  local_cluster cluster(2, 1);
  cluster.run_chief(
      [](parameter_server_strategy& strategy, cluster_coordinator&) -> asio::awaitable<void> {
        auto scope = strategy.scope();
        const auto e = vocabulary_of_four<T>();
        auto dense = co_await scope.create_variable("e", e);
        auto sharded = co_await scope.create_sharded_variable("e_sharded", e);
        REQUIRE(sharded.offsets() == std::vector<std::size_t>{0, 2, 3, 4});  // TF's partitioned case: 2, 1, 1
        const xt::xarray<T> zeros = xt::zeros<T>({4});
        const auto e0 = row_of(e, 0), e1 = row_of(e, 1), e2 = row_of(e, 2), e3 = row_of(e, 3);
        sparse_ids<std::int64_t> no_weights = tf_safe_ids;
        no_weights.weights.clear();

        // TF's test_safe_embedding_lookup_sparse_return_zero_vector.
        const auto zero_vector = stack_rows<T>({(e0 + T(2) * e1) / T(3), zeros, zeros, e2, zeros});
        check_close(co_await dense.safe_embedding_lookup_sparse(tf_safe_ids), zero_vector);
        check_close(co_await sharded.safe_embedding_lookup_sparse(tf_safe_ids), zero_vector);
        // ..._return_special_vector: default_id 3 fills rows 1, 2 and 4.
        const auto special_vector = stack_rows<T>({(e0 + T(2) * e1) / T(3), e3, e3, e2, e3});
        check_close(co_await dense.safe_embedding_lookup_sparse(tf_safe_ids, combiner::mean, 3), special_vector);
        check_close(co_await sharded.safe_embedding_lookup_sparse(tf_safe_ids, combiner::mean, 3), special_vector);
        // ..._no_weights and ..._partitioned (3 shards): without weights nothing but ids < 0 is dropped.
        const auto unweighted = stack_rows<T>({(e0 + e1) / T(2), zeros, zeros, e2, (e0 + e1) / T(2)});
        check_close(co_await dense.safe_embedding_lookup_sparse(no_weights), unweighted);
        check_close(co_await sharded.safe_embedding_lookup_sparse(no_weights), unweighted);

        // TF prunes weights only for mean and sqrtn: with sum, row 4's weights 0 and -0.5 count.
        const auto summed = stack_rows<T>({e0 + T(2) * e1, zeros, zeros, T(3) * e2, T(-0.5) * e1});
        check_close(co_await sharded.safe_embedding_lookup_sparse(tf_safe_ids, combiner::sum), summed);
        const auto summed_default = stack_rows<T>({e0 + T(2) * e1, e3, e3, T(3) * e2, T(-0.5) * e1});
        check_close(co_await sharded.safe_embedding_lookup_sparse(tf_safe_ids, combiner::sum, 3), summed_default);
        const auto sqrtn = stack_rows<T>({(e0 + T(2) * e1) / std::sqrt(T(5)), zeros, zeros, e2, zeros});
        check_close(co_await sharded.safe_embedding_lookup_sparse(tf_safe_ids, combiner::sqrtn), sqrtn);
        // default_id 0 is a row like any other (TF tells it from None).
        const auto default_zero = stack_rows<T>({(e0 + T(2) * e1) / T(3), e0, e0, e2, e0});
        check_close(co_await sharded.safe_embedding_lookup_sparse(tf_safe_ids, combiner::mean, 0), default_zero);

        // The unsafe lookup takes the same weights as they are, and refuses the id -1.
        auto failure = co_await failure_of(sharded.embedding_lookup_sparse(tf_safe_ids));
        CHECK(code_of(failure) == errc::invalid_argument);
        CHECK(message_of(failure) == "embedding_lookup_sparse of 'e_sharded': id -1 (position 2) is out of range [0, 4)");
      },
      {}, {}, fixed_shards_partitioner{3});
}

TEST_CASE("a worker function pools a sparse batch through the worker's connections") {
  local_cluster cluster(2, 1, bind_sparse_functions);
  cluster.run_chief(
      [](parameter_server_strategy& strategy, cluster_coordinator& coordinator) -> asio::awaitable<void> {
        const xt::xarray<float> value{{1, 2}, {3, 4}, {5, 6}, {7, 8}, {9, 10}};
        auto table = co_await strategy.scope().create_sharded_variable("pooled", value);
        // The batch is the function's argument (sparse_ids' codec); row 2 names no id.
        const sparse_ids<std::int64_t> batch{.rows = {0, 0, 1}, .ids = {4, 0, 2}, .weights = {1, 2, 0.5}, .dense_rows = 3};
        auto pooled = coordinator.schedule(pool_on_worker, table, batch);
        const auto got = co_await pooled.get();
        const std::vector<double> expected{11, 14, 2.5, 3, 0, 0};  // [9, 10] + 2 [1, 2]; 0.5 [5, 6]; zeros
        CHECK(got == expected);
      },
      {}, {}, fixed_shards_partitioner{3});
}

TEST_CASE("max_norm scales a row longer than it down to it before rows are combined") {
  local_cluster cluster(1, 1);
  cluster.run_chief(
      [](parameter_server_strategy& strategy, cluster_coordinator&) -> asio::awaitable<void> {
        const xt::xarray<float> value{{3, 4}, {0.3f, 0.4f}, {0, 0}};
        auto t = co_await strategy.scope().create_sharded_variable("t", value);
        const sparse_ids<std::int64_t> batch{.rows = {0, 0, 1, 2}, .ids = {0, 1, 0, 2}, .dense_rows = 3};
        // Row 0 (norm 5) becomes [0.6, 0.8]; row 1 (norm 0.5) and the zero row stay.
        const xt::xarray<float> clipped{{0.9f, 1.2f}, {0.6f, 0.8f}, {0, 0}};
        check_close(co_await t.embedding_lookup_sparse(batch, combiner::sum, 1.0), clipped);
        check_close(co_await t.safe_embedding_lookup_sparse(batch, combiner::sum, std::nullopt, 1.0), clipped);
        const xt::xarray<float> unclipped{{3.3f, 4.4f}, {3, 4}, {0, 0}};
        check_close(co_await t.embedding_lookup_sparse(batch, combiner::sum), unclipped);
      },
      {}, {}, fixed_shards_partitioner{2});
}

TEST_CASE("each distinct id's row is asked for once, from the shard that holds it only") {
  // 10 rows in 3 shards: rows 0-3, 4-6, 7-9.
  recorded_table t(10, 3);
  const sparse_ids<std::int64_t> batch{.rows = {0, 0, 1, 1, 2, 3, 3}, .ids = {7, 2, 7, 9, 2, 7, 7}, .dense_rows = 4};
  const auto result = run(t.handle.embedding_lookup_sparse(batch, combiner::sum));
  using asked = std::vector<std::vector<std::int64_t>>;
  CHECK(t.io->gathers.size() == 2);                           // "t/part_1" holds none of the ids
  CHECK(t.io->gathers["t/part_0"] == asked{{2}});             // id 2
  CHECK(t.io->gathers["t/part_2"] == asked{{0, 2}});          // ids 7 and 9, in first-seen order
  const xt::xarray<float> expected{{9, 90}, {16, 160}, {2, 20}, {14, 140}};
  check_close(result, expected);
}

TEST_CASE("a lookup places each reply's rows as they arrive, repeats and rows cut anywhere included") {
  // 12 rows of 3 floats in 2 shards; ids repeat within and across shards, so no part is received
  // straight into the result: every row goes through the placement as its bytes arrive.
  recorded_table t(12, 2, 3);
  const std::vector<std::int64_t> ids{7, 1, 7, 11, 0, 1, 5, 6, 6, 2, 11};
  const xt::xarray<std::int64_t> id_array = xt::adapt(ids, {ids.size()});
  const auto rows = run(t.handle.embedding_lookup(id_array));
  REQUIRE(rows.shape() == std::vector<std::size_t>{ids.size(), 3});
  for (std::size_t k = 0; k < ids.size(); ++k) {
    for (std::size_t j = 0; j < 3; ++j) {
      CHECK_MESSAGE(rows(k, j) == t.value(static_cast<std::size_t>(ids[k]), j), "id " << ids[k] << " column " << j);
    }
  }
  // Rows of no elements: nothing to place, and nothing divides by the row size.
  recorded_table empty(6, 2, 0);
  const xt::xarray<std::int64_t> repeated{4, 0, 4, 5, 1, 0};
  const auto none = run(empty.handle.embedding_lookup(repeated));
  CHECK(none.shape() == std::vector<std::size_t>{6, 0});
}

TEST_CASE("bad sparse input is refused before anything is sent, naming what is wrong") {
  recorded_table t(10, 3);
  const auto& table = t.handle;
  const auto message = [&](auto lookup) {
    const auto e = failure_of_run(std::move(lookup));
    REQUIRE(e);
    CHECK(code_of(e) == errc::invalid_argument);
    return message_of(e);
  };
  using ids64 = sparse_ids<std::int64_t>;

  const ids64 short_rows{.rows = {0, 0}, .ids = {1, 2, 3}, .dense_rows = 1};
  CHECK(message(table.embedding_lookup_sparse(short_rows)) == "embedding_lookup_sparse of 't': 3 ids but 2 row indices (one per id)");
  const ids64 short_weights{.rows = {0, 0, 0}, .ids = {1, 2, 3}, .weights = {1.0f, 2.0f}, .dense_rows = 1};
  CHECK(message(table.safe_embedding_lookup_sparse(short_weights)) ==
        "safe_embedding_lookup_sparse of 't': 3 ids but 2 weights (one per id, or none for weights of 1)");
  const ids64 row_too_big{.rows = {0, 1, 3}, .ids = {1, 2, 3}, .dense_rows = 3};
  CHECK(message(table.embedding_lookup_sparse(row_too_big)) ==
        "embedding_lookup_sparse of 't': row index 3 (position 2) is out of range [0, 3) (dense_rows)");
  const ids64 negative_row{.rows = {-1}, .ids = {1}, .dense_rows = 3};
  CHECK(message(table.safe_embedding_lookup_sparse(negative_row)) ==
        "safe_embedding_lookup_sparse of 't': row index -1 (position 0) is out of range [0, 3) (dense_rows)");
  const ids64 unsorted{.rows = {0, 1, 0}, .ids = {1, 2, 3}, .dense_rows = 2};
  CHECK(message(table.embedding_lookup_sparse(unsorted)) ==
        "embedding_lookup_sparse of 't': row indices must be non-decreasing (TF's canonical order): row index 0 "
        "(position 2) follows 1");
  const ids64 id_too_big{.rows = {0, 0}, .ids = {9, 10}, .dense_rows = 1};
  CHECK(message(table.embedding_lookup_sparse(id_too_big)) ==
        "embedding_lookup_sparse of 't': id 10 (position 1) is out of range [0, 10)");
  // The safe lookup drops ids < 0, not ids past the end.
  CHECK(message(table.safe_embedding_lookup_sparse(id_too_big)) ==
        "safe_embedding_lookup_sparse of 't': id 10 (position 1) is out of range [0, 10)");
  const ids64 fine{.rows = {0}, .ids = {1}, .dense_rows = 2};
  CHECK(message(table.safe_embedding_lookup_sparse(fine, combiner::mean, 10)) ==
        "safe_embedding_lookup_sparse of 't': default_id 10 is out of range [0, 10)");
  CHECK(message(table.embedding_lookup_sparse(fine, combiner::sum, 0.0)) ==
        "embedding_lookup_sparse of 't': max_norm must be positive, got 0");
  CHECK(message(table.embedding_lookup_sparse(fine, combiner::sum, std::nan(""))) ==
        "embedding_lookup_sparse of 't': max_norm must be positive, got nan");
  CHECK(message(table.embedding_lookup_sparse(fine, static_cast<combiner>(7))) ==
        "embedding_lookup_sparse of 't': unknown combiner 7 (sum, mean or sqrtn)");
  // dense_rows * 8 bytes per row would overflow the size of the result.
  const ids64 huge{.rows = {0}, .ids = {1}, .dense_rows = std::numeric_limits<std::size_t>::max() / 4};
  CHECK(message(table.embedding_lookup_sparse(huge)) ==
        "embedding_lookup_sparse of 't': a result of 4611686018427387903 rows of 8 bytes is more than memory can "
        "address");
  // An unsigned id past int64 fails where the lookup is awaited, as every other check.
  const sparse_ids<std::uint64_t> unrepresentable{.rows = {0}, .ids = {std::uint64_t{1} << 63}, .dense_rows = 1};
  auto awaitable = table.embedding_lookup_sparse(unrepresentable);
  CHECK(message(std::move(awaitable)) == "id 9223372036854775808 does not fit in int64");
  CHECK(t.io->gathers.empty());

  // A scalar variable has no rows to look up.
  const sharded_variable<float> scalar(sharded_variable_ref{"s", dtype::float32, {}, {{"s", dtype::float32, {}, 0}}}, t.io);
  CHECK(message(scalar.embedding_lookup_sparse(fine)) == "embedding_lookup_sparse of 's': a scalar variable has no rows");
}

TEST_CASE("combiner names and row splits are checked as TF checks them") {
  CHECK(parse_combiner("sum") == combiner::sum);
  CHECK(parse_combiner("mean") == combiner::mean);
  CHECK(parse_combiner("sqrtn") == combiner::sqrtn);
  CHECK(name_of(combiner::sqrtn) == "sqrtn");
  CHECK_THROWS_WITH_AS(parse_combiner("max"), "combiner must be one of 'mean', 'sqrtn' or 'sum', got 'max'", error);

  using ids32 = sparse_ids<std::int32_t>;
  const std::vector<std::size_t> none;
  CHECK_THROWS_WITH_AS(ids32::from_row_splits(none, {}), "row_splits must have at least one entry (0), one more than there are rows",
                       error);
  const std::vector<std::size_t> late_start{1, 2};
  CHECK_THROWS_WITH_AS(ids32::from_row_splits(late_start, {1, 2}), "row_splits must start at 0, not 1", error);
  const std::vector<std::size_t> decreasing{0, 2, 1};
  CHECK_THROWS_WITH_AS(ids32::from_row_splits(decreasing, {1}), "row_splits must be non-decreasing: split 2 is 1, below 2",
                       error);
  const std::vector<std::size_t> short_end{0, 1};
  CHECK_THROWS_WITH_AS(ids32::from_row_splits(short_end, {1, 2}), "row_splits must end at the number of ids 2, not 1", error);
  // Empty rows are rows: [0, 0, 2, 2] is three rows, the first and last empty.
  const std::vector<std::size_t> with_empty_rows{0, 0, 2, 2};
  const auto batch = ids32::from_row_splits(with_empty_rows, {4, 5});
  CHECK(batch.rows == std::vector<std::int64_t>{1, 1});
  CHECK(batch.dense_rows == 3);
}

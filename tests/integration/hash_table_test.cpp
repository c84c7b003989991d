// Dynamic embedding tables on an in-process cluster of real servers: rows made on first sight for
// any int64 id, the same rows from every ps count and from a sharded variable of the same name,
// optimizer steps from the chief and from workers, the clock and idle rows, and refusals that
// change nothing.
#include "local_cluster.hpp"
#include "test_support.hpp"

#include <pscoro/checkpoint.hpp>
#include <pscoro/coordinator.hpp>
#include <pscoro/hash_table.hpp>
#include <pscoro/metrics.hpp>
#include <pscoro/strategy.hpp>

#include <xtensor/xbuilder.hpp>
#include <xtensor/xadapt.hpp>
#include <xtensor/xmanipulation.hpp>
#include <xtensor/xview.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <vector>

using namespace pscoro;
using pscoro::testing::code_of;
using pscoro::testing::failure_of;
using pscoro::testing::local_cluster;
using pscoro::testing::message_of;

namespace {

constexpr std::int64_t min_id = std::numeric_limits<std::int64_t>::min();
constexpr std::int64_t max_id = std::numeric_limits<std::int64_t>::max();

hash_table_options normal_rows(std::size_t dim) {
  hash_table_options options;
  options.dim = dim;
  options.initializer = initializers::random_normal{.stddev = 0.1, .seed = 42};
  options.buckets = 64;
  return options;
}

constexpr hash_lookup_options inserting{.insert = true};

xt::xarray<std::int64_t> id_array(std::vector<std::int64_t> ids) { return xt::adapt(ids, {ids.size()}); }

// A step on a worker: looks up its ids (inserting), then steps them with gradients of 1.
const worker_function<double(hash_table<float>, xt::xarray<std::int64_t>)> train_on_worker{"test.table_step"};

void bind_table_functions(server& s) {
  s.bind(train_on_worker, [](hash_table<float> table, xt::xarray<std::int64_t> ids) -> asio::awaitable<double> {
    const auto rows = co_await table.lookup(ids, inserting);
    const xt::xarray<float> ones = xt::ones<float>(std::vector<std::size_t>{ids.size(), table.dim()});
    co_await table.apply_gradients(optimizers::sgd{.learning_rate = 0.5}, ids, ones);
    co_return static_cast<double>(xt::sum(rows)());
  });
}

bool bitwise_equal(const xt::xarray<float>& a, const xt::xarray<float>& b) {
  return a.shape() == b.shape() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct table_scratch {
  std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("pscoro-table-checkpoint-" + std::to_string(::getpid()));
  table_scratch() {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
  }
  ~table_scratch() { std::filesystem::remove_all(dir); }
};

bool row_is_zero(const xt::xarray<float>& rows, std::size_t k) {
  const auto row = xt::view(rows, k, xt::all());
  return std::all_of(row.begin(), row.end(), [](float x) { return x == 0.0f; });
}

// What the checkpoint tests save: a table with slots, a clock, idle rows and admission counters.
hash_table_options saved_table_options() {
  auto options = normal_rows(8);
  options.admission = admission::min_count{.count = 2, .counters = 1000};
  options.eviction = eviction::ttl{.max_idle = 5};
  return options;
}

}  // namespace

TEST_CASE("a table gives any int64 id a row on first sight, the same from every ps count and as a variable's row") {
  const std::vector<std::int64_t> raw{0, -1, 1, min_id, max_id, 123456789012345, -987654321, 7, 7};
  const xt::xarray<std::int64_t> ids = xt::adapt(raw, {raw.size()});
  xt::xarray<float> on_two;
  const xt::xarray<float> zeros = xt::zeros<float>(std::vector<std::size_t>{raw.size(), 4});
  const xt::xarray<std::int64_t> grid = xt::reshape_view(id_array({0, 1, max_id, -1}), {2, 2});
  const xt::xarray<std::int64_t> low = id_array({0, 1, 7});
  const std::vector<int> both_ps{0, 1};
  const std::vector<std::size_t> looked_up_shape{raw.size(), 4};
  const std::vector<std::size_t> grid_shape{2, 2, 4};
  const shape_type ten_rows{10, 4};
  local_cluster two(2, 1);
  two.run_chief([&](parameter_server_strategy& strategy, cluster_coordinator&) -> asio::awaitable<void> {
    auto table = co_await strategy.scope().create_hash_table<float>("emb", normal_rows(4));
    CHECK(table.ref().ps_tasks == both_ps);
    const auto absent = co_await table.lookup(ids);  // no insert: the default row, nothing stored
    CHECK(bitwise_equal(absent, zeros));
    on_two = co_await table.lookup(ids, inserting);
    CHECK(on_two.shape() == looked_up_shape);
    CHECK(bitwise_equal(xt::view(on_two, 7), xt::view(on_two, 8)));  // a repeated id: one row
    CHECK(bitwise_equal(co_await table.lookup(ids), on_two));         // held now
    const auto shaped = co_await table.lookup(grid);
    CHECK(shaped.shape() == grid_shape);
    CHECK(bitwise_equal(xt::view(shaped, 1, 0), xt::view(on_two, 4)));
  });

  local_cluster three(3, 1);
  three.run_chief([&](parameter_server_strategy& strategy, cluster_coordinator&) -> asio::awaitable<void> {
    auto table = co_await strategy.scope().create_hash_table<float>("emb", normal_rows(4));
    CHECK(bitwise_equal(co_await table.lookup(ids, inserting), on_two));
  });
  // Row `id` of a table is row `id` of a sharded variable of the same name and initializer.
  local_cluster one(1, 1);
  one.run_chief([&](parameter_server_strategy& strategy, cluster_coordinator&) -> asio::awaitable<void> {
    auto variable = co_await strategy.scope().create_sharded_variable<float>("emb", ten_rows,
                                                                             normal_rows(4).initializer);
    const auto rows = co_await variable.embedding_lookup(low);
    CHECK(bitwise_equal(xt::view(rows, 0), xt::view(on_two, 0)));
    CHECK(bitwise_equal(xt::view(rows, 1), xt::view(on_two, 2)));
    CHECK(bitwise_equal(xt::view(rows, 2), xt::view(on_two, 7)));
  });
}

TEST_CASE("every optimizer's steps on a table end bitwise equal to the same steps on a sharded variable") {
  // Ids drawn from [0, 1e6), repeats included, over a variable of 1e6 rows.
  constexpr std::size_t rows = 1'000'000, width = 2;
  std::mt19937_64 random(7);
  std::uniform_int_distribution<std::int64_t> row_of(0, rows - 1);
  std::vector<std::int64_t> raw;
  for (int k = 0; k < 3000; ++k) raw.push_back(row_of(random));
  raw.push_back(raw[0]);
  raw.push_back(0);
  raw.push_back(rows - 1);
  const xt::xarray<std::int64_t> ids = xt::adapt(raw, {raw.size()});
  std::normal_distribution<float> normal;
  std::vector<xt::xarray<float>> gradients;
  for (int step = 0; step < 3; ++step) {
    xt::xarray<float> g = xt::xarray<float>::from_shape({ids.size(), width});
    for (auto& x : g) x = normal(random);
    gradients.push_back(g);
  }
  const std::vector<std::pair<std::string, optimizer>> optimizers{
      {"emb_sgd", optimizers::sgd{.learning_rate = 0.1}},
      {"emb_momentum", optimizers::momentum{.learning_rate = 0.1, .momentum = 0.9, .nesterov = true}},
      {"emb_adagrad", optimizers::adagrad{.learning_rate = 0.1}},
      {"emb_adam", optimizers::adam{.learning_rate = 0.01}},
      {"emb_ftrl", optimizers::ftrl{.learning_rate = 0.1, .l1 = 0.01, .l2 = 0.01}}};
  const shape_type variable_shape{rows, width};
  std::vector<xt::xarray<float>> from_tables;
  local_cluster tables(2, 1);
  tables.run_chief([&](parameter_server_strategy& strategy, cluster_coordinator&) -> asio::awaitable<void> {
    for (const auto& [name, opt] : optimizers) {
      auto table = co_await strategy.scope().create_hash_table<float>(name, normal_rows(width));
      co_await table.lookup(ids, inserting);
      for (const auto& g : gradients) co_await table.apply_gradients(opt, ids, g);
      from_tables.push_back(co_await table.lookup(ids));
    }
    const auto& adagrad_table = optimizers[2];
    auto table = co_await strategy.scope().create_hash_table<float>("emb_other", normal_rows(width));
    co_await table.lookup(ids, inserting);
    co_await table.apply_gradients(adagrad_table.second, ids, gradients[0]);
    const auto failure = co_await failure_of(table.apply_gradients(optimizers::sgd{}, ids, gradients[0]));
    CHECK(code_of(failure) == errc::failed_precondition);
    CHECK(contains(message_of(failure), "hold the slots of adagrad"));
  });
  local_cluster variables(2, 1);
  variables.run_chief([&](parameter_server_strategy& strategy, cluster_coordinator&) -> asio::awaitable<void> {
    for (std::size_t k = 0; k < optimizers.size(); ++k) {
      CAPTURE(optimizers[k].first);
      auto variable = co_await strategy.scope().create_sharded_variable<float>(optimizers[k].first, variable_shape,
                                                                               normal_rows(width).initializer);
      for (const auto& g : gradients) co_await variable.apply_sparse_gradient(optimizers[k].second, ids, g);
      CHECK(bitwise_equal(co_await variable.embedding_lookup(ids), from_tables[k]));
    }
  });
}

TEST_CASE("a lookup over many tables sends one request per ps, and gives each table's rows as its own lookup") {
  std::vector<xt::xarray<std::int64_t>> ids;
  for (std::int64_t t = 0; t < 26; ++t) ids.push_back(id_array({t, t * 1000 + 7, -t, t}));
  local_cluster cluster(2, 1);
  cluster.run_chief([&](parameter_server_strategy& strategy, cluster_coordinator&) -> asio::awaitable<void> {
    std::vector<hash_table<float>> tables;
    for (int t = 0; t < 26; ++t) {
      tables.push_back(co_await strategy.scope().create_hash_table<float>("field" + std::to_string(t), normal_rows(4)));
    }
    const auto& r = metrics::process_registry();
    const metrics::labels lookups{{"operation", "hash_lookup"}};
    const auto before = r.histogram_value("pscoro_ps_operation_seconds", lookups);
    const auto all = co_await lookup_tables(tables, ids, inserting);
    const auto after = r.histogram_value("pscoro_ps_operation_seconds", lookups);
    REQUIRE(after.has_value());
    CHECK(after->count - (before ? before->count : 0) == 2);  // one request to each of the 2 ps
    REQUIRE(all.size() == 26);
    for (std::size_t t = 0; t < 26; ++t) {
      const auto alone = co_await tables[t].lookup(ids[t]);
      CHECK(bitwise_equal(all[t], alone));
    }
    // One step over every table: one request per ps again, and each table's rows stepped.
    std::vector<xt::xarray<float>> gradients;
    for (std::size_t t = 0; t < 26; ++t) gradients.push_back(xt::ones<float>(std::vector<std::size_t>{4, 4}));
    const metrics::labels steps{{"operation", "hash_apply_gradients"}};
    const auto steps_before = r.histogram_value("pscoro_ps_operation_seconds", steps);
    co_await apply_gradients_to_tables(optimizers::sgd{.learning_rate = 0.5}, tables, ids, gradients);
    const auto steps_after = r.histogram_value("pscoro_ps_operation_seconds", steps);
    REQUIRE(steps_after.has_value());
    CHECK(steps_after->count - (steps_before ? steps_before->count : 0) == 2);
    const auto stepped = co_await lookup_tables(tables, ids);
    // Ids 0 and -0 of table 0 are one id, asked 3 times: its gradients summed (3) times 0.5.
    CHECK(stepped[0](0, 0) == doctest::Approx(all[0](0, 0) - 1.5f));
    CHECK(stepped[5](1, 0) == doctest::Approx(all[5](1, 0) - 0.5f));
    const std::vector<xt::xarray<std::int64_t>> too_few(3);
    const auto failure = co_await failure_of(lookup_tables(tables, too_few));
    CHECK(code_of(failure) == errc::invalid_argument);
    CHECK(contains(message_of(failure), "26 tables but 3 lists of ids"));
  });
}

TEST_CASE("workers look up and step a table through their own connections") {
  std::vector<xt::xarray<std::int64_t>> batches;
  for (std::int64_t k = 0; k < 8; ++k) batches.push_back(id_array({k, k + 100}));
  const xt::xarray<std::int64_t> asked = id_array({0, 107});
  xt::xarray<float> stepped = xt::xarray<float>::from_shape({2, 2});
  stepped.fill(0.5f);
  local_cluster cluster(2, 2, bind_table_functions);
  cluster.run_chief([&](parameter_server_strategy& strategy, cluster_coordinator& coordinator) -> asio::awaitable<void> {
    hash_table_options options = normal_rows(2);
    options.initializer = initializers::constant{.value = 1.0};
    auto table = co_await strategy.scope().create_hash_table<float>("clicks", options);
    std::vector<remote_value<double>> sums;
    for (const auto& batch : batches) sums.push_back(coordinator.schedule(train_on_worker, table, batch));
    co_await coordinator.join();
    for (auto& s : sums) {
      const double sum = co_await s.get();
      CHECK(sum == doctest::Approx(4.0));  // two new rows of 1s
    }
    // Each row stepped once by sgd with gradient 1 and rate 0.5.
    const auto rows = co_await table.lookup(asked);
    CHECK(bitwise_equal(rows, stepped));
  });
}

TEST_CASE("4 workers racing to insert the same new ids insert each once, with one initial value") {
  std::vector<std::int64_t> raw;
  for (std::uint64_t k = 0; k < 1000; ++k) raw.push_back(static_cast<std::int64_t>(k * 0x9e3779b97f4a7c1ULL - 500));
  const xt::xarray<std::int64_t> ids = xt::adapt(raw, {raw.size()});
  xt::xarray<float> stepped_four_times = xt::xarray<float>::from_shape({raw.size(), 2});
  stepped_four_times.fill(1.0f - 0.5f - 0.5f - 0.5f - 0.5f);
  local_cluster cluster(2, 4, bind_table_functions);
  cluster.run_chief([&](parameter_server_strategy& strategy, cluster_coordinator& coordinator) -> asio::awaitable<void> {
    hash_table_options options = normal_rows(2);
    options.initializer = initializers::constant{.value = 1.0};
    auto table = co_await strategy.scope().create_hash_table<float>("race", options);
    std::vector<remote_value<double>> sums;
    for (int worker = 0; worker < 4; ++worker) sums.push_back(coordinator.schedule(train_on_worker, table, ids));
    co_await coordinator.join();
    // Every id was made once (one admission each, over both ps), and each of the 4 steps found it.
    const auto& r = metrics::process_registry();
    const metrics::labels race{{"table", "race"}};
    CHECK(r.value("pscoro_ps_hash_table_admitted_total", race) == 1000.0);
    CHECK(r.value("pscoro_ps_hash_table_rows", race) == 1000.0);
    CHECK(bitwise_equal(co_await table.lookup(ids), stepped_four_times));
  });
}

TEST_CASE("rows idle past max_idle drop when the clock moves; a full table refuses, naming it, and keeps its rows") {
  const auto one_two_three = id_array({1, 2, 3});
  const auto three = id_array({3});
  const auto one = id_array({1});
  const xt::xarray<float> zero_row = xt::zeros<float>(std::vector<std::size_t>{1, 2});
  local_cluster cluster(2, 1);
  cluster.run_chief([&](parameter_server_strategy& strategy, cluster_coordinator&) -> asio::awaitable<void> {
    hash_table_options options = normal_rows(2);
    options.eviction = eviction::ttl{.max_idle = 5};
    auto table = co_await strategy.scope().create_hash_table<float>("recent", options);
    const auto first = co_await table.lookup(one_two_three, inserting);
    CHECK(co_await table.advance_clock(4) == 0);
    co_await table.lookup(three);  // named at 4
    CHECK(co_await table.advance_clock(6) == 2);         // 1 and 2 were named at 0
    const auto failure = co_await failure_of(table.advance_clock(5));
    CHECK(code_of(failure) == errc::invalid_argument);
    CHECK(contains(message_of(failure), "the clock cannot go back from 6 to 5"));
    // 1 dropped: a lookup without insert reads the default row; one with insert makes it afresh.
    CHECK(bitwise_equal(co_await table.lookup(one), zero_row));
    const xt::xarray<float> first_row = xt::view(first, xt::range(0, 1));
    CHECK(bitwise_equal(co_await table.lookup(one, inserting), first_row));

  });
}

TEST_CASE("a full table refuses a lookup that would insert, naming it, and the ps keeps what it held") {
  const auto one_two = id_array({1, 2});
  const auto three_one_four = id_array({3, 1, 4});
  const auto three_four = id_array({3, 4});
  const xt::xarray<float> zero_rows = xt::zeros<float>(std::vector<std::size_t>{2, 2});
  local_cluster cluster(1, 1);
  cluster.run_chief([&](parameter_server_strategy& strategy, cluster_coordinator&) -> asio::awaitable<void> {
    hash_table_options small = normal_rows(2);
    small.max_rows_per_ps = 2;
    auto table = co_await strategy.scope().create_hash_table<float>("small", small);
    const auto held = co_await table.lookup(one_two, inserting);
    const auto failure = co_await failure_of(table.lookup(three_one_four, inserting));
    CHECK(code_of(failure) == errc::resource_exhausted);
    CHECK(contains(message_of(failure), "hash table 'small' on ps:0 is full: it holds 2 rows of its max_rows_per_ps 2, "
                                   "and this lookup would add 2"));
    CHECK(bitwise_equal(co_await table.lookup(three_four), zero_rows));
    CHECK(bitwise_equal(co_await table.lookup(one_two), held));
    // What the ps holds of the table and did with it, in the process registry.
    const auto& r = metrics::process_registry();
    const metrics::labels small_table{{"table", "small"}};
    CHECK(r.value("pscoro_ps_hash_table_rows", small_table) == 2.0);
    CHECK(r.value("pscoro_ps_hash_table_bytes", small_table) > 2.0 * 2 * sizeof(float));
    CHECK(r.value("pscoro_ps_hash_table_admitted_total", small_table) == 2.0);
    CHECK(r.value("pscoro_ps_hash_table_refused_total", small_table) == 1.0);
    CHECK(r.value("pscoro_ps_hash_table_not_admitted_total", small_table) == 2.0);  // 3 and 4, read without insert
  });
}

TEST_CASE("bad table operations are refused with what was wrong, and change nothing") {
  const auto one_two = id_array({1, 2});
  const xt::xarray<float> w_value = xt::ones<float>(std::vector<std::size_t>{2});
  const xt::xarray<float> wrong_width = xt::ones<float>(std::vector<std::size_t>{2, 3});
  const xt::xarray<float> short_gradients = xt::ones<float>(std::vector<std::size_t>{1, 4});
  const xt::xarray<float> gradients = xt::ones<float>(std::vector<std::size_t>{2, 4});
  const xt::xarray<std::int64_t> matrix = xt::reshape_view(id_array({1, 2}), {1, 2});
  xt::xarray<std::uint64_t> too_big = xt::xarray<std::uint64_t>::from_shape({1});
  too_big.fill(std::uint64_t{1} << 63);
  local_cluster cluster(2, 1);
  cluster.run_chief([&](parameter_server_strategy& strategy, cluster_coordinator&) -> asio::awaitable<void> {
    auto table = co_await strategy.scope().create_hash_table<float>("emb", normal_rows(4));
    co_await table.lookup(one_two, inserting);

    auto failure = co_await failure_of(strategy.scope().create_hash_table<float>("emb", normal_rows(4)));
    CHECK(code_of(failure) == errc::already_exists);
    auto variable = co_await strategy.scope().create_variable("w", w_value);
    (void)variable;
    failure = co_await failure_of(strategy.scope().create_hash_table<float>("w", normal_rows(4)));
    CHECK(code_of(failure) == errc::already_exists);
    CHECK(contains(message_of(failure), "'w' is a variable"));
    hash_table_options glorot = normal_rows(4);
    glorot.initializer = initializers::glorot_uniform{};
    failure = co_await failure_of(strategy.scope().create_hash_table<float>("g", glorot));
    CHECK(code_of(failure) == errc::invalid_argument);
    CHECK(contains(message_of(failure), "glorot_uniform"));
    hash_table_options few = normal_rows(4);
    few.buckets = 1;
    failure = co_await failure_of(strategy.scope().create_hash_table<float>("few", few));
    CHECK(code_of(failure) == errc::invalid_argument);
    CHECK(contains(message_of(failure), "1 buckets cannot spread over 2 ps"));

    const auto before = co_await table.lookup(one_two);
    failure = co_await failure_of(table.apply_gradients(optimizers::sgd{}, one_two, wrong_width));
    CHECK(code_of(failure) == errc::invalid_argument);
    CHECK(message_of(failure) == "apply_gradients of 'emb': 2 ids need gradients float32 [2, 4], got float32 [2, 3]");
    failure = co_await failure_of(table.apply_gradients(optimizers::sgd{}, one_two, short_gradients));
    CHECK(code_of(failure) == errc::invalid_argument);
    failure = co_await failure_of(table.apply_gradients(optimizers::sgd{}, matrix, gradients));
    CHECK(code_of(failure) == errc::invalid_argument);
    CHECK(contains(message_of(failure), "ids must be 1-D"));
    failure = co_await failure_of(table.lookup(too_big));
    CHECK(code_of(failure) == errc::invalid_argument);
    CHECK(contains(message_of(failure), "does not fit in int64"));
    CHECK(bitwise_equal(co_await table.lookup(one_two), before));
  });
}

TEST_CASE("a checkpoint saves a table from 2 ps and restores it onto 1 (tracked) and 3 (created after the restore)") {
  table_scratch scratch;
  const auto path = scratch.dir / "tables.safetensors";
  std::vector<std::int64_t> raw;
  for (std::int64_t id = -300; id < 300; ++id) raw.push_back(id * 1000003);
  raw.push_back(min_id);
  raw.push_back(max_id);
  const xt::xarray<std::int64_t> ids = xt::adapt(raw, {raw.size()});
  const xt::xarray<std::int64_t> seen_once{11, 12, 13};  // one sighting: counted, not admitted
  const xt::xarray<std::int64_t> idle{21, 22};           // named at clock 0 only
  xt::xarray<float> gradient = xt::xarray<float>::from_shape({raw.size(), 8});
  for (std::size_t k = 0; k < gradient.size(); ++k) gradient.data()[k] = 0.001f * static_cast<float>(k % 97) - 0.04f;
  const optimizer opt = optimizers::adam{.learning_rate = 0.05};
  xt::xarray<float> saved_rows, stepped_rows;
  local_cluster two(2, 1);
  two.run_chief([&](parameter_server_strategy& strategy, cluster_coordinator&) -> asio::awaitable<void> {
    auto table = co_await strategy.scope().create_hash_table<float>("emb", saved_table_options());
    for (int sighting = 0; sighting < 2; ++sighting) {
      co_await table.lookup(ids, inserting);
      co_await table.lookup(idle, inserting);
    }
    co_await table.lookup(seen_once, inserting);
    co_await table.advance_clock(4);
    co_await table.apply_gradients(opt, ids, gradient);
    co_await table.apply_gradients(opt, ids, gradient);
    saved_rows = co_await table.lookup(ids);
    checkpoint ckpt;
    ckpt.track(table);
    ckpt.set_chunk_bytes(4096);  // many pieces per part
    co_await ckpt.save(path);
    co_await table.apply_gradients(opt, ids, gradient);
    stepped_rows = co_await table.lookup(ids);
  });
  {
    checkpoint_reader reader(path);
    CHECK(reader.shape("emb") == shape_type{raw.size() + 2, 8});
    CHECK(reader.shape("emb/ids") == shape_type{raw.size() + 2});
    CHECK(reader.contains("emb/adam/m"));
    CHECK(reader.contains("emb/adam/v"));
    CHECK(reader.contains("emb/admission_counters"));
  }
  const xt::xarray<std::int64_t> now_seen{11, 12, 13, 99};
  const xt::xarray<std::int64_t> replaced = id_array({5, 6, 7});
  const xt::xarray<float> zero_rows = xt::zeros<float>(std::vector<std::size_t>{3, 8});
  const xt::xarray<float> zero_idle = xt::zeros<float>(std::vector<std::size_t>{2, 8});
  const std::vector<std::string> emb_pending{"emb"};
  for (const int ps : {1, 3}) {
    CAPTURE(ps);
    local_cluster restored(ps, 1);
    restored.run_chief([&](parameter_server_strategy& strategy, cluster_coordinator&) -> asio::awaitable<void> {
      checkpoint ckpt(strategy);
      hash_table<float> table;
      if (ps == 1) {  // a table that exists, tracked: its rows are replaced
        table = co_await strategy.scope().create_hash_table<float>("emb", saved_table_options());
        co_await table.lookup(replaced, inserting);
        co_await table.lookup(replaced, inserting);
        ckpt.track(table);
        co_await ckpt.restore(path);
      } else {  // restored before the table exists: it takes its rows when created
        co_await ckpt.restore(path);
        CHECK(ckpt.pending() == emb_pending);
        table = co_await strategy.scope().create_hash_table<float>("emb", saved_table_options());
        CHECK(ckpt.pending().empty());
      }
      CHECK(bitwise_equal(co_await table.lookup(ids), saved_rows));
      CHECK(bitwise_equal(co_await table.lookup(replaced), zero_rows));  // not in the file: gone
      // The slots and adam's step count came back: one more step gives the same rows as on 2 ps.
      co_await table.apply_gradients(opt, ids, gradient);
      CHECK(bitwise_equal(co_await table.lookup(ids), stepped_rows));
      // The counters came back: 11, 12 and 13 were seen once, so a second sighting admits them; 99
      // is new, so it is not.
      co_await table.lookup(now_seen, inserting);
      const auto admitted = co_await table.lookup(now_seen);
      CHECK_FALSE(row_is_zero(admitted, 0));
      CHECK(row_is_zero(admitted, 3));
      // The clock and when each row was last named came back: the idle rows, named at 0, drop
      // once it passes 5; the others, named at 4, do not.
      CHECK(co_await table.advance_clock(6) == 2);
      CHECK(bitwise_equal(co_await table.lookup(idle), zero_idle));
    });
  }
}

TEST_CASE("a table restore refuses a file that does not fit the table, naming it, and changes nothing") {
  table_scratch scratch;
  const auto path = scratch.dir / "tables.safetensors";
  const xt::xarray<std::int64_t> ids{1, 2, 3};
  const xt::xarray<std::int64_t> four = id_array({4});
  const xt::xarray<float> zero_row = xt::zeros<float>(std::vector<std::size_t>{1, 8});
  local_cluster cluster(2, 1);
  cluster.run_chief([&](parameter_server_strategy& strategy, cluster_coordinator&) -> asio::awaitable<void> {
    auto table = co_await strategy.scope().create_hash_table<float>("emb", normal_rows(8));
    co_await table.lookup(ids, inserting);
    const auto before = co_await table.lookup(ids);
    checkpoint saved;
    saved.track(table);
    co_await saved.save(path);
    // Another table's width, another name, and a variable under the table's name.
    auto wide = co_await strategy.scope().create_hash_table<float>("wide", normal_rows(4));
    checkpoint other;
    other.track(wide);
    const auto missing = co_await failure_of(other.restore(path));
    CHECK(code_of(missing) == errc::not_found);
    CHECK(contains(message_of(missing), "no hash table 'wide'"));
    checkpoint twice;
    twice.track(table);
    CHECK_NOTHROW(twice.track(table));  // the same table again: nothing
    co_await table.lookup(four, inserting);
    co_await twice.restore(path);
    CHECK(bitwise_equal(co_await table.lookup(ids), before));
    CHECK(bitwise_equal(co_await table.lookup(four), zero_row));
  });
  local_cluster narrower(1, 1);
  narrower.run_chief([&](parameter_server_strategy& strategy, cluster_coordinator&) -> asio::awaitable<void> {
    auto table = co_await strategy.scope().create_hash_table<float>("emb", normal_rows(4));
    co_await table.lookup(ids, inserting);
    const auto before = co_await table.lookup(ids);
    checkpoint ckpt;
    ckpt.track(table);
    const auto refused = co_await failure_of(ckpt.restore(path));
    CHECK(code_of(refused) == errc::invalid_argument);
    CHECK(contains(message_of(refused), "hash table 'emb' has rows of 8 float32 in the file but of 4 float32 here"));
    CHECK(bitwise_equal(co_await table.lookup(ids), before));
  });
}

namespace {

// Ten million ids in the release build; a tenth under the sanitizers, which are slower per row.
#if defined(__SANITIZE_ADDRESS__)
constexpr std::size_t many_ids = 1'000'000;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr std::size_t many_ids = 1'000'000;
#else
constexpr std::size_t many_ids = 10'000'000;
#endif
#else
constexpr std::size_t many_ids = 10'000'000;
#endif

}  // namespace

TEST_CASE("ten million random ids, the extremes included, over 3 ps: every lookup returns the row stored") {
  std::mt19937_64 random(2026);  // ids all distinct (checked by the rows held)
  std::vector<std::int64_t> raw(many_ids);
  for (auto& id : raw) id = static_cast<std::int64_t>(random());
  raw[0] = min_id;
  raw[1] = max_id;
  raw[2] = 0;
  raw[3] = -1;
  constexpr std::size_t chunk = 1'000'000;
  std::vector<xt::xarray<std::int64_t>> chunks;
  for (std::size_t begin = 0; begin < raw.size(); begin += chunk) {
    const std::size_t n = std::min(chunk, raw.size() - begin);
    chunks.push_back(xt::adapt(raw.data() + begin, n, xt::no_ownership(), std::vector<std::size_t>{n}));
  }
  // The same ids again in reverse order, in chunks of another size.
  std::vector<std::int64_t> reversed(raw.rbegin(), raw.rend());
  local_cluster cluster(3, 1);
  cluster.run_chief([&](parameter_server_strategy& strategy, cluster_coordinator&) -> asio::awaitable<void> {
    hash_table_options options = normal_rows(2);
    options.buckets = 4096;
    auto table = co_await strategy.scope().create_hash_table<float>("many", options);
    std::vector<float> stored(raw.size() * 2);
    for (std::size_t c = 0; c < chunks.size(); ++c) {
      const xt::xarray<float> rows = co_await table.lookup(chunks[c], inserting);
      std::copy(rows.begin(), rows.end(), stored.begin() + static_cast<std::ptrdiff_t>(c * chunk * 2));
    }
    std::size_t mismatches = 0;
    constexpr std::size_t other_chunk = 700'000;
    for (std::size_t begin = 0; begin < reversed.size(); begin += other_chunk) {
      const std::size_t n = std::min(other_chunk, reversed.size() - begin);
      const xt::xarray<std::int64_t> ids =
          xt::adapt(reversed.data() + begin, n, xt::no_ownership(), std::vector<std::size_t>{n});
      const xt::xarray<float> rows = co_await table.lookup(ids);
      const float* got = rows.data();
      const float* want = stored.data() + (raw.size() - begin - n) * 2;  // the same ids, reversed
      for (std::size_t k = 0; k < n; ++k) {
        if (std::memcmp(got + k * 2, want + (n - 1 - k) * 2, 2 * sizeof(float)) != 0) ++mismatches;
      }
    }
    CHECK(mismatches == 0);
    const auto& r = metrics::process_registry();
    const metrics::labels many{{"table", "many"}};
    const double held = r.value("pscoro_ps_hash_table_rows", many).value_or(0);
    CHECK(held == static_cast<double>(raw.size()));  // these random ids happen to be distinct
    const double bytes = r.value("pscoro_ps_hash_table_bytes", many).value_or(0);
    MESSAGE("bytes per row beyond the row's 8 over 3 ps at " << held << " rows: " << (bytes / held - 8.0));
  });
}

TEST_CASE("a table that holds no rows saves and restores as one (tensors of no rows)") {
  table_scratch scratch;
  const auto path = scratch.dir / "empty.safetensors";
  const xt::xarray<std::int64_t> ids{1, 2};
  const xt::xarray<float> zero_rows = xt::zeros<float>(std::vector<std::size_t>{2, 4});
  local_cluster cluster(2, 1);
  cluster.run_chief([&](parameter_server_strategy& strategy, cluster_coordinator&) -> asio::awaitable<void> {
    auto empty = co_await strategy.scope().create_hash_table<float>("empty", normal_rows(4));
    checkpoint ckpt;
    ckpt.track(empty);
    co_await ckpt.save(path);
    co_await empty.lookup(ids, inserting);
    co_await ckpt.restore(path);
    CHECK(bitwise_equal(co_await empty.lookup(ids), zero_rows));  // the rows made since are gone
  });
  checkpoint_reader reader(path);
  CHECK(reader.shape("empty") == shape_type{0, 4});
  CHECK(reader.shape("empty/ids") == shape_type{0});
}

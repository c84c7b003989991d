// Optimizers on the parameter servers against reference implementations written here, in double
// precision, from the published formulas (Keras / TF's Apply* ops): dense steps, then sparse steps
// with repeated ids, on a variable split in two uneven shards.
#include "local_cluster.hpp"
#include "test_support.hpp"

#include <pscoro/sharded_variable.hpp>
#include <pscoro/strategy.hpp>

#include <cmath>
#include <map>

using namespace pscoro;
using pscoro::testing::code_of;
using pscoro::testing::failure_of;
using pscoro::testing::local_cluster;
using pscoro::testing::message_of;

namespace {

constexpr std::size_t rows = 7, columns = 3;

// The reference: one optimizer's state over the whole variable, updated element by element.
struct reference {
  optimizer opt;
  std::vector<double> w, s0, s1;  // variable and (up to) two slots
  std::map<std::size_t, long> steps;  // adam's t, per shard (each shard counts its own updates)

  reference(optimizer o, const std::vector<double>& initial) : opt(o), w(initial), s0(initial.size()), s1(initial.size()) {
    double accumulator = 0;
    if (auto* a = std::get_if<optimizers::adagrad>(&opt)) accumulator = a->initial_accumulator_value;
    if (auto* f = std::get_if<optimizers::ftrl>(&opt)) accumulator = f->initial_accumulator_value;
    std::fill(s0.begin(), s0.end(), accumulator);
  }

  void element(std::size_t i, double g, long t) {
    if (auto* o = std::get_if<optimizers::sgd>(&opt)) {
      w[i] -= o->learning_rate * g;
    } else if (auto* o = std::get_if<optimizers::momentum>(&opt)) {
      s0[i] = o->momentum * s0[i] - o->learning_rate * g;
      w[i] += o->nesterov ? o->momentum * s0[i] - o->learning_rate * g : s0[i];
    } else if (auto* o = std::get_if<optimizers::adagrad>(&opt)) {
      s0[i] += g * g;
      w[i] -= o->learning_rate * g / (std::sqrt(s0[i]) + o->epsilon);
    } else if (auto* o = std::get_if<optimizers::adam>(&opt)) {
      const double lr_t = o->learning_rate * std::sqrt(1 - std::pow(o->beta_2, t)) / (1 - std::pow(o->beta_1, t));
      s0[i] = o->beta_1 * s0[i] + (1 - o->beta_1) * g;
      s1[i] = o->beta_2 * s1[i] + (1 - o->beta_2) * g * g;
      w[i] -= lr_t * s0[i] / (std::sqrt(s1[i]) + o->epsilon);
    } else if (auto* o = std::get_if<optimizers::ftrl>(&opt)) {
      // TF's ApplyFtrl documentation, with Keras's beta added to l2 as beta / (2 lr).
      const double lr = o->learning_rate, p = o->learning_rate_power;
      const double l2 = o->l2 + o->beta / (2 * lr);
      const double accum_new = s0[i] + g * g;
      s1[i] += g - (std::pow(accum_new, -p) - std::pow(s0[i], -p)) / lr * w[i];
      const double quadratic = 1.0 / (std::pow(accum_new, p) * lr) + 2 * l2;
      w[i] = std::abs(s1[i]) > o->l1 ? ((s1[i] > 0 ? o->l1 : -o->l1) - s1[i]) / quadratic : 0.0;
      s0[i] = accum_new;
    }
  }

  std::size_t shard_of(std::size_t row) const { return div_locate(row, rows, 2).shard; }

  void dense(const std::vector<double>& g) {
    for (std::size_t s = 0; s < 2; ++s) ++steps[s];
    for (std::size_t i = 0; i < w.size(); ++i) element(i, g[i], steps[shard_of(i / columns)]);
  }

  void sparse(const std::vector<std::size_t>& ids, const std::vector<double>& g) {
    std::map<std::size_t, std::vector<double>> summed;  // duplicates summed first
    for (std::size_t k = 0; k < ids.size(); ++k) {
      auto& row = summed[ids[k]];
      row.resize(columns);
      for (std::size_t j = 0; j < columns; ++j) row[j] += g[k * columns + j];
    }
    std::map<std::size_t, bool> touched;
    for (const auto& [id, _] : summed) touched[shard_of(id)] = true;
    for (const auto& [shard, _] : touched) ++steps[shard];
    for (const auto& [id, row] : summed) {
      for (std::size_t j = 0; j < columns; ++j) element(id * columns + j, row[j], steps[shard_of(id)]);
    }
  }
};

template <class T>
bool close_to(const xt::xarray<T>& got, const std::vector<double>& expected) {
  const double tolerance = std::is_same_v<T, float> ? 2e-5 : 1e-12;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const double e = expected[i];
    if (std::abs(double(got.data()[i]) - e) > tolerance * std::max(1.0, std::abs(e))) {
      MESSAGE("element ", i, ": got ", got.data()[i], ", expected ", e);
      return false;
    }
  }
  return true;
}

template <class T>
asio::awaitable<void> check_optimizer(parameter_server_strategy& strategy, const optimizer& opt, std::string name) {
  xt::xarray<T> initial = xt::zeros<T>({rows, columns});
  std::vector<double> initial_values;
  for (std::size_t i = 0; i < initial.size(); ++i) {
    initial.data()[i] = static_cast<T>(std::sin(0.7 * double(i)) * 0.5);
    initial_values.push_back(double(initial.data()[i]));
  }
  auto v = co_await strategy.scope().create_sharded_variable(name, initial);
  REQUIRE(v.num_shards() == 2);
  reference ref(opt, initial_values);
  for (int step = 0; step < 3; ++step) {
    xt::xarray<T> g = xt::zeros<T>({rows, columns});
    std::vector<double> grads;
    for (std::size_t i = 0; i < g.size(); ++i) {
      g.data()[i] = static_cast<T>(std::cos(1.3 * double(i) + step) * 0.8);
      grads.push_back(double(g.data()[i]));
    }
    co_await v.apply_gradient(opt, g);
    ref.dense(grads);
    const auto value = co_await v.read();
    CHECK_MESSAGE(close_to(value, ref.w), name, " dense step ", step);
  }
  // Sparse steps: repeated ids, one of them only in shard 0 in the last step (adam counts per shard).
  const std::vector<std::vector<std::size_t>> id_steps{{5, 1, 5, 6}, {0, 6, 6, 6}, {2, 3, 2}};
  for (std::size_t step = 0; step < id_steps.size(); ++step) {
    const auto& ids = id_steps[step];
    xt::xarray<std::int64_t> id_array = xt::zeros<std::int64_t>({ids.size()});
    xt::xarray<T> g = xt::zeros<T>({ids.size(), columns});
    std::vector<double> grads;
    for (std::size_t k = 0; k < ids.size(); ++k) {
      id_array(k) = static_cast<std::int64_t>(ids[k]);
      for (std::size_t j = 0; j < columns; ++j) {
        g(k, j) = static_cast<T>(0.3 * double(k + 1) - 0.2 * double(j) + 0.1 * double(step));
        grads.push_back(double(g(k, j)));
      }
    }
    co_await v.apply_sparse_gradient(opt, id_array, g);
    ref.sparse(ids, grads);
    const auto value = co_await v.read();
    CHECK_MESSAGE(close_to(value, ref.w), name, " sparse step ", step);
  }
}

}  // namespace

TEST_CASE_TEMPLATE("each optimizer matches its reference, dense and sparse, on uneven shards", T, float, double) {
  local_cluster cluster(2, 1);
  cluster.run_chief(
      [](parameter_server_strategy& strategy, cluster_coordinator&) -> asio::awaitable<void> {
        co_await check_optimizer<T>(strategy, optimizers::sgd{0.1}, "sgd");
        co_await check_optimizer<T>(strategy, optimizers::momentum{0.1, 0.9, false}, "momentum");
        co_await check_optimizer<T>(strategy, optimizers::momentum{0.05, 0.8, true}, "nesterov");
        co_await check_optimizer<T>(strategy, optimizers::adagrad{0.2, 0.1, 1e-7}, "adagrad");
        co_await check_optimizer<T>(strategy, optimizers::adam{0.05, 0.9, 0.999, 1e-7}, "adam");
        co_await check_optimizer<T>(strategy, optimizers::ftrl{0.1, -0.5, 0.1, 0.0, 0.0, 0.0}, "ftrl");
        co_await check_optimizer<T>(strategy, optimizers::ftrl{0.2, -0.5, 0.1, 0.05, 0.01, 0.5}, "ftrl_l1_l2_beta");
      },
      {}, {}, fixed_shards_partitioner{2});
}

TEST_CASE("slot variables live beside each shard, named after the optimizer") {
  local_cluster cluster(2, 1);
  cluster.run_chief(
      [](parameter_server_strategy& strategy, cluster_coordinator&) -> asio::awaitable<void> {
        const xt::xarray<float> initial = xt::zeros<float>({5, 2});
        auto v = co_await strategy.scope().create_sharded_variable("w", initial);
        const auto accumulator = v.slot("adagrad", "accumulator");
        auto e = co_await failure_of(accumulator.read());
        CHECK(code_of(e) == errc::not_found);  // created on first use
        const xt::xarray<float> g = xt::ones<float>({5, 2});
        co_await v.apply_gradient(optimizers::adagrad{0.1, 0.5}, g);
        const auto shards = accumulator.shards();
        REQUIRE(shards.size() == 2);
        CHECK(shards[0].handle.name() == "w/part_0/adagrad/accumulator");
        CHECK(shards[0].handle.ps_task() == v.shards()[0].handle.ps_task());
        CHECK(shards[1].handle.ps_task() == v.shards()[1].handle.ps_task());
        const xt::xarray<float> expected = xt::ones<float>({5, 2}) * 1.5f;
        CHECK((co_await accumulator.read() == expected));
      },
      {}, {}, fixed_shards_partitioner{2});
}

TEST_CASE("a dense gradient already in wire form steps like the same gradient as an xarray") {
  local_cluster cluster(2, 1);
  cluster.run_chief(
      [](parameter_server_strategy& strategy, cluster_coordinator&) -> asio::awaitable<void> {
        const xt::xarray<float> initial = xt::zeros<float>({5, 2});
        auto from_xarray = co_await strategy.scope().create_sharded_variable("from_xarray", initial);
        auto from_tensor = co_await strategy.scope().create_sharded_variable("from_tensor", initial);
        REQUIRE(from_tensor.num_shards() == 2);
        const optimizers::adagrad opt{0.1, 0.5};
        for (int step = 0; step < 2; ++step) {
          const xt::xarray<float> g = xt::arange<float>(10.0f).reshape({5, 2}) * float(step + 1);
          co_await from_xarray.apply_gradient(opt, g);
          co_await from_tensor.apply_gradient(opt, to_tensor(g));
        }
        const auto expected = co_await from_xarray.read();
        CHECK((co_await from_tensor.read() == expected));
        // Its dtype and shape are checked before anything is sent.
        const tensor wrong = to_tensor(xt::xarray<double>(xt::zeros<double>({5, 2})));
        auto e = co_await failure_of(from_tensor.apply_gradient(opt, wrong));
        CHECK(code_of(e) == errc::invalid_argument);
        CHECK(contains(message_of(e), "the value is float64 [5, 2] but the variable is float32 [5, 2]"));
        CHECK((co_await from_tensor.read() == expected));
      },
      {}, {}, fixed_shards_partitioner{2});
}

TEST_CASE("bad optimizer parameters and integer variables are refused, and nothing changes") {
  local_cluster cluster(1, 1);
  cluster.run_chief([](parameter_server_strategy& strategy, cluster_coordinator&) -> asio::awaitable<void> {
    const xt::xarray<double> initial{1.0, 2.0, 3.0};
    const xt::xarray<double> g{1.0, 1.0, 1.0};
    auto v = co_await strategy.scope().create_variable("w", initial);
    auto e = co_await failure_of(v.apply_gradient(optimizers::adam{0.1, 1.0}, g));
    CHECK(code_of(e) == errc::invalid_argument);
    CHECK(contains(message_of(e), "adam: beta_1 must be in [0, 1) (got 1)"));
    e = co_await failure_of(v.apply_gradient(optimizers::ftrl{0.1, 0.5}, g));
    CHECK(contains(message_of(e), "ftrl: learning_rate_power needs to be negative or zero (got 0.5)"));
    e = co_await failure_of(v.apply_gradient(optimizers::sgd{-1}, g));
    CHECK(contains(message_of(e), "sgd: learning_rate must be positive (got -1)"));
    const xt::xarray<double> short_gradient{1.0};
    e = co_await failure_of(v.apply_gradient(optimizers::sgd{}, short_gradient));
    CHECK(contains(message_of(e), "the value is float64 [1] but the variable is float64 [3]"));
    CHECK((co_await v.read() == initial));
    e = co_await failure_of(v.slot("adam", "m").read());
    CHECK(code_of(e) == errc::not_found);  // a refused update creates no slots
  });
}

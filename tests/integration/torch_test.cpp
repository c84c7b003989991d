// <pscoro/torch.hpp>: views between libtorch and pscoro tensors proven zero-copy by pointer identity,
// the refusals that say what was wrong, torch::Tensor through worker functions, and a small model
// (an embedding table on the ps, an MLP in libtorch) trained across 2 ps and 2 workers whose ps
// variables and losses match single-process libtorch doing the same steps.
//
// The one test source that includes libtorch (each such file costs ~30 s of compile time); built
// when libtorch is found, never under the sanitizers (tests/meson.build).
#include <pscoro/torch.hpp>  // first: this checks that it compiles on its own

#include "local_cluster.hpp"
#include "test_support.hpp"

#include <pscoro/coordinator.hpp>
#include <pscoro/partitioners.hpp>
#include <pscoro/server.hpp>
#include <pscoro/strategy.hpp>
#include <pscoro/worker_function.hpp>

#include <torch/torch.h>

#include <atomic>
#include <cmath>
#include <exception>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

using namespace pscoro;
using pscoro::testing::code_of;
using pscoro::testing::local_cluster;
using pscoro::testing::message_of;

namespace {

template <class F>
std::exception_ptr thrown_by(F f) {
  try {
    f();
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}

const void* bytes_of(const tensor& t) { return t.bytes().data(); }

// libtorch's name of a dtype ("Float"): doctest cannot print a c10::ScalarType (ADL finds c10's
// toString, which returns a const char*, where doctest expects its own String).
std::string torch_name(c10::ScalarType t) { return c10::toString(t); }

}  // namespace

TEST_CASE("a contiguous CPU torch::Tensor is a pscoro tensor over the same bytes, which it keeps alive") {
  const std::vector<std::pair<c10::ScalarType, dtype>> types{
      {torch::kFloat32, dtype::float32}, {torch::kFloat64, dtype::float64},
      {torch::kInt32, dtype::int32},     {torch::kInt64, dtype::int64}};
  for (const auto& [torch_type, pscoro_type] : types) {
    CAPTURE(name_of(pscoro_type));
    torch::Tensor t = torch::arange(6, torch::TensorOptions().dtype(torch_type)).reshape({2, 3});
    const tensor view = from_torch(t);
    CHECK(bytes_of(view) == t.data_ptr());
    CHECK(view.type() == pscoro_type);
    CHECK(view.shape() == shape_type{2, 3});
    CHECK(view.size_bytes() == 6 * size_of(pscoro_type));
    CHECK(from_torch_dtype(torch_type) == pscoro_type);
    CHECK(torch_name(to_torch_dtype(pscoro_type)) == torch_name(torch_type));
  }
  // The view owns a reference to the storage: the tensor may go first.
  auto t = std::make_unique<torch::Tensor>(torch::arange(6, torch::kFloat32));
  const tensor view = from_torch(*t);
  t.reset();
  CHECK(view.data<float>()[5] == 5.0f);
  // A contiguous slice starts inside its storage; a tensor that requires grad is shared as it is.
  const torch::Tensor rows = torch::arange(12, torch::kFloat64).reshape({4, 3});
  const torch::Tensor middle = rows.narrow(0, 1, 2);
  CHECK(bytes_of(from_torch(middle)) == middle.data_ptr());
  CHECK(from_torch(middle).data<double>()[0] == 3.0);
  const torch::Tensor weight = torch::ones({2, 2}, torch::requires_grad());
  CHECK(bytes_of(from_torch(weight)) == weight.data_ptr());
}

TEST_CASE("a pscoro tensor and an xarray are seen as torch tensors over the same bytes") {
  tensor t = tensor::uninitialized(dtype::int32, {3, 2});
  for (int i = 0; i < 6; ++i) t.mutable_data<std::int32_t>()[i] = 10 * i;
  auto view = std::make_unique<torch::Tensor>(to_torch(t));
  CHECK(view->data_ptr() == bytes_of(t));
  CHECK(torch_name(view->scalar_type()) == "Int");
  CHECK(view->sizes() == c10::IntArrayRef{3, 2});
  CHECK(view->index({2, 1}).item<std::int32_t>() == 50);
  // Both ways round: still the same bytes.
  CHECK(bytes_of(from_torch(*view)) == bytes_of(t));
  // The view keeps the bytes alive without the tensor.
  const void* where = bytes_of(t);
  t = tensor();
  CHECK(view->data_ptr() == where);
  CHECK(view->sum().item<std::int64_t>() == 150);
  view.reset();

  xt::xarray<double> a = {{1.0, 2.0}, {3.0, 4.0}};
  const double* data = a.data();
  const torch::Tensor from_array = to_torch(std::move(a));
  CHECK(from_array.data_ptr() == data);
  CHECK(torch_name(from_array.scalar_type()) == "Double");
  CHECK(from_array.index({1, 0}).item<double>() == 3.0);

  // Empty ones too (no bytes to share).
  CHECK(to_torch(tensor::uninitialized(dtype::float32, {0, 4})).sizes() == c10::IntArrayRef{0, 4});
  CHECK(from_torch(torch::empty({0, 4})).shape() == shape_type{0, 4});
}

TEST_CASE("what cannot be viewed is refused, saying what was wrong and what to do") {
  struct refusal {
    const char* what;
    torch::Tensor t;
    const char* message;
  };
  const std::vector<refusal> refusals{
      {"half", torch::zeros({2}, torch::kFloat16),
       "libtorch dtype Half has no pscoro dtype (pscoro has float32, float64, int32 and int64)"},
      {"bool", torch::zeros({2}, torch::kBool), "libtorch dtype Bool has no pscoro dtype"},
      {"uint8", torch::zeros({2}, torch::kUInt8), "libtorch dtype Byte has no pscoro dtype"},
      {"transposed", torch::zeros({3, 2}).t(),
       "from_torch: the tensor has strides [1, 2] for sizes [2, 3], not row-major: call .contiguous() first (a copy)"},
      {"meta", torch::zeros({2}, torch::TensorOptions().device(torch::kMeta)),
       "from_torch: the tensor is on device meta: pscoro reads and writes CPU memory (call .cpu() first: a copy)"},
      {"sparse", torch::eye(3).to_sparse(), "from_torch: the tensor is not a dense (strided) tensor"},
      {"undefined", torch::Tensor(), "from_torch: the tensor is an undefined torch::Tensor"},
  };
  for (const auto& r : refusals) {
    CAPTURE(r.what);
    const auto e = thrown_by([&] { (void)from_torch(r.t); });
    REQUIRE(e);
    CHECK(code_of(e) == errc::invalid_argument);
    CHECK(contains(message_of(e), r.message));
  }
}

TEST_CASE("torch::Tensor travels through the codec as a tensor, viewed where it lands") {
  // The same name as pscoro::tensor: a chief without libtorch can declare the same function.
  CHECK(worker_function<torch::Tensor(torch::Tensor)>::signature() == worker_function<tensor(tensor)>::signature());
  const torch::Tensor t = torch::arange(4, torch::kFloat32);
  value v = codec<torch::Tensor>::encode(t);
  REQUIRE(std::holds_alternative<tensor>(v));
  CHECK(bytes_of(std::get<tensor>(v)) == t.data_ptr());
  const void* sent = bytes_of(std::get<tensor>(v));
  const torch::Tensor back = codec<torch::Tensor>::decode(std::move(v), {});
  CHECK(back.data_ptr() == sent);
  // A transposed tensor is made contiguous first (one copy), elements in row-major order.
  const torch::Tensor transposed = torch::arange(6, torch::kInt64).reshape({2, 3}).t();
  const value copied = codec<torch::Tensor>::encode(transposed);
  const auto& as_tensor = std::get<tensor>(copied);
  CHECK(as_tensor.shape() == shape_type{3, 2});
  CHECK(as_tensor.data<std::int64_t>()[1] == 3);
  // Anything but a tensor is refused, naming what came.
  const auto e = thrown_by([] { (void)codec<torch::Tensor>::decode(value{std::int64_t{3}}, {}); });
  REQUIRE(e);
  CHECK(contains(message_of(e), "int64"));
}

namespace {

const worker_function<torch::Tensor(torch::Tensor, double)> scale{"torch_test.scale"};
// The same function as a chief without libtorch declares it.
const worker_function<tensor(tensor, double)> scale_plain{"torch_test.scale"};

}  // namespace

TEST_CASE("worker functions take and return torch::Tensor") {
  local_cluster cluster(1, 2, [](server& s) {
    s.bind(scale, [](torch::Tensor x, double factor) -> asio::awaitable<torch::Tensor> { co_return x * factor; });
  });
  cluster.run_chief([](parameter_server_strategy&, cluster_coordinator& coordinator) -> asio::awaitable<void> {
    const torch::Tensor x = torch::arange(6, torch::kFloat64).reshape({2, 3});
    auto scaled = coordinator.schedule(scale, x, 2.0);
    const torch::Tensor got = co_await scaled.get();
    CHECK(got.sizes() == c10::IntArrayRef{2, 3});
    CHECK(torch_name(got.scalar_type()) == "Double");
    CHECK(torch::equal(got, x * 2.0));
    const torch::Tensor ints = torch::arange(4, torch::kInt32);
    auto scaled_ints = coordinator.schedule(scale, ints, 3.0);
    const torch::Tensor got_ints = co_await scaled_ints.get();
    CHECK(torch::equal(got_ints, ints * 3));
    auto plain = coordinator.schedule(scale_plain, from_torch(x), 0.5);
    const tensor got_plain = co_await plain.get();
    CHECK(torch::equal(to_torch(got_plain), x * 0.5));
  });
}

TEST_CASE("module_variables refuses parameters and variables that do not match, naming them") {
  local_cluster cluster(1, 1);
  cluster.run_chief([](parameter_server_strategy& strategy, cluster_coordinator&) -> asio::awaitable<void> {
    torch::nn::Linear small(3, 2);
    auto variables = co_await create_module_variables<float>(strategy.scope(), *small, "small/");
    REQUIRE(variables.size() == 2);
    CHECK(variables.at("weight").name() == "small/weight");
    CHECK(variables.at("weight").shape() == shape_type{2, 3});
    // The variables hold the module's initial values.
    const xt::xarray<float> weight = co_await variables.at("weight").read();
    CHECK(torch::equal(to_torch(xt::xarray<float>(weight)), small->weight.detach()));

    const auto refused = [&](torch::nn::Module& module, const std::map<std::string, sharded_variable<float>>& vars) {
      const auto e = thrown_by([&] { module_variables<float> bound(module, vars); });
      REQUIRE(e);
      CHECK(code_of(e) == errc::invalid_argument);
      return message_of(e);
    };
    torch::nn::Linear wider(4, 2);
    CHECK(contains(refused(*wider, variables),
                   "module_variables: parameter 'weight' has shape [2, 4] but its variable 'small/weight' [2, 3]"));
    auto fewer = variables;
    fewer.erase("bias");
    CHECK(contains(refused(*small, fewer), "module_variables: parameter 'bias' has no variable (variables: weight)"));
    torch::nn::Linear no_bias(torch::nn::LinearOptions(3, 2).bias(false));
    CHECK(contains(refused(*no_bias, variables),
                   "module_variables: variable 'small/bias' for 'bias' names no parameter of the module"));
    torch::nn::Linear doubles(3, 2);
    doubles->to(torch::kFloat64);
    CHECK(contains(refused(*doubles, variables), "module_variables: parameter 'weight' is Double, not float32"));

    // Bound, a parameter keeps its values in storage of its own, which pull() receives into.
    const torch::Tensor before = small->weight.detach().clone();
    module_variables<float> bound(*small, variables);
    const void* storage = small->weight.data_ptr();
    CHECK(torch::equal(small->weight.detach(), before));
    const xt::xarray<float> changed = xt::ones<float>({2, 3}) * 0.5f;
    co_await variables.at("weight").assign(changed);
    // A graph that saved a parameter before the pull refuses backward() after it: it would mix two
    // steps' values. (The input requires grad: its gradient needs the weight, which is saved.)
    const torch::Tensor stale = small->forward(torch::ones({1, 3}, torch::requires_grad())).sum();
    co_await bound.pull();
    CHECK(small->weight.data_ptr() == storage);
    CHECK(torch::equal(small->weight.detach(), torch::full({2, 3}, 0.5f)));
    const auto e = thrown_by([&] { stale.backward(); });
    REQUIRE(e);
    CHECK(contains(message_of(e), "modified by an inplace operation"));
  });
}

namespace {

constexpr std::int64_t table_rows = 20, embedding_width = 4, dense_features = 3, ids_per_example = 2;
constexpr std::int64_t batch_size = 16, batches = 4, steps = 12;
constexpr double learning_rate = 0.1;

// x [b, 3] and the embedded rows of two ids per example [b, 2, 4], summed, into two layers.
struct mlp_impl : torch::nn::Module {
  mlp_impl()
      : fc1(register_module("fc1", torch::nn::Linear(dense_features + embedding_width, 8))),
        fc2(register_module("fc2", torch::nn::Linear(8, 1))) {}
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& embedded) {
    return fc2(torch::relu(fc1(torch::cat({x, embedded.sum(1)}, 1)))).squeeze(1);
  }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE_IMPL(mlp, mlp_impl);

using variable_map = std::map<std::string, sharded_variable<float>>;
const worker_function<double(variable_map, sharded_variable<float>, torch::Tensor, torch::Tensor, torch::Tensor)>
    train_step{"torch_test.train_step"};

struct worker_model {
  mlp model;
  std::unique_ptr<module_variables<float>> bound;
  // Where fc1.weight's elements are after each pull: always the storage binding gave it.
  std::atomic<const void*> weight_storage{nullptr};
  std::atomic<bool> weight_storage_moved{false};
  std::atomic<int> steps{0};
};

asio::awaitable<double> run_step(std::shared_ptr<worker_model> state, variable_map params,
                                 sharded_variable<float> table, torch::Tensor ids, torch::Tensor x, torch::Tensor y) {
  if (!state->bound) state->bound = std::make_unique<module_variables<float>>(*state->model, std::move(params));
  auto& bound = *state->bound;
  co_await bound.pull();
  const void* storage = state->model->fc1->weight.data_ptr();
  const void* expected = nullptr;
  if (!state->weight_storage.compare_exchange_strong(expected, storage) && expected != storage) {
    state->weight_storage_moved = true;
  }
  auto lookup = bound.embedding_lookup(table, ids);  // named: g++ 12 (temporaries in co_await)
  const torch::Tensor embedded = co_await std::move(lookup);
  const torch::Tensor loss = torch::binary_cross_entropy_with_logits(state->model->forward(x, embedded), y);
  loss.backward();
  auto pushed = bound.push(optimizers::adagrad{.learning_rate = learning_rate});
  co_await std::move(pushed);
  ++state->steps;
  co_return loss.item<double>();
}

struct batch {
  torch::Tensor ids, x, y;
};

// Labels from a fixed rule, so the model has something to learn.
std::vector<batch> make_batches() {
  torch::manual_seed(11);
  const torch::Tensor true_table = torch::randn({table_rows, embedding_width});
  const torch::Tensor true_weights = torch::randn({dense_features + embedding_width});
  std::vector<batch> out;
  for (int i = 0; i < batches; ++i) {
    batch b{torch::randint(0, table_rows, {batch_size, ids_per_example}, torch::kInt64),
            torch::randn({batch_size, dense_features}), {}};
    const torch::Tensor features = torch::cat({b.x, true_table.index_select(0, b.ids.reshape({-1}))
                                                        .reshape({batch_size, ids_per_example, embedding_width})
                                                        .sum(1)},
                                              1);
    b.y = (features.matmul(true_weights) > 0).to(torch::kFloat32);
    out.push_back(b);
  }
  return out;
}

}  // namespace

TEST_CASE("an MLP with an embedding table on the ps, trained by 2 workers, matches single-process libtorch") {
  torch::set_num_threads(1);
  const auto data = make_batches();
  torch::manual_seed(3);
  mlp initial;
  const torch::Tensor initial_table = torch::randn({table_rows, embedding_width}) * 0.1;

  std::vector<std::shared_ptr<worker_model>> workers;
  local_cluster cluster(2, 2, [&](server& s) {
    auto state = std::make_shared<worker_model>();
    workers.push_back(state);
    s.bind(train_step, [state](variable_map params, sharded_variable<float> table, torch::Tensor ids, torch::Tensor x,
                               torch::Tensor y) {
      return run_step(state, std::move(params), std::move(table), std::move(ids), std::move(x), std::move(y));
    });
  });

  std::vector<double> losses;
  std::map<std::string, torch::Tensor> ps_values;
  torch::Tensor ps_table;
  std::size_t table_shards = 0, fc1_weight_shards = 0;
  cluster.run_chief(
      [&](parameter_server_strategy& strategy, cluster_coordinator& coordinator) -> asio::awaitable<void> {
        auto params = co_await create_module_variables<float>(strategy.scope(), *initial, "mlp/");
        auto table = co_await strategy.scope().create_sharded_variable("embedding", to_xarray<float>(from_torch(initial_table)));
        table_shards = table.num_shards();
        fc1_weight_shards = params.at("fc1.weight").num_shards();
        // One step at a time, each on whichever worker is free: the order of updates is the reference's.
        for (std::int64_t step = 0; step < steps; ++step) {
          const auto& b = data[static_cast<std::size_t>(step % batches)];
          auto result = coordinator.schedule(train_step, params, table, b.ids, b.x, b.y);
          losses.push_back(co_await result.get());
        }
        for (const auto& [name, variable] : params) {
          xt::xarray<float> value = co_await variable.read();
          ps_values[name] = to_torch(std::move(value));
        }
        xt::xarray<float> table_value = co_await table.read();
        ps_table = to_torch(std::move(table_value));
      },
      {}, {}, fixed_shards_partitioner{2});
  REQUIRE(table_shards == 2);
  REQUIRE(fc1_weight_shards == 2);
  REQUIRE(workers.size() == 2);
  CHECK(workers[0]->steps + workers[1]->steps == steps);
  for (const auto& w : workers) {
    CHECK_MESSAGE(!w->weight_storage_moved, "pull() gave fc1.weight new storage instead of receiving into its own");
  }

  // The reference: the same model, data and optimizer (Keras's adagrad: accumulators start at 0.1,
  // epsilon 1e-7) in one process, the table a dense parameter (its untouched rows get zero
  // gradients, which change nothing, as the sparse updates leave them).
  torch::manual_seed(3);
  mlp reference;
  {
    torch::NoGradGuard no_grad;
    const auto from = initial->named_parameters();
    for (auto& p : reference->named_parameters()) p.value().copy_(from[p.key()]);
  }
  torch::Tensor reference_table = initial_table.clone().requires_grad_(true);
  std::vector<torch::Tensor> parameters = reference->parameters();
  parameters.push_back(reference_table);
  torch::optim::Adagrad optimizer(
      parameters, torch::optim::AdagradOptions(learning_rate).initial_accumulator_value(0.1).eps(1e-7));
  std::vector<double> reference_losses;
  for (std::int64_t step = 0; step < steps; ++step) {
    const auto& b = data[static_cast<std::size_t>(step % batches)];
    optimizer.zero_grad();
    const torch::Tensor embedded = reference_table.index_select(0, b.ids.reshape({-1}))
                                       .reshape({batch_size, ids_per_example, embedding_width});
    const torch::Tensor loss = torch::binary_cross_entropy_with_logits(reference->forward(b.x, embedded), b.y);
    loss.backward();
    optimizer.step();
    reference_losses.push_back(loss.item<double>());
  }

  REQUIRE(losses.size() == reference_losses.size());
  for (std::size_t i = 0; i < losses.size(); ++i) {
    CHECK_MESSAGE(std::abs(losses[i] - reference_losses[i]) < 1e-5, "step ", i, ": loss ", losses[i],
                  ", reference ", reference_losses[i]);
  }
  for (const auto& p : reference->named_parameters()) {
    REQUIRE(ps_values.count(p.key()) == 1);
    const double gap = (ps_values[p.key()] - p.value().detach()).abs().max().item<double>();
    CHECK_MESSAGE(gap < 1e-5, p.key(), " on the ps differs from the reference by up to ", gap);
  }
  const double table_gap = (ps_table - reference_table.detach()).abs().max().item<double>();
  CHECK_MESSAGE(table_gap < 1e-5, "the embedding table on the ps differs from the reference by up to ", table_gap);
  // And it learned: the last pass over the 4 batches has a lower mean loss than the first.
  double first = 0, last = 0;
  for (std::int64_t i = 0; i < batches; ++i) {
    first += losses[static_cast<std::size_t>(i)];
    last += losses[static_cast<std::size_t>(steps - batches + i)];
  }
  MESSAGE("mean loss of the first pass ", first / batches, ", of the last ", last / batches);
  CHECK(last < 0.9 * first);
}

TEST_CASE("module_variables looks up a hash table as a tensor that requires grad, and push steps its rows") {
  const torch::Tensor ids = torch::tensor({std::numeric_limits<std::int64_t>::min(), std::int64_t{7},
                                           std::int64_t{-3}, std::int64_t{7}},
                                          torch::kInt64)
                                .reshape({2, 2});
  const torch::Tensor x = torch::ones({2, dense_features});
  const torch::Tensor y = torch::tensor({1.0f, 0.0f});
  const hash_lookup_options inserting{.insert = true};
  hash_table_options options;
  options.dim = embedding_width;
  options.initializer = initializers::random_normal{.stddev = 0.5, .seed = 1};
  local_cluster cluster(2, 1);
  cluster.run_chief([&](parameter_server_strategy& strategy, cluster_coordinator&) -> asio::awaitable<void> {
    mlp model;
    auto params = co_await create_module_variables<float>(strategy.scope(), *model, "hashed/");
    auto table = co_await strategy.scope().create_hash_table<float>("hashed/users", options);
    module_variables<float> bound(*model, params);
    co_await bound.pull();
    auto lookup = bound.embedding_lookup(table, ids, inserting);  // named: g++ 12 (temporaries in co_await)
    const torch::Tensor embedded = co_await std::move(lookup);
    CHECK(embedded.sizes() == torch::IntArrayRef({2, 2, embedding_width}));
    CHECK(embedded.requires_grad());
    const torch::Tensor loss = torch::binary_cross_entropy_with_logits(model->forward(x, embedded), y);
    loss.backward();
    const torch::Tensor before = embedded.detach().clone().reshape({4, embedding_width});
    const torch::Tensor grad = embedded.grad().clone().reshape({4, embedding_width});
    auto pushed = bound.push(optimizers::sgd{.learning_rate = 0.1});
    co_await std::move(pushed);
    // Each row moved by the learning rate times its gradient, id 7's two gradients summed.
    torch::Tensor expected = before - 0.1 * grad;
    expected[1] = before[1] - 0.1 * (grad[1] + grad[3]);
    expected[3] = expected[1];
    const xt::xarray<std::int64_t> flat = xt::adapt(ids.data_ptr<std::int64_t>(), 4, xt::no_ownership(),
                                                    std::vector<std::size_t>{4});
    const xt::xarray<float> after = co_await table.lookup(flat);
    CHECK(torch::allclose(to_torch(xt::xarray<float>(after)), expected, 1e-5, 1e-6));
    // A lookup without insert of an id the table does not hold reads the default row.
    const torch::Tensor unseen = torch::tensor({std::int64_t{12345}}, torch::kInt64);
    auto read = bound.embedding_lookup(table, unseen);
    const torch::Tensor unseen_row = co_await std::move(read);
    CHECK(torch::equal(unseen_row.detach(), torch::zeros({1, embedding_width})));
  });
}

// A DLRM-style recommendation model (Naumov et al. 2019) written in libtorch and trained by a pscoro
// cluster: the CTR example's data (2M lines of its generator) and input pipelines, with the model's
// own code on the workers.
//
// The model: the 26 categorical features' embeddings (16 floats each, in rows of one hashed table,
// >= 1M rows, 68 MiB, split over the parameter servers by min_size_partitioner), a bottom MLP that
// maps log1p of the 13 integer features to a 16-float vector, the dot products of every pair of
// those 27 vectors (351), and a top MLP from [bottom output, dot products] to the click logit,
// plus a first-order weight per categorical value (a 17th float in its row; the CTR example's
// factorization machine has the same "wide" part: docs/design.md says why it is here). The
// workers run forward and backward() in libtorch (<pscoro/torch.hpp>): each step pulls the MLPs'
// parameters, looks up the rows its batch needs, and pushes dense gradients for the MLPs and
// sparse gradient rows for the table to the Adagrad optimizers on the ps, asynchronously.
//
// A worker runs several steps at once (--closures-per-worker, 2), interleaved where they await the
// network; a torch module holds one step's state (its parameters' values and gradients, the
// lookups made since its last push), so each worker keeps a pool of models and a step takes one for
// itself from its pull to its push (docs/design.md, "The DLRM example").
//
// The reference: after the cluster's run the chief trains the same model from the same initial
// values, on the same files and as many batches, in its own process with libtorch alone (sparse
// embedding gradients, torch::optim::Adagrad with the ps's settings), and prints both AUCs and
// steps/s side by side. The chief exits 1 when the cluster's test AUC ends more than 0.01 below the
// generator's bound (raw ids: 0.05) or more than 0.005 from the reference's.
//
// On raw ids (--ids raw: 64-bit ids from vocabularies of up to 10 million values that drift over
// the stream, criteo.hpp), --embedding hash keys the embeddings by the ids themselves, as the CTR
// example does: one pscoro::hash_table per field (field_tables.hpp), whose row is the value's
// embedding and first-order weight, looked up through module_variables like the fixed table and
// stepped by its push; --admission-min-count gives a row only to ids seen that often, --ttl forgets
// ids idle for that many steps (or --capacity caps the rows per table and ps), and each ps reports
// what its part of the tables holds (rows, bytes per row). The reference trains a fixed table only, so it does not run then.
//
//   pscoro-launch --ps 2 --workers 2 -- dlrm                    # cluster, then reference
//   pscoro-launch --ps 2 --workers 2 -- dlrm --no-reference     # the cluster alone
//   dlrm --reference-only                                       # the reference alone, no cluster
//   pscoro-launch --ps 2 --workers 2 -- dlrm --threaded-reference 2  # and the reference on 2 threads
//   pscoro-launch --ps 2 --workers 2 -- dlrm --ids raw --embedding hash --ttl 200  # raw ids
#include <pscoro/pscoro.hpp>
#include <pscoro/torch.hpp>

#include "chief.hpp"
#include "command_line.hpp"
#include "criteo.hpp"
#include "field_tables.hpp"

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <torch/torch.h>

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

// OpenBLAS's own query (libtorch multiplies through it when Debian's libopenblas0-* is installed;
// weak: null with another BLAS): 0 for the serial build, which gives wrong products when two
// threads multiply at once.
extern "C" int openblas_get_parallel() __attribute__((weak));

namespace {

namespace criteo = examples::criteo;
namespace field_tables = examples::field_tables;
constexpr std::int64_t fields = pscoro::criteo_example::categorical_features;
constexpr std::int64_t numerics = pscoro::criteo_example::integer_features;

using table = pscoro::sharded_variable<float>;
using hash_table = pscoro::hash_table<float>;
using variable_map = std::map<std::string, pscoro::sharded_variable<float>>;

struct options {
  std::string data_dir = "ctr-data";
  std::string format = "tsv";
  std::string ids = "criteo";
  std::int64_t train_examples = 2000000;
  std::size_t files = 8;
  std::int64_t steps = 9000;
  std::int64_t batch_size = 512;
  std::size_t shuffle_buffer = 10000;
  double learning_rate = 0.2;
  double initial_accumulator = 0.1;
  std::int64_t warmup_steps = 500;
  double decay_to = 0.0;
  // The first-order weights' gradient is multiplied by this in backward(): under Adagrad the same
  // as starting their accumulators at 0.1 / 30², so a rare value learns from its few examples;
  // the MLPs keep 0.1, since sign-sized first steps on them overshoot with steps in flight
  // (docs/design.md, The DLRM example: "Closing the gap to the bound").
  double first_order_gradient_scale = 30;
  std::string embedding = "fixed";
  std::int64_t rows = 1 << 20;
  field_tables::policies tables;  // --admission-min-count, --ttl, --capacity, --buckets
  double report_seconds = 5;
  std::int64_t dim = 16;
  std::int64_t hidden = 64;
  double init_stddev = 0.02;
  std::int64_t seed = 2026;
  std::int64_t test_examples = 100000;
  double max_auc_gap = 0.01;
  double max_reference_gap = 0.005;
  // Not the coordinator's 4: with 8 steps in flight (2 workers) at Adagrad 0.2, one run in a few
  // blows up and never recovers (docs/design.md, The DLRM example: "Closures per worker").
  std::size_t closures_per_worker = 2;
  long long max_staleness = -1;  // -1: none (fully asynchronous)
  std::int64_t log_every = 500;
  bool no_reference = false;
  bool reference_only = false;
  std::size_t threaded_reference = 0;  // threads of the second reference (0: none)

  bool raw_ids() const { return ids == "raw"; }
  bool hashed() const { return embedding == "hash"; }
  criteo::file_format file_format() const { return format == "tsv" ? criteo::file_format::tsv : criteo::file_format::tfrecord; }
  std::filesystem::path training_data_dir() const {
    return criteo::training_data_dir(data_dir, static_cast<std::uint64_t>(seed), train_examples, files, file_format(),
                                     raw_ids() ? criteo::id_form::raw : criteo::id_form::criteo);
  }
  criteo::id_mapping id_of() const { return {hashed() ? 0 : static_cast<std::size_t>(rows)}; }
  pscoro::optimizers::adagrad optimizer() const {
    return {.learning_rate = learning_rate, .initial_accumulator_value = initial_accumulator};
  }
  // The learning rate of step `step` (from 0): rising linearly over the first warmup_steps (the
  // steps in flight compute their gradients on the same early values; at full rate from the
  // start their updates overshoot together and the dot products blow up), then falling linearly
  // to decay_to x learning_rate at the last step.
  double learning_rate_at(std::int64_t step) const {
    if (step < warmup_steps) return learning_rate * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
    const double after =
        static_cast<double>(step - warmup_steps) / static_cast<double>(std::max<std::int64_t>(steps - warmup_steps, 1));
    return learning_rate * (1.0 - (1.0 - decay_to) * after);
  }
};

// Bottom MLP, pairwise dot products, top MLP.
struct dlrm_impl : torch::nn::Module {
  dlrm_impl(std::int64_t dim, std::int64_t hidden, double first_order_gradient_scale = 1.0)
      : first_order_scale(first_order_gradient_scale),
        bottom(register_module("bottom", torch::nn::Sequential(torch::nn::Linear(numerics, hidden), torch::nn::ReLU(),
                                                                torch::nn::Linear(hidden, dim)))),
        top(register_module("top", torch::nn::Sequential(torch::nn::Linear(dim + pairs, hidden), torch::nn::ReLU(),
                                                          torch::nn::Linear(hidden, 1)))) {
    // Where the pairs (i < j) of the 27 x 27 dot products are in their flattened matrix.
    const torch::Tensor upper = torch::triu_indices(vectors, vectors, 1);
    pair_index = upper[0] * vectors + upper[1];
  }

  // dense [n, 13], rows [n, 26, dim + 1] (an embedding and a first-order weight per value) -> logits [n]
  torch::Tensor forward(const torch::Tensor& dense, const torch::Tensor& rows) {
    torch::Tensor first_order = rows.select(2, rows.size(2) - 1);  // [n, 26]
    // The value is unchanged; the gradient that reaches the table's first-order column is scaled.
    if (first_order.requires_grad() && first_order_scale != 1.0) {
      first_order.register_hook([s = first_order_scale](const torch::Tensor& g) { return g * s; });
    }
    return top->forward(top_input(dense, rows)).squeeze(1) + first_order.sum(1);
  }
  // [bottom output, dot products]: [n, dim + 351]
  torch::Tensor top_input(const torch::Tensor& dense, const torch::Tensor& rows) {
    const std::int64_t dim = rows.size(2) - 1;
    const torch::Tensor x = bottom->forward(dense);                                 // [n, dim]
    const torch::Tensor all = torch::cat({x.unsqueeze(1), rows.narrow(2, 0, dim)}, 1);  // [n, 27, dim]
    const torch::Tensor dots = torch::bmm(all, all.transpose(1, 2)).flatten(1);
    return torch::cat({x, dots.index_select(1, pair_index)}, 1);
  }

  static constexpr std::int64_t vectors = fields + 1;
  static constexpr std::int64_t pairs = vectors * (vectors - 1) / 2;
  double first_order_scale;
  torch::nn::Sequential bottom, top;
  torch::Tensor pair_index;
};
TORCH_MODULE_IMPL(dlrm, dlrm_impl);

// A batch as the model sees it: the categoricals' ids (--embedding fixed: hashed rows; hash: the
// values), log1p of the integers, labels.
struct batch {
  torch::Tensor ids;     // [n, 26] int64
  torch::Tensor dense;   // [n, 13] float
  torch::Tensor labels;  // [n] float
};

// The model's inputs for `examples` (pscoro::criteo_example or criteo::raw_example).
template <class Example>
batch make_batch(const std::vector<Example>& examples, const criteo::id_mapping& id_of) {
  const auto n = static_cast<std::int64_t>(examples.size());
  batch b{torch::empty({n, fields}, torch::kInt64), torch::empty({n, numerics}), torch::empty({n})};
  auto ids = b.ids.accessor<std::int64_t, 2>();
  auto dense = b.dense.accessor<float, 2>();
  auto labels = b.labels.accessor<float, 1>();
  for (std::int64_t i = 0; i < n; ++i) {
    const auto& example = examples[static_cast<std::size_t>(i)];
    for (std::int64_t f = 0; f < fields; ++f) {
      ids[i][f] = id_of(static_cast<std::size_t>(f), example.categories[static_cast<std::size_t>(f)]);
    }
    for (std::int64_t j = 0; j < numerics; ++j) {
      const auto& v = example.integers[static_cast<std::size_t>(j)];
      dense[i][j] = v ? static_cast<float>(std::log1p(static_cast<double>(std::max<std::int64_t>(*v, 0)))) : 0.0f;
    }
    labels[i] = example.label;
  }
  return b;
}

// A worker's batches (the reference's: one worker): its share of the training files (by file; raw
// ids: by line), parsed, shuffled, batched, made into model inputs and prefetched by a background
// thread; forever.
pscoro::dataset<batch> training_batches(const options& o, pscoro::input_context context) {
  const auto seed = static_cast<std::uint64_t>(o.seed + context.worker_index);
  const auto batch_size = static_cast<std::size_t>(o.batch_size);
  const auto to_batch = [id_of = o.id_of()](const auto& examples) { return make_batch(examples, id_of); };
  if (o.raw_ids()) {
    return criteo::raw_training_examples(o.training_data_dir(), o.files, o.shuffle_buffer, seed, context)
        .batch(batch_size, /*drop_remainder=*/true)
        .map(to_batch)
        .prefetch(4);
  }
  return criteo::training_examples(o.training_data_dir(), o.files, o.file_format(), o.shuffle_buffer, seed, context)
      .batch(batch_size, /*drop_remainder=*/true)
      .map(to_batch)
      .prefetch(4);
}

// Shared by the chief and the workers.
const pscoro::dataset_function<batch> train_data{"dlrm.train_data"};
// (the MLPs' variables, the embedding table, the worker's batches, learning rate) -> mean log loss.
const pscoro::worker_function<double(variable_map, table, pscoro::per_worker_iterator<batch>, double)> train_step{
    "dlrm.train_step"};
// --embedding hash: (the MLPs' variables, the fields' hash tables, batches, learning rate) -> loss.
const pscoro::worker_function<double(variable_map, std::vector<hash_table>, pscoro::per_worker_iterator<batch>,
                                     double)>
    train_hash_step{"dlrm.train_hash_step"};

// A worker's models. A step takes an idle one (or makes one, bound to the variables) and gives it
// back when it has pushed: no two steps share a module's parameters, gradients or lookups. At most
// closures_per_worker models are ever made. Used on the worker's executor only: no lock.
class model_pool {
 public:
  model_pool(std::int64_t dim, std::int64_t hidden, double first_order_scale)
      : dim_(dim), hidden_(hidden), first_order_scale_(first_order_scale) {}

  struct replica {
    dlrm model;
    pscoro::module_variables<float> bound;
    replica(dlrm m, variable_map variables) : model(std::move(m)), bound(*model, std::move(variables)) {}
  };

  std::unique_ptr<replica> take(const variable_map& variables) {
    if (idle_.empty()) {
      ++made_;
      pscoro::print_line(fmt::format("worker: model {} made (as many steps in flight)", made_));
      return std::make_unique<replica>(dlrm(dim_, hidden_, first_order_scale_), variables);
    }
    auto r = std::move(idle_.back());
    idle_.pop_back();
    return r;
  }
  // Only after a step that pushed: a failed step's model (gradients or lookups left) is dropped.
  void give_back(std::unique_ptr<replica> r) { idle_.push_back(std::move(r)); }

 private:
  std::int64_t dim_, hidden_;
  double first_order_scale_;
  std::size_t made_ = 0;
  std::vector<std::unique_ptr<replica>> idle_;
};

// Named outside the coroutines: g++ 12 can fail to compile designated initializers among co_awaits.
const pscoro::hash_lookup_options inserting{.insert = true};
const pscoro::hash_lookup_options reading{};

// A step's rows of the fixed table: [n, 26, dim + 1], requiring grad.
asio::awaitable<torch::Tensor> look_up(pscoro::module_variables<float>& bound, table embedding, const torch::Tensor& ids) {
  auto lookup = bound.embedding_lookup(std::move(embedding), ids);  // named: g++ 12 (co_await temporaries)
  co_return co_await std::move(lookup);
}

// --embedding hash: a step's rows of the fields' tables (new ids admitted by the tables' policy),
// [n, 26, dim + 1], each field's lookup a leaf that requires grad, its gradient stepped by push().
asio::awaitable<torch::Tensor> look_up(pscoro::module_variables<float>& bound, std::vector<hash_table> tables,
                                       const torch::Tensor& ids) {
  std::vector<torch::Tensor> fields_rows;
  for (std::size_t f = 0; f < tables.size(); ++f) {
    const torch::Tensor field_ids = ids.select(1, static_cast<std::int64_t>(f));
    auto lookup = bound.embedding_lookup(tables[f], field_ids, inserting);
    fields_rows.push_back(co_await std::move(lookup));  // [n, dim + 1]
  }
  co_return torch::stack(fields_rows, 1);
}

// The worker side: one training step on the next batch of this worker's pipeline; `embedding` the
// fixed table or the fields' hash tables.
template <class Embedding>
asio::awaitable<double> train(std::shared_ptr<model_pool> pool, pscoro::optimizers::adagrad optimizer,
                              variable_map variables, Embedding embedding, pscoro::per_worker_iterator<batch> batches,
                              double learning_rate) {
  const batch b = co_await batches.next_async();  // off the executor: heartbeats go on
  auto replica = pool->take(variables);
  auto& bound = replica->bound;
  co_await bound.pull();
  auto lookup = look_up(bound, std::move(embedding), b.ids);  // named: g++ 12 (co_await temporaries)
  const torch::Tensor rows = co_await std::move(lookup);       // [n, 26, dim + 1], requires grad
  const torch::Tensor loss = torch::binary_cross_entropy_with_logits(replica->model->forward(b.dense, rows), b.labels);
  loss.backward();
  optimizer.learning_rate = learning_rate;
  auto pushed = bound.push(optimizer);
  co_await std::move(pushed);
  pool->give_back(std::move(replica));
  co_return loss.item<double>();
}

constexpr std::size_t test_chunk = 10000;

template <class Example>
std::vector<Example> chunk_of(const std::vector<Example>& examples, std::size_t first) {
  const auto last = std::min(first + test_chunk, examples.size());
  return {examples.begin() + static_cast<std::ptrdiff_t>(first), examples.begin() + static_cast<std::ptrdiff_t>(last)};
}

void append_scores(std::vector<double>& out, const torch::Tensor& logits) {
  const torch::Tensor z = logits.to(torch::kFloat64).contiguous();
  out.insert(out.end(), z.data_ptr<double>(), z.data_ptr<double>() + z.numel());
}

template <class Example>
std::vector<float> labels_of(const std::vector<Example>& examples) {
  std::vector<float> out;
  for (const auto& e : examples) out.push_back(e.label);
  return out;
}

// The training progress as the chief prints it, every log_every steps: the loss is the mean over
// the steps since the last line, not one batch's loss. One batch of 512 varies by +-0.04 around the
// mean; an asynchronous run that overshoots (docs/design.md, The DLRM example) shows as a mean that
// rises and stays up, which single batches hid.
// "chief: step 500/9000 loss 0.4286 41.2 steps/s ETA 3:23" (a redrawn line on a terminal)
pscoro::progress training_progress(const options& o, std::string label) {
  return pscoro::progress(
      o.steps,
      {.label = std::move(label), .print_every = o.log_every, .loss_window = static_cast<std::size_t>(o.log_every)});
}

// Which hidden units of the two MLPs (after their ReLU) fire for some test example. A unit that
// fires for none is dead: its gradient is 0 for every input, so training cannot revive it. A run
// that overshoots (docs/design.md, The DLRM example) is left with half or more of its top MLP dead.
class live_units {
 public:
  void add(dlrm_impl& model, const torch::Tensor& dense, const torch::Tensor& rows) {
    torch::NoGradGuard no_grad;
    merge(bottom_, fires(model.bottom, dense));
    merge(top_, fires(model.top, model.top_input(dense, rows)));
  }
  std::string describe() const {
    return fmt::format("{} of {} bottom-MLP and {} of {} top-MLP hidden units fire on the test set", count(bottom_),
                       bottom_.numel(), count(top_), top_.numel());
  }

 private:
  static torch::Tensor fires(torch::nn::Sequential& mlp, const torch::Tensor& in) {
    return (mlp->ptr(0)->as<torch::nn::Linear>()->forward(in) > 0).any(0);
  }
  static void merge(torch::Tensor& seen, const torch::Tensor& now) { seen = seen.defined() ? seen.logical_or(now) : now; }
  static std::int64_t count(const torch::Tensor& t) { return t.defined() ? t.sum().item<std::int64_t>() : 0; }
  torch::Tensor bottom_, top_;
};

struct result {
  double auc = 0;
  double seconds = 0;      // training, wall
  double cpu_seconds = 0;  // training, this process (-1: not measured)
  std::string units;       // live_units::describe()
  std::string staleness;   // the cluster's: steps that finished while a step ran
};

double cpu_now() { return static_cast<double>(std::clock()) / CLOCKS_PER_SEC; }

// A reference's test AUC and live units, from its model and table.
template <class Example>
void evaluate_reference(const options& o, dlrm& model, const torch::Tensor& embedding,
                        const criteo::basic_test_set<Example>& test, result& out) {
  torch::NoGradGuard no_grad;
  std::vector<double> scores;
  live_units live;
  for (std::size_t first = 0; first < test.examples.size(); first += test_chunk) {
    const auto b = make_batch(chunk_of(test.examples, first), o.id_of());
    const torch::Tensor rows =
        embedding.index_select(0, b.ids.reshape({-1})).reshape({b.ids.size(0), fields, o.dim + 1});
    append_scores(scores, model->forward(b.dense, rows));
    live.add(*model, b.dense, rows);
  }
  out.units = live.describe();
  out.auc = criteo::auc(scores, labels_of(test.examples));
}

// A reference's model, table and optimizer, from the cluster's initial values: the table a tensor
// whose lookups give sparse gradients (rows not looked up get none), torch::optim::Adagrad with the
// ps's Adagrad settings (Keras's: accumulators from 0.1, epsilon 1e-7).
struct reference_model {
  dlrm model;
  torch::Tensor embedding;
  std::vector<torch::Tensor> parameters;  // the model's, then the table
  torch::optim::Adagrad optimizer;

  reference_model(const options& o, const dlrm& initial, const torch::Tensor& initial_table)
      : model(o.dim, o.hidden, o.first_order_gradient_scale),
        embedding(initial_table.clone().requires_grad_(true)),
        parameters(with_table(model->parameters(), embedding)),
        optimizer(parameters, torch::optim::AdagradOptions(o.learning_rate)
                                  .initial_accumulator_value(o.optimizer().initial_accumulator_value)
                                  .eps(o.optimizer().epsilon)) {
    torch::NoGradGuard no_grad;
    const auto from = initial->named_parameters();
    for (auto& p : model->named_parameters()) p.value().copy_(from[p.key()]);
  }

 private:
  static std::vector<torch::Tensor> with_table(std::vector<torch::Tensor> parameters, const torch::Tensor& table) {
    parameters.push_back(table);
    return parameters;
  }
};

// The same model, data and optimizer in this process with libtorch alone (reference_model), one
// batch after another.
template <class Example>
result train_reference(const options& o, const dlrm& initial, const torch::Tensor& initial_table,
                       const criteo::basic_test_set<Example>& test) {
  reference_model reference(o, initial, initial_table);
  dlrm& model = reference.model;
  torch::Tensor& embedding = reference.embedding;
  std::vector<torch::Tensor>& parameters = reference.parameters;
  torch::optim::Adagrad& optimizer = reference.optimizer;
  auto batches = training_batches(o, {.worker_index = 0, .num_workers = 1}).make_iterator();
  const auto start = std::chrono::steady_clock::now();
  const double cpu_start = cpu_now();
  auto training = training_progress(o, "chief: reference ");
  for (std::int64_t step = 0; step < o.steps; ++step) {
    const auto b = batches.next();
    if (!b) throw std::runtime_error("the reference's training data ended");
    for (auto& p : parameters) p.mutable_grad() = torch::Tensor();
    for (auto& group : optimizer.param_groups()) group.options().set_lr(o.learning_rate_at(step));
    const torch::Tensor rows = torch::embedding(embedding, b->ids, -1, false, /*sparse=*/true);
    const torch::Tensor loss = torch::binary_cross_entropy_with_logits(model->forward(b->dense, rows), b->labels);
    loss.backward();
    optimizer.step();
    training.update(step + 1, loss.item<double>());
  }
  training.finish();
  result out;
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  out.cpu_seconds = cpu_now() - cpu_start;
  evaluate_reference(o, model, embedding, test, out);
  return out;
}

// The reference on `threads` threads: the cluster's algorithm without the cluster. Each thread
// trains on its share of the files (a worker's), and each step copies the model and the rows it
// looks up (a worker's reads), computes the gradients from the copies, and applies them to the
// shared model and table under a lock with the one Adagrad (the ps's update), so that steps overlap
// as the workers' do and read values a few steps old. Its steps/s is what the cluster's would be
// without distribution.
template <class Example>
result train_threaded_reference(const options& o, std::size_t threads, const dlrm& initial,
                                const torch::Tensor& initial_table, const criteo::basic_test_set<Example>& test) {
  reference_model reference(o, initial, initial_table);
  dlrm& model = reference.model;
  torch::Tensor& embedding = reference.embedding;
  torch::optim::Adagrad& optimizer = reference.optimizer;
  std::mutex shared;  // the model, the table, the optimizer, the steps handed out and done, the progress
  std::int64_t started = 0;
  std::int64_t done = 0;
  const auto label = fmt::format("chief: {}-thread reference ", threads);
  auto training = training_progress(o, label);
  const auto start = std::chrono::steady_clock::now();
  std::exception_ptr failure;
  const auto run = [&](std::size_t thread) {
    try {
      dlrm local(o.dim, o.hidden, o.first_order_gradient_scale);
      const std::vector<torch::Tensor> local_parameters = local->parameters();
      const std::vector<torch::Tensor> shared_parameters = model->parameters();
      auto batches =
          training_batches(o, {.worker_index = static_cast<std::int64_t>(thread),
                               .num_workers = static_cast<std::int64_t>(threads)})
              .make_iterator();
      while (true) {
        const auto b = batches.next();
        if (!b) throw std::runtime_error(fmt::format("the {}-thread reference's training data ended", threads));
        std::int64_t step = 0;
        torch::Tensor rows;
        {
          const std::lock_guard lock(shared);
          if (started == o.steps) return;
          step = started++;
          torch::NoGradGuard no_grad;
          for (std::size_t k = 0; k < local_parameters.size(); ++k) local_parameters[k].copy_(shared_parameters[k]);
          rows = embedding.index_select(0, b->ids.reshape({-1}));
        }
        rows = rows.reshape({b->ids.size(0), fields, o.dim + 1}).requires_grad_(true);
        for (const auto& p : local_parameters) p.mutable_grad() = torch::Tensor();
        const torch::Tensor loss = torch::binary_cross_entropy_with_logits(local->forward(b->dense, rows), b->labels);
        loss.backward();
        // The rows' gradient as the table's: sparse, a row per id looked up (repeats summed by
        // Adagrad), as torch::embedding's with sparse=true.
        const torch::Tensor table_gradient = torch::sparse_coo_tensor(
            b->ids.reshape({1, -1}), rows.grad().reshape({-1, o.dim + 1}), embedding.sizes());
        const double value = loss.item<double>();
        const std::lock_guard lock(shared);
        for (std::size_t k = 0; k < local_parameters.size(); ++k) {
          shared_parameters[k].mutable_grad() = local_parameters[k].grad();
        }
        embedding.mutable_grad() = table_gradient;
        for (auto& group : optimizer.param_groups()) group.options().set_lr(o.learning_rate_at(step));
        optimizer.step();
        training.update(++done, value);
      }
    } catch (...) {
      const std::lock_guard lock(shared);
      if (!failure) failure = std::current_exception();
      started = o.steps;  // the others stop at their next step
    }
  };
  std::vector<std::thread> others;
  for (std::size_t t = 1; t < threads; ++t) others.emplace_back(run, t);
  run(0);
  for (auto& t : others) t.join();
  if (failure) std::rethrow_exception(failure);
  training.finish();
  result out;
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  out.cpu_seconds = -1;  // spread over the threads
  evaluate_reference(o, model, embedding, test, out);
  return out;
}

// The initial values of the cluster and of the reference: the MLPs' from libtorch's initializers,
// the fixed table's drawn from a normal law (none with --embedding hash), both seeded.
struct initial_values {
  dlrm model;
  torch::Tensor table;
};
initial_values make_initial(const options& o) {
  torch::manual_seed(static_cast<std::uint64_t>(o.seed));
  dlrm model(o.dim, o.hidden);
  if (o.hashed()) return {std::move(model), torch::Tensor()};  // the hash tables make their own rows
  torch::Tensor t = torch::randn({o.rows, o.dim + 1}) * o.init_stddev;
  t.select(1, o.dim).zero_();  // the first-order weights start at 0
  return {std::move(model), std::move(t)};
}

// The verdict on both runs: prints the lines the README shows and returns the exit code.
int report(const options& o, const std::optional<result>& cluster, const std::optional<result>& reference,
           const std::optional<result>& threaded, double bound, std::size_t workers) {
  int code = 0;
  const result& judged = cluster ? *cluster : *reference;  // the reference when it ran alone
  pscoro::print_line(fmt::format("chief: test AUC {:.4f} (bound {:.4f})", judged.auc, bound));
  const auto line = [&](const char* what, const result& r) {
    std::string text = fmt::format("chief: {:<36} test AUC {:.4f}  {:7.1f} steps/s  ({} steps of {} in {:.1f} s", what,
                                   r.auc, static_cast<double>(o.steps) / r.seconds, static_cast<long long>(o.steps),
                                   static_cast<long long>(o.batch_size), r.seconds);
    if (r.cpu_seconds >= 0) text += fmt::format(", {:.1f} s CPU", r.cpu_seconds);
    pscoro::print_line(text + ")");
  };
  if (cluster) {
    const std::string mode =
        o.max_staleness >= 0 ? fmt::format("staleness <= {}", o.max_staleness) : std::string("asynchronous");
    line(fmt::format("cluster ({} workers, {}):", workers, mode).c_str(), *cluster);
  }
  if (reference) line("reference (one process, libtorch):", *reference);
  if (threaded) {
    line(fmt::format("reference (one process, {} thread{}):", o.threaded_reference,
                     o.threaded_reference == 1 ? "" : "s").c_str(),
         *threaded);
  }
  if (cluster) {
    // Steps/s against each reference that ran: the cost of distribution is the ratio to the
    // threaded one (the same algorithm in one process).
    std::string ratios;
    if (reference) ratios += fmt::format("{:.2f}x the one-thread reference", reference->seconds / cluster->seconds);
    if (threaded) {
      ratios += fmt::format("{}{:.2f}x the {}-thread reference", ratios.empty() ? "" : ", ",
                            threaded->seconds / cluster->seconds, o.threaded_reference);
    }
    if (!ratios.empty()) pscoro::print_line(fmt::format("chief: cluster steps/s: {}", ratios));
  }
  if (cluster) pscoro::print_line(fmt::format("chief: cluster: {}", cluster->units.c_str()));
  if (cluster) pscoro::print_line(fmt::format("chief: cluster: {}", cluster->staleness.c_str()));
  if (reference) pscoro::print_line(fmt::format("chief: reference: {}", reference->units.c_str()));
  if (threaded) {
    pscoro::print_line(fmt::format("chief: {}-thread reference: {}", o.threaded_reference, threaded->units.c_str()));
  }
  if (bound - judged.auc > o.max_auc_gap) {
    pscoro::print_line(fmt::format("chief: the AUC gap {:.4f} to the bound is above the allowed {:.3f}",
                                   bound - judged.auc, o.max_auc_gap),
                       pscoro::log_level::error);
    code = 1;
  }
  if (cluster && reference && std::abs(cluster->auc - reference->auc) > o.max_reference_gap) {
    pscoro::print_line(
        fmt::format("chief: the cluster's AUC is {:.4f} from the reference's, more than the allowed {:.3f}",
                    cluster->auc - reference->auc, o.max_reference_gap));
    code = 1;
  }
  return code;
}

// The model's embeddings on the ps: the fixed table, or the fields' hash tables (--embedding hash).
struct embeddings {
  table fixed;
  std::vector<hash_table> tables;
};

// The rows of a test batch's ids, [n, 26, dim + 1] (reads only: a hash table inserts nothing).
asio::awaitable<torch::Tensor> test_rows(const embeddings& e, const torch::Tensor& ids) {
  const auto n = static_cast<std::size_t>(ids.size(0));
  if (e.tables.empty()) {
    auto lookup = e.fixed.embedding_lookup(xt::adapt(ids.data_ptr<std::int64_t>(), static_cast<std::size_t>(ids.numel()),
                                                     xt::no_ownership(),
                                                     pscoro::shape_type{n, static_cast<std::size_t>(fields)}));
    xt::xarray<float> looked_up = co_await std::move(lookup);
    co_return pscoro::to_torch(std::move(looked_up));
  }
  // Every field's ids in one request per ps (lookup_tables), not 26.
  std::vector<xt::xarray<std::int64_t>> field_ids;
  for (std::int64_t f = 0; f < fields; ++f) {
    const torch::Tensor column = ids.select(1, f).contiguous();
    field_ids.emplace_back(
        xt::adapt(column.data_ptr<std::int64_t>(), n, xt::no_ownership(), pscoro::shape_type{n}));
  }
  auto lookup = pscoro::lookup_tables(e.tables, field_ids, reading);
  std::vector<xt::xarray<float>> looked_up = co_await std::move(lookup);
  std::vector<torch::Tensor> fields_rows;
  for (auto& rows : looked_up) fields_rows.push_back(pscoro::to_torch(std::move(rows)));
  co_return torch::stack(fields_rows, 1);
}

// The cluster's model (its MLPs in `variables`, its embeddings `e`) on `test`: its test AUC and live units.
template <class Example>
asio::awaitable<void> evaluate(const options& o, const variable_map& variables, const embeddings& e,
                               const criteo::basic_test_set<Example>& test, result& out) {
  dlrm trained(o.dim, o.hidden);
  pscoro::module_variables<float> bound(*trained, variables);
  co_await bound.pull();
  std::vector<double> scores;
  live_units live;
  for (std::size_t first = 0; first < test.examples.size(); first += test_chunk) {
    const auto b = make_batch(chunk_of(test.examples, first), o.id_of());
    auto lookup = test_rows(e, b.ids);
    const torch::Tensor rows = co_await std::move(lookup);
    torch::NoGradGuard no_grad;
    append_scores(scores, trained->forward(b.dense, rows));
    live.add(*trained, b.dense, rows);
  }
  out.units = live.describe();
  out.auc = criteo::auc(scores, labels_of(test.examples));
}

// The fields' tables' names (--embedding hash), on the chief and in each ps's report.
std::vector<std::string> field_table_names() {
  std::vector<std::string> out;
  for (std::int64_t f = 0; f < fields; ++f) out.push_back(field_tables::name("dlrm", static_cast<std::size_t>(f)));
  return out;
}

asio::awaitable<int> run_chief(pscoro::parameter_server_strategy& strategy, const options& o) {
  co_await strategy.connect();
  pscoro::coordinator_options coordinator_options;
  coordinator_options.closures_per_worker = o.closures_per_worker;
  if (o.max_staleness >= 0) coordinator_options.max_staleness = static_cast<std::size_t>(o.max_staleness);
  pscoro::cluster_coordinator coordinator(strategy, coordinator_options);
  auto scope = strategy.scope();
  const auto initial = make_initial(o);
  auto variables = co_await pscoro::create_module_variables<float>(scope, *initial.model, "dlrm/");
  std::size_t parameters = 0;
  for (const auto& p : initial.model->parameters()) parameters += static_cast<std::size_t>(p.numel());
  const auto mlps = fmt::format("MLPs 13-{}-{} and {}-{}-1 over {} dot products ({} parameters in {} variables)",
                                o.hidden, o.dim, o.dim + dlrm_impl::pairs, o.hidden, dlrm_impl::pairs, parameters,
                                variables.size());
  embeddings e;
  if (o.hashed()) {
    // Rows [embedding, first-order weight], all drawn from N(0, init_stddev): a table has one
    // initializer, so the first-order weights do not start at 0 as the fixed table's do.
    const auto table_options = o.tables.table_options(
        static_cast<std::size_t>(o.dim + 1),
        pscoro::initializers::random_normal{.stddev = o.init_stddev, .seed = static_cast<std::uint64_t>(o.seed)});
    for (const auto& name : field_table_names()) e.tables.push_back(co_await scope.create_hash_table<float>(name, table_options));
    pscoro::print_line(
        fmt::format("chief: {} hash tables of rows [{} + 1] ({}); {}; {} steps of {} examples on {} workers",
                    static_cast<long long>(fields), static_cast<long long>(o.dim),
                    o.tables.describe().c_str(), mlps.c_str(),
                    static_cast<long long>(o.steps), static_cast<long long>(o.batch_size), strategy.num_workers()));
  } else {
    e.fixed = co_await scope.create_sharded_variable("dlrm/embedding",
                                                     pscoro::to_xarray<float>(pscoro::from_torch(initial.table)));
    pscoro::print_line(
        fmt::format("chief: embedding {} x ({} + 1) in {} shards; {}; {} steps of {} examples on {} workers",
                    static_cast<long long>(o.rows), static_cast<long long>(o.dim), e.fixed.num_shards(), mlps.c_str(),
                    static_cast<long long>(o.steps), static_cast<long long>(o.batch_size), strategy.num_workers()));
  }
  // Every worker builds its input pipeline now, before any step can ask it for a batch.
  const auto batches = co_await coordinator.create_per_worker_dataset(train_data).iter();

  // Every step scheduled at once and its loss retired in order; with --ttl or --capacity a window of
  // them, the tables' clock counting the steps scheduled (field_tables.hpp says why).
  const auto start = std::chrono::steady_clock::now();
  const std::size_t window =
      o.tables.window(o.closures_per_worker * strategy.num_workers(), static_cast<std::size_t>(o.steps));
  const std::int64_t clock_every = o.tables.clock_every();
  std::deque<pscoro::remote_value<double>> losses;
  auto training = training_progress(o, "chief: ");
  std::int64_t retired = 0;
  const auto retire_oldest = [&]() -> asio::awaitable<void> {
    auto loss = std::move(losses.front());
    losses.pop_front();
    const double value = co_await loss.get();
    training.update(++retired, value);
  };
  for (std::int64_t step = 0; step < o.steps; ++step) {
    if (o.tables.clocked() && step % clock_every == 0) {
      co_await field_tables::advance_clocks(e.tables, static_cast<std::uint64_t>(step));
    }
    losses.push_back(o.hashed() ? coordinator.schedule(train_hash_step, variables, e.tables, batches, o.learning_rate_at(step))
                                : coordinator.schedule(train_step, variables, e.fixed, batches, o.learning_rate_at(step)));
    if (losses.size() > window) co_await retire_oldest();
  }
  while (!losses.empty()) co_await retire_oldest();
  co_await coordinator.join();
  training.finish();
  result cluster;
  cluster.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  cluster.cpu_seconds = -1;  // spread over the ps and workers
  const auto staleness = coordinator.metrics().closure_staleness;
  cluster.staleness = fmt::format("steps that finished while a step ran: p50 <= {}, p99 <= {}, max {} (bound: {})",
                                  staleness.p50, staleness.p99, staleness.max,
                                  o.max_staleness >= 0 ? std::to_string(o.max_staleness) : std::string("none"));

  // Test data with the generator's true probabilities: fresh lines far beyond the training lines
  // (raw ids: the lines right after them, the stream's next day).
  const auto seed = static_cast<std::uint64_t>(o.seed);
  const auto count = static_cast<std::size_t>(o.test_examples);
  double best = 0;
  std::optional<result> reference;
  std::optional<result> threaded;
  const auto evaluate_both = [&](const auto& test) -> asio::awaitable<void> {
    co_await evaluate(o, variables, e, test, cluster);
    best = criteo::auc(test.truth, labels_of(test.examples));
    // The ps and workers are idle now: the reference has the machine the cluster had. It trains a
    // fixed table: none beside hash tables.
    if (!o.no_reference && !o.hashed()) {
      reference = train_reference(o, initial.model, initial.table, test);
      if (o.threaded_reference > 0) {
        threaded = train_threaded_reference(o, o.threaded_reference, initial.model, initial.table, test);
      }
    }
  };
  if (o.raw_ids()) {
    const auto test = criteo::make_test_set(criteo::raw_id_generator(seed), count,
                                            static_cast<std::uint64_t>(o.train_examples));
    co_await evaluate_both(test);
  } else {
    const auto test = criteo::make_test_set(criteo::generator(seed), count);
    co_await evaluate_both(test);
  }
  co_return report(o, cluster, reference, threaded, best, strategy.num_workers());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"A DLRM-style model in libtorch on generated Criteo-format data, trained by a pscoro cluster (roles "
               "from TF_CONFIG or Slurm) and by libtorch alone in one process."};
  options o;
  app.add_option("--data-dir", o.data_dir, "where the chief writes the training data (once per seed and size)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // scripts/run.sh sets one; yours wins
  app.add_option("--format", o.format, "the files the workers read")->check(CLI::IsMember({"tsv", "tfrecord"}));
  app.add_option("--ids", o.ids,
                 "the categorical values: criteo (8 hex digits, fixed vocabularies) or raw (64-bit ids, "
                 "vocabularies of millions that drift; TSV only)")
      ->check(CLI::IsMember({"criteo", "raw"}));
  app.add_option("--train-examples", o.train_examples, "lines of training data")->check(CLI::PositiveNumber);
  app.add_option("--files", o.files, "files the training data is split into")->check(CLI::PositiveNumber);
  app.add_option("--steps", o.steps, "training steps (raw ids: 90% of one pass over the training lines unless set)")
      ->check(CLI::PositiveNumber);
  app.add_option("--batch-size", o.batch_size, "examples per step")->check(CLI::PositiveNumber);
  app.add_option("--shuffle-buffer", o.shuffle_buffer, "examples in each worker's shuffle buffer")
      ->check(CLI::PositiveNumber);
  app.add_option("--learning-rate", o.learning_rate, "Adagrad learning rate")->check(CLI::PositiveNumber);
  app.add_option("--initial-accumulator", o.initial_accumulator, "Adagrad's initial accumulator value")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--decay-to", o.decay_to,
                 "after the warm-up the learning rate falls linearly to this fraction of itself at the last step")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--first-order-gradient-scale", o.first_order_gradient_scale,
                 "the first-order weights' gradient is multiplied by this before it goes to Adagrad")
      ->check(CLI::PositiveNumber);
  app.add_option("--warmup-steps", o.warmup_steps, "steps over which the learning rate rises linearly to its value")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--embedding", o.embedding,
                 "fixed: one table of --rows rows, values hashed into it; hash: a hash table per field, keyed by "
                 "the values (no reference)")
      ->check(CLI::IsMember({"fixed", "hash"}));
  app.add_option("--rows", o.rows, "rows of the hashed embedding table")->check(CLI::PositiveNumber);
  o.tables.add_options(app);
  app.add_option("--report-seconds", o.report_seconds,
                 "--embedding hash: each ps reports its part of the tables this often while it changes")
      ->check(CLI::PositiveNumber);
  app.add_option("--dim", o.dim, "embedding width, and the bottom MLP's output")->check(CLI::PositiveNumber);
  app.add_option("--hidden", o.hidden, "width of the MLPs' hidden layers")->check(CLI::PositiveNumber);
  app.add_option("--init-stddev", o.init_stddev, "standard deviation of the embeddings' initial values")
      ->check(CLI::PositiveNumber);
  app.add_option("--seed", o.seed, "seed of the data generator, the initial values and the shuffles");
  app.add_option("--test-examples", o.test_examples, "examples in the test set")->check(CLI::PositiveNumber);
  app.add_option("--max-auc-gap", o.max_auc_gap,
                 "exit 1 if the test AUC ends further than this below the bound (raw ids: 0.05 unless set)");
  app.add_option("--max-reference-gap", o.max_reference_gap,
                 "exit 1 if the cluster's test AUC ends further than this from the reference's");
  app.add_option("--closures-per-worker", o.closures_per_worker, "closures in flight per worker")->check(CLI::PositiveNumber);
  app.add_option("--max-staleness", o.max_staleness,
                 "a step starts only once every step more than N before it has finished (-1: no bound)")
      ->check(CLI::Range(-1LL, 1LL << 40));
  app.add_option("--log-every", o.log_every,
                 "print progress (the mean training loss of the last N steps, steps/s, ETA) every N steps")
      ->check(CLI::PositiveNumber);
  app.add_flag("--no-reference", o.no_reference, "train on the cluster only, not the single-process reference");
  app.add_flag("--reference-only", o.reference_only, "train the single-process reference only (no cluster)");
  app.add_option("--threaded-reference", o.threaded_reference,
                 "after the one-thread reference, train it again on N threads as N workers do (each step reads the "
                 "model, computes its gradients, applies them under a lock) and report the cluster against both")
      ->check(CLI::Range(1, 64));
  if (const auto stop = pscoro::tools::parse_command_line(app, argc, argv)) return *stop;
  if (o.raw_ids() && o.format != "tsv") {
    pscoro::print_line("dlrm: --ids raw: the data is written as TSV only", pscoro::log_level::error);
    return 2;
  }
  if (const auto refusal = o.tables.refusal(o.hashed()); !refusal.empty()) {
    pscoro::print_line(fmt::format("dlrm: {}", refusal), pscoro::log_level::error);
    return 2;
  }
  if (o.hashed() && o.reference_only) {
    pscoro::print_line("dlrm: --reference-only: the reference trains a fixed table, not --embedding hash",
                       pscoro::log_level::error);
    return 2;
  }
  if (o.threaded_reference > 1 && openblas_get_parallel && openblas_get_parallel() == 0) {
    pscoro::print_line(
        fmt::format("dlrm: --threaded-reference {} multiplies on {} threads at once, and this process's BLAS is "
                    "OpenBLAS's serial build (Debian's libopenblas0-serial), which then returns wrong products; "
                    "run it on the pthread build with one thread a call: install libopenblas0-pthread and run with "
                    "LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-pthread OPENBLAS_NUM_THREADS=1",
                    o.threaded_reference, o.threaded_reference),
        pscoro::log_level::error);
    return 2;
  }
  if (o.raw_ids()) {
    // As in the CTR example: raw ids drift, and a second pass would go back in time, to ids the
    // tables may have forgotten; 90% of a pass, as the workers share the steps unevenly. Most raw
    // ids are seen once and no model learns their weights in the truth, so the bound is further.
    if (app.count("--steps") == 0) o.steps = std::max<std::int64_t>(1, o.train_examples * 9 / 10 / o.batch_size);
    if (app.count("--max-auc-gap") == 0) o.max_auc_gap = 0.05;
  }

  try {
    // One libtorch thread per process: the ps and the other workers share the cores.
    torch::set_num_threads(1);
    const auto write_data = [&] {
      const auto seed = static_cast<std::uint64_t>(o.seed);
      const auto dir = o.raw_ids() ? criteo::write_training_data(criteo::raw_id_generator(seed), o.data_dir,
                                                                 o.train_examples, o.files, o.file_format())
                                   : criteo::write_training_data(criteo::generator(seed), o.data_dir, o.train_examples,
                                                                 o.files, o.file_format());
      pscoro::print_line(fmt::format("chief: training data in {} ({} lines in {} {} files)", dir.c_str(),
                                     static_cast<long long>(o.train_examples), o.files,
                                     o.format == "tsv" ? "TSV" : "TFRecord"));
    };
    if (o.reference_only) {
      write_data();
      const auto initial = make_initial(o);
      const auto seed = static_cast<std::uint64_t>(o.seed);
      const auto count = static_cast<std::size_t>(o.test_examples);
      const auto run_alone = [&](const auto& test) {
        const auto reference = train_reference(o, initial.model, initial.table, test);
        std::optional<result> threaded;
        if (o.threaded_reference > 0) {
          threaded = train_threaded_reference(o, o.threaded_reference, initial.model, initial.table, test);
        }
        return report(o, std::nullopt, reference, threaded, criteo::auc(test.truth, labels_of(test.examples)), 0);
      };
      return o.raw_ids() ? run_alone(criteo::make_test_set(criteo::raw_id_generator(seed), count,
                                                           static_cast<std::uint64_t>(o.train_examples)))
                         : run_alone(criteo::make_test_set(criteo::generator(seed), count));
    }
    const auto resolver = pscoro::auto_cluster_resolver();
    if (resolver.task_type() == "ps") {
      std::optional<field_tables::table_report> report;
      if (o.hashed()) {
        report.emplace(fmt::format("ps:{}", resolver.task_id().value_or(0)), field_table_names(),
                       std::chrono::duration<double>(o.report_seconds));
      }
      return pscoro::run_server(resolver);
    }
    if (resolver.task_type() == "worker") {
      return pscoro::run_server(resolver, [&o](pscoro::server& s) {
        s.bind(train_data, [&o](pscoro::input_context context) { return training_batches(o, context); });
        auto pool = std::make_shared<model_pool>(o.dim, o.hidden, o.first_order_gradient_scale);
        s.bind(train_step, [pool, &o](variable_map variables, table embedding,
                                      pscoro::per_worker_iterator<batch> batches, double learning_rate) {
          return train(pool, o.optimizer(), std::move(variables), std::move(embedding), std::move(batches),
                       learning_rate);
        });
        s.bind(train_hash_step, [pool, &o](variable_map variables, std::vector<hash_table> tables,
                                           pscoro::per_worker_iterator<batch> batches, double learning_rate) {
          return train(pool, o.optimizer(), std::move(variables), std::move(tables), std::move(batches),
                       learning_rate);
        });
      });
    }
    // The chief writes the data before the workers are asked to read it (at iter()).
    write_data();
    asio::io_context io;
    // Shards of at least 256 KiB, at most 2 (one per ps of the example cluster): the table is split,
    // the MLPs' small parameters stay whole.
    pscoro::parameter_server_strategy strategy(io.get_executor(), resolver, pscoro::min_size_partitioner{256 << 10, 2});
    return examples::run_chief_to_end(io, strategy, run_chief(strategy, o));
  } catch (const std::exception& e) {
    pscoro::print_line(fmt::format("dlrm: {}", e.what()), pscoro::log_level::error);
    return 1;
  }
}

// Click-through-rate prediction on Criteo-format data with a known ground truth, trained by a pscoro
// cluster: the fashion_mnist example plus sharded embedding tables and optimizers on the ps.
//
// The chief's generator writes the training data once, as Criteo TSV files or as TFRecord files of
// tf.train.Example (the same lines; --format picks which the workers read, --prepare-only writes
// both). Every worker reads its
// share of the files through a per-worker dataset (files -> shard -> parse -> shuffle -> batch ->
// prefetch) and each step takes the next batch of the worker it runs on.
//
// The model is a factorization machine with a wide part (Rendle 2010): per hashed categorical
// value a weight (a [rows, 1] table) and a 16-float factor (a [rows, 16] table, >= 1M rows, 64 MiB),
// plus weights for log1p of the 13 integer features. Both tables are split over the parameter
// servers by min_size_partitioner; workers look up only the rows a batch needs and send sparse
// Adagrad updates, one message per shard. The chief reports the model's test AUC next to the AUC
// of the generator's true probabilities, the best any model can do on this data.
//
// On raw ids (--ids raw: 64-bit ids from vocabularies of up to 10 million values that drift over
// the stream, criteo.hpp), --embedding hash keys the model by the ids themselves: one
// pscoro::hash_table per field, whose row is the value's weight and factor, looked up and stepped
// for all 26 fields in one request per ps; --admission-min-count gives a row only to ids seen that
// often, --ttl forgets ids idle for that many steps, --capacity caps the rows a table holds per ps
// (sampled LRU), --buckets sets the tables' bucket count. Each ps reports what its part of the
// tables holds (rows, bytes per row). --id-lifetime frequency draws raw ids that live longer the
// more frequent they are (criteo.hpp), in a data directory of their own.
//
//   pscoro-launch --ps 2 --workers 2 -- ctr                    # AUC within ~0.01 of the truth
//   pscoro-launch --ps 2 --workers 2 -- ctr --format tfrecord  # the same data from TFRecord files
//   pscoro-launch --ps 2 --workers 2 -- ctr --logdir logs      # and TensorBoard curves
//   pscoro-launch --ps 2 --workers 2 -- ctr --ids raw --embedding hash --ttl 200  # raw ids
#include <pscoro/pscoro.hpp>

#include "chief.hpp"
#include "command_line.hpp"
#include "criteo.hpp"
#include "field_tables.hpp"

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <deque>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace {

namespace criteo = examples::criteo;
namespace field_tables = examples::field_tables;
constexpr std::size_t fields = pscoro::criteo_example::categorical_features;
constexpr std::size_t numerics = pscoro::criteo_example::integer_features;
constexpr std::size_t factor_size = 16;
// A hash table's row: the value's weight of the wide part, then its factor. One row, not a table for
// each: an id costs one entry of the table's map and one id in each request, not two.
constexpr std::size_t row_size = 1 + factor_size;

using table = pscoro::sharded_variable<float>;
using hash_table = pscoro::hash_table<float>;
using dense = pscoro::variable<float>;

// A batch as the model sees it: the categoricals' ids (--embedding fixed: hashed rows; hash: the
// values), log1p of the integers, labels.
struct batch {
  xt::xarray<std::int64_t> ids;  // [n, fields]
  xt::xarray<float> numeric;     // [n, numerics]
  std::vector<float> labels;
  std::size_t size() const { return labels.size(); }
};

// Shared by the chief and the workers.
const pscoro::dataset_function<batch> train_data{"ctr.train_data"};
// (wide, factors, numeric weights, bias, the worker's batches, learning rate) -> mean log loss.
const pscoro::worker_function<double(table, table, dense, dense, pscoro::per_worker_iterator<batch>, double)>
    train_step{"ctr.train_step"};
// --embedding hash: (the fields' tables, numeric weights, bias, batches, learning rate) -> loss.
const pscoro::worker_function<double(std::vector<hash_table>, dense, dense, pscoro::per_worker_iterator<batch>,
                                     double)>
    train_hash_step{"ctr.train_hash_step"};

// The table of field `f` (--embedding hash), on the chief and in each ps's report.
std::string field_table_name(std::size_t f) { return examples::field_tables::name("ctr", f); }

// The model's inputs for `examples` (pscoro::criteo_example or criteo::raw_example).
template <class Example>
batch make_batch(const std::vector<Example>& examples, const criteo::id_mapping& id_of) {
  const std::size_t n = examples.size();
  batch b{xt::zeros<std::int64_t>({n, fields}), xt::zeros<float>({n, numerics}), {}};
  for (std::size_t i = 0; i < n; ++i) {
    const auto& example = examples[i];
    for (std::size_t f = 0; f < fields; ++f) b.ids(i, f) = id_of(f, example.categories[f]);
    for (std::size_t j = 0; j < numerics; ++j) {
      const auto& v = example.integers[j];
      b.numeric(i, j) = v ? static_cast<float>(std::log1p(static_cast<double>(std::max<std::int64_t>(*v, 0)))) : 0.0f;
    }
    b.labels.push_back(example.label);
  }
  return b;
}

// The model's logits for a batch, given the looked-up rows; `sums` receives the per-example sum of
// factors (the backward pass needs it).
std::vector<float> logits(const batch& b, const xt::xarray<float>& wide, const xt::xarray<float>& factors,
                          const xt::xarray<float>& numeric_w, float bias, std::vector<float>* sums = nullptr) {
  std::vector<float> out(b.size());
  if (sums) sums->assign(b.size() * factor_size, 0.0f);
  for (std::size_t i = 0; i < b.size(); ++i) {
    float z = bias;
    for (std::size_t j = 0; j < numerics; ++j) z += numeric_w(j) * b.numeric(i, j);
    std::array<float, factor_size> sum{};
    float squares = 0;
    for (std::size_t f = 0; f < fields; ++f) {
      z += wide(i, f, 0);
      const float* v = &factors(i, f, 0);
      for (std::size_t k = 0; k < factor_size; ++k) {
        sum[k] += v[k];
        squares += v[k] * v[k];
      }
    }
    float pairs = 0;
    for (std::size_t k = 0; k < factor_size; ++k) pairs += sum[k] * sum[k];
    z += 0.5f * (pairs - squares);  // sum over pairs of fields of <v_f, v_g>
    out[i] = z;
    if (sums) std::copy(sum.begin(), sum.end(), sums->begin() + static_cast<std::ptrdiff_t>(i * factor_size));
  }
  return out;
}

float sigmoid(float z) { return 1.0f / (1.0f + std::exp(-z)); }

// A step's mean log loss and its gradients.
struct gradients {
  double loss = 0;
  xt::xarray<float> wide;     // [n * fields, 1]
  xt::xarray<float> factors;  // [n * fields, 16]
  xt::xarray<float> numeric;  // [numerics]
  xt::xarray<float> bias;     // [1]
};

// The model's loss and gradients on a batch, given the looked-up rows.
gradients backward(const batch& b, const xt::xarray<float>& w, const xt::xarray<float>& v, const xt::xarray<float>& nw,
                   float b0) {
  const std::size_t n = b.size();
  std::vector<float> sums;
  const auto z = logits(b, w, v, nw, b0, &sums);

  // Log loss, mean over the batch; d(loss)/d(logit) = (p - y) / n.
  gradients g{0, xt::zeros<float>({n * fields, std::size_t{1}}), xt::zeros<float>({n * fields, factor_size}),
              xt::zeros<float>({numerics}), xt::zeros<float>({std::size_t{1}})};
  for (std::size_t i = 0; i < n; ++i) {
    const float p = sigmoid(z[i]);
    const float y = b.labels[i];
    g.loss -= y * std::log(std::max(p, 1e-7f)) + (1 - y) * std::log(std::max(1 - p, 1e-7f));
    const float d = (p - y) / static_cast<float>(n);
    g.bias(0) += d;
    for (std::size_t j = 0; j < numerics; ++j) g.numeric(j) += d * b.numeric(i, j);
    for (std::size_t f = 0; f < fields; ++f) {
      g.wide(i * fields + f, 0) = d;
      for (std::size_t k = 0; k < factor_size; ++k) {
        g.factors(i * fields + f, k) = d * (sums[i * factor_size + k] - v(i, f, k));
      }
    }
  }
  g.loss /= static_cast<double>(n);
  return g;
}

// The worker side: one training step on the next batch of this worker's pipeline.
asio::awaitable<double> train(table wide, table factors, dense numeric, dense bias,
                              pscoro::per_worker_iterator<batch> batches, double learning_rate) {
  const auto b = co_await batches.next_async();  // off the executor: heartbeats go on
  const std::size_t n = b.size();
  const auto w = co_await wide.embedding_lookup(b.ids);     // [n, fields, 1]
  const auto v = co_await factors.embedding_lookup(b.ids);  // [n, fields, 16]
  const auto nw = co_await numeric.read();
  const auto b0 = co_await bias.read();
  const auto g = backward(b, w, v, nw, b0(0));
  const xt::xarray<std::int64_t> flat_ids = xt::reshape_view(b.ids, {n * fields});
  const pscoro::optimizers::adagrad opt{.learning_rate = learning_rate};
  co_await wide.apply_sparse_gradient(opt, flat_ids, g.wide);
  co_await factors.apply_sparse_gradient(opt, flat_ids, g.factors);
  co_await numeric.apply_gradient(opt, g.numeric);
  co_await bias.apply_gradient(opt, g.bias);
  co_return g.loss;
}

// --embedding hash: each field's ids (column f of the batch's), the keys of its table.
std::vector<xt::xarray<std::int64_t>> field_ids(const batch& b) {
  std::vector<xt::xarray<std::int64_t>> out;
  for (std::size_t f = 0; f < fields; ++f) out.emplace_back(xt::view(b.ids, xt::all(), f));
  return out;
}

// The fields' rows ([n, row_size] each) as the model's [n, fields, 1] and [n, fields, 16]. (Row-major
// arrays walked by pointer: indexing an xarray element by element costs more than the model.)
std::pair<xt::xarray<float>, xt::xarray<float>> split_rows(const std::vector<xt::xarray<float>>& rows, std::size_t n) {
  xt::xarray<float> wide = xt::xarray<float>::from_shape({n, fields, std::size_t{1}});
  xt::xarray<float> factors = xt::xarray<float>::from_shape({n, fields, factor_size});
  for (std::size_t f = 0; f < fields; ++f) {
    const float* row = rows[f].data();
    for (std::size_t i = 0; i < n; ++i, row += row_size) {
      wide.data()[i * fields + f] = row[0];
      std::copy(row + 1, row + row_size, factors.data() + (i * fields + f) * factor_size);
    }
  }
  return {std::move(wide), std::move(factors)};
}

// The gradients of the fields' rows ([n, row_size] each), the inverse of split_rows.
std::vector<xt::xarray<float>> field_gradients(const gradients& g, std::size_t n) {
  std::vector<xt::xarray<float>> out;
  for (std::size_t f = 0; f < fields; ++f) {
    xt::xarray<float> rows = xt::xarray<float>::from_shape({n, row_size});
    float* row = rows.data();
    for (std::size_t i = 0; i < n; ++i, row += row_size) {
      row[0] = g.wide.data()[i * fields + f];
      const float* factor = g.factors.data() + (i * fields + f) * factor_size;
      std::copy(factor, factor + factor_size, row + 1);
    }
    out.push_back(std::move(rows));
  }
  return out;
}

// Named outside the coroutines: g++ 12 can fail to compile designated initializers among co_awaits.
const pscoro::hash_lookup_options inserting{.insert = true};
const pscoro::hash_lookup_options reading{};

// The worker side of --embedding hash: the same step, the 26 fields' rows looked up (new ids
// admitted by the tables' policy) and stepped in one request per ps each.
asio::awaitable<double> train_hash(std::vector<hash_table> tables, dense numeric, dense bias,
                                   pscoro::per_worker_iterator<batch> batches, double learning_rate) {
  const auto b = co_await batches.next_async();
  const auto ids = field_ids(b);
  const auto rows = co_await pscoro::lookup_tables(tables, ids, inserting);
  const auto nw = co_await numeric.read();
  const auto b0 = co_await bias.read();
  const auto [w, v] = split_rows(rows, b.size());
  const auto g = backward(b, w, v, nw, b0(0));
  const pscoro::optimizers::adagrad opt{.learning_rate = learning_rate};
  co_await pscoro::apply_gradients_to_tables(opt, tables, ids, field_gradients(g, b.size()));
  co_await numeric.apply_gradient(opt, g.numeric);
  co_await bias.apply_gradient(opt, g.bias);
  co_return g.loss;
}

struct options {
  std::string data_dir = "ctr-data";
  std::string format = "tsv";
  std::string ids = "criteo";
  std::string id_lifetime = "fixed";
  std::int64_t train_examples = 1000000;
  std::size_t files = 8;
  bool gzip = false;
  bool prepare_only = false;
  std::int64_t steps = 3000;
  std::int64_t batch_size = 512;
  std::size_t shuffle_buffer = 10000;
  double learning_rate = 0.2;
  std::string embedding = "fixed";
  std::int64_t rows = 1 << 20;
  examples::field_tables::policies tables;  // --admission-min-count, --ttl, --capacity, --buckets
  double report_seconds = 5;
  std::int64_t seed = 2026;
  std::int64_t test_examples = 100000;
  double max_auc_gap = 0.02;
  std::size_t closures_per_worker = 4;
  std::int64_t log_every = 500;
  std::string logdir;
  std::string checkpoint_dir;
  std::int64_t checkpoint_every = 1000;
  std::size_t max_to_keep = 3;
  std::size_t full_every = 1;        // hash tables: one save in N whole, the others incremental
  std::string on_ps_loss = "fail";  // or "restore": from the newest checkpoint, in place

  bool raw_ids() const { return ids == "raw"; }
  criteo::id_lifetime lifetimes() const {
    return id_lifetime == "frequency" ? criteo::id_lifetime::frequency : criteo::id_lifetime::fixed;
  }
  criteo::raw_id_generator raw_data() const {
    return criteo::raw_id_generator(static_cast<std::uint64_t>(seed), lifetimes());
  }
  bool hashed() const { return embedding == "hash"; }
  criteo::file_format file_format() const {
    if (format == "tsv") return criteo::file_format::tsv;
    return gzip ? criteo::file_format::tfrecord_gzip : criteo::file_format::tfrecord;
  }
  std::filesystem::path training_data_dir() const {
    return criteo::training_data_dir(data_dir, static_cast<std::uint64_t>(seed), train_examples, files, file_format(),
                                     raw_ids() ? criteo::id_form::raw : criteo::id_form::criteo, lifetimes());
  }
  criteo::id_mapping id_of() const { return {hashed() ? 0 : static_cast<std::size_t>(rows)}; }
};

// A worker's batches: its share of the training files (by file; raw ids: by line), parsed,
// shuffled, batched, made into model inputs and prefetched by a background thread; forever, the
// chief decides how many steps to take.
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

// What a field's table is made with (--embedding hash): a row per id, [wide weight, factor], all
// drawn from N(0, 0.01) (the fixed tables start the wide weights at 0; one initializer per table).
pscoro::hash_table_options table_options(const options& o) {
  return o.tables.table_options(row_size, pscoro::initializers::random_normal{.stddev = 0.01, .seed = 1});
}

// The model's variables: the embedding tables of one kind or the other, the dense weights.
struct model {
  table wide, factors;              // --embedding fixed: one hashed table for all fields, each
  std::vector<hash_table> tables;   // --embedding hash: one per field, rows [weight, factor]
  dense numeric, bias;
};

// The model's logits for `b` (the chief's test; reads only: a hash table inserts nothing).
asio::awaitable<std::vector<float>> predict(const model& m, const batch& b, const xt::xarray<float>& nw, float b0) {
  if (m.tables.empty()) {
    const auto w = co_await m.wide.embedding_lookup(b.ids);
    const auto v = co_await m.factors.embedding_lookup(b.ids);
    co_return logits(b, w, v, nw, b0);
  }
  const auto rows = co_await pscoro::lookup_tables(m.tables, field_ids(b), reading);
  const auto [w, v] = split_rows(rows, b.size());
  co_return logits(b, w, v, nw, b0);
}

// The model's test AUC on `test`, in chunks of 10,000 examples.
template <class Example>
asio::awaitable<double> test_auc(const model& m, const criteo::basic_test_set<Example>& test, const options& o) {
  const auto nw = co_await m.numeric.read();
  const auto b0 = co_await m.bias.read();
  std::vector<double> model_scores;
  std::vector<float> labels;
  constexpr std::size_t chunk = 10000;
  for (std::size_t first = 0; first < test.examples.size(); first += chunk) {
    const std::vector<Example> examples(
        test.examples.begin() + static_cast<std::ptrdiff_t>(first),
        test.examples.begin() + static_cast<std::ptrdiff_t>(std::min(first + chunk, test.examples.size())));
    const auto b = make_batch(examples, o.id_of());
    for (const float z : co_await predict(m, b, nw, b0(0))) model_scores.push_back(z);
    labels.insert(labels.end(), b.labels.begin(), b.labels.end());
  }
  co_return criteo::auc(model_scores, labels);
}

asio::awaitable<int> run_chief(pscoro::parameter_server_strategy& strategy, const options& o) {
  co_await strategy.connect();
  pscoro::cluster_coordinator coordinator(strategy, {o.closures_per_worker});
  auto scope = strategy.scope();
  model m;
  const auto rows = static_cast<std::size_t>(o.rows);
  const pscoro::shape_type wide_shape{rows, 1}, factor_shape{rows, factor_size}, numeric_shape{numerics},
      bias_shape{1};
  if (o.hashed()) {
    const auto table_opts = table_options(o);
    for (std::size_t f = 0; f < fields; ++f) {
      m.tables.push_back(co_await scope.create_hash_table<float>(field_table_name(f), table_opts));
    }
    pscoro::print_line(
        fmt::format("chief: {} hash tables of rows [weight, {} factors] ({}); {} steps of {} examples on {} workers",
                    fields, factor_size, o.tables.describe().c_str(),
                    static_cast<long long>(o.steps), static_cast<long long>(o.batch_size), strategy.num_workers()));
  } else {
    m.wide = co_await scope.create_sharded_variable<float>("ctr/wide", wide_shape, pscoro::initializers::zeros{});
    m.factors = co_await scope.create_sharded_variable<float>(
        "ctr/factors", factor_shape, pscoro::initializers::random_normal{.stddev = 0.01, .seed = 1});
    pscoro::print_line(
        fmt::format("chief: factors {} x {} in {} shards, wide in {} shards; {} steps of {} examples on {} workers",
                    rows, factor_size, m.factors.num_shards(), m.wide.num_shards(), static_cast<long long>(o.steps),
                    static_cast<long long>(o.batch_size), strategy.num_workers()));
  }
  m.numeric = co_await scope.create_variable<float>("ctr/numeric", numeric_shape, pscoro::initializers::zeros{});
  m.bias = co_await scope.create_variable<float>("ctr/bias", bias_shape, pscoro::initializers::zeros{});
  // With a checkpoint directory: resume from its newest checkpoint, and save one every
  // checkpoint_every steps (hash tables: only their changed rows, but one save in full_every).
  pscoro::checkpoint ckpt(strategy);
  if (o.hashed()) {
    for (const auto& table : m.tables) ckpt.track(table);
  } else {
    ckpt.track(m.wide).track(m.factors);
  }
  ckpt.track(m.numeric).track(m.bias);
  std::optional<pscoro::checkpoint_manager> manager;
  std::int64_t first_step = 0;
  if (!o.checkpoint_dir.empty()) {
    manager.emplace(ckpt, o.checkpoint_dir, o.max_to_keep, o.full_every);
    // --on-ps-loss restore: a ps that dies and comes back (pscoro-launch --restart-ps) gets its
    // shards and table parts from the newest checkpoint; the other ps keep theirs.
    if (o.on_ps_loss == "restore") {
      manager->restore_lost_ps({.wait_for_ps = std::chrono::minutes(5),
                                .on_restored = [](const pscoro::ps_restore_report& r) {
                                  pscoro::print_line(fmt::format("chief: {} restored from {} (step {}) in {:.1f} s",
                                                                 r.ps, r.checkpoint.string(), r.step, r.seconds));
                                }});
    }
    if (const auto latest = manager->latest_checkpoint()) {
      co_await ckpt.restore(*latest);
      first_step = std::min(ckpt.step(), o.steps);
      pscoro::print_line(fmt::format("chief: resumed from {} at step {}", latest->string(), first_step));
    }
  }
  // Every worker builds its input pipeline now, before any step can ask it for a batch.
  const auto batches = co_await coordinator.create_per_worker_dataset(train_data).iter();

  // With --logdir: the sampled losses, the learning rate and the test AUCs as TensorBoard curves.
  std::optional<pscoro::summary_writer> summaries;
  if (!o.logdir.empty()) summaries.emplace(o.logdir);
  // Keep the workers busy with a window of scheduled steps and retire each step's result in order;
  // with --ttl or --capacity the tables' clock counts the steps scheduled (field_tables.hpp says why).
  const std::int64_t clock_every = o.tables.clock_every();
  const auto started = std::chrono::steady_clock::now();
  const std::size_t in_flight_at_most = o.closures_per_worker * strategy.num_workers();
  const std::size_t window = o.tables.window(in_flight_at_most, std::max<std::size_t>(64, 4 * in_flight_at_most));
  // "chief: step 500/3000 loss 0.6123 812.3 steps/s ETA 3s" every log_every steps (a redrawn line
  // on a terminal): the loss is the mean of the last 100 steps'.
  pscoro::progress report(o.steps, {.label = "chief: ", .print_every = o.log_every});
  std::deque<std::pair<std::int64_t, pscoro::remote_value<double>>> in_flight;
  auto retire_oldest = [&]() -> asio::awaitable<void> {
    auto [step, loss] = std::move(in_flight.front());
    in_flight.pop_front();
    const double value = co_await loss.get();
    report.update(step, value);
    if (step % o.log_every == 0 || step == o.steps) {
      if (summaries) {
        summaries->scalar("train/loss", value, step);
        summaries->scalar("train/learning_rate", o.learning_rate, step);
      }
    }
  };
  for (std::int64_t step = first_step; step < o.steps; ++step) {
    if (o.tables.clocked() && step % clock_every == 0) {
      co_await field_tables::advance_clocks(m.tables, static_cast<std::uint64_t>(step));
    }
    in_flight.emplace_back(step + 1, o.hashed() ? coordinator.schedule(train_hash_step, m.tables, m.numeric, m.bias,
                                                                       batches, o.learning_rate)
                                                : coordinator.schedule(train_step, m.wide, m.factors, m.numeric,
                                                                       m.bias, batches, o.learning_rate));
    if (in_flight.size() > window) co_await retire_oldest();
    if (manager && ((step + 1) % o.checkpoint_every == 0 || step + 1 == o.steps)) {
      while (!in_flight.empty()) co_await retire_oldest();
      co_await coordinator.join();  // a consistent snapshot: no step is updating the model
      ckpt.set_step(step + 1);
      const auto path = co_await manager->save(step + 1);
      pscoro::print_line(fmt::format("chief: saved {}", path.string()));
    }
  }
  while (!in_flight.empty()) co_await retire_oldest();
  co_await coordinator.join();
  report.finish();
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - started;
  pscoro::print_line(fmt::format("chief: trained {} steps in {:.1f} s: {:.1f} steps/s", o.steps - first_step,
                                 took.count(), static_cast<double>(o.steps - first_step) / took.count()));

  // Test data with the generator's true probabilities: fresh lines far beyond the training lines
  // (raw ids: the lines right after them, the stream's next day).
  double model_auc = 0, best_auc = 0;
  std::size_t examples = 0;
  const auto seed = static_cast<std::uint64_t>(o.seed);
  const auto count = static_cast<std::size_t>(o.test_examples);
  const auto evaluate = [&](const auto& test) -> asio::awaitable<void> {
    model_auc = co_await test_auc(m, test, o);
    std::vector<float> labels;
    for (const auto& example : test.examples) labels.push_back(example.label);
    best_auc = criteo::auc(test.truth, labels);
    examples = labels.size();
  };
  if (o.raw_ids()) {
    co_await evaluate(criteo::make_test_set(o.raw_data(), count,
                                            static_cast<std::uint64_t>(o.train_examples)));
  } else {
    co_await evaluate(criteo::make_test_set(criteo::generator(seed), count));
  }
  pscoro::print_line(fmt::format("chief: test AUC {:.4f}, ground truth {:.4f} (gap {:.4f}) on {} examples", model_auc,
                                 best_auc, best_auc - model_auc, examples));
  if (summaries) {
    summaries->scalar("test/auc", model_auc, o.steps);
    summaries->scalar("test/ground_truth_auc", best_auc, o.steps);
    summaries->close();
  }
  if (best_auc - model_auc > o.max_auc_gap) {
    pscoro::print_line(
        fmt::format("chief: the AUC gap {:.4f} is above the allowed {:.3f}", best_auc - model_auc, o.max_auc_gap),
        pscoro::log_level::error);
    co_return 1;
  }
  co_return 0;
}

// The fields' tables' names (--embedding hash), for each ps's report.
std::vector<std::string> field_table_names() {
  std::vector<std::string> out;
  for (std::size_t f = 0; f < fields; ++f) out.push_back(field_table_name(f));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "A factorization machine on generated Criteo-format data with a pscoro cluster (roles from TF_CONFIG or Slurm)."};
  options o;
  app.add_option("--data-dir", o.data_dir, "where the chief writes the training data (once per seed and size)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // scripts/run.sh sets one; yours wins
  app.add_option("--format", o.format, "the files the workers read")->check(CLI::IsMember({"tsv", "tfrecord"}));
  app.add_option("--ids", o.ids,
                 "the categorical values: criteo (8 hex digits, fixed vocabularies) or raw (64-bit ids, "
                 "vocabularies of millions that drift; TSV only)")
      ->check(CLI::IsMember({"criteo", "raw"}));
  app.add_option("--id-lifetime", o.id_lifetime,
                 "raw ids: how long an id past a field's 100 most frequent values lives: fixed (100,000 lines) or "
                 "frequency (longer the more frequent: 100,000 x max(1, 10,000 / rank) lines; data of its own)")
      ->check(CLI::IsMember({"fixed", "frequency"}));
  app.add_option("--train-examples", o.train_examples, "lines of training data")->check(CLI::PositiveNumber);
  app.add_option("--files", o.files, "files the training data is split into")->check(CLI::PositiveNumber);
  app.add_flag("--gzip", o.gzip, "GZIP-compress the TFRecord files");
  app.add_flag("--prepare-only", o.prepare_only,
               "write the training data as TSV and as TFRecord (raw ids: TSV) and exit (no cluster)");
  app.add_option("--steps", o.steps, "training steps (raw ids: 90% of one pass over the training lines unless set)")
      ->check(CLI::PositiveNumber);
  app.add_option("--batch-size", o.batch_size, "examples per step")->check(CLI::PositiveNumber);
  app.add_option("--shuffle-buffer", o.shuffle_buffer, "examples in each worker's shuffle buffer")
      ->check(CLI::PositiveNumber);
  app.add_option("--learning-rate", o.learning_rate, "Adagrad learning rate")->check(CLI::PositiveNumber);
  app.add_option("--embedding", o.embedding,
                 "fixed: one table of --rows rows, values hashed into it; hash: a hash table per field, keyed by "
                 "the values")
      ->check(CLI::IsMember({"fixed", "hash"}));
  app.add_option("--rows", o.rows, "rows of the hashed embedding tables")->check(CLI::PositiveNumber);
  o.tables.add_options(app);
  app.add_option("--report-seconds", o.report_seconds,
                 "--embedding hash: each ps reports its part of the tables this often while it changes")
      ->check(CLI::PositiveNumber);
  app.add_option("--seed", o.seed, "seed of the data generator and of the shuffles");
  app.add_option("--test-examples", o.test_examples, "examples in the test set")->check(CLI::PositiveNumber);
  app.add_option("--max-auc-gap", o.max_auc_gap,
                 "exit 1 if the test AUC ends further than this below the truth's (raw ids: 0.05 unless set)");
  app.add_option("--closures-per-worker", o.closures_per_worker, "closures in flight per worker")->check(CLI::PositiveNumber);
  app.add_option("--log-every", o.log_every, "print progress (mean loss, steps/s, ETA) every N steps")->check(CLI::PositiveNumber);
  app.add_option("--logdir", o.logdir, "write TensorBoard events (loss, learning rate, test AUC) here");
  auto* checkpoint_dir = app.add_option("--checkpoint-dir", o.checkpoint_dir,
                                        "save checkpoints here, and resume from the newest one found at the start");
  app.add_option("--checkpoint-every", o.checkpoint_every, "steps between checkpoints")->check(CLI::PositiveNumber);
  app.add_option("--max-to-keep", o.max_to_keep, "checkpoints kept (0: all)");
  app.add_option("--full-every", o.full_every,
                 "--embedding hash: one checkpoint in N holds the tables whole, the others only the rows changed")
      ->check(CLI::PositiveNumber);
  app.add_option("--on-ps-loss", o.on_ps_loss,
                 "what a lost ps does: fail the run (TF's way), or restore it in place from the newest checkpoint "
                 "(with --checkpoint-dir; the ps must come back at its address)")
      ->check(CLI::IsMember({"fail", "restore"}))
      ->needs(checkpoint_dir);
  if (const auto stop = pscoro::tools::parse_command_line(app, argc, argv)) return *stop;
  if (o.raw_ids() && o.format != "tsv") {
    pscoro::print_line("ctr: --ids raw: the data is written as TSV only", pscoro::log_level::error);
    return 2;
  }
  if (const auto refusal = o.tables.refusal(o.hashed()); !refusal.empty()) {
    pscoro::print_line(fmt::format("ctr: {}", refusal), pscoro::log_level::error);
    return 2;
  }
  if (o.raw_ids()) {
    // Raw ids drift: a second pass would go back in time, to ids the tables may have forgotten. So
    // 90% of one pass: the workers share the steps unevenly, and the one that takes more must not
    // start its lines again.
    if (app.count("--steps") == 0) o.steps = std::max<std::int64_t>(1, o.train_examples * 9 / 10 / o.batch_size);
    // The truth gives every id a weight, and most raw ids are seen once: no model learns theirs
    // (1M lines end ~0.03 below the truth, with either embedding).
    if (app.count("--max-auc-gap") == 0) o.max_auc_gap = 0.05;
  }

  try {
    const auto write_data = [&](criteo::file_format format) {
      const auto seed = static_cast<std::uint64_t>(o.seed);
      const auto dir = o.raw_ids()
                           ? criteo::write_training_data(o.raw_data(), o.data_dir, o.train_examples, o.files, format)
                           : criteo::write_training_data(criteo::generator(seed), o.data_dir, o.train_examples, o.files,
                                                         format);
      pscoro::print_line(fmt::format("chief: training data in {} ({} lines in {} {} files)", dir.c_str(),
                                     static_cast<long long>(o.train_examples), o.files,
                                     format == criteo::file_format::tsv ? "TSV" : "TFRecord"));
    };
    if (o.prepare_only) {
      write_data(criteo::file_format::tsv);
      if (!o.raw_ids()) write_data(o.gzip ? criteo::file_format::tfrecord_gzip : criteo::file_format::tfrecord);
      return 0;
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
        s.bind(train_step, train);
        s.bind(train_hash_step, train_hash);
      });
    }
    // The chief writes the data before the workers are asked to read it (at iter()).
    write_data(o.file_format());
    asio::io_context io;
    // Shards of at least 256 KiB, at most 2 (one per ps of the example cluster).
    pscoro::parameter_server_strategy strategy(io.get_executor(), resolver, pscoro::min_size_partitioner{256 << 10, 2});
    return examples::run_chief_to_end(io, strategy, run_chief(strategy, o));
  } catch (const std::exception& e) {
    pscoro::print_line(fmt::format("ctr: {}", e.what()), pscoro::log_level::error);
    return 1;
  }
}

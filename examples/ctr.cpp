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
//   pscoro-launch --ps 2 --workers 2 -- ctr                    # AUC within ~0.01 of the truth
//   pscoro-launch --ps 2 --workers 2 -- ctr --format tfrecord  # the same data from TFRecord files
//   pscoro-launch --ps 2 --workers 2 -- ctr --logdir logs      # and TensorBoard curves
#include <pscoro/pscoro.hpp>

#include "chief.hpp"
#include "command_line.hpp"
#include "criteo.hpp"

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace {

namespace criteo = examples::criteo;
constexpr std::size_t fields = pscoro::criteo_example::categorical_features;
constexpr std::size_t numerics = pscoro::criteo_example::integer_features;
constexpr std::size_t factor_size = 16;

using table = pscoro::sharded_variable<float>;
using dense = pscoro::variable<float>;

// A batch as the model sees it: hashed rows of the categoricals, log1p of the integers, labels.
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

// The model's inputs for `examples`, with tables of `rows` rows.
batch make_batch(const std::vector<pscoro::criteo_example>& examples, std::size_t rows) {
  const std::size_t n = examples.size();
  batch b{xt::zeros<std::int64_t>({n, fields}), xt::zeros<float>({n, numerics}), {}};
  for (std::size_t i = 0; i < n; ++i) {
    const auto& example = examples[i];
    for (std::size_t f = 0; f < fields; ++f) b.ids(i, f) = criteo::hashed_row(f, example.categories[f], rows);
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

// The worker side: one training step on the next batch of this worker's pipeline.
asio::awaitable<double> train(table wide, table factors, dense numeric, dense bias,
                              pscoro::per_worker_iterator<batch> batches, double learning_rate) {
  const auto b = co_await batches.next_async();  // off the executor: heartbeats go on
  const std::size_t n = b.size();
  const auto w = co_await wide.embedding_lookup(b.ids);     // [n, fields, 1]
  const auto v = co_await factors.embedding_lookup(b.ids);  // [n, fields, 16]
  const auto nw = co_await numeric.read();
  const auto b0 = co_await bias.read();
  std::vector<float> sums;
  const auto z = logits(b, w, v, nw, b0(0), &sums);

  // Log loss, mean over the batch; d(loss)/d(logit) = (p - y) / n.
  double loss = 0;
  xt::xarray<float> grad_wide = xt::zeros<float>({n * fields, std::size_t{1}});
  xt::xarray<float> grad_factors = xt::zeros<float>({n * fields, factor_size});
  xt::xarray<float> grad_numeric = xt::zeros<float>({numerics});
  xt::xarray<float> grad_bias = xt::zeros<float>({std::size_t{1}});
  for (std::size_t i = 0; i < n; ++i) {
    const float p = sigmoid(z[i]);
    const float y = b.labels[i];
    loss -= y * std::log(std::max(p, 1e-7f)) + (1 - y) * std::log(std::max(1 - p, 1e-7f));
    const float d = (p - y) / static_cast<float>(n);
    grad_bias(0) += d;
    for (std::size_t j = 0; j < numerics; ++j) grad_numeric(j) += d * b.numeric(i, j);
    for (std::size_t f = 0; f < fields; ++f) {
      grad_wide(i * fields + f, 0) = d;
      for (std::size_t k = 0; k < factor_size; ++k) {
        grad_factors(i * fields + f, k) = d * (sums[i * factor_size + k] - v(i, f, k));
      }
    }
  }
  const xt::xarray<std::int64_t> flat_ids = xt::reshape_view(b.ids, {n * fields});
  const pscoro::optimizers::adagrad opt{.learning_rate = learning_rate};
  co_await wide.apply_sparse_gradient(opt, flat_ids, grad_wide);
  co_await factors.apply_sparse_gradient(opt, flat_ids, grad_factors);
  co_await numeric.apply_gradient(opt, grad_numeric);
  co_await bias.apply_gradient(opt, grad_bias);
  co_return loss / static_cast<double>(n);
}

struct options {
  std::string data_dir = "ctr-data";
  std::string format = "tsv";
  std::int64_t train_examples = 1000000;
  std::size_t files = 8;
  bool gzip = false;
  bool prepare_only = false;
  std::int64_t steps = 3000;
  std::int64_t batch_size = 512;
  std::size_t shuffle_buffer = 10000;
  double learning_rate = 0.2;
  std::int64_t rows = 1 << 20;
  std::int64_t seed = 2026;
  std::int64_t test_examples = 100000;
  double max_auc_gap = 0.02;
  std::size_t closures_per_worker = 4;
  std::int64_t log_every = 500;
  std::string logdir;

  criteo::file_format file_format() const {
    if (format == "tsv") return criteo::file_format::tsv;
    return gzip ? criteo::file_format::tfrecord_gzip : criteo::file_format::tfrecord;
  }
};

// A worker's batches: its share of the training files (by file), parsed, shuffled, batched, made
// into model inputs and prefetched by a background thread; forever, the chief decides how many
// steps to take.
pscoro::dataset<batch> training_batches(const options& o, pscoro::input_context context) {
  const auto seed = static_cast<std::uint64_t>(o.seed + context.worker_index);
  const auto format = o.file_format();
  const auto dir = criteo::training_data_dir(o.data_dir, static_cast<std::uint64_t>(o.seed), o.train_examples,
                                             o.files, format);
  return criteo::training_examples(dir, o.files, format, o.shuffle_buffer, seed, context)
      .batch(static_cast<std::size_t>(o.batch_size), /*drop_remainder=*/true)
      .map([rows = static_cast<std::size_t>(o.rows)](const std::vector<pscoro::criteo_example>& examples) {
        return make_batch(examples, rows);
      })
      .prefetch(4);
}

asio::awaitable<int> run_chief(pscoro::parameter_server_strategy& strategy, const options& o) {
  co_await strategy.connect();
  pscoro::cluster_coordinator coordinator(strategy, {o.closures_per_worker});
  auto scope = strategy.scope();
  const auto rows = static_cast<std::size_t>(o.rows);
  const pscoro::shape_type wide_shape{rows, 1}, factor_shape{rows, factor_size}, numeric_shape{numerics},
      bias_shape{1};
  auto wide = co_await scope.create_sharded_variable<float>("ctr/wide", wide_shape, pscoro::initializers::zeros{});
  auto factors = co_await scope.create_sharded_variable<float>(
      "ctr/factors", factor_shape, pscoro::initializers::random_normal{.stddev = 0.01, .seed = 1});
  auto numeric = co_await scope.create_variable<float>("ctr/numeric", numeric_shape, pscoro::initializers::zeros{});
  auto bias = co_await scope.create_variable<float>("ctr/bias", bias_shape, pscoro::initializers::zeros{});
  std::printf("chief: factors %zu x %zu in %zu shards, wide in %zu shards; %lld steps of %lld examples on %zu workers\n",
              rows, factor_size, factors.num_shards(), wide.num_shards(), static_cast<long long>(o.steps),
              static_cast<long long>(o.batch_size), strategy.num_workers());
  // Every worker builds its input pipeline now, before any step can ask it for a batch.
  const auto batches = co_await coordinator.create_per_worker_dataset(train_data).iter();

  std::vector<std::pair<std::int64_t, pscoro::remote_value<double>>> progress;
  for (std::int64_t step = 0; step < o.steps; ++step) {
    auto loss = coordinator.schedule(train_step, wide, factors, numeric, bias, batches, o.learning_rate);
    if ((step + 1) % o.log_every == 0 || step + 1 == o.steps) progress.emplace_back(step + 1, std::move(loss));
  }
  // With --logdir: the sampled losses, the learning rate and the test AUCs as TensorBoard curves.
  std::optional<pscoro::summary_writer> summaries;
  if (!o.logdir.empty()) summaries.emplace(o.logdir);
  for (auto& [step, loss] : progress) {
    const double value = co_await loss.get();
    std::printf("chief: step %lld/%lld loss %.4f\n", static_cast<long long>(step), static_cast<long long>(o.steps),
                value);
    std::fflush(stdout);
    if (summaries) {
      summaries->scalar("train/loss", value, step);
      summaries->scalar("train/learning_rate", o.learning_rate, step);
    }
  }
  co_await coordinator.join();

  // Test data: fresh lines of the generator, far beyond the training lines, with their true
  // probabilities.
  const auto test = criteo::make_test_set(criteo::generator(static_cast<std::uint64_t>(o.seed)),
                                          static_cast<std::size_t>(o.test_examples));
  const auto nw = co_await numeric.read();
  const auto b0 = co_await bias.read();
  std::vector<double> model_scores;
  std::vector<float> labels;
  constexpr std::size_t chunk = 10000;
  for (std::size_t first = 0; first < test.examples.size(); first += chunk) {
    const std::vector<pscoro::criteo_example> examples(
        test.examples.begin() + static_cast<std::ptrdiff_t>(first),
        test.examples.begin() + static_cast<std::ptrdiff_t>(std::min(first + chunk, test.examples.size())));
    const auto b = make_batch(examples, rows);
    const auto w = co_await wide.embedding_lookup(b.ids);
    const auto v = co_await factors.embedding_lookup(b.ids);
    for (const float z : logits(b, w, v, nw, b0(0))) model_scores.push_back(z);
    labels.insert(labels.end(), b.labels.begin(), b.labels.end());
  }
  const double model_auc = criteo::auc(model_scores, labels);
  const double best_auc = criteo::auc(test.truth, labels);
  std::printf("chief: test AUC %.4f, ground truth %.4f (gap %.4f) on %zu examples\n", model_auc, best_auc,
              best_auc - model_auc, labels.size());
  if (summaries) {
    summaries->scalar("test/auc", model_auc, o.steps);
    summaries->scalar("test/ground_truth_auc", best_auc, o.steps);
    summaries->close();
  }
  if (best_auc - model_auc > o.max_auc_gap) {
    std::printf("chief: the AUC gap %.4f is above the allowed %.3f\n", best_auc - model_auc, o.max_auc_gap);
    co_return 1;
  }
  co_return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "A factorization machine on generated Criteo-format data with a pscoro cluster (roles from TF_CONFIG or Slurm)."};
  options o;
  app.add_option("--data-dir", o.data_dir, "where the chief writes the training data (once per seed and size)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // scripts/run.sh sets one; yours wins
  app.add_option("--format", o.format, "the files the workers read")->check(CLI::IsMember({"tsv", "tfrecord"}));
  app.add_option("--train-examples", o.train_examples, "lines of training data")->check(CLI::PositiveNumber);
  app.add_option("--files", o.files, "files the training data is split into")->check(CLI::PositiveNumber);
  app.add_flag("--gzip", o.gzip, "GZIP-compress the TFRecord files");
  app.add_flag("--prepare-only", o.prepare_only, "write the training data as TSV and as TFRecord and exit (no cluster)");
  app.add_option("--steps", o.steps, "training steps")->check(CLI::PositiveNumber);
  app.add_option("--batch-size", o.batch_size, "examples per step")->check(CLI::PositiveNumber);
  app.add_option("--shuffle-buffer", o.shuffle_buffer, "examples in each worker's shuffle buffer")
      ->check(CLI::PositiveNumber);
  app.add_option("--learning-rate", o.learning_rate, "Adagrad learning rate")->check(CLI::PositiveNumber);
  app.add_option("--rows", o.rows, "rows of the hashed embedding tables")->check(CLI::PositiveNumber);
  app.add_option("--seed", o.seed, "seed of the data generator and of the shuffles");
  app.add_option("--test-examples", o.test_examples, "examples in the test set")->check(CLI::PositiveNumber);
  app.add_option("--max-auc-gap", o.max_auc_gap, "exit 1 if the test AUC ends further than this below the truth's");
  app.add_option("--closures-per-worker", o.closures_per_worker, "closures in flight per worker")->check(CLI::PositiveNumber);
  app.add_option("--log-every", o.log_every, "print the loss every N steps")->check(CLI::PositiveNumber);
  app.add_option("--logdir", o.logdir, "write TensorBoard events (loss, learning rate, test AUC) here");
  if (const auto stop = pscoro::tools::parse_command_line(app, argc, argv)) return *stop;

  try {
    const auto write_data = [&](criteo::file_format format) {
      const auto dir = criteo::write_training_data(criteo::generator(static_cast<std::uint64_t>(o.seed)), o.data_dir,
                                                   o.train_examples, o.files, format);
      std::printf("chief: training data in %s (%lld lines in %zu %s files)\n", dir.c_str(),
                  static_cast<long long>(o.train_examples), o.files, format == criteo::file_format::tsv ? "TSV" : "TFRecord");
      std::fflush(stdout);
    };
    if (o.prepare_only) {
      write_data(criteo::file_format::tsv);
      write_data(o.gzip ? criteo::file_format::tfrecord_gzip : criteo::file_format::tfrecord);
      return 0;
    }
    const auto resolver = pscoro::auto_cluster_resolver();
    if (resolver.task_type() == "ps") return pscoro::run_server(resolver);
    if (resolver.task_type() == "worker") {
      return pscoro::run_server(resolver, [&o](pscoro::server& s) {
        s.bind(train_data, [&o](pscoro::input_context context) { return training_batches(o, context); });
        s.bind(train_step, train);
      });
    }
    // The chief writes the data before the workers are asked to read it (at iter()).
    write_data(o.file_format());
    asio::io_context io;
    // Shards of at least 256 KiB, at most 2 (one per ps of the example cluster).
    pscoro::parameter_server_strategy strategy(io.get_executor(), resolver, pscoro::min_size_partitioner{256 << 10, 2});
    return examples::run_chief_to_end(io, strategy, run_chief(strategy, o));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ctr: %s\n", e.what());
    return 1;
  }
}

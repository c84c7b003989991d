// Softmax regression on Fashion-MNIST, trained by a pscoro cluster.
//
// The weights live on the parameter servers. Every worker reads its shard of the training files
// through its own input pipeline (a per-worker dataset: IDX files -> shard -> cache -> shuffle ->
// batch -> prefetch); each step takes a batch from the worker's iterator, pulls the weights, computes the
// gradient with xtensor and pushes the update. The chief schedules the steps, reports progress
// (pscoro::progress) and the test-set accuracy; with --logdir it writes TensorBoard curves (loss,
// accuracy, steps/s, learning rate); with --checkpoint-dir it saves checkpoints as it goes and
// resumes from the newest at the start (fashion_mnist_evaluator evaluates them on the side). One
// binary plays every role, chosen by TF_CONFIG (or by Slurm's variables under srun):
//
//   pscoro-launch --ps 2 --workers 2 -- fashion_mnist --steps 3000 --checkpoint-dir ckpts --logdir logs
//
// `fashion_mnist --one-thread` trains with the same math and batches in one thread of one process,
// the data in memory, no cluster; `--in-process-threads 2` the same on 2 threads, each step
// reading the weights and applying its gradient as a worker does: what the cluster is measured
// against (benchmarks/fashion_mnist_bench runs all three from this one binary, so the math is the
// same machine code).
#include <pscoro/pscoro.hpp>

#include "chief.hpp"
#include "command_line.hpp"
#include "fashion_mnist.hpp"

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <exception>
#include <mutex>
#include <numeric>
#include <optional>
#include <random>
#include <thread>
#include <tuple>
#include <vector>

namespace {

using namespace examples::fashion_mnist;

// What a step returns: its batch's mean loss and the share of the batch it classified right
// (before its update).
struct step_result {
  double loss = 0;
  double accuracy = 0;
};

}  // namespace

template <>
struct pscoro::codec<step_result> : pscoro::member_codec<step_result, &step_result::loss, &step_result::accuracy> {
  static constexpr std::string_view name = "fashion_mnist.step_result";
};

namespace {

// Shared by the chief and the workers.
const pscoro::dataset_function<batch> train_data{"fashion_mnist.train_data"};
// (weights, bias, the worker's batches, learning rate) -> loss and accuracy.
const pscoro::worker_function<step_result(pscoro::variable<float>, pscoro::variable<float>,
                                          pscoro::per_worker_iterator<batch>, double)>
    train_step{"fashion_mnist.train_step"};
// The same, and counts itself: adds 1 to entry `step` of `runs`.
const pscoro::worker_function<step_result(pscoro::variable<float>, pscoro::variable<float>,
                                          pscoro::per_worker_iterator<batch>, double, std::int64_t,
                                          pscoro::variable<std::int64_t>)>
    counted_train_step{"fashion_mnist.counted_train_step"};

// The worker side: one training step on the next batch of this worker's pipeline.
asio::awaitable<step_result> train(pscoro::variable<float> w, pscoro::variable<float> b,
                                   pscoro::per_worker_iterator<batch> batches, double learning_rate) {
  const auto [x, labels] = co_await batches.next_async();  // off the executor: heartbeats go on
  const auto weights = co_await w.read();
  const auto bias = co_await b.read();
  const auto math = sgd_step_math(x, labels, weights, bias, learning_rate);
  co_await w.assign_sub(math.grad_w);
  co_await b.assign_sub(math.grad_b);
  co_return step_result{math.loss, static_cast<double>(math.right) / static_cast<double>(labels.size())};
}

// A step whose worker is lost runs again elsewhere (at least once): `runs` tells how often each did.
asio::awaitable<step_result> counted_train(pscoro::variable<float> w, pscoro::variable<float> b,
                                           pscoro::per_worker_iterator<batch> batches, double learning_rate,
                                           std::int64_t step, pscoro::variable<std::int64_t> runs) {
  const auto result = co_await train(std::move(w), std::move(b), std::move(batches), learning_rate);
  const xt::xarray<std::int64_t> this_step{step}, once{1};
  co_await runs.scatter_add(this_step, once);
  co_return result;
}

struct options {
  std::string data_dir = default_data_dir;
  std::int64_t steps = 3000;
  std::int64_t batch_size = 100;
  double learning_rate = 0.3;
  double min_accuracy = 0.80;
  std::size_t closures_per_worker = 2;
  long long max_staleness = -1;  // -1: none (fully asynchronous)
  std::int64_t log_every = 500;
  std::string checkpoint_dir;
  std::string logdir;
  std::int64_t checkpoint_every = 500;
  std::size_t max_to_keep = 5;
  std::string on_ps_loss = "fail";  // or "restore": from the newest checkpoint, in place
  bool count_runs = false;
  bool one_thread = false;
  std::size_t in_process_threads = 0;  // 0: the cluster
};

// The reference: the same steps on `threads` threads of this process, the training split in
// memory, each thread drawing batches from its own shuffle of it (reshuffled every epoch), the
// chief's learning-rate schedule. With more than one thread it is the cluster's math without the
// cluster: each step copies the weights (a worker's read), computes the gradient from the copy and
// applies it whole under a lock (the ps's update), so steps overlap as a worker's do. Prints
// progress and the test accuracy as the chief does ("one thread: " or "2 threads: " for "chief: ").
int train_in_process(const options& o, std::size_t threads) {
  const auto train = load_split(o.data_dir, "train");
  const auto test = load_split(o.data_dir, "t10k");
  const auto batch_size = static_cast<std::size_t>(o.batch_size);
  const std::size_t n = train.labels.size();
  const std::string label = threads == 1 ? "one thread: " : fmt::format("{} threads: ", threads);
  xt::xarray<float> w = xt::zeros<float>({pixels, classes});
  xt::xarray<float> b = xt::zeros<float>({classes});
  std::mutex model;  // w, b, the steps handed out and done, the progress
  std::int64_t started = 0;
  std::int64_t done = 0;
  pscoro::print_line(fmt::format("{}{} steps of {} images", label, static_cast<long long>(o.steps),
                                 static_cast<long long>(o.batch_size)));
  pscoro::progress report(o.steps, {.label = label, .print_every = o.log_every});
  const auto train_steps = [&](std::size_t thread) {
    std::vector<std::size_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::mt19937_64 random(42 + thread);
    std::size_t next = n;
    xt::xarray<float> x = xt::xarray<float>::from_shape({batch_size, pixels});
    xt::xarray<std::int64_t> labels = xt::xarray<std::int64_t>::from_shape({batch_size});
    xt::xarray<float> w_read;
    xt::xarray<float> b_read;
    while (true) {
      std::int64_t step = 0;
      {
        const std::lock_guard lock(model);
        if (started == o.steps) return;
        step = started++;
        w_read = w;
        b_read = b;
      }
      for (std::size_t r = 0; r < batch_size; ++r) {
        if (next == n) {
          std::shuffle(order.begin(), order.end(), random);
          next = 0;
        }
        const std::size_t i = order[next++];
        std::copy_n(&train.pixels(i, 0), pixels, &x(r, 0));
        labels(r) = train.labels(i);
      }
      const double learning_rate = o.learning_rate * static_cast<double>(o.steps - step) / static_cast<double>(o.steps);
      const auto math = sgd_step_math(x, labels, w_read, b_read, learning_rate);
      const std::lock_guard lock(model);
      w -= math.grad_w;
      b -= math.grad_b;
      report.update(++done, math.loss);
    }
  };
  std::exception_ptr failure;  // the first thread's: the others stop at their next step
  const auto run = [&](std::size_t thread) {
    try {
      train_steps(thread);
    } catch (...) {
      const std::lock_guard lock(model);
      if (!failure) failure = std::current_exception();
      started = o.steps;
    }
  };
  std::vector<std::thread> others;
  for (std::size_t t = 1; t < threads; ++t) others.emplace_back(run, t);
  run(0);
  for (auto& t : others) t.join();
  if (failure) std::rethrow_exception(failure);
  report.finish();
  const auto [acc, images] = accuracy(test, w, b);
  pscoro::print_line(fmt::format("{}test accuracy {:.4f} on {} images", label, acc, images));
  if (acc < o.min_accuracy) {
    pscoro::print_line(fmt::format("{}accuracy {:.4f} is below the required {:.2f}", label, acc, o.min_accuracy),
                       pscoro::log_level::error);
    return 1;
  }
  return 0;
}

asio::awaitable<int> run_chief(pscoro::parameter_server_strategy& strategy, const options& o) {
  co_await strategy.connect();
  pscoro::coordinator_options coordinator_options;
  coordinator_options.closures_per_worker = o.closures_per_worker;
  if (o.max_staleness >= 0) coordinator_options.max_staleness = static_cast<std::size_t>(o.max_staleness);
  pscoro::cluster_coordinator coordinator(strategy, coordinator_options);
  auto scope = strategy.scope();
  const xt::xarray<float> zero_weights = xt::zeros<float>({pixels, classes});
  const xt::xarray<float> zero_bias = xt::zeros<float>({classes});
  auto w = co_await scope.create_variable("softmax/weights", zero_weights);
  auto b = co_await scope.create_variable("softmax/bias", zero_bias);
  pscoro::print_line(fmt::format("chief: weights on ps:{}, bias on ps:{}; {} steps of {} images on {} workers",
                                 w.ps_task(), b.ps_task(), static_cast<long long>(o.steps),
                                 static_cast<long long>(o.batch_size), strategy.num_workers()));
  // With a checkpoint directory: resume from its newest checkpoint, and save one every
  // checkpoint_every steps (the sidecar evaluator watches the directory).
  pscoro::checkpoint ckpt(strategy);
  ckpt.track(w).track(b);
  std::optional<pscoro::checkpoint_manager> manager;
  std::int64_t first_step = 0;
  if (!o.checkpoint_dir.empty()) {
    manager.emplace(ckpt, o.checkpoint_dir, o.max_to_keep);
    // --on-ps-loss restore: a ps that dies and comes back (pscoro-launch --restart-ps) gets its
    // variables from the newest checkpoint; the other ps keep theirs, and training goes on.
    if (o.on_ps_loss == "restore") {
      manager->restore_lost_ps(
          {.wait_for_ps = std::chrono::minutes(5), .on_restored = [](const pscoro::ps_restore_report& r) {
             pscoro::print_line(fmt::format("chief: {} restored from {} (step {}) in {:.1f} s", r.ps.c_str(),
                                            r.checkpoint.c_str(), static_cast<long long>(r.step), r.seconds));
           }});
    }
    if (const auto latest = manager->latest_checkpoint()) {
      co_await ckpt.restore(*latest);
      first_step = std::min(ckpt.step(), o.steps);
      pscoro::print_line(
          fmt::format("chief: resumed from {} at step {}", latest->c_str(), static_cast<long long>(first_step)));
    }
  }
  // Every worker builds its input pipeline now, before any step can ask it for a batch.
  const auto batches = co_await coordinator.create_per_worker_dataset(train_data).iter();
  // With --count-runs: how often each step ran (not checkpointed: it counts the steps of this run).
  std::optional<pscoro::variable<std::int64_t>> runs;
  if (o.count_runs) {
    const xt::xarray<std::int64_t> none = xt::zeros<std::int64_t>({static_cast<std::size_t>(o.steps)});
    runs = co_await scope.create_variable("train/runs_per_step", none);
  }

  // With --logdir: TensorBoard curves of the training steps (steps counted from 1).
  std::optional<pscoro::summary_writer> summaries;
  if (!o.logdir.empty()) {
    summaries.emplace(o.logdir);
    pscoro::print_line(fmt::format("chief: TensorBoard events in {}", summaries->path().c_str()));
  }
  // "chief: step 500/3000 loss 0.6123 812.3 steps/s ETA 3s" every log_every steps (a redrawn
  // line on a terminal): the loss is the mean of the last 100 steps'.
  pscoro::progress report(o.steps, {.initial_step = first_step, .label = "chief: ", .print_every = o.log_every});

  // Keep the workers busy with a window of scheduled steps; await every result in order (each
  // resolves, whatever worker it ran on or how often), reporting as training goes.
  const std::size_t window = std::max<std::size_t>(64, 4 * o.closures_per_worker * strategy.num_workers());
  struct scheduled_step {
    std::int64_t step;
    double learning_rate;
    pscoro::remote_value<step_result> result;
  };
  std::deque<scheduled_step> in_flight;
  auto retire_oldest = [&]() -> asio::awaitable<void> {
    auto oldest = std::move(in_flight.front());
    in_flight.pop_front();
    const auto result = co_await oldest.result.get();
    report.update(oldest.step, result.loss);
    if (summaries) {
      summaries->scalar("train/loss", result.loss, oldest.step);
      summaries->scalar("train/accuracy", result.accuracy, oldest.step);
      summaries->scalar("train/learning_rate", oldest.learning_rate, oldest.step);
      if (oldest.step % o.log_every == 0 || oldest.step == o.steps) {
        summaries->scalar("train/steps_per_second", report.steps_per_second(), oldest.step);
      }
    }
  };
  for (std::int64_t step = first_step; step < o.steps; ++step) {
    // Linear decay to zero: the last steps settle instead of jumping around the optimum.
    const double learning_rate = o.learning_rate * static_cast<double>(o.steps - step) / static_cast<double>(o.steps);
    in_flight.push_back({step + 1, learning_rate,
                         runs ? coordinator.schedule(counted_train_step, w, b, batches, learning_rate, step, *runs)
                              : coordinator.schedule(train_step, w, b, batches, learning_rate)});
    if (in_flight.size() > window) co_await retire_oldest();
    if (manager && ((step + 1) % o.checkpoint_every == 0 || step + 1 == o.steps)) {
      while (!in_flight.empty()) co_await retire_oldest();
      co_await coordinator.join();  // a consistent snapshot: no step is updating the weights
      ckpt.set_step(step + 1);
      const auto path = co_await manager->save(step + 1);
      report.interrupt();  // on a terminal, the progress line ends first
      pscoro::print_line(fmt::format("chief: saved {}", path.c_str()));
    }
  }
  while (!in_flight.empty()) co_await retire_oldest();
  co_await coordinator.join();
  report.finish();

  // At least once: every step of this run ran; some ran again after their worker was lost.
  std::int64_t never = 0;
  if (runs) {
    const auto counts = co_await runs->read();
    std::int64_t once = 0, again = 0;
    for (std::int64_t step = first_step; step < o.steps; ++step) {
      const auto n = counts(static_cast<std::size_t>(step));
      (n == 0 ? never : n == 1 ? once : again) += 1;
    }
    pscoro::print_line(fmt::format("chief: steps {}-{} ran: {} once, {} again after a worker was lost, {} never",
                                   static_cast<long long>(first_step + 1), static_cast<long long>(o.steps),
                                   static_cast<long long>(once), static_cast<long long>(again),
                                   static_cast<long long>(never)));
  }

  const auto weights = co_await w.read();
  const auto bias = co_await b.read();
  const auto [acc, images] = accuracy(load_split(o.data_dir, "t10k"), weights, bias);
  pscoro::print_line(fmt::format("chief: test accuracy {:.4f} on {} images", acc, images));
  const auto staleness = coordinator.metrics().closure_staleness;
  pscoro::print_line(
      fmt::format("chief: steps that finished while a step ran: p50 <= {}, p99 <= {}, max {} (bound: {})",
                  static_cast<unsigned long long>(staleness.p50), static_cast<unsigned long long>(staleness.p99),
                  static_cast<unsigned long long>(staleness.max),
                  o.max_staleness >= 0 ? std::to_string(o.max_staleness).c_str() : "none"));
  if (summaries) {
    summaries->scalar("test/accuracy", acc, o.steps);
    summaries->close();
  }
  if (never > 0) {
    pscoro::print_line(fmt::format("chief: {} steps never ran", static_cast<long long>(never)));
    co_return 1;
  }
  if (acc < o.min_accuracy) {
    pscoro::print_line(fmt::format("chief: accuracy {:.4f} is below the required {:.2f}", acc, o.min_accuracy),
                       pscoro::log_level::error);
    co_return 1;
  }
  co_return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Softmax regression on Fashion-MNIST with a pscoro cluster (roles from TF_CONFIG or Slurm)."};
  options o;
  app.add_option("--data-dir", o.data_dir, "directory of the gzipped IDX files");
  app.add_option("--steps", o.steps, "training steps")->check(CLI::PositiveNumber);
  app.add_option("--batch-size", o.batch_size, "images per step")->check(CLI::PositiveNumber);
  app.add_option("--learning-rate", o.learning_rate, "initial SGD learning rate (decays linearly to 0)")
      ->check(CLI::PositiveNumber);
  app.add_option("--min-accuracy", o.min_accuracy, "exit 1 if the test accuracy ends below this");
  app.add_option("--closures-per-worker", o.closures_per_worker, "closures in flight per worker")->check(CLI::PositiveNumber);
  app.add_option("--max-staleness", o.max_staleness,
                 "a step starts only once every step more than N before it has finished (-1: no bound)")
      ->check(CLI::Range(-1LL, 1LL << 40));
  app.add_option("--log-every", o.log_every, "print the loss every N steps")->check(CLI::PositiveNumber);
  auto* checkpoint_dir = app.add_option("--checkpoint-dir", o.checkpoint_dir,
                                        "save checkpoints here, and resume from the newest one found at the start");
  auto* logdir =
      app.add_option("--logdir", o.logdir, "write TensorBoard events (loss, accuracy, steps/s, learning rate) here");
  app.add_option("--checkpoint-every", o.checkpoint_every, "steps between checkpoints")->check(CLI::PositiveNumber);
  app.add_option("--max-to-keep", o.max_to_keep, "checkpoints kept (0: all)");
  app.add_option("--on-ps-loss", o.on_ps_loss,
                 "what a lost ps does: fail the run (TF's way), or restore it in place from the newest checkpoint "
                 "(with --checkpoint-dir; the ps must come back at its address)")
      ->check(CLI::IsMember({"fail", "restore"}))
      ->needs(checkpoint_dir);
  auto* count_runs = app.add_flag("--count-runs", o.count_runs,
                                  "count how often each step runs (a [steps] table on a ps); fail if one never ran");
  // What the cluster is measured against (benchmarks/fashion_mnist_bench), and what a user can time
  // their cluster against: the example's own math, so both run the same machine code.
  auto* one_thread = app.add_flag("--one-thread", o.one_thread,
                                  "no cluster: the same steps in one thread of this process, the data in memory (the "
                                  "reference)")
                         ->excludes(checkpoint_dir, logdir, count_runs);
  app.add_option("--in-process-threads", o.in_process_threads,
                 "no cluster: the same steps on N threads of this process, each reading the weights, computing its "
                 "gradient and applying it as a worker does (the reference for N workers)")
      ->check(CLI::Range(1, 64))
      ->excludes(one_thread, checkpoint_dir, logdir, count_runs);
  if (const auto stop = pscoro::tools::parse_command_line(app, argc, argv)) return *stop;

  try {
    if (o.one_thread || o.in_process_threads > 0) return train_in_process(o, o.one_thread ? 1 : o.in_process_threads);
    const auto resolver = pscoro::auto_cluster_resolver();
    if (resolver.task_type() == "ps") return pscoro::run_server(resolver);
    // TF's evaluator (a Kubeflow TFJob Evaluator replica) is a side job, never a second chief: it
    // evaluates the chief's checkpoints as they appear, until the last step's.
    if (resolver.task_type() == "evaluator") {
      if (o.checkpoint_dir.empty()) {
        pscoro::print_line("fashion_mnist: the evaluator task evaluates checkpoints: give it --checkpoint-dir",
                           pscoro::log_level::error);
        return 2;
      }
      return run_sidecar_evaluator({.checkpoint_dir = o.checkpoint_dir, .data_dir = o.data_dir, .until_step = o.steps});
    }
    if (resolver.task_type() == "worker") {
      return pscoro::run_server(resolver, [&o](pscoro::server& s) {
        // This worker's half (third, ...) of the training images, decoded once and reshuffled
        // every epoch, forever: the chief decides how many steps to take.
        s.bind(train_data, [dir = o.data_dir, size = static_cast<std::size_t>(o.batch_size)](pscoro::input_context c) {
          return training_batches(dir, c.num_workers, c.worker_index, size);
        });
        s.bind(train_step, train);
        s.bind(counted_train_step, counted_train);
      });
    }
    asio::io_context io;
    pscoro::parameter_server_strategy strategy(io.get_executor(), resolver);
    return examples::run_chief_to_end(io, strategy, run_chief(strategy, o));
  } catch (const std::exception& e) {
    pscoro::print_line(fmt::format("fashion_mnist: {}", e.what()), pscoro::log_level::error);
    return 1;
  }
}

// The program of the hash table kill test: one binary for every role (TF_CONFIG). Its chief trains
// a dynamic embedding table on ids drawn from a long-tailed law, step by step on its own executor
// (so that a run is a pure function of the step range), saving a checkpoint every few steps, and
// resumes from the newest one when there is one, into whatever number of ps it now has. With
// --full-every F, one save in F is whole and the others are increments on the save before.
//
//   table_trainer --steps N --checkpoint-dir DIR [--every K] [--full-every F] [--step-delay-ms MS]
//
// Each step looks up (inserting) the step's ids, steps them with Adagrad on gradients made from the
// rows read, and moves the table's clock to the step (rows idle for 30 steps drop). At the end the
// chief prints "table_trainer: digest <hex> of <n> rows held": a digest of the rows of every id
// any step drew, read without inserting, so two runs that end with the same table print the same
// digest whatever their ps count, and whether or not they were interrupted and resumed.
#include <pscoro/pscoro.hpp>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace {

constexpr std::size_t dim = 8;
constexpr std::size_t ids_per_step = 512;

struct options {
  std::int64_t steps = 200;
  std::int64_t every = 20;
  std::int64_t full_every = 1;
  std::filesystem::path checkpoint_dir;
  int step_delay_ms = 0;
};

// Step `step`'s ids: a Zipf-like law over raw 64-bit ids (id k of the law spread over the whole
// int64 range), with a vocabulary that drifts as steps go on, so rows appear and go idle.
std::vector<std::int64_t> ids_of_step(std::int64_t step) {
  std::mt19937_64 random(static_cast<std::uint64_t>(step) * 0x9e3779b97f4a7c15ULL + 1);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  std::vector<std::int64_t> out;
  for (std::size_t k = 0; k < ids_per_step; ++k) {
    const auto rank = static_cast<std::int64_t>(std::pow(5000.0, uniform(random)));  // ~1/rank
    const std::int64_t drifted = rank + (rank > 50 ? step * 7 : 0);  // the tail moves on
    out.push_back(static_cast<std::int64_t>(static_cast<std::uint64_t>(drifted) * 0xbf58476d1ce4e5b9ULL));
  }
  return out;
}

pscoro::hash_table_options table_options() {
  pscoro::hash_table_options o;
  o.dim = dim;
  o.initializer = pscoro::initializers::random_normal{.stddev = 0.1, .seed = 3};
  o.eviction = pscoro::eviction::ttl{.max_idle = 30};
  o.buckets = 256;
  return o;
}

std::uint64_t fnv1a(std::uint64_t h, const void* data, std::size_t size) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < size; ++i) h = (h ^ p[i]) * 0x100000001b3ULL;
  return h;
}

asio::awaitable<int> run_chief(pscoro::parameter_server_strategy& strategy, options o) {
  co_await strategy.connect();
  const auto table = co_await strategy.scope().create_hash_table<float>("users", table_options());
  pscoro::checkpoint ckpt;
  ckpt.track(table);
  pscoro::checkpoint_manager manager(ckpt, o.checkpoint_dir, 2, static_cast<std::size_t>(o.full_every));
  std::int64_t first = 0;
  if (const auto latest = manager.latest_checkpoint()) {
    co_await ckpt.restore(*latest);
    first = ckpt.step();
    std::printf("table_trainer: resumed from %s at step %lld on %zu ps\n", latest->c_str(),
                static_cast<long long>(first), strategy.num_ps());
  }
  const pscoro::optimizer opt = pscoro::optimizers::adagrad{.learning_rate = 0.05};
  asio::steady_timer delay(co_await asio::this_coro::executor);
  for (std::int64_t step = first; step < o.steps; ++step) {
    const auto raw = ids_of_step(step);
    const xt::xarray<std::int64_t> ids = xt::adapt(raw, std::vector<std::size_t>{raw.size()});
    const xt::xarray<float> rows = co_await table.lookup(ids, {.insert = true});
    // A gradient of the rows themselves plus a pull towards a target of the id's sign: the rows
    // move, and differently for each id.
    xt::xarray<float> gradient = rows;
    for (std::size_t k = 0; k < raw.size(); ++k) {
      for (std::size_t j = 0; j < dim; ++j) gradient(k, j) += raw[k] < 0 ? 0.1f : -0.1f;
    }
    co_await table.apply_gradients(opt, ids, gradient);
    co_await table.advance_clock(static_cast<std::uint64_t>(step + 1));
    if ((step + 1) % o.every == 0) {
      ckpt.set_step(step + 1);
      const auto path = co_await manager.save(step + 1);
      const pscoro::checkpoint_reader saved(path);
      const std::string kind = saved.base() ? "an increment on " + saved.base()->path.string() : std::string("whole");
      std::printf("table_trainer: saved %s (%s)\n", path.c_str(), kind.c_str());
      std::fflush(stdout);
    }
    if (o.step_delay_ms > 0) {
      delay.expires_after(std::chrono::milliseconds(o.step_delay_ms));
      co_await delay.async_wait(asio::use_awaitable);
    }
  }
  std::set<std::int64_t> every_id;
  for (std::int64_t step = 0; step < o.steps; ++step) {
    for (const auto id : ids_of_step(step)) every_id.insert(id);
  }
  const std::vector<std::int64_t> all(every_id.begin(), every_id.end());
  const xt::xarray<std::int64_t> ids = xt::adapt(all, std::vector<std::size_t>{all.size()});
  const xt::xarray<float> rows = co_await table.lookup(ids);
  std::size_t held = 0;
  for (std::size_t k = 0; k < all.size(); ++k) {
    bool zero = true;
    for (std::size_t j = 0; j < dim; ++j) zero = zero && rows(k, j) == 0.0f;
    held += zero ? 0 : 1;
  }
  std::printf("table_trainer: digest %016llx of %zu rows held\n",
              static_cast<unsigned long long>(fnv1a(0xcbf29ce484222325ULL, rows.data(), rows.size() * sizeof(float))),
              held);
  co_return 0;
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const char* value = argv[i + 1];
    if (flag == "--steps") {
      o.steps = std::atoll(value);
    } else if (flag == "--every") {
      o.every = std::atoll(value);
    } else if (flag == "--full-every") {
      o.full_every = std::atoll(value);
    } else if (flag == "--checkpoint-dir") {
      o.checkpoint_dir = value;
    } else if (flag == "--step-delay-ms") {
      o.step_delay_ms = std::atoi(value);
    } else {
      throw pscoro::error(pscoro::errc::invalid_argument, "table_trainer: unknown flag " + flag);
    }
  }
  if (o.checkpoint_dir.empty() || o.every <= 0 || o.full_every <= 0) {
    throw pscoro::error(pscoro::errc::invalid_argument,
                        "table_trainer: --checkpoint-dir, and a positive --every and --full-every");
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const auto resolver = pscoro::auto_cluster_resolver();
    if (resolver.task_type() != "chief") return pscoro::run_server(resolver);
    const options o = parse(argc, argv);
    asio::io_context io;
    pscoro::parameter_server_strategy strategy(io.get_executor(), resolver);
    int exit_code = 1;
    asio::co_spawn(io, run_chief(strategy, o), [&](std::exception_ptr e, int code) {
      exit_code = code;
      if (e) {
        try {
          std::rethrow_exception(e);
        } catch (const std::exception& failure) {
          std::fprintf(stderr, "table_trainer: %s\n", failure.what());
        }
        exit_code = 1;
      }
      strategy.close(exit_code);
    });
    io.run();
    return exit_code;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "table_trainer: %s\n", e.what());
    return 1;
  }
}

// Variable benchmark: dense reads and assigns of 4 KiB, 1 MiB and 64 MiB variables over 1 and 2 ps,
// embedding lookups and sparse updates of 100,000 and 1,000,000 ids, against the machine's raw
// loopback round trip and pull bandwidth measured in the same run.
//
// Chief and ps are threads of one process on 127.0.0.1 (2 hardware threads shared by all), so pscoro
// and the raw figures cross the same kernel path. Quote the ratios, not the absolute times.
#include "local_cluster.hpp"
#include "raw_limits.hpp"

#include <pscoro/pscoro.hpp>

#include <CLI/CLI.hpp>

#include <fmt/chrono.h>
#include <fmt/format.h>

#include <ctime>
#include <random>

namespace {

using bench::clock_type;
using bench::micros;

struct dense_figures {
  std::size_t bytes;
  int ps;
  double read_us;    // median, into a fresh array
  double reuse_us;   // median, into the same array each time
  double assign_us;  // median
};

struct sparse_figures {
  std::string what;
  std::size_t ids;
  std::size_t width;
  double lookup_us;
  double scatter_us;
  double adagrad_us;
};

int iterations_for(std::size_t bytes, int scale) {
  if (bytes <= 4096) return 2000 * scale;
  if (bytes <= (1 << 20)) return 100 * scale;
  return 5 * scale;
}

template <class F>
asio::awaitable<double> median_us(int iterations, F f) {
  std::vector<double> samples;
  for (int i = -std::max(1, iterations / 10); i < iterations; ++i) {
    const auto start = clock_type::now();
    co_await f();
    if (i >= 0) samples.push_back(micros(clock_type::now() - start).count());
  }
  co_return bench::median(std::move(samples));
}

std::vector<dense_figures> measure_dense(int num_ps, int scale) {
  std::vector<dense_figures> out;
  pscoro::testing::local_cluster cluster(num_ps, 1);
  cluster.run_chief(
      [&](pscoro::parameter_server_strategy& strategy, pscoro::cluster_coordinator&) -> asio::awaitable<void> {
        for (const std::size_t bytes : {std::size_t{4} << 10, std::size_t{1} << 20, std::size_t{64} << 20}) {
          const pscoro::shape_type shape{bytes / sizeof(float) / 64, 64};
          auto v = co_await strategy.scope().create_sharded_variable<float>(fmt::format("dense_{}", bytes), shape,
                                                                            pscoro::initializers::ones{});
          const int n = iterations_for(bytes, scale);
          const double read = co_await median_us(n, [&] { return v.read(); });
          xt::xarray<float> into(shape);
          const double reuse = co_await median_us(n, [&] { return v.read(into); });
          const xt::xarray<float> value = xt::zeros<float>(shape);
          const double assign = co_await median_us(n, [&] { return v.assign(value); });
          out.push_back({bytes, num_ps, read, reuse, assign});
        }
      },
      {}, {}, pscoro::fixed_shards_partitioner{num_ps});
  return out;
}

std::vector<sparse_figures> measure_sparse(int scale) {
  std::vector<sparse_figures> out;
  pscoro::testing::local_cluster cluster(2, 1);
  cluster.run_chief(
      [&](pscoro::parameter_server_strategy& strategy, pscoro::cluster_coordinator&) -> asio::awaitable<void> {
        constexpr std::size_t rows = 1000000;
        std::mt19937_64 random(7);
        for (const auto& [ids, width] : {std::pair<std::size_t, std::size_t>{100000, 1}, {100000, 16}, {1000000, 1}}) {
          const pscoro::shape_type shape{rows, width};
          auto table = co_await strategy.scope().create_sharded_variable<float>(
              fmt::format("table_{}x{}", ids, width), shape, pscoro::initializers::random_uniform{});
          xt::xarray<std::int64_t> id_array = xt::zeros<std::int64_t>({ids});
          std::uniform_int_distribution<std::int64_t> pick(0, rows - 1);
          for (auto& id : id_array) id = pick(random);
          const xt::xarray<float> updates = xt::ones<float>({ids, width});
          const int n = 10 * scale;
          const double lookup = co_await median_us(n, [&] { return table.embedding_lookup(id_array); });
          const double scatter = co_await median_us(n, [&] { return table.scatter_add(id_array, updates); });
          const pscoro::optimizers::adagrad opt{.learning_rate = 0.01};
          const double adagrad =
              co_await median_us(n, [&] { return table.apply_sparse_gradient(opt, id_array, updates); });
          out.push_back({"uniform ids, 2 ps", ids, width, lookup, scatter, adagrad});
        }
      },
      {}, {}, pscoro::fixed_shards_partitioner{2});
  return out;
}

std::string size_name(std::size_t bytes) {
  if (bytes >= (1 << 20)) return fmt::format("{} MiB", bytes >> 20);
  return fmt::format("{} KiB", bytes >> 10);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"pscoro variable benchmark: dense and sparse variable operations against raw loopback TCP."};
  int scale = 1;
  app.add_option("--scale", scale, "multiplies the iteration counts")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  ::setenv("PSCORO_LOG_LEVEL", "warning", 0);

  const auto rtt4k = bench::raw_round_trip(4096, 2000 * scale);
  const double pull_1m = bench::raw_pull_bandwidth(1 << 20, 100 * scale);
  const double pull_64m = bench::raw_pull_bandwidth(64 << 20, 5 * scale);
  const double copy_64m = bench::memcpy_bandwidth(64 << 20, 5 * scale);
  std::vector<dense_figures> dense = measure_dense(1, scale);
  for (auto& f : measure_dense(2, scale)) dense.push_back(f);
  const auto sparse = measure_sparse(scale);

  fmt::print("pscoro variable benchmark, {:%Y-%m-%d}, {} hardware threads\n\n", fmt::localtime(std::time(nullptr)),
             std::thread::hardware_concurrency());
  fmt::print("raw limits: 4 KiB round trip p50 {:.1f} us; pull bandwidth 1 MiB {:.2f} GB/s, 64 MiB {:.2f} GB/s; "
             "memcpy 64 MiB {:.2f} GB/s\n\n",
             rtt4k.p50, pull_1m / 1e9, pull_64m / 1e9, copy_64m / 1e9);
  fmt::print("read: into a fresh array (allocation included) / into the same array (read(out)); ratios are\n"
             "to the raw round trip (4 KiB) or the raw pull bandwidth (1 MiB, 64 MiB)\n");
  fmt::print("{:<8} {:>3} {:>10} {:>12} {:>10} {:>12} {:>11} {:>12}\n", "dense", "ps", "read us", "fresh/raw",
             "reuse us", "reuse/raw", "assign us", "assign GB/s");
  for (const auto& f : dense) {
    auto versus = [&](double us) {
      if (f.bytes <= 4096) return fmt::format("{:.2f}x RTT", us / rtt4k.p50);
      const double bandwidth = static_cast<double>(f.bytes) / (us * 1e-6);
      return fmt::format("{:.2f}x", bandwidth / (f.bytes >= (64u << 20) ? pull_64m : pull_1m));
    };
    const double assign_bw = static_cast<double>(f.bytes) / (f.assign_us * 1e-6);
    fmt::print("{:<8} {:>3} {:>10.1f} {:>12} {:>10.1f} {:>12} {:>11.1f} {:>12.2f}\n", size_name(f.bytes), f.ps,
               f.read_us, versus(f.read_us), f.reuse_us, versus(f.reuse_us), f.assign_us, assign_bw / 1e9);
  }
  fmt::print("\n{:<20} {:>9} {:>6} {:>12} {:>12} {:>12} {:>12} {:>14}\n", "sparse (1M rows)", "ids", "width",
             "lookup us", "Mids/s", "rows GB/s", "scatter us", "adagrad us");
  for (const auto& f : sparse) {
    const double bytes = static_cast<double>(f.ids * f.width * sizeof(float));
    fmt::print("{:<20} {:>9} {:>6} {:>12.0f} {:>12.2f} {:>12.2f} {:>12.0f} {:>14.0f}\n", f.what, f.ids, f.width,
               f.lookup_us, static_cast<double>(f.ids) / f.lookup_us, bytes / (f.lookup_us * 1e-6) / 1e9,
               f.scatter_us, f.adagrad_us);
  }
  fmt::print("\nTargets: 4 KiB read <= 2x a raw round trip; 64 MiB read >= 0.6x raw pull bandwidth (the raw\n"
             "pull reuses its buffer, like read(out)).\n");
  return 0;
}

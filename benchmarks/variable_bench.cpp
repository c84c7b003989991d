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

// Medians over rounds; each round measures the raw exchange of the same size right before pscoro,
// so a slow phase of the machine slows both (ratios are per round, then the median).
struct dense_figures {
  std::size_t bytes;
  int ps;
  double raw_us;        // raw 4 KiB round trip, or raw pull of the same bytes
  double read_us;       // into a fresh array
  double reuse_us;      // into the same array each time (read(out))
  double assign_us;
  double read_ratio;    // read / raw (time)
  double reuse_ratio;   // read(out) / raw (time)
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
  if (bytes <= 4096) return 500 * scale;
  if (bytes <= (1 << 20)) return 30 * scale;
  return 3 * scale;
}

using bench::median_us;

std::vector<dense_figures> measure_dense(int num_ps, int scale, int rounds) {
  std::vector<dense_figures> out;
  pscoro::testing::local_cluster cluster(num_ps, 1);
  cluster.run_chief(
      [&](pscoro::parameter_server_strategy& strategy, pscoro::cluster_coordinator&) -> asio::awaitable<void> {
        for (const std::size_t bytes : {std::size_t{4} << 10, std::size_t{1} << 20, std::size_t{64} << 20}) {
          const pscoro::shape_type shape{bytes / sizeof(float) / 64, 64};
          auto v = co_await strategy.scope().create_sharded_variable<float>(fmt::format("dense_{}", bytes), shape,
                                                                            pscoro::initializers::ones{});
          const int n = iterations_for(bytes, scale);
          const xt::xarray<float> value = xt::zeros<float>(shape);
          xt::xarray<float> into(shape);
          std::vector<double> raw, read, reuse, assign, read_ratio, reuse_ratio;
          for (int round = 0; round < rounds; ++round) {
            // The raw exchange blocks this thread; nothing else runs on the chief meanwhile.
            raw.push_back(bench::median(bytes <= 4096 ? bench::raw_exchanges(bytes, bytes, n)
                                                      : bench::raw_exchanges(64, bytes, n)));
            read.push_back(co_await median_us(n, [&] { return v.read(); }));
            reuse.push_back(co_await median_us(n, [&] { return v.read(into); }));
            assign.push_back(co_await median_us(n, [&] { return v.assign(value); }));
            read_ratio.push_back(read.back() / raw.back());
            reuse_ratio.push_back(reuse.back() / raw.back());
          }
          using bench::median;
          out.push_back({bytes, num_ps, median(raw), median(read), median(reuse), median(assign), median(read_ratio),
                         median(reuse_ratio)});
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

struct pooling_figures {
  double lookup_us;  // embedding_lookup of every id, unpooled: [ids] + row shape
  double sparse_us;  // embedding_lookup_sparse, weighted mean: [rows] + row shape
  double safe_us;    // safe_embedding_lookup_sparse, weighted mean, some ids -1
};

// A CTR-like batch pooled per example: 4,096 rows of 26 ids (Criteo's categorical fields) from a
// 1,000,000 x 16 table over 2 ps, against a plain lookup of the same ids (what pooling adds or saves).
pooling_figures measure_pooling(int scale) {
  pooling_figures out{};
  pscoro::testing::local_cluster cluster(2, 1);
  cluster.run_chief(
      [&](pscoro::parameter_server_strategy& strategy, pscoro::cluster_coordinator&) -> asio::awaitable<void> {
        constexpr std::size_t rows = 1000000, batch_rows = 4096, fields = 26;
        const pscoro::shape_type shape{rows, 16};
        auto table = co_await strategy.scope().create_sharded_variable<float>("pooled", shape,
                                                                              pscoro::initializers::random_uniform{});
        std::mt19937_64 random(11);
        std::uniform_int_distribution<std::int64_t> pick(0, rows - 1);
        std::uniform_real_distribution<float> weigh(0.5f, 1.5f);
        pscoro::sparse_ids<std::int64_t> batch{.dense_rows = batch_rows};
        for (std::size_t r = 0; r < batch_rows; ++r) {
          for (std::size_t f = 0; f < fields; ++f) {
            batch.rows.push_back(static_cast<std::int64_t>(r));
            batch.ids.push_back(pick(random));
            batch.weights.push_back(weigh(random));
          }
        }
        auto with_missing = batch;
        for (std::size_t k = 0; k < with_missing.ids.size(); k += 10) with_missing.ids[k] = -1;
        const auto flat_ids = xt::adapt(batch.ids);
        const int n = 10 * scale;
        out.lookup_us = co_await median_us(n, [&] { return table.embedding_lookup(flat_ids); });
        out.sparse_us = co_await median_us(n, [&] { return table.embedding_lookup_sparse(batch); });
        out.safe_us = co_await median_us(n, [&] { return table.safe_embedding_lookup_sparse(with_missing); });
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
  int rounds = 5;
  app.add_option("--scale", scale, "multiplies the iteration counts")->check(CLI::PositiveNumber);
  app.add_option("--rounds", rounds, "rounds of raw + pscoro measurements (medians are reported)")
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  ::setenv("PSCORO_LOG_LEVEL", "warning", 0);

  std::vector<dense_figures> dense = measure_dense(1, scale, rounds);
  for (auto& f : measure_dense(2, scale, rounds)) dense.push_back(f);
  const auto sparse = measure_sparse(scale);
  const auto pooling = measure_pooling(scale);
  const double copy_64m = bench::memcpy_bandwidth(64 << 20, 5 * scale);

  fmt::print("pscoro variable benchmark, {:%Y-%m-%d}, {} hardware threads; memcpy 64 MiB {:.2f} GB/s\n\n",
             fmt::localtime(std::time(nullptr)), std::thread::hardware_concurrency(), copy_64m / 1e9);
  fmt::print("dense: medians of {} rounds; each round measures the raw exchange (4 KiB: ping-pong; larger: a\n"
             "64-byte request answered by the whole buffer) right before pscoro. x raw = pscoro time / raw time.\n",
             rounds);
  fmt::print("{:<8} {:>3} {:>10} {:>10} {:>8} {:>13} {:>8} {:>10} {:>12}\n", "size", "ps", "raw us", "read us",
             "x raw", "read(out) us", "x raw", "assign us", "assign GB/s");
  for (const auto& f : dense) {
    fmt::print("{:<8} {:>3} {:>10.1f} {:>10.1f} {:>8.2f} {:>13.1f} {:>8.2f} {:>10.1f} {:>12.2f}\n", size_name(f.bytes),
               f.ps, f.raw_us, f.read_us, f.read_ratio, f.reuse_us, f.reuse_ratio, f.assign_us,
               static_cast<double>(f.bytes) / (f.assign_us * 1e-6) / 1e9);
  }
  fmt::print("\n{:<20} {:>9} {:>6} {:>12} {:>12} {:>12} {:>12} {:>14}\n", "sparse (1M rows)", "ids", "width",
             "lookup us", "Mids/s", "rows GB/s", "scatter us", "adagrad us");
  for (const auto& f : sparse) {
    const double bytes = static_cast<double>(f.ids * f.width * sizeof(float));
    fmt::print("{:<20} {:>9} {:>6} {:>12.0f} {:>12.2f} {:>12.2f} {:>12.0f} {:>14.0f}\n", f.what, f.ids, f.width,
               f.lookup_us, static_cast<double>(f.ids) / f.lookup_us, bytes / (f.lookup_us * 1e-6) / 1e9,
               f.scatter_us, f.adagrad_us);
  }
  fmt::print("\npooled (1M x 16, 2 ps): 4,096 rows x 26 ids, weighted mean: embedding_lookup of the 106,496 ids\n"
             "{:.0f} us; embedding_lookup_sparse {:.0f} us; safe_embedding_lookup_sparse (every 10th id -1) {:.0f} us\n",
             pooling.lookup_us, pooling.sparse_us, pooling.safe_us);
  fmt::print("\nTargets: a 4 KiB read within 2x a raw round trip; a 64 MiB read at >= 60% of the raw pull's\n"
             "bandwidth, i.e. x raw <= 1.67 (the raw pull reuses its buffer, like read(out)).\n");
  return 0;
}

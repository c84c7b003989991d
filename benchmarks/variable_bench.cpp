// Variable benchmark: dense reads and assigns of 4 KiB, 1 MiB and 64 MiB variables over 1 and 2 ps,
// embedding lookups and sparse updates of 100,000 and 1,000,000 ids, against the machine's raw
// loopback round trip and pull bandwidth measured in the same run.
//
// Dense operations run twice (--mode): with chief and ps as threads of one process, against raw
// exchanges between two threads, and with ps and worker as processes of their own (forked at the
// start), against raw exchanges between two processes; both print page faults per operation.
// Everything runs on 127.0.0.1 (2 hardware threads shared by all), so pscoro and the raw figures
// cross the same kernel path. Quote the ratios, not the absolute times.
#include "local_cluster.hpp"
#include "process_cluster.hpp"
#include "raw_limits.hpp"

#include <pscoro/pscoro.hpp>

#include <CLI/CLI.hpp>

#include <fmt/chrono.h>
#include <fmt/format.h>

#include <ctime>
#include <optional>
#include <random>

namespace {

using bench::clock_type;
using bench::micros;

// Medians over rounds; each round measures the raw exchanges of the same size right before pscoro,
// so a slow phase of the machine slows both (ratios are per round, then the median).
struct dense_figures {
  std::size_t bytes;
  int ps;
  double pull_us;       // raw 4 KiB round trip, or raw pull of the same bytes
  double push_us;       // raw 4 KiB round trip, or raw push of the same bytes (answered by 64 bytes)
  double read_us;       // into a fresh array
  double reuse_us;      // into the same array each time (read(out))
  double assign_us;
  double read_ratio;    // read / raw pull (time)
  double reuse_ratio;   // read(out) / raw pull (time)
  double assign_ratio;  // assign / raw push (time)
  // Minor page faults per operation: the chief's process, and the ps processes' (-1: threads of one
  // process, all counted in the chief's).
  double read_faults, read_ps_faults, reuse_faults, reuse_ps_faults, assign_faults, assign_ps_faults;
};

struct sparse_figures {
  std::size_t ids;
  std::size_t width;
  double lookup_us;
  double scatter_us;
  double adagrad_us;
  double raw_lookup_us;   // per ps in turn: its ids out (8 bytes each), their rows back
  double raw_scatter_us;  // per ps in turn: its ids and rows out, 64 bytes back
  double lookup_ratio;    // lookup / raw_lookup (time, per round)
  double scatter_ratio;   // scatter_add / raw_scatter
  double adagrad_ratio;   // apply_sparse_gradient / raw_scatter (same bytes)
  double lookup_faults, lookup_ps_faults, scatter_faults, scatter_ps_faults;
  // CPU time per operation (us; the chief's process, the ps processes' together: -1 for threads of
  // one process, all in the chief's): robust where wall times are not, on a busy machine.
  double lookup_cpu, lookup_ps_cpu, scatter_cpu, scatter_ps_cpu;
};

// CPU time per awaited operation of median_us(n, ...), as fault_counter counts faults.
struct cpu_counter {
  std::vector<pid_t> ps;
  double self = 0, others = 0;
  static double own() {
    timespec t{};
    ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
  }
  void start() {
    self = own();
    others = 0;
    for (const pid_t pid : ps) others += bench::cpu_seconds(pid);
  }
  std::pair<double, double> per_operation(int n) const {
    const double calls = n + std::max(1, n / 10);
    double now = 0;
    for (const pid_t pid : ps) now += bench::cpu_seconds(pid);
    return {(own() - self) / calls * 1e6, ps.empty() ? -1.0 : (now - others) / calls * 1e6};
  }
};

int iterations_for(std::size_t bytes, int scale) {
  if (bytes <= 4096) return 500 * scale;
  if (bytes <= (1 << 20)) return 30 * scale;
  return 3 * scale;
}

std::string size_name(std::size_t bytes) {
  if (bytes >= (1 << 20)) return fmt::format("{} MiB", bytes >> 20);
  return fmt::format("{} KiB", bytes >> 10);
}

using bench::median_us;

// Page faults per awaited operation of median_us(n, ...) (which awaits n plus a tenth as many).
struct fault_counter {
  std::vector<pid_t> ps;  // empty: one process
  std::uint64_t self = 0, others = 0;
  void start() {
    self = bench::minor_faults();
    others = 0;
    for (const pid_t pid : ps) others += bench::minor_faults(pid);
  }
  std::pair<double, double> per_operation(int n) const {
    const double calls = n + std::max(1, n / 10);
    std::uint64_t now = 0;
    for (const pid_t pid : ps) now += bench::minor_faults(pid);
    return {static_cast<double>(bench::minor_faults() - self) / calls,
            ps.empty() ? -1.0 : static_cast<double>(now - others) / calls};
  }
};

// `run_chief(body)` runs a chief over `num_ps` ps; `raw(request, response, n)` times raw exchanges.
template <class RunChief, class Raw>
std::vector<dense_figures> measure_dense(int num_ps, int scale, int rounds, RunChief run_chief, Raw raw,
                                         std::vector<pid_t> ps_pids) {
  std::vector<dense_figures> out;
  run_chief([&](pscoro::parameter_server_strategy& strategy, pscoro::cluster_coordinator&) -> asio::awaitable<void> {
    for (const std::size_t bytes : {std::size_t{4} << 10, std::size_t{1} << 20, std::size_t{64} << 20}) {
      const pscoro::shape_type shape{bytes / sizeof(float) / 64, 64};
      auto v = co_await strategy.scope().create_sharded_variable<float>(fmt::format("dense_{}", bytes), shape,
                                                                        pscoro::initializers::ones{});
      const int n = iterations_for(bytes, scale);
      const xt::xarray<float> value = xt::zeros<float>(shape);
      xt::xarray<float> into(shape);
      std::vector<double> pull, push, read, reuse, assign, read_ratio, reuse_ratio, assign_ratio;
      std::vector<double> faults[6];
      fault_counter counter{ps_pids};
      auto count = [&](int first) {
        const auto [self, ps] = counter.per_operation(n);
        faults[first].push_back(self);
        faults[first + 1].push_back(ps);
      };
      for (int round = 0; round < rounds; ++round) {
        // The raw exchanges block this thread; nothing else runs on the chief meanwhile.
        pull.push_back(bench::median(bytes <= 4096 ? raw(bytes, bytes, n) : raw(64, bytes, n)));
        push.push_back(bench::median(bytes <= 4096 ? raw(bytes, bytes, n) : raw(bytes, 64, n)));
        counter.start();
        read.push_back(co_await median_us(n, [&] { return v.read(); }));
        count(0);
        counter.start();
        reuse.push_back(co_await median_us(n, [&] { return v.read(into); }));
        count(2);
        counter.start();
        assign.push_back(co_await median_us(n, [&] { return v.assign(value); }));
        count(4);
        read_ratio.push_back(read.back() / pull.back());
        reuse_ratio.push_back(reuse.back() / pull.back());
        assign_ratio.push_back(assign.back() / push.back());
      }
      using bench::median;
      out.push_back({bytes, num_ps, median(pull), median(push), median(read), median(reuse), median(assign),
                     median(read_ratio), median(reuse_ratio), median(assign_ratio), median(faults[0]),
                     median(faults[1]), median(faults[2]), median(faults[3]), median(faults[4]),
                     median(faults[5])});
    }
  });
  return out;
}

std::vector<dense_figures> measure_dense_threads(int num_ps, int scale, int rounds) {
  pscoro::testing::local_cluster cluster(num_ps, 1);
  return measure_dense(
      num_ps, scale, rounds,
      [&](auto body) { cluster.run_chief(body, {}, {}, pscoro::fixed_shards_partitioner{num_ps}); },
      [](std::size_t request, std::size_t response, int n) { return bench::raw_exchanges(request, response, n); },
      {});
}

std::vector<dense_figures> measure_dense_processes(bench::process_cluster& cluster, bench::raw_server_process& raw,
                                                   int num_ps, int scale, int rounds) {
  std::vector<pid_t> pids;
  for (int i = 0; i < num_ps; ++i) pids.push_back(cluster.pid("ps", i));
  return measure_dense(
      num_ps, scale, rounds,
      [&](auto body) { cluster.run_chief(num_ps, body, pscoro::fixed_shards_partitioner{num_ps}); },
      [&](std::size_t request, std::size_t response, int n) { return raw.exchanges(request, response, n); }, pids);
}

void print_dense(const std::vector<dense_figures>& dense) {
  fmt::print("{:<8} {:>3} {:>9} {:>9} {:>9} {:>6} {:>12} {:>6} {:>9} {:>6} {:>11}   {}\n", "size", "ps", "pull us",
             "push us", "read us", "x pull", "read(out) us", "x pull", "assign us", "x push", "assign GB/s",
             "faults/op chief|ps: read, read(out), assign");
  auto faults = [](double self, double ps) {
    return ps < 0 ? fmt::format("{:.0f}", self) : fmt::format("{:.0f}|{:.0f}", self, ps);
  };
  for (const auto& f : dense) {
    fmt::print("{:<8} {:>3} {:>9.1f} {:>9.1f} {:>9.1f} {:>6.2f} {:>12.1f} {:>6.2f} {:>9.1f} {:>6.2f} {:>11.2f}   {}, {}, {}\n",
               size_name(f.bytes), f.ps, f.pull_us, f.push_us, f.read_us, f.read_ratio, f.reuse_us, f.reuse_ratio,
               f.assign_us, f.assign_ratio, static_cast<double>(f.bytes) / (f.assign_us * 1e-6) / 1e9,
               faults(f.read_faults, f.read_ps_faults), faults(f.reuse_faults, f.reuse_ps_faults),
               faults(f.assign_faults, f.assign_ps_faults));
  }
}

// Embedding lookups and scatter_add of uniform ids over a 1M-row table on 2 ps, each round against
// the raw exchanges of the same bytes right before. The raw limit is sequential: per ps, the ids it
// holds go out (8 bytes each) and their rows come back (lookup), or ids and rows go out and 64 bytes
// come back (scatter), one exchange after the other over one connection; the medians are summed.
// pscoro asks both ps at once, so the limit is a conservative one (on 2 cores shared by chief, 2 ps
// and the raw server, two concurrent raw streams gain little over one).
template <class RunChief, class Raw>
std::vector<sparse_figures> measure_sparse(int scale, int rounds, RunChief run_chief, Raw raw,
                                           std::vector<pid_t> ps_pids, std::size_t only_width) {
  std::vector<sparse_figures> out;
  run_chief([&](pscoro::parameter_server_strategy& strategy, pscoro::cluster_coordinator&) -> asio::awaitable<void> {
    constexpr std::size_t rows = 1000000;
    std::mt19937_64 random(7);
    for (const auto& [ids, width] : {std::pair<std::size_t, std::size_t>{100000, 1}, {100000, 16}, {1000000, 1}}) {
      if (only_width && width != only_width) continue;
      const pscoro::shape_type shape{rows, width};
      auto table = co_await strategy.scope().create_sharded_variable<float>(
          fmt::format("table_{}x{}", ids, width), shape, pscoro::initializers::random_uniform{});
      xt::xarray<std::int64_t> id_array = xt::zeros<std::int64_t>({ids});
      std::uniform_int_distribution<std::int64_t> pick(0, rows - 1);
      for (auto& id : id_array) id = pick(random);
      std::vector<std::size_t> per_shard(table.num_shards());
      for (const auto id : id_array) {
        std::size_t s = 0;
        while (static_cast<std::size_t>(id) >= table.offsets()[s + 1]) ++s;
        ++per_shard[s];
      }
      const xt::xarray<float> updates = xt::ones<float>({ids, width});
      const int n = 10 * scale;
      std::vector<double> raw_lookup, raw_scatter, lookup, scatter, adagrad, lookup_ratio, scatter_ratio,
          adagrad_ratio;
      std::vector<double> faults[4], cpu[4];
      fault_counter counter{ps_pids};
      cpu_counter cpu_time{ps_pids};
      auto start = [&] {
        counter.start();
        cpu_time.start();
      };
      auto count = [&](int first) {
        const auto [self, ps] = counter.per_operation(n);
        faults[first].push_back(self);
        faults[first + 1].push_back(ps);
        const auto [self_cpu, ps_cpu] = cpu_time.per_operation(n);
        cpu[first].push_back(self_cpu);
        cpu[first + 1].push_back(ps_cpu);
      };
      const pscoro::optimizers::adagrad opt{.learning_rate = 0.01};
      for (int round = 0; round < rounds; ++round) {
        double pull = 0, push = 0;
        for (const std::size_t k : per_shard) {
          pull += bench::median(raw(k * sizeof(std::int64_t), k * width * sizeof(float), n));
          push += bench::median(raw(k * (sizeof(std::int64_t) + width * sizeof(float)), 64, n));
        }
        raw_lookup.push_back(pull);
        raw_scatter.push_back(push);
        start();
        lookup.push_back(co_await median_us(n, [&] { return table.embedding_lookup(id_array); }));
        count(0);
        start();
        scatter.push_back(co_await median_us(n, [&] { return table.scatter_add(id_array, updates); }));
        count(2);
        adagrad.push_back(co_await median_us(n, [&] { return table.apply_sparse_gradient(opt, id_array, updates); }));
        lookup_ratio.push_back(lookup.back() / pull);
        scatter_ratio.push_back(scatter.back() / push);
        adagrad_ratio.push_back(adagrad.back() / push);
      }
      using bench::median;
      out.push_back({ids, width, median(lookup), median(scatter), median(adagrad), median(raw_lookup),
                     median(raw_scatter), median(lookup_ratio), median(scatter_ratio), median(adagrad_ratio),
                     median(faults[0]), median(faults[1]), median(faults[2]), median(faults[3]), median(cpu[0]),
                     median(cpu[1]), median(cpu[2]), median(cpu[3])});
    }
  });
  return out;
}

void print_sparse(const std::vector<sparse_figures>& sparse) {
  fmt::print("{:>8} {:>5} {:>9} {:>9} {:>6} {:>10} {:>10} {:>6} {:>10} {:>6}   {:<22} {}\n", "ids", "width",
             "raw lk us", "lookup us", "x raw", "raw sc us", "scatter us", "x raw", "adagrad us", "x raw",
             "faults/op chief|ps", "CPU us/op chief|ps (lookup, scatter_add)");
  auto pair = [](double self, double ps) {
    return ps < 0 ? fmt::format("{:.0f}", self) : fmt::format("{:.0f}|{:.0f}", self, ps);
  };
  for (const auto& f : sparse) {
    fmt::print("{:>8} {:>5} {:>9.0f} {:>9.0f} {:>6.2f} {:>10.0f} {:>10.0f} {:>6.2f} {:>10.0f} {:>6.2f}   {:<22} {}\n",
               f.ids, f.width, f.raw_lookup_us, f.lookup_us, f.lookup_ratio, f.raw_scatter_us, f.scatter_us,
               f.scatter_ratio, f.adagrad_us, f.adagrad_ratio,
               fmt::format("{}, {}", pair(f.lookup_faults, f.lookup_ps_faults), pair(f.scatter_faults, f.scatter_ps_faults)),
               fmt::format("{}, {}", pair(f.lookup_cpu, f.lookup_ps_cpu), pair(f.scatter_cpu, f.scatter_ps_cpu)));
  }
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


}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"pscoro variable benchmark: dense and sparse variable operations against raw loopback TCP."};
  int scale = 1;
  int rounds = 5;
  app.add_option("--scale", scale, "multiplies the iteration counts")->check(CLI::PositiveNumber);
  app.add_option("--rounds", rounds, "rounds of raw + pscoro measurements (medians are reported)")
      ->check(CLI::PositiveNumber);
  std::string mode = "both";
  app.add_option("--mode", mode,
                 "dense operations with the ps as threads of this process, as processes of their own, or both")
      ->check(CLI::IsMember({"threads", "processes", "both"}));
  bool dense_only = false;
  app.add_flag("--dense-only", dense_only, "only the dense table");
  bool sparse_only = false;
  app.add_flag("--sparse-only", sparse_only, "only the sparse tables (embedding lookups, scatters)");
  std::size_t sparse_width = 0;
  app.add_option("--sparse-width", sparse_width, "only the sparse cases of this row width (1 or 16; 0: all)");
  CLI11_PARSE(app, argc, argv);
  ::setenv("PSCORO_LOG_LEVEL", "warning", 0);

  // The processes are forked first, while this program has one thread.
  std::optional<bench::process_cluster> processes;
  std::optional<bench::raw_server_process> raw_server;
  if (mode != "threads") {
    processes.emplace(2, 1);
    raw_server.emplace();
  }
  std::vector<dense_figures> dense_threads, dense_processes;
  for (const int ps : {1, 2}) {
    if (sparse_only) break;
    // Interleaved: a slow phase of the machine falls on both modes.
    if (mode != "processes") {
      for (auto& f : measure_dense_threads(ps, scale, rounds)) dense_threads.push_back(f);
    }
    if (mode != "threads") {
      for (auto& f : measure_dense_processes(*processes, *raw_server, ps, scale, rounds)) dense_processes.push_back(f);
    }
  }
  const double copy_64m = bench::memcpy_bandwidth(64 << 20, 5 * scale);

  fmt::print("pscoro variable benchmark, {:%Y-%m-%d}, {} hardware threads; memcpy 64 MiB {:.2f} GB/s\n\n",
             fmt::localtime(std::time(nullptr)), std::thread::hardware_concurrency(), copy_64m / 1e9);
  fmt::print("dense: medians of {} rounds; each round measures the raw exchanges (4 KiB: ping-pong; larger: pull =\n"
             "a 64-byte request answered by the whole buffer, push = the whole buffer answered by 64 bytes) right\n"
             "before pscoro. x pull, x push = pscoro time / raw time, per round. faults/op: minor page faults\n"
             "per operation (/proc/<pid>/stat minflt) of the chief's process and the ps processes'.\n",
             rounds);
  if (!dense_threads.empty()) {
    fmt::print("\nchief and ps as threads of one process (raw: two threads):\n");
    print_dense(dense_threads);
  }
  if (!dense_processes.empty()) {
    fmt::print("\nchief, ps and worker as processes (raw: two processes):\n");
    print_dense(dense_processes);
  }
  fmt::print("\nTargets: a 4 KiB read within 2x a raw round trip; 64 MiB: assign <= 1.3x the raw push, read into a\n"
             "fresh array <= 1.3x the raw pull, read(out) <= 1.0x (the raw pull reuses its buffer, like read(out)).\n");
  if (dense_only) return 0;
  std::vector<sparse_figures> sparse_threads, sparse_processes;
  if (mode != "processes") {
    pscoro::testing::local_cluster cluster(2, 1);
    sparse_threads = measure_sparse(
        scale, rounds,
        [&](auto body) { cluster.run_chief(body, {}, {}, pscoro::fixed_shards_partitioner{2}); },
        [](std::size_t request, std::size_t response, int n) { return bench::raw_exchanges(request, response, n); },
        {}, sparse_width);
  }
  if (mode != "threads") {
    sparse_processes = measure_sparse(
        scale, rounds,
        [&](auto body) { processes->run_chief(2, body, pscoro::fixed_shards_partitioner{2}); },
        [&](std::size_t request, std::size_t response, int n) { return raw_server->exchanges(request, response, n); },
        {processes->pid("ps", 0), processes->pid("ps", 1)}, sparse_width);
  }
  const auto pooling = sparse_width ? pooling_figures{} : measure_pooling(scale);
  fmt::print("\nsparse, uniform ids over a 1M-row float table on 2 ps: medians of {} rounds; each round measures the\n"
             "raw exchanges of the same bytes right before pscoro: per ps in turn, its ids out (8 bytes each) and\n"
             "their rows back (raw lk), or its ids and rows out and 64 bytes back (raw sc, also adagrad's limit).\n"
             "Sequential over one connection: pscoro asks both ps at once. ps-lite is not a Debian package, so\n"
             "the raw exchange is the comparison. faults/op as above.\n",
             rounds);
  if (!sparse_threads.empty()) {
    fmt::print("\nchief and ps as threads of one process (raw: two threads):\n");
    print_sparse(sparse_threads);
  }
  if (!sparse_processes.empty()) {
    fmt::print("\nchief and ps as processes (raw: two processes):\n");
    print_sparse(sparse_processes);
  }
  fmt::print("\nTargets: embedding_lookup and scatter_add of 100k x 16 <= 2x raw.\n");
  fmt::print("\npooled (1M x 16, 2 ps): 4,096 rows x 26 ids, weighted mean: embedding_lookup of the 106,496 ids\n"
             "{:.0f} us; embedding_lookup_sparse {:.0f} us; safe_embedding_lookup_sparse (every 10th id -1) {:.0f} us\n",
             pooling.lookup_us, pooling.sparse_us, pooling.safe_us);
  return 0;
}

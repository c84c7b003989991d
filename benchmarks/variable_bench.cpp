// Variable benchmark: dense reads and assigns of 4 KiB, 1 MiB and 64 MiB variables over 1 and 2 ps,
// embedding lookups and sparse updates of 100,000 and 1,000,000 ids, against the machine's raw
// loopback round trip and pull bandwidth measured in the same run.
//
// Dense operations run twice (--mode): with chief and ps as threads of one process, against raw
// exchanges between two threads, and with ps and worker as processes of their own (forked at the
// start), against raw exchanges between two processes; both print page faults per operation.
// Everything runs on 127.0.0.1 (2 hardware threads shared by all), so pscoro and the raw figures
// cross the same kernel path. Quote the ratios, not the absolute times.
//
// --mode kernels: small requests while a big optimizer step runs on the ps. A ps and a
// worker as processes; the chief applies 256 MiB Adagrad steps to one variable in a loop while the
// worker, over its own connection, reads a 4 KiB variable and a 4-byte one (a heartbeat-sized
// request) every millisecond; then the same reads with the ps idle. Latency is counted from when
// each read was due (one every 2 ms per kind), so reads held up behind a step count as long as it
// held them (no coordinated omission). --kernel-threads 0 runs every kernel on the ps's executor,
// as before the kernel pool.
//
// --mode hash: a dynamic embedding table against a sharded variable, ps as processes: a lookup
// with insert of 100,000 ids x 16 floats over 2 ps, 90% of them held already and 10% new each
// time, against embedding_lookup of 100,000 uniform ids of a 1M x 16 variable, in the same
// rounds; then sparse Adagrad steps of the same ids on each.
//
// --json prints, instead of the dense and sparse tables, one JSON object a line per layout,
// operation, size and ps count (read_4KiB, assign_64MiB, ...: read into a fresh array and assign;
// embedding_lookup, scatter_add), with the raw figure beside it: what torch_rpc_bench.py reads to
// set pscoro beside PyTorch's RPC.
#include "command_line.hpp"
#include "local_cluster.hpp"
#include "process_cluster.hpp"
#include "raw_limits.hpp"

#include <pscoro/pscoro.hpp>

#include <fmt/chrono.h>
#include <fmt/format.h>

#include <asio/detached.hpp>
#include <asio/steady_timer.hpp>

#include <cstring>
#include <ctime>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>

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
  double fresh_pull_us; // the raw pull into a fresh buffer per exchange (what read() into a fresh array pays)
  double read_us;       // into a fresh array
  double reuse_us;      // into the same array each time (read(out))
  double assign_us;
  double read_ratio;    // read / raw pull (time)
  double fresh_ratio;   // read / raw pull into a fresh buffer (time)
  double reuse_ratio;   // read(out) / raw pull (time)
  double assign_ratio;  // assign / raw push (time)
  // The raw pull of the same bytes split among the ps, from as many raw servers at once into one
  // thread (what read(out) of a sharded variable does), and read(out) / it; -1: not measured
  // (threads mode, one ps, 4 KiB).
  double split_pull_us;
  double split_reuse_ratio;
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
  double raw_lookup_us;   // per ps in turn: its ids out (8 bytes each), their rows back: the best of
                          // receiving into a plain buffer and into huge pages (both below)
  double raw_lookup_plain_us;
  double raw_lookup_huge_us;
  double raw_scatter_us;  // per ps in turn: its ids and rows out, 64 bytes back
  double lookup_ratio;    // lookup / raw_lookup (time, per round)
  double scatter_ratio;   // scatter_add / raw_scatter
  double adagrad_ratio;   // apply_sparse_gradient / raw_scatter (same bytes)
  // The memory work the raw exchanges leave out, done by this thread alone in the same round: the
  // received rows copied to their places in a fresh result in input order (place), and the rows,
  // read in the order they arrive, added into a local table at their ids (apply; what the ps's
  // kernels::scatter does to their shards, done the same way). raw + place and raw + apply are the
  // same work done one part after the other: not bounds (pscoro overlaps the parts, and its two ps
  // apply their halves at once), but what pscoro's time is to be read against once the work itself
  // is counted.
  double place_us, apply_us;
  double lookup_mem_ratio;   // lookup / (raw_lookup + place)
  double scatter_mem_ratio;  // scatter_add / (raw_scatter + apply)
  // The same lookups timed on a worker (a worker function awaiting them), and against the same
  // floor; -1: not measured (threads mode).
  double worker_lookup_us, worker_lookup_mem_ratio;
  double lookup_faults, lookup_ps_faults, scatter_faults, scatter_ps_faults;
  // CPU time per operation (us; the chief's process, the ps processes' together: -1 for threads of
  // one process, all in the chief's): robust where wall times are not, on a busy machine.
  double lookup_cpu, lookup_ps_cpu, scatter_cpu, scatter_ps_cpu;
  // The same for the raw exchanges: the client's (this process) and the raw server's, per lookup
  // (or scatter) of all shards' bytes: what moving the bytes costs each side, the floor under
  // pscoro's figures.
  double raw_lookup_cpu, raw_lookup_server_cpu, raw_scatter_cpu, raw_scatter_server_cpu;
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

// `run_chief(body)` runs a chief over `num_ps` ps; `raw(request, response, n, receive_into)` times raw
// exchanges; `split_pull(request, response, n)`, concurrent pulls of `response` bytes from each of
// `num_ps` raw servers (empty: not measured).
template <class RunChief, class Raw, class SplitPull>
std::vector<dense_figures> measure_dense(int num_ps, int scale, int rounds, RunChief run_chief, Raw raw,
                                         SplitPull split_pull, std::vector<pid_t> ps_pids) {
  std::vector<dense_figures> out;
  run_chief([&](pscoro::parameter_server_strategy& strategy, pscoro::cluster_coordinator&) -> asio::awaitable<void> {
    for (const std::size_t bytes : {std::size_t{4} << 10, std::size_t{1} << 20, std::size_t{64} << 20}) {
      const pscoro::shape_type shape{bytes / sizeof(float) / 64, 64};
      auto v = co_await strategy.scope().create_sharded_variable<float>(fmt::format("dense_{}", bytes), shape,
                                                                        pscoro::initializers::ones{});
      const int n = iterations_for(bytes, scale);
      // Like for like: every raw buffer is in huge pages from 4 MiB on (raw_limits.hpp), and so are
      // the arrays pscoro sends from and reads into here, as read()'s results are. A plain xarray is
      // in 4 KiB pages, which cost the kernel's copy more: a raw 64 MiB push from one took 17.4-18.4
      // ms against 14.3-15.6 from huge pages (RESULTS.md, 2026-11-25 03:25).
      const xt::xarray<float> value = co_await v.read();
      xt::xarray<float> into = co_await v.read();
      std::vector<double> pull, push, fresh_pull, read, reuse, assign, read_ratio, fresh_ratio, reuse_ratio,
          assign_ratio, split, split_ratio;
      std::vector<double> faults[6];
      fault_counter counter{ps_pids};
      auto count = [&](int first) {
        const auto [self, ps] = counter.per_operation(n);
        faults[first].push_back(self);
        faults[first + 1].push_back(ps);
      };
      for (int round = 0; round < rounds; ++round) {
        // The raw exchanges block this thread; nothing else runs on the chief meanwhile.
        using bench::receive_into;
        pull.push_back(bench::median(bytes <= 4096 ? raw(bytes, bytes, n, receive_into::reused)
                                                   : raw(64, bytes, n, receive_into::reused)));
        push.push_back(bench::median(bytes <= 4096 ? raw(bytes, bytes, n, receive_into::reused)
                                                   : raw(bytes, 64, n, receive_into::reused)));
        fresh_pull.push_back(bench::median(bytes <= 4096 ? raw(bytes, bytes, n, receive_into::fresh)
                                                         : raw(64, bytes, n, receive_into::fresh)));
        const auto split_samples = bytes <= 4096 || num_ps == 1
                                       ? std::vector<double>{}
                                       : split_pull(64, bytes / static_cast<std::size_t>(num_ps), n);
        if (!split_samples.empty()) split.push_back(bench::median(split_samples));
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
        fresh_ratio.push_back(read.back() / fresh_pull.back());
        reuse_ratio.push_back(reuse.back() / pull.back());
        if (!split.empty()) split_ratio.push_back(reuse.back() / split.back());
        assign_ratio.push_back(assign.back() / push.back());
      }
      using bench::median;
      out.push_back({bytes, num_ps, median(pull), median(push), median(fresh_pull), median(read), median(reuse),
                     median(assign), median(read_ratio), median(fresh_ratio), median(reuse_ratio),
                     median(assign_ratio), split.empty() ? -1.0 : median(split),
                     split_ratio.empty() ? -1.0 : median(split_ratio), median(faults[0]),
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
      [](std::size_t request, std::size_t response, int n, bench::receive_into where) {
        return bench::raw_exchanges(request, response, n, where);
      },
      [](std::size_t, std::size_t, int) { return std::vector<double>{}; }, {});
}

// `raw`: the raw servers, as many as ps (the first also answers the single-server exchanges).
std::vector<dense_figures> measure_dense_processes(bench::process_cluster& cluster,
                                                   std::vector<bench::raw_server_process*> raw, int num_ps, int scale,
                                                   int rounds, bench::placement placement) {
  std::vector<pid_t> pids;
  for (int i = 0; i < num_ps; ++i) pids.push_back(cluster.pid("ps", i));
  std::vector<pid_t> servers = pids;
  for (auto* server : raw) servers.push_back(server->pid());
  const bench::pinned_placement pinned(placement, servers);
  return measure_dense(
      num_ps, scale, rounds,
      [&](auto body) { cluster.run_chief(num_ps, body, pscoro::fixed_shards_partitioner{num_ps}); },
      [&](std::size_t request, std::size_t response, int n, bench::receive_into where) {
        return raw[0]->exchanges(request, response, n, where);
      },
      [&](std::size_t request, std::size_t response, int n) { return bench::concurrent_pulls(raw, request, response, n); },
      pids);
}

void print_dense(const std::vector<dense_figures>& dense) {
  fmt::print("{:<8} {:>3} {:>9} {:>9} {:>9} {:>9} {:>6} {:>7} {:>12} {:>6} {:>9} {:>8} {:>9} {:>6} {:>11}   {}\n",
             "size", "ps", "pull us", "push us", "fresh us", "read us", "x pull", "x fresh", "read(out) us", "x pull",
             "split us", "x split", "assign us", "x push", "assign GB/s", "faults/op chief|ps: read, read(out), assign");
  auto faults = [](double self, double ps) {
    return ps < 0 ? fmt::format("{:.0f}", self) : fmt::format("{:.0f}|{:.0f}", self, ps);
  };
  for (const auto& f : dense) {
    const bool split = f.split_pull_us >= 0;
    fmt::print(
        "{:<8} {:>3} {:>9.1f} {:>9.1f} {:>9.1f} {:>9.1f} {:>6.2f} {:>7.2f} {:>12.1f} {:>6.2f} {:>9} {:>8} {:>9.1f} "
        "{:>6.2f} {:>11.2f}   {}, {}, {}\n",
        size_name(f.bytes), f.ps, f.pull_us, f.push_us, f.fresh_pull_us, f.read_us, f.read_ratio, f.fresh_ratio,
        f.reuse_us, f.reuse_ratio, split ? fmt::format("{:.1f}", f.split_pull_us) : "-",
        split ? fmt::format("{:.2f}", f.split_reuse_ratio) : "-", f.assign_us, f.assign_ratio,
        static_cast<double>(f.bytes) / (f.assign_us * 1e-6) / 1e9, faults(f.read_faults, f.read_ps_faults),
        faults(f.reuse_faults, f.reuse_ps_faults), faults(f.assign_faults, f.assign_ps_faults));
  }
}

// On a worker: the median time (us) of `n` embedding lookups of `ids`, timed as the chief times its
// own (a tenth as many first, to warm up): a worker's lookups go through the same client, from
// another process and its own connections.
const pscoro::worker_function<double(pscoro::sharded_variable<float>, xt::xarray<std::int64_t>, std::int64_t)>
    worker_lookups{"bench.worker_lookups"};
asio::awaitable<double> time_worker_lookups(pscoro::sharded_variable<float> table, xt::xarray<std::int64_t> ids,
                                            std::int64_t n) {
  const auto lookup = [&] { return table.embedding_lookup(ids); };
  co_return co_await median_us(static_cast<int>(n), lookup);
}
void bind_sparse_bench(pscoro::server& s) { s.bind(worker_lookups, time_worker_lookups); }

// Embedding lookups and scatter_add of uniform ids over a 1M-row table on 2 ps, each round against
// the raw exchanges of the same bytes right before. The raw limit is sequential: per ps, the ids it
// holds go out (8 bytes each) and their rows come back (lookup), or ids and rows go out and 64 bytes
// come back (scatter), one exchange after the other over one connection; the medians are summed.
// pscoro asks both ps at once, so the limit is a conservative one (on 2 cores shared by chief, 2 ps
// and the raw server, two concurrent raw streams gain little over one).
template <class RunChief, class Raw>
std::vector<sparse_figures> measure_sparse(int scale, int rounds, RunChief run_chief, Raw raw,
                                           std::vector<pid_t> ps_pids, std::vector<pid_t> raw_pids,
                                           std::size_t only_width,
                                           std::string_view only_op, bool time_on_worker) {
  const auto runs = [&](std::string_view op) { return only_op == "all" || only_op == op; };
  std::vector<sparse_figures> out;
  run_chief([&](pscoro::parameter_server_strategy& strategy,
                pscoro::cluster_coordinator& coordinator) -> asio::awaitable<void> {
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
      // The positions of the rows in the order they arrive: shard by shard, each in input order.
      std::vector<std::uint32_t> arrival;
      arrival.reserve(ids);
      for (std::size_t s = 0; s < table.num_shards(); ++s) {
        for (std::size_t k = 0; k < ids; ++k) {
          const auto id = static_cast<std::size_t>(id_array(k));
          if (id >= table.offsets()[s] && id < table.offsets()[s + 1]) arrival.push_back(static_cast<std::uint32_t>(k));
        }
      }
      const std::size_t id_count = ids, row_width = width;  // clang 14 cannot capture structured bindings
      const std::size_t row_bytes = row_width * sizeof(float);
      const auto reply_rows = bench::detail::fresh_buffer(id_count * row_bytes);
      std::memset(reply_rows.get(), 1, id_count * row_bytes);
      // The table the ps hold, in one piece: huge pages, as the ps's storage (memory.cpp), or every
      // random row would also be a TLB miss the ps do not pay.
      const auto local_table = bench::detail::fresh_buffer(rows * row_bytes);
      std::memset(local_table.get(), 0, rows * row_bytes);
      // The ids as the ps receive them: contiguous, each shard's in input order, shard after shard.
      std::vector<std::int64_t> arrival_ids(id_count);
      for (std::size_t r = 0; r < id_count; ++r) arrival_ids[r] = id_array(arrival[r]);
      const auto place = [&] {
        xt::xarray<float> result(pscoro::shape_type{id_count, row_width});
        auto* to = reinterpret_cast<char*>(result.data());
        for (std::size_t r = 0; r < id_count; ++r) {
          std::memcpy(to + arrival[r] * row_bytes, reply_rows.get() + r * row_bytes, row_bytes);
        }
        return result(0, 0);
      };
      const auto apply = [&] {
        // What a ps's scatter_add does (kernels::scatter in src/ps/kernels.cpp): the rows in
        // the order they arrive, each added at its id, the row 32 ids ahead prefetched, the row's
        // width a compile-time constant when it is 16.
        const float* rows_in = updates.data();
        auto* table_rows = reinterpret_cast<float*>(local_table.get());
        const auto add_rows = [&](auto elements) {
          constexpr std::size_t ahead = 32;  // common::random_row_prefetch_distance
          for (std::size_t r = 0; r < id_count; ++r) {
            if (r + ahead < id_count) {
              __builtin_prefetch(table_rows + static_cast<std::size_t>(arrival_ids[r + ahead]) * elements, 1);
            }
            float* row = table_rows + static_cast<std::size_t>(arrival_ids[r]) * elements;
            const float* add = rows_in + r * elements;
            for (std::size_t j = 0; j < elements; ++j) row[j] += add[j];
          }
        };
        if (row_width == 16) {
          add_rows(std::integral_constant<std::size_t, 16>{});
        } else {
          add_rows(row_width);
        }
        return table_rows[0];
      };
      const int n = 10 * scale;
      std::vector<double> raw_lookup, raw_lookup_plain, raw_lookup_huge, raw_scatter, lookup, scatter, adagrad, lookup_ratio, scatter_ratio,
          adagrad_ratio, placing, applying, lookup_mem_ratio, scatter_mem_ratio, worker_lookup, worker_mem_ratio;
      std::vector<double> faults[4], cpu[4], raw_cpu[4];
      fault_counter counter{ps_pids};
      cpu_counter cpu_time{ps_pids}, raw_cpu_time{raw_pids};
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
        double plain = 0, huge = 0, push = 0;
        raw_cpu_time.start();
        for (const std::size_t k : per_shard) {
          plain += bench::median(raw(k * sizeof(std::int64_t), k * width * sizeof(float), n, bench::receive_into::reused));
        }
        auto [client, server] = raw_cpu_time.per_operation(n);
        for (const std::size_t k : per_shard) {
          huge += bench::median(raw(k * sizeof(std::int64_t), k * width * sizeof(float), n, bench::receive_into::reused_huge));
        }
        // The limit is the better receiver's; the CPU figures are the plain one's.
        const double pull = std::min(plain, huge);
        raw_lookup_plain.push_back(plain);
        raw_lookup_huge.push_back(huge);
        raw_cpu[0].push_back(client);
        raw_cpu[1].push_back(server);
        raw_cpu_time.start();
        for (const std::size_t k : per_shard) {
          push += bench::median(raw(k * (sizeof(std::int64_t) + width * sizeof(float)), 64, n, bench::receive_into::reused));
        }
        std::tie(client, server) = raw_cpu_time.per_operation(n);
        raw_cpu[2].push_back(client);
        raw_cpu[3].push_back(server);
        raw_lookup.push_back(pull);
        raw_scatter.push_back(push);
        placing.push_back(bench::median_sync_us(n, place));
        applying.push_back(bench::median_sync_us(n, apply));
        // An operation left out (--sparse-op) prints as 0. No co_await inside a conditional
        // expression: g++ 12 mishandles it.
        double lookup_us = 0, scatter_us = 0, adagrad_us = 0;
        start();
        if (runs("lookup")) lookup_us = co_await median_us(n, [&] { return table.embedding_lookup(id_array); });
        count(0);
        start();
        if (runs("scatter_add")) scatter_us = co_await median_us(n, [&] { return table.scatter_add(id_array, updates); });
        count(2);
        if (runs("adagrad")) {
          adagrad_us = co_await median_us(n, [&] { return table.apply_sparse_gradient(opt, id_array, updates); });
        }
        double worker_us = -1;
        if (time_on_worker && runs("lookup")) {
          auto timed = coordinator.schedule(worker_lookups, table, id_array, std::int64_t{n});
          worker_us = co_await timed.get();
        }
        worker_lookup.push_back(worker_us);
        worker_mem_ratio.push_back(worker_us < 0 ? -1.0 : worker_us / (pull + placing.back()));
        lookup.push_back(lookup_us);
        scatter.push_back(scatter_us);
        adagrad.push_back(adagrad_us);
        lookup_ratio.push_back(lookup.back() / pull);
        scatter_ratio.push_back(scatter.back() / push);
        adagrad_ratio.push_back(adagrad.back() / push);
        lookup_mem_ratio.push_back(lookup.back() / (pull + placing.back()));
        scatter_mem_ratio.push_back(scatter.back() / (push + applying.back()));
      }
      using bench::median;
      out.push_back({ids, width, median(lookup), median(scatter), median(adagrad), median(raw_lookup),
                     median(raw_lookup_plain), median(raw_lookup_huge), median(raw_scatter), median(lookup_ratio), median(scatter_ratio), median(adagrad_ratio),
                     median(placing), median(applying), median(lookup_mem_ratio), median(scatter_mem_ratio),
                     median(worker_lookup), median(worker_mem_ratio),
                     median(faults[0]), median(faults[1]), median(faults[2]), median(faults[3]), median(cpu[0]),
                     median(cpu[1]), median(cpu[2]), median(cpu[3]), median(raw_cpu[0]), median(raw_cpu[1]),
                     median(raw_cpu[2]), median(raw_cpu[3])});
    }
  });
  return out;
}

void print_sparse(const std::vector<sparse_figures>& sparse) {
  fmt::print("{:>8} {:>5} {:>9} {:>9} {:>8} {:>9} {:>6} {:>7} {:>9} {:>7} {:>10} {:>8} {:>10} {:>6} {:>7} {:>10} {:>6}   {:<22} "
             "{}\n",
             "ids", "width", "raw lk us", "raw lk hp", "place us", "lookup us", "x raw", "x +mem", "worker us", "x +mem",
             "raw sc us", "apply us",
             "scatter us", "x raw", "x +mem", "adagrad us", "x raw", "faults/op chief|ps",
             "CPU us/op chief|ps (raw client|server): lookup, scatter_add");
  auto pair = [](double self, double ps) {
    return ps < 0 ? fmt::format("{:.0f}", self) : fmt::format("{:.0f}|{:.0f}", self, ps);
  };
  for (const auto& f : sparse) {
    const auto or_dash = [](double x, int decimals) {
      return x < 0 ? std::string("-") : fmt::format("{:.{}f}", x, decimals);
    };
    fmt::print("{:>8} {:>5} {:>9.0f} {:>9.0f} {:>8.0f} {:>9.0f} {:>6.2f} {:>7.2f} {:>9} {:>7} {:>10.0f} {:>8.0f} {:>10.0f} "
               "{:>6.2f} {:>7.2f} {:>10.0f} {:>6.2f}   {:<22} {}\n",
               f.ids, f.width, f.raw_lookup_plain_us, f.raw_lookup_huge_us, f.place_us, f.lookup_us, f.lookup_ratio, f.lookup_mem_ratio,
               or_dash(f.worker_lookup_us, 0), or_dash(f.worker_lookup_mem_ratio, 2), f.raw_scatter_us, f.apply_us, f.scatter_us, f.scatter_ratio, f.scatter_mem_ratio, f.adagrad_us,
               f.adagrad_ratio,
               fmt::format("{}, {}", pair(f.lookup_faults, f.lookup_ps_faults), pair(f.scatter_faults, f.scatter_ps_faults)),
               fmt::format("{} ({}), {} ({})", pair(f.lookup_cpu, f.lookup_ps_cpu),
                           pair(f.raw_lookup_cpu, f.raw_lookup_server_cpu), pair(f.scatter_cpu, f.scatter_ps_cpu),
                           pair(f.raw_scatter_cpu, f.raw_scatter_server_cpu)));
  }
}

// The --json lines: times in microseconds (medians of rounds), as torch_rpc_peer.py prints its own.
void print_json(std::string_view layout, const std::vector<dense_figures>& dense,
                const std::vector<sparse_figures>& sparse) {
  for (const auto& f : dense) {
    std::string size = size_name(f.bytes);
    std::erase(size, ' ');
    for (const auto& [operation, us, raw_us] : {std::tuple{"read", f.read_us, f.fresh_pull_us},
                                                 std::tuple{"assign", f.assign_us, f.push_us}}) {
      fmt::print(R"({{"benchmark": "variable_bench", "layout": "{}", "operation": "{}_{}", "ps": {}, )"
                 R"("us": {:.2f}, "raw_us": {:.2f}}})"
                 "\n",
                 layout, operation, size, f.ps, us, raw_us);
    }
  }
  for (const auto& f : sparse) {
    for (const auto& [operation, us, raw_us] : {std::tuple{"embedding_lookup", f.lookup_us, f.raw_lookup_us},
                                                 std::tuple{"scatter_add", f.scatter_us, f.raw_scatter_us}}) {
      fmt::print(R"({{"benchmark": "variable_bench", "layout": "{}", "operation": "{}", "ps": 2, "ids": {}, )"
                 R"("width": {}, "us": {:.2f}, "raw_us": {:.2f}}})"
                 "\n",
                 layout, operation, f.ids, f.width, us, raw_us);
    }
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

// ---- --mode kernels ----------------------------------------------------------------------------

using small_read_latencies = xt::xarray<double>;
const pscoro::worker_function<small_read_latencies(pscoro::variable<float>, pscoro::variable<float>, std::int64_t)>
    small_reads{"bench.small_reads"};

// On the worker: reads `small` then `tiny`, one pair due every 2 ms for `millis`, and returns each
// read's latency in microseconds from when it was due, then from when it was sent ([pairs, 4]:
// small and tiny from due, small and tiny from send). From due counts the worker's own lateness
// too (its timer waking it late, which has reached tens of ms on this VM while the ps answered at
// once: RESULTS.md, 2026-11-25 05:20); from send is what the ps and the connection take.
asio::awaitable<small_read_latencies> time_small_reads(pscoro::variable<float> small, pscoro::variable<float> tiny,
                                                       std::int64_t millis) {
  asio::steady_timer timer(co_await asio::this_coro::executor);
  xt::xarray<float> small_out, tiny_out;
  std::vector<double> samples, from_send;
  const auto start = clock_type::now();
  const auto end = start + std::chrono::milliseconds(millis);
  auto due = start;
  // (No range-for over a braced list here: g++ 12 cannot put its array in a coroutine frame.)
  for (std::size_t k = 0; due < end; ++k) {
    const bool is_small = k % 2 == 0;
    timer.expires_at(due);
    co_await timer.async_wait(asio::use_awaitable);
    const auto sent = clock_type::now();
    co_await (is_small ? small : tiny).read(is_small ? small_out : tiny_out);
    const auto done = clock_type::now();
    samples.push_back(micros(done - due).count());
    from_send.push_back(micros(done - sent).count());
    due += std::chrono::milliseconds(1);
  }
  const std::size_t pairs = samples.size() / 2;
  small_read_latencies out = xt::zeros<double>({pairs, std::size_t{4}});
  for (std::size_t i = 0; i < pairs; ++i) {
    out(i, 0) = samples[2 * i];
    out(i, 1) = samples[2 * i + 1];
    out(i, 2) = from_send[2 * i];
    out(i, 3) = from_send[2 * i + 1];
  }
  co_return out;
}

void bind_kernel_bench(pscoro::server& s) { s.bind(small_reads, time_small_reads); }

// On the chief: Adagrad steps on `big` until `stop`, each step's time in `steps`.
asio::awaitable<void> step_loop(pscoro::variable<float>& big, const xt::xarray<float>& gradient, const bool& stop,
                                std::vector<double>& steps, bool& ended) {
  const pscoro::optimizers::adagrad opt{.learning_rate = 0.01};
  while (!stop) {
    const auto start = clock_type::now();
    co_await big.apply_gradient(opt, gradient);
    steps.push_back(micros(clock_type::now() - start).count());
  }
  ended = true;
}

// On the chief: sparse reads of `ids` from `big` until `stop` (each reply gathered by the ps as it
// is sent, a step per turn of its executor), each read's time in `steps`.
asio::awaitable<void> lookup_loop(pscoro::variable<float>& big, const xt::xarray<std::int64_t>& ids, const bool& stop,
                                  std::vector<double>& steps, bool& ended) {
  while (!stop) {
    const auto start = clock_type::now();
    const auto rows = co_await big.sparse_read(ids);
    steps.push_back(micros(clock_type::now() - start).count());
  }
  ended = true;
}

struct kernel_figures {
  bench::percentiles small_idle, tiny_idle, small_busy, tiny_busy;
  double small_max_busy = 0, tiny_max_busy = 0;
  bench::percentiles small_sent_busy, tiny_sent_busy;  // from each read's send
  double small_sent_max_busy = 0, tiny_sent_max_busy = 0;
  double step_us = 0;
  std::size_t steps = 0, samples = 0;
};

// `load`: "adagrad" (256 MiB Adagrad steps) or "lookup" (sparse reads of 256k random rows of it).
kernel_figures measure_kernels(bench::process_cluster& cluster, int millis, const std::string& load) {
  kernel_figures out;
  cluster.run_chief(1, [&](pscoro::parameter_server_strategy& strategy,
                           pscoro::cluster_coordinator& coordinator) -> asio::awaitable<void> {
    // Named: no braced lists inside a co_await expression (g++ 12).
    const pscoro::shape_type big_shape{std::size_t{1} << 20, 64};  // 256 MiB of float32
    const pscoro::shape_type small_shape{16, 64}, tiny_shape{1};
    const pscoro::initializer ones = pscoro::initializers::ones{};
    auto big = co_await strategy.scope().create_variable<float>("big", big_shape, ones);
    auto small = co_await strategy.scope().create_variable<float>("small", small_shape, ones);
    auto tiny = co_await strategy.scope().create_variable<float>("tiny", tiny_shape, ones);
    const xt::xarray<float> gradient(big_shape, 0.001f);  // (not ones * 0.001f: g++ 12 -O3 -Wnonnull misfires in xtensor)
    auto split = [](const small_read_latencies& l, std::size_t column) {
      std::vector<double> v;
      for (std::size_t i = 0; i < l.shape()[0]; ++i) v.push_back(l(i, column));
      return v;
    };
    // The first step creates the slot and pages everything in: not timed.
    const pscoro::optimizers::adagrad first_step{.learning_rate = 0.01};
    co_await big.apply_gradient(first_step, gradient);
    bool stop = false, ended = false;
    std::vector<double> steps;
    auto executor = co_await asio::this_coro::executor;
    xt::xarray<std::int64_t> ids = xt::zeros<std::int64_t>({std::size_t{1} << 18});
    std::mt19937_64 random(3);
    std::uniform_int_distribution<std::int64_t> pick(0, static_cast<std::int64_t>(big_shape[0]) - 1);
    for (auto& id : ids) id = pick(random);
    if (load == "lookup") {
      asio::co_spawn(executor, lookup_loop(big, ids, stop, steps, ended), asio::detached);
    } else {
      asio::co_spawn(executor, step_loop(big, gradient, stop, steps, ended), asio::detached);
    }
    auto busy_reads = coordinator.schedule(small_reads, small, tiny, std::int64_t{millis});
    const auto busy = co_await busy_reads.get();
    stop = true;
    asio::steady_timer timer(executor);
    while (!ended) {
      timer.expires_after(std::chrono::milliseconds(5));
      co_await timer.async_wait(asio::use_awaitable);
    }
    auto idle_reads = coordinator.schedule(small_reads, small, tiny, std::int64_t{millis});
    const auto idle = co_await idle_reads.get();
    const auto small_busy = split(busy, 0), tiny_busy = split(busy, 1);
    out.small_busy = bench::summarize(small_busy);
    out.tiny_busy = bench::summarize(tiny_busy);
    out.small_max_busy = *std::max_element(small_busy.begin(), small_busy.end());
    out.tiny_max_busy = *std::max_element(tiny_busy.begin(), tiny_busy.end());
    const auto small_sent = split(busy, 2), tiny_sent = split(busy, 3);
    out.small_sent_busy = bench::summarize(small_sent);
    out.tiny_sent_busy = bench::summarize(tiny_sent);
    out.small_sent_max_busy = *std::max_element(small_sent.begin(), small_sent.end());
    out.tiny_sent_max_busy = *std::max_element(tiny_sent.begin(), tiny_sent.end());
    out.small_idle = bench::summarize(split(idle, 0));
    out.tiny_idle = bench::summarize(split(idle, 1));
    out.steps = steps.size();
    out.samples = small_busy.size();
    out.step_us = steps.empty() ? 0 : bench::median(steps);
  });
  return out;
}

int run_kernel_bench(int kernel_threads, int millis, const std::string& load) {
  pscoro::server_options ps_options;
  ps_options.ps_kernel_threads = static_cast<std::size_t>(kernel_threads);
  bench::process_cluster cluster(1, 1, bind_kernel_bench, ps_options);
  const auto f = measure_kernels(cluster, millis, load);
  fmt::print("pscoro ps kernel benchmark, {:%Y-%m-%d}, {} hardware threads; ps kernel threads: {}\n",
             fmt::localtime(std::time(nullptr)), std::thread::hardware_concurrency(), kernel_threads);
  fmt::print("a worker reads a 4 KiB and a 4-byte variable, one each per 2 ms for {} ms, while the chief runs\n"
             "{} in a loop ({} of them, median {:.0f} ms each, transfers included),\n"
             "then with the ps idle; latency from when each read was due (us):\n",
             millis,
             load == "lookup" ? "sparse reads of 256k random rows of a 256 MiB variable (~58 MB replies)"
                              : "256 MiB Adagrad steps",
             f.steps, f.step_us / 1000);
  fmt::print("{:<14} {:>10} {:>10} {:>10} {:>10} {:>12} {:>12}   {}\n", "read", "idle p50", "idle p99", "step p50",
             "step p99", "step max", "p99 ratio", "samples");
  fmt::print("{:<14} {:>10.0f} {:>10.0f} {:>10.0f} {:>10.0f} {:>12.0f} {:>12.1f}   {}\n", "4 KiB", f.small_idle.p50,
             f.small_idle.p99, f.small_busy.p50, f.small_busy.p99, f.small_max_busy,
             f.small_busy.p99 / f.small_idle.p99, f.samples);
  fmt::print("{:<14} {:>10.0f} {:>10.0f} {:>10.0f} {:>10.0f} {:>12.0f} {:>12.1f}   {}\n", "4 B", f.tiny_idle.p50,
             f.tiny_idle.p99, f.tiny_busy.p50, f.tiny_busy.p99, f.tiny_max_busy, f.tiny_busy.p99 / f.tiny_idle.p99,
             f.samples);
  fmt::print("the same busy reads from when each was sent (the ps and the connection, without the worker's own\n"
             "lateness): 4 KiB p50 {:.0f}, p99 {:.0f}, max {:.0f}; 4 B p50 {:.0f}, p99 {:.0f}, max {:.0f}\n",
             f.small_sent_busy.p50, f.small_sent_busy.p99, f.small_sent_max_busy, f.tiny_sent_busy.p50,
             f.tiny_sent_busy.p99, f.tiny_sent_max_busy);
  return 0;
}

}  // namespace

// ---- --mode hash -------------------------------------------------------------------------------

struct hash_figures {
  double table_read_us;      // hash_table::lookup without insert, every id held
  double table_lookup_us;    // hash_table::lookup with insert, 90% held
  double variable_lookup_us; // sharded_variable::embedding_lookup of as many ids
  double table_adagrad_us;   // hash_table::apply_gradients, Adagrad
  double variable_adagrad_us;  // sharded_variable::apply_sparse_gradient, Adagrad
};

hash_figures measure_hash(bench::process_cluster& cluster, int scale) {
  hash_figures out{};
  cluster.run_chief(2, [&](pscoro::parameter_server_strategy& strategy,
                           pscoro::cluster_coordinator&) -> asio::awaitable<void> {
    constexpr std::size_t rows = 1000000, batch = 100000, dim = 16;
    const pscoro::shape_type shape{rows, dim};
    auto variable = co_await strategy.scope().create_sharded_variable<float>("dense", shape,
                                                                             pscoro::initializers::random_uniform{});
    pscoro::hash_table_options options;
    options.dim = dim;
    options.max_rows_per_ps = std::uint64_t{1} << 24;
    auto table = co_await strategy.scope().create_hash_table<float>("table", options);
    const int n = 10 * scale;
    // Held ids: 900,000 raw 64-bit ids, inserted first; each batch takes 90% of its ids from them
    // and 10% never seen.
    std::mt19937_64 random(17);
    std::vector<std::int64_t> held(900000);
    for (auto& id : held) id = static_cast<std::int64_t>(random());
    const pscoro::hash_lookup_options inserting{.insert = true};
    for (std::size_t k = 0; k < held.size(); k += batch) {
      const auto part = xt::adapt(held.data() + k, std::min(batch, held.size() - k), xt::no_ownership(),
                                  std::vector<std::size_t>{std::min(batch, held.size() - k)});
      const xt::xarray<std::int64_t> ids = part;
      co_await table.lookup(ids, inserting);
    }
    std::vector<xt::xarray<std::int64_t>> table_ids, variable_ids, held_ids;
    std::uniform_int_distribution<std::size_t> pick_held(0, held.size() - 1);
    std::uniform_int_distribution<std::int64_t> pick_row(0, rows - 1);
    for (int i = 0; i < 2 * n; ++i) {
      xt::xarray<std::int64_t> t = xt::xarray<std::int64_t>::from_shape({batch});
      xt::xarray<std::int64_t> v = xt::xarray<std::int64_t>::from_shape({batch});
      xt::xarray<std::int64_t> h = xt::xarray<std::int64_t>::from_shape({batch});
      for (std::size_t k = 0; k < batch; ++k) {
        t(k) = k % 10 == 0 ? static_cast<std::int64_t>(random()) : held[pick_held(random)];
        v(k) = pick_row(random);
        h(k) = held[pick_held(random)];
      }
      held_ids.push_back(std::move(h));
      table_ids.push_back(std::move(t));
      variable_ids.push_back(std::move(v));
    }
    xt::xarray<float> gradients = xt::xarray<float>::from_shape({batch, dim});
    gradients.fill(0.01f);
    const pscoro::optimizer adagrad = pscoro::optimizers::adagrad{.learning_rate = 0.01};
    std::size_t next = 0;
    out.table_read_us = co_await median_us(n, [&] { return table.lookup(held_ids[next++]); });
    next = 0;
    out.table_lookup_us = co_await median_us(n, [&] { return table.lookup(table_ids[next++], inserting); });
    next = 0;
    out.variable_lookup_us = co_await median_us(n, [&] { return variable.embedding_lookup(variable_ids[next++]); });
    next = 0;
    out.table_adagrad_us =
        co_await median_us(n, [&] { return table.apply_gradients(adagrad, table_ids[next++], gradients); });
    next = 0;
    out.variable_adagrad_us = co_await median_us(
        n, [&] { return variable.apply_sparse_gradient(adagrad, variable_ids[next++], gradients); });
  }, pscoro::fixed_shards_partitioner{2});
  return out;
}

int run_hash_bench(int scale, int rounds) {
  bench::process_cluster cluster(2, 1);
  std::vector<hash_figures> figures;
  for (int r = 0; r < rounds; ++r) figures.push_back(measure_hash(cluster, scale));
  const auto median_of = [&](auto member) {
    std::vector<double> values;
    for (const auto& f : figures) values.push_back(f.*member);
    std::sort(values.begin(), values.end());
    return values[values.size() / 2];
  };
  const auto ratios = [&](auto table, auto variable) {
    std::vector<double> values;
    for (const auto& f : figures) values.push_back(f.*table / f.*variable);
    std::sort(values.begin(), values.end());
    return std::pair{values.front(), values.back()};
  };
  fmt::print("pscoro hash table benchmark, {:%Y-%m-%d}, {} hardware threads; chief and 2 ps as processes;\n"
             "medians of {} rounds (each round: the median of 10 x scale operations of each kind, in turn)\n\n",
             fmt::localtime(std::time(nullptr)), std::thread::hardware_concurrency(), rounds);
  const auto [lookup_low, lookup_high] = ratios(&hash_figures::table_lookup_us, &hash_figures::variable_lookup_us);
  const auto [adagrad_low, adagrad_high] =
      ratios(&hash_figures::table_adagrad_us, &hash_figures::variable_adagrad_us);
  fmt::print("| 100k ids x 16 floats, 2 ps | hash table us | sharded variable us | table / variable (range) |\n");
  fmt::print("|---|---:|---:|---|\n");
  const auto [read_low, read_high] = ratios(&hash_figures::table_read_us, &hash_figures::variable_lookup_us);
  fmt::print("| lookup (table: all held, no insert) | {:.0f} | {:.0f} | {:.2f} ({:.2f}-{:.2f}) |\n",
             median_of(&hash_figures::table_read_us), median_of(&hash_figures::variable_lookup_us),
             median_of(&hash_figures::table_read_us) / median_of(&hash_figures::variable_lookup_us), read_low,
             read_high);
  fmt::print("| lookup (table: insert, 90% held) | {:.0f} | {:.0f} | {:.2f} ({:.2f}-{:.2f}) |\n",
             median_of(&hash_figures::table_lookup_us), median_of(&hash_figures::variable_lookup_us),
             median_of(&hash_figures::table_lookup_us) / median_of(&hash_figures::variable_lookup_us), lookup_low,
             lookup_high);
  fmt::print("| Adagrad step | {:.0f} | {:.0f} | {:.2f} ({:.2f}-{:.2f}) |\n",
             median_of(&hash_figures::table_adagrad_us), median_of(&hash_figures::variable_adagrad_us),
             median_of(&hash_figures::table_adagrad_us) / median_of(&hash_figures::variable_adagrad_us), adagrad_low,
             adagrad_high);
  fmt::print("\nTarget: a table's lookup with insert and its Adagrad step <= 1.3x the sharded variable's.\n");
  return 0;
}

int main(int argc, char** argv) {
  CLI::App app{"pscoro variable benchmark: dense and sparse variable operations against raw loopback TCP."};
  int scale = 1;
  int rounds = 5;
  app.add_option("--scale", scale, "multiplies the iteration counts")->check(CLI::PositiveNumber);
  app.add_option("--rounds", rounds, "rounds of raw + pscoro measurements (medians are reported)")
      ->check(CLI::PositiveNumber);
  std::string mode = "both";
  app.add_option("--mode", mode,
                 "dense operations with the ps as threads of this process, as processes of their own, or both; "
                 "kernels or hash: the benchmarks described at the top of this file")
      ->check(CLI::IsMember({"threads", "processes", "both", "kernels", "hash"}));
  int kernel_threads = 1;
  app.add_option("--kernel-threads", kernel_threads,
                 "--mode kernels: the ps's kernel threads (0: every kernel on its executor, as before the pool)")
      ->check(CLI::NonNegativeNumber);
  int millis = 4000;
  app.add_option("--millis", millis, "--mode kernels: how long the worker reads, busy and idle")
      ->check(CLI::PositiveNumber);
  std::string kernel_load = "adagrad";
  app.add_option("--kernel-load", kernel_load,
                 "--mode kernels: what keeps the ps busy: 256 MiB Adagrad steps (adagrad), or sparse reads whose "
                 "replies the ps gathers as it sends them (lookup)")
      ->check(CLI::IsMember({"adagrad", "lookup"}));
  bool dense_only = false;
  app.add_flag("--dense-only", dense_only, "only the dense table");
  std::string placement = "split";
  app.add_option("--placement", placement,
                 "processes mode: chief | ps on two CPUs (split), all on one CPU (one), or as the scheduler likes (any); "
                 "the raw exchanges are placed alike")
      ->check(CLI::IsMember({"split", "one", "any"}));
  bool sparse_only = false;
  app.add_flag("--sparse-only", sparse_only, "only the sparse tables (embedding lookups, scatters)");
  std::size_t sparse_width = 0;
  app.add_option("--sparse-width", sparse_width, "only the sparse cases of this row width (1 or 16; 0: all)");
  std::string sparse_op = "all";
  app.add_option("--sparse-op", sparse_op, "only this sparse operation (to profile one; the others print 0)")
      ->check(CLI::IsMember({"all", "lookup", "scatter_add", "adagrad"}));
  bool json = false;
  app.add_flag("--json", json, "print one JSON line per layout, operation and size instead of the tables");
  if (const auto stop = pscoro::tools::parse_command_line(app, argc, argv)) return *stop;
  ::setenv("PSCORO_LOG_LEVEL", "warning", 0);
  if (mode == "kernels") return run_kernel_bench(kernel_threads, millis, kernel_load);
  if (mode == "hash") return run_hash_bench(scale, rounds);

  // The processes are forked first, while this program has one thread.
  std::optional<bench::process_cluster> processes;
  std::optional<bench::raw_server_process> raw_server, second_raw_server;  // 2 ps: a split pull from both
  if (mode != "threads") {
    processes.emplace(2, 1, bind_sparse_bench);
    raw_server.emplace();
    second_raw_server.emplace();
  }
  std::vector<dense_figures> dense_threads, dense_processes;
  for (const int ps : {1, 2}) {
    if (sparse_only) break;
    // Interleaved: a slow phase of the machine falls on both modes.
    if (mode != "processes") {
      for (auto& f : measure_dense_threads(ps, scale, rounds)) dense_threads.push_back(f);
    }
    if (mode != "threads") {
      const auto figures =
          measure_dense_processes(*processes,
                                  ps == 1 ? std::vector{&*raw_server} : std::vector{&*raw_server, &*second_raw_server},
                                  ps, scale, rounds, bench::parse_placement(placement));
      dense_processes.insert(dense_processes.end(), figures.begin(), figures.end());
    }
  }
  if (!json) {
    const double copy_64m = bench::memcpy_bandwidth(64 << 20, 5 * scale);

    fmt::print("pscoro variable benchmark, {:%Y-%m-%d}, {} hardware threads; memcpy 64 MiB {:.2f} GB/s\n\n",
               fmt::localtime(std::time(nullptr)), std::thread::hardware_concurrency(), copy_64m / 1e9);
    fmt::print("dense: medians of {} rounds; each round measures the raw exchanges (4 KiB: ping-pong; larger: pull =\n"
               "a 64-byte request answered by the whole buffer, push = the whole buffer answered by 64 bytes; fresh =\n"
               "the pull into a fresh buffer each time, as read() into a fresh array) right before pscoro. x pull,\n"
               "x fresh, x push = pscoro time / raw time, per round. faults/op: minor page faults per operation\n"
               "(/proc/<pid>/stat minflt) of the chief's process and the ps processes'.\n",
               rounds);
    if (!dense_threads.empty()) {
      fmt::print("\nchief and ps as threads of one process (raw: two threads):\n");
      print_dense(dense_threads);
    }
    if (!dense_processes.empty()) {
      fmt::print("\nchief, ps and worker as processes (raw: two processes), placement {}:\n", placement);
      print_dense(dense_processes);
    }
    fmt::print("\nTargets: a 4 KiB read within 2x a raw round trip; 64 MiB: assign <= 1.3x the raw push, read into a\n"
               "fresh array <= 1.3x the raw pull, read(out) <= 1.0x (the raw pull reuses its buffer, like read(out)).\n");
  }
  std::vector<sparse_figures> sparse_threads, sparse_processes;
  const auto print_all_json = [&] {
    print_json("threads", dense_threads, sparse_threads);
    print_json("processes", dense_processes, sparse_processes);
    return 0;
  };
  if (dense_only) return json ? print_all_json() : 0;
  if (mode != "processes") {
    pscoro::testing::local_cluster cluster(2, 1);
    sparse_threads = measure_sparse(
        scale, rounds,
        [&](auto body) { cluster.run_chief(body, {}, {}, pscoro::fixed_shards_partitioner{2}); },
        [](std::size_t request, std::size_t response, int n, bench::receive_into where) {
          return bench::raw_exchanges(request, response, n, where);
        },
        {}, {}, sparse_width, sparse_op, false);
  }
  if (mode != "threads") {
    const bench::pinned_placement pinned(bench::parse_placement(placement),
                                         {processes->pid("ps", 0), processes->pid("ps", 1), raw_server->pid()});
    sparse_processes = measure_sparse(
        scale, rounds,
        [&](auto body) { processes->run_chief(2, body, pscoro::fixed_shards_partitioner{2}); },
        [&](std::size_t request, std::size_t response, int n, bench::receive_into where) {
          return raw_server->exchanges(request, response, n, where);
        },
        {processes->pid("ps", 0), processes->pid("ps", 1)}, {raw_server->pid()}, sparse_width, sparse_op, true);
  }
  if (json) return print_all_json();
  const bool pooled = sparse_width == 0 && sparse_op == "all";
  const auto pooling = pooled ? measure_pooling(scale) : pooling_figures{};
  fmt::print("\nsparse, uniform ids over a 1M-row float table on 2 ps: medians of {} rounds; each round measures the\n"
             "raw exchanges of the same bytes right before pscoro: per ps in turn, its ids out (8 bytes each) and\n"
             "their rows back (raw lk: into a plain buffer; raw lk hp: into huge pages; x raw and x +mem use the\n"
             "faster of the two), or its ids and rows out and 64 bytes back (raw sc, also adagrad's limit).\n"
             "Sequential over one connection: pscoro asks both ps at once. ps-lite is not a Debian package, so\n"
             "the raw exchange is the comparison. place us / apply us: the memory work the raw exchange leaves\n"
             "out, done by this thread in the same round (the rows copied to their places in a fresh result in\n"
             "input order; the rows added at their ids into a local table in huge pages, as a ps's kernel does);\n"
             "x +mem: pscoro against raw + that, the floor (the same work one part after the other; not a bound:\n"
             "pscoro overlaps them, and its 2 ps apply at once; target: lookup <= 1.15x it). worker us: the same\n"
             "lookups timed on a worker (processes only), and its x +mem against the same floor.\n"
             "faults/op as above; CPU us/op: CPU time per operation of this process (the chief, or the raw\n"
             "client) and of the ps processes together (or the raw server).\n",
             rounds);
  if (!sparse_threads.empty()) {
    fmt::print("\nchief and ps as threads of one process (raw: two threads):\n");
    print_sparse(sparse_threads);
  }
  if (!sparse_processes.empty()) {
    fmt::print("\nchief and ps as processes (raw: two processes), placement {}:\n", placement);
    print_sparse(sparse_processes);
  }
  fmt::print("\nTargets: embedding_lookup and scatter_add of 100k x 16 <= 2x raw (x raw).\n");
  if (!pooled) return 0;
  fmt::print("\npooled (1M x 16, 2 ps): 4,096 rows x 26 ids, weighted mean: embedding_lookup of the 106,496 ids\n"
             "{:.0f} us; embedding_lookup_sparse {:.0f} us; safe_embedding_lookup_sparse (every 10th id -1) {:.0f} us\n",
             pooling.lookup_us, pooling.sparse_us, pooling.safe_us);
  return 0;
}

// Cluster benchmark: a no-op closure's schedule -> result latency and the closure throughput,
// against the machine's own raw loopback TCP round trip measured in the same run.
//
// Two layouts (--mode): the ps and workers as threads of this process, against a raw round trip
// between two threads; and as processes of their own (forked at the start), against a raw round
// trip between two processes, placed on the CPUs alike (--placement, process_cluster.hpp). All on
// 127.0.0.1, so the raw round trip and pscoro cross the same kernel path. Quote the ratios, not the
// absolute times: the machine is shared and noisy.
//
// --json prints, instead of the tables, one JSON object a line per layout and operation (1 worker:
// noop_round_trip, its p50 latency; noop_throughput, time per closure at --in-flight), with the
// raw figure beside it: what torch_rpc_bench.py reads to set pscoro beside PyTorch's RPC.
#include "command_line.hpp"
#include "local_cluster.hpp"
#include "process_cluster.hpp"
#include "raw_limits.hpp"

#include <pscoro/pscoro.hpp>

#include <fmt/chrono.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <fstream>
#include <optional>
#include <string_view>
#include <thread>
#include <vector>

#include <unistd.h>

namespace {

using bench::clock_type;
using bench::median;
using bench::micros;
using bench::percentiles;
using bench::summarize;

// Smaller than the default bound, so that the flood fills the queue early and the plateau shows.
constexpr std::size_t flood_queue_bound = 65536;

const pscoro::worker_function<void()> noop{"bench.noop"};

struct closure_figures {
  percentiles latency;
  double throughput;  // closures per second, median of rounds
  // Resident memory before the flood and after each quarter of it (1 worker run only).
  double rss_before_mib = 0;
  std::vector<double> rss_quarters_mib;
};

// Resident memory of this process, in MiB.
double resident_mib() {
  std::ifstream statm("/proc/self/statm");
  std::size_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return static_cast<double>(resident) * static_cast<double>(::sysconf(_SC_PAGESIZE)) / (1 << 20);
}

void bind_noop(pscoro::server& s) {
  s.bind(noop, []() -> asio::awaitable<void> { co_return; });
}

// `run_chief(body, options)` runs a chief with one ps and the workers measured.
template <class RunChief>
closure_figures measure_closures(RunChief run_chief, std::size_t in_flight, int latency_iterations,
                                 int throughput_closures, int rounds, int flood) {
  closure_figures out{};
  pscoro::coordinator_options options;
  options.closures_per_worker = in_flight;
  options.max_queued_closures = flood_queue_bound;
  run_chief(
      [&](pscoro::parameter_server_strategy&, pscoro::cluster_coordinator& coordinator) -> asio::awaitable<void> {
        std::vector<double> samples;
        samples.reserve(latency_iterations);
        for (int i = -latency_iterations / 10; i < latency_iterations; ++i) {
          const auto start = clock_type::now();
          auto result = coordinator.schedule(noop);
          co_await result.get();
          if (i >= 0) samples.push_back(micros(clock_type::now() - start).count());
        }
        out.latency = summarize(std::move(samples));
        std::vector<double> rates;
        for (int round = 0; round < rounds; ++round) {
          const auto start = clock_type::now();
          for (int i = 0; i < throughput_closures; ++i) coordinator.schedule(noop);
          co_await coordinator.join();
          rates.push_back(throughput_closures / std::chrono::duration<double>(clock_type::now() - start).count());
        }
        out.throughput = median(std::move(rates));
        if (flood > 0) {
          // Many more closures than the queue holds: memory must stay flat.
          out.rss_before_mib = resident_mib();
          for (int i = 1; i <= flood; ++i) {
            (void)co_await coordinator.wait_and_schedule(noop);
            if (i % (flood / 4) == 0) out.rss_quarters_mib.push_back(resident_mib());
          }
          co_await coordinator.join();
        }
      },
      options);
  return out;
}

closure_figures measure_closures_threads(int workers, std::size_t in_flight, int latency_iterations,
                                         int throughput_closures, int rounds, int flood) {
  pscoro::testing::local_cluster cluster(1, workers, bind_noop);
  return measure_closures([&](auto body, pscoro::coordinator_options options) { cluster.run_chief(body, options); },
                          in_flight, latency_iterations, throughput_closures, rounds, flood);
}

closure_figures measure_closures_processes(bench::process_cluster& cluster, int workers, std::size_t in_flight,
                                           int latency_iterations, int throughput_closures, int rounds) {
  return measure_closures(
      [&](auto body, pscoro::coordinator_options options) { cluster.run_chief(1, workers, body, {}, options); },
      in_flight, latency_iterations, throughput_closures, rounds, 0);
}

// One layout's figures: the raw round trips and the closures with 1 and 2 workers.
struct layout_figures {
  percentiles raw64, raw4k;
  double raw_pipelined = 0;  // 64 B exchanges/s with in_flight of them in flight (processes only)
  closure_figures one, two;
};

void print_layout(std::string_view title, const layout_figures& f, std::size_t in_flight) {
  fmt::print("{}\n", title);
  fmt::print("{:<36} {:>10} {:>10} {:>16}\n", "latency (schedule -> result)", "p50 us", "p99 us", "p50 / raw 64 B");
  auto latency_row = [&](std::string_view name, percentiles p) {
    fmt::print("{:<36} {:>10.1f} {:>10.1f} {:>16.2f}\n", name, p.p50, p.p99, p.p50 / f.raw64.p50);
  };
  latency_row("raw TCP round trip, 64 B", f.raw64);
  latency_row("raw TCP round trip, 4 KiB", f.raw4k);
  latency_row("no-op closure, 1 worker", f.one.latency);
  latency_row("no-op closure, 2 workers", f.two.latency);
  fmt::print("\n{:<36} {:>21} {:>16} {:>14}\n", fmt::format("throughput ({} in flight per worker)", in_flight),
             "closures/s (median)", "/ 20,000 target", "/ raw echo");
  const auto to_raw = [&](double rate) {
    return f.raw_pipelined > 0 ? fmt::format("{:.2f}", rate / f.raw_pipelined) : std::string("-");
  };
  if (f.raw_pipelined > 0) {
    fmt::print("{:<36} {:>21.0f} {:>16} {:>14}\n", fmt::format("raw pipelined echo, 64 B, {} in flight", in_flight),
               f.raw_pipelined, "", "1.00");
  }
  fmt::print("{:<36} {:>21.0f} {:>16.2f} {:>14}\n", "no-op closures, 1 worker", f.one.throughput,
             f.one.throughput / 20000, to_raw(f.one.throughput));
  fmt::print("{:<36} {:>21.0f} {:>16.2f} {:>14}\n\n", "no-op closures, 2 workers", f.two.throughput,
             f.two.throughput / 20000, to_raw(f.two.throughput));
}

// The --json lines of one layout: times in microseconds, as torch_rpc_peer.py prints its own.
void print_json(std::string_view layout, const layout_figures& f, std::size_t in_flight) {
  fmt::print(R"({{"benchmark": "cluster_bench", "layout": "{}", "operation": "noop_round_trip", "workers": 1, )"
             R"("us": {:.2f}, "raw_us": {:.2f}}})"
             "\n",
             layout, f.one.latency.p50, f.raw64.p50);
  const auto per_call = [](double rate) { return rate > 0 ? fmt::format("{:.3f}", 1e6 / rate) : std::string("null"); };
  fmt::print(R"({{"benchmark": "cluster_bench", "layout": "{}", "operation": "noop_throughput", "workers": 1, )"
             R"("window": {}, "us": {}, "raw_us": {}}})"
             "\n",
             layout, in_flight, per_call(f.one.throughput), per_call(f.raw_pipelined));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"pscoro cluster benchmark: closure latency and throughput against raw loopback TCP."};
  int iterations = 20000;
  int closures = 50000;
  int rounds = 5;
  std::size_t in_flight = 8;
  int flood = 4000000;
  std::string mode = "both";
  std::string placement = "split";
  app.add_option("--iterations", iterations, "round trips per latency measurement")->check(CLI::PositiveNumber);
  app.add_option("--closures", closures, "closures per throughput round")->check(CLI::PositiveNumber);
  app.add_option("--rounds", rounds, "throughput rounds (the median is reported)")->check(CLI::PositiveNumber);
  app.add_option("--in-flight", in_flight, "closures in flight per worker for throughput")->check(CLI::PositiveNumber);
  app.add_option("--flood", flood, "closures pushed through the bounded queue to check memory (0: skip; threads mode)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--mode", mode, "the ps and workers as threads of this process, as processes of their own, or both")
      ->check(CLI::IsMember({"threads", "processes", "both"}));
  app.add_option("--placement", placement,
                 "processes mode: the chief on one CPU and the ps and workers on the other (split), all on one CPU "
                 "(one), or as the scheduler likes (any); the raw round trips are placed alike")
      ->check(CLI::IsMember({"split", "one", "any"}));
  bool json = false;
  app.add_flag("--json", json, "print one JSON line per layout and operation instead of the tables");
  if (const auto stop = pscoro::tools::parse_command_line(app, argc, argv)) return *stop;
  if (flood < 4) flood = 0;  // reported by quarters
  ::setenv("PSCORO_LOG_LEVEL", "warning", 0);

  // The processes are forked first, while this program has one thread.
  std::optional<bench::process_cluster> processes;
  std::optional<bench::raw_server_process> raw_server;
  if (mode != "threads") {
    processes.emplace(1, 2, bind_noop);
    raw_server.emplace();
  }
  std::optional<layout_figures> threads, separate;
  if (mode != "processes") {
    threads.emplace();
    threads->raw64 = summarize(bench::raw_exchanges(64, 64, iterations));
    threads->raw4k = summarize(bench::raw_exchanges(4096, 4096, iterations));
    threads->one = measure_closures_threads(1, in_flight, iterations, closures, rounds, flood);
    threads->two = measure_closures_threads(2, in_flight, iterations, closures, rounds, 0);
  }
  if (mode != "threads") {
    std::vector<pid_t> servers = processes->pids();
    servers.push_back(raw_server->pid());
    const bench::pinned_placement pinned(bench::parse_placement(placement), servers);
    separate.emplace();
    separate->raw64 = summarize(raw_server->exchanges(64, 64, iterations));
    separate->raw4k = summarize(raw_server->exchanges(4096, 4096, iterations));
    std::vector<double> echo;
    for (int round = 0; round < rounds; ++round) {
      echo.push_back(raw_server->pipelined(64, 64, in_flight, static_cast<std::size_t>(closures)));
    }
    separate->raw_pipelined = median(std::move(echo));
    separate->one = measure_closures_processes(*processes, 1, in_flight, iterations, closures, rounds);
    separate->two = measure_closures_processes(*processes, 2, in_flight, iterations, closures, rounds);
  }

  if (json) {
    if (threads) print_json("threads", *threads, in_flight);
    if (separate) print_json("processes", *separate, in_flight);
    return 0;
  }
  const std::time_t now = std::time(nullptr);
  fmt::print("pscoro cluster benchmark, {:%Y-%m-%d}, {} hardware threads\n\n", fmt::localtime(now),
             std::thread::hardware_concurrency());
  if (threads) print_layout("chief, ps and workers as threads of one process (raw: two threads):", *threads, in_flight);
  if (separate) {
    print_layout(fmt::format("chief, ps and workers as processes (raw: two processes), placement {}:", placement),
                 *separate, in_flight);
  }
  if (threads && flood > 0) {
    fmt::print("resident memory while {} closures flow through a queue bounded at {} (threads, 1 worker):\n"
               "  {:.1f} MiB before; after each quarter:", flood, flood_queue_bound,
               threads->one.rss_before_mib);
    for (const double mib : threads->one.rss_quarters_mib) fmt::print(" {:.1f}", mib);
    fmt::print(" MiB (it rises while the queue fills, then stays flat)\n\n");
  }
  fmt::print("raw TCP round trip at 1 closure in flight bounds latency; throughput is bounded by the\n"
             "per-closure CPU cost on {} hardware threads shared by chief, ps and workers (the raw pipelined\n"
             "echo: two processes, the same window; target: 1 worker >= 0.5x it).\n\n",
             std::thread::hardware_concurrency());
  return 0;
}

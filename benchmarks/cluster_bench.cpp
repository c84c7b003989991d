// Cluster benchmark: a no-op closure's schedule -> result latency and the closure throughput,
// against the machine's own raw loopback TCP round trip measured in the same run.
//
// Everything runs in one process on 127.0.0.1 (servers on their own threads), so the raw round
// trip and pscoro cross the same kernel path. Quote the ratios, not the absolute times: the
// machine is shared and noisy.
#include "local_cluster.hpp"
#include "raw_limits.hpp"

#include <pscoro/pscoro.hpp>

#include <CLI/CLI.hpp>

#include <fmt/chrono.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <fstream>

#include <unistd.h>
#include <thread>
#include <vector>

namespace {

using bench::clock_type;
using bench::median;
using bench::micros;
using bench::percentiles;
using bench::raw_round_trip;
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

closure_figures measure_closures(int workers, std::size_t in_flight, int latency_iterations, int throughput_closures,
                                 int rounds, int flood) {
  pscoro::testing::local_cluster cluster(1, workers, [](pscoro::server& s) {
    s.bind(noop, []() -> asio::awaitable<void> { co_return; });
  });
  closure_figures out{};
  pscoro::coordinator_options options;
  options.closures_per_worker = in_flight;
  options.max_queued_closures = flood_queue_bound;
  cluster.run_chief(
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

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"pscoro cluster benchmark: closure latency and throughput against raw loopback TCP."};
  int iterations = 20000;
  int closures = 50000;
  int rounds = 5;
  std::size_t in_flight = 8;
  int flood = 4000000;
  app.add_option("--iterations", iterations, "round trips per latency measurement")->check(CLI::PositiveNumber);
  app.add_option("--closures", closures, "closures per throughput round")->check(CLI::PositiveNumber);
  app.add_option("--rounds", rounds, "throughput rounds (the median is reported)")->check(CLI::PositiveNumber);
  app.add_option("--in-flight", in_flight, "closures in flight per worker for throughput")->check(CLI::PositiveNumber);
  app.add_option("--flood", flood, "closures pushed through the bounded queue to check memory (0: skip)")
      ->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);
  if (flood < 4) flood = 0;  // reported by quarters
  ::setenv("PSCORO_LOG_LEVEL", "warning", 0);

  const auto raw64 = raw_round_trip(64, iterations);
  const auto raw4k = raw_round_trip(4096, iterations);
  const auto one = measure_closures(1, in_flight, iterations, closures, rounds, flood);
  const auto two = measure_closures(2, in_flight, iterations, closures, rounds, 0);

  const std::time_t now = std::time(nullptr);
  fmt::print("pscoro cluster benchmark, {:%Y-%m-%d}, {} hardware threads\n\n", fmt::localtime(now),
             std::thread::hardware_concurrency());
  fmt::print("{:<36} {:>10} {:>10} {:>16}\n", "latency (schedule -> result)", "p50 us", "p99 us", "p50 / raw 64 B");
  auto latency_row = [&](std::string_view name, percentiles p) {
    fmt::print("{:<36} {:>10.1f} {:>10.1f} {:>16.2f}\n", name, p.p50, p.p99, p.p50 / raw64.p50);
  };
  latency_row("raw TCP round trip, 64 B", raw64);
  latency_row("raw TCP round trip, 4 KiB", raw4k);
  latency_row("no-op closure, 1 worker", one.latency);
  latency_row("no-op closure, 2 workers", two.latency);
  fmt::print("\n{:<36} {:>21} {:>16}\n", fmt::format("throughput ({} in flight per worker)", in_flight),
             "closures/s (median)", "/ 20,000 target");
  fmt::print("{:<36} {:>21.0f} {:>16.2f}\n", "no-op closures, 1 worker", one.throughput, one.throughput / 20000);
  fmt::print("{:<36} {:>21.0f} {:>16.2f}\n", "no-op closures, 2 workers", two.throughput, two.throughput / 20000);
  if (flood > 0) {
    fmt::print("\nresident memory while {} closures flow through a queue bounded at {} (1 worker):\n"
               "  {:.1f} MiB before; after each quarter:", flood, flood_queue_bound,
               one.rss_before_mib);
    for (const double mib : one.rss_quarters_mib) fmt::print(" {:.1f}", mib);
    fmt::print(" MiB (it rises while the queue fills, then stays flat)\n");
  }
  fmt::print("\nraw TCP round trip at 1 closure in flight bounds latency; throughput is bounded by the\n"
             "per-closure CPU cost on {} hardware threads shared by chief, ps and workers.\n\n",
             std::thread::hardware_concurrency());
  return 0;
}

// Metrics benchmark: what metrics cost the no-op closure throughput and a 4 KiB
// variable read, as ratios measured in one run. Three modes take turns round by round, so that the
// machine's drift falls on all of them alike: metrics off (metrics::set_enabled(false): no update,
// no clock read for timings), on (the default), and on while a thread scrapes /metrics without a
// every 10 ms (--scrape-ms; 0: without a pause), a thousand times what a Prometheus server
// scraping every 15 s or so asks.
//
// One process on 127.0.0.1: chief, one ps and one worker on their threads, as cluster_bench.
#include "command_line.hpp"
#include "local_cluster.hpp"
#include "raw_limits.hpp"

#include <pscoro/metrics.hpp>
#include <pscoro/pscoro.hpp>

#include <asio/connect.hpp>
#include <asio/read.hpp>
#include <asio/write.hpp>

#include <fmt/chrono.h>
#include <fmt/format.h>

#include <array>
#include <atomic>
#include <ctime>
#include <thread>
#include <vector>

namespace {

using bench::clock_type;
using bench::median;
using bench::micros;

const pscoro::worker_function<void()> noop{"bench.noop"};

enum mode { off, on, scraped };
constexpr std::array<const char*, 3> mode_names{"metrics off", "metrics on", "on and scraped"};

// Scrapes 127.0.0.1:`port`/metrics every `interval` until `stop`; counts the scrapes.
void scrape_loop(std::uint16_t port, std::chrono::milliseconds interval, const std::atomic<bool>& stop,
                 std::atomic<long>& scrapes) {
  asio::io_context io;
  const std::string request = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
  while (!stop.load()) {
    asio::ip::tcp::socket socket(io);
    std::error_code ec;
    socket.connect({asio::ip::make_address("127.0.0.1"), port}, ec);
    if (ec) continue;
    asio::write(socket, asio::buffer(request), ec);
    std::string response;
    asio::read(socket, asio::dynamic_buffer(response), ec);
    ++scrapes;
    std::this_thread::sleep_for(interval);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"pscoro metrics benchmark: closure throughput and 4 KiB reads with metrics off, on and scraped."};
  int rounds = 30;
  int closures = 10000;
  int reads = 2000;
  std::size_t in_flight = 8;
  int scrape_ms = 10;
  app.add_option("--rounds", rounds, "rounds per mode (medians are reported)")->check(CLI::PositiveNumber);
  app.add_option("--closures", closures, "no-op closures per throughput round")->check(CLI::PositiveNumber);
  app.add_option("--reads", reads, "4 KiB reads per latency round")->check(CLI::PositiveNumber);
  app.add_option("--in-flight", in_flight, "closures in flight per worker")->check(CLI::PositiveNumber);
  app.add_option("--scrape-ms", scrape_ms, "milliseconds between scrapes in the scraped mode (0: none)")
      ->check(CLI::NonNegativeNumber);
  if (const auto stop = pscoro::tools::parse_command_line(app, argc, argv)) return *stop;
  ::setenv("PSCORO_LOG_LEVEL", "warning", 0);

  pscoro::metrics::exposer exposer("127.0.0.1:0");
  std::array<std::vector<double>, 3> rates, read_us;
  long scrapes = 0;
  pscoro::testing::local_cluster cluster(1, 1, [](pscoro::server& s) {
    s.bind(noop, []() -> asio::awaitable<void> { co_return; });
  });
  pscoro::coordinator_options options;
  options.closures_per_worker = in_flight;
  cluster.run_chief(
      [&](pscoro::parameter_server_strategy& strategy, pscoro::cluster_coordinator& coordinator)
          -> asio::awaitable<void> {
        const xt::xarray<float> initial = xt::ones<float>({std::size_t{1024}});
        auto v = co_await strategy.scope().create_variable("bench/4k", initial);
        xt::xarray<float> out = initial;
        for (int round = -1; round < rounds; ++round) {  // round -1 warms up and is not counted
          // The order of the modes turns each round.
          for (int k = 0; k < 3; ++k) {
            const auto m = static_cast<mode>((k + round + 3) % 3);
            pscoro::metrics::set_enabled(m != off);
            std::atomic<bool> stop{false};
            std::atomic<long> scraped_now{0};
            std::thread scraper;
            if (m == scraped) scraper = std::thread(scrape_loop, exposer.port(), std::chrono::milliseconds(scrape_ms), std::cref(stop),
                                  std::ref(scraped_now));

            auto start = clock_type::now();
            for (int i = 0; i < closures; ++i) coordinator.schedule(noop);
            co_await coordinator.join();
            const double rate = closures / std::chrono::duration<double>(clock_type::now() - start).count();
            std::vector<double> samples;
            samples.reserve(static_cast<std::size_t>(reads));
            for (int i = 0; i < reads; ++i) {
              start = clock_type::now();
              co_await v.read(out);
              samples.push_back(micros(clock_type::now() - start).count());
            }

            stop = true;
            if (scraper.joinable()) scraper.join();
            if (round >= 0) {
              rates[m].push_back(rate);
              read_us[m].push_back(median(std::move(samples)));
              scrapes += scraped_now.load();
            }
          }
        }
        pscoro::metrics::set_enabled(true);
      },
      options);

  const std::time_t now = std::time(nullptr);
  fmt::print("pscoro metrics benchmark, {:%Y-%m-%d}, {} hardware threads, {} rounds per mode "
             "(modes interleaved)\n\n",
             fmt::localtime(now), std::thread::hardware_concurrency(), rounds);
  fmt::print("{:<22} {:>18} {:>10} {:>18} {:>10}\n", "mode", "no-op closures/s", "/ off", "4 KiB read p50 us",
             "/ off");  // medians over rounds; "/ off": the median of the rounds' paired ratios
  // Ratios are paired: each mode against the off run of the same round (run next to it), then the
  // median over rounds, so that load from elsewhere moving between rounds cancels out.
  auto paired = [&](const std::array<std::vector<double>, 3>& figures, mode m) {
    std::vector<double> ratios;
    for (std::size_t r = 0; r < figures[m].size(); ++r) ratios.push_back(figures[m][r] / figures[off][r]);
    return median(std::move(ratios));
  };
  for (const auto m : {off, on, scraped}) {
    fmt::print("{:<22} {:>18.0f} {:>10.3f} {:>18.1f} {:>10.3f}\n", mode_names[m], median(rates[m]), paired(rates, m),
               median(read_us[m]), paired(read_us, m));
  }
  fmt::print("\nmetrics on: closures/s x{:.3f}, 4 KiB read time x{:.3f} (target: closures/s >= x0.97, read time\n"
             "<= x1.03); on and scraped every {} ms ({} scrapes): closures/s x{:.3f}, read time x{:.3f}\n",
             paired(rates, on), paired(read_us, on), scrape_ms, scrapes, paired(rates, scraped),
             paired(read_us, scraped));
  return 0;
}

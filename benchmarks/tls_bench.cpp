// TLS benchmark: what mutual TLS costs a variable's round trip and a 64 MiB pull, against the same
// cluster without it and against the raw loopback exchange, all measured in the same run.
//
// Two in-process clusters on 127.0.0.1 (plain, then TLS with certificates made by the `openssl`
// command); each round measures the raw exchange, then plain, then TLS. Quote the ratios: the
// machine is shared and noisy.
#include "command_line.hpp"
#include "local_cluster.hpp"
#include "raw_limits.hpp"
#include "test_certificates.hpp"

#include <pscoro/pscoro.hpp>

#include <fmt/chrono.h>
#include <fmt/format.h>

#include <ctime>
#include <thread>
#include <vector>

namespace {

using bench::clock_type;
using bench::micros;

using bench::median_us;

// Median read(out) time of a `bytes` variable on a 1-ps cluster with `transport`, in microseconds.
double read_us(const pscoro::transport_options& transport, std::size_t bytes, int iterations) {
  pscoro::server_options servers;
  servers.transport = transport;
  pscoro::strategy_options chief;
  chief.transport = transport;
  pscoro::testing::local_cluster cluster(1, 1, {}, servers);
  double out = 0;
  cluster.run_chief(
      [&](pscoro::parameter_server_strategy& strategy, pscoro::cluster_coordinator&) -> asio::awaitable<void> {
        const pscoro::shape_type shape{bytes / sizeof(float) / 64, 64};
        auto v = co_await strategy.scope().create_variable<float>("v", shape, pscoro::initializers::ones{});
        xt::xarray<float> into(shape);
        out = co_await median_us(iterations, [&] { return v.read(into); });
      },
      {}, chief);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"pscoro TLS benchmark: variable reads with and without mutual TLS against raw loopback TCP."};
  int rounds = 5;
  int scale = 1;
  app.add_option("--rounds", rounds, "rounds of raw + plain + TLS measurements (medians reported)")
      ->check(CLI::PositiveNumber);
  app.add_option("--scale", scale, "multiplies the iteration counts")->check(CLI::PositiveNumber);
  if (const auto stop = pscoro::tools::parse_command_line(app, argc, argv)) return *stop;
  ::setenv("PSCORO_LOG_LEVEL", "warning", 0);

  const pscoro::testing::certificates certs;
  struct row {
    std::size_t bytes;
    int iterations;
    std::vector<double> raw, plain, tls;
  };
  std::vector<row> rows{{std::size_t{4} << 10, 500 * scale, {}, {}, {}},
                        {std::size_t{64} << 20, 3 * scale, {}, {}, {}}};
  for (int round = 0; round < rounds; ++round) {
    for (auto& r : rows) {
      r.raw.push_back(bench::median(r.bytes <= 4096 ? bench::raw_exchanges(r.bytes, r.bytes, r.iterations)
                                                    : bench::raw_exchanges(64, r.bytes, r.iterations)));
      r.plain.push_back(read_us({}, r.bytes, r.iterations));
      r.tls.push_back(read_us(certs.transport(), r.bytes, r.iterations));
    }
  }

  fmt::print("pscoro TLS benchmark, {:%Y-%m-%d}, {} hardware threads; medians of {} rounds\n\n",
             fmt::localtime(std::time(nullptr)), std::thread::hardware_concurrency(), rounds);
  fmt::print("{:<26} {:>10} {:>10} {:>10} {:>11} {:>11} {:>11}\n", "read(out) of a variable", "raw us", "plain us",
             "TLS us", "plain x raw", "TLS x raw", "TLS x plain");
  for (auto& r : rows) {
    const double raw = bench::median(r.raw), plain = bench::median(r.plain), tls = bench::median(r.tls);
    fmt::print("{:<26} {:>10.1f} {:>10.1f} {:>10.1f} {:>11.2f} {:>11.2f} {:>11.2f}\n",
               r.bytes <= 4096 ? "4 KiB (a round trip)" : "64 MiB (a pull)", raw, plain, tls, plain / raw, tls / raw,
               tls / plain);
  }
  fmt::print("\nTLS 1.3 (AES-GCM with the CPU's AES instructions where it has them) encrypts and decrypts\n"
             "every byte on both sides: a pull pays two passes over the data on 2 shared cores.\n");
  return 0;
}

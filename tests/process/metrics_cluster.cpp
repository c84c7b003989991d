// A cluster for tests/process/metrics_test.sh: every role in one binary, as hello_cluster. Workers
// read lines of a file through a per-worker dataset and add their lengths to a variable on the ps;
// the chief schedules STEPS such closures, prints "chief: ran STEPS closures", and holds the cluster
// up until the file RELEASE exists (the test scrapes every task meanwhile), then ends the job.
//
//   metrics_cluster STEPS DATA_FILE RELEASE_FILE
#include <pscoro/pscoro.hpp>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace {

const pscoro::dataset_function<std::string> lines{"metrics.lines"};
const pscoro::worker_function<std::int64_t(pscoro::variable<double>, pscoro::per_worker_iterator<std::string>)> step{
    "metrics.step"};

asio::awaitable<int> run_chief(pscoro::parameter_server_strategy& strategy, int steps, std::string release) {
  co_await strategy.connect();
  pscoro::cluster_coordinator coordinator(strategy);
  const xt::xarray<double> zero{0};
  const auto total = co_await strategy.scope().create_variable("metrics/total", zero);
  const auto it = co_await coordinator.create_per_worker_dataset(lines).iter();
  for (int k = 0; k < steps; ++k) coordinator.schedule(step, total, it);
  co_await coordinator.join();
  std::printf("chief: ran %d closures\n", steps);
  std::fflush(stdout);
  asio::steady_timer timer(co_await asio::this_coro::executor);
  while (!std::filesystem::exists(release)) {
    timer.expires_after(std::chrono::milliseconds(50));
    co_await timer.async_wait(asio::use_awaitable);
  }
  co_return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: metrics_cluster STEPS DATA_FILE RELEASE_FILE\n");
    return 2;
  }
  const int steps = std::atoi(argv[1]);
  const std::string data = argv[2];
  try {
    const auto resolver = pscoro::auto_cluster_resolver();
    if (resolver.task_type() == "ps") return pscoro::run_server(resolver);
    if (resolver.task_type() == "worker") {
      return pscoro::run_server(resolver, [data](pscoro::server& s) {
        s.bind(lines, [data](pscoro::input_context) { return pscoro::text_lines({data}).repeat(); });
        s.bind(step, [](pscoro::variable<double> total,
                        pscoro::per_worker_iterator<std::string> it) -> asio::awaitable<std::int64_t> {
          const auto line = co_await it.next_async();
          const xt::xarray<double> added{static_cast<double>(line.size())};
          co_await total.assign_add(added);
          co_return static_cast<std::int64_t>(line.size());
        });
      });
    }
    asio::io_context io;
    pscoro::parameter_server_strategy strategy(io.get_executor(), resolver);
    int exit_code = 1;
    asio::co_spawn(io, run_chief(strategy, steps, argv[3]), [&](std::exception_ptr e, int code) {
      if (e) {
        try {
          std::rethrow_exception(e);
        } catch (const std::exception& x) {
          std::fprintf(stderr, "metrics_cluster: %s\n", x.what());
        }
      }
      exit_code = e ? 1 : code;
      strategy.close(exit_code);
    });
    io.run();
    return exit_code;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "metrics_cluster: %s\n", e.what());
    return 1;
  }
}

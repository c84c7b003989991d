// A cluster for tests/process/elastic_test.sh: every role in one binary, as hello_cluster. Each
// worker reads its shard of 0..999 through a per-worker dataset; the chief admits up to one worker
// beyond its cluster spec (coordinator_options::max_elastic_workers = 1) and schedules closures,
// eight at a time, until the file RELEASE exists. It prints "chief: first closure on worker:N" the
// first time a worker runs one and, at the end, how many ran on each worker; then it ends the job.
//
//   elastic_cluster RELEASE_FILE
#include <pscoro/pscoro.hpp>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>

#include <cstdio>
#include <filesystem>
#include <map>
#include <numeric>
#include <string>
#include <vector>

namespace {

const pscoro::dataset_function<std::int64_t> numbers{"elastic.numbers"};
// Takes the next number of the worker's shard; returns "worker:N" (the worker it ran on).
const pscoro::worker_function<std::string(pscoro::per_worker_iterator<std::int64_t>)> step{"elastic.step"};

asio::awaitable<int> run_chief(pscoro::parameter_server_strategy& strategy, std::string release) {
  co_await strategy.connect();
  pscoro::cluster_coordinator coordinator(strategy, pscoro::coordinator_options{.max_elastic_workers = 1});
  const auto it = co_await coordinator.create_per_worker_dataset(numbers).iter();
  std::map<std::string, int> runs;  // per worker
  while (!std::filesystem::exists(release)) {
    std::vector<pscoro::remote_value<std::string>> results;
    for (int k = 0; k < 8; ++k) results.push_back(coordinator.schedule(step, it));
    for (const auto& where : co_await pscoro::cluster_coordinator::fetch(std::move(results))) {
      if (runs[where]++ == 0) pscoro::print_line("chief: first closure on " + where);
    }
  }
  std::string counts = "chief: closures per worker:";
  for (const auto& [worker, n] : runs) counts += " " + worker + "=" + std::to_string(n);
  pscoro::print_line(counts);
  co_return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: elastic_cluster RELEASE_FILE\n");
    return 2;
  }
  try {
    const auto resolver = pscoro::auto_cluster_resolver();
    if (resolver.task_type() == "ps") return pscoro::run_server(resolver);
    if (resolver.task_type() == "worker") {
      return pscoro::run_server(resolver, [](pscoro::server& s) {
        s.bind(numbers, [](pscoro::input_context context) {
          std::vector<std::int64_t> all(1000);
          std::iota(all.begin(), all.end(), 0);
          return pscoro::from_values(all).shard(context.num_workers, context.worker_index).repeat();
        });
        s.bind(step, [&s](pscoro::per_worker_iterator<std::int64_t> it) -> asio::awaitable<std::string> {
          (void)co_await it.next_async();
          co_return s.task();  // the index the chief gave it, for an admitted worker
        });
      });
    }
    asio::io_context io;
    pscoro::parameter_server_strategy strategy(io.get_executor(), resolver);
    int exit_code = 1;
    asio::co_spawn(io, run_chief(strategy, argv[1]), [&](std::exception_ptr e, int code) {
      if (e) {
        try {
          std::rethrow_exception(e);
        } catch (const std::exception& x) {
          std::fprintf(stderr, "elastic_cluster: %s\n", x.what());
        }
      }
      exit_code = e ? 1 : code;
      strategy.close(exit_code);
    });
    io.run();
    return exit_code;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "elastic_cluster: %s\n", e.what());
    return 1;
  }
}

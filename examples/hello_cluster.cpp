// Hello, cluster: the smallest pscoro program. One binary plays every role, chosen by TF_CONFIG
// (or by Slurm's variables under srun): the chief puts two variables on the parameter servers,
// schedules a worker function that reads one and adds to the other, and prints the results; ps
// and workers serve until the chief ends the job, then exit with its code.
//
//   pscoro-launch --ps 2 --workers 2 -- hello_cluster [STEPS]
//   PSCORO_AUTH_SECRET_FILE=~/.pscoro-secret srun -N 2 --ntasks-per-node 2 hello_cluster [STEPS]
#include <pscoro/pscoro.hpp>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>

#include <fmt/format.h>

#include <cstdlib>
#include <exception>
#include <numeric>
#include <vector>

// Shared by the chief and the workers: (weights, total, k) -> what it added to the total.
const pscoro::worker_function<double(pscoro::variable<double>, pscoro::variable<double>, double)> add_scaled{
    "hello.add_scaled"};

// On a worker: adds k times the sum of the weights to the total.
asio::awaitable<double> add_scaled_sum(pscoro::variable<double> weights, pscoro::variable<double> total, double k) {
  const auto w = co_await weights.read();
  const xt::xarray<double> added{k * std::accumulate(w.begin(), w.end(), 0.0)};
  co_await total.assign_add(added);
  co_return added(0);
}

// On the chief, a coroutine on its executor.
asio::awaitable<int> run_chief(pscoro::parameter_server_strategy& strategy, int steps) {
  co_await strategy.connect();
  pscoro::cluster_coordinator coordinator(strategy);
  const xt::xarray<double> one_two_three{1, 2, 3}, zero{0};
  const auto weights = co_await strategy.scope().create_variable("hello/weights", one_two_three);
  const auto total = co_await strategy.scope().create_variable("hello/total", zero);
  std::vector<pscoro::remote_value<double>> results;
  for (int k = 1; k <= steps; ++k) results.push_back(coordinator.schedule(add_scaled, weights, total, k));
  co_await coordinator.join();  // every closure has run; throws the first error
  const auto values = co_await pscoro::cluster_coordinator::fetch(results);
  const auto final_total = co_await total.read();
  double sum = 0;
  std::string returned = fmt::format("chief: {} closures on {} workers returned", steps, strategy.num_workers());
  for (const double v : values) {
    returned += fmt::format(" {:g}", v);
    sum += v;
  }
  pscoro::print_line(returned);
  pscoro::print_line(
      fmt::format("chief: total on ps:{} is {:g}, the sum of the results {:g}", total.ps_task(), final_total(0), sum));
  co_return final_total(0) == sum ? 0 : 1;
}

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 10;
  try {
    const auto resolver = pscoro::auto_cluster_resolver();
    if (resolver.task_type() == "ps") return pscoro::run_server(resolver);
    if (resolver.task_type() == "worker") {
      return pscoro::run_server(resolver, [](pscoro::server& s) { s.bind(add_scaled, add_scaled_sum); });
    }
    asio::io_context io;
    pscoro::parameter_server_strategy strategy(io.get_executor(), resolver);
    int exit_code = 1;
    std::exception_ptr failure;
    asio::co_spawn(io, run_chief(strategy, steps), [&](std::exception_ptr e, int code) {
      failure = e;
      exit_code = e ? 1 : code;
      strategy.close(exit_code);  // ends the job (the ps and workers exit with this code), so io.run() returns
    });
    io.run();
    if (failure) std::rethrow_exception(failure);
    return exit_code;
  } catch (const std::exception& e) {
    pscoro::print_line(fmt::format("hello_cluster: {}", e.what()), pscoro::log_level::error);
    return 1;
  }
}

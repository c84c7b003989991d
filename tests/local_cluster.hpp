// An in-process cluster for tests and benchmarks: every ps and worker is a real server with its own
// io_context and thread, listening on 127.0.0.1 port 0; the chief runs on the caller's thread.
#pragma once

#include <pscoro/coordinator.hpp>
#include <pscoro/server.hpp>
#include <pscoro/strategy.hpp>
#include <pscoro/variable.hpp>
#include <pscoro/worker_function.hpp>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/use_future.hpp>

#include <xtensor/xbuilder.hpp>
#include <xtensor/xmath.hpp>

#include <exception>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

namespace pscoro::testing {

/// A worker -> ps round trip for the tests that need one over a transport (TLS, secrets): adds 1
/// to every element of the variable on its ps and returns the sum it reads back. A local_cluster
/// binds it with bind_add_one.
inline const worker_function<double(variable<float>)> add_one{"test.add_one"};

inline void bind_add_one(server& s) {
  s.bind(add_one, [](variable<float> v) -> asio::awaitable<double> {
    xt::xarray<float> ones = xt::ones<float>(v.shape());
    co_await v.assign_add(ones);
    const auto value = co_await v.read();
    co_return static_cast<double>(xt::sum(value)());
  });
}

/// A test's or benchmark's chief: connects, runs `body(strategy, coordinator)`, closes the strategy
/// whether the body finished or threw, and rethrows what it threw.
template <class Body>
asio::awaitable<void> chief_main(parameter_server_strategy& strategy, cluster_coordinator& coordinator, Body body) {
  co_await strategy.connect();
  std::exception_ptr failure;
  try {
    co_await body(strategy, coordinator);
  } catch (...) {
    failure = std::current_exception();
  }
  strategy.close();
  if (failure) std::rethrow_exception(failure);
}

class local_cluster {
 public:
  using configure_worker = std::function<void(server&)>;

  local_cluster(int num_ps, int num_workers, const configure_worker& configure = {}, server_options options = {})
      : configure_(configure), options_(options) {
    cluster_spec placeholder;
    for (int i = 0; i < num_ps; ++i) placeholder.add_task("ps", i, "127.0.0.1:0");
    for (int i = 0; i < num_workers; ++i) placeholder.add_task("worker", i, "127.0.0.1:0");
    auto start = [&](const std::string& job, int index) {
      auto task = std::make_unique<running_task>();
      task->srv = std::make_unique<server>(task->io.get_executor(), simple_cluster_resolver(placeholder, job, index),
                                           options);
      if (job == "worker" && configure) configure(*task->srv);
      task->srv->start();
      spec.add_task(job, index, task->srv->address());
      task->thread = std::thread([t = task.get()] { t->io.run(); });
      tasks_.push_back(std::move(task));
    };
    for (int i = 0; i < num_ps; ++i) start("ps", i);
    for (int i = 0; i < num_workers; ++i) start("worker", i);
  }

  ~local_cluster() {
    for (auto& task : tasks_) {
      asio::post(task->io, [t = task.get()] {
        t->srv->stop();
        t->io.stop();
      });
    }
    for (auto& task : tasks_) task->thread.join();
  }

  /// The server of `job`:`index` (e.g. to stop it).
  server& task(const std::string& job, int index) {
    for (auto& t : tasks_) {
      if (t->srv->task() == task_name(job, index)) return *t->srv;
    }
    throw error(errc::not_found, task_name(job, index));
  }
  /// Runs `f` on the thread of `job`:`index` and waits.
  template <class F>
  void on_task(const std::string& job, int index, F f) {
    for (auto& t : tasks_) {
      if (t->srv->task() == task_name(job, index)) detail::run_on(t->io.get_executor(), f);
    }
  }

  /// Stops `job`:`index`: its port closes, as if its process had not started yet (restart() starts it).
  void stop(const std::string& job, int index) {
    for (auto& t : tasks_) {
      if (t->srv->task() == task_name(job, index)) detail::run_on(t->io.get_executor(), [&] { t->srv->stop(); });
    }
  }

  /// Stops `job`:`index` and starts a new server at the same address on the same thread: to the
  /// others, the task's process was restarted.
  void restart(const std::string& job, int index) {
    for (auto& t : tasks_) {
      if (t->srv->task() != task_name(job, index)) continue;
      detail::run_on(t->io.get_executor(), [&] {
        t->srv->stop();
        t->srv = std::make_unique<server>(t->io.get_executor(), simple_cluster_resolver(spec, job, index), options_);
        if (job == "worker" && configure_) configure_(*t->srv);
        t->srv->start();
      });
    }
  }

  /// Stops `job`:`index` and starts a new server for it at a new port, whose cluster spec names
  /// the chief at `chief_address`: to the others, the task came back elsewhere and announced itself.
  void restart_elsewhere(const std::string& job, int index, const std::string& chief_address) {
    for (auto& t : tasks_) {
      if (t->srv->task() != task_name(job, index)) continue;
      cluster_spec moved;
      for (const auto& other : {"ps", "worker"}) {
        for (const int i : spec.task_indices(other)) {
          moved.add_task(other, i, (other == job && i == index) ? "127.0.0.1:0" : spec.task_address(other, i));
        }
      }
      moved.add_task("chief", 0, chief_address);
      detail::run_on(t->io.get_executor(), [&] {
        t->srv->stop();
        t->srv = std::make_unique<server>(t->io.get_executor(), simple_cluster_resolver(moved, job, index), options_);
        if (job == "worker" && configure_) configure_(*t->srv);
        t->srv->start();
      });
    }
  }

  /// Queues `f` on the thread of `job`:`index` and returns at once (f may block that task, as a
  /// hung process would be).
  template <class F>
  void post_to_task(const std::string& job, int index, F f) {
    for (auto& t : tasks_) {
      if (t->srv->task() == task_name(job, index)) asio::post(t->io, std::move(f));
    }
  }

  /// Runs `body(strategy, coordinator)` as the chief on this thread until it finishes; rethrows.
  template <class Body>
  void run_chief(Body body, coordinator_options options = {}, strategy_options strategy_opts = {},
                 variable_partitioner partitioner = {}) {
    asio::io_context io;
    auto chief_spec = spec;
    if (!chief_address.empty()) chief_spec.add_task("chief", 0, chief_address);
    strategy_opts.keep_servers = strategy_opts.keep_servers || keep_servers;
    parameter_server_strategy strategy(io.get_executor(),
                                       chief_address.empty() ? simple_cluster_resolver(chief_spec)
                                                             : simple_cluster_resolver(chief_spec, "chief", 0),
                                       std::move(partitioner), strategy_opts);
    cluster_coordinator coordinator(strategy, options);
    auto done = asio::co_spawn(io, chief_main(strategy, coordinator, std::move(body)), asio::use_future);
    io.run();
    done.get();
  }

  cluster_spec spec;
  /// Whether the servers outlive a chief of run_chief() (tests run several chiefs against one
  /// cluster); false: its close() ends the job and every server stops, as in a real job.
  bool keep_servers = true;
  /// When set, the chief's address in its cluster spec: it listens there for announcements.
  std::string chief_address;

 private:
  struct running_task {
    asio::io_context io;
    // A stopped server leaves its io_context without work: the thread must still run (restart).
    asio::executor_work_guard<asio::io_context::executor_type> keep_running = asio::make_work_guard(io);
    std::unique_ptr<server> srv;
    std::thread thread;
  };
  configure_worker configure_;
  server_options options_;
  std::vector<std::unique_ptr<running_task>> tasks_;
};

/// A connected chief whose executor runs on a thread of its own, for tests of plain-thread callers.
class threaded_chief {
 public:
  explicit threaded_chief(const cluster_spec& spec)
      : strategy(io_.get_executor(), simple_cluster_resolver(spec), keeping_servers()), thread_([this] { io_.run(); }) {
    asio::co_spawn(io_, strategy.connect(), asio::use_future).get();
  }
  ~threaded_chief() {
    asio::post(io_, [this] { strategy.close(); });
    guard_.reset();
    thread_.join();
  }

 private:
  // As local_cluster's chiefs: the servers outlive this chief.
  static strategy_options keeping_servers() {
    strategy_options options;
    options.keep_servers = true;
    return options;
  }

  // Declaration order is construction order: the io_context, its guard, the strategy, the thread.
  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> guard_ = asio::make_work_guard(io_);

 public:
  parameter_server_strategy strategy;

 private:
  std::thread thread_;
};

/// Awaits `a` and returns what it threw, or null.
template <class Awaitable>
asio::awaitable<std::exception_ptr> failure_of(Awaitable a) {
  try {
    co_await std::move(a);
  } catch (...) {
    co_return std::current_exception();
  }
  co_return nullptr;
}

/// Connects a chief to `spec` and returns the pscoro::error that connecting throws; fails the
/// calling test when connecting succeeds.
inline error connect_failure(const cluster_spec& spec, strategy_options options) {
  asio::io_context io;
  parameter_server_strategy strategy(io.get_executor(), simple_cluster_resolver(spec), options);
  auto connected = asio::co_spawn(io, strategy.connect(), asio::use_future);
  io.run();
  try {
    connected.get();
  } catch (const error& e) {
    return e;
  }
  throw std::logic_error("connecting succeeded where it should have failed");
}

}  // namespace pscoro::testing

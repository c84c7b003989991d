// A cluster of processes for benchmarks: every ps and worker is a pscoro::server in a child process
// of its own (forked, so it runs this program's code), listening on 127.0.0.1 port 0; the chief runs
// on the caller's thread, as local_cluster's does. Fork before the program starts any thread (the
// children are forked in the constructor), and read the children's page faults from /proc.
#pragma once

#include <pscoro/coordinator.hpp>
#include <pscoro/server.hpp>
#include <pscoro/strategy.hpp>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/use_future.hpp>

#include <fmt/format.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

namespace bench {

/// Field `number` (1-based, >= 3) of /proc/<pid>/stat (0: this process), as a number.
inline std::uint64_t proc_stat_field(pid_t pid, std::size_t number) {
  std::ifstream in(pid ? fmt::format("/proc/{}/stat", pid) : std::string("/proc/self/stat"));
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // The command name (field 2) is in parentheses and may hold spaces: count fields after the last ')'.
  const auto close = text.rfind(')');
  if (close == std::string::npos) throw std::runtime_error(fmt::format("cannot parse /proc/{}/stat", pid));
  std::size_t field = 2, at = close + 1;
  while (field < number && at < text.size()) {
    if (text[at] == ' ') ++field;
    ++at;
  }
  return std::strtoull(text.c_str() + at, nullptr, 10);
}

/// Minor page faults of process `pid` so far (0: this process), from /proc/<pid>/stat.
inline std::uint64_t minor_faults(pid_t pid = 0) { return proc_stat_field(pid, 10); }

/// CPU time (user + system) of process `pid` so far, in seconds (clock-tick resolution; 0: this
/// process).
inline double cpu_seconds(pid_t pid = 0) {
  return static_cast<double>(proc_stat_field(pid, 14) + proc_stat_field(pid, 15)) /
         static_cast<double>(::sysconf(_SC_CLK_TCK));
}

class process_cluster {
 public:
  process_cluster(int num_ps, int num_workers) {
    pscoro::cluster_spec placeholder;
    for (int i = 0; i < num_ps; ++i) placeholder.add_task("ps", i, "127.0.0.1:0");
    for (int i = 0; i < num_workers; ++i) placeholder.add_task("worker", i, "127.0.0.1:0");
    for (const auto& [job, count] : {std::pair<std::string, int>{"ps", num_ps}, {"worker", num_workers}}) {
      for (int index = 0; index < count; ++index) {
        std::array<int, 2> pipe_ends{};
        if (::pipe(pipe_ends.data()) != 0) throw std::runtime_error("pipe failed");
        const pid_t pid = ::fork();
        if (pid < 0) throw std::runtime_error("fork failed");
        if (pid == 0) {
          ::close(pipe_ends[0]);
          serve(placeholder, job, index, pipe_ends[1]);
        }
        ::close(pipe_ends[1]);
        std::string address;
        char c = 0;
        while (::read(pipe_ends[0], &c, 1) == 1 && c != '\n') address += c;
        ::close(pipe_ends[0]);
        if (address.empty()) throw std::runtime_error(fmt::format("{}:{} did not start", job, index));
        tasks_.push_back({job, index, address, pid});
      }
    }
  }
  process_cluster(const process_cluster&) = delete;
  process_cluster& operator=(const process_cluster&) = delete;

  ~process_cluster() {
    for (const auto& t : tasks_) ::kill(t.pid, SIGTERM);
    for (const auto& t : tasks_) ::waitpid(t.pid, nullptr, 0);
  }

  /// The process of `job`:`index`.
  pid_t pid(const std::string& job, int index) const {
    for (const auto& t : tasks_) {
      if (t.job == job && t.index == index) return t.pid;
    }
    throw std::runtime_error(fmt::format("no task {}:{}", job, index));
  }

  /// Runs `body(strategy, coordinator)` as the chief on this thread, against the first `num_ps` ps
  /// and every worker, until it finishes; rethrows. The servers outlive it (another chief may follow).
  template <class Body>
  void run_chief(int num_ps, Body body, pscoro::variable_partitioner partitioner = {}) {
    pscoro::cluster_spec spec;
    for (const auto& t : tasks_) {
      if (t.job != "ps" || t.index < num_ps) spec.add_task(t.job, t.index, t.address);
    }
    asio::io_context io;
    pscoro::strategy_options options;
    options.keep_servers = true;
    pscoro::parameter_server_strategy strategy(io.get_executor(), pscoro::simple_cluster_resolver(spec),
                                               std::move(partitioner), options);
    pscoro::cluster_coordinator coordinator(strategy);
    auto done = asio::co_spawn(io, chief_main(strategy, coordinator, std::move(body)), asio::use_future);
    io.run();
    done.get();
  }

 private:
  struct task {
    std::string job;
    int index;
    std::string address;
    pid_t pid;
  };

  // The child: serves until it is killed; tells its parent its address through `out`.
  [[noreturn]] static void serve(const pscoro::cluster_spec& placeholder, const std::string& job, int index, int out) {
    try {
      asio::io_context io;
      auto guard = asio::make_work_guard(io);
      pscoro::server srv(io.get_executor(), pscoro::simple_cluster_resolver(placeholder, job, index));
      srv.start();
      const std::string line = srv.address() + "\n";
      if (::write(out, line.data(), line.size()) != static_cast<ssize_t>(line.size())) std::_Exit(1);
      ::close(out);
      io.run();
    } catch (const std::exception& e) {
      fmt::print(stderr, "{}:{}: {}\n", job, index, e.what());
    }
    std::_Exit(1);
  }

  template <class Body>
  static asio::awaitable<void> chief_main(pscoro::parameter_server_strategy& strategy,
                                          pscoro::cluster_coordinator& coordinator, Body body) {
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

  std::vector<task> tasks_;
};

}  // namespace bench

// A cluster of processes for benchmarks: every ps and worker is a pscoro::server in a child process
// of its own (forked, so it runs this program's code), listening on 127.0.0.1 port 0; the chief runs
// on the caller's thread, as local_cluster's does. Fork before the program starts any thread (the
// children are forked in the constructor), and read the children's page faults from /proc.
#pragma once

#include "local_cluster.hpp"

#include <pscoro/coordinator.hpp>
#include <pscoro/server.hpp>
#include <pscoro/strategy.hpp>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/use_future.hpp>

#include <fmt/format.h>

#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace bench {

/// Where the processes of a measurement run. On this VM a wake-up that crosses CPUs costs ~40-60 us
/// (an inter-processor interrupt to a halted vCPU) and one on the same CPU ~5 us, and the scheduler
/// puts two ping-ponging processes on one CPU or on two as it likes: a raw exchange that landed on
/// one CPU beside a pscoro exchange that landed on two compares placements, not code (RESULTS.md,
/// 2026-11-24). So both are placed alike: `split` runs the chief and the raw client on the first
/// CPU this process may use and the ps and the raw server on the second (as separate machines
/// would, each side with its own CPU), `one` runs all on the first, `any` leaves it to the scheduler.
enum class placement { split, one, any };

inline placement parse_placement(std::string_view text) {
  if (text == "split") return placement::split;
  if (text == "one") return placement::one;
  if (text == "any") return placement::any;
  throw std::invalid_argument(fmt::format("placement '{}': expected split, one or any", text));
}

/// Pins the chief's thread (the caller) and every thread of `servers` (ps and raw server processes)
/// as `how` says, for its lifetime; gives them their CPUs back at the end. `split` needs two CPUs.
/// (sched_setaffinity moves one thread: a server's threads are each of /proc/<pid>/task.)
class pinned_placement {
 public:
  pinned_placement(placement how, const std::vector<pid_t>& servers) {
    if (::sched_getaffinity(0, sizeof(allowed_), &allowed_) != 0) {
      throw std::system_error(errno, std::generic_category(), "sched_getaffinity");
    }
    if (how == placement::any) return;
    std::vector<int> cpus;
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
      if (CPU_ISSET(cpu, &allowed_)) cpus.push_back(cpu);
    }
    if (how == placement::split && cpus.size() < 2) throw std::runtime_error("placement split needs two CPUs");
    pin(0, cpus[0]);
    for (const pid_t pid : servers) {
      for (const pid_t thread : threads_of(pid)) {
        pin(thread, how == placement::split ? cpus[1] : cpus[0]);
        server_threads_.push_back(thread);
      }
    }
  }
  pinned_placement(const pinned_placement&) = delete;
  pinned_placement& operator=(const pinned_placement&) = delete;
  ~pinned_placement() {
    ::sched_setaffinity(0, sizeof(allowed_), &allowed_);
    for (const pid_t thread : server_threads_) ::sched_setaffinity(thread, sizeof(allowed_), &allowed_);
  }

 private:
  static std::vector<pid_t> threads_of(pid_t pid) {
    std::vector<pid_t> out;
    for (const auto& entry : std::filesystem::directory_iterator(fmt::format("/proc/{}/task", pid))) {
      out.push_back(static_cast<pid_t>(std::stol(entry.path().filename().string())));
    }
    return out;
  }

  static void pin(pid_t pid, int cpu) {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    if (::sched_setaffinity(pid, sizeof(one), &one) != 0) {
      throw std::system_error(errno, std::generic_category(), fmt::format("pinning process {} to CPU {}", pid, cpu));
    }
  }

  cpu_set_t allowed_{};
  std::vector<pid_t> server_threads_;
};

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

/// CPU time (user + system, all threads) of process `pid` so far, in seconds (0: this process).
/// The process's CPU-time clock counts nanoseconds; /proc/<pid>/stat counts 10 ms ticks, too coarse
/// for operations of a few milliseconds.
inline double cpu_seconds(pid_t pid = 0) {
  clockid_t clock{};
  if (::clock_getcpuclockid(pid, &clock) != 0) throw std::runtime_error(fmt::format("no CPU clock for pid {}", pid));
  timespec now{};
  if (::clock_gettime(clock, &now) != 0) throw std::runtime_error(fmt::format("cannot read pid {}'s CPU clock", pid));
  return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) * 1e-9;
}

class process_cluster {
 public:
  using configure_worker = std::function<void(pscoro::server&)>;

  /// Forks `num_ps` ps and `num_workers` workers; `configure` runs on each worker's server before it
  /// starts (in the worker's process: it binds the worker functions); each ps runs with `ps_options`.
  process_cluster(int num_ps, int num_workers, const configure_worker& configure = {},
                  pscoro::server_options ps_options = {}) {
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
          serve(placeholder, job, index, pipe_ends[1], job == "worker" ? configure : configure_worker{},
                job == "ps" ? ps_options : pscoro::server_options{});
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

  /// Every ps's and worker's process.
  std::vector<pid_t> pids() const {
    std::vector<pid_t> out;
    for (const auto& t : tasks_) out.push_back(t.pid);
    return out;
  }

  /// Runs `body(strategy, coordinator)` as the chief on this thread, against the first `num_ps` ps
  /// and every worker, until it finishes; rethrows. The servers outlive it (another chief may follow).
  template <class Body>
  void run_chief(int num_ps, Body body, pscoro::variable_partitioner partitioner = {}) {
    const auto workers = std::count_if(tasks_.begin(), tasks_.end(), [](const task& t) { return t.job == "worker"; });
    run_chief(num_ps, static_cast<int>(workers), std::move(body), std::move(partitioner));
  }

  /// The same, against the first `num_ps` ps and the first `num_workers` workers, with `options`.
  template <class Body>
  void run_chief(int num_ps, int num_workers, Body body, pscoro::variable_partitioner partitioner,
                 pscoro::coordinator_options coordinator_options = {}) {
    pscoro::cluster_spec spec;
    for (const auto& t : tasks_) {
      if (t.index < (t.job == "ps" ? num_ps : num_workers)) spec.add_task(t.job, t.index, t.address);
    }
    asio::io_context io;
    pscoro::strategy_options options;
    options.keep_servers = true;
    pscoro::parameter_server_strategy strategy(io.get_executor(), pscoro::simple_cluster_resolver(spec),
                                               std::move(partitioner), options);
    pscoro::cluster_coordinator coordinator(strategy, coordinator_options);
    auto done =
        asio::co_spawn(io, pscoro::testing::chief_main(strategy, coordinator, std::move(body)), asio::use_future);
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
  [[noreturn]] static void serve(const pscoro::cluster_spec& placeholder, const std::string& job, int index, int out,
                                 const configure_worker& configure, pscoro::server_options options) {
    try {
      asio::io_context io;
      auto guard = asio::make_work_guard(io);
      pscoro::server srv(io.get_executor(), pscoro::simple_cluster_resolver(placeholder, job, index),
                         std::move(options));
      if (configure) configure(srv);
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

  std::vector<task> tasks_;
};

}  // namespace bench

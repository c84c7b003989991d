// The chief's state: connections to every task, variable placement and the closure queue. One
// object per strategy, shared with its coordinator; used on the strategy's executor only (public
// entry points hop onto it).
#pragma once

#include <pscoro/coordinator.hpp>
#include <pscoro/strategy.hpp>

#include "runtime/peer.hpp"
#include "runtime/ps_client.hpp"

#include <asio/steady_timer.hpp>

#include <chrono>
#include <deque>
#include <optional>
#include <memory>
#include <vector>

namespace pscoro::detail {

class coordinator_core : public std::enable_shared_from_this<coordinator_core> {
 public:
  coordinator_core(asio::any_io_executor executor, const simple_cluster_resolver& resolver, strategy_options options);

  asio::awaitable<void> connect();
  /// Closes every connection; closures still running fail as their worker is lost.
  void close();

  /// Creates a variable of `shards` (1 unless `partition` and the partitioner say otherwise),
  /// placed round robin, concurrently.
  asio::awaitable<sharded_variable_ref> create_variable(std::string name, dtype type, shape_type shape,
                                                        parameter_server_strategy::variable_source source,
                                                        bool partition);
  void set_partitioner(variable_partitioner partitioner) { partitioner_ = std::move(partitioner); }
  const std::shared_ptr<runtime::ps_client>& ps() const noexcept { return ps_; }

  /// Takes `options`; TF_CLUSTER_COORDINATOR_WATCH_DOG_TIMEOUT and
  /// TF_COORDINATOR_IGNORE_TRANSIENT_PS_FAILURES override theirs.
  void set_options(const coordinator_options& options);

  /// Builds a fresh iterator of dataset function `function` on every worker; completes when all
  /// exist, with their common id.
  asio::awaitable<per_worker_ref> create_iterators(std::string function);

  // Closures. All on the executor.
  /// Queues at once; throws the pending error, or errc::resource_exhausted when the queue is full.
  std::shared_ptr<remote_state> schedule(std::string name, std::string signature, std::vector<value> args);
  /// Queues when there is room: `admitted` gets the closure's result state then, or the pending
  /// error instead.
  using admission_handler = erased_handler<void(std::exception_ptr, std::shared_ptr<remote_state>)>;
  void schedule_when_room(std::string name, std::string signature, std::vector<value> args,
                          admission_handler admitted);
  void join(erased_handler<void(std::exception_ptr)> handler);
  bool done();

  const asio::any_io_executor& executor() const noexcept { return executor_; }
  const cluster_spec& cluster() const noexcept { return cluster_; }
  std::size_t num_ps() const noexcept { return ps_peers_.size(); }
  std::size_t num_workers() const noexcept { return workers_.size(); }
  /// Where the chief listens for workers announcing themselves (after connect()), or "" when the
  /// cluster spec gives the chief no address.
  std::string address() const;

 private:
  struct closure {
    std::string function;
    std::string signature;
    std::vector<value> args;
    std::shared_ptr<remote_state> result;
    std::uint64_t generation;  // errors of closures from before the last report are not reported again
    std::chrono::steady_clock::time_point started{};  // sent to its worker (the last time)
    bool abandoned = false;  // resolved while its worker still runs it (a ps was lost): ignore the reply
  };
  struct worker_slot {
    std::shared_ptr<runtime::peer> peer;
    std::vector<std::shared_ptr<closure>> running;  // sent to it, not answered yet
    std::size_t in_flight = 0;
    bool alive = true;
    bool probing = false;  // a recovery attempt is under way
  };

  static asio::awaitable<void> create_on(std::shared_ptr<runtime::peer> worker, wire::frame request);
  std::shared_ptr<closure> make_closure(std::string name, std::string signature, std::vector<value> args);
  bool has_room() const noexcept {
    return options_.max_queued_closures == 0 || queue_.size() < options_.max_queued_closures;
  }
  void dispatch();
  void start_closures();
  bool admit_waiting();
  static asio::awaitable<void> run(std::shared_ptr<coordinator_core> self, std::size_t worker,
                                   std::shared_ptr<closure> c);
  void finish(const std::shared_ptr<closure>& c, const wire::frame& response, const std::string& worker);
  /// A closure failed on `worker` because it could not reach a ps (`failure`): true when that
  /// counts as a transient connectivity failure (it runs again), TF's rule.
  bool transient_ps_failure(const remote_error& failure, const closure& c, const std::string& worker);
  /// Keeps `e` as the error to report, if it is the first of the current generation, and cancels
  /// what is queued.
  void record_error(std::exception_ptr e, std::uint64_t generation);
  /// A connection to a task closed without our asking (it died, hung past the heartbeat timeout,
  /// or the network failed).
  void lost_ps(std::size_t index, const std::string& reason);
  void lost_worker(std::size_t index, const std::string& reason);
  /// Accepts workers announcing themselves (Hello.address) until the coordinator closes.
  static asio::awaitable<void> hear_announcements(std::weak_ptr<coordinator_core> weak);
  static asio::awaitable<void> hear_announcement(std::weak_ptr<coordinator_core> weak, asio::ip::tcp::socket socket);
  /// Worker `index` says it can be reached at `address` now: use that, and bring it back at once.
  void announced(std::size_t index, const std::string& address);
  /// Probes lost workers every worker_probe_interval until the coordinator closes.
  static asio::awaitable<void> watch_workers(std::weak_ptr<coordinator_core> weak);
  /// One attempt to bring worker `index` back: connect, rebuild its iterators, then mark it alive.
  static asio::awaitable<void> recover(std::shared_ptr<coordinator_core> self, std::size_t index);
  /// With no live worker for worker_recovery_timeout and closures waiting: the error that says so.
  void check_recovery_timeout();
  /// With work and no closure finished for watchdog_timeout: logs what every worker runs.
  void check_watchdog();
  wire::frame iterator_request(const per_worker_ref& ref, std::size_t worker) const;
  /// Resolves `c`'s remote_value as cancelled by the pending error.
  void cancel(const closure& c);
  /// Returns the pending error (cleared) and starts a new generation, or null.
  std::exception_ptr take_error();
  void notify_joiners();

  asio::any_io_executor executor_;
  cluster_spec cluster_;
  std::string task_;
  strategy_options strategy_options_;
  coordinator_options options_;
  wire::Hello hello_;
  std::vector<std::shared_ptr<runtime::peer>> ps_peers_;
  std::shared_ptr<runtime::ps_client> ps_;
  std::vector<worker_slot> workers_;
  std::size_t next_placement_ = 0;
  std::uint64_t next_iterator_id_ = 1;
  variable_partitioner partitioner_;
  bool closed_ = false;

  struct waiting_producer {
    std::shared_ptr<closure> c;
    admission_handler admitted;
  };

  std::deque<std::shared_ptr<closure>> queue_;
  std::deque<waiting_producer> waiting_;  // closures waiting for room in queue_, in order
  std::size_t in_flight_ = 0;
  std::size_t next_worker_ = 0;
  std::uint64_t generation_ = 0;
  std::exception_ptr pending_error_;
  // Set when a ps is lost: its variables are gone, so nothing runs any more and every schedule
  // says so (TF: a ps failure needs a coordinator restart and a checkpoint).
  std::exception_ptr ps_failure_;
  std::vector<per_worker_ref> iterators_;
  std::vector<int> transient_ps_failures_;  // per ps: closures that failed reaching it (TF's counters)  // every iter(): rebuilt on a worker that comes back
  std::optional<asio::steady_timer> watch_timer_;
  std::string spec_address_;  // the chief's own address in the cluster spec, if any
  std::optional<asio::ip::tcp::acceptor> acceptor_;  // for announcements, when spec_address_ is set
  std::size_t announcements_in_handshake_ = 0;
  std::optional<std::chrono::steady_clock::time_point> all_lost_since_;
  // The last time a closure finished, or the coordinator had nothing to do (for the watchdog).
  std::chrono::steady_clock::time_point last_progress_ = std::chrono::steady_clock::now();
  std::vector<erased_handler<void(std::exception_ptr)>> joiners_;
};

}  // namespace pscoro::detail

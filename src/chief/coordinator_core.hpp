// The chief: what a parameter_server_strategy and its cluster_coordinator share. It puts four
// parts together — the connections to the cluster (chief::cluster_connections), where variables
// go (chief::variable_placement), the per-worker values (chief::per_worker_values) and the closure
// queue (closure_queue, a state machine) — and
// runs what the queue hands out: a closure's call to its worker, and its outcome back into the
// queue. One object per strategy; used on the strategy's executor only (the public entry points
// hop onto it).
#pragma once

#include <pscoro/coordinator.hpp>
#include <pscoro/strategy.hpp>

#include "chief/closure_queue.hpp"
#include "chief/cluster_connections.hpp"
#include "chief/lost_ps_restorer.hpp"
#include "chief/per_worker_values.hpp"
#include "chief/placement.hpp"
#include "client/ps_client.hpp"

#include <asio/dispatch.hpp>

#include <atomic>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

namespace pscoro::detail {

class coordinator_core : public std::enable_shared_from_this<coordinator_core> {
 public:
  /// Checks the cluster (TF's rules) and that this process is its chief; connects nothing yet.
  static std::shared_ptr<coordinator_core> make(asio::any_io_executor executor, const simple_cluster_resolver& resolver,
                                                strategy_options options);

  asio::awaitable<void> connect() { return connections_->connect(); }
  /// Closes every connection; queued closures are cancelled, running ones as their worker is lost.
  /// With `job_exit_code`, and unless strategy_options::keep_servers, first tells every server
  /// that the job ended with that code.
  void close(std::optional<int> job_exit_code);

  asio::awaitable<sharded_variable_ref> create_variable(std::string name, dtype type, shape_type shape,
                                                        parameter_server_strategy::variable_source source,
                                                        parameter_server_strategy::placement_request placement) {
    return placement_.create(std::move(name), type, std::move(shape), std::move(source), placement);
  }
  asio::awaitable<hash_table_ref> create_hash_table(std::string name, dtype type, hash_table_options options) {
    return placement_.create_table(std::move(name), type, std::move(options));
  }
  void set_partitioner(variable_partitioner partitioner) { placement_.set_partitioner(std::move(partitioner)); }
  /// Variables created from now on ask `restorer` for a saved value (a checkpoint restored before
  /// they existed). On the executor.
  void add_restorer(const std::shared_ptr<chief::restore_on_create>& restorer) { placement_.add_restorer(restorer); }
  /// From now on a lost ps is restored in place by `restorer` (while it lives) instead of ending
  /// the run: closures are held, the ps is waited for at its address, its shards and table parts
  /// are made again and restored, and the held and failed closures run. On the executor.
  void set_ps_restorer(std::weak_ptr<chief::lost_ps_restorer> restorer) { ps_restorer_ = std::move(restorer); }
  /// Whether a lost ps is being restored now (its variables are not all there yet). Any thread.
  bool restoring_ps() const noexcept { return restores_in_progress_.load(std::memory_order_acquire) > 0; }
  /// How many ps losses a lost_ps_restorer has taken in hand so far (restored, or being restored).
  /// Any thread.
  std::uint64_t ps_losses_in_hand() const noexcept { return losses_in_hand_.load(std::memory_order_acquire); }
  const std::shared_ptr<client::ps_client>& ps() const noexcept { return ps_; }

  /// Takes `options`; TF_CLUSTER_COORDINATOR_WATCH_DOG_TIMEOUT and
  /// TF_COORDINATOR_IGNORE_TRANSIENT_PS_FAILURES override theirs. On the executor.
  void set_options(const coordinator_options& options);
  /// A cluster_coordinator is made with `asked` (none: whatever the strategy's coordinators share).
  /// Returns the options to set when it is the strategy's first coordinator, none when it shares
  /// the first one's; throws errc::invalid_argument when `asked` differs from those. Any thread.
  std::optional<coordinator_options> claim_options(const std::optional<coordinator_options>& asked);

  /// The per-worker values (iterators, variables, resources) made on every worker and rebuilt on
  /// a worker that comes back.
  chief::per_worker_values& per_worker() noexcept { return *per_worker_; }

  /// A closure of `name` with `args`, not scheduled yet.
  std::shared_ptr<chief::closure> make_closure(std::string name, std::string signature, std::vector<value> args);
  chief::closure_queue& queue() noexcept { return *queue_; }

  const asio::any_io_executor& executor() const noexcept { return executor_; }
  const cluster_spec& cluster() const noexcept { return cluster_; }
  std::size_t num_ps() const noexcept { return connections_->ps().size(); }
  std::size_t num_workers() const noexcept { return connections_->num_workers(); }
  /// Where the chief listens for workers announcing themselves (after connect()), or "" when the
  /// cluster spec gives the chief no address.
  std::string address() const { return connections_->address(); }

  /// TF's coordinator metrics, read now. Any thread.
  metrics::coordinator_metrics metrics() const;

  /// Drains worker `worker` (cluster_coordinator::drain): no new closure or per-worker value goes
  /// there, and once nothing runs there it drops its per-worker values and `drained` completes
  /// (with errc::invalid_argument for a worker the cluster does not have). On the executor.
  void drain(std::size_t worker, chief::closure_queue::join_handler drained);
  /// Brings drained worker `worker` back (cluster_coordinator::resume); throws
  /// errc::invalid_argument for a worker the cluster does not have. On the executor.
  void resume(std::size_t worker);

 private:
  coordinator_core(asio::any_io_executor executor, cluster_spec cluster, strategy_options options,
                   net::task_identity self, std::string spec_address, const std::string& chief_page);
  /// Wires the parts' events to this core (they hold it weakly).
  void wire_events();
  /// Registers worker `worker`'s series (the queue's worker_metrics) with the process registry.
  void register_worker(std::size_t worker);

  /// Sends closure `c` to `worker` and hands its outcome to the queue.
  static asio::awaitable<void> run(std::shared_ptr<coordinator_core> self, std::size_t worker,
                                   std::shared_ptr<chief::closure> c);
  /// Sends `cancel` to `worker` (closure_queue::cancel_function and cancel_attempt_function).
  static asio::awaitable<void> cancel_on(std::shared_ptr<net::peer> worker, wire::CancelClosures cancel);
  void finish(std::size_t worker, const std::shared_ptr<chief::closure>& c, const wire::frame& response);
  /// What a closure's failure to reach a ps means (TF's rule: a few such failures per ps are
  /// transient connectivity failures, and the closure runs again).
  struct ps_failure {
    enum class kind {
      none,       // not a ps that could not be reached
      transient,  // within the tolerance: run it again
      too_many,   // past it: the run fails, once confirm_ps_failure has asked the ps
    } what = kind::none;
    std::size_t ps = 0;  // which one (not none)
  };
  ps_failure classify_ps_failure(const remote_error& failure, const chief::closure& c, const std::string& worker);
  /// Fails closure `c`, which could not reach ps `ps` once too often, after the chief asked that
  /// ps itself (a Heartbeat on its own connection): a ps that is gone fails the run through
  /// lost_ps, with its one message, whoever noticed first; a ps that answers the chief, with the
  /// workers' error.
  static asio::awaitable<void> confirm_ps_failure(std::shared_ptr<coordinator_core> self, std::size_t ps,
                                                  std::size_t worker, std::shared_ptr<chief::closure> c,
                                                  std::exception_ptr failure);
  /// The connection to ps `index` closed without our asking: its variables are gone, and the run
  /// with them, unless a lost_ps_restorer restores them.
  void lost_ps(std::size_t index, const std::string& reason);
  /// Keeps what ps `index` reported in its answer to a Heartbeat as the chief's series of that ps
  /// (its requests as a counter that goes on over the ps's restarts), registered at its first report.
  void ps_reported(std::size_t index, const wire::PsTotals& totals);
  /// Ends the run: ps `index` is lost, for `reason`.
  void fail_run(std::size_t index, std::exception_ptr failure);
  /// Waits for ps `index` to answer again, makes its shards and parts again and has `restorer`
  /// restore them, then lets the held closures run; ends the run when any of it fails.
  static asio::awaitable<void> restore_lost_ps(std::shared_ptr<coordinator_core> self, std::size_t index,
                                               std::shared_ptr<chief::lost_ps_restorer> restorer);

  asio::any_io_executor executor_;
  cluster_spec cluster_;
  strategy_options strategy_options_;
  std::shared_ptr<chief::cluster_connections> connections_;
  std::shared_ptr<client::ps_client> ps_;
  chief::variable_placement placement_;
  std::shared_ptr<chief::closure_queue> queue_;
  std::shared_ptr<chief::per_worker_values> per_worker_;
  std::vector<int> transient_ps_failures_;  // per ps: closures that failed reaching it (TF's counters)
  std::weak_ptr<chief::lost_ps_restorer> ps_restorer_;
  // Per ps: being restored (its failures are the loss's, not transient), and lost again meanwhile
  // (the restore's calls may have reached the next incarnation: it starts over).
  enum class restore_state : char { none, running, lost_again };
  std::vector<restore_state> restoring_;
  std::vector<std::uint64_t> restored_losses_;  // per ps: losses a restorer took in hand
  std::atomic<int> restores_in_progress_{0};  // restoring_'s ones, for other threads
  std::atomic<std::uint64_t> losses_in_hand_{0};  // restored_losses_'s sum, for other threads
  // The options the strategy's coordinators share, once the first one is made. Coordinators may
  // be made on any thread: this is the one piece of the chief a mutex guards (set once, read at
  // construction only; never protocol state).
  std::mutex options_mutex_;
  std::optional<coordinator_options> shared_options_;
  // TF's coordinator metrics besides the queue's gauges; updated on the executor, read anywhere.
  metrics::histogram closure_execution_;
  metrics::histogram remote_value_fetch_;
  metrics::counter worker_failures_;
  metrics::counter ps_failures_;
  metrics::counter iterator_rebuilds_;
  metrics::counter ps_restores_;
  metrics::histogram ps_restore_seconds_;
  metrics::gauge ps_restore_step_;  // the step of the checkpoint the last restore used
  // What a ps reports of itself (wire::PsTotals), as the chief's series of that ps.
  struct ps_report {
    metrics::counter requests;  // what its incarnations served, summed
    metrics::gauge variables;
    metrics::gauge held_bytes;
    metrics::gauge resident_memory;
    std::uint64_t incarnation = 0;    // of its last report
    std::uint64_t last_requests = 0;  // that incarnation's total at its last report
    std::vector<metrics::registry::registration> registered;  // last: goes before what it lists
  };
  std::vector<std::unique_ptr<ps_report>> ps_reports_;  // per ps, null before its first report
  std::vector<metrics::registry::registration> registered_;  // last: goes before what it lists
};

/// The one way onto the chief's executor: `f(core)` runs there — inline when the caller already runs
/// there, posted otherwise — and the future gets what it returns or throws. A caller on another
/// thread may wait on the future; a caller on the executor gets it ready, or must not wait.
template <class F>
auto on_chief(std::shared_ptr<coordinator_core> core, F f) -> std::future<decltype(f(*core))> {
  std::packaged_task<decltype(f(*core))()> task([core, f = std::move(f)]() mutable { return f(*core); });
  auto result = task.get_future();
  const auto executor = core->executor();
  // Wrapped: asio takes a bare packaged_task as a completion token and would take its future.
  asio::dispatch(executor, [task = std::move(task)]() mutable { task(); });
  return result;
}

}  // namespace pscoro::detail

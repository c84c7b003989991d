// The chief's closure queue: a state machine with no I/O. Producers schedule closures; the queue
// hands each to a live worker with a free slot (through `start`, which sends it) and takes its
// outcome back. It keeps TF's contract: at least once per closure while workers come and go, and
// the first error of a generation reported once, by the next schedule, join or done, with every
// closure still queued then cancelled. Used on one executor; tests drive it with fake workers.
#pragma once

#include <pscoro/coordinator_options.hpp>
#include <pscoro/detail/completion.hpp>
#include <pscoro/metrics.hpp>
#include <pscoro/remote_value.hpp>
#include <pscoro/value.hpp>

#include <asio/steady_timer.hpp>

#include <chrono>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace pscoro::chief {

/// One scheduled call of a worker function.
struct closure {
  std::string function;
  std::string signature;
  std::vector<value> args;
  std::shared_ptr<detail::remote_state> result;
  std::uint64_t generation = 0;  // errors of closures from before the last report are not reported again
  std::chrono::steady_clock::time_point started{};  // handed to its worker (the last time)
  std::uint64_t number = 0;  // its place in the order closures were queued (bounded staleness);
                             // RunFunction.closure names it to its workers
  std::uint64_t finished_before = 0;  // closures finished when it was handed to its worker
  // Speculation: the worker running its backup attempt, and since when (at most one backup).
  std::optional<std::size_t> backup_worker = std::nullopt;
  std::chrono::steady_clock::time_point backup_started{};
};

class closure_queue : public std::enable_shared_from_this<closure_queue> {
 public:
  using closure_ptr = std::shared_ptr<closure>;
  using clock = std::chrono::steady_clock;
  /// Sends `c` to `worker`. The queue counts it as running there from now on and expects exactly
  /// one outcome for it (succeeded, failed, retry or lost); an outcome for a closure the queue has
  /// already resolved (fail()) is ignored.
  using start_function = std::function<void(std::size_t worker, const closure_ptr& c)>;
  /// Tells `worker` to cancel what it still runs of generation `generation`: the queue has resolved
  /// those closures already (cancelled) and ignores their outcomes.
  using cancel_function = std::function<void(std::size_t worker, std::uint64_t generation)>;
  /// Tells `worker` to cancel its attempt of `c`: another attempt finished first, and the queue
  /// ignores this one's outcome.
  using cancel_attempt_function = std::function<void(std::size_t worker, const closure_ptr& c)>;
  using admission_handler = detail::erased_handler<void(std::exception_ptr, std::shared_ptr<detail::remote_state>)>;
  using join_handler = detail::erased_handler<void(std::exception_ptr)>;

  /// A queue for workers named `workers` (for the watchdog's lines), all alive at first.
  closure_queue(asio::any_io_executor executor, std::vector<std::string> workers, start_function start,
                cancel_function cancel = {}, cancel_attempt_function cancel_attempt = {});

  /// Takes `options`; the staggered start counts from now.
  void set_options(const coordinator_options& options);
  const coordinator_options& options() const noexcept { return options_; }

  // Producers.
  /// Queues `c` at once and returns its result state; throws the pending error (then cleared), the
  /// fatal one, or errc::resource_exhausted when the queue is full.
  std::shared_ptr<detail::remote_state> schedule(closure_ptr c);
  /// Queues `c` when there is room: `admitted` gets its result state then, or the pending error
  /// instead. Producers are admitted in order.
  void schedule_when_room(closure_ptr c, admission_handler admitted);
  /// Completes once no closure runs, none waits to run and the queue is not held, with the pending
  /// error (then cleared).
  void join(join_handler handler);
  /// True when nothing is queued or running and the queue is not held; throws the pending error
  /// (then cleared).
  bool done();

  // Workers.
  /// `worker` may take closures (again).
  void worker_up(std::size_t worker);
  /// `worker` takes no closures until worker_up; what it runs comes back through lost().
  void worker_lost(std::size_t worker);
  bool alive(std::size_t worker) const { return workers_.at(worker).alive; }
  /// A worker joins (elastic admission) as number workers() - 1; it takes closures from its
  /// worker_up, once its per-worker values are made.
  void add_worker(std::string name);
  std::size_t workers() const noexcept { return workers_.size(); }
  /// `worker` takes no new closure from now on; `drained` gets null once nothing runs there (at
  /// once when nothing does). What runs there finishes as usual, or comes back through lost().
  void drain(std::size_t worker, join_handler drained);
  bool draining(std::size_t worker) const { return workers_.at(worker).draining; }
  /// Whether `worker`'s next worker_up is a return from a loss (not its first, nor a resume).
  bool returning(std::size_t worker) const { return workers_.at(worker).lost_since_up; }
  /// `worker` is drained no more. After a completed drain it takes closures again from its next
  /// worker_up (its per-worker values are made again first) and this returns false. A drain still
  /// in progress is called off: its waiters get errc::cancelled, the worker (which still holds
  /// its values) takes closures again at once, and this returns true.
  bool undrain(std::size_t worker);

  // The outcome of a closure handed to `worker`.
  void succeeded(std::size_t worker, const closure_ptr& c, value result);
  /// Fails `c` with `e`, which becomes the error to report if it is the first of its generation.
  void failed(std::size_t worker, const closure_ptr& c, std::exception_ptr e);
  /// Runs `c` again, from the tail of the queue (a transient failure: at least once).
  void retry(std::size_t worker, const closure_ptr& c);
  /// `worker` was lost while running `c`: it runs again elsewhere (TF: at the tail), or is cancelled
  /// if the queue is closed. (Were an error waiting to be reported, `c` would not be running.)
  void lost(std::size_t worker, const closure_ptr& c);

  /// Speculative re-runs of `function`'s slow closures, as `options` say (replacing any before).
  void speculate(const std::string& function, const speculation_options& options);
  /// Backup attempts started, and closures whose backup finished first. Any thread may read them.
  const metrics::counter& speculated() const noexcept { return speculated_; }
  const metrics::counter& backup_wins() const noexcept { return backup_wins_; }

  // Faults.
  /// While held (a lost ps being restored), no closure starts; running ones go on, and queued or
  /// retried ones wait. Holds nest: each hold() needs its release().
  void hold() noexcept { ++holds_; }
  void release();
  bool held() const noexcept { return holds_ > 0; }
  /// A fault that ends the run (a lost ps): every running closure fails with `e` now, nothing starts
  /// any more, `e` is reported once like any error, and every later schedule throws it.
  void fail(std::exception_ptr e);
  /// An error waits to be reported, or the run has failed: nothing starts.
  bool failing() const noexcept { return pending_error_ || fatal_; }
  /// fail() was called.
  bool has_failed() const noexcept { return fatal_ != nullptr; }
  /// Nothing queued or waiting will run: they are cancelled ("the coordinator closed"), and so is a
  /// running closure whose worker is lost from now on.
  void close();

  /// The periodic checks (every worker_probe_interval): with no live worker for
  /// worker_recovery_timeout and closures waiting, the error that says so; with work and no closure
  /// finished for watchdog_timeout, a warning naming what every worker runs; backups of slow
  /// closures of functions with speculation.
  void tick(clock::time_point now = clock::now());

  std::size_t queued() const noexcept { return queue_.size(); }
  std::size_t waiting() const noexcept { return waiting_.size(); }
  std::size_t in_flight() const noexcept;
  const std::vector<closure_ptr>& running(std::size_t worker) const { return workers_.at(worker).running; }

  /// queued() and in_flight() as gauges any thread may read (a scrape), set after every change.
  const metrics::gauge& queued_gauge() const noexcept { return queued_gauge_; }
  const metrics::gauge& inflight_gauge() const noexcept { return inflight_gauge_; }
  /// Each finished closure's staleness: how many closures finished between the moment it was handed
  /// to its worker and its own end (what its reads may have missed). Any thread may read them.
  const metrics::histogram& staleness() const noexcept { return staleness_; }
  const metrics::gauge& staleness_max() const noexcept { return staleness_max_; }
  /// The staleness histogram's bounds: every value to 16, then powers of two to 2^20.
  static std::vector<double> staleness_bounds();
  /// Closures taken into the queue (schedule, or admitted when there was room), as a counter.
  const metrics::counter& scheduled_counter() const noexcept { return scheduled_counter_; }

  /// What one worker did, as metrics any thread may read, updated with every change.
  struct worker_metrics {
    metrics::counter succeeded;  ///< outcomes: the closure returned
    metrics::counter failed;     ///< outcomes: the closure failed (retries and losses are neither)
    metrics::counter restarts;   ///< times it came back after a loss
    metrics::gauge in_flight;    ///< handed to it, no outcome yet
    metrics::gauge up;           ///< 1 while it may take closures
    metrics::gauge drained;      ///< 1 from a drain until it is resumed
  };
  const worker_metrics& worker_stats(std::size_t worker) const { return *worker_metrics_.at(worker); }

 private:
  struct worker_slot {
    std::string name;
    std::vector<closure_ptr> running;  // handed to it, no outcome yet
    bool alive = true;
    bool lost_since_up = false;  // its next worker_up is a return from a loss (a restart)
    bool draining = false;  // drained, or being drained: takes no new closure
    clock::time_point takes_from{};  // its staggered start (coordinator_options::schedule_start_delay)
    std::vector<join_handler> drainers{};  // completed once nothing runs on it
  };
  /// Whether `w` may be handed a closure now (not counting its room).
  static bool takes_closures(const worker_slot& w) noexcept { return w.alive && !w.draining; }
  struct waiting_producer {
    closure_ptr c;
    admission_handler admitted;
  };

  bool has_room() const noexcept {
    return options_.max_queued_closures == 0 || queue_.size() < options_.max_queued_closures;
  }
  /// Starts what can start, admits waiting producers while there is room, then checks the recovery
  /// timeout and the joiners.
  void dispatch();
  void start_closures();
  bool admit_waiting();
  /// Takes `c` off `worker`'s running list; false when it is not there (resolved already).
  bool take_running(std::size_t worker, const closure_ptr& c);
  /// Whether `c` still runs on some worker (its other attempt).
  bool running_anywhere(const closure_ptr& c) const;
  /// `c` finished on `winner`: its other attempt, if any, is taken off its worker and cancelled
  /// there; a backup that won is counted, and the run time goes to the function's recent runs.
  void end_other_attempts(std::size_t winner, const closure_ptr& c, clock::time_point now);
  /// Starts backups of the slow closures of functions with speculation, where there is room.
  void check_speculation(clock::time_point now);
  /// Puts `c` in the queue to run again: at the tail (TF), or with bounded staleness in its
  /// number's place, at the head of what waits (the window waits for it).
  void requeue(const closure_ptr& c);
  /// `c` (which ran: succeeded or failed) finished: its staleness is counted.
  void count_finished(const closure& c);
  /// Closure number `number` is resolved (run or not): the staleness window moves past it.
  void settle(std::uint64_t number);
  /// Whether closure number `number` may start under the staleness bound.
  bool within_window(std::uint64_t number) const noexcept {
    return !options_.max_staleness || number - lowest_unsettled_ <= *options_.max_staleness;
  }
  /// Numbers `c` as the next closure queued.
  void number(closure& c) noexcept { c.number = next_number_++; }
  /// Keeps `e` as the error to report, if it is the first of generation `generation`, and cancels
  /// what is queued and what still runs of that generation (TF's testCancellation).
  void record_error(std::exception_ptr e, std::uint64_t generation);
  /// Resolves `c` as cancelled by the pending error.
  void cancel(const closure& c);
  /// Takes the closures of `generation` (every one when it is empty) off the running lists, tells
  /// their workers to cancel them, and returns them.
  std::vector<closure_ptr> stop_running(std::optional<std::uint64_t> generation);
  /// Returns the pending error (cleared) and starts a new generation, or null.
  std::exception_ptr take_error();
  void check_recovery_timeout(clock::time_point now);
  void check_watchdog(clock::time_point now);
  void notify_joiners();
  /// Completes the drains of workers that run nothing any more.
  void notify_drainers();
  /// Sets the gauges from the queue and the running lists.
  void publish() noexcept;

  asio::any_io_executor executor_;
  asio::steady_timer staggered_start_;  // wakes the queue when the next worker's start comes
  start_function start_;
  cancel_function cancel_;
  cancel_attempt_function cancel_attempt_;
  // Speculation, per function: its options and its recent run times (seconds; a ring).
  struct function_runs {
    speculation_options options;
    std::vector<double> recent;
    std::size_t next = 0;  // where the next run time goes once `recent` is full
  };
  static constexpr std::size_t recent_runs = 32;
  std::map<std::string, function_runs, std::less<>> speculation_;
  metrics::counter speculated_;
  metrics::counter backup_wins_;
  coordinator_options options_;
  std::vector<worker_slot> workers_;
  std::size_t next_worker_ = 0;  // where the search for a free worker starts (fairness)
  std::deque<closure_ptr> queue_;
  std::deque<waiting_producer> waiting_;  // producers waiting for room in queue_, in order
  std::uint64_t generation_ = 0;
  std::exception_ptr pending_error_;
  // Set by fail(): nothing runs any more and every schedule says why (TF: a ps failure needs a
  // coordinator restart and a checkpoint).
  std::exception_ptr fatal_;
  int holds_ = 0;
  bool closed_ = false;
  std::optional<clock::time_point> all_lost_since_;
  // The last time a closure finished, or the queue had nothing to do (for the watchdog).
  clock::time_point last_progress_ = clock::now();
  std::vector<join_handler> joiners_;
  metrics::gauge queued_gauge_;
  metrics::gauge inflight_gauge_;
  // Bounded staleness: closures are numbered as they are queued; numbers below lowest_unsettled_
  // are all resolved, and settled_ marks those resolved from it on (settled_[i]: number
  // lowest_unsettled_ + i). Kept only with a bound, when it holds at most the bound's width.
  std::uint64_t next_number_ = 0;
  std::uint64_t lowest_unsettled_ = 0;
  std::deque<bool> settled_;
  std::uint64_t finished_ = 0;  // closures that ran and finished (succeeded or failed)
  metrics::histogram staleness_{staleness_bounds()};
  metrics::gauge staleness_max_;
  metrics::counter scheduled_counter_;
  std::vector<std::unique_ptr<worker_metrics>> worker_metrics_;  // atomics: neither copied nor moved
};

}  // namespace pscoro::chief

#include "chief/closure_queue.hpp"

#include "common/log.hpp"
#include "common/text.hpp"

#include <pscoro/error.hpp>

#include <asio/post.hpp>

#include <fmt/chrono.h>
#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <utility>

namespace pscoro::chief {

namespace {

std::exception_ptr closed_error() {
  return std::make_exception_ptr(error(errc::cancelled, "the coordinator closed"));
}

}  // namespace

closure_queue::closure_queue(asio::any_io_executor executor, std::vector<std::string> workers, start_function start,
                             cancel_function cancel, cancel_attempt_function cancel_attempt)
    : executor_(std::move(executor)),
      staggered_start_(executor_),
      start_(std::move(start)),
      cancel_(std::move(cancel)),
      cancel_attempt_(std::move(cancel_attempt)) {
  workers_.reserve(workers.size());
  for (auto& name : workers) {
    workers_.push_back(worker_slot{std::move(name), {}, true});
    worker_metrics_.push_back(std::make_unique<worker_metrics>());
    worker_metrics_.back()->up.set(1);
  }
}

void closure_queue::add_worker(std::string name) {
  // Not alive until worker_up: its per-worker values are made first. It joined after the staggered
  // start was planned: it starts at once.
  workers_.push_back(worker_slot{std::move(name), {}, false});
  worker_metrics_.push_back(std::make_unique<worker_metrics>());
}

void closure_queue::drain(std::size_t worker, join_handler drained) {
  auto& slot = workers_.at(worker);
  if (!slot.draining) {
    slot.draining = true;
    worker_metrics_[worker]->drained.set(1);
    worker_metrics_[worker]->up.set(0);
  }
  slot.drainers.push_back(std::move(drained));
  dispatch();
}

bool closure_queue::undrain(std::size_t worker) {
  auto& slot = workers_.at(worker);
  if (!slot.draining) return false;
  slot.draining = false;
  worker_metrics_[worker]->drained.set(0);
  if (slot.drainers.empty()) {
    slot.alive = false;  // until worker_up: its per-worker values are made again first
    return false;
  }
  auto drainers = std::move(slot.drainers);
  slot.drainers.clear();
  const auto called_off = std::make_exception_ptr(
      error(errc::cancelled, fmt::format("the drain of {} was called off: it was resumed first", slot.name)));
  for (auto& drained : drainers) drained(called_off);
  if (slot.alive) worker_metrics_[worker]->up.set(1);
  dispatch();
  return true;
}

void closure_queue::notify_drainers() {
  for (auto& w : workers_) {
    if (!w.draining || !w.running.empty() || w.drainers.empty()) continue;
    auto drainers = std::move(w.drainers);
    w.drainers.clear();
    for (auto& drained : drainers) drained(nullptr);
  }
}

void closure_queue::set_options(const coordinator_options& options) {
  options_ = options;
  const auto now = clock::now();
  for (std::size_t i = 0; i < workers_.size(); ++i) {
    // TF's _maybe_delay: i x delay, capped when a cap is set.
    auto delay = options_.schedule_start_delay * static_cast<std::int64_t>(i);
    if (options_.schedule_start_delay_max > std::chrono::milliseconds(0)) {
      delay = std::min(delay, options_.schedule_start_delay_max);
    }
    workers_[i].takes_from = now + delay;
  }
}

std::size_t closure_queue::in_flight() const noexcept {
  return std::accumulate(workers_.begin(), workers_.end(), std::size_t{0},
                         [](std::size_t sum, const worker_slot& w) { return sum + w.running.size(); });
}

std::shared_ptr<detail::remote_state> closure_queue::schedule(closure_ptr c) {
  if (auto e = take_error()) std::rethrow_exception(e);
  if (fatal_) std::rethrow_exception(fatal_);
  if (!has_room() || !waiting_.empty()) {
    throw error(errc::resource_exhausted,
                fmt::format("the closure queue holds {} closures (coordinator_options::max_queued_closures); on the "
                            "coordinator's executor, co_await wait_and_schedule() to wait for room",
                            queue_.size()));
  }
  auto result = c->result;
  if (closed_) {
    result->set_error(closed_error(), remote_status::cancelled);
    return result;
  }
  c->generation = generation_;
  number(*c);
  queue_.push_back(std::move(c));
  scheduled_counter_.inc();
  dispatch();
  return result;
}

void closure_queue::schedule_when_room(closure_ptr c, admission_handler admitted) {
  if (closed_) {
    c->result->set_error(closed_error(), remote_status::cancelled);
    admitted(nullptr, c->result);
    return;
  }
  waiting_.push_back({std::move(c), std::move(admitted)});
  dispatch();
}

bool closure_queue::admit_waiting() {
  bool admitted = false;
  while (!waiting_.empty()) {
    auto producer = std::move(waiting_.front());
    if (failing()) {
      // No closure starts while an error waits, so the queue would not drain: the waiting
      // producer is the next schedule call, and reports the error (TF: put() raises it).
      waiting_.pop_front();
      auto failure = take_error();
      producer.admitted(failure ? failure : fatal_, nullptr);
      continue;
    }
    if (!has_room()) {
      waiting_.front() = std::move(producer);
      break;
    }
    waiting_.pop_front();
    producer.c->generation = generation_;
    number(*producer.c);
    producer.admitted(nullptr, producer.c->result);
    queue_.push_back(std::move(producer.c));
    scheduled_counter_.inc();
    admitted = true;
  }
  return admitted;
}

void closure_queue::dispatch() {
  do {
    start_closures();
  } while (admit_waiting());
  check_recovery_timeout(clock::now());
  notify_joiners();
  notify_drainers();
  publish();
}

void closure_queue::publish() noexcept {
  queued_gauge_.set(static_cast<std::int64_t>(queue_.size()));
  inflight_gauge_.set(static_cast<std::int64_t>(in_flight()));
  for (std::size_t i = 0; i < workers_.size(); ++i) {
    worker_metrics_[i]->in_flight.set(static_cast<std::int64_t>(workers_[i].running.size()));
  }
}

void closure_queue::release() {
  if (holds_ > 0 && --holds_ == 0) dispatch();
}

void closure_queue::start_closures() {
  // While an error waits to be reported, nothing new starts: what is queued will be cancelled.
  // With bounded staleness the queue is in number order, and nothing past the front's number starts
  // before it.
  const auto now = clock::now();
  std::optional<clock::time_point> next_start;  // the soonest start of a worker not started yet
  while (!queue_.empty() && !failing() && !held() && within_window(queue_.front()->number)) {
    // The least busy live worker with a free slot, scanning from a rotating start for fairness.
    const std::size_t none = workers_.size();
    std::size_t best = none;
    for (std::size_t k = 0; k < workers_.size(); ++k) {
      const std::size_t i = (next_worker_ + k) % workers_.size();
      const auto& w = workers_[i];
      if (!takes_closures(w) || w.running.size() >= options_.closures_per_worker) continue;
      if (w.takes_from > now) {
        if (!next_start || w.takes_from < *next_start) next_start = w.takes_from;
        continue;
      }
      if (best == none || w.running.size() < workers_[best].running.size()) best = i;
    }
    if (best == none) break;
    next_worker_ = (best + 1) % workers_.size();
    auto c = std::move(queue_.front());
    queue_.pop_front();
    c->started = clock::now();
    c->finished_before = finished_;
    workers_[best].running.push_back(c);
    start_(best, c);
  }
  if (next_start && !queue_.empty() && staggered_start_.expiry() != *next_start) {
    // Closures wait that a worker not started yet could take: look again when it starts.
    staggered_start_.expires_at(*next_start);
    staggered_start_.async_wait([weak = weak_from_this()](std::error_code ec) {
      if (auto self = weak.lock(); self && !ec) self->dispatch();
    });
  }
}

void closure_queue::worker_up(std::size_t worker) {
  auto& slot = workers_.at(worker);
  // A worker that joined or was resumed comes up, not back from a loss.
  if (std::exchange(slot.lost_since_up, false)) worker_metrics_[worker]->restarts.inc();
  slot.alive = true;
  if (!slot.draining) worker_metrics_[worker]->up.set(1);
  dispatch();
}

void closure_queue::worker_lost(std::size_t worker) {
  workers_.at(worker).alive = false;
  workers_[worker].lost_since_up = true;
  worker_metrics_.at(worker)->up.set(0);
  dispatch();
}

bool closure_queue::take_running(std::size_t worker, const closure_ptr& c) {
  auto& running = workers_.at(worker).running;
  const auto it = std::find(running.begin(), running.end(), c);
  if (it == running.end()) return false;
  running.erase(it);
  return true;
}

bool closure_queue::running_anywhere(const closure_ptr& c) const {
  return std::any_of(workers_.begin(), workers_.end(), [&](const worker_slot& w) {
    return std::find(w.running.begin(), w.running.end(), c) != w.running.end();
  });
}

void closure_queue::end_other_attempts(std::size_t winner, const closure_ptr& c, clock::time_point now) {
  for (std::size_t w = 0; w < workers_.size(); ++w) {
    if (w != winner && take_running(w, c) && cancel_attempt_) cancel_attempt_(w, c);
  }
  const bool backup = c->backup_worker == winner;
  if (backup) backup_wins_.inc();
  if (const auto it = speculation_.find(c->function); it != speculation_.end()) {
    auto& runs = it->second;
    const double seconds = std::chrono::duration<double>(now - (backup ? c->backup_started : c->started)).count();
    if (runs.recent.size() < recent_runs) {
      runs.recent.push_back(seconds);
    } else {
      runs.recent[runs.next] = seconds;
      runs.next = (runs.next + 1) % recent_runs;
    }
  }
}

void closure_queue::speculate(const std::string& function, const speculation_options& options) {
  if (!(options.multiplier >= 1) || options.min_run_time < std::chrono::milliseconds(0)) {
    throw error(errc::invalid_argument,
                fmt::format("speculation of '{}': the multiplier must be at least 1 (got {}) and the minimum run time "
                            "not negative (got {})",
                            function, options.multiplier, options.min_run_time));
  }
  speculation_[function].options = options;
}

void closure_queue::check_speculation(clock::time_point now) {
  // A backup takes room a queued closure could take: only when nothing queued may start.
  if (speculation_.empty() || failing() || held() || closed_ ||
      (!queue_.empty() && within_window(queue_.front()->number))) {
    return;
  }
  for (std::size_t w = 0; w < workers_.size(); ++w) {
    for (const auto& c : std::vector(workers_[w].running)) {  // a copy: a backup may go on any list
      if (c->backup_worker) continue;  // one backup at most
      const auto it = speculation_.find(c->function);
      if (it == speculation_.end()) continue;
      const auto& runs = it->second;
      if (runs.recent.size() < std::max<std::size_t>(runs.options.min_samples, 1)) continue;
      std::vector<double> sorted = runs.recent;
      std::nth_element(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(sorted.size() / 2), sorted.end());
      const double median = sorted[sorted.size() / 2];
      const double running = std::chrono::duration<double>(now - c->started).count();
      const double min_run_time = std::chrono::duration<double>(runs.options.min_run_time).count();
      if (running <= std::max(min_run_time, runs.options.multiplier * median)) continue;
      // The least busy other live worker with room, started.
      std::optional<std::size_t> best;
      for (std::size_t b = 0; b < workers_.size(); ++b) {
        const auto& other = workers_[b];
        if (b == w || !takes_closures(other) || other.takes_from > now || other.running.size() >= options_.closures_per_worker) {
          continue;
        }
        if (!best || other.running.size() < workers_[*best].running.size()) best = b;
      }
      if (!best) return;  // no room anywhere
      c->backup_worker = *best;
      c->backup_started = now;
      speculated_.inc();
      workers_[*best].running.push_back(c);
      log::info("closure '{}' has run on {} for {:.2f} s, {:.1f}x its function's median: a backup runs on {}",
                c->function, workers_[w].name, running, median > 0 ? running / median : 0.0, workers_[*best].name);
      start_(*best, c);
    }
  }
}

void closure_queue::succeeded(std::size_t worker, const closure_ptr& c, value result) {
  if (!take_running(worker, c)) return;
  last_progress_ = clock::now();
  end_other_attempts(worker, c, last_progress_);
  count_finished(*c);
  worker_metrics_[worker]->succeeded.inc();
  c->result->set_value(std::move(result));
  settle(c->number);
  dispatch();
}

void closure_queue::failed(std::size_t worker, const closure_ptr& c, std::exception_ptr e) {
  if (!take_running(worker, c)) return;
  last_progress_ = clock::now();
  end_other_attempts(worker, c, last_progress_);  // the first outcome is the closure's, a failure too
  count_finished(*c);
  worker_metrics_[worker]->failed.inc();
  c->result->set_error(e);
  settle(c->number);
  record_error(std::move(e), c->generation);
  dispatch();
}

void closure_queue::retry(std::size_t worker, const closure_ptr& c) {
  if (!take_running(worker, c)) return;
  last_progress_ = clock::now();
  if (!running_anywhere(c)) requeue(c);  // else its other attempt goes on
  dispatch();
}

void closure_queue::requeue(const closure_ptr& c) {
  c->backup_worker.reset();  // no attempt of it runs now: it may get a backup again when it runs
  if (!options_.max_staleness) {
    queue_.push_back(c);
    return;
  }
  const auto at = std::lower_bound(queue_.begin(), queue_.end(), c->number,
                                   [](const closure_ptr& queued, std::uint64_t n) { return queued->number < n; });
  queue_.insert(at, c);
}

void closure_queue::count_finished(const closure& c) {
  const std::uint64_t missed = finished_ - c.finished_before;
  staleness_.observe(static_cast<double>(missed));
  if (static_cast<std::int64_t>(missed) > staleness_max_.value()) staleness_max_.set(static_cast<std::int64_t>(missed));
  ++finished_;
}

void closure_queue::settle(std::uint64_t number) {
  if (!options_.max_staleness || number < lowest_unsettled_) return;
  const std::uint64_t at = number - lowest_unsettled_;
  if (at >= settled_.size()) settled_.resize(at + 1, false);
  settled_[at] = true;
  while (!settled_.empty() && settled_.front()) {
    settled_.pop_front();
    ++lowest_unsettled_;
  }
}

std::vector<double> closure_queue::staleness_bounds() {
  std::vector<double> bounds;
  for (int s = 0; s <= 16; ++s) bounds.push_back(s);
  for (int s = 32; s <= (1 << 20); s *= 2) bounds.push_back(s);
  return bounds;
}

void closure_queue::lost(std::size_t worker, const closure_ptr& c) {
  // Still running means no error is pending: recording one stops every running closure of its
  // generation, and a newer generation starts only once it is reported (take_error).
  if (!take_running(worker, c)) return;
  if (running_anywhere(c)) {
    // Its other attempt goes on.
  } else if (closed_) {
    c->result->set_error(closed_error(), remote_status::cancelled);
    settle(c->number);
  } else {
    requeue(c);  // at least once: it runs again elsewhere (TF: at the tail)
  }
  dispatch();
}

void closure_queue::fail(std::exception_ptr e) {
  if (fatal_) return;
  fatal_ = e;
  // What runs now cannot finish well, and its worker may wait long for what failed: resolve it
  // now with the failure, so that nothing waits on it; its outcome is ignored when it comes.
  for (const auto& c : stop_running(std::nullopt)) {
    c->result->set_error(e);
    settle(c->number);
  }
  record_error(e, generation_);
  dispatch();
}

void closure_queue::close() {
  closed_ = true;
  staggered_start_.cancel();  // nothing waits for a worker's start any more
  // Nothing queued will run any more: say so, rather than leave remote_values waiting forever.
  const auto closed = closed_error();
  auto queued = std::move(queue_);
  queue_.clear();
  for (const auto& c : queued) {
    c->result->set_error(closed, remote_status::cancelled);
    settle(c->number);
  }
  auto waiting = std::move(waiting_);
  waiting_.clear();
  for (auto& producer : waiting) producer.admitted(closed, nullptr);
  notify_drainers();
  publish();
}

void closure_queue::record_error(std::exception_ptr e, std::uint64_t generation) {
  if (generation != generation_ || pending_error_) return;  // first error only; older ones were reported
  pending_error_ = std::move(e);
  // Nothing queued starts while the error waits, and TF throws the queue away when the error is
  // raised. Do it now: a caller awaiting one of those remote_values before its join() (the natural
  // loop over results) learns it was cancelled instead of waiting forever.
  auto queued = std::move(queue_);
  queue_.clear();
  for (const auto& c : queued) cancel(*c);
  // What still runs of this generation is cancelled too: join() raises now instead of waiting for
  // it, and its worker stops it at its next pscoro operation (TF's testCancellation).
  for (const auto& c : stop_running(generation)) cancel(*c);
}

std::vector<closure_queue::closure_ptr> closure_queue::stop_running(std::optional<std::uint64_t> generation) {
  std::vector<closure_ptr> stopped;
  for (std::size_t w = 0; w < workers_.size(); ++w) {
    auto& running = workers_[w].running;
    std::vector<std::uint64_t> generations;  // to cancel on this worker
    std::erase_if(running, [&](const closure_ptr& c) {
      if (generation && c->generation != *generation) return false;
      if (std::find(generations.begin(), generations.end(), c->generation) == generations.end()) {
        generations.push_back(c->generation);
      }
      // Once, though a closure with a backup runs on two workers.
      if (std::find(stopped.begin(), stopped.end(), c) == stopped.end()) stopped.push_back(c);
      return true;
    });
    if (cancel_) {
      for (const auto g : generations) cancel_(w, g);
    }
  }
  return stopped;
}

void closure_queue::cancel(const closure& c) {
  settle(c.number);
  // TF's message, plus the cause: whoever awaits this value learns why without a join().
  const std::string cause = common::what_of(pending_error_, "an unknown error");
  c.result->set_error(std::make_exception_ptr(error(
                          errc::cancelled, fmt::format("The corresponding function '{}' is cancelled. Please "
                                                       "reschedule the function. (An earlier function failed: {})",
                                                       c.function, cause))),
                      remote_status::cancelled);
}

std::exception_ptr closure_queue::take_error() {
  if (!pending_error_) return nullptr;
  ++generation_;
  // Producers waiting for room can go on now; later, not inside the caller's own call.
  if (!waiting_.empty()) asio::post(executor_, [self = shared_from_this()] { self->dispatch(); });
  return std::exchange(pending_error_, nullptr);
}

void closure_queue::join(join_handler handler) {
  joiners_.push_back(std::move(handler));
  notify_joiners();
}

void closure_queue::notify_joiners() {
  // TF: join returns (or raises) only when no closure is running. Nor while the queue is held: a
  // lost ps is being restored, and what a program reads after join() must be there.
  if (joiners_.empty() || in_flight() > 0 || ((!queue_.empty() || held()) && !pending_error_)) return;
  auto error = take_error();
  auto joiners = std::move(joiners_);
  joiners_.clear();
  for (auto& joiner : joiners) joiner(error);
}

bool closure_queue::done() {
  if (auto e = take_error()) std::rethrow_exception(e);
  return queue_.empty() && in_flight() == 0 && !held();
}

void closure_queue::tick(clock::time_point now) {
  check_speculation(now);
  check_recovery_timeout(now);
  check_watchdog(now);
  notify_joiners();
  notify_drainers();
  publish();
}

void closure_queue::check_recovery_timeout(clock::time_point now) {
  if (std::any_of(workers_.begin(), workers_.end(), [](const auto& w) { return takes_closures(w); })) {
    all_lost_since_.reset();
    return;
  }
  if (!all_lost_since_) all_lost_since_ = now;
  if ((queue_.empty() && waiting_.empty()) || pending_error_ || now - *all_lost_since_ < options_.worker_recovery_timeout) {
    return;
  }
  record_error(std::make_exception_ptr(error(
                   errc::unavailable, fmt::format("every worker is lost and none came back within {} "
                                                  "(coordinator_options::worker_recovery_timeout); queued closures "
                                                  "cannot run",
                                                  options_.worker_recovery_timeout))),
               generation_);
  admit_waiting();
}

void closure_queue::check_watchdog(clock::time_point now) {
  const auto running = in_flight();
  if (options_.watchdog_timeout <= std::chrono::milliseconds(0) || (running == 0 && queue_.empty())) {
    last_progress_ = now;  // idle time is not a stall
    return;
  }
  if (now - last_progress_ < options_.watchdog_timeout) return;
  last_progress_ = now;  // once per timeout, as TF's watchdog
  using seconds = std::chrono::duration<double>;
  log::warning("watchdog: no closure finished for {} (coordinator_options::watchdog_timeout): {} queued, {} running",
               options_.watchdog_timeout, queue_.size(), running);
  for (const auto& worker : workers_) {
    std::vector<std::string> lines;
    for (const auto& c : worker.running) {
      lines.push_back(fmt::format("'{}' for {:.1f}s", c->function, seconds(now - c->started).count()));
    }
    log::warning("watchdog: {} ({}): {}", worker.name, worker.alive ? "alive" : "lost",
                 lines.empty() ? std::string("nothing running") : common::join(lines, ", "));
  }
}

}  // namespace pscoro::chief

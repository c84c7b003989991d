#include "chief/closure_queue.hpp"

#include "common/log.hpp"
#include "common/text.hpp"

#include <pscoro/error.hpp>

#include <asio/post.hpp>

#include <fmt/chrono.h>
#include <fmt/format.h>

#include <algorithm>
#include <numeric>

namespace pscoro::chief {

namespace {

std::exception_ptr closed_error() {
  return std::make_exception_ptr(error(errc::cancelled, "the coordinator closed"));
}

}  // namespace

closure_queue::closure_queue(asio::any_io_executor executor, std::vector<std::string> workers, start_function start,
                             cancel_function cancel)
    : executor_(std::move(executor)), start_(std::move(start)), cancel_(std::move(cancel)) {
  workers_.reserve(workers.size());
  for (auto& name : workers) {
    workers_.push_back(worker_slot{std::move(name), {}, true});
    worker_metrics_.push_back(std::make_unique<worker_metrics>());
    worker_metrics_.back()->up.set(1);
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
  while (!queue_.empty() && !failing() && !held()) {
    // The least busy live worker with a free slot, scanning from a rotating start for fairness.
    const std::size_t none = workers_.size();
    std::size_t best = none;
    for (std::size_t k = 0; k < workers_.size(); ++k) {
      const std::size_t i = (next_worker_ + k) % workers_.size();
      const auto& w = workers_[i];
      if (!w.alive || w.running.size() >= options_.closures_per_worker) continue;
      if (best == none || w.running.size() < workers_[best].running.size()) best = i;
    }
    if (best == none) break;
    next_worker_ = (best + 1) % workers_.size();
    auto c = std::move(queue_.front());
    queue_.pop_front();
    c->started = clock::now();
    workers_[best].running.push_back(c);
    start_(best, c);
  }
}

void closure_queue::worker_up(std::size_t worker) {
  if (!workers_.at(worker).alive) worker_metrics_[worker]->restarts.inc();
  worker_metrics_[worker]->up.set(1);
  workers_.at(worker).alive = true;
  dispatch();
}

void closure_queue::worker_lost(std::size_t worker) {
  workers_.at(worker).alive = false;
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

void closure_queue::succeeded(std::size_t worker, const closure_ptr& c, value result) {
  if (!take_running(worker, c)) return;
  last_progress_ = clock::now();
  worker_metrics_[worker]->succeeded.inc();
  c->result->set_value(std::move(result));
  dispatch();
}

void closure_queue::failed(std::size_t worker, const closure_ptr& c, std::exception_ptr e) {
  if (!take_running(worker, c)) return;
  last_progress_ = clock::now();
  worker_metrics_[worker]->failed.inc();
  c->result->set_error(e);
  record_error(std::move(e), c->generation);
  dispatch();
}

void closure_queue::retry(std::size_t worker, const closure_ptr& c) {
  if (!take_running(worker, c)) return;
  last_progress_ = clock::now();
  queue_.push_back(c);
  dispatch();
}

void closure_queue::lost(std::size_t worker, const closure_ptr& c) {
  // Still running means no error is pending: recording one stops every running closure of its
  // generation, and a newer generation starts only once it is reported (take_error).
  if (!take_running(worker, c)) return;
  if (closed_) {
    c->result->set_error(closed_error(), remote_status::cancelled);
  } else {
    queue_.push_back(c);  // at least once: it runs again elsewhere (TF: at the tail)
  }
  dispatch();
}

void closure_queue::fail(std::exception_ptr e) {
  if (fatal_) return;
  fatal_ = e;
  // What runs now cannot finish well, and its worker may wait long for what failed: resolve it
  // now with the failure, so that nothing waits on it; its outcome is ignored when it comes.
  for (const auto& c : stop_running(std::nullopt)) c->result->set_error(e);
  record_error(e, generation_);
  dispatch();
}

void closure_queue::close() {
  closed_ = true;
  // Nothing queued will run any more: say so, rather than leave remote_values waiting forever.
  const auto closed = closed_error();
  auto queued = std::move(queue_);
  queue_.clear();
  for (const auto& c : queued) c->result->set_error(closed, remote_status::cancelled);
  auto waiting = std::move(waiting_);
  waiting_.clear();
  for (auto& producer : waiting) producer.admitted(closed, nullptr);
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
      stopped.push_back(c);
      return true;
    });
    if (cancel_) {
      for (const auto g : generations) cancel_(w, g);
    }
  }
  return stopped;
}

void closure_queue::cancel(const closure& c) const {
  // TF's message, plus the cause: whoever awaits this value learns why without a join().
  std::string cause;
  try {
    std::rethrow_exception(pending_error_);
  } catch (const std::exception& e) {
    cause = e.what();
  } catch (...) {
    cause = "an unknown error";
  }
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
  // TF: join returns (or raises) only when no closure is running.
  if (joiners_.empty() || in_flight() > 0 || (!queue_.empty() && !pending_error_)) return;
  auto error = take_error();
  auto joiners = std::move(joiners_);
  joiners_.clear();
  for (auto& joiner : joiners) joiner(error);
}

bool closure_queue::done() {
  if (auto e = take_error()) std::rethrow_exception(e);
  return queue_.empty() && in_flight() == 0;
}

void closure_queue::tick(clock::time_point now) {
  check_recovery_timeout(now);
  check_watchdog(now);
  notify_joiners();
  publish();
}

void closure_queue::check_recovery_timeout(clock::time_point now) {
  if (std::any_of(workers_.begin(), workers_.end(), [](const auto& w) { return w.alive; })) {
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

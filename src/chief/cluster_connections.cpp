#include "chief/cluster_connections.hpp"

#include "common/log.hpp"
#include "common/text.hpp"

#include <pscoro/error.hpp>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/use_awaitable.hpp>

#include <fmt/format.h>

#include <optional>
#include <tuple>
#include <variant>

namespace pscoro::chief {

using asio::experimental::as_tuple;
using asio::use_awaitable;

cluster_connections::cluster_connections(asio::any_io_executor executor, const cluster_spec& cluster,
                                         net::task_identity self, std::string spec_address, transport_options transport,
                                         const std::string& chief_page)
    : executor_(std::move(executor)),
      self_(std::move(self)),
      task_(task_name(self_.job, self_.index)),
      spec_address_(std::move(spec_address)),
      transport_(std::move(transport)),
      announcement_gate_(task_, transport_) {
  // The chief's incarnation is its session on every server: a restarted chief starts a new one,
  // which makes the servers drop the old session's variables and iterators.
  auto hello = make_hello(self_, self_.incarnation);
  hello.set_chief_page(chief_page);
  for (const auto& job : {"ps", "worker"}) {
    auto* entry = hello.add_cluster();
    entry->set_name(job);
    for (const int index : cluster.task_indices(job)) (*entry->mutable_tasks())[index] = cluster.task_address(job, index);
  }
  for (const int index : cluster.task_indices("ps")) {
    ps_.push_back(std::make_shared<net::peer>(executor_, task_name("ps", index), cluster.task_address("ps", index), hello,
                                         transport_));
  }
  for (const int index : cluster.task_indices("worker")) {
    workers_.push_back(worker_slot{std::make_shared<net::peer>(executor_, task_name("worker", index),
                                                          cluster.task_address("worker", index), hello, transport_)});
  }
  spec_workers_ = workers_.size();
  session_hello_ = std::move(hello);
}

asio::awaitable<void> cluster_connections::connect() {
  // Losses are noticed as they happen (connection closed, heartbeat timeout), not only when a call
  // fails. The handlers hold the connections weakly: they may run while those are destroyed.
  for (std::size_t i = 0; i < ps_.size(); ++i) {
    ps_[i]->on_lost([weak = weak_from_this(), i](const std::string& reason) {
      auto self = weak.lock();
      if (self && !self->closed_ && self->events_.ps_lost) self->events_.ps_lost(i, reason);
    });
  }
  for (std::size_t i = 0; i < ps_.size(); ++i) {
    ps_[i]->on_heartbeat_reply([weak = weak_from_this(), i](const wire::frame& reply) {
      auto self = weak.lock();
      const auto& response = reply.message.response();
      if (self && !self->closed_ && response.has_ps_totals() && self->events_.ps_totals) {
        self->events_.ps_totals(i, response.ps_totals());
      }
    });
  }
  for (std::size_t i = 0; i < workers_.size(); ++i) {
    workers_[i].peer->on_lost([weak = weak_from_this(), i](const std::string& reason) {
      if (auto self = weak.lock()) self->worker_failed(i, reason);
    });
  }
  // Listen first: a worker that comes back at another address while we connect is heard.
  // Not being able to is no reason to fail the run: only moved workers go unheard.
  if (!spec_address_.empty() && !acceptor_) {
    acceptor_.emplace(executor_);
    try {
      net::listen_on(*acceptor_, net::listen_address_for(spec_address_, task_), task_, transport_);
      asio::co_spawn(executor_, hear_announcements(weak_from_this()), asio::detached);
    } catch (const std::exception& e) {
      log::warning("cannot listen for workers announcing a new address at {}: {}; a worker that moves will not be "
                   "found",
                   spec_address_, e.what());
      std::error_code ignored;
      acceptor_->close(ignored);
    }
  }
  {
    auto waiting_timer = std::make_shared<asio::steady_timer>(executor_);
    asio::co_spawn(executor_, report_waiting(weak_from_this(), waiting_timer), asio::detached);
    // However connect() ends (a throw too): nothing to report any more, even if the timer fired.
    struct stop_report {
      cluster_connections* self;
      std::shared_ptr<asio::steady_timer> timer;
      ~stop_report() {
        self->awaiting_ = nullptr;
        timer->cancel();
      }
    } stop{this, waiting_timer};
    // First who answers at every address, then the session: a spec that names a wrong address
    // (another task, or a task of another job holding the same secret) fails here, before this
    // chief has opened its session on any task, where it would end a live job's session on a
    // task it reached first. A Hello without a session is such a check (docs/protocol.md §4).
    const auto check = net::make_hello(self_, 0);
    std::vector<const net::peer*> tasks;
    for (const auto& ps : ps_) tasks.push_back(ps.get());
    for (const auto& worker : workers_) tasks.push_back(worker.peer.get());
    for (const auto* task : tasks) {
      awaiting_ = task;
      const auto checked = co_await net::connect_to_task(task->task(), task->address(), check, transport_);
      checked->close("the chief checked who answers here");
    }
    spec_checked_ = true;
    // One task at a time, in spec order: the first failure is the first task's, as it always was.
    for (const auto& ps : ps_) {
      awaiting_ = ps.get();
      co_await ps->get();
    }
    for (const auto& worker : workers_) {
      awaiting_ = worker.peer.get();
      co_await worker.peer->get();
    }
    awaiting_ = nullptr;
  }
  log::info("connected to {} ps and {} workers", ps_.size(), workers_.size());
  if (!watch_timer_) {
    watch_timer_.emplace(executor_);
    asio::co_spawn(executor_, watch_workers(weak_from_this()), asio::detached);
  }
}

void cluster_connections::close(std::optional<int> job_exit_code) {
  // Once: a second close() (the strategy's destructor after close()) must not cut the Shutdown
  // exchange short.
  if (std::exchange(closed_, true)) return;
  if (watch_timer_) watch_timer_->cancel();
  if (acceptor_) {
    std::error_code ignored;
    acceptor_->close(ignored);
  }
  std::vector<std::shared_ptr<net::peer>> tasks(ps_.begin(), ps_.end());
  for (const auto& worker : workers_) tasks.push_back(worker.peer);
  if (job_exit_code && !spec_checked_) {
    // Not every address of the spec answered as the task it names: the tasks reached may belong
    // to another job (one that shares the secret), and a Shutdown would open this chief's session
    // on them and end that job. They are left as they are; whoever started them stops them.
    log::warning("the job ends before every task of the cluster spec was confirmed: no task is told to exit");
    job_exit_code.reset();
  }
  if (!job_exit_code) {
    for (const auto& p : tasks) p->close("the coordinator closed");
    return;
  }
  end_job(std::move(tasks), *job_exit_code);
}

// What every task's end_task holds: the last one done cancels the deadline, so the executor runs
// out of work as soon as every task has answered.
struct cluster_connections::ending {
  ending(asio::any_io_executor executor, std::chrono::milliseconds timeout, std::size_t tasks)
      : deadline(std::move(executor), timeout), waiting(tasks) {}
  asio::steady_timer deadline;
  std::size_t waiting;
};

void cluster_connections::end_job(std::vector<std::shared_ptr<net::peer>> tasks, int exit_code) {
  log::info("the job ends: telling {} task(s) to exit with code {}", tasks.size(), exit_code);
  auto state = std::make_shared<ending>(executor_, transport_.handshake_timeout, tasks.size());
  state->deadline.async_wait([tasks](std::error_code ec) {
    if (ec) return;
    for (const auto& p : tasks) {
      if (p->connection()) log::warning("{} did not answer the Shutdown in time; closing", p->task());
      p->close("the job ended");
    }
  });
  for (const auto& p : tasks) asio::co_spawn(executor_, end_task(p, exit_code, state), asio::detached);
}

asio::awaitable<void> cluster_connections::end_task(std::shared_ptr<net::peer> task, int exit_code,
                                                    std::shared_ptr<ending> state) {
  try {
    auto connection = task->connection();
    // A task the chief lost may still run (a network blip, a worker that was hung): one attempt.
    if (!connection) connection = co_await task->connect_once();
    if (connection) {
      wire::frame request;
      request.message.mutable_request()->mutable_shutdown()->set_exit_code(exit_code);
      const auto [ec, response] = co_await connection->async_call(std::move(request), as_tuple(use_awaitable));
      if (ec) {
        log::warning("{} did not answer the Shutdown: {}", task->task(), connection->close_reason());
      } else if (const auto& status = response.message.response().status(); status.code() != 0) {
        log::warning("{} refused the Shutdown: {}", task->task(), status.message());
      }
    } else {
      log::warning("{} at {} could not be reached to tell it that the job ended", task->task(), task->address());
    }
  } catch (const std::exception& e) {
    log::warning("{} could not be told that the job ended: {}", task->task(), e.what());
  }
  task->close("the job ended");
  if (--state->waiting == 0) state->deadline.cancel();
}

void cluster_connections::worker_failed(std::size_t index, const std::string& reason) {
  auto& slot = workers_.at(index);
  if (slot.drained && !closed_ && !reason.empty()) {
    // Its task may leave once drained (scaled down): nothing of the job is lost with it.
    log::info("drained {} disconnected: {}", slot.peer->task(), reason);
    return;
  }
  if (closed_ || !slot.ready) return;
  log::warning("lost {}: {}; its closures go back to the queue", slot.peer->task(), reason);
  slot.ready = false;
  if (events_.worker_lost) events_.worker_lost(index);
}

std::string cluster_connections::address() const {
  if (!acceptor_ || !acceptor_->is_open()) return {};
  return common::format_address(acceptor_->local_endpoint());
}

asio::awaitable<void> cluster_connections::report_waiting(std::weak_ptr<cluster_connections> weak,
                                                          std::shared_ptr<asio::steady_timer> timer) {
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    timer->expires_after(waiting_report_interval);
    const auto [woke] = co_await timer->async_wait(as_tuple(use_awaitable));
    auto self = weak.lock();
    if (!self || self->closed_ || woke == asio::error::operation_aborted) co_return;
    const net::peer* awaiting = self->awaiting_;
    if (!awaiting) co_return;
    std::size_t connected = 0;
    for (const auto& ps : self->ps_) connected += ps->connection() ? 1 : 0;
    for (const auto& worker : self->workers_) connected += worker.peer->connection() ? 1 : 0;
    const auto waited = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - start);
    log::info("still waiting for {} at {} after {} s ({} of {} tasks connected; the chief gives up on a task after "
              "{} s, transport_options::connect_timeout)",
              awaiting->task(), awaiting->address(), waited.count(), connected,
              self->ps_.size() + self->workers_.size(),
              std::chrono::duration_cast<std::chrono::seconds>(self->transport_.connect_timeout).count());
  }
}

asio::awaitable<void> cluster_connections::watch_workers(std::weak_ptr<cluster_connections> weak) {
  for (;;) {
    asio::steady_timer* timer = nullptr;
    {
      auto self = weak.lock();
      if (!self || self->closed_) co_return;
      timer = &*self->watch_timer_;
      timer->expires_after(self->probe_interval_);
    }
    // Waits holding nothing: close() or destroyed connections cancel the timer, ending the loop.
    const auto [woke] = co_await timer->async_wait(as_tuple(use_awaitable));
    auto self = weak.lock();
    if (!self || self->closed_ || woke == asio::error::operation_aborted) co_return;
    for (std::size_t i = 0; i < self->workers_.size(); ++i) self->probe(i);
    if (self->events_.tick) self->events_.tick();
  }
}

void cluster_connections::drain(std::size_t index) {
  auto& slot = workers_.at(index);
  slot.drained = true;
  slot.ready = false;
}

void cluster_connections::resume(std::size_t index, bool holds_values) {
  auto& slot = workers_.at(index);
  if (!slot.drained) return;
  slot.drained = false;
  slot.ready = holds_values && slot.peer->connection();
  probe(index);  // at once when not ready: it may still be connected
}

void cluster_connections::probe(std::size_t index) {
  auto& slot = workers_[index];
  if (closed_ || slot.ready || slot.probing || slot.drained) return;
  slot.probing = true;
  asio::co_spawn(executor_, recover(shared_from_this(), index), asio::detached);
}

asio::awaitable<void> cluster_connections::hear_announcements(std::weak_ptr<cluster_connections> weak) {
  net::accept_backoff backoff;
  for (;;) {
    asio::ip::tcp::acceptor* acceptor = nullptr;
    {
      auto self = weak.lock();
      if (!self || self->closed_) co_return;
      acceptor = &*self->acceptor_;
    }
    // Waits holding nothing: close() or destroyed connections close the acceptor.
    auto [ec, socket] = co_await acceptor->async_accept(as_tuple(use_awaitable));
    auto self = weak.lock();
    if (!self || self->closed_ || ec == asio::error::operation_aborted) co_return;
    if (ec) {
      const auto task = self->task_;
      self.reset();  // the wait holds nothing either
      co_await backoff.failed(ec, task);
      continue;
    }
    backoff.succeeded();
    asio::co_spawn(self->executor_, hear_announcement(weak, std::move(socket)), asio::detached);
  }
}

asio::awaitable<void> cluster_connections::hear_announcement(std::weak_ptr<cluster_connections> weak,
                                                             asio::ip::tcp::socket socket) {
  std::string task;
  transport_options transport;
  net::task_identity identity;
  std::error_code ignored;
  const auto remote = socket.remote_endpoint(ignored);
  auto connection =
      std::make_shared<wire::connection>(std::move(socket), net::limits_of(transport), common::format_address(remote));
  std::optional<net::handshake_gate::place> place;
  {
    auto self = weak.lock();
    if (!self) co_return;
    task = self->task_;
    transport = self->transport_;
    identity = self->self_;
    // An announcement is its handshake and nothing more: no connection outlives it.
    auto entered = self->announcement_gate_.enter(remote.address().to_string(), 0);
    if (const auto* refused = std::get_if<std::string>(&entered)) {
      net::refuse_early(connection, transport, make_error_code(errc::resource_exhausted), *refused, task);
      co_return;
    }
    place.emplace(std::get<net::handshake_gate::place>(std::move(entered)));
  }
  auto budget = place->budget();
  const auto hello = co_await net::receive_hello(connection, transport, identity, std::move(budget));
  place.reset();
  auto self = weak.lock();
  if (!hello || !self || self->closed_) co_return;
  const auto count = self->workers_.size();
  // Quoted as the peer named itself: a worker with no index says -1.
  const auto claimed = hello->task_index() < 0 ? std::string("an unlisted worker")
                                               : task_name("worker", hello->task_index());
  const bool listed = hello->task_index() >= 0 && static_cast<std::size_t>(hello->task_index()) < count;
  std::string refusal;
  std::error_code refusal_code = make_error_code(errc::invalid_argument);
  if (hello->job() != "worker" || hello->address().empty()) {
    refusal = fmt::format("{} hears only workers announcing their address (got a Hello of '{}'{})", task,
                          hello->job(), hello->address().empty() ? " without an address" : "");
  } else {
    try {
      (void)common::split_address(hello->address(), claimed);
    } catch (const error& e) {
      refusal = e.what();
    }
  }
  // Not one of the workers the chief has: a worker asking to join (elastic admission). An
  // admitted worker the chief has lost is most likely this one, restarted by its cluster manager
  // with no index to say so: it takes that index back (within the cap, as it was).
  std::optional<std::size_t> taken_back;
  if (refusal.empty() && !listed) {
    taken_back = self->lost_admitted_worker();
    if (!taken_back) std::tie(refusal_code, refusal) = self->admission(claimed, hello->address());
  }
  if (!refusal.empty()) {
    net::refuse(connection, refusal_code, refusal, task);
    co_return;
  }
  net::welcome(connection, identity);
  connection->close_after_flush("announcement heard");
  if (listed) {
    self->announced(static_cast<std::size_t>(hello->task_index()), hello->address());
  } else if (taken_back) {
    log::info("{} at {} takes back the index of {}, admitted before and lost", claimed, hello->address(),
              self->workers_[*taken_back].peer->task());
    self->announced(*taken_back, hello->address());
  } else {
    self->admit(hello->address());
  }
}

std::pair<std::error_code, std::string> cluster_connections::admission(const std::string& claimed,
                                                                       const std::string& address) const {
  const auto who = fmt::format("{} at {}", claimed, address);
  // resource_exhausted is not a refusal to a worker: it announces itself again (with backoff, until
  // heard), and the chief decides once it has connected to its cluster and has a coordinator.
  if (!watch_timer_) {
    return {make_error_code(errc::resource_exhausted),
            fmt::format("{} admits workers once it has connected to its cluster; {} asks again", task_, who)};
  }
  if (!elastic_cap_) {
    return {make_error_code(errc::resource_exhausted),
            fmt::format("{} admits workers once its cluster_coordinator is made; {} asks again", task_, who)};
  }
  const auto spec = fmt::format("the cluster spec has workers 0..{}", spec_workers_ - 1);
  if (*elastic_cap_ == 0) {
    return {make_error_code(errc::permission_denied),
            fmt::format("{} is not one of this job's workers ({}), and the job admits no worker beyond its cluster spec "
                        "(coordinator_options::max_elastic_workers is 0)",
                        who, spec)};
  }
  std::size_t admitted = 0;
  for (std::size_t i = spec_workers_; i < workers_.size(); ++i) admitted += workers_[i].drained ? 0 : 1;
  if (admitted >= *elastic_cap_) {
    return {make_error_code(errc::permission_denied),
            fmt::format("{} is refused: the job admits at most {} worker(s) beyond its cluster spec "
                        "(coordinator_options::max_elastic_workers) and has {} ({})",
                        who, *elastic_cap_, admitted, spec)};
  }
  return {};
}

std::optional<std::size_t> cluster_connections::lost_admitted_worker() const {
  // Only while admission is on: with it off, nothing beyond the spec is taken, back or new.
  if (!watch_timer_ || !elastic_cap_ || *elastic_cap_ == 0) return std::nullopt;
  for (std::size_t i = spec_workers_; i < workers_.size(); ++i) {
    if (!workers_[i].ready && !workers_[i].drained) return i;
  }
  return std::nullopt;
}

void cluster_connections::admit(const std::string& address) {
  const auto index = workers_.size();
  auto hello = session_hello_;
  hello.set_admits(true);  // the index it dials is the one this worker is given
  workers_.push_back(worker_slot{
      std::make_shared<net::peer>(executor_, task_name("worker", static_cast<int>(index)), address, hello, transport_),
      false});
  workers_.back().peer->on_lost([weak = weak_from_this(), index](const std::string& reason) {
    if (auto self = weak.lock()) self->worker_failed(index, reason);
  });
  log::info("admitted {} at {}, beyond the cluster spec's {} worker(s); it takes closures once its per-worker values "
            "are made",
            workers_.back().peer->task(), address, spec_workers_);
  if (events_.worker_admitted) events_.worker_admitted(index);
  probe(index);
}

void cluster_connections::announced(std::size_t index, const std::string& address) {
  auto& slot = workers_[index];
  if (address != slot.peer->address()) {
    log::info("{} announced itself at {} (was {})", slot.peer->task(), address, slot.peer->address());
    slot.peer->set_address(address);
    // What it ran at the old address is lost with the old process: its calls fail and their
    // closures go back to the queue.
    const auto moved = fmt::format("it moved to {}", address);
    worker_failed(index, moved);
    slot.peer->close(moved);
  }
  probe(index);
}

asio::awaitable<void> cluster_connections::recover(std::shared_ptr<cluster_connections> self, std::size_t index) {
  auto& slot = self->workers_[index];  // a deque: admitted workers never move the others
  try {
    if (co_await slot.peer->connect_once() && !self->closed_) {
      // Its per-worker resources first: no closure may reach it before its iterators exist.
      if (self->events_.prepare_worker) {
        auto prepared = self->events_.prepare_worker(index);  // named: g++ 12 (temporaries)
        co_await std::move(prepared);
      }
      if (!self->closed_ && !slot.drained && slot.peer->connection()) {
        slot.ready = true;
        if (self->events_.worker_back) self->events_.worker_back(index);
      }
    }
  } catch (const std::exception& e) {
    log::warning("{} answered but cannot take closures yet: {}", slot.peer->task(), e.what());
    slot.peer->close("recovery failed");
  }
  slot.probing = false;
}

}  // namespace pscoro::chief

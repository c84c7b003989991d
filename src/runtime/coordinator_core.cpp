#include "runtime/coordinator_core.hpp"

#include "runtime/log.hpp"
#include "runtime/security.hpp"
#include "runtime/text.hpp"
#include "runtime/values.hpp"
#include "wire/connection.hpp"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/use_awaitable.hpp>

#include <fmt/chrono.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <random>

namespace pscoro::detail {

using asio::experimental::as_tuple;
using asio::use_awaitable;

coordinator_core::coordinator_core(asio::any_io_executor executor, const simple_cluster_resolver& resolver,
                                   strategy_options options)
    : executor_(std::move(executor)), cluster_(resolver.cluster_spec()), strategy_options_(options) {
  strategy_options_.transport = runtime::with_environment(strategy_options_.transport);
  const std::string task_type = resolver.task_type().empty() ? "chief" : resolver.task_type();
  if (task_type == "ps" || task_type == "worker") {
    throw error(errc::invalid_argument,
                fmt::format("the coordinator runs as the 'chief' task, not '{}' (TF: coordinator name should not be "
                            "'worker' or 'ps')",
                            task_type));
  }
  // A second coordinator would end the chief's session on every server (they refuse it anyway).
  if (task_type != "chief" && task_type != "master") {
    throw error(errc::invalid_argument,
                fmt::format("the coordinator runs as the 'chief' task, not '{}': an evaluator is a side job that "
                            "evaluates the chief's checkpoints (a sidecar evaluator), never a second coordinator",
                            task_type));
  }
  validate_parameter_server_cluster(cluster_, resolver.task_type(), resolver.task_id());
  for (const auto& job : {"ps", "worker"}) {
    const auto indices = cluster_.task_indices(job);
    for (std::size_t i = 0; i < indices.size(); ++i) {
      if (indices[i] != static_cast<int>(i)) {
        throw error(errc::invalid_argument,
                    fmt::format("job '{}' must list tasks 0..{} for training; task {} is missing", job,
                                indices.size() - 1, i));
      }
    }
  }
  task_ = task_name(task_type, resolver.task_id().value_or(0));
  if (cluster_.has_job(task_type)) {
    const auto indices = cluster_.task_indices(task_type);
    const int index = resolver.task_id().value_or(0);
    if (std::find(indices.begin(), indices.end(), index) != indices.end()) {
      spec_address_ = cluster_.task_address(task_type, index);
    }
  }

  std::random_device device;
  hello_.set_protocol_version(wire::protocol_version);
  hello_.set_job("chief");
  hello_.set_task_index(resolver.task_id().value_or(0));
  // This coordinator's incarnation is its session on every server: a restarted chief starts a new
  // one, which makes the servers drop the old session's variables and iterators.
  const std::uint64_t incarnation = (std::uint64_t{device()} << 32) ^ device();
  hello_.set_incarnation(incarnation == 0 ? 1 : incarnation);
  hello_.set_session(hello_.incarnation());
  for (const auto& job : {"ps", "worker"}) {
    auto* entry = hello_.add_cluster();
    entry->set_name(job);
    for (const int index : cluster_.task_indices(job)) (*entry->mutable_tasks())[index] = cluster_.task_address(job, index);
  }
  for (const int index : cluster_.task_indices("ps")) {
    ps_peers_.push_back(std::make_shared<runtime::peer>(executor_, task_name("ps", index),
                                                        cluster_.task_address("ps", index), hello_,
                                                        strategy_options_.transport));
  }
  ps_ = std::make_shared<runtime::ps_client>(ps_peers_);
  for (const int index : cluster_.task_indices("worker")) {
    workers_.emplace_back().peer = std::make_shared<runtime::peer>(
        executor_, task_name("worker", index), cluster_.task_address("worker", index), hello_,
        strategy_options_.transport);
  }
}

asio::awaitable<void> coordinator_core::connect() {
  // Losses are noticed as they happen (connection closed, heartbeat timeout), not only when a call
  // fails. The handlers hold the core weakly: they may run while it is being destroyed.
  for (std::size_t i = 0; i < ps_peers_.size(); ++i) {
    ps_peers_[i]->on_lost([weak = weak_from_this(), i](const std::string& reason) {
      if (auto self = weak.lock()) self->lost_ps(i, reason);
    });
  }
  for (std::size_t i = 0; i < workers_.size(); ++i) {
    workers_[i].peer->on_lost([weak = weak_from_this(), i](const std::string& reason) {
      if (auto self = weak.lock()) self->lost_worker(i, reason);
    });
  }
  // Listen first: a worker that comes back at another address while we connect is heard.
  // Not being able to is no reason to fail the run: only moved workers go unheard.
  if (!spec_address_.empty() && !acceptor_) {
    acceptor_.emplace(executor_);
    try {
      runtime::listen_on(*acceptor_, runtime::listen_address_for(spec_address_, task_), task_,
                         strategy_options_.transport);
      asio::co_spawn(executor_, hear_announcements(weak_from_this()), asio::detached);
    } catch (const std::exception& e) {
      log::warning("cannot listen for workers announcing a new address at {}: {}; a worker that moves will not be "
                   "found",
                   spec_address_, e.what());
      std::error_code ignored;
      acceptor_->close(ignored);
    }
  }
  for (const auto& ps : ps_peers_) co_await ps->get();
  for (const auto& worker : workers_) co_await worker.peer->get();
  log::info("connected to {} ps and {} workers", ps_peers_.size(), workers_.size());
  if (!watch_timer_) {
    watch_timer_.emplace(executor_);
    asio::co_spawn(executor_, watch_workers(weak_from_this()), asio::detached);
  }
}

void coordinator_core::close() {
  closed_ = true;
  if (watch_timer_) watch_timer_->cancel();
  if (acceptor_) {
    std::error_code ignored;
    acceptor_->close(ignored);
  }
  // Nothing queued will run any more: say so, rather than leave remote_values waiting forever.
  const auto closed = std::make_exception_ptr(error(errc::cancelled, "the coordinator closed"));
  auto queued = std::move(queue_);
  queue_.clear();
  for (const auto& c : queued) c->result->set_error(closed, remote_status::cancelled);
  auto waiting = std::move(waiting_);
  waiting_.clear();
  for (auto& producer : waiting) producer.admitted(closed, nullptr);
  for (const auto& ps : ps_peers_) ps->close("the coordinator closed");
  for (const auto& worker : workers_) worker.peer->close("the coordinator closed");
}

namespace {

// FNV-1a: a stable hash of the variable's name, mixed into initializer seeds so that two variables
// created with the same seed still differ.
std::uint64_t name_hash(std::string_view name) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (const char c : name) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ULL;
  return h;
}

wire::Initializer encode_initializer(const initializer& init, const std::string& name, const shape_type& shape,
                                     std::size_t row_offset) {
  wire::Initializer out;
  std::uint64_t seed = 0;
  struct visitor {
    wire::Initializer& out;
    std::uint64_t& seed;
    void operator()(const initializers::zeros&) const { out.set_kind(wire::Initializer::ZEROS); }
    void operator()(const initializers::ones&) const { out.set_kind(wire::Initializer::ONES); }
    void operator()(const initializers::constant& c) const {
      out.set_kind(wire::Initializer::CONSTANT);
      out.set_a(c.value);
    }
    void operator()(const initializers::random_uniform& r) const {
      out.set_kind(wire::Initializer::RANDOM_UNIFORM);
      out.set_a(r.minval);
      out.set_b(r.maxval);
      seed = r.seed;
    }
    void operator()(const initializers::random_normal& r) const {
      out.set_kind(wire::Initializer::RANDOM_NORMAL);
      out.set_a(r.mean);
      out.set_b(r.stddev);
      seed = r.seed;
    }
    void operator()(const initializers::truncated_normal& r) const {
      out.set_kind(wire::Initializer::TRUNCATED_NORMAL);
      out.set_a(r.mean);
      out.set_b(r.stddev);
      seed = r.seed;
    }
    void operator()(const initializers::glorot_uniform& r) const {
      out.set_kind(wire::Initializer::GLOROT_UNIFORM);
      seed = r.seed;
    }
  };
  std::visit(visitor{out, seed}, init);
  out.set_seed(seed ^ name_hash(name));
  for (const auto d : shape) out.add_full_shape(d);
  out.set_row_offset(row_offset);
  return out;
}

}  // namespace

asio::awaitable<sharded_variable_ref> coordinator_core::create_variable(
    std::string name, dtype type, shape_type shape, parameter_server_strategy::variable_source source,
    bool partition) {
  if (name.empty()) throw error(errc::invalid_argument, "a variable needs a name");
  std::size_t shards = 1;
  if (partition && partitioner_ && !shape.empty()) {
    const std::size_t asked = partitioner_(shape, type);
    if (asked == 0) {
      throw error(errc::invalid_argument,
                  fmt::format("variable_partitioner must return a non-zero number of shards, got 0 for '{}' {} {}",
                              name, name_of(type), to_string(shape)));
    }
    shards = std::max<std::size_t>(1, std::min(asked, shape[0]));  // TF clamps to the row count
  }
  const auto offsets = div_offsets(shape.empty() ? 1 : shape[0], shards);
  sharded_variable_ref ref{name, type, shape, {}};
  for (std::size_t i = 0; i < shards; ++i) {
    shape_type part = shape;
    if (!part.empty()) part[0] = offsets[i + 1] - offsets[i];
    ref.shards.push_back(variable_ref{shards == 1 ? name : fmt::format("{}/part_{}", name, i), type, std::move(part),
                                      static_cast<int>(next_placement_++ % ps_peers_.size())});
  }
  const auto layout = make_layout(ref);
  if (auto* value = std::get_if<tensor>(&source)) {
    const auto parts = split_dense(*layout, *value, "create_variable");
    co_await run_all(shards, [&](std::size_t i) { return ps_->create(ref.shards[i], parts[i]); });
  } else {
    const auto& init = std::get<initializer>(source);
    co_await run_all(shards, [&](std::size_t i) {
      return ps_->create(ref.shards[i], encode_initializer(init, name, shape, offsets[i]));
    });
  }
  co_return ref;
}

wire::frame coordinator_core::iterator_request(const per_worker_ref& ref, std::size_t worker) const {
  wire::frame request;
  auto* create = request.message.mutable_request()->mutable_create_iterator();
  create->set_function(ref.function);
  create->set_id(ref.id);
  create->set_worker_index(static_cast<std::int64_t>(worker));
  create->set_num_workers(static_cast<std::int64_t>(workers_.size()));
  return request;
}

asio::awaitable<per_worker_ref> coordinator_core::create_iterators(std::string function) {
  per_worker_ref ref{next_iterator_id_++, std::move(function)};
  // Lost workers build theirs when they come back (recover), before they take a closure.
  std::vector<std::size_t> alive;
  for (std::size_t i = 0; i < workers_.size(); ++i) {
    if (workers_[i].alive) alive.push_back(i);
  }
  co_await run_all(alive.size(), [&](std::size_t k) { return create_on(workers_[alive[k]].peer, iterator_request(ref, alive[k])); });
  iterators_.push_back(ref);
  co_return ref;
}

asio::awaitable<void> coordinator_core::create_on(std::shared_ptr<runtime::peer> worker, wire::frame request) {
  co_await worker->call(std::move(request));
}

std::shared_ptr<coordinator_core::closure> coordinator_core::make_closure(std::string name, std::string signature,
                                                                          std::vector<value> args) {
  auto result = std::make_shared<remote_state>(executor_, decode_context{ps_});
  return std::make_shared<closure>(closure{std::move(name), std::move(signature), std::move(args), result, generation_});
}

std::shared_ptr<remote_state> coordinator_core::schedule(std::string name, std::string signature,
                                                         std::vector<value> args) {
  if (auto e = take_error()) std::rethrow_exception(e);
  if (ps_failure_) std::rethrow_exception(ps_failure_);
  if (!has_room() || !waiting_.empty()) {
    throw error(errc::resource_exhausted,
                fmt::format("the closure queue holds {} closures (coordinator_options::max_queued_closures); on the "
                            "coordinator's executor, co_await wait_and_schedule() to wait for room",
                            queue_.size()));
  }
  auto c = make_closure(std::move(name), std::move(signature), std::move(args));
  queue_.push_back(c);
  dispatch();
  return c->result;
}

void coordinator_core::schedule_when_room(std::string name, std::string signature, std::vector<value> args,
                                          admission_handler admitted) {
  waiting_.push_back({make_closure(std::move(name), std::move(signature), std::move(args)), std::move(admitted)});
  dispatch();
}

bool coordinator_core::admit_waiting() {
  bool admitted = false;
  while (!waiting_.empty()) {
    auto producer = std::move(waiting_.front());
    if (pending_error_ || ps_failure_) {
      // No closure starts while an error waits, so the queue would not drain: the waiting
      // producer is the next schedule call, and reports the error (TF: put() raises it).
      waiting_.pop_front();
      auto failure = take_error();
      producer.admitted(failure ? failure : ps_failure_, nullptr);
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
    admitted = true;
  }
  return admitted;
}

void coordinator_core::dispatch() {
  do {
    start_closures();
  } while (admit_waiting());
  check_recovery_timeout();
  notify_joiners();
}

void coordinator_core::check_recovery_timeout() {
  if (std::any_of(workers_.begin(), workers_.end(), [](const auto& w) { return w.alive; })) {
    all_lost_since_.reset();
    return;
  }
  const auto now = std::chrono::steady_clock::now();
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

asio::awaitable<void> coordinator_core::watch_workers(std::weak_ptr<coordinator_core> weak) {
  for (;;) {
    asio::steady_timer* timer = nullptr;
    {
      auto self = weak.lock();
      if (!self || self->closed_) co_return;
      timer = &*self->watch_timer_;
      timer->expires_after(self->options_.worker_probe_interval);
    }
    // Waits holding nothing: close() or a destroyed coordinator cancels the timer, ending the loop.
    const auto [woke] = co_await timer->async_wait(as_tuple(use_awaitable));
    auto self = weak.lock();
    if (!self || self->closed_ || woke == asio::error::operation_aborted) co_return;
    for (std::size_t i = 0; i < self->workers_.size(); ++i) {
      auto& slot = self->workers_[i];
      if (slot.alive || slot.probing) continue;
      slot.probing = true;
      asio::co_spawn(self->executor_, recover(self, i), asio::detached);
    }
    self->check_recovery_timeout();
    self->check_watchdog();
    self->notify_joiners();
  }
}

namespace {

// The number in environment variable `name`, if it is set to one (a warning names it otherwise).
std::optional<double> number_from_environment(const char* name) {
  const char* text = std::getenv(name);
  if (!text || !*text) return std::nullopt;
  char* end = nullptr;
  const double value = std::strtod(text, &end);
  if (*end != '\0' || !std::isfinite(value)) {
    log::warning("{}='{}' is not a number; ignored", name, text);
    return std::nullopt;
  }
  return value;
}

}  // namespace

void coordinator_core::set_options(const coordinator_options& options) {
  options_ = options;
  if (const auto seconds = number_from_environment("TF_CLUSTER_COORDINATOR_WATCH_DOG_TIMEOUT")) {
    options_.watchdog_timeout = std::chrono::milliseconds(*seconds > 0 ? static_cast<std::int64_t>(*seconds * 1000) : 0);
  }
  if (const auto count = number_from_environment("TF_COORDINATOR_IGNORE_TRANSIENT_PS_FAILURES")) {
    options_.transient_ps_failures = static_cast<int>(std::clamp(*count, -1.0, 1e6));
  }
}

void coordinator_core::check_watchdog() {
  const auto now = std::chrono::steady_clock::now();
  if (options_.watchdog_timeout <= std::chrono::milliseconds(0) || (in_flight_ == 0 && queue_.empty())) {
    last_progress_ = now;  // idle time is not a stall
    return;
  }
  if (now - last_progress_ < options_.watchdog_timeout) return;
  last_progress_ = now;  // once per timeout, as TF's watchdog
  using seconds = std::chrono::duration<double>;
  log::warning("watchdog: no closure finished for {} (coordinator_options::watchdog_timeout): {} queued, {} running",
               options_.watchdog_timeout, queue_.size(), in_flight_);
  for (const auto& slot : workers_) {
    std::vector<std::string> running;
    for (const auto& c : slot.running) {
      running.push_back(fmt::format("'{}' for {:.1f}s", c->function, seconds(now - c->started).count()));
    }
    log::warning("watchdog: {} ({}): {}", slot.peer->task(), slot.alive ? "alive" : "lost",
                 running.empty() ? std::string("nothing running") : runtime::join(running, ", "));
  }
}

std::string coordinator_core::address() const {
  if (!acceptor_ || !acceptor_->is_open()) return {};
  const auto endpoint = acceptor_->local_endpoint();
  return fmt::format("{}:{}", endpoint.address().to_string(), endpoint.port());
}

asio::awaitable<void> coordinator_core::hear_announcements(std::weak_ptr<coordinator_core> weak) {
  runtime::accept_backoff backoff;
  for (;;) {
    asio::ip::tcp::acceptor* acceptor = nullptr;
    {
      auto self = weak.lock();
      if (!self || self->closed_) co_return;
      acceptor = &*self->acceptor_;
    }
    // Waits holding nothing: close() or a destroyed coordinator closes the acceptor.
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

asio::awaitable<void> coordinator_core::hear_announcement(std::weak_ptr<coordinator_core> weak,
                                                          asio::ip::tcp::socket socket) {
  std::string task;
  transport_options transport;
  runtime::task_identity identity;
  std::error_code ignored;
  const auto remote = socket.remote_endpoint(ignored);
  auto connection = std::make_shared<wire::connection>(std::move(socket), runtime::limits_of(transport),
                                                       fmt::format("{}:{}", remote.address().to_string(), remote.port()));
  {
    auto self = weak.lock();
    if (!self) co_return;
    task = self->task_;
    transport = self->strategy_options_.transport;
    identity = {"chief", self->hello_.task_index(), self->hello_.incarnation()};
    if (self->announcements_in_handshake_ >= transport.max_connections) {
      runtime::refuse_early(connection, transport, make_error_code(errc::resource_exhausted),
                            fmt::format("{} is in {} handshakes, its limit (transport_options::max_connections)",
                                        task, self->announcements_in_handshake_),
                            task);
      co_return;
    }
    ++self->announcements_in_handshake_;
  }
  std::optional<wire::Hello> hello;
  std::exception_ptr failure;
  try {
    hello = co_await runtime::receive_hello(connection, transport, identity);
  } catch (...) {
    failure = std::current_exception();
  }
  auto self = weak.lock();
  if (self) --self->announcements_in_handshake_;
  if (failure) std::rethrow_exception(failure);
  if (!hello || !self || self->closed_) co_return;
  const auto count = self->workers_.size();
  std::string refusal;
  if (hello->job() != "worker" || hello->address().empty()) {
    refusal = fmt::format("{} hears only workers announcing their address (got a Hello of '{}'{})", task,
                          hello->job(), hello->address().empty() ? " without an address" : "");
  } else if (hello->task_index() < 0 || static_cast<std::size_t>(hello->task_index()) >= count) {
    refusal = fmt::format("worker index {} is out of range: the cluster has workers 0..{}", hello->task_index(),
                          count - 1);
  } else {
    try {
      (void)runtime::split_address(hello->address(), task_name("worker", hello->task_index()));
    } catch (const error& e) {
      refusal = e.what();
    }
  }
  if (!refusal.empty()) {
    runtime::refuse(connection, make_error_code(errc::invalid_argument), refusal, task);
    co_return;
  }
  runtime::welcome(connection, identity);
  connection->close_after_flush("announcement heard");
  self->announced(static_cast<std::size_t>(hello->task_index()), hello->address());
}

void coordinator_core::announced(std::size_t index, const std::string& address) {
  auto& slot = workers_[index];
  if (address != slot.peer->address()) {
    log::info("{} announced itself at {} (was {})", slot.peer->task(), address, slot.peer->address());
    slot.peer->set_address(address);
    if (slot.alive) {
      // What it ran at the old address is lost with the old process: run() puts it back.
      log::warning("lost {}: it moved; its closures go back to the queue", slot.peer->task());
      slot.alive = false;
      slot.peer->close(fmt::format("{} moved to {}", slot.peer->task(), address));
    }
  }
  if (!slot.alive && !slot.probing) {
    slot.probing = true;
    asio::co_spawn(executor_, recover(shared_from_this(), index), asio::detached);
  }
}

asio::awaitable<void> coordinator_core::recover(std::shared_ptr<coordinator_core> self, std::size_t index) {
  auto& slot = self->workers_[index];  // workers_ never changes size
  try {
    if (co_await slot.peer->connect_once() && !self->closed_) {
      // Its per-worker resources first: no closure may reach it before its iterators exist.
      for (std::size_t k = 0; k < self->iterators_.size(); ++k) {
        auto request = self->iterator_request(self->iterators_[k], index);  // named: g++ 12 (temporaries)
        co_await create_on(slot.peer, std::move(request));
      }
      if (!self->closed_ && slot.peer->connection()) {
        log::info("{} is back; {} iterator(s) rebuilt before it takes closures", slot.peer->task(),
                  self->iterators_.size());
        slot.alive = true;
        self->dispatch();
      }
    }
  } catch (const std::exception& e) {
    log::warning("{} answered but cannot take closures yet: {}", slot.peer->task(), e.what());
    slot.peer->close("recovery failed");
  }
  slot.probing = false;
}

void coordinator_core::start_closures() {
  // While an error waits to be reported, nothing new starts: what is queued will be cancelled.
  while (!queue_.empty() && !pending_error_ && !ps_failure_) {
    // The least busy live worker with a free slot, scanning from a rotating start for fairness.
    std::size_t best = workers_.size();
    for (std::size_t k = 0; k < workers_.size(); ++k) {
      const std::size_t i = (next_worker_ + k) % workers_.size();
      const auto& w = workers_[i];
      if (!w.alive || w.in_flight >= options_.closures_per_worker) continue;
      if (best == workers_.size() || w.in_flight < workers_[best].in_flight) best = i;
    }
    if (best == workers_.size()) break;
    next_worker_ = (best + 1) % workers_.size();
    auto c = std::move(queue_.front());
    queue_.pop_front();
    c->started = std::chrono::steady_clock::now();
    workers_[best].running.push_back(c);
    ++workers_[best].in_flight;
    ++in_flight_;
    asio::co_spawn(executor_, run(shared_from_this(), best, std::move(c)), asio::detached);
  }
}

asio::awaitable<void> coordinator_core::run(std::shared_ptr<coordinator_core> self, std::size_t index,
                                            std::shared_ptr<closure> c) {
  auto& slot = self->workers_[index];
  wire::frame request;
  auto* call = request.message.mutable_request()->mutable_run_function();
  call->set_name(c->function);
  call->set_signature(c->signature);
  for (const auto& arg : c->args) runtime::encode_value(request, *call->add_args(), arg);

  std::string lost;
  wire::frame response;
  if (auto connection = slot.peer->connection()) {
    auto [ec, reply] = co_await connection->async_call(std::move(request), as_tuple(use_awaitable));
    if (ec) lost = connection->close_reason();
    response = std::move(reply);
  } else {
    lost = "not connected";
  }
  if (c->abandoned) co_return;  // resolved already, and no longer counted
  std::erase(slot.running, c);
  --slot.in_flight;
  --self->in_flight_;
  if (!lost.empty() && self->closed_) {
    c->result->set_error(std::make_exception_ptr(error(errc::cancelled, "the coordinator closed")),
                         remote_status::cancelled);
  } else if (!lost.empty()) {
    if (slot.alive) log::warning("lost {}: {}; its closures go back to the queue", slot.peer->task(), lost);
    slot.alive = false;
    if (self->pending_error_) {
      self->cancel(*c);  // it would be cancelled with the queue anyway (TF's put_back)
    } else {
      self->queue_.push_back(std::move(c));  // at least once: it runs again elsewhere (TF: at the tail)
    }
  } else {
    self->last_progress_ = std::chrono::steady_clock::now();
    self->finish(c, response, slot.peer->task());
  }
  self->dispatch();
}

void coordinator_core::finish(const std::shared_ptr<closure>& c, const wire::frame& response, const std::string& worker) {
  const auto& reply = response.message.response();
  try {
    wire::throw_if_error(reply.status(), worker);
    c->result->set_value(runtime::decode_value(response, reply.result()));
  } catch (const remote_error& e) {
    if (transient_ps_failure(e, *c, worker)) {
      queue_.push_back(c);  // at least once, as for a lost worker
      return;
    }
    auto failure = std::current_exception();
    c->result->set_error(failure);
    record_error(failure, c->generation);
  } catch (const std::exception&) {
    auto e = std::current_exception();
    c->result->set_error(e);
    record_error(e, c->generation);
  }
}

bool coordinator_core::transient_ps_failure(const remote_error& failure, const closure& c, const std::string& worker) {
  if (failure.code() != errc::unavailable || !failure.origin_task().starts_with("ps:") || ps_failure_ ||
      pending_error_) {
    return false;
  }
  std::size_t index = ps_peers_.size();
  for (std::size_t i = 0; i < ps_peers_.size(); ++i) {
    if (ps_peers_[i]->task() == failure.origin_task()) index = i;
  }
  if (index == ps_peers_.size()) return false;
  transient_ps_failures_.resize(ps_peers_.size());
  const int count = ++transient_ps_failures_[index];
  if (count >= options_.transient_ps_failures) return false;
  log::warning("'{}' on {} could not reach {}: {}. It is treated as a transient connectivity failure for now ({} of "
               "{} tolerated for {}); it runs again.",
               c.function, worker, failure.origin_task(), failure.remote_message(), count,
               options_.transient_ps_failures - 1, failure.origin_task());
  return true;
}

void coordinator_core::lost_ps(std::size_t index, const std::string& reason) {
  if (closed_ || ps_failure_) return;
  const auto& task = ps_peers_[index]->task();
  log::error("lost {}: {}; its variables are gone (restart the cluster and restore a checkpoint)", task, reason);
  ps_failure_ = std::make_exception_ptr(remote_error(
      make_error_code(errc::unavailable), task, fmt::format("parameter server {} is unavailable: {}", task, reason)));
  ps_peers_[index]->fail_with(ps_failure_);
  record_error(ps_failure_, generation_);
  // What runs now cannot finish well, and its worker may wait long for the lost ps (reconnecting
  // for connect_timeout): resolve it now, so that nothing waits on it, and ignore its reply.
  for (auto& slot : workers_) {
    for (const auto& c : slot.running) {
      c->abandoned = true;
      c->result->set_error(ps_failure_);
      --in_flight_;
    }
    slot.running.clear();
    slot.in_flight = 0;
  }
  dispatch();
}

void coordinator_core::lost_worker(std::size_t index, const std::string& reason) {
  if (closed_) return;
  auto& slot = workers_[index];
  if (slot.alive) log::warning("lost {}: {}; its closures go back to the queue", slot.peer->task(), reason);
  slot.alive = false;
  dispatch();
}

void coordinator_core::record_error(std::exception_ptr e, std::uint64_t generation) {
  if (generation != generation_ || pending_error_) return;  // first error only; older ones were reported
  pending_error_ = std::move(e);
  // Nothing queued starts while the error waits, and TF throws the queue away when the error is
  // raised. Do it now: a caller awaiting one of those remote_values before its join() (the natural
  // loop over results) learns it was cancelled instead of waiting forever.
  auto queued = std::move(queue_);
  queue_.clear();
  for (const auto& c : queued) cancel(*c);
}

void coordinator_core::cancel(const closure& c) {
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

std::exception_ptr coordinator_core::take_error() {
  if (!pending_error_) return nullptr;
  ++generation_;
  if (!waiting_.empty()) asio::post(executor_, [self = shared_from_this()] { self->dispatch(); });
  return std::exchange(pending_error_, nullptr);
}

void coordinator_core::join(erased_handler<void(std::exception_ptr)> handler) {
  joiners_.push_back(std::move(handler));
  notify_joiners();
}

void coordinator_core::notify_joiners() {
  // TF: join returns (or raises) only when no closure is running.
  if (joiners_.empty() || in_flight_ > 0 || (!queue_.empty() && !pending_error_)) return;
  auto error = take_error();
  auto joiners = std::move(joiners_);
  joiners_.clear();
  for (auto& joiner : joiners) joiner(error);
}

bool coordinator_core::done() {
  if (auto e = take_error()) std::rethrow_exception(e);
  return queue_.empty() && in_flight_ == 0;
}

}  // namespace pscoro::detail

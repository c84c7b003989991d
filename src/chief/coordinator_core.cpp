#include "chief/coordinator_core.hpp"

#include "metrics/library.hpp"

#include "common/environment.hpp"
#include "common/log.hpp"
#include "net/security.hpp"
#include "wire/connection.hpp"
#include "wire/values.hpp"

#include <pscoro/detail/parallel.hpp>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/post.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/use_awaitable.hpp>

#include <fmt/chrono.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <optional>

namespace pscoro::detail {

using asio::experimental::as_tuple;
using asio::use_awaitable;

std::shared_ptr<coordinator_core> coordinator_core::make(asio::any_io_executor executor,
                                                         const simple_cluster_resolver& resolver,
                                                         strategy_options options) {
  // The cluster first, as TF: "There must be at least one worker." says more than who runs where.
  const auto& cluster = resolver.cluster_spec();
  validate_parameter_server_cluster(cluster, resolver.task_type(), resolver.task_id());
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
  for (const auto& job : {"ps", "worker"}) {
    const auto indices = cluster.task_indices(job);
    for (std::size_t i = 0; i < indices.size(); ++i) {
      if (indices[i] != static_cast<int>(i)) {
        throw error(errc::invalid_argument,
                    fmt::format("job '{}' must list tasks 0..{} for training; task {} is missing", job,
                                indices.size() - 1, i));
      }
    }
  }
  const int index = resolver.task_id().value_or(0);
  std::string spec_address;
  if (cluster.has_job(task_type)) {
    const auto indices = cluster.task_indices(task_type);
    if (std::find(indices.begin(), indices.end(), index) != indices.end()) {
      spec_address = cluster.task_address(task_type, index);
    }
  }
  // The chief's lines name it too ("chief:0"), unless this process already has a role.
  log::set_task_if_unset(fmt::format("{}:{}", task_type, index));
  net::task_identity self{"chief", index, net::new_incarnation()};
  options.transport = net::with_environment(options.transport);
  options.keep_servers =
      common::flag_from_environment("PSCORO_KEEP_SERVERS", "the servers keep serving when the chief closes")
          .value_or(options.keep_servers);
  const auto metrics_port = metrics::metrics_port(options.metrics_port);
  const std::string chief_address = spec_address;
  auto core = std::shared_ptr<coordinator_core>(
      new coordinator_core(std::move(executor), cluster, std::move(options), std::move(self), std::move(spec_address)));
  core->wire_events();
  if (metrics_port) {
    // Where the chief's address says (a loopback host kept, any other: every interface), or on
    // loopback when the cluster spec gives the chief no address.
    const auto task = fmt::format("{}:{}", task_type, index);
    std::string listen_host = "127.0.0.1", shown_host = "127.0.0.1";
    if (!chief_address.empty()) {
      listen_host = common::split_address(net::listen_address_for(chief_address, task), task).first;
      shown_host = common::split_address(chief_address, task).first;
    }
    metrics::serve_process_metrics(task, listen_host, shown_host, *metrics_port);
  }
  return core;
}

coordinator_core::coordinator_core(asio::any_io_executor executor, cluster_spec cluster, strategy_options options,
                                   net::task_identity self, std::string spec_address)
    : executor_(std::move(executor)),
      cluster_(std::move(cluster)),
      strategy_options_(std::move(options)),
      connections_(std::make_shared<chief::cluster_connections>(executor_, cluster_, std::move(self),
                                                                  std::move(spec_address), strategy_options_.transport)),
      ps_(std::make_shared<client::ps_client>(connections_->ps())),
      placement_(ps_) {
  auto& r = metrics::process_registry();
  registered_.push_back(r.add("pscoro_coordinator_closure_execution_seconds",
                              "Time from handing a closure to its worker to its outcome (TF: closure_execution).",
                              {}, closure_execution_));
  registered_.push_back(r.add("pscoro_coordinator_remote_value_fetch_seconds",
                              "Time to take a closure's result from its response (TF: remote_value_fetch).", {},
                              remote_value_fetch_));
  registered_.push_back(r.add("pscoro_coordinator_worker_failures_total",
                              "Workers lost: connection closed or heartbeat timed out (TF: worker_failures).", {},
                              worker_failures_));
  registered_.push_back(r.add("pscoro_coordinator_ps_failures_total",
                              "Parameter servers lost, and closures that could not reach one.", {}, ps_failures_));
  registered_.push_back(r.add("pscoro_coordinator_iterator_rebuilds_total",
                              "Per-worker iterators rebuilt on workers that came back.", {}, iterator_rebuilds_));
}

metrics::coordinator_metrics coordinator_core::metrics() const {
  metrics::coordinator_metrics m;
  m.queued_closures = queue_->queued_gauge().value();
  m.inflight_closures = queue_->inflight_gauge().value();
  const auto execution = closure_execution_.read();
  m.closure_execution = {execution.count, execution.sum};
  const auto fetch = remote_value_fetch_.read();
  m.remote_value_fetch = {fetch.count, fetch.sum};
  m.worker_failures = worker_failures_.value();
  m.ps_failures = ps_failures_.value();
  m.iterator_rebuilds = iterator_rebuilds_.value();
  return m;
}

void coordinator_core::wire_events() {
  std::vector<std::string> workers;
  for (std::size_t i = 0; i < connections_->num_workers(); ++i) workers.push_back(connections_->worker(i)->task());
  // The parts hold the core weakly: their events may come while it is being destroyed.
  const std::weak_ptr<coordinator_core> weak = weak_from_this();
  queue_ = std::make_shared<chief::closure_queue>(
      executor_, std::move(workers),
      [weak](std::size_t worker, const auto& c) {
        if (auto self = weak.lock()) asio::co_spawn(self->executor_, run(self, worker, c), asio::detached);
      },
      [weak](std::size_t worker, std::uint64_t generation) {
        auto self = weak.lock();
        if (!self) return;
        asio::co_spawn(self->executor_, cancel_on(self->connections_->worker(worker), generation), asio::detached);
      });
  auto& r = metrics::process_registry();
  registered_.push_back(r.add("pscoro_coordinator_queued_closures", "Closures waiting in the queue (TF: queued_closures).",
                              {}, queue_->queued_gauge()));
  registered_.push_back(r.add("pscoro_coordinator_inflight_closures",
                              "Closures sent to a worker without an outcome yet (TF: inflight_closures).", {},
                              queue_->inflight_gauge()));
  chief::cluster_connections::events events;
  events.ps_lost = [weak](std::size_t ps, const std::string& reason) {
    if (auto self = weak.lock()) self->lost_ps(ps, reason);
  };
  events.worker_lost = [weak](std::size_t worker) {
    if (auto self = weak.lock()) {
      self->worker_failures_.inc();
      self->queue_->worker_lost(worker);
    }
  };
  events.prepare_worker = [weak](std::size_t worker) { return prepare_worker(weak.lock(), worker); };
  events.worker_back = [weak](std::size_t worker) {
    auto self = weak.lock();
    if (!self) return;
    std::size_t counts[3] = {0, 0, 0};  // iterators, variables, resources
    for (const auto& entry : self->per_worker_) ++counts[static_cast<std::size_t>(entry.what)];
    self->iterator_rebuilds_.inc(counts[0]);
    // "is back; N iterator(s) rebuilt before it takes closures" is what the process tests look for.
    log::info("{} is back; {} iterator(s) rebuilt before it takes closures (and {} per-worker variable(s), {} "
              "resource(s))",
              self->connections_->worker(worker)->task(), counts[0], counts[1], counts[2]);
    self->queue_->worker_up(worker);
  };
  events.tick = [weak] {
    if (auto self = weak.lock()) self->queue_->tick();
  };
  connections_->set_events(std::move(events));
}

void coordinator_core::close(std::optional<int> job_exit_code) {
  queue_->close();
  connections_->close(strategy_options_.keep_servers ? std::nullopt : job_exit_code);
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
  auto taken = options;
  if (const auto seconds = number_from_environment("TF_CLUSTER_COORDINATOR_WATCH_DOG_TIMEOUT")) {
    taken.watchdog_timeout = std::chrono::milliseconds(*seconds > 0 ? static_cast<std::int64_t>(*seconds * 1000) : 0);
  }
  if (const auto count = number_from_environment("TF_COORDINATOR_IGNORE_TRANSIENT_PS_FAILURES")) {
    taken.transient_ps_failures = static_cast<int>(std::clamp(*count, -1.0, 1e6));
  }
  queue_->set_options(taken);
  connections_->set_probe_interval(taken.worker_probe_interval);
}

namespace {

std::string describe(const coordinator_options& o) {
  return fmt::format(
      "closures_per_worker {}, max_queued_closures {}, worker_recovery_timeout {}, worker_probe_interval {}, "
      "watchdog_timeout {}, transient_ps_failures {}",
      o.closures_per_worker, o.max_queued_closures, o.worker_recovery_timeout, o.worker_probe_interval,
      o.watchdog_timeout, o.transient_ps_failures);
}

}  // namespace

std::optional<coordinator_options> coordinator_core::claim_options(const std::optional<coordinator_options>& asked) {
  const std::lock_guard lock(options_mutex_);
  if (!shared_options_) {
    shared_options_ = asked.value_or(coordinator_options{});
    return shared_options_;
  }
  if (asked && *asked != *shared_options_) {
    throw error(errc::invalid_argument,
                fmt::format("this strategy already has a cluster_coordinator, and a second one shares its queue and "
                            "options ({}); it was given others ({}): make it without options, or with the same",
                            describe(*shared_options_), describe(*asked)));
  }
  return std::nullopt;
}

wire::frame coordinator_core::create_request(const per_worker_entry& entry, std::size_t worker) const {
  wire::frame request;
  auto& body = *request.message.mutable_request();
  switch (entry.what) {
    case per_worker_entry::kind::iterator: {
      auto* create = body.mutable_create_iterator();
      create->set_function(entry.ref.function);
      create->set_id(entry.ref.id);
      create->set_worker_index(static_cast<std::int64_t>(worker));
      create->set_num_workers(static_cast<std::int64_t>(connections_->num_workers()));
      break;
    }
    case per_worker_entry::kind::resource: {
      auto* create = body.mutable_create_resource();
      create->set_function(entry.ref.function);
      create->set_id(entry.ref.id);
      create->set_worker_index(static_cast<std::int64_t>(worker));
      create->set_num_workers(static_cast<std::int64_t>(connections_->num_workers()));
      break;
    }
    case per_worker_entry::kind::variable: {
      auto* create = body.mutable_create_per_worker_variable();
      create->set_id(entry.ref.id);
      wire::encode_ref(*create->mutable_variable(), entry.variable);
      // The chief's copy of the initial value goes out shared, not copied, to every worker.
      wire::put_tensor(request, *create->mutable_initial_value(), entry.initial_value);
      break;
    }
  }
  return request;
}

asio::awaitable<per_worker_ref> coordinator_core::create_iterators(std::string function) {
  per_worker_entry entry;
  entry.what = per_worker_entry::kind::iterator;
  entry.ref.function = std::move(function);
  co_return co_await create_per_worker(std::move(entry));
}

asio::awaitable<per_worker_ref> coordinator_core::create_resources(std::string function) {
  per_worker_entry entry;
  entry.what = per_worker_entry::kind::resource;
  entry.ref.function = std::move(function);
  co_return co_await create_per_worker(std::move(entry));
}

asio::awaitable<per_worker_ref> coordinator_core::create_per_worker_variables(variable_ref variable,
                                                                               tensor initial_value) {
  if (initial_value.type() != variable.type || initial_value.shape() != variable.shape) {
    throw error(errc::invalid_argument,
                fmt::format("per-worker variable '{}' is {} {} but its initial value is {} {}", variable.name,
                            name_of(variable.type), to_string(variable.shape), name_of(initial_value.type()),
                            to_string(initial_value.shape())));
  }
  per_worker_entry entry;
  entry.what = per_worker_entry::kind::variable;
  entry.ref.function = variable.name;
  entry.variable = std::move(variable);
  entry.initial_value = std::move(initial_value);
  co_return co_await create_per_worker(std::move(entry));
}

asio::awaitable<per_worker_ref> coordinator_core::create_per_worker(per_worker_entry entry) {
  entry.ref.id = next_per_worker_id_++;
  // Listed first: a lost worker that comes back meanwhile builds it too (prepare_worker), before it
  // takes a closure.
  per_worker_.push_back(entry);
  per_worker_ref ref = entry.ref;
  std::vector<std::size_t> ready;
  for (std::size_t i = 0; i < connections_->num_workers(); ++i) {
    if (connections_->ready(i)) ready.push_back(i);
  }
  std::exception_ptr failure;
  try {
    const auto self = shared_from_this();
    co_await run_all(ready.size(), [&](std::size_t k) { return create_on(self, ready[k], entry); });
  } catch (...) {
    failure = std::current_exception();
  }
  if (failure) {
    release_per_worker(ref.id);  // the workers that built theirs drop them
    std::rethrow_exception(failure);
  }
  // The last copy of the lease, wherever it goes (any thread), has the chief release the values.
  // It only posts: locking the core here could make this thread its last owner.
  struct lease {
    lease(asio::any_io_executor on, std::weak_ptr<coordinator_core> of, std::uint64_t value)
        : executor(std::move(on)), core(std::move(of)), id(value) {}
    lease(const lease&) = delete;  // one release per value
    lease& operator=(const lease&) = delete;
    asio::any_io_executor executor;
    std::weak_ptr<coordinator_core> core;
    std::uint64_t id;
    ~lease() {
      asio::post(executor, [weak = core, value = id] {
        if (auto self = weak.lock()) self->release_per_worker(value);
      });
    }
  };
  ref.lease = std::make_shared<const lease>(executor_, weak_from_this(), ref.id);
  co_return ref;
}

asio::awaitable<void> coordinator_core::create_on(std::shared_ptr<coordinator_core> self, std::size_t worker,
                                                  const per_worker_entry& entry) {
  const auto peer = self->connections_->worker(worker);
  // On the open connection only, as a closure: a worker that is gone may not come back soon.
  const auto connection = peer->connection();
  std::string lost = "not connected";
  if (connection) {
    auto request = self->create_request(entry, worker);  // named: g++ 12 (temporaries)
    auto [ec, response] = co_await connection->async_call(std::move(request), as_tuple(use_awaitable));
    if (!ec) {
      // The worker's own refusal (an unbound or failing function) fails the creation.
      wire::throw_if_error(response.message.response().status(), peer->task());
      co_return;
    }
    lost = connection->close_reason();
  }
  if (self->connections_->closed()) {
    throw remote_error(make_error_code(errc::unavailable), peer->task(),
                       fmt::format("'{}' could not be made on {}: the chief closed its connections", entry.ref.function,
                                   peer->task()));
  }
  // A worker that came back meanwhile on a new connection was prepared there, with this value
  // (listed before any worker was asked).
  if (const auto current = peer->connection(); current && current != connection) co_return;
  // TF's contract: a lost worker costs only time. The value is listed already, so the worker
  // builds it in prepare_worker when it comes back, before it takes a closure.
  self->connections_->worker_failed(worker, lost);
}

void coordinator_core::release_per_worker(std::uint64_t id) {
  std::erase_if(per_worker_, [id](const per_worker_entry& e) { return e.ref.id == id; });
  if (connections_->closed()) return;
  for (std::size_t i = 0; i < connections_->num_workers(); ++i) {
    // Only an open connection: a lost worker has lost its values, and one that comes back is not
    // given this one again.
    const auto connection = connections_->worker(i)->connection();
    if (!connection) continue;
    wire::frame request;
    request.message.mutable_request()->mutable_release_iterator()->set_id(id);
    connection->async_call(std::move(request), [](std::error_code, wire::frame) {});
  }
}

asio::awaitable<std::vector<std::optional<tensor>>> coordinator_core::read_per_worker_variable(per_worker_ref ref,
                                                                                              variable_ref variable,
                                                                                              lost_workers lost) {
  const auto workers = connections_->num_workers();
  for (std::size_t i = 0; i < workers && lost == lost_workers::fail; ++i) {
    if (connections_->ready(i)) continue;
    // TF raises too (its per-worker variable's value on a lost worker is aborted). The chief does
    // not wait for the worker: it may never come back.
    const auto& task = connections_->worker(i)->task();
    throw remote_error(make_error_code(errc::unavailable), task,
                       fmt::format("per-worker variable '{}' cannot be read on {}: the chief has lost that worker (it "
                                   "gets the variable anew, from its initial value, when it comes back)",
                                   variable.name, task));
  }
  std::vector<std::optional<tensor>> values(workers);
  const auto self = shared_from_this();
  co_await run_all(workers, [&](std::size_t i) { return read_on(self, i, ref.id, variable, lost, values[i]); });
  co_return values;
}

asio::awaitable<void> coordinator_core::read_on(std::shared_ptr<coordinator_core> self, std::size_t worker,
                                                std::uint64_t id, variable_ref variable, lost_workers lost,
                                                std::optional<tensor>& out) {
  // A worker being prepared to come back does not hold the variable yet: it counts as lost.
  if (lost == lost_workers::skip && !self->connections_->ready(worker)) co_return;
  wire::frame request;
  auto* read = request.message.mutable_request()->mutable_read_per_worker_variable();
  read->set_id(id);
  wire::encode_ref(*read->mutable_variable(), variable);
  const auto peer = self->connections_->worker(worker);
  // On the open connection only, never a new one: a worker that is gone may not come back soon.
  auto connection = peer->connection();
  if (!connection && lost == lost_workers::skip) co_return;
  if (!connection) {
    throw remote_error(make_error_code(errc::unavailable), peer->task(),
                       fmt::format("per-worker variable '{}' cannot be read on {}: it is not connected", variable.name,
                                   peer->task()));
  }
  auto [ec, response] = co_await connection->async_call(std::move(request), as_tuple(use_awaitable));
  if (ec && lost == lost_workers::skip) co_return;
  if (ec) {
    throw remote_error(make_error_code(errc::unavailable), peer->task(),
                       fmt::format("per-worker variable '{}' cannot be read on {}: connection lost: {}", variable.name,
                                   peer->task(), connection->close_reason()));
  }
  wire::throw_if_error(response.message.response().status(), peer->task());
  const auto& result = response.message.response().result();
  tensor value;
  if (result.kind_case() == wire::Value::kTensor) value = wire::get_tensor(response, result.tensor());
  if (result.kind_case() != wire::Value::kTensor || value.type() != variable.type || value.shape() != variable.shape) {
    throw remote_error(make_error_code(errc::protocol_error), peer->task(),
                       fmt::format("{} answered a read of per-worker variable '{}' ({} {}) with something else",
                                   peer->task(), variable.name, name_of(variable.type), to_string(variable.shape)));
  }
  out = std::move(value);
}

asio::awaitable<void> coordinator_core::prepare_worker(std::shared_ptr<coordinator_core> self, std::size_t worker) {
  if (!self) co_return;
  // By id from the live list, afresh after every call: a value released while this waits is
  // skipped, and one created meanwhile is built too (its create_per_worker did not send it here,
  // this worker not being ready yet). Ids only grow, and the list keeps their order.
  std::uint64_t built = 0;
  for (;;) {
    const auto& live = self->per_worker_;
    const auto next =
        std::find_if(live.begin(), live.end(), [built](const per_worker_entry& e) { return e.ref.id > built; });
    if (next == live.end()) co_return;
    built = next->ref.id;
    auto request = self->create_request(*next, worker);  // named: g++ 12 (temporaries)
    co_await self->connections_->worker(worker)->call(std::move(request));
  }
}

std::shared_ptr<chief::closure> coordinator_core::make_closure(std::string name, std::string signature,
                                                        std::vector<value> args) {
  auto result = std::make_shared<remote_state>(executor_, decode_context{ps_});
  return std::make_shared<chief::closure>(chief::closure{std::move(name), std::move(signature), std::move(args), std::move(result)});
}

asio::awaitable<void> coordinator_core::run(std::shared_ptr<coordinator_core> self, std::size_t worker,
                                            std::shared_ptr<chief::closure> c) {
  const auto& peer = *self->connections_->worker(worker);
  wire::frame request;
  auto* call = request.message.mutable_request()->mutable_run_function();
  call->set_name(c->function);
  call->set_signature(c->signature);
  call->set_generation(c->generation);
  for (const auto& arg : c->args) wire::encode_value(request, *call->add_args(), arg);

  std::string lost;
  wire::frame response;
  if (auto connection = peer.connection()) {
    auto [ec, reply] = co_await connection->async_call(std::move(request), as_tuple(use_awaitable));
    if (ec) lost = connection->close_reason();
    response = std::move(reply);
  } else {
    lost = "not connected";
  }
  if (lost.empty()) {
    self->finish(worker, c, response);
    co_return;
  }
  // Lost first: the queue must not hand the worker another closure while it takes this one back.
  self->connections_->worker_failed(worker, lost);
  self->queue_->lost(worker, c);
}

asio::awaitable<void> coordinator_core::cancel_on(std::shared_ptr<net::peer> worker, std::uint64_t generation) {
  // On the open connection only: a worker that is gone runs nothing of ours any more.
  auto connection = worker->connection();
  if (!connection) co_return;
  wire::frame request;
  request.message.mutable_request()->mutable_cancel_closures()->set_generation(generation);
  // The answer says nothing we need (a worker that does not know the request refuses it, and its
  // closures run to their end, with nobody waiting for them).
  (void)co_await connection->async_call(std::move(request), as_tuple(use_awaitable));
}

void coordinator_core::finish(std::size_t worker, const std::shared_ptr<chief::closure>& c, const wire::frame& response) {
  const auto& reply = response.message.response();
  const auto& task = connections_->worker(worker)->task();
  value result;
  // No clock read while metrics are off (what they cost is measured against that).
  const bool timed = metrics::enabled();
  const auto outcome = timed ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
  if (timed) closure_execution_.observe(std::chrono::duration<double>(outcome - c->started).count());
  try {
    wire::throw_if_error(reply.status(), task);
    std::size_t budget = max_value_items;
    result = wire::decode_value(response, reply.result(), budget);
    if (timed) {
      remote_value_fetch_.observe(std::chrono::duration<double>(std::chrono::steady_clock::now() - outcome).count());
    }
  } catch (const remote_error& e) {
    const auto ps = classify_ps_failure(e, *c, task);
    switch (ps.what) {
      case ps_failure::kind::transient:
        queue_->retry(worker, c);  // at least once, as for a lost worker
        return;
      case ps_failure::kind::too_many:
        asio::co_spawn(executor_, confirm_ps_failure(shared_from_this(), ps.ps, worker, c, std::current_exception()),
                       asio::detached);
        return;
      case ps_failure::kind::none:
        break;
    }
    queue_->failed(worker, c, std::current_exception());
    return;
  } catch (const std::exception&) {
    queue_->failed(worker, c, std::current_exception());
    return;
  }
  queue_->succeeded(worker, c, std::move(result));
}

coordinator_core::ps_failure coordinator_core::classify_ps_failure(const remote_error& failure, const chief::closure& c,
                                                                    const std::string& worker) {
  const auto& ps = connections_->ps();
  if (failure.code() != errc::unavailable || !failure.origin_task().starts_with("ps:") || queue_->failing()) {
    return {};
  }
  const auto blamed = std::find_if(ps.begin(), ps.end(), [&](const auto& p) { return p->task() == failure.origin_task(); });
  if (blamed == ps.end()) return {};
  const auto index = static_cast<std::size_t>(blamed - ps.begin());
  transient_ps_failures_.resize(ps.size());
  ps_failures_.inc();
  const int count = ++transient_ps_failures_[index];
  const int tolerated = queue_->options().transient_ps_failures;
  if (count >= tolerated) return {ps_failure::kind::too_many, index};
  log::warning("'{}' on {} could not reach {}: {}. It is treated as a transient connectivity failure for now ({} of "
               "{} tolerated for {}); it runs again.",
               c.function, worker, failure.origin_task(), failure.remote_message(), count, tolerated - 1,
               failure.origin_task());
  return {ps_failure::kind::transient, index};
}

asio::awaitable<void> coordinator_core::confirm_ps_failure(std::shared_ptr<coordinator_core> self, std::size_t ps,
                                                           std::size_t worker, std::shared_ptr<chief::closure> c,
                                                           std::exception_ptr failure) {
  // Workers in flight at a ps's death can pass the tolerance within milliseconds, before the
  // chief's own connection reports it. A Heartbeat settles it: when the ps is gone, the connection
  // closes first (lost_ps fails the run and resolves this closure with that failure; failed()
  // below then finds it no longer running); the heartbeat timeout bounds a ps that hangs.
  if (auto connection = self->connections_->ps().at(ps)->connection()) {
    wire::frame ping;
    ping.message.mutable_request()->mutable_heartbeat();
    (void)co_await connection->async_call(std::move(ping), as_tuple(use_awaitable));
  }
  self->queue_->failed(worker, c, std::move(failure));
}

void coordinator_core::lost_ps(std::size_t index, const std::string& reason) {
  ps_failures_.inc();
  if (queue_->has_failed()) return;  // the first loss ended the run; the rest adds nothing
  const auto& peer = connections_->ps().at(index);
  const auto& task = peer->task();
  log::error("lost {}: {}; its variables are gone (restart the cluster and restore a checkpoint)", task, reason);
  auto failure = std::make_exception_ptr(remote_error(
      make_error_code(errc::unavailable), task, fmt::format("parameter server {} is unavailable: {}", task, reason)));
  peer->fail_with(failure);
  queue_->fail(std::move(failure));
}

}  // namespace pscoro::detail

#include "chief/coordinator_core.hpp"

#include "metrics/cluster_view.hpp"
#include "metrics/library.hpp"

#include "common/address.hpp"
#include "common/environment.hpp"
#include "common/log.hpp"
#include "common/text.hpp"
#include "net/security.hpp"
#include "wire/connection.hpp"
#include "wire/values.hpp"

#include <pscoro/detail/parallel.hpp>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
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
  // Served before the connections are made: every server's Hello carries the page's URL.
  std::string chief_page;
  if (const auto metrics_port = metrics::metrics_port(options.metrics_port)) {
    // Where the chief's address says (a loopback host kept, any other: every interface), or on
    // loopback when the cluster spec gives the chief no address.
    const auto task = fmt::format("{}:{}", task_type, index);
    std::string listen_host = "127.0.0.1", shown_host = "127.0.0.1";
    if (!spec_address.empty()) {
      listen_host = common::split_address(net::listen_address_for(spec_address, task), task).first;
      shown_host = common::split_address(spec_address, task).first;
    }
    const auto port = metrics::serve_process_metrics(task, listen_host, shown_host, *metrics_port);
    chief_page = fmt::format("http://{}/", common::format_address(shown_host, std::to_string(port)));
  }
  auto core = std::shared_ptr<coordinator_core>(new coordinator_core(
      std::move(executor), cluster, std::move(options), std::move(self), std::move(spec_address), chief_page));
  core->wire_events();
  {
    // Who the page is about: the chief, and every task of the cluster with its address.
    metrics::task_view view{fmt::format("{}:{}", task_type, index), "chief", {}, {}, {}};
    const auto& spec = core->cluster_;
    for (const auto& peer : core->connections_->ps()) {
      view.ps.emplace_back(peer->task(), spec.task_address("ps", static_cast<int>(view.ps.size())));
    }
    for (std::size_t i = 0; i < core->connections_->num_workers(); ++i) {
      view.workers.emplace_back(core->connections_->worker(i)->task(), spec.task_address("worker", static_cast<int>(i)));
    }
    metrics::process_view().set_task(std::move(view));
  }
  return core;
}

coordinator_core::coordinator_core(asio::any_io_executor executor, cluster_spec cluster, strategy_options options,
                                   net::task_identity self, std::string spec_address, const std::string& chief_page)
    : executor_(std::move(executor)),
      cluster_(std::move(cluster)),
      strategy_options_(std::move(options)),
      connections_(std::make_shared<chief::cluster_connections>(executor_, cluster_, std::move(self),
                                                                  std::move(spec_address), strategy_options_.transport,
                                                                  chief_page)),
      ps_(std::make_shared<client::ps_client>(connections_->ps())),
      placement_(ps_),
      per_worker_(std::make_shared<chief::per_worker_values>(executor_, connections_)) {
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
  registered_.push_back(r.add("pscoro_coordinator_ps_restores_total",
                              "Lost parameter servers restored in place from a checkpoint.", {}, ps_restores_));
  registered_.push_back(r.add("pscoro_coordinator_ps_restore_seconds",
                              "Time from a ps's loss to its closures running again, per restore.", {},
                              ps_restore_seconds_));
  registered_.push_back(r.add("pscoro_coordinator_ps_restore_checkpoint_step",
                              "The step of the checkpoint the last restore of a lost ps used.", {}, ps_restore_step_));
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
  const auto staleness = queue_->staleness().read();
  m.closure_staleness.count = staleness.count;
  m.closure_staleness.p50 = static_cast<std::uint64_t>(metrics::quantile_bound(staleness, 0.5));
  m.closure_staleness.p99 = static_cast<std::uint64_t>(metrics::quantile_bound(staleness, 0.99));
  m.closure_staleness.max = static_cast<std::uint64_t>(queue_->staleness_max().value());
  m.speculated_closures = queue_->speculated().value();
  m.backup_wins = queue_->backup_wins().value();
  return m;
}

namespace {

error no_such_worker(std::size_t worker, std::size_t workers, const char* call) {
  return error(errc::invalid_argument,
               fmt::format("{}({}): the cluster has workers 0..{}", call, worker, workers == 0 ? 0 : workers - 1));
}

}  // namespace

void coordinator_core::drain(std::size_t worker, chief::closure_queue::join_handler drained) {
  if (worker >= num_workers()) {
    drained(std::make_exception_ptr(no_such_worker(worker, num_workers(), "drain")));
    return;
  }
  // No per-worker value is made there from now on, and leaving is no failure: what it runs comes
  // back to the queue if it goes before finishing.
  connections_->drain(worker);
  const auto& task = connections_->worker(worker)->task();
  log::info("draining {}: it takes no new closures; {} still run there", task, queue_->running(worker).size());
  const std::weak_ptr<coordinator_core> weak = weak_from_this();
  queue_->drain(worker, chief::closure_queue::join_handler(
                            [weak, worker, drained = std::move(drained)](std::exception_ptr e) mutable {
                              auto self = weak.lock();
                              // Dropped even if it was resumed since: it is prepared afresh
                              // (values made again), and this goes out on its connection first.
                              if (self && !e) {
                                self->per_worker_->release_on(worker);
                                const auto counts = self->per_worker_->counts();
                                log::info("drained {}: nothing runs there; it dropped {} iterator(s), {} per-worker "
                                          "variable(s) and {} resource(s)",
                                          self->connections_->worker(worker)->task(), counts[0], counts[1], counts[2]);
                              }
                              drained(e);
                            },
                            executor_));
}

void coordinator_core::resume(std::size_t worker) {
  if (worker >= num_workers()) throw no_such_worker(worker, num_workers(), "resume");
  if (!connections_->drained(worker)) return;
  log::info("resuming {}: its per-worker values are made again before it takes closures",
            connections_->worker(worker)->task());
  // Called off before it finished, the drain left the worker its values: it goes on as it was,
  // unless it left meanwhile, when it comes back as a lost worker does.
  const bool interrupted = queue_->undrain(worker);
  const bool holds_values = interrupted && connections_->worker(worker)->connection();
  if (interrupted && !holds_values) queue_->worker_lost(worker);
  connections_->resume(worker, holds_values);
}

void coordinator_core::register_worker(std::size_t i) {
  auto& r = metrics::process_registry();
  const auto& stats = queue_->worker_stats(i);
  const auto task = connections_->worker(i)->task();
  const metrics::labels worker{{"worker", task}};
  const auto closures_help = "Closures a worker finished, by outcome (succeeded, failed).";
  registered_.push_back(r.add("pscoro_coordinator_worker_closures_total", closures_help,
                              {{"worker", task}, {"outcome", "succeeded"}}, stats.succeeded));
  registered_.push_back(r.add("pscoro_coordinator_worker_closures_total", closures_help,
                              {{"worker", task}, {"outcome", "failed"}}, stats.failed));
  registered_.push_back(r.add("pscoro_coordinator_worker_inflight_closures",
                              "Closures sent to a worker without an outcome yet.", worker, stats.in_flight));
  registered_.push_back(r.add("pscoro_coordinator_worker_up", "1 while a worker may take closures, else 0.", worker,
                              stats.up));
  registered_.push_back(r.add("pscoro_coordinator_worker_restarts_total",
                              "Times a worker came back after it was lost.", worker, stats.restarts));
  registered_.push_back(r.add("pscoro_coordinator_worker_drained",
                              "1 while a worker is drained (or being drained), else 0.", worker, stats.drained));
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
        wire::CancelClosures cancel;
        cancel.set_generation(generation);
        asio::co_spawn(self->executor_, cancel_on(self->connections_->worker(worker), std::move(cancel)),
                       asio::detached);
      },
      [weak](std::size_t worker, const std::shared_ptr<chief::closure>& c) {
        auto self = weak.lock();
        if (!self) return;
        wire::CancelClosures cancel;
        cancel.add_closures(c->number);
        asio::co_spawn(self->executor_, cancel_on(self->connections_->worker(worker), std::move(cancel)),
                       asio::detached);
      });
  auto& r = metrics::process_registry();
  registered_.push_back(r.add("pscoro_coordinator_queued_closures", "Closures waiting in the queue (TF: queued_closures).",
                              {}, queue_->queued_gauge()));
  registered_.push_back(r.add("pscoro_coordinator_inflight_closures",
                              "Closures sent to a worker without an outcome yet (TF: inflight_closures).", {},
                              queue_->inflight_gauge()));
  registered_.push_back(r.add("pscoro_coordinator_closure_staleness",
                              "Closures that finished between a closure's start on its worker and its end (what its "
                              "reads may have missed).",
                              {}, queue_->staleness()));
  registered_.push_back(r.add("pscoro_coordinator_closure_staleness_max",
                              "The largest closure staleness so far.", {}, queue_->staleness_max()));
  registered_.push_back(r.add("pscoro_coordinator_speculated_closures_total",
                              "Backup attempts started for slow closures (speculation).", {}, queue_->speculated()));
  registered_.push_back(r.add("pscoro_coordinator_backup_wins_total",
                              "Closures whose backup attempt finished first.", {}, queue_->backup_wins()));
  registered_.push_back(r.add("pscoro_coordinator_scheduled_closures_total",
                              "Closures taken into the queue (scheduled).", {}, queue_->scheduled_counter()));
  for (std::size_t i = 0; i < connections_->num_workers(); ++i) register_worker(i);
  for (std::size_t i = 0; i < connections_->ps().size(); ++i) {
    const metrics::labels ps{{"ps", connections_->ps()[i]->task()}};
    registered_.push_back(r.add("pscoro_coordinator_ps_variables",
                                "Variable shards the chief placed on a parameter server.", ps,
                                placement_.usage(i).shards));
    registered_.push_back(r.add("pscoro_coordinator_ps_variable_bytes",
                                "Bytes of the variable shards the chief placed on a parameter server (values; "
                                "optimizer slots not counted).",
                                ps, placement_.usage(i).bytes));
  }
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
  events.prepare_worker = [weak](std::size_t worker) {
    const auto self = weak.lock();
    return chief::per_worker_values::prepare(self ? self->per_worker_ : nullptr, worker);
  };
  events.worker_back = [weak](std::size_t worker) {
    auto self = weak.lock();
    if (!self) return;
    const auto counts = self->per_worker_->counts();  // iterators, variables, resources
    if (self->queue_->returning(worker)) {
      self->iterator_rebuilds_.inc(counts[0]);
      // "is back; N iterator(s) rebuilt before it takes closures" is what the process tests look for.
      log::info("{} is back; {} iterator(s) rebuilt before it takes closures (and {} per-worker variable(s), {} "
                "resource(s))",
                self->connections_->worker(worker)->task(), counts[0], counts[1], counts[2]);
    } else {
      // Admitted or resumed: "takes closures now" is what the elastic process test looks for.
      log::info("{} takes closures now; {} iterator(s), {} per-worker variable(s) and {} resource(s) made there first",
                self->connections_->worker(worker)->task(), counts[0], counts[1], counts[2]);
    }
    self->queue_->worker_up(worker);
  };
  events.worker_admitted = [weak](std::size_t worker) {
    auto self = weak.lock();
    if (!self) return;
    const auto& peer = self->connections_->worker(worker);
    self->queue_->add_worker(peer->task());
    self->register_worker(worker);
    metrics::process_view().add_worker(peer->task(), peer->address());
  };
  events.tick = [weak] {
    if (auto self = weak.lock()) self->queue_->tick();
  };
  events.ps_totals = [weak](std::size_t ps, const wire::PsTotals& totals) {
    if (auto self = weak.lock()) self->ps_reported(ps, totals);
  };
  connections_->set_events(std::move(events));
}

void coordinator_core::close(std::optional<int> job_exit_code) {
  metrics::process_view().set_job_state(job_exit_code.value_or(0) == 0 ? "finished" : "failed");
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
  // TF's _maybe_delay reads whole seconds (int()).
  if (const auto seconds = number_from_environment("TF_COORDINATOR_SCHEDULE_START_DELAY")) {
    taken.schedule_start_delay = std::chrono::seconds(static_cast<std::int64_t>(std::clamp(*seconds, 0.0, 1e6)));
  }
  if (const auto seconds = number_from_environment("TF_COORDINATOR_SCHEDULE_START_DELAY_MAX")) {
    taken.schedule_start_delay_max = std::chrono::seconds(static_cast<std::int64_t>(std::clamp(*seconds, 0.0, 1e6)));
  }
  queue_->set_options(taken);
  connections_->set_probe_interval(taken.worker_probe_interval);
  connections_->set_max_elastic_workers(taken.max_elastic_workers);
}

namespace {

std::string describe(const coordinator_options& o) {
  return fmt::format(
      "closures_per_worker {}, max_queued_closures {}, worker_recovery_timeout {}, worker_probe_interval {}, "
      "watchdog_timeout {}, transient_ps_failures {}, max_staleness {}, schedule_start_delay {}, "
      "schedule_start_delay_max {}, max_elastic_workers {}",
      o.closures_per_worker, o.max_queued_closures, o.worker_recovery_timeout, o.worker_probe_interval,
      o.watchdog_timeout, o.transient_ps_failures,
      o.max_staleness ? std::to_string(*o.max_staleness) : std::string("none"), o.schedule_start_delay,
      o.schedule_start_delay_max, o.max_elastic_workers);
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
  call->set_closure(c->number);
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

asio::awaitable<void> coordinator_core::cancel_on(std::shared_ptr<net::peer> worker, wire::CancelClosures cancel) {
  // On the open connection only: a worker that is gone runs nothing of ours any more.
  auto connection = worker->connection();
  if (!connection) co_return;
  wire::frame request;
  *request.message.mutable_request()->mutable_cancel_closures() = std::move(cancel);
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
  if (!failure.origin_task().starts_with("ps:") || queue_->failing()) return {};
  const auto blamed = std::find_if(ps.begin(), ps.end(), [&](const auto& p) { return p->task() == failure.origin_task(); });
  if (blamed == ps.end()) return {};
  const auto index = static_cast<std::size_t>(blamed - ps.begin());
  // A ps being restored fails whatever reaches it (it is not there, or holds nothing yet); a ps
  // restarted before the chief noticed does not know the session yet (aborted). Either way the
  // closure runs again once the ps is restored.
  if (index < restoring_.size() && restoring_[index] != restore_state::none) return {ps_failure::kind::transient, index};
  if (failure.code() == errc::aborted && !ps_restorer_.expired()) return {ps_failure::kind::transient, index};
  if (failure.code() != errc::unavailable) return {};
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
  self->restored_losses_.resize(self->connections_->ps().size(), 0);
  const std::uint64_t losses_before = self->restored_losses_[ps];
  if (auto connection = self->connections_->ps().at(ps)->connection()) {
    wire::frame ping;
    ping.message.mutable_request()->mutable_heartbeat();
    (void)co_await connection->async_call(std::move(ping), as_tuple(use_awaitable));
  }
  // The ps was lost, and a restorer took it in hand (it is being restored, or is back): what the
  // workers met was that loss, so the closure runs again once the ps is restored.
  if (self->restored_losses_[ps] != losses_before) {
    self->queue_->retry(worker, c);
    co_return;
  }
  self->queue_->failed(worker, c, std::move(failure));
}

void coordinator_core::lost_ps(std::size_t index, const std::string& reason) {
  ps_failures_.inc();
  if (queue_->has_failed()) return;  // the first loss ended the run; the rest adds nothing
  const auto& task = connections_->ps().at(index)->task();
  restoring_.resize(connections_->ps().size(), restore_state::none);
  if (restoring_[index] != restore_state::none) {
    restoring_[index] = restore_state::lost_again;  // the restore finds out, and starts over
    return;
  }
  if (auto restorer = ps_restorer_.lock()) {
    log::warning("lost {}: {}; its closures wait while it is restored from the newest checkpoint (the other ps keep "
                 "their values)",
                 task, reason);
    restoring_[index] = restore_state::running;
    restored_losses_.resize(connections_->ps().size(), 0);
    ++restored_losses_[index];
    losses_in_hand_.fetch_add(1, std::memory_order_release);
    restores_in_progress_.fetch_add(1, std::memory_order_release);
    queue_->hold();
    asio::co_spawn(executor_, restore_lost_ps(shared_from_this(), index, std::move(restorer)), asio::detached);
    return;
  }
  log::error("lost {}: {}; its variables are gone (restart the cluster and restore a checkpoint)", task, reason);
  fail_run(index, std::make_exception_ptr(remote_error(
                      make_error_code(errc::unavailable), task,
                      fmt::format("parameter server {} is unavailable: {}", task, reason))));
}

void coordinator_core::ps_reported(std::size_t index, const wire::PsTotals& totals) {
  ps_reports_.resize(connections_->ps().size());
  auto& report = ps_reports_.at(index);
  if (!report) {
    // Registered at the first report: until then the page shows nothing rather than zeros.
    report = std::make_unique<ps_report>();
    const metrics::labels ps{{"ps", connections_->ps()[index]->task()}};
    auto& r = metrics::process_registry();
    report->registered.push_back(r.add("pscoro_coordinator_ps_requests_total",
                                       "Requests a parameter server served (from every task), as its answers to the "
                                       "chief's heartbeats report them.",
                                       ps, report->requests));
    report->registered.push_back(r.add("pscoro_coordinator_ps_held_variables",
                                       "Variables and optimizer slots a parameter server holds, as it reports them.",
                                       ps, report->variables));
    report->registered.push_back(r.add("pscoro_coordinator_ps_held_bytes",
                                       "Bytes a parameter server holds for variables, slots and hash tables, as it "
                                       "reports them.",
                                       ps, report->held_bytes));
    report->registered.push_back(r.add("pscoro_coordinator_ps_resident_memory_bytes",
                                       "Resident memory of a parameter server's process, as it reports it.", ps,
                                       report->resident_memory));
  }
  // A restarted ps counts from 0 again: the counter goes on from where the last one left it.
  if (totals.incarnation() != report->incarnation) {
    report->incarnation = totals.incarnation();
    report->last_requests = 0;
  }
  report->requests.inc(totals.requests_served() - std::min(totals.requests_served(), report->last_requests));
  report->last_requests = std::max(report->last_requests, totals.requests_served());
  report->variables.set(static_cast<std::int64_t>(totals.variables()));
  report->held_bytes.set(static_cast<std::int64_t>(totals.held_bytes()));
  if (totals.resident_memory_bytes() > 0) {
    report->resident_memory.set(static_cast<std::int64_t>(totals.resident_memory_bytes()));
  }
}

void coordinator_core::fail_run(std::size_t index, std::exception_ptr failure) {
  connections_->ps().at(index)->fail_with(failure);
  queue_->fail(std::move(failure));
}

asio::awaitable<void> coordinator_core::restore_lost_ps(std::shared_ptr<coordinator_core> self, std::size_t index,
                                                        std::shared_ptr<chief::lost_ps_restorer> restorer) {
  const auto started = std::chrono::steady_clock::now();
  const auto& peer = self->connections_->ps().at(index);
  const std::string task = peer->task();
  const int ps_task = static_cast<int>(index);
  std::exception_ptr failure;
  try {
    // The same task at its address again (restarted in place, as pscoro-launch --restart-ps and
    // Kubernetes do): one connection attempt per probe interval until the wait is over. A ps lost
    // again while it is being restored (it crashed again, or its node went) is waited for again,
    // within the same wait, and restored from the start: what it held of the first restore is gone.
    const auto wait = restorer->wait_for_ps();
    const auto deadline = started + wait;
    asio::steady_timer timer(self->executor_);
    const auto held = self->placement_.held_by(ps_task);
    chief::lost_ps_restorer::restored restored;
    for (;;) {
      while (!co_await peer->connect_once()) {
        if (self->connections_->closed()) throw error(errc::cancelled, "the coordinator closed");
        if (std::chrono::steady_clock::now() >= deadline) {
          throw remote_error(make_error_code(errc::unavailable), task,
                             fmt::format("parameter server {} was lost and did not answer at {} within {} ms; its "
                                         "variables are gone",
                                         task, peer->address(), wait.count()));
        }
        timer.expires_after(std::chrono::milliseconds(250));
        co_await timer.async_wait(asio::use_awaitable);
      }
      // Lost again during the attempt (its calls may then have reached the next incarnation, which
      // holds part of it): the attempt's outcome, success or failure, is the loss's.
      std::exception_ptr attempt_failure;
      std::error_code attempt_code;
      try {
        co_await self->placement_.recreate_on(ps_task);
        restored = co_await restorer->restore_ps(ps_task, held.variables, held.tables);
      } catch (const std::system_error& e) {
        attempt_failure = std::current_exception();
        attempt_code = e.code();
      } catch (...) {
        attempt_failure = std::current_exception();
      }
      // (Its failure may come before the loss is told: a call that failed unavailable on a closed
      // connection is the loss too.)
      const bool lost_again = std::exchange(self->restoring_[index], restore_state::running) ==
                                  restore_state::lost_again ||
                              (attempt_code == make_error_code(errc::unavailable) && !peer->connection());
      if (!lost_again) {
        if (attempt_failure) std::rethrow_exception(attempt_failure);
        break;
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        throw remote_error(make_error_code(errc::unavailable), task,
                           fmt::format("parameter server {} was lost again while being restored, and the wait of {} "
                                       "ms for it is over",
                                       task, wait.count()));
      }
      log::warning("{} was lost again while being restored; waiting for it again", task);
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    self->ps_restores_.inc();
    self->ps_restore_seconds_.observe(seconds);
    self->ps_restore_step_.set(restored.step);
    log::warning("{} is back and restored from {} (step {}) in {:.1f} s: its {} variable(s) and {} hash table "
                 "part(s) lost what changed since; closures run again",
                 task, restored.checkpoint, restored.step, seconds, held.variables.size(), held.tables.size());
    restorer->restored_ps(task, restored, seconds);
  } catch (...) {
    failure = std::current_exception();
  }
  self->restoring_[index] = restore_state::none;
  self->restores_in_progress_.fetch_sub(1, std::memory_order_release);
  if (failure) {
    log::error("lost {}, and restoring it failed: {}", task, common::what_of(failure));
    self->fail_run(index, failure);
  } else if (index < self->transient_ps_failures_.size()) {
    // What workers met of this ps until the chief saw it lost was the loss, restored now: not
    // transient failures counted against TF's tolerance for the rest of the run.
    self->transient_ps_failures_[index] = 0;
  }
  self->queue_->release();
}

}  // namespace pscoro::detail

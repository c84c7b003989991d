#include <pscoro/server.hpp>

#include "common/environment.hpp"
#include "common/log.hpp"
#include "metrics/cluster_view.hpp"
#include "metrics/library.hpp"
#include "net/handshake_gate.hpp"
#include "net/peer.hpp"
#include "net/security.hpp"
#include "ps/ps_service.hpp"
#include "server/session_table.hpp"
#include "wire/connection.hpp"
#include "wire/requests.hpp"
#include "wire/status.hpp"
#include "worker/worker_service.hpp"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/dispatch.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/post.hpp>
#include <asio/signal_set.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>

#include <fmt/chrono.h>

#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <string_view>
#include <variant>

namespace pscoro {

using asio::experimental::as_tuple;
using asio::use_awaitable;

struct server::impl : std::enable_shared_from_this<impl> {
  asio::any_io_executor executor;
  std::string job;
  int index;
  std::string task;
  std::string spec_address;
  std::string listen_address;
  std::string chief_address;  // where the chief listens for announcements (a worker's; or empty)
  std::string chief_task;     // the chief's task name, as its Welcome gives it ("chief:0")
  bool chief_connected = false;
  bool unlisted = false;  // a worker the cluster spec does not list: the chief must admit it
  bool awaiting_admission = false;  // announced, no chief session yet: Hello.admits may give an index
  transport_options transport;
  std::uint64_t incarnation = net::new_incarnation();
  asio::ip::tcp::acceptor acceptor;
  std::optional<ps::ps_service> ps;
  // A ps releases the pooled buffers no request reused for this long (0: never), checking on this
  // timer.
  std::chrono::milliseconds idle_buffers_release{0};
  std::optional<asio::steady_timer> idle_buffers_timer;
  std::optional<worker::worker_service> worker;
  // Accepted connections and the coordinator session each works for.
  std::map<std::shared_ptr<wire::connection>, std::uint64_t> connections;
  // The coordinator session this server works for, and those it worked for before.
  serving::session_table sessions{""};
  std::optional<net::handshake_gate> gate;  // what accepted connections may hold in their handshakes
  bool stopped = false;
  // The chief ended the job (Shutdown): the exit code it asked for, the connection that carries
  // the answer (the server stops once it is written), and how long that may take.
  std::optional<int> shutdown_code;
  std::weak_ptr<wire::connection> shutdown_from;
  std::optional<asio::steady_timer> shutdown_deadline;
  bool shutdown_finished = false;
  std::function<void(int exit_code)> on_shutdown;

  std::optional<std::uint16_t> metrics_port;
  // The chief's page, linked from this task's page, when it can be known: from the chief's Hello,
  // or before the chief connects, on the chief's host at a fixed metrics port.
  std::string chief_page;

  impl(asio::any_io_executor ex, const simple_cluster_resolver& resolver, server_options options)
      : executor(ex), transport(net::with_environment(options.transport)), acceptor(ex) {
    on_shutdown = std::move(options.on_shutdown);
    metrics_port = metrics::metrics_port(options.metrics_port);
    job = resolver.task_type();
    if (job != "ps" && job != "worker") {
      throw error(errc::invalid_argument,
                  fmt::format("a server runs a 'ps' or 'worker' task, not '{}'", job.empty() ? "<none>" : job));
    }
    const auto& spec = resolver.cluster_spec();
    const auto listed = [&] {
      if (!resolver.task_id() || !spec.has_job(job)) return false;
      const auto indices = spec.task_indices(job);
      return std::find(indices.begin(), indices.end(), *resolver.task_id()) != indices.end();
    }();
    // A worker the spec does not list (no index, or one the spec lacks) asks the chief to admit
    // it (elastic admission): it listens where it is told and announces that address.
    unlisted = job == "worker" && !listed;
    if (!unlisted && !resolver.task_id()) {
      throw error(errc::invalid_argument, fmt::format("the {} task has no index", job));
    }
    if (!unlisted && !spec.has_job(job)) {
      throw error(errc::invalid_argument, fmt::format("`task_type` '{}' not found in cluster_spec.", job));
    }
    index = resolver.task_id().value_or(-1);
    task = task_name(job, unlisted ? -1 : index);
    sessions = serving::session_table(task);
    gate.emplace(task, transport);
    if (unlisted) {
      listen_address = options.listen_address.empty() ? common::environment("PSCORO_LISTEN_ADDRESS")
                                                      : options.listen_address;
      if (listen_address.empty()) {
        throw error(errc::invalid_argument,
                    fmt::format("this worker is not in the cluster spec ({}): to join the job as an unlisted worker "
                                "it needs an address to listen on and announce, reachable by the chief "
                                "(server_options::listen_address or PSCORO_LISTEN_ADDRESS, e.g. 10.0.0.7:0)",
                                resolver.task_id() ? fmt::format("task index {}", *resolver.task_id())
                                                   : std::string("no task index")));
      }
      // It announces this address: the chief must be able to dial it.
      const auto host = common::split_address(listen_address, task).first;
      std::error_code not_literal;
      if (const auto literal = asio::ip::make_address(host, not_literal); !not_literal && literal.is_unspecified()) {
        throw error(errc::invalid_argument,
                    fmt::format("this worker is not in the cluster spec and announces the address it listens on, "
                                "but {} is every interface, which the chief cannot dial: give the host the chief "
                                "reaches it at (server_options::listen_address or PSCORO_LISTEN_ADDRESS, e.g. "
                                "10.0.0.7:0)",
                                listen_address));
      }
      spec_address = listen_address;
    } else {
      spec_address = spec.task_address(job, index);
      listen_address =
          options.listen_address.empty() ? net::listen_address_for(spec_address, task) : options.listen_address;
    }
    // A worker tells the chief where it is (it may have come back at another address), if the
    // spec says where the chief listens.
    if (job == "worker") {
      for (const auto& chief_job : {"chief", "master"}) {
        if (!spec.has_job(chief_job)) continue;
        const auto indices = spec.task_indices(chief_job);
        const auto address = spec.task_address(chief_job, indices.front());
        if (common::split_address(address, chief_job).second != "0") chief_address = address;
        chief_task = task_name("chief", indices.front());  // the chief answers as "chief" whatever its job's name
        break;
      }
      if (unlisted && chief_address.empty()) {
        throw error(errc::invalid_argument,
                    "this worker is not in the cluster spec, and an unlisted worker joins the job by announcing "
                    "itself to the chief: the cluster spec must give the chief's address (a 'chief' job with a "
                    "port other than 0)");
      }
      // Until the chief opens its session here, a chief that admits this worker may give it an
      // index (Hello.admits).
      awaiting_admission = !chief_address.empty();
    }
    // Every task serves its page on the same fixed port (PSCORO_METRICS_PORT=9100 in a deployment):
    // the chief's is then on the chief's host. A port picked free (0) is known only to the chief.
    if (metrics_port && *metrics_port != 0) {
      for (const auto& chief_job : {"chief", "master"}) {
        if (!spec.has_job(chief_job)) continue;
        const auto host = common::split_address(spec.task_address(chief_job, spec.task_indices(chief_job).front()),
                                                chief_job).first;
        chief_page = fmt::format("http://{}/", common::format_address(host, std::to_string(*metrics_port)));
        break;
      }
    }
    if (job == "ps") {
      ps.emplace(task, options);
      // A year or more is never (milliseconds::max() would overflow the timer's nanoseconds).
      const auto release = options.ps_idle_buffers_release;
      if (release.count() > 0 && release < std::chrono::hours(24 * 365)) idle_buffers_release = release;
    } else {
      worker.emplace(executor, task, identity(), transport);
    }
  }

  void start() {
    net::listen_on(acceptor, listen_address, task, transport);
    if (metrics_port) {
      const auto listen_host = common::split_address(listen_address, task).first;
      const auto shown_host = common::split_address(reachable_address(), task).first;
      metrics::serve_process_metrics(task, listen_host, shown_host, *metrics_port);
    }
    metrics::process_view().set_task({task, job, chief_page, {}, {}});
    asio::co_spawn(executor, accept_loop(shared_from_this()), asio::detached);
    if (!chief_address.empty()) asio::co_spawn(executor, announce(shared_from_this()), asio::detached);
    if (ps && idle_buffers_release.count() > 0) {
      idle_buffers_timer.emplace(executor);
      asio::co_spawn(executor, release_idle_buffers(shared_from_this()), asio::detached);
    }
  }

  // Every half of idle_buffers_release, the ps releases the buffers unused for that long: each goes
  // back between one and one and a half times that after its last use.
  static asio::awaitable<void> release_idle_buffers(std::shared_ptr<impl> self) {
    const auto period = std::max(self->idle_buffers_release / 2, std::chrono::milliseconds{1});
    while (!self->stopped) {
      self->idle_buffers_timer->expires_after(period);
      auto [ec] = co_await self->idle_buffers_timer->async_wait(as_tuple(use_awaitable));
      if (ec || self->stopped) break;
      if (const auto released = self->ps->release_idle_buffers(self->idle_buffers_release)) {
        log::debug("{} released {} bytes of buffers unused for {} ms", self->task, released,
                   self->idle_buffers_release.count());
      }
    }
  }

  // Where others reach this task: its spec address, with the port it got if the spec said 0.
  std::string reachable_address() const {
    const auto [host, port] = common::split_address(spec_address, task);
    return common::format_address(host, port == "0" ? std::to_string(acceptor.local_endpoint().port()) : port);
  }

  // Tells the chief where this worker is, until it has heard it or the chief has connected: a
  // worker that comes back at another address than the one the chief knows is found that way.
  static asio::awaitable<void> announce(std::shared_ptr<impl> self) {
    auto hello = net::make_hello(self->identity(), 0);
    hello.set_address(self->reachable_address());
    net::peer chief(self->executor, self->chief_task, self->chief_address, hello, self->transport);
    asio::steady_timer timer(self->executor);
    auto backoff = std::chrono::milliseconds(100);
    while (!self->stopped && !self->chief_connected) {
      try {
        if (auto connection = co_await chief.connect_once()) {
          log::info("announced {} at {} to the chief at {}", self->task, hello.address(), self->chief_address);
          chief.close("announced");
          co_return;
        }
      } catch (const std::exception& e) {
        if (!self->unlisted) {
          log::warning("the chief at {} refused this worker's announcement: {}", self->chief_address, e.what());
          co_return;
        }
        // Not admitted, an unlisted worker has nothing to do: it says why and ends.
        log::error("the chief at {} did not admit this worker: {}", self->chief_address, e.what());
        self->stop();
        if (self->on_shutdown) self->on_shutdown(1);
        co_return;
      }
      timer.expires_after(backoff);
      co_await timer.async_wait(as_tuple(use_awaitable));
      backoff = std::min<std::chrono::milliseconds>(backoff * 2, std::chrono::seconds(5));
    }
  }

  void stop() {
    stopped = true;
    if (shutdown_deadline) shutdown_deadline->cancel();
    if (idle_buffers_timer) idle_buffers_timer->cancel();
    std::error_code ignored;
    acceptor.close(ignored);
    auto open = std::move(connections);
    connections.clear();
    for (const auto& [connection, _] : open) connection->close("server stopped");
    if (worker) worker->close_connections();
    if (ps) ps->stop_kernels();
  }

  static asio::awaitable<void> accept_loop(std::shared_ptr<impl> self) {
    net::accept_backoff backoff;
    while (!self->stopped) {
      auto [ec, socket] = co_await self->acceptor.async_accept(as_tuple(use_awaitable));
      if (ec == asio::error::operation_aborted || self->stopped) break;
      if (ec) {
        co_await backoff.failed(ec, self->task);
        continue;
      }
      backoff.succeeded();
      asio::co_spawn(self->executor, handshake(self, std::move(socket)), asio::detached);
    }
  }

  net::task_identity identity() const { return {job, index, incarnation, awaiting_admission}; }

  // The chief admitted this worker as worker `given` (Hello.admits): it is that task from now on.
  void admitted_as(int given) {
    const auto was = task;
    index = given;
    task = task_name(job, index);
    sessions = serving::session_table(task);
    worker->set_identity(task, identity());
    log::rename_task(was, task);
    metrics::process_view().rename_task(was, task);
    log::info("the chief admitted this worker as {} (it announced itself as {})", task, was);
  }

  // Puts the connection from `peer` into coordinator session `hello_session` (session_table::join)
  // and, when that ends the current session, closes the ended session's connections and releases
  // its state: variables on a ps, iterators on a worker. Returns why the connection is refused, or "".
  std::string join_session(std::uint64_t hello_session, const std::string& peer, bool opens) {
    auto joined = sessions.join(hello_session, peer, opens);
    if (!joined.refusal.empty() || joined.ended == 0) return std::move(joined.refusal);
    log::info("new coordinator session {:016x} (from {}): ending session {:016x} and releasing its {}", hello_session,
              peer, joined.ended, ps ? fmt::format("{} variable(s)", ps->num_variables()) : std::string("iterators"));
    std::vector<std::shared_ptr<wire::connection>> ended;
    for (const auto& [connection, its_session] : connections) {
      if (its_session != hello_session) ended.push_back(connection);
    }
    for (const auto& connection : ended) {
      connections.erase(connection);
      connection->close(fmt::format("coordinator session {:016x} ended", joined.ended));
    }
    if (ps) ps->clear();
    if (worker) worker->end_session();
    return {};
  }

  static asio::awaitable<void> handshake(std::shared_ptr<impl> self, asio::ip::tcp::socket socket) {
    std::error_code ignored;
    const auto remote = socket.remote_endpoint(ignored);
    auto connection = std::make_shared<wire::connection>(std::move(socket), net::limits_of(self->transport),
                                                         common::format_address(remote));
    auto entered = self->gate->enter(remote.address().to_string(), self->connections.size());
    if (const auto* refused = std::get_if<std::string>(&entered)) {
      net::refuse_early(connection, self->transport, make_error_code(errc::resource_exhausted), *refused, self->task);
      co_return;
    }
    std::optional<wire::Hello> hello;
    {
      // Its place at the gate, given back when the handshake ends, however it ends.
      const auto place = std::get<net::handshake_gate::place>(std::move(entered));
      // Named: g++ 12 destroys a co_await's temporaries early.
      const auto identity = self->identity();
      auto budget = place.budget();
      hello = co_await net::receive_hello(connection, self->transport, identity, std::move(budget));
    }
    if (!hello) co_return;
    const auto& h = *hello;
    // The chief opens and ends sessions; workers only join the current one, on a ps. Any other
    // role (an evaluator, a second program started by mistake) is refused before it changes anything.
    const bool chief = h.job() == "chief";
    if (!chief && !(h.job() == "worker" && self->ps)) {
      net::refuse(connection, make_error_code(errc::permission_denied),
                      fmt::format("{} does not accept connections from '{}' tasks: only the chief opens a coordinator "
                                  "session{}",
                                  self->task, h.job(), self->ps ? ", and workers join it" : ""),
                      self->task);
      co_return;
    }
    connection->set_peer(fmt::format("{} at {}", task_name(h.job(), h.task_index()), connection->peer()));
    if (chief && h.session() == 0) {
      // A chief checking who answers at this address before it opens its session on any task
      // (cluster_connections::connect): welcomed (the secret proved, the dialled task this one),
      // and nothing else; no session changes.
      log::debug("{} checked that {} answers here", connection->peer(), self->task);
      net::welcome(connection, self->identity());
      connection->close_after_flush("the chief checked who answers here");
      co_return;
    }
    // Before it joins the session: the session table and the Welcome name the task it is now.
    // (receive_hello let this Hello name the index only for a worker awaiting admission.)
    if (chief && self->worker && self->awaiting_admission && h.admits() && h.to_task_index() != self->index) {
      self->admitted_as(h.to_task_index());
    }
    if (const auto refused = self->join_session(h.session(), connection->peer(), chief); !refused.empty()) {
      net::refuse(connection, make_error_code(errc::aborted), refused, self->task);
      co_return;
    }
    if (chief && self->worker) {
      self->awaiting_admission = false;
      self->worker->set_cluster(h);
      self->chief_connected = true;
    }
    // The chief's page at the URL the chief serves it on (its port may have been picked free):
    // this task's page links there from now on.
    if (chief && !h.chief_page().empty() && h.chief_page() != self->chief_page) {
      self->chief_page = h.chief_page();
      metrics::process_view().set_chief_page(self->chief_page);
    }
    log::debug("accepted {}", connection->peer());
    connection->count_traffic(&metrics::traffic_of(task_name(h.job(), h.task_index())));

    net::welcome(connection, self->identity());

    self->connections.emplace(connection, h.session());
    std::weak_ptr<impl> weak_self = self;
    std::weak_ptr<wire::connection> weak_connection = connection;
    if (self->ps) {
      connection->receive_requests_into(self->ps->buffers());
      // A read of a few bytes can ask for a variable's worth of answer: counted from its arrival, so
      // a peer cannot have more answers in the making than max_bytes_in_flight holds.
      connection->bound_answers_by([weak_self](const wire::frame& request) -> std::uint64_t {
        const auto s = weak_self.lock();
        return s && s->ps ? s->ps->answer_bytes_bound(request) : 0;
      });
    }
    connection->start(
        [weak_self, weak_connection, session = h.session(), chief](wire::frame request) {
          return serve(weak_self, weak_connection, session, chief, std::move(request));
        },
        [weak_self, weak_connection](const std::string& reason) {
          auto s = weak_self.lock();
          auto c = weak_connection.lock();
          if (!s || !c) return;
          log::debug("connection from {} closed: {}", c->peer(), reason);
          s->connections.erase(c);
          if (s->shutdown_code && s->shutdown_from.lock() == c) s->finish_shutdown();
        });
  }

  // The chief on `from` ended the job: answers it, stops accepting, and stops for good once the
  // answer is written (or after handshake_timeout if it cannot be).
  wire::frame shutdown(const wire::Shutdown& asked, const std::shared_ptr<wire::connection>& from) {
    wire::frame response;
    response.message.mutable_response();
    const auto& peer = from ? from->peer() : std::string("a closed connection");
    if (shutdown_code) return response;  // already stopping
    shutdown_code = asked.exit_code();
    log::info("the chief ({}) ended the job with exit code {}: {} stops", peer, *shutdown_code, task);
    stopped = true;
    std::error_code ignored;
    acceptor.close(ignored);
    if (worker) worker->end_session();  // running closures are cancelled; nobody waits for them
    shutdown_from = from;
    // Posted: the answer is queued behind this handler, and closing after the flush sends it.
    asio::post(executor, [weak = std::weak_ptr(from)] {
      if (auto connection = weak.lock()) connection->close_after_flush("the chief ended the job");
    });
    shutdown_deadline.emplace(executor, transport.handshake_timeout);
    shutdown_deadline->async_wait([weak = weak_from_this()](std::error_code ec) {
      if (auto self = weak.lock(); self && !ec) self->finish_shutdown();
    });
    return response;
  }

  void finish_shutdown() {
    if (!shutdown_code || shutdown_finished) return;
    shutdown_finished = true;
    stop();
    if (on_shutdown) on_shutdown(*shutdown_code);
  }

  // The answer that refuses a request with `why`.
  static wire::frame refusal(const error& why, const std::string& task) {
    wire::frame refused;
    wire::set_status(*refused.message.mutable_response()->mutable_status(), why.code(), why.what(), task);
    return refused;
  }

  static asio::awaitable<wire::frame> serve(std::weak_ptr<impl> weak, std::weak_ptr<wire::connection> weak_connection,
                                            std::uint64_t session, bool from_chief, wire::frame request) {
    auto self = weak.lock();
    if (!self) throw error(errc::unavailable, "server stopped");
    if (request.message.request().has_heartbeat()) {
      wire::frame alive;
      auto& answer = *alive.message.mutable_response();
      // The chief's page shows what a ps serves to everyone (the workers' requests included) and
      // holds; a worker's heartbeats to a ps need none of it.
      if (from_chief && self->ps) {
        auto& totals = *answer.mutable_ps_totals() = self->ps->totals();
        totals.set_resident_memory_bytes(metrics::resident_memory_bytes().value_or(0));
        totals.set_incarnation(self->incarnation);
      }
      co_return alive;
    }
    // The connection is closed when its session ends; this catches what was already on its way.
    if (session != self->sessions.current()) {
      co_return refusal(
          error(errc::aborted, fmt::format("coordinator session {:016x} has ended on {}", session, self->task)),
          self->task);
    }
    // Who may ask, and whether this task serves it: refused here, in one place, for every kind.
    const auto& body = request.message.request();
    if (const auto action = wire::chief_only_action(body); !action.empty() && !from_chief) {
      const auto connection = weak_connection.lock();
      co_return refusal(error(errc::permission_denied,
                              fmt::format("{} takes {} only from the chief; {} may not {}", self->task,
                                          wire::request_name(body.body_case()),
                                          connection ? connection->peer() : std::string("a closed connection"),
                                          action)),
                        self->task);
    }
    if (body.has_shutdown()) co_return self->shutdown(body.shutdown(), weak_connection.lock());
    if (self->ps ? !wire::serves(ps::ps_service::kinds_served, body.body_case())
                 : !wire::serves(worker::worker_service::kinds_served, body.body_case())) {
      co_return refusal(wire::not_served(body, self->ps ? "parameter server" : "worker", self->task), self->task);
    }
    if (self->ps) {
      // Not holding the server while the ps serves: while a big kernel runs, this frame belongs to
      // the kernel thread's task, which must never own (and so end up destroying) the server. The
      // ps checks that it still lives when the kernel is done.
      auto& ps = *self->ps;
      self.reset();
      co_return co_await ps.serve(std::move(request));
    }
    co_return co_await self->worker->handle(std::move(request));
  }
};

server::server(asio::any_io_executor executor, const simple_cluster_resolver& resolver, server_options options)
    : impl_(std::make_shared<impl>(std::move(executor), resolver, std::move(options))) {}

server::~server() {
  if (impl_) impl_->stop();
}

void server::start() { impl_->start(); }
// Dispatched: at once on the executor's thread; from another (a dataset or resource function runs on
// the worker's build thread, whose stop would otherwise join itself), posted to the executor.
void server::stop() {
  asio::dispatch(impl_->executor, [impl = impl_] { impl->stop(); });
}
std::uint16_t server::port() const { return impl_->acceptor.local_endpoint().port(); }
std::string server::address() const {
  return common::format_address(impl_->acceptor.local_endpoint());
}
const std::string& server::task() const noexcept { return impl_->task; }

void server::bind_erased(std::string name, std::string signature, detail::erased_worker_function fn) {
  if (!impl_->worker) {
    throw error(errc::failed_precondition, fmt::format("{} is not a worker: it cannot bind '{}'", impl_->task, name));
  }
  impl_->worker->bind(std::move(name), std::move(signature), std::move(fn));
}

void server::bind_dataset_erased(std::string name, detail::erased_dataset_function fn) {
  if (!impl_->worker) {
    throw error(errc::failed_precondition, fmt::format("{} is not a worker: it cannot bind '{}'", impl_->task, name));
  }
  impl_->worker->bind_dataset(std::move(name), std::move(fn));
}

void server::bind_resource_erased(std::string name, detail::erased_resource_function fn) {
  if (!impl_->worker) {
    throw error(errc::failed_precondition, fmt::format("{} is not a worker: it cannot bind '{}'", impl_->task, name));
  }
  impl_->worker->bind_resource(std::move(name), std::move(fn));
}

int run_server(const simple_cluster_resolver& resolver, const std::function<void(server&)>& configure,
               server_options options) {
  try {
    asio::io_context io;
    int exit_code = 0;
    // The chief ended the job: exit with its code, not waiting for what may still be queued (a
    // closure that ignores cancellation).
    options.on_shutdown = [&io, &exit_code, also = std::move(options.on_shutdown)](int code) {
      // A process returns 8 bits: 256 must not become 0 (success). Any other failure is 1.
      exit_code = code >= 0 && code <= 255 ? code : 1;
      if (also) also(code);
      io.stop();
    };
    server s(io.get_executor(), resolver, std::move(options));
    log::set_task(s.task());
    if (configure) configure(s);
    s.start();
    // The launcher reads this line (the message, under PSCORO_LOG_FORMAT=json) for the port.
    print_line(fmt::format("pscoro: {} listening on {}", s.task(), s.address()));
    asio::signal_set signals(io, SIGINT, SIGTERM);
    signals.async_wait([&](std::error_code ec, int signal) {
      if (ec) return;
      log::info("signal {}: stopping", signal);
      // As a shell reports a process the signal ended: a cluster manager (an Indexed Job, the
      // launcher) takes it for a kill to retry, not for a task that finished its work.
      exit_code = 128 + signal;
      s.stop();
      io.stop();
    });
    io.run();
    return exit_code;
  } catch (const std::exception& e) {
    log::error("{}", e.what());
    return 1;
  }
}

}  // namespace pscoro

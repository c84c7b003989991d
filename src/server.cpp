#include <pscoro/server.hpp>

#include "runtime/log.hpp"
#include "runtime/peer.hpp"
#include "runtime/ps_service.hpp"
#include "runtime/worker_service.hpp"
#include "wire/connection.hpp"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/signal_set.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>

#include <fmt/chrono.h>

#include <cstdio>
#include <random>
#include <algorithm>
#include <deque>
#include <map>

namespace pscoro {

using asio::experimental::as_tuple;
using asio::use_awaitable;

namespace {

std::uint64_t new_incarnation() {
  std::random_device device;
  return (std::uint64_t{device()} << 32) ^ device();
}

}  // namespace

struct server::impl : std::enable_shared_from_this<impl> {
  asio::any_io_executor executor;
  std::string job;
  int index;
  std::string task;
  std::string listen_address;
  transport_options transport;
  std::uint64_t incarnation = new_incarnation();
  asio::ip::tcp::acceptor acceptor;
  std::optional<runtime::ps_service> ps;
  std::optional<runtime::worker_service> worker;
  // Accepted connections and the coordinator session each works for.
  std::map<std::shared_ptr<wire::connection>, std::uint64_t> connections;
  // The coordinator session this server works for (0: none yet), and the sessions it worked for
  // before, newest last: a Hello of one of those is refused.
  std::uint64_t session = 0;
  std::deque<std::uint64_t> ended_sessions;
  static constexpr std::size_t max_ended_sessions = 1024;
  bool stopped = false;

  impl(asio::any_io_executor ex, const simple_cluster_resolver& resolver, server_options options)
      : executor(ex), transport(options.transport), acceptor(ex) {
    job = resolver.task_type();
    if (job != "ps" && job != "worker") {
      throw error(errc::invalid_argument,
                  fmt::format("a server runs a 'ps' or 'worker' task, not '{}'", job.empty() ? "<none>" : job));
    }
    if (!resolver.task_id()) throw error(errc::invalid_argument, fmt::format("the {} task has no index", job));
    index = *resolver.task_id();
    task = task_name(job, index);
    const auto& spec = resolver.cluster_spec();
    if (!spec.has_job(job)) throw error(errc::invalid_argument, fmt::format("`task_type` '{}' not found in cluster_spec.", job));
    listen_address =
        options.listen_address.empty() ? listen_address_for(spec.task_address(job, index), task) : options.listen_address;
    if (job == "ps") {
      ps.emplace(task);
    } else {
      worker.emplace(executor, task, index, incarnation, transport);
    }
  }

  // The task's address from the spec, as a place to listen: a loopback host is kept (local
  // clusters); any other host becomes the wildcard with the same port, as TF's server does. Under
  // Kubernetes the address is a service name, which need not be an address of this pod.
  static std::string listen_address_for(const std::string& spec_address, const std::string& task) {
    const auto [host, port] = runtime::split_address(spec_address, task);
    std::error_code not_literal;
    const auto literal = asio::ip::make_address(host, not_literal);
    if (host == "localhost" || (!not_literal && literal.is_loopback())) return spec_address;
    return (!not_literal && literal.is_v6() ? "[::]:" : "0.0.0.0:") + port;
  }

  void start() {
    const auto [host, port] = runtime::split_address(listen_address, task);
    asio::ip::tcp::resolver resolver(executor);
    const auto endpoint = *resolver.resolve(host, port, asio::ip::tcp::resolver::passive).begin();
    acceptor.open(endpoint.endpoint().protocol());
    acceptor.set_option(asio::ip::tcp::acceptor::reuse_address(true));
    acceptor.bind(endpoint.endpoint());
    acceptor.listen();
    asio::co_spawn(executor, accept_loop(shared_from_this()), asio::detached);
  }

  void stop() {
    stopped = true;
    std::error_code ignored;
    acceptor.close(ignored);
    auto open = std::move(connections);
    connections.clear();
    for (const auto& [connection, _] : open) connection->close("server stopped");
    if (worker) worker->close_connections();
  }

  static asio::awaitable<void> accept_loop(std::shared_ptr<impl> self) {
    while (!self->stopped) {
      auto [ec, socket] = co_await self->acceptor.async_accept(as_tuple(use_awaitable));
      if (ec == asio::error::operation_aborted || self->stopped) break;
      if (ec) {
        log::warning("accept failed: {}", ec.message());
        continue;
      }
      asio::co_spawn(self->executor, handshake(self, std::move(socket)), asio::detached);
    }
  }

  // Refuses a peer: tells it why (best effort) and closes.
  static void refuse(const std::shared_ptr<wire::connection>& connection, std::error_code code, const std::string& why,
                     const std::string& task) {
    log::warning("refused connection from {}: {}", connection->peer(), why);
    wire::frame welcome;
    welcome.kind = wire::frame_kind::welcome;
    wire::set_status(*welcome.message.mutable_welcome()->mutable_status(), code, why, task);
    connection->send(std::move(welcome));
    connection->close_after_flush(why);
  }

  // Puts the connection from `peer` into coordinator session `hello_session`: the current one; or
  // a new one, which ends the current session (its connections are closed and its state
  // released: variables on a ps, iterators on a worker); never an ended one. Returns why the
  // connection is refused, or "".
  std::string join_session(std::uint64_t hello_session, const std::string& peer) {
    if (hello_session == 0) return fmt::format("the Hello of {} names no coordinator session", peer);
    if (hello_session == session) return {};
    if (std::find(ended_sessions.begin(), ended_sessions.end(), hello_session) != ended_sessions.end()) {
      return fmt::format("coordinator session {:016x} of {} has ended on {}: a newer coordinator (session {:016x}) "
                         "took over",
                         hello_session, peer, task, session);
    }
    if (session != 0) {
      log::info("new coordinator session {:016x} (from {}): ending session {:016x} and releasing its {}", hello_session,
                peer, session, ps ? fmt::format("{} variables", ps->num_variables()) : std::string("iterators"));
      ended_sessions.push_back(session);
      if (ended_sessions.size() > max_ended_sessions) ended_sessions.pop_front();
      std::vector<std::shared_ptr<wire::connection>> ended;
      for (const auto& [connection, its_session] : connections) {
        if (its_session != hello_session) ended.push_back(connection);
      }
      for (const auto& connection : ended) {
        connections.erase(connection);
        connection->close(fmt::format("coordinator session {:016x} ended", session));
      }
      if (ps) ps->clear();
      if (worker) worker->end_session();
    }
    session = hello_session;
    return {};
  }

  static asio::awaitable<void> handshake(std::shared_ptr<impl> self, asio::ip::tcp::socket socket) {
    std::error_code ignored;
    const auto remote = socket.remote_endpoint(ignored);
    auto connection = std::make_shared<wire::connection>(
        std::move(socket), runtime::limits_of(self->transport),
        fmt::format("{}:{}", remote.address().to_string(), remote.port()));
    wire::handshake_deadline deadline(connection, self->transport.handshake_timeout, "no handshake");
    std::optional<wire::frame> hello;
    try {
      hello = co_await connection->read_frame();
    } catch (const std::system_error& e) {
      if (deadline.expired()) {
        log::warning("closed connection from {}: no handshake within {}", connection->peer(),
                     self->transport.handshake_timeout);
      } else {
        refuse(connection, e.code(), e.what(), self->task);
      }
      co_return;
    }
    deadline.cancel();
    if (!hello) {
      if (deadline.expired()) {
        log::warning("closed connection from {}: no handshake within {}", connection->peer(),
                     self->transport.handshake_timeout);
      } else {
        log::info("connection from {} closed before its handshake", connection->peer());
      }
      co_return;
    }
    if (hello->kind != wire::frame_kind::hello) {
      refuse(connection, make_error_code(errc::protocol_error), "the first frame must be a Hello", self->task);
      co_return;
    }
    const auto& h = hello->message.hello();
    if (h.protocol_version() != wire::protocol_version) {
      refuse(connection, make_error_code(errc::protocol_error),
             fmt::format("Hello speaks protocol version {}, {} speaks {}", h.protocol_version(), self->task,
                         wire::protocol_version),
             self->task);
      co_return;
    }
    const bool allowed = h.job() == "chief" || (h.job() == "worker" && self->ps);
    if (!allowed) {
      refuse(connection, make_error_code(errc::failed_precondition),
             fmt::format("{} does not accept connections from '{}' tasks", self->task, h.job()), self->task);
      co_return;
    }
    connection->set_peer(fmt::format("{} at {}", task_name(h.job(), h.task_index()), connection->peer()));
    if (const auto refused = self->join_session(h.session(), connection->peer()); !refused.empty()) {
      refuse(connection, make_error_code(errc::aborted), refused, self->task);
      co_return;
    }
    if (h.job() == "chief" && self->worker) self->worker->set_cluster(h);
    log::debug("accepted {}", connection->peer());

    wire::frame welcome;
    welcome.kind = wire::frame_kind::welcome;
    auto* w = welcome.message.mutable_welcome();
    w->set_job(self->job);
    w->set_task_index(self->index);
    w->set_incarnation(self->incarnation);
    connection->send(std::move(welcome));

    self->connections.emplace(connection, h.session());
    std::weak_ptr<impl> weak_self = self;
    std::weak_ptr<wire::connection> weak_connection = connection;
    connection->start(
        [weak_self, session = h.session()](wire::frame request) {
          return serve(weak_self, session, std::move(request));
        },
        [weak_self, weak_connection](const std::string& reason) {
          auto s = weak_self.lock();
          auto c = weak_connection.lock();
          if (!s || !c) return;
          log::debug("connection from {} closed: {}", c->peer(), reason);
          s->connections.erase(c);
        });
  }

  static asio::awaitable<wire::frame> serve(std::weak_ptr<impl> weak, std::uint64_t session, wire::frame request) {
    auto self = weak.lock();
    if (!self) throw error(errc::unavailable, "server stopped");
    if (request.message.request().has_heartbeat()) {
      wire::frame alive;
      alive.message.mutable_response();
      co_return alive;
    }
    // The connection is closed when its session ends; this catches what was already on its way.
    if (session != self->session) {
      wire::frame refused;
      wire::set_status(*refused.message.mutable_response()->mutable_status(), make_error_code(errc::aborted),
                       fmt::format("coordinator session {:016x} has ended on {}", session, self->task), self->task);
      co_return refused;
    }
    if (self->ps) co_return self->ps->handle(request);
    co_return co_await self->worker->handle(std::move(request));
  }
};

server::server(asio::any_io_executor executor, const simple_cluster_resolver& resolver, server_options options)
    : impl_(std::make_shared<impl>(std::move(executor), resolver, std::move(options))) {}

server::~server() {
  if (impl_) impl_->stop();
}

void server::start() { impl_->start(); }
void server::stop() { impl_->stop(); }
std::uint16_t server::port() const { return impl_->acceptor.local_endpoint().port(); }
std::string server::address() const {
  const auto endpoint = impl_->acceptor.local_endpoint();
  return fmt::format("{}:{}", endpoint.address().to_string(), endpoint.port());
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

int run_server(const simple_cluster_resolver& resolver, const std::function<void(server&)>& configure,
               server_options options) {
  try {
    asio::io_context io;
    server s(io.get_executor(), resolver, std::move(options));
    log::set_task(s.task());
    if (configure) configure(s);
    s.start();
    std::printf("pscoro: %s listening on %s\n", s.task().c_str(), s.address().c_str());
    std::fflush(stdout);
    asio::signal_set signals(io, SIGINT, SIGTERM);
    signals.async_wait([&](std::error_code ec, int signal) {
      if (ec) return;
      log::info("signal {}: stopping", signal);
      s.stop();
      io.stop();
    });
    io.run();
    return 0;
  } catch (const std::exception& e) {
    log::error("{}", e.what());
    return 1;
  }
}

}  // namespace pscoro

#include "net/peer.hpp"

#include <pscoro/cluster_spec.hpp>
#include <pscoro/worker_function.hpp>

#include "common/log.hpp"
#include "net/security.hpp"
#include "wire/status.hpp"

#include <asio/co_spawn.hpp>
#include <asio/connect.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/ssl/error.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <fmt/chrono.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <random>
#include <variant>

namespace pscoro::net {

using asio::experimental::as_tuple;
using asio::use_awaitable;

wire::frame_limits limits_of(const transport_options& options) {
  wire::frame_limits limits;
  limits.max_header_bytes = options.max_header_bytes;
  limits.max_payload_bytes = options.max_payload_bytes;
  limits.stall_timeout = options.frame_stall_timeout;
  limits.max_bytes_in_flight = options.max_bytes_in_flight;
  return limits;
}

wire::frame_limits handshake_limits_of(const transport_options& options) {
  wire::frame_limits limits;
  limits.max_header_bytes = std::min(options.max_handshake_bytes, options.max_header_bytes);
  limits.max_payload_bytes = 0;
  limits.max_segments = 0;
  return limits;
}

std::uint64_t new_incarnation() {
  std::random_device device;
  const std::uint64_t incarnation = (std::uint64_t{device()} << 32) ^ device();
  return incarnation == 0 ? 1 : incarnation;
}

wire::Hello make_hello(const task_identity& self, std::uint64_t session) {
  wire::Hello hello;
  hello.set_protocol_version(wire::protocol_version);
  hello.set_job(self.job);
  hello.set_task_index(self.index);
  hello.set_incarnation(self.incarnation);
  hello.set_session(session);
  return hello;
}

std::string listen_address_for(const std::string& spec_address, const std::string& task) {
  const auto [host, port] = common::split_address(spec_address, task);
  std::error_code not_literal;
  const auto literal = asio::ip::make_address(host, not_literal);
  if (host == "localhost" || (!not_literal && literal.is_loopback())) return spec_address;
  return (!not_literal && literal.is_v6() ? "[::]:" : "0.0.0.0:") + port;
}

void listen_on(asio::ip::tcp::acceptor& acceptor, const std::string& address, const std::string& task,
               const transport_options& options) {
  const auto [host, port] = common::split_address(address, task);
  asio::ip::tcp::resolver resolver(acceptor.get_executor());
  std::error_code ec;
  const auto resolved = resolver.resolve(host, port, asio::ip::tcp::resolver::passive, ec);
  if (ec || resolved.empty()) {
    throw error(errc::unavailable, fmt::format("{} cannot listen on {}: the address does not resolve: {}", task,
                                               address, ec ? ec.message() : "no address"));
  }
  const auto endpoint = resolved.begin()->endpoint();
  check_exposure(endpoint, options, task);
  // Every failure names the address: "Address already in use" alone does not say which one.
  const auto check = [&](std::string_view step) {
    if (!ec) return;
    throw error(errc::unavailable, fmt::format("{} cannot listen on {} ({}): {} failed: {}", task, address,
                                               common::format_address(endpoint), step, ec.message()));
  };
  acceptor.open(endpoint.protocol(), ec);
  check("open");
  acceptor.set_option(asio::ip::tcp::acceptor::reuse_address(true), ec);
  check("setsockopt(SO_REUSEADDR)");
  acceptor.bind(endpoint, ec);
  check("bind");
  acceptor.listen(asio::socket_base::max_listen_connections, ec);
  check("listen");
}

asio::awaitable<void> accept_backoff::failed(std::error_code ec, const std::string& task) {
  std::size_t held_back = 0;
  if (throttle_.allow(held_back)) {
    log::warning("{} cannot accept connections: {}{}; trying again in {} (logged at most every 10 s)", task,
                 ec.message(), held_back ? fmt::format(" ({} more failures since the last report)", held_back) : "",
                 delay_);
  }
  asio::steady_timer timer(co_await asio::this_coro::executor, delay_);
  co_await timer.async_wait(as_tuple(use_awaitable));
  delay_ = std::min<std::chrono::milliseconds>(delay_ * 2, std::chrono::seconds(1));
}

void refuse(const std::shared_ptr<wire::connection>& connection, std::error_code code, const std::string& why,
            const std::string& task) {
  thread_local log::throttle throttle(20, std::chrono::seconds(10));
  if (std::size_t held_back = 0; throttle.allow(held_back)) {
    log::warning("refused connection from {}: {}{}", connection->peer(), why,
                 held_back ? fmt::format(" ({} more refusals not logged)", held_back) : "");
  }
  wire::frame refusal;
  refusal.kind = wire::frame_kind::welcome;
  wire::set_status(*refusal.message.mutable_welcome()->mutable_status(), code, why, task);
  connection->send(std::move(refusal));
  connection->close_after_flush(why);
}

void refuse_early(const std::shared_ptr<wire::connection>& connection, const transport_options& options,
                  std::error_code code, const std::string& why, const std::string& task) {
  if (!uses_tls(options)) {
    refuse(connection, code, why, task);
    return;
  }
  thread_local log::throttle throttle(20, std::chrono::seconds(10));
  if (std::size_t held_back = 0; throttle.allow(held_back)) {
    log::warning("closed connection from {} before its TLS handshake: {}", connection->peer(), why);
  }
  connection->close(why);
}

void welcome(const std::shared_ptr<wire::connection>& connection, const task_identity& self) {
  wire::frame accepted;
  accepted.kind = wire::frame_kind::welcome;
  auto* w = accepted.message.mutable_welcome();
  w->set_job(self.job);
  w->set_task_index(self.index);
  w->set_incarnation(self.incarnation);
  connection->send(std::move(accepted));
}

namespace {

// A name a peer sent, fit for a log line: plain names as they are, anything else escaped, at most
// 64 characters.
std::string printable(const std::string& name) {
  const bool plain = name.size() <= 64 && std::all_of(name.begin(), name.end(), [](unsigned char c) {
                       return std::isalnum(c) || c == '_' || c == '-' || c == '.';
                     });
  if (plain) return name;
  std::string out = "\"";
  for (const unsigned char c : std::string_view(name).substr(0, 64)) {
    out += std::isprint(c) && c != '"' && c != '\\' ? std::string(1, static_cast<char>(c)) : fmt::format("\\x{:02x}", c);
  }
  return out + (name.size() > 64 ? "\"..." : "\"");
}

// The next frame of a handshake the accepting side runs, which must be of `kind`: nothing after
// refusing the peer or giving up on it (logged either way).
asio::awaitable<std::optional<wire::frame>> read_handshake_frame(const std::shared_ptr<wire::connection>& connection,
                                                                 const wire::handshake_deadline& deadline,
                                                                 const transport_options& options,
                                                                 const std::string& task, wire::frame_kind kind,
                                                                 std::string_view expected) {
  std::optional<wire::frame> f;
  try {
    f = co_await connection->read_frame();
  } catch (const std::system_error& e) {
    if (deadline.expired()) {
      log::warning("closed connection from {}: no handshake within {}", connection->peer(), options.handshake_timeout);
    } else {
      refuse(connection, e.code(), e.what(), task);
    }
    co_return std::nullopt;
  }
  if (!f) {
    if (deadline.expired()) {
      log::warning("closed connection from {}: no handshake within {}", connection->peer(), options.handshake_timeout);
    } else {
      log::info("connection from {} closed during its handshake", connection->peer());
    }
    co_return std::nullopt;
  }
  if (f->kind != kind) {
    refuse(connection, make_error_code(errc::protocol_error), fmt::format("the {} frame must be a {}",
                                                                          kind == wire::frame_kind::hello ? "first" : "next",
                                                                          expected),
           task);
    co_return std::nullopt;
  }
  co_return f;
}

}  // namespace

asio::awaitable<std::optional<wire::Hello>> receive_hello(std::shared_ptr<wire::connection> connection,
                                                          transport_options options, task_identity self,
                                                          std::shared_ptr<wire::byte_budget> budget) {
  const auto task = task_name(self.job, self.index);
  auto limits = handshake_limits_of(options);
  limits.buffer_budget = std::move(budget);
  connection->set_limits(std::move(limits));
  wire::handshake_deadline deadline(connection, options.handshake_timeout, "no handshake");
  if (uses_tls(options)) {
    if (co_await connection->peer_sends_plain_frames()) {
      refuse(connection, make_error_code(errc::unauthenticated),
             fmt::format("{} requires TLS with a certificate of the cluster CA, and {} connected without it", task,
                         connection->peer()),
             task);
      co_return std::nullopt;
    }
    try {
      const auto context = tls_context_for(options);
      co_await connection->start_tls(context, asio::ssl::stream_base::server);
    } catch (const std::system_error& e) {
      thread_local log::throttle throttle(20, std::chrono::seconds(10));
      if (std::size_t held_back = 0; throttle.allow(held_back)) {
        log::warning("refused connection from {}: {}", connection->peer(),
                     deadline.expired() ? std::string("no TLS handshake in time")
                                        : fmt::format("TLS handshake failed: {}", e.code().message()));
      }
      connection->close("TLS handshake failed");
      co_return std::nullopt;
    }
  }
  auto hello_frame =
      co_await read_handshake_frame(connection, deadline, options, task, wire::frame_kind::hello, "Hello");
  if (!hello_frame) co_return std::nullopt;
  wire::Hello hello = std::move(*hello_frame->message.mutable_hello());
  if (hello.protocol_version() != wire::protocol_version) {
    refuse(connection, make_error_code(errc::protocol_error),
           fmt::format("Hello speaks protocol version {}, {} speaks {}", hello.protocol_version(), task,
                       wire::protocol_version),
           task);
    co_return std::nullopt;
  }
  // Named for messages; nothing the peer says about itself is trusted before it proved the secret
  // (and its words are quoted, escaped and cut short: they go into logs).
  const auto claimed = fmt::format("{} (claims {})", connection->peer(),
                                   task_name(printable(hello.job()), hello.task_index()));
  // A chief admitting this worker names the index it gives it (the Challenge below names it too);
  // whether the Hello is the chief's is known only once the secret is proved, and the server
  // adopts the index only then.
  const bool admitted = self.awaiting_admission && hello.admits() && hello.job() == "chief" &&
                        hello.to_job() == self.job && hello.to_task_index() >= 0;
  if (admitted) self.index = hello.to_task_index();
  if (hello.to_job() != self.job || hello.to_task_index() != self.index) {
    const auto meant =
        hello.to_job().empty() ? std::string("no task") : task_name(printable(hello.to_job()), hello.to_task_index());
    refuse(connection, make_error_code(errc::failed_precondition),
           fmt::format("{} dialled {} but reached {}: its cluster spec names the wrong address for {}", claimed, meant,
                       task, meant),
           task);
    co_return std::nullopt;
  }
  if (options.auth_secret.empty()) {
    if (!hello.nonce().empty()) {
      refuse(connection, make_error_code(errc::unauthenticated),
             fmt::format("{} authenticates with a cluster secret but {} has none: give every task the same secret",
                         claimed, task),
             task);
      co_return std::nullopt;
    }
  } else {
    if (hello.nonce().size() != nonce_bytes) {
      refuse(connection, make_error_code(errc::unauthenticated),
             fmt::format("{} sent no proof of the cluster secret and {} requires one: give every task the same secret "
                         "(PSCORO_AUTH_SECRET_FILE)",
                         claimed, task),
             task);
      co_return std::nullopt;
    }
    wire::frame challenge_frame;
    challenge_frame.kind = wire::frame_kind::challenge;
    auto& challenge = *challenge_frame.message.mutable_challenge();
    challenge.set_job(self.job);
    challenge.set_task_index(self.index);
    challenge.set_incarnation(self.incarnation);
    challenge.set_nonce(random_nonce());
    challenge.set_proof(handshake_proof(options.auth_secret, handshake_side::accepting, hello, challenge));
    const wire::Challenge sent = challenge;
    connection->send(std::move(challenge_frame));
    auto proof_frame =
        co_await read_handshake_frame(connection, deadline, options, task, wire::frame_kind::proof, "Proof");
    if (!proof_frame) co_return std::nullopt;
    if (!verify_handshake_proof(options.auth_secret, handshake_side::connecting, hello, sent,
                                proof_frame->message.proof().proof())) {
      refuse(connection, make_error_code(errc::unauthenticated),
             fmt::format("{} failed to prove the cluster secret (a different secret, or a replayed handshake)",
                         claimed),
             task);
      co_return std::nullopt;
    }
  }
  deadline.cancel();
  connection->set_limits(limits_of(options));
  co_return hello;
}

namespace {

// "ps:0" as ("ps", 0).
std::pair<std::string, int> split_task_name(const std::string& task) {
  const auto colon = task.rfind(':');
  int index = 0;
  const char* digits = task.data() + colon + 1;
  if (colon == std::string::npos || std::from_chars(digits, task.data() + task.size(), index).ptr == digits) {
    throw error(errc::internal, fmt::format("'{}' is not a task name (job:index)", task));
  }
  return {task.substr(0, colon), index};
}

// A handshake failure that retrying will not fix: the connection is closed and `e` thrown.
[[noreturn]] void give_up(const std::shared_ptr<wire::connection>& connection, const error& e) {
  connection->close(e.what());
  throw e;
}

// Checks that the task that answered at `address` is the one we dialled.
void check_identity(const std::shared_ptr<wire::connection>& connection, const std::string& task,
                    const std::string& address, const std::string& job, int index) {
  if (const auto answered = task_name(job, index); answered != task) {
    give_up(connection, error(errc::failed_precondition,
                              fmt::format("dialled {} at {} but {} answered: the cluster spec names the wrong address "
                                          "for {}",
                                          task, address, answered, task)));
  }
}

// One attempt to reach a task: the connection, or why there is none yet. A retry may succeed where
// this one failed (nothing listens yet, the task is at its connection limit); what no retry can
// change (a wrong secret, another protocol, the wrong task) is thrown instead.
struct connect_attempt {
  std::shared_ptr<wire::connection> connection;
  std::string retry_reason;  // set when `connection` is null
};

connect_attempt retry_because(std::string reason) { return {nullptr, std::move(reason)}; }

// A socket connected to one of a host's addresses, and that address ("127.0.0.1:4567").
struct reached {
  asio::ip::tcp::socket socket;
  std::string address;
};

// Resolves and connects: the socket, or why there is none.
asio::awaitable<std::variant<reached, std::string>> open_socket(const std::string& host, const std::string& port) {
  auto executor = co_await asio::this_coro::executor;
  asio::ip::tcp::resolver resolver(executor);
  auto [resolve_error, endpoints] = co_await resolver.async_resolve(host, port, as_tuple(use_awaitable));
  if (resolve_error) co_return fmt::format("cannot resolve {}: {}", host, resolve_error.message());
  asio::ip::tcp::socket socket(executor);
  auto [connect_error, endpoint] = co_await asio::async_connect(socket, endpoints, as_tuple(use_awaitable));
  if (connect_error) co_return connect_error.message();
  co_return reached{std::move(socket), common::format_address(endpoint)};
}

// The client's side of the TLS handshake. Returns why to retry (the task closed the connection at
// its limit), or "" when the handshake is done; throws what a retry cannot change.
asio::awaitable<std::string> start_client_tls(const std::shared_ptr<wire::connection>& connection,
                                              const wire::handshake_deadline& deadline, const std::string& task,
                                              const std::string& address, const transport_options& options) {
  try {
    const auto context = tls_context_for(options);
    co_await connection->start_tls(context, asio::ssl::stream_base::client);
    co_return std::string();
  } catch (const std::system_error& e) {
    if (deadline.expired()) {
      throw error(errc::deadline_exceeded, fmt::format("{} at {} accepted the connection but did not finish the "
                                                       "TLS handshake within {}",
                                                       task, address, options.handshake_timeout));
    }
    if (e.code() == asio::error::eof || e.code() == asio::ssl::error::stream_truncated ||
        e.code() == asio::error::connection_reset) {
      auto why = fmt::format("closed during the TLS handshake: {}", e.code().message());  // at its limit: retried
      connection->close(why);
      co_return why;
    }
    give_up(connection, error(errc::unauthenticated,
                              fmt::format("TLS handshake with {} at {} failed: {} (does it use TLS with a "
                                          "certificate of the same cluster CA?)",
                                          task, address, e.code().message())));
  }
}

// The task's next handshake frame, or why the connection closed first (worth a retry); throws what
// a retry cannot change.
asio::awaitable<std::variant<wire::frame, std::string>> next_handshake_frame(
    const std::shared_ptr<wire::connection>& connection, const wire::handshake_deadline& deadline,
    const std::string& task, const std::string& address, const transport_options& options) {
  std::optional<wire::frame> f;
  std::string why;
  try {
    f = co_await connection->read_frame();
  } catch (const std::system_error& e) {
    why = connection->close_reason().empty() ? e.what() : connection->close_reason();
    connection->close(why);
    // Whatever answers there speaks something else: retrying will not change that.
    if (e.code() == errc::protocol_error && !deadline.expired()) {
      throw error(errc::protocol_error,
                  fmt::format("{} at {} does not answer in pscoro's protocol: {}", task, address, e.what()));
    }
    // In TLS 1.3 the task checks our certificate after our side of the TLS handshake is done: its
    // refusal arrives as an alert on the first read.
    if (e.code().category() == asio::error::get_ssl_category()) {
      throw error(errc::unauthenticated, fmt::format("TLS handshake with {} at {} failed: it refused this "
                                                     "task's certificate: {}",
                                                     task, address, e.code().message()));
    }
  }
  if (deadline.expired()) {
    throw error(errc::deadline_exceeded,
                fmt::format("{} at {} accepted the connection but did not finish the handshake within {}", task,
                            address, options.handshake_timeout));
  }
  if (f) co_return std::move(*f);
  if (why.empty()) why = connection->close_reason().empty() ? "closed during the handshake" : connection->close_reason();
  co_return why;
}

// One attempt: connect, hello, [challenge, proof,] welcome.
asio::awaitable<connect_attempt> try_connect(const std::string& task, const std::string& host, const std::string& port,
                                             wire::Hello hello, const transport_options& options) {
  auto opened = co_await open_socket(host, port);
  if (auto* why = std::get_if<std::string>(&opened)) co_return retry_because(std::move(*why));
  auto& [socket, address] = std::get<reached>(opened);
  const auto connection = std::make_shared<wire::connection>(std::move(socket), handshake_limits_of(options),
                                                             fmt::format("{} at {}", task, address));

  // A task that accepts but does not answer is not retried: something else listens there, or it hangs.
  wire::handshake_deadline deadline(connection, options.handshake_timeout, "no Welcome within the handshake timeout");
  if (uses_tls(options)) {
    if (auto why = co_await start_client_tls(connection, deadline, task, address, options); !why.empty()) {
      co_return retry_because(std::move(why));
    }
  }
  const auto [to_job, to_index] = split_task_name(task);
  hello.set_to_job(to_job);
  hello.set_to_task_index(to_index);
  const bool authenticating = !options.auth_secret.empty();
  if (authenticating) hello.set_nonce(random_nonce());
  wire::frame hello_frame;
  hello_frame.kind = wire::frame_kind::hello;
  *hello_frame.message.mutable_hello() = hello;
  connection->send(std::move(hello_frame));

  auto answer = co_await next_handshake_frame(connection, deadline, task, address, options);
  if (auto* why = std::get_if<std::string>(&answer)) co_return retry_because(std::move(*why));
  bool proved = false;
  if (std::get<wire::frame>(answer).kind == wire::frame_kind::challenge) {
    const auto& challenge = std::get<wire::frame>(answer).message.challenge();
    if (!authenticating) {
      give_up(connection, error(errc::unauthenticated,
                                fmt::format("{} at {} asks for the cluster secret and this task has none: give every "
                                            "task the same secret (PSCORO_AUTH_SECRET_FILE)",
                                            task, address)));
    }
    if (!verify_handshake_proof(options.auth_secret, handshake_side::accepting, hello, challenge,
                                challenge.proof())) {
      give_up(connection,
              error(errc::unauthenticated, fmt::format("{} at {} failed to prove the cluster secret: it holds a "
                                                       "different one, or it is not {}",
                                                       task, address, task)));
    }
    check_identity(connection, task, address, challenge.job(), challenge.task_index());
    wire::frame proof;
    proof.kind = wire::frame_kind::proof;
    proof.message.mutable_proof()->set_proof(
        handshake_proof(options.auth_secret, handshake_side::connecting, hello, challenge));
    connection->send(std::move(proof));
    answer = co_await next_handshake_frame(connection, deadline, task, address, options);
    if (auto* why = std::get_if<std::string>(&answer)) co_return retry_because(std::move(*why));
    proved = true;
  }
  deadline.cancel();
  const auto& welcome_frame = std::get<wire::frame>(answer);
  if (welcome_frame.kind != wire::frame_kind::welcome) {
    give_up(connection, error(errc::protocol_error,
                              fmt::format("{} at {} answered the handshake with something else than a Welcome", task,
                                          address)));
  }
  const auto& w = welcome_frame.message.welcome();
  if (w.status().code() == static_cast<int>(errc::resource_exhausted)) {
    connection->close("handshake refused");
    co_return retry_because(w.status().message());  // at its connection limit: it may have room again soon
  }
  if (w.status().code() != 0) {
    connection->close("handshake refused");
    wire::throw_if_error(w.status(), task);
  }
  if (authenticating && !proved) {
    give_up(connection, error(errc::unauthenticated,
                              fmt::format("{} at {} did not prove the cluster secret: it runs without one; give every "
                                          "task the same secret",
                                          task, address)));
  }
  check_identity(connection, task, address, w.job(), w.task_index());
  connection->set_limits(limits_of(options));
  connection->count_traffic(&metrics::traffic_of(task));
  co_return connect_attempt{connection, {}};
}

}  // namespace

asio::awaitable<std::shared_ptr<wire::connection>> connect_to_task(std::string task, std::string address,
                                                                   wire::Hello hello, transport_options options) {
  const auto [host, port] = common::split_address(address, task);
  const auto deadline = std::chrono::steady_clock::now() + options.connect_timeout;
  auto backoff = std::chrono::milliseconds(10);
  asio::steady_timer timer(co_await asio::this_coro::executor);
  for (int attempt = 1;; ++attempt) {
    auto tried = co_await try_connect(task, host, port, hello, options);
    if (tried.connection) co_return std::move(tried.connection);
    const auto& why = tried.retry_reason;
    if (std::chrono::steady_clock::now() + backoff >= deadline) {
      throw error(errc::unavailable, fmt::format("cannot reach {} at {} within {} ({} attempts): {}", task, address,
                                                 options.connect_timeout, attempt, why));
    }
    if (attempt == 1 || attempt % 20 == 0) log::debug("waiting for {} at {}: {}", task, address, why);
    timer.expires_after(backoff);
    co_await timer.async_wait(as_tuple(use_awaitable));
    backoff = std::min<std::chrono::milliseconds>(backoff * 3 / 2, std::chrono::seconds(1));
  }
}

void peer::close(const std::string& reason) {
  closing_ = true;
  if (connection_) connection_->close(reason);
  closing_ = false;
  // Waiters hold what holds this peer: left waiting, they would never be freed.
  if (auto attempt = std::exchange(connecting_, nullptr)) {
    attempt->finish(std::make_exception_ptr(
        remote_error(make_error_code(errc::unavailable), task_, fmt::format("connection to {} closed: {}", task_, reason))));
  }
}

void peer::wake_waiters() {
  if (!connecting_) return;
  // Set the old event after the swap: a woken waiter that waits on goes to the fresh one.
  const auto woken = std::exchange(connecting_->changed, std::make_shared<detail::async_event>(executor_));
  woken->set();
}

asio::awaitable<std::shared_ptr<wire::connection>> peer::get() {
  for (;;) {
    if (failure_) std::rethrow_exception(failure_);
    if (auto open = connection()) co_return open;
    if (!connecting_) {
      connecting_ = std::make_shared<connect_attempt>(executor_);
      // Detached: the attempt serves every waiter, whichever of them stops waiting.
      asio::co_spawn(executor_, run_attempt(this, lifetime_, connecting_, task_, address_, hello_, options_),
                     asio::detached);
    }
    const auto attempt = connecting_;
    const auto changed = attempt->changed;
    co_await changed->async_wait(use_awaitable);
    if (attempt->finished) {
      if (attempt->error) std::rethrow_exception(attempt->error);
      continue;
    }
    // Woken while the attempt goes on: stop waiting if this caller's closure was cancelled.
    if ((co_await asio::this_coro::cancellation_state).cancelled() != asio::cancellation_type::none) {
      throw detail::closure_cancelled();
    }
  }
}

asio::awaitable<void> peer::run_attempt(peer* self, std::weak_ptr<void> alive,
                                        std::shared_ptr<connect_attempt> attempt, std::string task,
                                        std::string address, wire::Hello hello, transport_options options) {
  // The peer may be gone by the time this starts (it is posted) and when connecting ends: `self`
  // is touched only while `alive` says it lives.
  std::shared_ptr<wire::connection> fresh;
  std::exception_ptr failure;
  try {
    fresh = co_await connect_to_task(task, address, hello, options);
  } catch (...) {
    failure = std::current_exception();
  }
  if (alive.expired() || self->connecting_ != attempt) {  // close() gave up on this attempt, or the peer is gone
    if (fresh) fresh->close("the peer was closed while connecting");
    if (!attempt->finished) {
      attempt->finish(std::make_exception_ptr(remote_error(make_error_code(errc::unavailable), task,
                                                           fmt::format("connection to {} closed", task))));
    }
    co_return;
  }
  self->connecting_ = nullptr;
  if (fresh) self->adopt(std::move(fresh));
  attempt->finish(failure);
}

void peer::adopt(std::shared_ptr<wire::connection> fresh) {
  // The handler may outlive this peer: it holds only the callback and a flag's owner.
  fresh->start(nullptr, [this, alive = std::weak_ptr<void>(lifetime_)](const std::string& reason) {
    if (alive.expired() || closing_ || !on_lost_) return;
    on_lost_(reason);
  });
  if (on_heartbeat_reply_) fresh->on_heartbeat_reply(on_heartbeat_reply_);
  fresh->start_heartbeat(options_.heartbeat_interval, options_.heartbeat_timeout);
  connection_ = std::move(fresh);
}

asio::awaitable<std::shared_ptr<wire::connection>> peer::connect_once() {
  if (auto open = connection()) co_return open;
  if (connecting_ || failure_) co_return nullptr;
  const auto [host, port] = common::split_address(address_, task_);
  auto tried = co_await try_connect(task_, host, port, hello_, options_);
  if (!tried.connection || connection()) co_return connection();
  adopt(std::move(tried.connection));
  co_return connection_;
}

asio::awaitable<wire::frame> peer::call(wire::frame request, std::vector<wire::segment_target> receive_into) {
  // In a closure the chief has cancelled, no new operation starts (this_closure::check_cancelled,
  // inlined: no coroutine frame for the common case).
  if ((co_await asio::this_coro::cancellation_state).cancelled() != asio::cancellation_type::none) {
    throw detail::closure_cancelled();
  }
  // A task we cannot reach is the origin of the failure: whoever gets it (the chief, from a worker
  // function) can tell a lost ps from a failing worker without reading the message.
  std::shared_ptr<wire::connection> connection;
  try {
    connection = co_await get();
  } catch (const remote_error&) {
    throw;
  } catch (const error& e) {
    if (e.code() != errc::unavailable) throw;
    throw remote_error(e.code(), task_, e.what());
  }
  auto [ec, response] =
      co_await connection->async_call(std::move(request), std::move(receive_into), as_tuple(use_awaitable));
  if (ec) {
    throw remote_error(make_error_code(errc::unavailable), task_,
                       fmt::format("connection to {} lost: {}", connection->peer(), connection->close_reason()));
  }
  wire::throw_if_error(response.message.response().status(), task_);
  co_return std::move(response);
}

}  // namespace pscoro::net

// What the fuzz targets share: frames built with the library's own encoder, a loopback socket
// pair, and a live ps or worker (a real pscoro::server on 127.0.0.1) fed raw bytes through a real
// connection, then asked a well-formed question to prove it is still alive.
//
// Everything runs on one io_context driven by the fuzzing thread, one input at a time. A broken
// invariant (a hang, a server that no longer answers) aborts with a message, which libFuzzer and
// the replay driver report as a crash.
#pragma once

#include <pscoro/cluster_spec.hpp>
#include <pscoro/server.hpp>

#include "wire/frame.hpp"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

namespace pscoro::fuzz {

[[noreturn]] inline void broken(const std::string& what) {
  std::fprintf(stderr, "fuzz invariant broken: %s\n", what.c_str());
  std::abort();
}

/// Quiet servers: at fuzzing speed their info lines would be all the output.
inline void quiet_logs() { ::setenv("PSCORO_LOG_LEVEL", "error", 0); }

/// A frame as it goes on the wire: fixed header, protobuf, segments.
inline std::string wire_bytes(wire::frame f) {
  auto encoded = wire::encode(std::move(f));
  std::string out = std::move(encoded.head);
  for (const auto& segment : encoded.segments) {
    out.append(reinterpret_cast<const char*>(segment.data()), segment.size());
  }
  return out;
}

/// The chief's Hello to `to_job`:0 in `session`.
inline wire::frame hello(std::string to_job, std::uint64_t session) {
  wire::frame f;
  f.kind = wire::frame_kind::hello;
  auto* h = f.message.mutable_hello();
  h->set_protocol_version(wire::protocol_version);
  h->set_job("chief");
  h->set_task_index(0);
  h->set_incarnation(0x5eed0000u + session);
  h->set_session(session);
  h->set_to_job(std::move(to_job));
  h->set_to_task_index(0);
  return f;
}

inline wire::frame heartbeat(std::uint64_t request_id) {
  wire::frame f;
  f.kind = wire::frame_kind::request;
  f.request_id = request_id;
  f.message.mutable_request()->mutable_heartbeat();
  return f;
}

/// Runs `io` until `done` is true; a run past `deadline` is a hang, and aborts.
inline void run_until(asio::io_context& io, const bool& done, const char* what,
                      std::chrono::seconds deadline = std::chrono::seconds(20)) {
  const auto until = std::chrono::steady_clock::now() + deadline;
  io.restart();
  while (!done) {
    if (std::chrono::steady_clock::now() > until) broken(std::string(what) + ": no end within the deadline (a hang)");
    io.run_one_for(std::chrono::milliseconds(100));
  }
  io.poll();  // what the finished work left ready (a server closing its side)
}

/// Runs `work` on `io` until it finishes (see run_until); rethrows its exception.
inline void run(asio::io_context& io, asio::awaitable<void> work, const char* what,
                std::chrono::seconds deadline = std::chrono::seconds(20)) {
  bool done = false;
  std::exception_ptr failure;
  asio::co_spawn(io, std::move(work), [&](std::exception_ptr e) {
    failure = e;
    done = true;
  });
  run_until(io, done, what, deadline);
  if (failure) std::rethrow_exception(failure);
}

/// Two ends of a fresh loopback TCP connection.
struct socket_pair {
  asio::ip::tcp::socket client;
  asio::ip::tcp::socket server;
};

class loopback {
 public:
  loopback() : acceptor_(io_, {asio::ip::make_address("127.0.0.1"), 0}) {}
  asio::io_context& io() noexcept { return io_; }

  socket_pair connect() {
    socket_pair pair{asio::ip::tcp::socket(io_), asio::ip::tcp::socket(io_)};
    // libFuzzer's timeout watchdog is a SIGALRM: a blocking call it lands in fails with EINTR (seen
    // once in 610,000 runs), which is the harness's to retry, not a finding.
    std::error_code ec;
    do {
      pair.client.close(ec);
      pair.client.connect(acceptor_.local_endpoint(), ec);
    } while (ec == asio::error::interrupted);
    if (ec) throw std::system_error(ec, "loopback connect");
    do {
      acceptor_.accept(pair.server, ec);
    } while (ec == asio::error::interrupted);
    if (ec) throw std::system_error(ec, "loopback accept");
    return pair;
  }

 private:
  asio::io_context io_;
  asio::ip::tcp::acceptor acceptor_;
};

/// A ps or worker server on 127.0.0.1 with small limits, so that anything a peer makes it hold
/// beyond them shows as a large allocation (scripts/run.sh fuzz runs with -malloc_limit_mb).
class live_server {
 public:
  live_server(const std::string& job, const std::function<void(server&)>& configure = {})
      : job_(job), configure_(configure) {
    quiet_logs();
    start();
  }
  ~live_server() {
    server_->stop();
    io_.restart();
    io_.poll();
  }

  /// Sends `bytes` on a fresh connection, after a valid Hello of a new session if `with_hello`,
  /// closes the sending side and reads until the server closes the connection.
  void feed(std::string_view bytes, bool with_hello) {
    std::string sent = with_hello ? wire_bytes(hello(job_, ++session_)) : std::string();
    sent.append(bytes);
    run(io_, exchange(std::move(sent)), "a connection fed fuzz bytes");
  }

  /// A fresh connection with a valid Hello of a new session and a Heartbeat gets an ok Welcome and
  /// an ok response; anything else aborts. A server the chief ended the job on (a Shutdown after the
  /// chief's Hello: it obeys, as it must) is replaced by a fresh one first, which must answer.
  void check_alive() {
    if (ended_) {
      if (verbose_) std::fprintf(stderr, "  the chief ended the job: a fresh server takes over\n");
      server_->stop();
      io_.restart();
      io_.poll();
      start();
    }
    run(io_, ask_heartbeat(hello(job_, ++session_)), "the check that the server answers");
  }

 private:
  void start() {
    cluster_spec spec;
    spec.add_task("chief", 0, "127.0.0.1:1");
    spec.add_task("ps", 0, "127.0.0.1:0");
    spec.add_task("worker", 0, "127.0.0.1:0");
    server_options options;
    options.transport.max_header_bytes = 1u << 20;
    options.transport.max_payload_bytes = 1u << 20;
    options.transport.max_handshake_bytes = 64u << 10;
    options.max_variable_bytes = 16u << 20;
    options.max_ps_bytes = 64u << 20;
    // A ps runs kernels of 4 KiB and more on its kernel thread (the default 1 MiB is out of reach of
    // a 4 KiB input but for an initializer), so that lanes, the hand-off back to the executor and a
    // session ending under a running kernel are fuzzed too (seed kernel_pool; docs/design.md).
    options.ps_kernel_offload_bytes = 4u << 10;
    options.on_shutdown = [this](int) { ended_ = true; };
    ended_ = false;
    server_.reset();
    server_ = std::make_unique<server>(io_.get_executor(), simple_cluster_resolver(spec, job_, 0), options);
    if (configure_) configure_(*server_);
    server_->start();
    endpoint_ = {asio::ip::make_address("127.0.0.1"), server_->port()};
  }

  asio::awaitable<void> exchange(std::string bytes) {
    asio::ip::tcp::socket socket(io_);
    co_await socket.async_connect(endpoint_, asio::use_awaitable);
    auto [write_error, written] =
        co_await asio::async_write(socket, asio::buffer(bytes), asio::experimental::as_tuple(asio::use_awaitable));
    (void)written;
    std::error_code ignored;
    if (!write_error) socket.shutdown(asio::ip::tcp::socket::shutdown_send, ignored);
    // Whatever the server answers, until it closes (EOF or reset); PSCORO_FUZZ_VERBOSE=1 prints
    // it, to see how far a seed gets.
    wire::frame_reader reader(wire::frame_limits{});
    try {
      while (auto answer = co_await reader.read(socket)) {
        if (verbose_) std::fprintf(stderr, "  answer %llu: %s\n", static_cast<unsigned long long>(answer->request_id),
                                   answer->message.ShortDebugString().c_str());
      }
    } catch (const std::exception& e) {
      if (verbose_) std::fprintf(stderr, "  the connection ended: %s\n", e.what());
    }
  }

  asio::awaitable<void> ask_heartbeat(wire::frame hello_frame) {
    asio::ip::tcp::socket socket(io_);
    co_await socket.async_connect(endpoint_, asio::use_awaitable);
    const std::string bytes = wire_bytes(std::move(hello_frame)) + wire_bytes(heartbeat(7));
    co_await asio::async_write(socket, asio::buffer(bytes), asio::use_awaitable);
    wire::frame_reader reader(wire::frame_limits{});
    auto welcome = co_await reader.read(socket);
    if (!welcome || welcome->kind != wire::frame_kind::welcome ||
        welcome->message.welcome().status().code() != 0) {
      broken("a valid Hello after fuzz input was not welcomed: " +
             (welcome ? welcome->message.ShortDebugString() : std::string("the server closed the connection")));
    }
    auto response = co_await reader.read(socket);
    if (!response || response->kind != wire::frame_kind::response || response->request_id != 7 ||
        response->message.response().status().code() != 0) {
      broken("a Heartbeat after fuzz input was not answered ok: " +
             (response ? response->message.ShortDebugString() : std::string("the server closed the connection")));
    }
  }

  std::string job_;
  std::function<void(server&)> configure_;
  asio::io_context io_;
  std::unique_ptr<server> server_;
  bool ended_ = false;  // the chief's Shutdown stopped server_
  asio::ip::tcp::endpoint endpoint_;
  std::uint64_t session_ = 0;
  bool verbose_ = std::getenv("PSCORO_FUZZ_VERBOSE") != nullptr;
};

}  // namespace pscoro::fuzz

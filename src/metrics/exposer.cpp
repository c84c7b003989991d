// A small HTTP/1.x responder for GET /metrics, the page (GET /) and its JSON document
// (GET /api/cluster) on an io_context and thread of its own. It reads one
// request head (at most 8 KiB, within the timeout), answers it, and closes: a scrape every few
// seconds needs no keep-alive, and one exchange per connection keeps the state to a socket and a
// timer. Anything it cannot take gets a short status line and the connection closed.
#include <pscoro/metrics.hpp>

#include "common/address.hpp"
#include "metrics/cluster_view.hpp"
#include "metrics/http.hpp"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/read_until.hpp>
#include <asio/steady_timer.hpp>
#include <asio/streambuf.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <thread>

namespace pscoro::metrics {

namespace {

using asio::experimental::as_tuple;
using asio::use_awaitable;
using asio::ip::tcp;

constexpr std::size_t max_head_bytes = 8 * 1024;
constexpr std::size_t max_connections = 64;

bool token_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

}  // namespace

http_reply answer_http(std::string_view head) {
  const auto end = head.find("\r\n");
  const auto line = head.substr(0, end);
  const auto first = line.find(' ');
  const auto second = first == std::string_view::npos ? first : line.find(' ', first + 1);
  if (second == std::string_view::npos || line.find(' ', second + 1) != std::string_view::npos) {
    return {"400 Bad Request", "400 Bad Request: expected 'GET /metrics HTTP/1.1'\n"};
  }
  const auto method = line.substr(0, first);
  const auto target = line.substr(first + 1, second - first - 1);
  const auto version = line.substr(second + 1);
  if (method.empty() || !std::all_of(method.begin(), method.end(), token_char) ||
      (version != "HTTP/1.1" && version != "HTTP/1.0") || target.empty() || target.front() != '/') {
    return {"400 Bad Request", "400 Bad Request: expected 'GET /metrics HTTP/1.1'\n"};
  }
  if (method != "GET") {
    return {"405 Method Not Allowed", "405 Method Not Allowed: only GET /, /api/cluster and /metrics\n",
            resource::none, true};
  }
  const auto path = target.substr(0, target.find('?'));
  if (path == "/metrics") return {"200 OK", {}, resource::metrics};
  if (path == "/") return {"200 OK", {}, resource::page};
  if (path == "/api/cluster") return {"200 OK", {}, resource::cluster};
  return {"404 Not Found", "404 Not Found: only /, /api/cluster and /metrics\n"};
}

struct exposer::impl {
  registry& served;
  std::chrono::milliseconds timeout;
  asio::io_context io{1};
  tcp::acceptor acceptor{io};
  std::size_t active = 0;  // connections being served (on the thread only)
  std::thread thread;

  impl(registry& r, std::chrono::milliseconds t) : served(r), timeout(t) {}

  static asio::awaitable<void> accept_loop(impl* self) {
    for (;;) {
      auto [ec, socket] = co_await self->acceptor.async_accept(as_tuple(use_awaitable));
      if (ec == asio::error::operation_aborted || !self->acceptor.is_open()) co_return;
      if (ec) {
        // Out of descriptors, say: wait a little rather than spin.
        asio::steady_timer pause(self->io, std::chrono::milliseconds(100));
        co_await pause.async_wait(as_tuple(use_awaitable));
        continue;
      }
      if (self->active >= max_connections) {
        std::error_code ignored;
        socket.close(ignored);
        continue;
      }
      ++self->active;
      // Counted back whichever way serve() ends (an exception, such as bad_alloc building the
      // page, ends only that connection).
      asio::co_spawn(self->io, serve(self, std::make_shared<tcp::socket>(std::move(socket))),
                     [self](std::exception_ptr) { --self->active; });
    }
  }

  static asio::awaitable<void> serve(impl* self, std::shared_ptr<tcp::socket> socket) {
    // The whole exchange within the timeout: a client that sends or reads slowly is dropped.
    asio::steady_timer deadline(self->io, self->timeout);
    deadline.async_wait([socket](std::error_code ec) {
      std::error_code ignored;
      if (!ec) socket->close(ignored);
    });
    std::string head;
    auto [ec, n] = co_await asio::async_read_until(*socket, asio::dynamic_buffer(head, max_head_bytes), "\r\n\r\n",
                                                  as_tuple(use_awaitable));
    http_reply r;
    if (ec == asio::error::not_found) {
      r = {"400 Bad Request", fmt::format("400 Bad Request: the request head exceeds {} bytes\n", max_head_bytes)};
    } else if (!ec) {
      r = answer_http(std::string_view(head).substr(0, n));
    }
    if (!ec || ec == asio::error::not_found) {
      std::string_view type = "text/plain; charset=utf-8";
      switch (r.served) {
        case resource::none: break;
        case resource::metrics:
          r.body = self->served.expose();
          type = "text/plain; version=0.0.4; charset=utf-8";
          break;
        case resource::page:
          r.body = page_html();
          type = "text/html; charset=utf-8";
          break;
        case resource::cluster:
          // Messages of the log may hold bytes a peer sent: invalid UTF-8 becomes U+FFFD.
          r.body = process_view()
                       .document(self->served, std::chrono::system_clock::now(), std::chrono::steady_clock::now())
                       .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
          type = "application/json";
          break;
      }
      // The page and its document change every second: a cache must not keep them.
      auto response = fmt::format(
          "HTTP/1.1 {}\r\nContent-Type: {}\r\nContent-Length: {}\r\n{}{}Connection: close\r\n\r\n", r.status, type,
          r.body.size(), r.allow_get ? "Allow: GET\r\n" : "",
          r.served == resource::page || r.served == resource::cluster ? "Cache-Control: no-store\r\n" : "");
      response += r.body;
      (void)co_await asio::async_write(*socket, asio::buffer(response), as_tuple(use_awaitable));
      std::error_code ignored;
      socket->shutdown(tcp::socket::shutdown_send, ignored);
    }
    deadline.cancel();
    std::error_code ignored;
    socket->close(ignored);
  }
};

exposer::exposer(const std::string& address, registry& served, std::chrono::milliseconds timeout)
    : impl_(std::make_unique<impl>(served, timeout)) {
  const auto [host, port] = common::split_address(address, "metrics");
  tcp::resolver resolver(impl_->io);
  std::error_code ec;
  const auto found = resolver.resolve(host, port, tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (ec || found.empty()) {
    throw std::system_error(ec ? ec : make_error_code(asio::error::host_not_found),
                            fmt::format("metrics cannot listen on {}", address));
  }
  const tcp::endpoint endpoint = found.begin()->endpoint();
  auto& acceptor = impl_->acceptor;
  acceptor.open(endpoint.protocol());
  acceptor.set_option(tcp::acceptor::reuse_address(true));
  acceptor.bind(endpoint, ec);
  if (ec) throw std::system_error(ec, fmt::format("metrics cannot listen on {}", address));
  acceptor.listen(asio::socket_base::max_listen_connections);
  asio::co_spawn(impl_->io, impl::accept_loop(impl_.get()), asio::detached);
  impl_->thread = std::thread([this] { impl_->io.run(); });
}

exposer::~exposer() {
  impl_->io.stop();
  impl_->thread.join();
}

std::uint16_t exposer::port() const noexcept {
  std::error_code ec;
  return impl_->acceptor.local_endpoint(ec).port();
}

std::string exposer::address() const {
  std::error_code ec;
  return common::format_address(impl_->acceptor.local_endpoint(ec));
}

}  // namespace pscoro::metrics

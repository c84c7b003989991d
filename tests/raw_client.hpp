// What a hostile or broken peer can do, for tests: a blocking client that speaks raw bytes to a
// server (whole frames, parts of frames, or garbage) and reads what it answers, and a stranger
// that dials a task through the real handshake and reports how it was refused.
#pragma once

#include "net/peer.hpp"
#include "test_support.hpp"
#include "wire/connection.hpp"
#include "wire/frame.hpp"

#include <asio/co_spawn.hpp>
#include <asio/connect.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/io_context.hpp>
#include <asio/read.hpp>
#include <asio/use_future.hpp>
#include <asio/write.hpp>

#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace pscoro::testing {

// A blocking client socket to `address` whose reads give up after a generous 30 s. With
// `receive_buffer_bytes`, its receive buffer is that small (set before it connects: the window it
// offers), so a server's long answers wait in the server until the client reads them.
struct raw_client {
  asio::io_context io;
  asio::ip::tcp::socket socket{io};

  explicit raw_client(const std::string& address, int receive_buffer_bytes = 0) {
    const auto colon = address.rfind(':');
    const asio::ip::tcp::endpoint endpoint{asio::ip::make_address(address.substr(0, colon)),
                                           static_cast<unsigned short>(std::stoi(address.substr(colon + 1)))};
    socket.open(endpoint.protocol());
    if (receive_buffer_bytes > 0) socket.set_option(asio::socket_base::receive_buffer_size(receive_buffer_bytes));
    socket.connect(endpoint);
    timeval timeout{30, 0};
    ::setsockopt(socket.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  }

  void send(std::string_view bytes) { asio::write(socket, asio::buffer(bytes)); }
  void send(const wire::encoded_frame& f) {
    send(f.head);
    for (const auto& s : f.segments) asio::write(socket, asio::buffer(s.data(), s.size()));
  }

  // The next frame the server sends: one without segments (as in a handshake), or with
  // `drop_payload` any frame, its segments read and dropped. Fails the test when the connection
  // closes or times out first.
  wire::frame read_frame(bool drop_payload = false) {
    std::array<std::byte, wire::fixed_header_size> fixed;
    asio::read(socket, asio::buffer(fixed));
    const auto header = wire::parse_fixed_header(fixed, {});
    if (!drop_payload) REQUIRE(header.payload_bytes == 0);
    std::string body(header.header_bytes, '\0');
    asio::read(socket, asio::buffer(body));
    std::vector<char> dropped(std::min<std::uint64_t>(header.payload_bytes, 1 << 16));
    for (std::uint64_t left = header.payload_bytes; left > 0;) {
      left -= asio::read(socket, asio::buffer(dropped.data(), std::min<std::uint64_t>(left, dropped.size())));
    }
    wire::frame f;
    f.kind = header.kind;
    f.request_id = header.request_id;
    REQUIRE(f.message.ParseFromString(body));
    return f;
  }

  // Everything the server sends until it closes the connection; fails the test on a timeout.
  std::string read_until_closed() {
    std::string received;
    char chunk[4096];
    for (;;) {
      std::error_code ec;
      const auto n = socket.read_some(asio::buffer(chunk), ec);
      received.append(chunk, n);
      if (ec == asio::error::eof || ec == asio::error::connection_reset) return received;
      if (ec == asio::error::would_block || ec == asio::error::try_again) {
        FAIL("the server did not close the connection within 30 s");
        return received;
      }
      if (ec) return received;
    }
  }
};

inline std::string as_string(const wire::encoded_frame& f) {
  std::string out = f.head;
  for (const auto& s : f.segments) out.append(reinterpret_cast<const char*>(s.data()), s.size());
  return out;
}

inline std::string fixed_header(wire::frame_kind kind, std::uint32_t header_bytes, std::uint64_t payload_bytes,
                                std::uint16_t version = wire::protocol_version, std::uint16_t raw_kind = 0) {
  auto bytes = wire::encode_fixed_header({kind, 1, header_bytes, payload_bytes});
  if (version != wire::protocol_version) std::memcpy(bytes.data() + 4, &version, 2);
  if (raw_kind) std::memcpy(bytes.data() + 6, &raw_kind, 2);
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

// The refusal the server sent: the Welcome's status message, or "" if it sent none.
inline std::string refusal(const std::string& received) {
  if (received.size() < wire::fixed_header_size) return "";
  const auto header = wire::parse_fixed_header(
      std::span<const std::byte, wire::fixed_header_size>(reinterpret_cast<const std::byte*>(received.data()),
                                                          wire::fixed_header_size),
      {});
  wire::FrameHeader message;
  REQUIRE(message.ParseFromArray(received.data() + wire::fixed_header_size, static_cast<int>(header.header_bytes)));
  REQUIRE(message.has_welcome());
  CHECK(message.welcome().status().code() != 0);
  return message.welcome().status().message();
}

/// A Hello of `job` in coordinator session `session` (also its incarnation).
inline wire::Hello hello_of(const std::string& job, std::uint64_t session) {
  return net::make_hello({job, 0, session}, session);
}

/// How a connection attempt ended: its error code and what it said (nothing: it connected).
struct dial_outcome {
  std::error_code code;
  std::string text;
};

/// Dials `task` at `address` with `hello` and `transport` (retrying for at most 5 s) and returns
/// how it was refused.
inline asio::awaitable<dial_outcome> refusal_of(std::string task, std::string address, wire::Hello hello,
                                           transport_options transport) {
  transport.connect_timeout = std::min<std::chrono::milliseconds>(transport.connect_timeout, std::chrono::seconds(5));
  try {
    auto c = co_await net::connect_to_task(task, address, hello, transport);
    c->close("done");
  } catch (const error& e) {
    co_return dial_outcome{e.code(), e.what()};
  }
  co_return dial_outcome{};
}

/// Sends `request` to `task` at `address` through the real transport after the handshake `hello`
/// (a chief's of some session, a worker's, ...) and returns the whole response. Fails the test
/// when the call itself fails (the connection lost before an answer).
inline wire::frame call_task(std::string task, std::string address, wire::frame request, wire::Hello hello) {
  asio::io_context io;
  const transport_options options;
  auto answer = asio::co_spawn(
      io,
      [&]() -> asio::awaitable<wire::frame> {
        auto connection = co_await net::connect_to_task(task, address, hello, options);
        connection->start(nullptr, nullptr);
        auto [ec, reply] =
            co_await connection->async_call(std::move(request), asio::experimental::as_tuple(asio::use_awaitable));
        REQUIRE_FALSE(ec);
        connection->close("done");
        co_return std::move(reply);
      },
      asio::use_future);
  io.run();
  return answer.get();
}

}  // namespace pscoro::testing

// Bad input on the wire: each case is sent to a real ps over loopback by a raw socket. The server
// must refuse it (with a reason, where it can), close that connection, and keep serving others.
#include "local_cluster.hpp"
#include "test_support.hpp"
#include "wire/frame.hpp"

#include <asio/connect.hpp>
#include <fmt/format.h>
#include <asio/read.hpp>
#include <asio/write.hpp>

#include <sys/socket.h>

#include <thread>

#include <cstring>

using namespace pscoro;
using pscoro::testing::local_cluster;

namespace {

// Short enough that the silent-peer case ends soon, long enough that a loaded machine still reads a
// well-formed Hello before it.
server_options short_handshake() {
  server_options options;
  options.transport.handshake_timeout = std::chrono::seconds(2);
  options.transport.max_header_bytes = 1 << 16;
  return options;
}

// A blocking client socket to `address` whose reads give up after a generous 30 s.
struct raw_client {
  asio::io_context io;
  asio::ip::tcp::socket socket{io};

  explicit raw_client(const std::string& address) {
    const auto colon = address.rfind(':');
    socket.connect({asio::ip::make_address(address.substr(0, colon)),
                    static_cast<unsigned short>(std::stoi(address.substr(colon + 1)))});
    timeval timeout{30, 0};
    ::setsockopt(socket.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  }

  void send(std::string_view bytes) { asio::write(socket, asio::buffer(bytes)); }
  void send(const wire::encoded_frame& f) {
    send(f.head);
    for (const auto& s : f.segments) asio::write(socket, asio::buffer(s.data(), s.size()));
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

std::string as_string(const wire::encoded_frame& f) {
  std::string out = f.head;
  for (const auto& s : f.segments) out.append(reinterpret_cast<const char*>(s.data()), s.size());
  return out;
}

wire::encoded_frame hello_frame(std::string job = "chief", std::uint32_t version = wire::protocol_version) {
  wire::frame f;
  f.kind = wire::frame_kind::hello;
  auto* hello = f.message.mutable_hello();
  hello->set_protocol_version(version);
  hello->set_job(std::move(job));
  hello->set_session(1);
  return wire::encode(std::move(f));
}

std::string fixed_header(wire::frame_kind kind, std::uint32_t header_bytes, std::uint64_t payload_bytes,
                         std::uint16_t version = wire::protocol_version, std::uint16_t raw_kind = 0) {
  auto bytes = wire::encode_fixed_header({kind, 1, header_bytes, payload_bytes});
  if (version != wire::protocol_version) std::memcpy(bytes.data() + 4, &version, 2);
  if (raw_kind) std::memcpy(bytes.data() + 6, &raw_kind, 2);
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

// The refusal the server sent: the Welcome's status message, or "" if it sent none.
std::string refusal(const std::string& received) {
  if (received.size() < wire::fixed_header_size) return "";
  const auto header = wire::parse_fixed_header(
      std::span<const std::byte, wire::fixed_header_size>(reinterpret_cast<const std::byte*>(received.data()),
                                                          wire::fixed_header_size),
      {});
  wire::Frame message;
  REQUIRE(message.ParseFromArray(received.data() + wire::fixed_header_size, static_cast<int>(header.header_bytes)));
  REQUIRE(message.has_welcome());
  CHECK(message.welcome().status().code() != 0);
  return message.welcome().status().message();
}

// The ps still works for a well-behaved coordinator.
void check_still_serving(local_cluster& cluster) {
  cluster.run_chief([](parameter_server_strategy& strategy, cluster_coordinator&) -> asio::awaitable<void> {
    const xt::xarray<float> initial{1, 2};
    auto v = co_await strategy.scope().create_variable("still_serving", initial);
    CHECK((co_await v.read() == initial));
  });
}

}  // namespace

TEST_CASE("bad input closes only that connection, with a reason") {
  local_cluster cluster(1, 1, {}, short_handshake());
  const auto ps = cluster.spec.task_address("ps", 0);

  SUBCASE("wrong magic") {
    raw_client c(ps);
    c.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n.....");
    CHECK(contains(refusal(c.read_until_closed()), "bad magic"));
  }
  SUBCASE("wrong version in the frame header") {
    raw_client c(ps);
    c.send(fixed_header(wire::frame_kind::hello, 0, 0, 1));
    CHECK(contains(refusal(c.read_until_closed()), "unsupported protocol version 1 (this build speaks version 2)"));
  }
  SUBCASE("wrong version in the Hello") {
    raw_client c(ps);
    c.send(hello_frame("chief", 7));
    CHECK(contains(refusal(c.read_until_closed()), "Hello speaks protocol version 7"));
  }
  SUBCASE("unknown frame kind") {
    raw_client c(ps);
    c.send(fixed_header(wire::frame_kind::hello, 0, 0, wire::protocol_version, 77));
    CHECK(contains(refusal(c.read_until_closed()), "unknown frame kind 77"));
  }
  SUBCASE("oversized frame") {
    raw_client c(ps);
    c.send(fixed_header(wire::frame_kind::hello, 1 << 20, 0));
    CHECK(contains(refusal(c.read_until_closed()), "exceeds the limit of 65536 bytes"));
  }
  SUBCASE("oversized payload") {
    raw_client c(ps);
    c.send(fixed_header(wire::frame_kind::hello, 0, std::uint64_t{1} << 40));
    CHECK(contains(refusal(c.read_until_closed()), "frame payload of 1099511627776 bytes exceeds the limit"));
  }
  SUBCASE("unparsable protobuf header") {
    raw_client c(ps);
    c.send(fixed_header(wire::frame_kind::hello, 6, 0) + "\xff\xff\xff\xff\xff\xff");
    CHECK(contains(refusal(c.read_until_closed()), "unparsable 6-byte frame header"));
  }
  SUBCASE("truncated frame") {
    raw_client c(ps);
    const auto hello = as_string(hello_frame());
    c.send(hello.substr(0, hello.size() - 2));
    c.socket.shutdown(asio::ip::tcp::socket::shutdown_send);
    CHECK(contains(refusal(c.read_until_closed()), "truncated frame"));
  }
  SUBCASE("a request before the handshake") {
    raw_client c(ps);
    wire::frame f;
    f.kind = wire::frame_kind::request;
    f.message.mutable_request()->mutable_read_variable();
    c.send(wire::encode(std::move(f)));
    CHECK(contains(refusal(c.read_until_closed()), "the first frame must be a Hello"));
  }
  SUBCASE("a peer that connects and says nothing") {
    raw_client c(ps);
    CHECK(c.read_until_closed().empty());  // closed at the handshake deadline, no Welcome
  }
  SUBCASE("garbage after a good handshake") {
    raw_client c(ps);
    c.send(hello_frame());
    c.send("this is not a frame at all, not even close....");
    const auto received = c.read_until_closed();
    // A Welcome (ok), then the close.
    REQUIRE(received.size() > wire::fixed_header_size);
  }
  check_still_serving(cluster);
}

TEST_CASE("a worker refuses connections from other workers") {
  local_cluster cluster(1, 1, {}, short_handshake());
  raw_client c(cluster.spec.task_address("worker", 0));
  c.send(hello_frame("worker"));
  CHECK(contains(refusal(c.read_until_closed()), "worker:0 does not accept connections from 'worker' tasks"));
  check_still_serving(cluster);
}

TEST_CASE("a task that accepts but never answers the handshake is deadline_exceeded") {
  asio::io_context io;
  asio::ip::tcp::acceptor silent(io, {asio::ip::address_v4::loopback(), 0});
  const auto address = fmt::format("127.0.0.1:{}", silent.local_endpoint().port());
  cluster_spec spec{{"ps", {address}}, {"worker", {address}}};
  strategy_options options;
  options.transport.handshake_timeout = std::chrono::milliseconds(200);
  const auto e = pscoro::testing::connect_failure(spec, options);
  CHECK(e.code() == errc::deadline_exceeded);
  CHECK(contains(e.what(), "accepted the connection but sent no Welcome"));
}

TEST_CASE("a task address where something else answers fails at once with protocol_error") {
  asio::io_context io;
  asio::ip::tcp::acceptor impostor(io, {asio::ip::address_v4::loopback(), 0});
  const auto address = fmt::format("127.0.0.1:{}", impostor.local_endpoint().port());
  std::thread answer([&] {
    auto s = impostor.accept();
    asio::write(s, asio::buffer(std::string_view("HTTP/1.1 400 Bad Request\r\n\r\n.....")));
  });
  cluster_spec spec{{"ps", {address}}, {"worker", {address}}};
  const auto e = pscoro::testing::connect_failure(spec, {});  // default: would retry for 3 minutes
  answer.join();
  CHECK(e.code() == errc::protocol_error);
  CHECK(contains(e.what(), "does not answer in pscoro's protocol: bad magic"));
}

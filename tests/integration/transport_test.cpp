// Bad input on the wire: each case is sent to a real ps over loopback by a raw socket. The server
// must refuse it (with a reason, where it can), close that connection, and keep serving others.
#include "local_cluster.hpp"
#include "raw_client.hpp"
#include "wire/values.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <asio/steady_timer.hpp>

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

using namespace pscoro;
using pscoro::testing::local_cluster;
using pscoro::testing::raw_client;
using pscoro::testing::fixed_header;
using pscoro::testing::refusal;
using pscoro::testing::as_string;

namespace {

// Short enough that the silent-peer case ends soon, long enough that a loaded machine still reads a
// well-formed Hello before it.
server_options short_handshake() {
  server_options options;
  options.transport.handshake_timeout = std::chrono::seconds(2);
  options.transport.max_header_bytes = 1 << 16;
  return options;
}

// A Hello of `job` for task `to`:0.
wire::encoded_frame hello_frame(std::string job = "chief", std::uint32_t version = wire::protocol_version,
                                std::string to = "ps") {
  wire::frame f;
  f.kind = wire::frame_kind::hello;
  auto* hello = f.message.mutable_hello();
  hello->set_protocol_version(version);
  hello->set_job(std::move(job));
  hello->set_session(1);
  hello->set_to_job(std::move(to));
  return wire::encode(std::move(f));
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
    CHECK(contains(refusal(c.read_until_closed()), "unsupported protocol version 1 (this build speaks version 3)"));
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
  c.send(hello_frame("worker", wire::protocol_version, "worker"));
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
  CHECK(contains(e.what(), "accepted the connection but did not finish the handshake"));
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

TEST_CASE("a peer that stalls in the middle of a frame is disconnected; others are served") {
  auto options = short_handshake();
  options.transport.frame_stall_timeout = std::chrono::milliseconds(200);
  local_cluster cluster(1, 1, {}, options);
  raw_client c(cluster.spec.task_address("ps", 0));
  c.send(hello_frame());
  REQUIRE(c.read_frame().message.welcome().status().code() == 0);
  // A request frame announcing a 100-byte header, of which only 10 bytes ever come.
  c.send(fixed_header(wire::frame_kind::request, 100, 0) + std::string(10, '\0'));
  CHECK(c.read_until_closed().empty());  // closed without an answer, long before the 30 s read timeout
  check_still_serving(cluster);
}

TEST_CASE("a server holds at most max_connections connections; one more is refused until one closes") {
  auto options = short_handshake();
  options.transport.handshake_timeout = std::chrono::seconds(30);
  options.transport.max_connections = 3;
  local_cluster cluster(1, 1, {}, options);
  const auto ps = cluster.spec.task_address("ps", 0);
  {
    std::vector<std::unique_ptr<raw_client>> idle;  // connected, silent: still in their handshake
    for (int i = 0; i < 3; ++i) idle.push_back(std::make_unique<raw_client>(ps));
    raw_client one_more(ps);
    const auto refused = refusal(one_more.read_until_closed());
    CHECK(contains(refused, "ps:0 holds 3 connections, its limit (transport_options::max_connections)"));
  }
  // The chief is refused while the server has not yet seen the idle ones close, and tries again.
  check_still_serving(cluster);
}

namespace {

std::atomic<int> holding{0};
std::atomic<int> most_holding{0};
std::atomic<bool> release{false};
const worker_function<void(std::string)> hold_with{"transport.hold_with"};

void bind_hold(server& s) {
  // Holds until released, counting how many run at once; its argument only adds request bytes.
  s.bind(hold_with, [](std::string) -> asio::awaitable<void> {
    most_holding = std::max(most_holding.load(), ++holding);
    asio::steady_timer timer(co_await asio::this_coro::executor);
    while (!release) {
      timer.expires_after(std::chrono::milliseconds(5));
      co_await timer.async_wait(asio::use_awaitable);
    }
    --holding;
  });
}

}  // namespace

TEST_CASE("past max_bytes_in_flight a server stops reading a connection until it has answered") {
  server_options options;
  options.transport.max_bytes_in_flight = 1024;
  local_cluster cluster(1, 1, bind_hold, options);
  cluster.run_chief([&](parameter_server_strategy&, cluster_coordinator& coordinator) -> asio::awaitable<void> {
    // Each request carries 4 KiB: the first one alone is over the limit, so the worker reads the
    // next only when it has answered.
    std::vector<remote_value<void>> held;
    const std::string payload(4096, 'x');
    for (int i = 0; i < 4; ++i) held.push_back(coordinator.schedule(hold_with, payload));
    asio::steady_timer timer(co_await asio::this_coro::executor);
    // Without backpressure all 4 would be running within this wait.
    for (int i = 0; i < 200 && most_holding < 2; ++i) {
      timer.expires_after(std::chrono::milliseconds(10));
      co_await timer.async_wait(asio::use_awaitable);
    }
    CHECK(holding.load() == 1);
    release = true;
    co_await coordinator.join();
    CHECK(most_holding.load() == 1);
    for (auto& h : held) CHECK(h.status() == remote_status::ready);
  }, coordinator_options{.closures_per_worker = 4});
}

namespace {

wire::frame request_frame(std::uint64_t id) {
  wire::frame f;
  f.kind = wire::frame_kind::request;
  f.request_id = id;
  f.message.mutable_request();
  return f;
}

}  // namespace

TEST_CASE("a ps counts a read's answer from the read's arrival: reads waiting for their variable pause reading") {
  // A sparse read whose 16 MiB reply is gathered as it is sent holds its variable's lane until the
  // last row is gathered (this client reads nothing until it has sent everything), and the dense
  // reads after it wait for the lane: their answers do not exist yet. Each counts the variable's
  // 4 MiB from its arrival, so with a limit of 24 MiB the ps reads no further than the third
  // request until the first reply is written, and the Heartbeat behind them is answered after the
  // reads taken before it. Counted only once queued, every request was taken at once and the
  // Heartbeat answered right after the first reply, before reads that could each come to a whole
  // variable.
  server_options options;
  options.transport.max_bytes_in_flight = 24 << 20;
  local_cluster cluster(1, 1, {}, options);
  raw_client c(cluster.spec.task_address("ps", 0), 64 << 10);
  c.send(hello_frame());
  REQUIRE(c.read_frame().message.welcome().status().code() == 0);

  const variable_ref v{"bounded", dtype::float32, {1024, 1024}, 0};  // rows of 4 KiB, 4 MiB in all
  wire::frame create = request_frame(1);
  auto* created = create.message.mutable_request()->mutable_create_variable();
  wire::encode_ref(*created->mutable_variable(), v);
  tensor zeros = tensor::uninitialized(dtype::float32, {1024, 1024});
  std::fill_n(zeros.mutable_data<float>(), zeros.size(), 0.0f);
  wire::put_tensor(create, *created->mutable_initial_value(), zeros);
  c.send(wire::encode(std::move(create)));
  REQUIRE(c.read_frame().message.response().status().code() == 0);

  wire::frame gather = request_frame(2);  // row 0, 4096 times: 16 MiB
  auto* sparse = gather.message.mutable_request()->mutable_read_variable();
  wire::encode_ref(*sparse->mutable_variable(), v);
  wire::put_tensor(gather, *sparse->mutable_indices(), detail::vector_tensor(std::vector<std::int64_t>(4096, 0)));
  c.send(wire::encode(std::move(gather)));
  for (std::uint64_t id = 3; id <= 10; ++id) {
    wire::frame read = request_frame(id);
    wire::encode_ref(*read.message.mutable_request()->mutable_read_variable()->mutable_variable(), v);
    c.send(wire::encode(std::move(read)));
  }
  wire::frame heartbeat = request_frame(11);
  heartbeat.message.mutable_request()->mutable_heartbeat();
  c.send(wire::encode(std::move(heartbeat)));

  std::vector<std::uint64_t> order;
  for (int n = 0; n < 10; ++n) {
    const auto answer = c.read_frame(/*drop_payload=*/true);
    REQUIRE_MESSAGE(answer.message.response().status().code() == 0, answer.message.response().status().message());
    order.push_back(answer.request_id);
  }
  const auto heartbeat_at = std::find(order.begin(), order.end(), 11) - order.begin();
  CHECK_MESSAGE(heartbeat_at >= 2, "answers in the order ", fmt::format("{}", fmt::join(order, ", ")),
                ": the Heartbeat (11) was read while the reads before it waited, uncounted");
}

// What a task says about itself before it connects (its address, its Hello, its incarnation), and
// how callers wait for a connection.
#include "net/peer.hpp"

#include "test_support.hpp"

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

using namespace pscoro;
using pscoro::testing::code_of;
using pscoro::testing::message_of;

TEST_CASE("an address is formatted as split_address reads it, an IPv6 host in brackets") {
  CHECK(common::format_address("127.0.0.1", "4567") == "127.0.0.1:4567");
  CHECK(common::format_address("ps-0.cluster.local", "2222") == "ps-0.cluster.local:2222");
  CHECK(common::format_address("::1", "4567") == "[::1]:4567");
  for (const std::string address : {"127.0.0.1:4567", "[::1]:4567", "localhost:0"}) {
    const auto split = common::split_address(address, "ps:0");
    CHECK(common::format_address(split.first, split.second) == address);
  }
}

TEST_CASE("an endpoint is formatted like an address") {
  CHECK(common::format_address(asio::ip::tcp::endpoint(asio::ip::make_address("10.0.0.7"), 2222)) == "10.0.0.7:2222");
  CHECK(common::format_address(asio::ip::tcp::endpoint(asio::ip::address_v6::loopback(), 80)) == "[::1]:80");
}

TEST_CASE("a Hello names the task, its incarnation and its session in this protocol version") {
  const auto hello = net::make_hello({"worker", 3, 0xabcdef}, 42);
  CHECK(hello.protocol_version() == wire::protocol_version);
  CHECK(hello.job() == "worker");
  CHECK(hello.task_index() == 3);
  CHECK(hello.incarnation() == 0xabcdef);
  CHECK(hello.session() == 42);
  CHECK(hello.address().empty());
  CHECK(hello.cluster_size() == 0);
}

TEST_CASE("an incarnation is never 0, the session of no one") {
  for (int i = 0; i < 100; ++i) CHECK(net::new_incarnation() != 0);
}

namespace {

// What a caller of peer::get() ended with: nothing yet, the connection, or what it threw.
struct connection_outcome {
  bool ended = false;
  std::shared_ptr<wire::connection> connection;
  std::exception_ptr failure;
};

// Waits for `ps`'s connection as a closure's operation does: in a thread of execution whose
// cancellation state records a cancellation without aborting what it waits on (as
// worker_service::run_cancellable sets it up).
asio::awaitable<void> get_as_closure(net::peer* ps, connection_outcome* outcome) {
  co_await asio::this_coro::reset_cancellation_state(asio::enable_terminal_cancellation(),
                                                     asio::disable_cancellation());
  co_await asio::this_coro::throw_if_cancelled(false);
  try {
    outcome->connection = co_await ps->get();
  } catch (...) {
    outcome->failure = std::current_exception();
  }
  outcome->ended = true;
}

// The accepting side of one handshake, as a server runs it: the connection, once welcomed.
asio::awaitable<void> accept_one(asio::ip::tcp::acceptor* acceptor, transport_options options,
                                 std::shared_ptr<wire::connection>* accepted) {
  auto socket = co_await acceptor->async_accept(asio::use_awaitable);
  auto connection = std::make_shared<wire::connection>(std::move(socket), net::limits_of(options), "the worker");
  const net::task_identity self{"ps", 0, 7};
  auto budget = std::make_shared<wire::byte_budget>(options.max_handshake_bytes_total);
  if (co_await net::receive_hello(connection, options, self, std::move(budget))) {
    net::welcome(connection, self);
    *accepted = connection;
  }
}

}  // namespace

TEST_CASE("a closure cancelled while it waits to reach a ps stops waiting; the attempt goes on for the others") {
  asio::io_context io;
  const asio::ip::tcp::endpoint loopback(asio::ip::address_v4::loopback(), 0);
  // Bound but not listening: every attempt to connect is refused, and retried with backoff.
  asio::ip::tcp::acceptor port(io);
  port.open(loopback.protocol());
  port.bind(loopback);
  const auto endpoint = port.local_endpoint();
  transport_options options;
  // Far longer than the test: a cancelled caller still waiting when it ends fails the checks
  // below with this attempt's unavailable error, not a hang.
  options.connect_timeout = std::chrono::seconds(20);
  net::peer ps(io.get_executor(), "ps:0", common::format_address(endpoint),
                   net::make_hello({"worker", 0, 11}, 0), options);

  asio::cancellation_signal first_closure, second_closure;
  connection_outcome first, second;
  // The first caller starts the attempt; the second joins it.
  asio::co_spawn(io, get_as_closure(&ps, &first), asio::bind_cancellation_slot(first_closure.slot(), asio::detached));
  asio::co_spawn(io, get_as_closure(&ps, &second), asio::bind_cancellation_slot(second_closure.slot(), asio::detached));
  io.poll();
  REQUIRE_FALSE(first.ended);
  REQUIRE_FALSE(second.ended);

  // The chief cancels the first closure (worker_service::cancel: emit, then wake the waiters).
  first_closure.emit(asio::cancellation_type::terminal);
  ps.wake_waiters();
  while (!first.ended) io.run_one();
  CHECK(code_of(first.failure) == errc::cancelled);
  CHECK(contains(message_of(first.failure), "cancelled this closure"));
  CHECK_FALSE(second.ended);  // woken, not cancelled: it waits on

  // The ps comes up on the same port: the attempt the cancelled caller started connects for the other.
  port.close();
  asio::ip::tcp::acceptor listening(io, endpoint);
  std::shared_ptr<wire::connection> accepted;
  asio::co_spawn(io, accept_one(&listening, options, &accepted), asio::detached);
  while (!second.ended) io.run_one();
  CHECK(second.failure == nullptr);
  CHECK(second.connection != nullptr);
  CHECK(ps.connection() == second.connection);
  CHECK(accepted != nullptr);
  ps.close("the test is over");
  if (accepted) accepted->close("the test is over");
  io.poll();
}

// What a task says about itself before it connects: its address, its Hello, its incarnation.
#include "runtime/peer.hpp"

#include "test_support.hpp"

using namespace pscoro;

TEST_CASE("an address is formatted as split_address reads it, an IPv6 host in brackets") {
  CHECK(runtime::format_address("127.0.0.1", "4567") == "127.0.0.1:4567");
  CHECK(runtime::format_address("ps-0.cluster.local", "2222") == "ps-0.cluster.local:2222");
  CHECK(runtime::format_address("::1", "4567") == "[::1]:4567");
  for (const std::string address : {"127.0.0.1:4567", "[::1]:4567", "localhost:0"}) {
    const auto split = runtime::split_address(address, "ps:0");
    CHECK(runtime::format_address(split.first, split.second) == address);
  }
}

TEST_CASE("an endpoint is formatted like an address") {
  CHECK(runtime::format_address(asio::ip::tcp::endpoint(asio::ip::make_address("10.0.0.7"), 2222)) == "10.0.0.7:2222");
  CHECK(runtime::format_address(asio::ip::tcp::endpoint(asio::ip::address_v6::loopback(), 80)) == "[::1]:80");
}

TEST_CASE("a Hello names the task, its incarnation and its session in this protocol version") {
  const auto hello = runtime::make_hello({"worker", 3, 0xabcdef}, 42);
  CHECK(hello.protocol_version() == wire::protocol_version);
  CHECK(hello.job() == "worker");
  CHECK(hello.task_index() == 3);
  CHECK(hello.incarnation() == 0xabcdef);
  CHECK(hello.session() == 42);
  CHECK(hello.address().empty());
  CHECK(hello.cluster_size() == 0);
}

TEST_CASE("an incarnation is never 0, the session of no one") {
  for (int i = 0; i < 100; ++i) CHECK(runtime::new_incarnation() != 0);
}

// What strangers may hold before they prove who they are, without a socket: places for
// handshakes in total, per address and within max_connections, given back however a handshake
// ends, and the reasons for a refusal.
#include "test_support.hpp"

#include "net/handshake_gate.hpp"

#include <optional>
#include <variant>
#include <vector>

using namespace pscoro;
using net::handshake_gate;

namespace {

transport_options gate_limits(std::size_t connections, std::size_t handshakes, std::size_t per_address) {
  transport_options options;
  options.max_connections = connections;
  options.max_handshakes = handshakes;
  options.max_handshakes_per_address = per_address;
  options.max_handshake_bytes_total = 1u << 20;
  return options;
}

// The reason `entered` holds, or a failed check when it holds a place.
std::string refusal_of(std::variant<handshake_gate::place, std::string>&& entered) {
  const auto* refused = std::get_if<std::string>(&entered);
  REQUIRE_MESSAGE(refused, "expected a refusal, got a place");
  return *refused;
}

}  // namespace

TEST_CASE("a handshake gate gives one address at most its share of places, and the others theirs") {
  handshake_gate gate("ps:0", gate_limits(100, 4, 2));
  std::vector<handshake_gate::place> places;
  for (int i = 0; i < 2; ++i) places.push_back(std::get<handshake_gate::place>(gate.enter("10.0.0.9", 0)));
  CHECK(gate.in_progress_from("10.0.0.9") == 2);
  CHECK(refusal_of(gate.enter("10.0.0.9", 0)) ==
        "ps:0 has 2 handshakes in progress from 10.0.0.9, its limit per address "
        "(transport_options::max_handshakes_per_address)");
  // Another address still gets in, up to the total.
  for (const char* host : {"10.0.0.1", "10.0.0.2"}) places.push_back(std::get<handshake_gate::place>(gate.enter(host, 0)));
  CHECK(gate.in_progress() == 4);
  CHECK(refusal_of(gate.enter("10.0.0.3", 0)) ==
        "ps:0 has 4 handshakes in progress, its limit (transport_options::max_handshakes)");

  // A handshake that ends, however, gives its place back.
  places.erase(places.begin());
  CHECK(gate.in_progress() == 3);
  CHECK(gate.in_progress_from("10.0.0.9") == 1);
  places.push_back(std::get<handshake_gate::place>(gate.enter("10.0.0.9", 0)));
  places.clear();
  CHECK(gate.in_progress() == 0);
  CHECK(gate.in_progress_from("10.0.0.9") == 0);
}

TEST_CASE("a handshake gate counts established connections and handshakes against max_connections") {
  handshake_gate gate("worker:1", gate_limits(3, 10, 10));
  auto one = std::get<handshake_gate::place>(gate.enter("10.0.0.1", 1));
  CHECK(std::holds_alternative<handshake_gate::place>(gate.enter("10.0.0.1", 1)));  // given back at once
  CHECK(refusal_of(gate.enter("10.0.0.2", 2)) ==
        "worker:1 holds 3 connections, its limit (transport_options::max_connections)");
}

TEST_CASE("a handshake's place may outlive its gate, and its budget is the gate's") {
  std::optional<handshake_gate::place> kept;
  {
    handshake_gate gate("chief:0", gate_limits(10, 10, 10));
    kept.emplace(std::get<handshake_gate::place>(gate.enter("10.0.0.1", 0)));
    CHECK(kept->budget().get() == &gate.budget());
    CHECK(gate.budget().total() == 1u << 20);
  }
  kept.reset();  // the gate is gone: nothing to give back to, nothing happens
}

// The ps's per-variable lanes, without a ps: who waits, in what order each is handed the lane,
// what a session's end does to the waiters and to the holds taken before it, and which lane a
// slot's request goes through. A waiter holds its executor's work while it waits, so the
// io_context is polled, not run.
#include "test_support.hpp"

#include "ps/lanes.hpp"

#include <pscoro/error.hpp>

#include <asio/io_context.hpp>

#include <optional>
#include <string>
#include <vector>

using namespace pscoro;
using ps::lanes;

namespace {

// A waiter that records, when completed, its name and code in `log`.
lanes::waiter recorded_waiter(asio::io_context& io, std::vector<std::pair<std::string, std::error_code>>& log,
                              std::string name) {
  return lanes::waiter([&log, name](std::error_code ec) { log.emplace_back(name, ec); }, io.get_executor());
}

ps::stored_variable floats_of(std::size_t n, std::string slot_of = {}) {
  return ps::stored_variable{dtype::float32, {n}, byte_buffer(n * sizeof(float)), std::move(slot_of), 0.0};
}

}  // namespace

TEST_CASE("lanes hand a variable's lane to its waiters one at a time, in arrival order") {
  asio::io_context io;
  std::vector<std::pair<std::string, std::error_code>> log;
  lanes l;
  CHECK(l.empty());
  CHECK(!l.busy("w"));
  auto first = l.take("w");
  CHECK(l.busy("w"));
  CHECK(!l.busy("v"));  // other variables are served at once
  l.wait("w", recorded_waiter(io, log, "second"));
  l.wait("w", recorded_waiter(io, log, "third"));
  CHECK(l.waiting() == 2);

  first.reset();  // the first is done: the second is handed the lane, the third still waits
  io.poll();
  io.restart();
  REQUIRE(log.size() == 1);
  CHECK(log[0] == std::pair<std::string, std::error_code>{"second", {}});
  CHECK(l.busy("w"));
  CHECK(l.waiting() == 1);

  auto second = l.take("w");  // what a waiter does once handed the lane
  second.reset();
  io.poll();
  io.restart();
  REQUIRE(log.size() == 2);
  CHECK(log[1].first == "third");
  CHECK(l.busy("w"));  // the third holds it now: whoever comes next queues behind it

  l.take("w").reset();  // the third is done, nobody waits: the lane is dropped
  CHECK(!l.busy("w"));
  CHECK(l.empty());
}

TEST_CASE("lanes: a session's end fails every waiter, and the holds taken before it let go of nothing") {
  asio::io_context io;
  std::vector<std::pair<std::string, std::error_code>> log;
  lanes l;
  auto before = l.take("w");
  l.wait("w", recorded_waiter(io, log, "waiting"));
  l.fail_all(make_error_code(errc::aborted));
  io.poll();
  io.restart();
  REQUIRE(log.size() == 1);
  CHECK(log[0].second == make_error_code(errc::aborted));
  CHECK(l.empty());

  // A request of the next session holds "w" now, and another waits for it: the stale hold from
  // before must not hand that lane on.
  auto now = l.take("w");
  l.wait("w", recorded_waiter(io, log, "next session"));
  before.reset();
  io.poll();
  io.restart();
  CHECK(log.size() == 1);
  CHECK(l.waiting() == 1);
  now.reset();
  io.poll();
  REQUIRE(log.size() == 2);
  CHECK(log[1] == std::pair<std::string, std::error_code>{"next session", {}});
}

TEST_CASE("lanes that are destroyed fail their waiters as unavailable; a hold that outlives them does nothing") {
  asio::io_context io;
  std::vector<std::pair<std::string, std::error_code>> log;
  std::shared_ptr<lanes::hold> outliving;
  {
    lanes l;
    outliving = l.take("w");
    l.wait("w", recorded_waiter(io, log, "waiting"));
  }
  outliving.reset();  // no lanes to release into: nothing happens
  io.poll();
  REQUIRE(log.size() == 1);
  CHECK(log[0].second == make_error_code(errc::unavailable));
}

TEST_CASE("lanes: a slot's requests go through its variable's lane, one not created yet through a busy prefix's") {
  ps::variable_store store("ps:0", std::uint64_t{1} << 30, std::uint64_t{1} << 30);
  store.hold("w", floats_of(4));
  store.hold("w/momentum/momentum", floats_of(4, "w"));
  store.hold("w/x", floats_of(4));  // named like a slot, but a variable of its own
  lanes l;
  CHECK(l.key_of("w", store) == "w");
  CHECK(l.key_of("w/momentum/momentum", store) == "w");
  CHECK(l.key_of("w/x", store) == "w/x");
  // Not held yet: its own name while nothing for its variable runs...
  CHECK(l.key_of("w/adagrad/accumulator", store) == "w/adagrad/accumulator");
  // ...its variable's while a step that may create it waits or runs there.
  auto step = l.take("w");
  CHECK(l.key_of("w/adagrad/accumulator", store) == "w");
  CHECK(l.key_of("v/adagrad/accumulator", store) == "v/adagrad/accumulator");
  CHECK(l.key_of("w/x", store) == "w/x");  // held: its own lane, whatever runs for "w"
}

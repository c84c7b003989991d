// A task's coordinator sessions without sockets: who opens one, who joins, and what an ended one
// leaves behind (its Hellos refused by name).
#include "test_support.hpp"

#include "server/session_table.hpp"

using namespace pscoro;
using serving::session_table;

TEST_CASE("a session is opened by the chief alone, and workers join only the open one") {
  session_table sessions("ps:0");
  CHECK(sessions.current() == 0);
  const auto early = sessions.join(7, "worker:0 at 127.0.0.1:5000", false);
  CHECK(contains(early.refusal,
                 "coordinator session 0000000000000007 of worker:0 at 127.0.0.1:5000 is not open on ps:0"));
  CHECK(contains(early.refusal, "only the chief opens a session"));
  CHECK(sessions.current() == 0);

  const auto opened = sessions.join(7, "chief:0 at 127.0.0.1:4000", true);
  CHECK(opened.refusal.empty());
  CHECK(opened.ended == 0);  // nothing was open before
  CHECK(sessions.current() == 7);

  const auto joined = sessions.join(7, "worker:0 at 127.0.0.1:5000", false);
  CHECK(joined.refusal.empty());
  CHECK(joined.ended == 0);
  // The chief again (a second connection of its own) joins what it opened; nothing ends.
  CHECK(sessions.join(7, "chief:0 at 127.0.0.1:4000", true).ended == 0);
}

TEST_CASE("a Hello that names no session is refused, from the chief too") {
  session_table sessions("worker:1");
  for (const bool chief : {false, true}) {
    const auto refused = sessions.join(0, "chief:0 at 127.0.0.1:4000", chief);
    CHECK(contains(refused.refusal, "the Hello of chief:0 at 127.0.0.1:4000 names no coordinator session"));
  }
  CHECK(sessions.current() == 0);
}

TEST_CASE("a new chief's session ends the current one, whose Hellos are refused from then on") {
  session_table sessions("ps:1");
  REQUIRE(sessions.join(0x10, "chief:0", true).refusal.empty());
  const auto taken_over = sessions.join(0x20, "chief:0", true);
  CHECK(taken_over.refusal.empty());
  CHECK(taken_over.ended == 0x10);
  CHECK(sessions.current() == 0x20);
  for (const bool chief : {false, true}) {
    const auto old = sessions.join(0x10, "worker:3", chief);
    CHECK(contains(old.refusal, "coordinator session 0000000000000010 of worker:3 has ended on ps:1"));
    CHECK(contains(old.refusal, "a newer coordinator (session 0000000000000020) took over"));
    CHECK(old.ended == 0);
  }
  CHECK(sessions.current() == 0x20);  // a refused Hello changes nothing
}

TEST_CASE("ended sessions are remembered up to the bound, oldest forgotten first") {
  session_table sessions("ps:0", 2);
  for (std::uint64_t s = 1; s <= 4; ++s) REQUIRE(sessions.join(s, "chief:0", true).refusal.empty());
  // Ended: 1, 2, 3; remembered: 2 and 3. Session 1 is forgotten, so a chief may open it again.
  CHECK(!sessions.join(2, "chief:0", true).refusal.empty());
  CHECK(!sessions.join(3, "chief:0", true).refusal.empty());
  const auto reopened = sessions.join(1, "chief:0", true);
  CHECK(reopened.refusal.empty());
  CHECK(reopened.ended == 4);
}

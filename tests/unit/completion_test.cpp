// The completion plumbing under remote_value, the coordinator and sharded variables: erased_handler,
// async_event and run_all, each on a bare io_context with no sockets and no clocks. The tests poll()
// rather than run(): poll() runs what is ready and returns, so a handler that is never posted
// fails a check instead of hanging the test.
#include "test_support.hpp"

#include <pscoro/detail/completion.hpp>
#include <pscoro/detail/parallel.hpp>

#include <asio/bind_executor.hpp>
#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <algorithm>
#include <cstddef>
#include <exception>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

using pscoro::errc;
using pscoro::detail::async_event;
using pscoro::detail::erased_handler;
using pscoro::detail::run_all;

namespace {

// Counts its live instances: a test that ends with counted::alive == 0 proves that whatever held
// one (a stored handler, a coroutine frame) was destroyed.
struct counted {
  static inline int alive = 0;
  counted() { ++alive; }
  counted(const counted&) { ++alive; }
  counted(counted&&) noexcept { ++alive; }
  counted& operator=(const counted&) = default;
  counted& operator=(counted&&) noexcept = default;
  ~counted() { --alive; }
};

/// Runs `body` on a fresh io_context until nothing is ready to run and returns what it threw (null
/// when nothing); throws std::logic_error when `body` is still unfinished then (it waits for
/// something that nothing will do).
std::exception_ptr run(asio::awaitable<void> body) {
  asio::io_context io;
  std::exception_ptr thrown;
  bool finished = false;
  asio::co_spawn(io, std::move(body), [&](std::exception_ptr e) {
    thrown = e;
    finished = true;
  });
  while (io.poll() > 0) {
  }
  if (!finished) throw std::logic_error("the test body is stuck: it waits for something nothing will do");
  return thrown;
}

/// Lets every handler already queued on the current executor run first.
asio::awaitable<void> yield() {
  const auto executor = co_await asio::this_coro::executor;
  co_await asio::post(executor, asio::use_awaitable);
}

}  // namespace

// --- erased_handler ---------------------------------------------------------------------------

TEST_CASE("an erased handler never runs inside the call that completes it") {
  asio::io_context io;
  std::optional<int> got;
  erased_handler<void(int)> handler([&got](int x) { got = x; }, io.get_executor());
  bool ran_inside_the_call = false;
  asio::post(io, [&] {
    handler(7);  // from a handler of the very executor it completes on
    ran_inside_the_call = got.has_value();
  });
  io.poll();
  CHECK_FALSE(ran_inside_the_call);
  CHECK(got == 7);
}

TEST_CASE("an erased handler runs on the handler's associated executor, else on the fallback") {
  asio::io_context fallback;
  asio::io_context own;
  bool bound_ran_on_own = false;
  bool plain_ran_on_fallback = false;
  erased_handler<void()> bound(
      asio::bind_executor(own, [&] { bound_ran_on_own = own.get_executor().running_in_this_thread(); }),
      fallback.get_executor());
  erased_handler<void()> plain([&] { plain_ran_on_fallback = fallback.get_executor().running_in_this_thread(); },
                               fallback.get_executor());
  bound();
  plain();
  fallback.poll();
  CHECK_FALSE(bound_ran_on_own);  // not yet: it waits for `own`
  CHECK(plain_ran_on_fallback);
  own.poll();
  CHECK(bound_ran_on_own);
}

TEST_CASE("a stored erased handler keeps its executor's work until it is destroyed") {
  asio::io_context io;
  {
    erased_handler<void()> stored([c = counted{}] {}, io.get_executor());
    io.poll();  // with no outstanding work, poll would stop the context
    CHECK_FALSE(io.stopped());
    CHECK(counted::alive > 0);
  }
  CHECK(counted::alive == 0);  // destroyed uncalled: the handler goes with it
  io.poll();
  CHECK(io.stopped());  // and so does the work it held
}

TEST_CASE("a called erased handler lets go of its handler and its work once the handler has run") {
  asio::io_context io;
  bool ran = false;
  erased_handler<void()> handler([&ran, c = counted{}] { ran = true; }, io.get_executor());
  handler();
  CHECK_FALSE(ran);
  CHECK(counted::alive > 0);  // the posted handler owns it now
  io.poll();
  CHECK(ran);
  CHECK(counted::alive == 0);
  CHECK(io.stopped());  // the last work ended with the handler
}

TEST_CASE("an erased handler is empty after it is called, after a move and when default-constructed") {
  asio::io_context io;
  int calls = 0;
  erased_handler<void()> handler([&calls] { ++calls; }, io.get_executor());
  CHECK(static_cast<bool>(handler));
  erased_handler<void()> moved = std::move(handler);
  CHECK_FALSE(static_cast<bool>(handler));  // NOLINT(bugprone-use-after-move): that is the point
  CHECK(static_cast<bool>(moved));
  moved();
  CHECK_FALSE(static_cast<bool>(moved));
  CHECK_FALSE(static_cast<bool>(erased_handler<void()>{}));
  io.poll();
  CHECK(calls == 1);
}

TEST_CASE("calling an empty erased handler throws bad_function_call, as std::function does") {
  asio::io_context io;
  erased_handler<void(int)> empty;
  CHECK_THROWS_AS(empty(1), std::bad_function_call);
  erased_handler<void(int)> once([](int) {}, io.get_executor());
  once(1);
  CHECK_THROWS_AS(once(2), std::bad_function_call);  // called once already: empty now
  CHECK(io.poll() == 1);
}

// --- async_event ------------------------------------------------------------------------------

TEST_CASE("setting an event wakes every waiter once, posted, not inside set()") {
  asio::io_context io;
  async_event event(io.get_executor());
  int woken[3] = {0, 0, 0};
  for (int& w : woken) event.async_wait([&w] { ++w; });
  io.poll();
  CHECK_FALSE(event.is_set());
  CHECK(woken[0] + woken[1] + woken[2] == 0);
  event.set();
  CHECK(event.is_set());
  CHECK(woken[0] + woken[1] + woken[2] == 0);  // posted
  io.poll();
  CHECK(woken[0] == 1);
  CHECK(woken[1] == 1);
  CHECK(woken[2] == 1);
  event.set();  // a second set wakes nobody again
  io.restart();
  io.poll();
  CHECK(woken[0] + woken[1] + woken[2] == 3);
}

TEST_CASE("a waiter that comes after set() completes at once, but posted") {
  asio::io_context io;
  async_event event(io.get_executor());
  event.set();
  bool woken = false;
  event.async_wait([&woken] { woken = true; });
  CHECK_FALSE(woken);
  io.poll();
  CHECK(woken);
}

namespace {

asio::awaitable<void> wait_then_count(async_event& event, int& resumed) {
  co_await event.async_wait(asio::use_awaitable);
  ++resumed;
}

}  // namespace

TEST_CASE("coroutines awaiting an event all resume once it is set") {
  asio::io_context io;
  async_event event(io.get_executor());
  int resumed = 0;
  int spawned_and_done = 0;
  for (int i = 0; i < 3; ++i) {
    asio::co_spawn(io, wait_then_count(event, resumed), [&spawned_and_done](std::exception_ptr e) {
      spawned_and_done += e == nullptr;
    });
  }
  io.poll();
  CHECK(resumed == 0);
  CHECK_FALSE(io.stopped());  // the waiting coroutines keep the context alive
  event.set();
  io.poll();
  CHECK(resumed == 3);
  CHECK(spawned_and_done == 3);
}

TEST_CASE("an event destroyed before it is set destroys its waiters and releases their work") {
  asio::io_context io;
  {
    async_event event(io.get_executor());
    event.async_wait([c = counted{}] {});
    io.poll();
    CHECK_FALSE(io.stopped());
    CHECK(counted::alive > 0);
  }
  CHECK(counted::alive == 0);
  io.poll();
  CHECK(io.stopped());
}

// --- run_all ------------------------------------------------------------------------------------

namespace {

struct step_counts {
  std::size_t started = 0;
  std::size_t running = 0;
  std::size_t most_running = 0;
  std::size_t finished = 0;
};

/// Yields `yields` times, then finishes; records how many tasks run at once.
asio::awaitable<void> step(step_counts& p, std::size_t yields, counted) {
  ++p.started;
  ++p.running;
  p.most_running = std::max(p.most_running, p.running);
  for (std::size_t k = 0; k < yields; ++k) co_await yield();
  --p.running;
  ++p.finished;
}

asio::awaitable<void> run_steps(step_counts& p, std::size_t n) {
  // Task i yields i + 1 times: the last one started is the last to finish.
  const auto make_task = [&p](std::size_t i) { return step(p, i + 1, counted{}); };
  co_await run_all(n, make_task);
  CHECK(p.finished == n);  // every task has finished when run_all returns
  CHECK(p.running == 0);
}

}  // namespace

TEST_CASE("run_all runs every task at once and returns when the last one has finished") {
  step_counts p;
  CHECK(run(run_steps(p, 4)) == nullptr);
  CHECK(p.started == 4);
  CHECK(p.most_running == 4);
  CHECK(p.finished == 4);
  CHECK(counted::alive == 0);  // every task's frame is gone
}

TEST_CASE("run_all of one task runs it, and of none returns at once without making a task") {
  step_counts one;
  CHECK(run(run_steps(one, 1)) == nullptr);
  CHECK(one.finished == 1);
  step_counts none;
  CHECK(run(run_steps(none, 0)) == nullptr);
  CHECK(none.started == 0);
  CHECK(counted::alive == 0);
}

namespace {

// Three tasks whose order is fixed by events, not clocks: task 0 fails first; task 1 fails second,
// a few turns of the executor later; task 2 is still running then and succeeds last.
struct staged_failures {
  explicit staged_failures(asio::any_io_executor executor) : first_failed(executor), second_failed(executor) {}
  async_event first_failed;
  async_event second_failed;
  step_counts p;
  bool last_finished_before_run_all_threw = false;
};

asio::awaitable<void> staged_task(staged_failures& s, std::size_t i, counted) {
  ++s.p.started;
  if (i == 0) {
    co_await yield();
    ++s.p.finished;
    s.first_failed.set();
    throw pscoro::error(errc::aborted, "task 0 failed first");
  }
  if (i == 1) {
    co_await s.first_failed.async_wait(asio::use_awaitable);
    for (int k = 0; k < 3; ++k) co_await yield();
    ++s.p.finished;
    s.second_failed.set();
    throw pscoro::error(errc::unavailable, "task 1 failed second");
  }
  co_await s.second_failed.async_wait(asio::use_awaitable);
  for (int k = 0; k < 3; ++k) co_await yield();
  ++s.p.finished;
}

asio::awaitable<void> run_staged(std::optional<staged_failures>& s) {
  const auto executor = co_await asio::this_coro::executor;
  s.emplace(executor);
  const auto make_task = [&s](std::size_t i) { return staged_task(*s, i, counted{}); };
  try {
    co_await run_all(3, make_task);
  } catch (...) {
    s->last_finished_before_run_all_threw = s->p.finished == 3;
    throw;
  }
}

asio::awaitable<void> fail_alone(counted) {
  co_await yield();
  throw pscoro::error(errc::not_found, "the only task failed");
}

asio::awaitable<void> run_one_failing() {
  const auto make_task = [](std::size_t) { return fail_alone(counted{}); };
  co_await run_all(1, make_task);
}

/// The pscoro::error in `e`, or an errc::internal error saying `e` held none.
pscoro::error error_in(const std::exception_ptr& e) {
  try {
    if (e) std::rethrow_exception(e);
  } catch (const pscoro::error& x) {
    return x;
  } catch (...) {
  }
  return pscoro::error(errc::internal, "expected a pscoro::error, got " + pscoro::testing::describe_exception(e));
}

}  // namespace

TEST_CASE("run_all rethrows the first failure, but only after every other task has finished") {
  std::optional<staged_failures> s;
  const auto thrown = run(run_staged(s));
  REQUIRE(s.has_value());
  REQUIRE(thrown != nullptr);
  const auto e = error_in(thrown);
  CHECK(e.code() == errc::aborted);
  CHECK(contains(e.what(), "task 0 failed first"));
  CHECK(s->p.started == 3);
  CHECK(s->last_finished_before_run_all_threw);
  CHECK(s->p.finished == 3);
  s.reset();
  CHECK(counted::alive == 0);
}

TEST_CASE("run_all of one failing task rethrows its failure") {
  const auto e = error_in(run(run_one_failing()));
  CHECK(e.code() == errc::not_found);
  CHECK(contains(e.what(), "the only task failed"));
  CHECK(counted::alive == 0);
}

namespace {

// make_task throws for task 2, after tasks 0 and 1 (which refer to the caller's counts) were spawned.
asio::awaitable<void> run_until_make_task_throws(step_counts& p, bool& spawned_finished_first) {
  const auto make_task = [&p](std::size_t i) {
    if (i == 2) throw pscoro::error(errc::invalid_argument, "no task 2");
    return step(p, 3, counted{});
  };
  try {
    co_await run_all(4, make_task);
  } catch (...) {
    spawned_finished_first = p.finished == 2 && p.running == 0;
    throw;
  }
}

}  // namespace

TEST_CASE("run_all whose make_task throws waits for the tasks already spawned, then rethrows") {
  step_counts p;
  bool spawned_finished_first = false;
  const auto e = error_in(run(run_until_make_task_throws(p, spawned_finished_first)));
  CHECK(e.code() == errc::invalid_argument);
  CHECK(contains(e.what(), "no task 2"));
  CHECK(p.started == 2);
  CHECK(spawned_finished_first);
  CHECK(counted::alive == 0);
}

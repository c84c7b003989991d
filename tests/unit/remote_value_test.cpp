#include "test_support.hpp"

#include <pscoro/remote_value.hpp>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>

#include <cstdint>
#include <exception>
#include <optional>
#include <thread>

using namespace pscoro;

namespace {

std::shared_ptr<detail::remote_state> new_state(asio::io_context& io) {
  return std::make_shared<detail::remote_state>(io.get_executor(), decode_context{});
}

}  // namespace

TEST_CASE("a remote_value is not_ready until its result is set, then ready") {
  asio::io_context io;
  auto state = new_state(io);
  remote_value<std::int64_t> value(state);
  CHECK(value.status() == remote_status::not_ready);
  std::optional<std::int64_t> got;
  asio::co_spawn(io, [value, &got]() -> asio::awaitable<void> { got = co_await value.get(); }, asio::detached);
  io.poll();
  CHECK_FALSE(got.has_value());  // still waiting
  state->set_value(std::int64_t{42});
  CHECK(value.status() == remote_status::ready);
  io.poll();
  CHECK(got == 42);
}

TEST_CASE("an error or a cancellation is rethrown by every get") {
  asio::io_context io;
  auto failed = new_state(io);
  auto cancelled = new_state(io);
  failed->set_error(std::make_exception_ptr(remote_error(make_error_code(errc::unknown), "worker:1", "boom")));
  cancelled->set_error(std::make_exception_ptr(error(errc::cancelled, "cancelled")), remote_status::cancelled);
  CHECK(remote_value<void>(failed).status() == remote_status::error);
  CHECK(remote_value<void>(cancelled).status() == remote_status::cancelled);
  int caught = 0;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        for (int i = 0; i < 2; ++i) {
          try {
            co_await remote_value<void>(failed).get();
          } catch (const remote_error& e) {
            caught += e.origin_task() == "worker:1";
          }
        }
        try {
          co_await remote_value<void>(cancelled).get();
        } catch (const error& e) {
          caught += e.code() == errc::cancelled;
        }
      },
      asio::detached);
  io.run();
  CHECK(caught == 3);
}

TEST_CASE("fetch blocks a plain thread until the executor sets the result") {
  asio::io_context io;
  auto guard = asio::make_work_guard(io);
  std::thread executor([&] { io.run(); });
  auto state = new_state(io);
  remote_value<std::string> value(state);
  asio::post(io, [state] { state->set_value(std::string("done")); });
  CHECK(value.fetch() == "done");
  CHECK(value.fetch() == "done");  // a value stays fetchable
  guard.reset();
  executor.join();
}

TEST_CASE("a result of the wrong type is an invalid_argument naming both types") {
  asio::io_context io;
  auto guard = asio::make_work_guard(io);
  std::thread executor([&] { io.run(); });
  auto state = new_state(io);
  asio::post(io, [state] { state->set_value(std::string("text")); });
  remote_value<std::int64_t> value(state);
  try {
    (void)value.fetch();
    FAIL("decoded a string as int64");
  } catch (const error& e) {
    CHECK(e.code() == errc::invalid_argument);
    CHECK(contains(e.what(), "expected int64, got string"));
  }
  guard.reset();
  executor.join();
}

namespace {

template <class R>
asio::awaitable<void> await_result(remote_value<R> value) {
  (void)co_await value.get();
}

/// What awaiting `value.get()` in a coroutine throws, as error_thrown_by does.
template <class R>
error error_awaiting(const remote_value<R>& value) {
  asio::io_context io;
  std::exception_ptr thrown;
  asio::co_spawn(io, await_result(value), [&thrown](std::exception_ptr e) { thrown = e; });
  io.run();
  return error_thrown_by([&thrown] {
    if (thrown) std::rethrow_exception(thrown);
  });
}

}  // namespace

TEST_CASE_TEMPLATE("an empty remote_value throws failed_precondition from every accessor", R, std::int64_t, void) {
  const remote_value<R> empty;  // a placeholder, never returned by schedule()
  struct thrown_by {
    const char* accessor;
    error e;
  };
  const thrown_by failures[] = {
      {"status()", error_thrown_by([&] { (void)empty.status(); })},
      {"fetch()", error_thrown_by([&] { (void)empty.fetch(); })},
      {"get()", error_thrown_by([&] { (void)empty.get(); })},
      {"co_await get()", error_awaiting(empty)},
  };
  for (const auto& failure : failures) {
    INFO("from ", failure.accessor);
    CHECK(failure.e.code() == errc::failed_precondition);
    CHECK(contains(failure.e.what(), "this remote_value is empty: it was default-constructed and never returned by "
                                     "schedule()"));
  }
}

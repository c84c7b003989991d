// Running a few coroutines at once on the current executor and waiting for all of them (asio 1.22
// has no ranged parallel_group).
#pragma once

#include <pscoro/config.hpp>

#include <pscoro/detail/completion.hpp>

#include <asio/awaitable.hpp>
#include <asio/co_spawn.hpp>
#include <asio/post.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <cstddef>
#include <exception>
#include <memory>

namespace pscoro::detail {

struct parallel_state {
  explicit parallel_state(asio::any_io_executor executor) : done(std::move(executor)) {}
  std::size_t running = 0;
  std::exception_ptr first_failure;
  async_event done;  // set when the last running task ends
};

// A named handler, not a lambda: g++ 12 mishandles capturing lambdas given to co_spawn from a coroutine.
struct parallel_completion {
  std::shared_ptr<parallel_state> state;
  void operator()(std::exception_ptr e) const {
    if (e && !state->first_failure) state->first_failure = e;
    if (--state->running == 0) state->done.set();
  }
};

/// Coroutines started one at a time on an executor and awaited together. A spawned task starts
/// once the spawning coroutine suspends (co_spawn posts it): `co_await group.let_run()` after a
/// spawn lets it run up to its first wait (a request sent) before the caller goes on. Every task
/// spawned runs to its end before wait() returns, so tasks may refer to the caller's locals, and
/// wait() must be awaited once something was spawned, also when the caller is about to fail.
class task_group {
 public:
  explicit task_group(asio::any_io_executor executor)
      : executor_(executor), state_(std::make_shared<parallel_state>(std::move(executor))) {}

  void spawn(asio::awaitable<void> task) {
    ++state_->running;
    asio::co_spawn(executor_, std::move(task), parallel_completion{state_});
  }

  /// Lets the tasks spawned so far run until they wait (a round through the executor's queue).
  asio::awaitable<void> let_run() { co_await asio::post(executor_, asio::use_awaitable); }

  /// Completes when every spawned task has ended; `rethrow`: then throws the first failure.
  asio::awaitable<void> wait(bool rethrow = true) {
    if (state_->running > 0) co_await state_->done.async_wait(asio::use_awaitable);
    if (rethrow && state_->first_failure) std::rethrow_exception(state_->first_failure);
  }

 private:
  asio::any_io_executor executor_;
  std::shared_ptr<parallel_state> state_;
};

/// Runs `make_task(i)` (returning asio::awaitable<void>) for every i in [0, n) concurrently and
/// completes when all have finished, rethrowing the first failure. Every task runs to its end
/// before this returns, so tasks may refer to the caller's locals. `make_task` must not itself be a
/// coroutine lambda with captures (its frame would outlive the lambda): have it call a function.
template <class MakeTask>
asio::awaitable<void> run_all(std::size_t n, MakeTask make_task) {
  if (n == 0) co_return;
  if (n == 1) {
    co_await make_task(std::size_t{0});
    co_return;
  }
  const auto executor = co_await asio::this_coro::executor;
  task_group tasks(executor);
  std::exception_ptr failure;  // make_task failing: the tasks already spawned still end first
  try {
    for (std::size_t i = 0; i < n; ++i) tasks.spawn(make_task(i));
  } catch (...) {
    failure = std::current_exception();
  }
  co_await tasks.wait(!failure);
  if (failure) std::rethrow_exception(failure);
}

}  // namespace pscoro::detail

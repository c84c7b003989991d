// Running a few coroutines at once on the current executor and waiting for all of them (asio 1.22
// has no ranged parallel_group).
#pragma once

#include <pscoro/config.hpp>

#include <pscoro/detail/completion.hpp>

#include <asio/awaitable.hpp>
#include <asio/co_spawn.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <cstddef>
#include <exception>
#include <memory>

namespace pscoro::detail {

struct parallel_state {
  explicit parallel_state(asio::any_io_executor executor, std::size_t n) : remaining(n), done(std::move(executor)) {}
  std::size_t remaining;
  std::exception_ptr first_failure;
  async_event done;
};

// A named handler, not a lambda: g++ 12 mishandles capturing lambdas given to co_spawn from a coroutine.
struct parallel_completion {
  std::shared_ptr<parallel_state> state;
  void operator()(std::exception_ptr e) const {
    if (e && !state->first_failure) state->first_failure = e;
    if (--state->remaining == 0) state->done.set();
  }
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
  auto state = std::make_shared<parallel_state>(executor, n);
  for (std::size_t i = 0; i < n; ++i) asio::co_spawn(executor, make_task(i), parallel_completion{state});
  co_await state->done.async_wait(asio::use_awaitable);
  if (state->first_failure) std::rethrow_exception(state->first_failure);
}

}  // namespace pscoro::detail

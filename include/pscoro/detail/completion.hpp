// Type-erased completion handlers and a one-shot event, for asio 1.22 (no any_completion_handler).
//
// A stored handler is always completed by posting to its associated executor, never inline, so a
// completion cannot re-enter the code that triggered it. While stored it keeps that executor's
// outstanding work, so a plain thread waiting on a std::future keeps the io_context alive.
#pragma once

#include <pscoro/config.hpp>

#include <asio/any_io_executor.hpp>
#include <asio/associated_executor.hpp>
#include <asio/async_result.hpp>
#include <asio/execution.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/prefer.hpp>
#include <asio/strand.hpp>

#include <functional>
#include <future>
#include <memory>
#include <utility>
#include <vector>

namespace pscoro::detail {

template <class Signature>
class erased_handler;

template <class... Args>
class erased_handler<void(Args...)> {
  struct base {
    virtual ~base() = default;
    virtual void post(Args... args) = 0;
  };

  template <class Handler, class Executor>
  struct impl final : base {
    using work_executor = std::decay_t<decltype(asio::prefer(
        std::declval<asio::associated_executor_t<Handler, Executor>>(),
        asio::execution::outstanding_work.tracked))>;

    impl(Handler&& h, const Executor& fallback)
        : handler(std::move(h)),
          work(asio::prefer(asio::get_associated_executor(handler, fallback),
                            asio::execution::outstanding_work.tracked)) {}

    void post(Args... args) override {
      asio::post(work, [h = std::move(handler), ... a = std::move(args)]() mutable {
        std::move(h)(std::move(a)...);
      });
    }

    Handler handler;
    work_executor work;
  };

 public:
  erased_handler() = default;

  /// Stores `handler`; it completes on its associated executor, or `fallback` if it has none.
  template <class Handler, class Executor>
  erased_handler(Handler&& handler, const Executor& fallback)
      : impl_(std::make_unique<impl<std::decay_t<Handler>, Executor>>(std::forward<Handler>(handler),
                                                                      fallback)) {}

  explicit operator bool() const noexcept { return impl_ != nullptr; }

  /// Posts the handler with `args`; the erased_handler is empty afterwards. Calling an empty one
  /// throws std::bad_function_call, as std::function does.
  void operator()(Args... args) {
    if (!impl_) throw std::bad_function_call();
    auto stored = std::move(impl_);
    stored->post(std::move(args)...);
  }

 private:
  std::unique_ptr<base> impl_;
};

/// True when the caller runs inside `executor` (an io_context executor or a strand over one).
inline bool running_in_this_thread(const asio::any_io_executor& executor) {
  if (auto* io = executor.target<asio::io_context::executor_type>()) return io->running_in_this_thread();
  if (auto* strand = executor.target<asio::strand<asio::io_context::executor_type>>()) {
    return strand->running_in_this_thread();
  }
  return false;
}

/// Runs `f` on `executor` and returns its result: inline when already there, else posts and
/// blocks the calling thread until it has run (exceptions propagate).
template <class F>
auto run_on(const asio::any_io_executor& executor, F&& f) -> decltype(f()) {
  if (running_in_this_thread(executor)) return f();
  std::packaged_task<decltype(f())()> task(std::forward<F>(f));
  auto result = task.get_future();
  asio::post(executor, [&task] { task(); });
  return result.get();
}

/// A one-shot event on a single executor: waiters complete (posted) once `set()` is called.
/// Not thread-safe: use it from its executor only.
class PSCORO_API async_event {
 public:
  explicit async_event(asio::any_io_executor executor) : executor_(std::move(executor)) {}

  bool is_set() const noexcept { return set_; }

  void set() {
    set_ = true;
    auto waiters = std::move(waiters_);
    waiters_.clear();
    for (auto& waiter : waiters) waiter();
  }

  /// Completes with signature void() once the event is set (at once, posted, if it already is).
  template <class CompletionToken>
  auto async_wait(CompletionToken&& token) {
    return asio::async_initiate<CompletionToken, void()>(
        [this](auto handler) {
          erased_handler<void()> stored(std::move(handler), executor_);
          if (set_) {
            stored();
          } else {
            waiters_.push_back(std::move(stored));
          }
        },
        token);
  }

  const asio::any_io_executor& get_executor() const noexcept { return executor_; }

 private:
  asio::any_io_executor executor_;
  bool set_ = false;
  std::vector<erased_handler<void()>> waiters_;
};

}  // namespace pscoro::detail

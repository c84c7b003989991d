// The future result of a scheduled worker function (TF's RemoteValue).
//
// A remote_value starts not_ready and ends ready (a value), error (the function failed) or
// cancelled (an earlier closure failed and this one was dropped before it ran). A coroutine on the
// coordinator's executor awaits `get()`; a plain thread calls `fetch()`, which blocks.
#pragma once

#include <pscoro/config.hpp>

#include <pscoro/detail/completion.hpp>
#include <pscoro/error.hpp>
#include <pscoro/value.hpp>

#include <asio/awaitable.hpp>
#include <asio/dispatch.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/use_future.hpp>

#include <atomic>
#include <exception>
#include <memory>

namespace pscoro {

enum class remote_status { not_ready, ready, error, cancelled };

namespace detail {

/// The shared state of a remote_value. Written on the coordinator's executor only; waited on from
/// anywhere (waits hop to the executor first).
class PSCORO_API remote_state : public std::enable_shared_from_this<remote_state> {
 public:
  remote_state(asio::any_io_executor executor, decode_context context)
      : ready_(std::move(executor)), context_(std::move(context)) {}

  remote_status status() const noexcept { return status_.load(std::memory_order_acquire); }

  // Called on the executor, once.
  void set_value(value v) {
    result_ = std::move(v);
    finish(remote_status::ready);
  }
  void set_error(std::exception_ptr e, remote_status how = remote_status::error) {
    error_ = std::move(e);
    finish(how);
  }
  const std::exception_ptr& error() const noexcept { return error_; }

  /// Completes with signature void() once the state is no longer not_ready.
  template <class CompletionToken>
  auto async_wait(CompletionToken&& token) {
    return asio::async_initiate<CompletionToken, void()>(
        [self = shared_from_this()](auto handler) {
          asio::dispatch(self->ready_.get_executor(), [self, h = std::move(handler)]() mutable {
            self->ready_.async_wait(std::move(h));
          });
        },
        token);
  }

  /// The result as R; rethrows the error. Only after a wait has completed.
  template <class R>
  R result() const {
    if (error_) std::rethrow_exception(error_);
    if constexpr (!std::is_void_v<R>) return codec<R>::decode(value(result_), context_);
  }

  const asio::any_io_executor& get_executor() const noexcept { return ready_.get_executor(); }

 private:
  void finish(remote_status how) {
    status_.store(how, std::memory_order_release);
    ready_.set();
  }

  async_event ready_;
  decode_context context_;
  std::atomic<remote_status> status_{remote_status::not_ready};
  value result_;
  std::exception_ptr error_;
};

}  // namespace detail

/// The result of one scheduled closure. A default-constructed remote_value (a placeholder, e.g. in
/// a vector resized before scheduling) is empty: every accessor throws errc::failed_precondition.
template <class R>
class remote_value {
 public:
  remote_value() = default;
  explicit remote_value(std::shared_ptr<detail::remote_state> state) : state_(std::move(state)) {}

  remote_status status() const { return state().status(); }

  /// Waits for the result from a coroutine; throws the function's error, or errc::cancelled.
  [[nodiscard]] asio::awaitable<R> get() const {
    (void)state();  // an empty remote_value throws here, at the call
    return get_from(state_);
  }

  /// Blocks the calling thread until the result is there; same results as get(). Must not be
  /// called on the coordinator's executor (that thread would wait on itself).
  [[nodiscard]] R fetch() const {
    if (detail::running_in_this_thread(state().get_executor())) {
      throw error(errc::failed_precondition,
                  "remote_value::fetch() blocks; on the coordinator's executor use co_await get()");
    }
    state_->async_wait(asio::use_future).get();
    return state_->template result<R>();
  }

 private:
  const detail::remote_state& state() const {
    if (!state_) {
      throw error(errc::failed_precondition,
                  "this remote_value is empty: it was default-constructed and never returned by schedule()");
    }
    return *state_;
  }

  static asio::awaitable<R> get_from(std::shared_ptr<detail::remote_state> state) {
    co_await state->async_wait(asio::use_awaitable);
    co_return state->template result<R>();
  }

  std::shared_ptr<detail::remote_state> state_;
};

}  // namespace pscoro

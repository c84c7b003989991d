// ClusterCoordinator: schedules worker functions on workers and reports their results and errors.
//
//   pscoro::cluster_coordinator coordinator(strategy);
//   for (int step = 0; step < 1000; ++step) coordinator.schedule(train_step, w, step);
//   co_await coordinator.join();      // throws the first error, once
//
// schedule() never waits on the network: it queues a closure and returns its remote_value. The
// coordinator's executor sends queued closures to workers with a free slot (several in flight per
// worker). Error contract (TF's): the first error of a closure is raised once, by the next
// schedule, join or done, then cleared; closures still queued then are cancelled.
#pragma once

#include <pscoro/config.hpp>

#include <pscoro/coordinator_options.hpp>
#include <pscoro/detail/completion.hpp>
#include <pscoro/metrics.hpp>
#include <pscoro/per_worker.hpp>
#include <pscoro/remote_value.hpp>
#include <pscoro/strategy.hpp>
#include <pscoro/worker_function.hpp>

#include <asio/async_result.hpp>
#include <asio/awaitable.hpp>
#include <asio/use_awaitable.hpp>

#include <exception>
#include <chrono>
#include <memory>
#include <optional>
#include <tuple>
#include <vector>

namespace pscoro {

namespace detail {
/// Builds a fresh iterator of `function` on every worker, concurrently; completes when all exist
/// (throws the first failure, naming the worker).
PSCORO_API asio::awaitable<per_worker_ref> create_per_worker_iterators(std::shared_ptr<coordinator_core> core,
                                                            std::string function);
/// Makes per-worker variable `variable` holding `initial_value` on every worker, as above.
PSCORO_API asio::awaitable<per_worker_ref> create_per_worker_variables(std::shared_ptr<coordinator_core> core,
                                                                       variable_ref variable, tensor initial_value);
/// Builds a resource of resource function `function` on every worker, as above.
PSCORO_API asio::awaitable<per_worker_ref> create_per_worker_resources(std::shared_ptr<coordinator_core> core,
                                                                       std::string function);
}  // namespace detail

/// A dataset that every worker builds for itself (TF's per-worker dataset); iter() makes iterators.
template <class T>
class per_worker_dataset {
 public:
  per_worker_dataset(std::shared_ptr<detail::coordinator_core> core, std::string function)
      : core_(std::move(core)), function_(std::move(function)) {}

  /// A fresh iterator on every worker (each from the start of its data), created before any closure
  /// can use it: pass the result to schedule(). Throws the first worker's failure (an unbound
  /// dataset function is errc::not_found naming it).
  [[nodiscard]] asio::awaitable<per_worker_iterator<T>> iter() const { return iter_on(core_, function_); }

  const std::string& function() const noexcept { return function_; }

 private:
  static asio::awaitable<per_worker_iterator<T>> iter_on(std::shared_ptr<detail::coordinator_core> core,
                                                         std::string function) {
    co_return per_worker_iterator<T>(co_await detail::create_per_worker_iterators(std::move(core), std::move(function)));
  }

  std::shared_ptr<detail::coordinator_core> core_;
  std::string function_;
};

class PSCORO_API cluster_coordinator {
 public:
  /// The coordinator of `strategy`; the strategy must outlive it. Like TF, there is one per
  /// strategy: a second coordinator shares the first one's queue and options, so this one takes
  /// the first one's options (the defaults when it is the first).
  explicit cluster_coordinator(parameter_server_strategy& strategy);
  /// As above, with `options`; throws errc::invalid_argument when the strategy already has a
  /// coordinator with different ones (they would change under it), or when they are invalid.
  cluster_coordinator(parameter_server_strategy& strategy, coordinator_options options);

  /// Queues `function(args...)` and returns its result handle. Throws the pending error of an
  /// earlier closure, if any (then clears it). From any thread but the coordinator's executor, a
  /// full queue makes it wait for room (TF); on the executor, where waiting would stall
  /// everything, a full queue throws errc::resource_exhausted: use `wait_and_schedule` there.
  template <class R, class... Params, class... Args>
  remote_value<R> schedule(const worker_function<R(Params...)>& function, Args&&... args) {
    return remote_value<R>(schedule_erased(function.name(), function.signature(), encode_arguments<Params...>(std::forward<Args>(args)...)));
  }

  /// Like schedule, but on the coordinator's executor: waits for room in the queue first.
  template <class R, class... Params, class... Args>
  [[nodiscard]] asio::awaitable<remote_value<R>> wait_and_schedule(const worker_function<R(Params...)>& function,
                                                                   Args&&... args) {
    return wait_and_schedule_as<R>(core_, function.name(), function.signature(), encode_arguments<Params...>(std::forward<Args>(args)...));
  }

  /// Completes when every scheduled closure has finished, with signature
  /// void(std::exception_ptr): the first error since the last report, if any. A plain thread
  /// waits with `async_join(asio::use_future).get()`, which throws that error.
  template <class CompletionToken>
  auto async_join(CompletionToken&& token) {
    return asio::async_initiate<CompletionToken, void(std::exception_ptr)>(
        [this](auto handler) {
          join_erased(detail::erased_handler<void(std::exception_ptr)>(std::move(handler), executor()));
        },
        token);
  }

  /// The dataset that `function` builds on every worker (TF's create_per_worker_dataset). Nothing
  /// happens until iter().
  template <class T>
  per_worker_dataset<T> create_per_worker_dataset(const dataset_function<T>& function) const {
    return per_worker_dataset<T>(core_, function.name());
  }

  /// A variable with one copy on every worker, each starting as `initial_value` (TF's
  /// `tf.Variable(initial_value, per_worker_variable=True)`): completes when every live worker holds
  /// its copy (a worker lost before gets it when it comes back). Pass it to schedule(); a worker
  /// function reads and updates its own worker's copy; read_all() reads them all. Throws the first
  /// worker's failure, a worker lost while it is made included (remote_error, errc::unavailable),
  /// and then no worker keeps a copy. From a coroutine on the coordinator's executor.
  template <class E>
  [[nodiscard]] asio::awaitable<per_worker_variable<typename E::value_type>> create_per_worker_variable(
      std::string name, const xt::xexpression<E>& initial_value) const {
    using T = typename E::value_type;
    static_assert(is_element_type_v<T>, "a per-worker variable holds float, double, int32 or int64");
    // Converted before the coroutine starts: it must not hold a reference to the caller's expression.
    auto initial = to_tensor(initial_value);
    variable_ref variable{std::move(name), dtype_of<T>, initial.shape(), 0};
    return make_per_worker_variable<T>(core_, std::move(variable), std::move(initial));
  }

  /// A resource built on every worker by its bound `function` (TF's _create_per_worker_resources):
  /// completes when every live worker has built its own (a worker lost before builds it when it
  /// comes back, and so does a worker that comes back after a failure). Pass it to schedule(); a
  /// worker function gets its own worker's instance. Throws the first worker's failure (an unbound
  /// function is errc::not_found naming it; a worker lost while it is built, errc::unavailable),
  /// and then no worker keeps one. From a coroutine on the coordinator's executor.
  template <class T>
  [[nodiscard]] asio::awaitable<per_worker_resource<T>> create_per_worker_resource(
      const resource_function<T>& function) const {
    return make_per_worker_resource<T>(core_, function.name());
  }

  /// Waits for every scheduled closure; throws the first error (then clears it).
  [[nodiscard]] asio::awaitable<void> join() { return async_join(asio::use_awaitable); }

  /// Drains worker `worker` (its index, 0..num_workers()-1): from now on it takes no new closure
  /// and gets no new per-worker value; what runs there finishes and counts as usual (or, if the
  /// worker goes first, runs again elsewhere, as for a lost worker). Completes, with signature
  /// void(std::exception_ptr), once nothing runs there and it was told to drop its per-worker
  /// values (datasets' iterators, variables, resources); errc::invalid_argument for a worker the
  /// cluster does not have. A drained worker stays drained, connected or not, until resume(); it
  /// may leave (its loss is no failure). Draining a drained worker completes when nothing runs there.
  template <class CompletionToken>
  auto async_drain(std::size_t worker, CompletionToken&& token) {
    return asio::async_initiate<CompletionToken, void(std::exception_ptr)>(
        [this, worker](auto handler) {
          drain_erased(worker, detail::erased_handler<void(std::exception_ptr)>(std::move(handler), executor()));
        },
        token);
  }
  /// async_drain(worker) as a coroutine: throws what it completes with.
  [[nodiscard]] asio::awaitable<void> drain(std::size_t worker) { return async_drain(worker, asio::use_awaitable); }
  /// Brings drained worker `worker` back: reached again (it may have left and come back), its
  /// per-worker values made again (fresh iterators, variables at their initial value), then it
  /// takes closures. A drain still in progress is called off instead (its completion gets
  /// errc::cancelled) and the worker, which still holds its values, goes on at once. Nothing for a
  /// worker that is not drained; errc::invalid_argument for one the cluster does not have. Any
  /// thread; waits for the coordinator's executor unless on it.
  void resume(std::size_t worker);

  /// True when nothing is queued or running. Throws the pending error, if any (then clears it).
  [[nodiscard]] bool done();

  /// Speculative re-runs of `function`'s slow closures, as `options` say (speculation_options:
  /// for functions that may run twice). Throws errc::invalid_argument for a multiplier below 1 or
  /// a negative minimum run time. Any thread; waits for the coordinator's executor unless on it.
  template <class Signature>
  void speculate(const worker_function<Signature>& function, speculation_options options = {}) {
    speculate_erased(function.name(), options);
  }

  /// TF's coordinator metrics for this coordinator's strategy, read now: closures queued and in
  /// flight, closure execution and result fetch times, workers and ps lost, iterators rebuilt
  /// (the same values process_registry() exposes as pscoro_coordinator_*). Any thread.
  [[nodiscard]] metrics::coordinator_metrics metrics() const;

  /// The results of `values`, in order (TF's coordinator.fetch); throws the first failure.
  template <class R>
  [[nodiscard]] static asio::awaitable<std::vector<R>> fetch(std::vector<remote_value<R>> values) {
    std::vector<R> results;
    results.reserve(values.size());
    for (const auto& v : values) results.push_back(co_await v.get());
    co_return results;
  }
  /// The results of a tuple of remote values, as a tuple, in order; throws the first failure.
  template <class... R>
  [[nodiscard]] static asio::awaitable<std::tuple<R...>> fetch(std::tuple<remote_value<R>...> values) {
    std::tuple<std::optional<R>...> results;
    co_await fetch_into<0>(values, results);
    co_return std::apply([](auto&... r) { return std::tuple<R...>{std::move(*r)...}; }, results);
  }

 private:
  // One co_await per statement: g++ 12 mishandles several in one full-expression.
  template <std::size_t I, class... R>
  static asio::awaitable<void> fetch_into(const std::tuple<remote_value<R>...>& values,
                                          std::tuple<std::optional<R>...>& results) {
    if constexpr (I < sizeof...(R)) {
      std::get<I>(results) = co_await std::get<I>(values).get();
      co_await fetch_into<I + 1>(values, results);
    }
  }

  template <class T>
  static asio::awaitable<per_worker_variable<T>> make_per_worker_variable(std::shared_ptr<detail::coordinator_core> core,
                                                                          variable_ref variable, tensor initial) {
    std::weak_ptr<detail::coordinator_core> weak = core;
    auto created = detail::create_per_worker_variables(std::move(core), variable, std::move(initial));  // named: g++ 12
    auto ref = co_await std::move(created);
    co_return per_worker_variable<T>(std::move(ref), std::move(variable), std::move(weak));
  }
  template <class T>
  static asio::awaitable<per_worker_resource<T>> make_per_worker_resource(std::shared_ptr<detail::coordinator_core> core,
                                                                          std::string function) {
    auto created = detail::create_per_worker_resources(std::move(core), std::move(function));  // named: g++ 12
    co_return per_worker_resource<T>(co_await std::move(created));
  }

  template <class... Params, class... Args>
  static std::vector<value> encode_arguments(Args&&... args) {
    static_assert(sizeof...(Params) == sizeof...(Args), "schedule: wrong number of arguments");
    return {codec<std::decay_t<Params>>::encode(std::decay_t<Params>(std::forward<Args>(args)))...};
  }
  template <class R>
  static asio::awaitable<remote_value<R>> wait_and_schedule_as(std::shared_ptr<detail::coordinator_core> core,
                                                               std::string name, std::string signature,
                                                               std::vector<value> args) {
    co_return remote_value<R>(
        co_await wait_and_schedule_erased(std::move(core), std::move(name), std::move(signature), std::move(args)));
  }
  static asio::awaitable<std::shared_ptr<detail::remote_state>> wait_and_schedule_erased(
      std::shared_ptr<detail::coordinator_core> core, std::string name, std::string signature,
      std::vector<value> args);
  void speculate_erased(const std::string& function, const speculation_options& options);
  std::shared_ptr<detail::remote_state> schedule_erased(std::string name, std::string signature,
                                                        std::vector<value> args);
  void join_erased(detail::erased_handler<void(std::exception_ptr)> handler);
  void drain_erased(std::size_t worker, detail::erased_handler<void(std::exception_ptr)> handler);
  /// Takes `options` (or the shared ones) as the strategy's coordinator options.
  void adopt(std::optional<coordinator_options> options);
  const asio::any_io_executor& executor() const noexcept;

  std::shared_ptr<detail::coordinator_core> core_;
};

}  // namespace pscoro

// Values that exist once on every worker (TF's PerWorkerValues): per-worker datasets (TF's
// create_per_worker_dataset), per-worker variables (TF's `tf.Variable(..., per_worker_variable=True)`)
// and per-worker resources (TF's _create_per_worker_resources). A scheduled function that takes one
// gets the copy of the worker it runs on; a worker that comes back after a failure gets each of them
// rebuilt (fresh iterators, variables from their initial value, resources by their function) before
// it takes a closure.
//
//   // Shared by chief and workers:
//   const pscoro::dataset_function<xt::xarray<float>> train_data{"model.train_data"};
//   const pscoro::worker_function<double(pscoro::per_worker_iterator<xt::xarray<float>>)> step{"model.step"};
//
//   // Worker: how to build its pipeline.
//   s.bind(train_data, [](pscoro::input_context context) {
//     return pscoro::criteo_tsv(files).shard(context.num_workers, context.worker_index).map(...).batch(512);
//   });
//   s.bind(step, [](pscoro::per_worker_iterator<xt::xarray<float>> it) -> asio::awaitable<double> {
//     const auto batch = co_await it.next_async();   // errc::out_of_range at the end of the data
//     ...
//   });
//
//   // Chief:
//   auto per_worker = coordinator.create_per_worker_dataset(train_data);
//   auto it = co_await per_worker.iter();      // a fresh iterator on every worker
//   coordinator.schedule(step, it);
//
// C++ cannot ship the dataset function, so like a worker function it is a named, typed handle the
// worker binds. The iterators live on the workers; the chief holds a reference.
//
// Per-worker variables and resources:
//
//   const pscoro::resource_function<lookup_table> table{"model.table"};     // shared by both sides
//   const pscoro::worker_function<double(pscoro::per_worker_variable<float>,
//                                        pscoro::per_worker_resource<lookup_table>)> step{"model.step"};
//   s.bind(table, [](pscoro::input_context) { return lookup_table(...); });  // worker
//   s.bind(step, [](auto seen, auto t) -> asio::awaitable<double> {
//     seen.assign_add(ones);               // this worker's own copy, in its memory: no network
//     co_return t->size();
//   });
//   auto seen = co_await coordinator.create_per_worker_variable("seen", zeros);   // chief
//   auto tables = co_await coordinator.create_per_worker_resource(table);
//   coordinator.schedule(step, seen, tables);
//   const auto each = co_await seen.read_all();   // one value per worker, in worker order
#pragma once

#include <pscoro/config.hpp>

#include <pscoro/dataset.hpp>
#include <pscoro/detail/per_worker_values.hpp>
#include <pscoro/metrics.hpp>
#include <pscoro/value.hpp>
#include <pscoro/xtensor.hpp>

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/co_spawn.hpp>
#include <asio/use_awaitable.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <vector>

namespace pscoro {

namespace detail {

class coordinator_core;

/// The value of per-worker variable `variable` (`ref`) on every worker, in worker order: the chief
/// asks every worker at once. A worker the chief has lost throws remote_error(errc::unavailable)
/// naming it (TF raises too), or, with lost_workers::skip, gives no value; a drained one gives none. Throws
/// errc::failed_precondition when the strategy is gone. On the chief's executor.
PSCORO_API asio::awaitable<std::vector<std::optional<tensor>>> read_per_worker_variable(
    std::weak_ptr<coordinator_core> core, per_worker_ref ref, variable_ref variable, lost_workers lost);

/// A worker's iterator, read by closures on the worker's executor (next()) and on its input thread
/// (next_async()): one reader at a time.
template <class T>
class shared_iterator {
 public:
  shared_iterator(dataset_iterator<T> it, std::weak_ptr<input_thread> input)
      : it_(std::move(it)), input_(std::move(input)) {}
  std::optional<T> next() {
    const std::lock_guard lock(mutex_);
    auto item = it_.next();
    if (item) pscoro::metrics::detail::dataset_elements().inc();
    return item;
  }
  /// The worker's input thread, if the worker still runs.
  std::shared_ptr<input_thread> input() const { return input_.lock(); }

 private:
  std::mutex mutex_;
  dataset_iterator<T> it_;
  std::weak_ptr<input_thread> input_;
};

template <class T>
asio::awaitable<std::optional<T>> next_of(std::shared_ptr<shared_iterator<T>> it) {
  co_return it->next();
}

template <class T, class F>
erased_dataset_function erase_dataset_function(F&& f) {
  static_assert(std::is_convertible_v<std::invoke_result_t<std::decay_t<F>&, const input_context&>, dataset<T>>,
                "a dataset function must be callable as pscoro::dataset<T>(pscoro::input_context)");
  return {&typeid(T),
          [f = std::forward<F>(f)](const input_context& context,
                                   std::weak_ptr<input_thread> input) -> std::shared_ptr<void> {
            const dataset<T> d = f(context);
            return std::make_shared<shared_iterator<T>>(d.make_iterator(), std::move(input));
          }};
}

}  // namespace detail

/// An iterator that exists on every worker: on the chief a reference to pass to schedule(); in a
/// worker function, the iterator of the worker it runs on. When the last copy on the chief is gone
/// (and no closure that takes it waits to run), the workers drop their iterators.
template <class T>
class per_worker_iterator {
 public:
  per_worker_iterator() = default;
  explicit per_worker_iterator(per_worker_ref ref, std::shared_ptr<detail::shared_iterator<T>> local = {})
      : ref_(std::move(ref)), local_(std::move(local)) {}

  /// The next element of this worker's pass, produced on the worker's input thread while its
  /// executor serves everything else (heartbeats, other closures, the chief's requests). At the end
  /// of the data: errc::out_of_range ("End of sequence", TF's OutOfRangeError), which travels to the
  /// chief like any function error. Only in a worker function.
  [[nodiscard]] asio::awaitable<T> next_async() const { return next_async_of(local_, ref_.function); }

  /// The same, produced on the calling thread: while the pipeline works (reads and decodes a file,
  /// say), the worker's executor waits with it. Right where an element is always ready (a pipeline
  /// that ends in prefetch and keeps up); next_async() everywhere else.
  T next() {
    return element_of(checked(local_, ref_.function)->next(), ref_.function);
  }

  const per_worker_ref& ref() const noexcept { return ref_; }

 private:
  static const std::shared_ptr<detail::shared_iterator<T>>& checked(
      const std::shared_ptr<detail::shared_iterator<T>>& local, const std::string& function) {
    if (!local) {
      throw error(errc::failed_precondition,
                  "a per-worker iterator of '" + function + "' is read inside a worker function, not on the chief");
    }
    return local;
  }
  static T element_of(std::optional<T> item, const std::string& function) {
    if (!item) throw error(errc::out_of_range, "End of sequence (the dataset of '" + function + "' is exhausted)");
    return std::move(*item);
  }
  // Takes copies: the iterator handle may go before the caller resumes.
  static asio::awaitable<T> next_async_of(std::shared_ptr<detail::shared_iterator<T>> local, std::string function) {
    std::optional<asio::any_io_executor> input;
    if (const auto thread = checked(local, function)->input()) input = thread->executor();
    if (!input) throw error(errc::unavailable, "the worker stopped: '" + function + "' cannot be read any more");
    auto read = detail::next_of<T>(local);  // named: g++ 12 (temporaries)
    auto item = co_await asio::co_spawn(*input, std::move(read), asio::use_awaitable);
    co_return element_of(std::move(item), function);
  }

  per_worker_ref ref_;
  std::shared_ptr<detail::shared_iterator<T>> local_;
};

template <class T>
struct codec<per_worker_iterator<T>> {
  static constexpr std::string_view name = "per_worker_iterator";
  static value encode(const per_worker_iterator<T>& it) { return it.ref(); }
  static per_worker_iterator<T> decode(value&& v, const decode_context& context) {
    auto* ref = std::get_if<per_worker_ref>(&v);
    if (!ref) detail::throw_decode_mismatch(name, v);
    if (!context.per_worker) return per_worker_iterator<T>(std::move(*ref));  // on the chief: a reference
    auto local = context.per_worker->template get<T>(ref->id, ref->function);
    return per_worker_iterator<T>(std::move(*ref), std::move(local));
  }
};

/// A variable with one copy on every worker (TF's `tf.Variable(..., per_worker_variable=True)`): on
/// the chief a handle to pass to schedule() and to read every worker's copy with read_all(); in a
/// worker function, that worker's own copy, read and updated in its memory (no network). Every copy
/// starts from the initial value, and so does the copy of a worker that comes back after a failure.
/// When the last copy of the handle on the chief is gone (and no closure that takes it waits to
/// run), the workers drop theirs.
template <class T>
  requires is_element_type_v<T>
class per_worker_variable {
 public:
  using value_type = T;

  per_worker_variable() = default;
  /// The chief's handle.
  per_worker_variable(per_worker_ref ref, variable_ref variable, std::weak_ptr<detail::coordinator_core> core = {})
      : ref_(std::move(ref)), variable_(std::move(variable)), core_(std::move(core)) {}
  /// A worker's handle to its own copy.
  per_worker_variable(per_worker_ref ref, std::shared_ptr<detail::local_variable> local)
      : ref_(std::move(ref)), variable_(local->ref), local_(std::move(local)) {}

  const std::string& name() const noexcept { return variable_.name; }
  const shape_type& shape() const noexcept { return variable_.shape; }
  static constexpr pscoro::dtype dtype() noexcept { return dtype_of<T>; }
  const per_worker_ref& ref() const noexcept { return ref_; }

  // Integers wrap around, as the ps's kernels do: in unsigned arithmetic, where overflow is defined.
  static T wrapping_add(T x, T y) noexcept {
    if constexpr (std::is_integral_v<T>) {
      using U = std::make_unsigned_t<T>;
      return static_cast<T>(static_cast<U>(static_cast<U>(x) + static_cast<U>(y)));
    } else {
      return x + y;
    }
  }
  static T negated(T y) noexcept {
    if constexpr (std::is_integral_v<T>) {
      using U = std::make_unsigned_t<T>;
      return static_cast<T>(static_cast<U>(U{0} - static_cast<U>(y)));
    } else {
      return -y;
    }
  }

  /// This worker's value. Only in a worker function (errc::failed_precondition on the chief).
  xt::xarray<T> read() const { return to_xarray<T>(local().value); }
  /// Replaces this worker's value; `new_value` must have the variable's shape (else
  /// errc::invalid_argument naming both). Only in a worker function.
  template <class E>
  void assign(const xt::xexpression<E>& new_value) const {
    update("assign", new_value, [](T& x, T y) { x = y; });
  }
  /// Adds `delta` element-wise to this worker's value. Only in a worker function.
  template <class E>
  void assign_add(const xt::xexpression<E>& delta) const {
    update("assign_add", delta, [](T& x, T y) { x = wrapping_add(x, y); });
  }
  /// Subtracts `delta` element-wise from this worker's value. Only in a worker function.
  template <class E>
  void assign_sub(const xt::xexpression<E>& delta) const {
    update("assign_sub", delta, [](T& x, T y) { x = wrapping_add(x, negated(y)); });
  }

  /// Every worker's value, in worker order (TF's read_all()), asked of all workers at once. A
  /// worker the chief has lost makes it throw remote_error(errc::unavailable) naming that worker
  /// (TF raises too); a drained worker holds no copy and is left out. Only on the chief, from a coroutine on the coordinator's executor.
  [[nodiscard]] asio::awaitable<std::vector<xt::xarray<T>>> read_all() const {
    return read_all_of(core_, ref_, variable_, static_cast<bool>(local_));
  }
  /// As read_all(), but a worker the chief has lost, or loses during the read, gives no value
  /// instead of failing the read (TF has no such call): for a sum over the workers that are there.
  /// A drained worker gives no value either.
  [[nodiscard]] asio::awaitable<std::vector<std::optional<xt::xarray<T>>>> read_available() const {
    return read_available_of(core_, ref_, variable_, static_cast<bool>(local_));
  }

 private:
  detail::local_variable& local() const {
    if (!local_) {
      throw error(errc::failed_precondition, "per-worker variable '" + variable_.name +
                                                 "' is read or updated inside a worker function, not on the chief "
                                                 "(read_all() reads every worker's copy)");
    }
    return *local_;
  }
  template <class E, class Op>
  void update(const char* what, const xt::xexpression<E>& operand, Op op) const {
    auto& target = local();
    const xt::xarray<T> given = operand.derived_cast();
    const shape_type value_shape(given.shape().begin(), given.shape().end());
    if (value_shape != target.ref.shape) {
      throw error(errc::invalid_argument, std::string(what) + " to per-worker variable '" + target.ref.name +
                                              "': the value has shape " + to_string(value_shape) +
                                              ", the variable " + to_string(target.ref.shape));
    }
    // Copy on write: a reply to read_all() may still be sending these bytes.
    if (!target.value.bytes().unique()) {
      tensor copy = tensor::uninitialized(target.value.type(), target.value.shape());
      std::copy_n(target.value.template data<T>(), target.value.size(), copy.template mutable_data<T>());
      target.value = std::move(copy);
    }
    T* data = target.value.template mutable_data<T>();
    const T* in = given.data();
    for (std::size_t i = 0, n = given.size(); i < n; ++i) op(data[i], in[i]);
  }
  static asio::awaitable<std::vector<xt::xarray<T>>> read_all_of(std::weak_ptr<detail::coordinator_core> core,
                                                                 per_worker_ref ref, variable_ref variable,
                                                                 bool on_worker) {
    check_on_chief("read_all", variable, on_worker);
    auto read = detail::read_per_worker_variable(std::move(core), std::move(ref), std::move(variable),
                                                 detail::lost_workers::fail);  // named: g++ 12
    const auto tensors = co_await std::move(read);
    std::vector<xt::xarray<T>> out;
    out.reserve(tensors.size());
    for (const auto& t : tensors) {
      if (t) out.push_back(to_xarray<T>(*t));  // none: a drained worker, which holds no copy
    }
    co_return out;
  }
  static asio::awaitable<std::vector<std::optional<xt::xarray<T>>>> read_available_of(
      std::weak_ptr<detail::coordinator_core> core, per_worker_ref ref, variable_ref variable, bool on_worker) {
    check_on_chief("read_available", variable, on_worker);
    auto read = detail::read_per_worker_variable(std::move(core), std::move(ref), std::move(variable),
                                                 detail::lost_workers::skip);  // named: g++ 12
    const auto tensors = co_await std::move(read);
    std::vector<std::optional<xt::xarray<T>>> out;
    out.reserve(tensors.size());
    for (const auto& t : tensors) {
      out.push_back(t ? std::optional<xt::xarray<T>>(to_xarray<T>(*t)) : std::nullopt);
    }
    co_return out;
  }
  static void check_on_chief(std::string_view call, const variable_ref& variable, bool on_worker) {
    if (on_worker) {
      throw error(errc::failed_precondition, std::string(call) + "() of per-worker variable '" + variable.name +
                                                 "' is called in a worker function: read() reads this worker's copy");
    }
  }

  per_worker_ref ref_;
  variable_ref variable_;
  std::weak_ptr<detail::coordinator_core> core_;
  std::shared_ptr<detail::local_variable> local_;
};

template <class T>
struct codec<per_worker_variable<T>> {
  static constexpr std::string_view name = "per_worker_variable";
  static value encode(const per_worker_variable<T>& v) { return v.ref(); }
  static per_worker_variable<T> decode(value&& v, const decode_context& context) {
    auto* ref = std::get_if<per_worker_ref>(&v);
    if (!ref) detail::throw_decode_mismatch(name, v);
    if (!context.per_worker) {  // on the chief: a reference
      return per_worker_variable<T>(*ref, variable_ref{ref->function, dtype_of<T>, {}, 0});
    }
    auto local = context.per_worker->variable(ref->id, ref->function);
    if (local->ref.type != dtype_of<T>) {
      detail::throw_dtype_mismatch(dtype_of<T>, "per-worker variable", local->ref.type, local->ref.name);
    }
    return per_worker_variable<T>(std::move(*ref), std::move(local));
  }
};

/// A resource with one instance on every worker, built there by a bound resource_function<T> (TF's
/// _create_per_worker_resources): on the chief a handle to pass to schedule(); in a worker function,
/// that worker's instance (get(), *, ->). A worker that comes back after a failure gets it built
/// again by the function. When the last copy of the handle on the chief is gone (and no closure
/// that takes it waits to run), the workers drop theirs.
template <class T>
class per_worker_resource {
 public:
  using resource_type = T;

  per_worker_resource() = default;
  explicit per_worker_resource(per_worker_ref ref, std::shared_ptr<T> local = {})
      : ref_(std::move(ref)), local_(std::move(local)) {}

  /// This worker's instance. Only in a worker function (errc::failed_precondition on the chief).
  T& get() const {
    if (!local_) {
      throw error(errc::failed_precondition,
                  "a per-worker resource of '" + ref_.function + "' is used inside a worker function, not on the chief");
    }
    return *local_;
  }
  T& operator*() const { return get(); }
  T* operator->() const { return &get(); }

  const per_worker_ref& ref() const noexcept { return ref_; }

 private:
  per_worker_ref ref_;
  std::shared_ptr<T> local_;
};

template <class T>
struct codec<per_worker_resource<T>> {
  static constexpr std::string_view name = "per_worker_resource";
  static value encode(const per_worker_resource<T>& r) { return r.ref(); }
  static per_worker_resource<T> decode(value&& v, const decode_context& context) {
    auto* ref = std::get_if<per_worker_ref>(&v);
    if (!ref) detail::throw_decode_mismatch(name, v);
    if (!context.per_worker) return per_worker_resource<T>(std::move(*ref));  // on the chief: a reference
    auto local = context.per_worker->template resource<T>(ref->id, ref->function);
    return per_worker_resource<T>(std::move(*ref), std::move(local));
  }
};

}  // namespace pscoro

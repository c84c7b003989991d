// Per-worker values (iterators, variables, resources) as a worker holds them and as the chief reads
// them, without datasets or xtensor: what the worker's service and the chief's bookkeeping need.
// The typed handles that make and use them are in <pscoro/per_worker.hpp>.
#pragma once

#include <pscoro/config.hpp>

#include <pscoro/error.hpp>
#include <pscoro/value.hpp>
#include <pscoro/worker_function.hpp>

#include <asio/any_io_executor.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <typeinfo>

namespace pscoro::detail {

/// What a read of every worker's copy does about a worker the chief has lost, or loses meanwhile.
enum class lost_workers { fail, skip };

/// A thread of a worker, off its executor: its input thread, where next_async() runs pipelines, or
/// its build thread, where dataset and resource functions build their values. Made on first use;
/// owned by the worker, whose stop() stops it while the worker's executor still exists (what waits
/// there then never completes into an executor that is gone). Used on the worker's executor.
class PSCORO_API input_thread {
 public:
  input_thread();
  ~input_thread();
  input_thread(const input_thread&) = delete;
  input_thread& operator=(const input_thread&) = delete;

  /// Where this thread runs what is posted (pipelines, or builds); none once stopped.
  std::optional<asio::any_io_executor> executor();
  /// Joins the thread (after the element it is producing) and drops what waits for it.
  void stop() noexcept;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
  bool stopped_ = false;
};

/// A worker's iterator of T's (<pscoro/per_worker.hpp>).
template <class T>
class shared_iterator;

/// A worker's per-worker variable: the chief's description (name, dtype, shape; no ps) and its
/// value, in this worker's memory. Used on the worker's executor only.
struct local_variable {
  variable_ref ref;
  tensor value;
};

/// A worker's per-worker values (iterators, variables, resources), by the id the chief chose. Used on
/// the worker's executor only.
class per_worker_table {
 public:
  enum class kind { iterator, variable, resource };
  struct entry {
    kind what = kind::iterator;
    std::string function;  // the dataset or resource function that made it, or the variable's name
    const std::type_info* element_type = nullptr;  // iterators' elements, resources' type
    std::shared_ptr<void> object;  // a shared_iterator<T>, a local_variable or a T
  };

  /// Keeps `e` under `id`, replacing what was there (a worker that comes back gets it rebuilt).
  void put(std::uint64_t id, entry e) { entries_[id] = std::move(e); }
  /// Drops value `id`, if there is one (a closure still using it keeps it until it is done).
  void erase(std::uint64_t id) noexcept { entries_.erase(id); }
  std::size_t size() const noexcept { return entries_.size(); }
  /// Drops every value (a closure still using one keeps it alive until it is done).
  void clear() noexcept { entries_.clear(); }

  /// The iterator `id` as a dataset_iterator<T>; throws errc::not_found or errc::invalid_argument.
  template <class T>
  std::shared_ptr<shared_iterator<T>> get(std::uint64_t id, const std::string& function) const {
    const auto& e = find(id, kind::iterator, "iterator " + std::to_string(id) + " of '" + function + "'");
    if (*e.element_type != typeid(T)) {
      throw error(errc::invalid_argument, "iterator of '" + function +
                                              "' is read with another element type than its dataset function makes");
    }
    return std::static_pointer_cast<shared_iterator<T>>(e.object);
  }
  /// The per-worker variable `id` (`name` for messages); throws errc::not_found.
  std::shared_ptr<local_variable> variable(std::uint64_t id, const std::string& name) const {
    const auto& e = find(id, kind::variable, "per-worker variable " + std::to_string(id) + " ('" + name + "')");
    return std::static_pointer_cast<local_variable>(e.object);
  }
  /// The per-worker resource `id` of `function`, a T; throws errc::not_found or errc::invalid_argument.
  template <class T>
  std::shared_ptr<T> resource(std::uint64_t id, const std::string& function) const {
    const auto& e = find(id, kind::resource, "per-worker resource " + std::to_string(id) + " of '" + function + "'");
    if (*e.element_type != typeid(T)) {
      throw error(errc::invalid_argument, "per-worker resource of '" + function +
                                              "' is used as another type than its resource function makes");
    }
    return std::static_pointer_cast<T>(e.object);
  }

 private:
  const entry& find(std::uint64_t id, kind what, const std::string& described) const {
    const auto it = entries_.find(id);
    if (it == entries_.end() || it->second.what != what) {
      throw error(errc::not_found, described + " does not exist on this worker (it was not created here, or it "
                                               "was released)");
    }
    return it->second;
  }

  std::map<std::uint64_t, entry> entries_;
};

/// A bound dataset function, type-erased: builds a fresh iterator for an input context.
struct erased_dataset_function {
  const std::type_info* element_type;
  std::function<std::shared_ptr<void>(const input_context&, std::weak_ptr<input_thread>)> make_iterator;
};

/// A bound resource function, type-erased: builds the resource for an input context.
struct erased_resource_function {
  const std::type_info* type;
  std::function<std::shared_ptr<void>(const input_context&)> make;
};

template <class T, class F>
erased_resource_function erase_resource_function(F&& f) {
  static_assert(std::is_convertible_v<std::invoke_result_t<std::decay_t<F>&, const input_context&>, T>,
                "a resource function must be callable as T(pscoro::input_context)");
  return {&typeid(T), [f = std::forward<F>(f)](const input_context& context) -> std::shared_ptr<void> {
            return std::make_shared<T>(f(context));
          }};
}

}  // namespace pscoro::detail

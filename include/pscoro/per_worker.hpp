// Per-worker datasets (TF's create_per_worker_dataset): every worker builds its own input pipeline,
// and a scheduled function reads the iterator of the worker it runs on.
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
//     const auto batch = it.next();   // errc::out_of_range at the end of the data
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
#pragma once

#include <pscoro/config.hpp>

#include <pscoro/dataset.hpp>
#include <pscoro/value.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <typeinfo>

namespace pscoro {

/// What a worker's dataset function knows about its place among the workers (TF's InputContext:
/// input_pipeline_id, num_input_pipelines).
struct input_context {
  std::int64_t worker_index = 0;
  std::int64_t num_workers = 1;
};

/// A named handle to a function that builds a worker's dataset of T; bound on workers with
/// server::bind, used on the chief with cluster_coordinator::create_per_worker_dataset.
template <class T>
class dataset_function {
 public:
  using element_type = T;
  explicit dataset_function(std::string name) : name_(std::move(name)) {}
  const std::string& name() const noexcept { return name_; }

 private:
  std::string name_;
};

namespace detail {

/// A worker's live iterators, by id. Used on the worker's executor only.
class iterator_table {
 public:
  struct entry {
    std::string function;
    const std::type_info* element_type;
    std::shared_ptr<void> iterator;  // a dataset_iterator<T>
  };

  void put(std::uint64_t id, entry e) { entries_[id] = std::move(e); }
  /// Drops every iterator (a closure still reading one keeps it alive until it is done).
  void clear() noexcept { entries_.clear(); }
  /// The iterator `id` as a dataset_iterator<T>; throws errc::not_found or errc::invalid_argument.
  template <class T>
  std::shared_ptr<dataset_iterator<T>> get(std::uint64_t id, const std::string& function) const {
    const auto it = entries_.find(id);
    if (it == entries_.end()) {
      throw error(errc::not_found, "iterator " + std::to_string(id) + " of '" + function +
                                       "' does not exist on this worker (it was not created here)");
    }
    if (*it->second.element_type != typeid(T)) {
      throw error(errc::invalid_argument, "iterator of '" + function +
                                              "' is read with another element type than its dataset function makes");
    }
    return std::static_pointer_cast<dataset_iterator<T>>(it->second.iterator);
  }

 private:
  std::map<std::uint64_t, entry> entries_;
};

/// A bound dataset function, type-erased: builds a fresh iterator for an input context.
struct erased_dataset_function {
  const std::type_info* element_type;
  std::function<std::shared_ptr<void>(const input_context&)> make_iterator;
};

template <class T, class F>
erased_dataset_function erase_dataset_function(F&& f) {
  static_assert(std::is_convertible_v<std::invoke_result_t<std::decay_t<F>&, const input_context&>, dataset<T>>,
                "a dataset function must be callable as pscoro::dataset<T>(pscoro::input_context)");
  return {&typeid(T), [f = std::forward<F>(f)](const input_context& context) -> std::shared_ptr<void> {
            const dataset<T> d = f(context);
            return std::make_shared<dataset_iterator<T>>(d.make_iterator());
          }};
}

}  // namespace detail

/// An iterator that exists on every worker: on the chief a reference to pass to schedule(); in a
/// worker function, the iterator of the worker it runs on.
template <class T>
class per_worker_iterator {
 public:
  per_worker_iterator() = default;
  explicit per_worker_iterator(per_worker_ref ref, std::shared_ptr<dataset_iterator<T>> local = {})
      : ref_(std::move(ref)), local_(std::move(local)) {}

  /// The next element of this worker's pass. At the end of the data: errc::out_of_range ("End of
  /// sequence", TF's OutOfRangeError), which travels to the chief like any function error. Runs the
  /// pipeline on the calling thread (use prefetch to have elements ready). Only on a worker.
  T next() {
    if (!local_) {
      throw error(errc::failed_precondition,
                  "a per-worker iterator of '" + ref_.function + "' is read inside a worker function, not on the chief");
    }
    auto item = local_->next();
    if (!item) throw error(errc::out_of_range, "End of sequence (the dataset of '" + ref_.function + "' is exhausted)");
    return std::move(*item);
  }

  const per_worker_ref& ref() const noexcept { return ref_; }

 private:
  per_worker_ref ref_;
  std::shared_ptr<dataset_iterator<T>> local_;
};

template <class T>
struct codec<per_worker_iterator<T>> {
  static constexpr std::string_view name = "per_worker_iterator";
  static value encode(const per_worker_iterator<T>& it) { return it.ref(); }
  static per_worker_iterator<T> decode(value&& v, const decode_context& context) {
    auto* ref = std::get_if<per_worker_ref>(&v);
    if (!ref) detail::throw_decode_mismatch(name, v);
    if (!context.iterators) return per_worker_iterator<T>(std::move(*ref));  // on the chief: a reference
    auto local = context.iterators->template get<T>(ref->id, ref->function);
    return per_worker_iterator<T>(std::move(*ref), std::move(local));
  }
};

}  // namespace pscoro

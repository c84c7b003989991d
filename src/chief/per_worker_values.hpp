// The chief's per-worker values: iterators of dataset functions, per-worker variables and
// resources, made on every worker, remembered while a lease on them lives, and made again, in
// order, on a worker that comes back before it takes a closure (TF's contract). Used on the
// chief's executor only; detail::coordinator_core owns it and calls prepare() when a worker
// returns.
#pragma once

#include <pscoro/detail/per_worker_values.hpp>
#include <pscoro/value.hpp>

#include "chief/cluster_connections.hpp"
#include "wire/frame.hpp"

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace pscoro::chief {

class per_worker_values : public std::enable_shared_from_this<per_worker_values> {
 public:
  enum class kind { iterator, variable, resource };

  per_worker_values(asio::any_io_executor executor, std::shared_ptr<cluster_connections> connections);

  /// Builds a fresh iterator of dataset function `function` on every ready worker; completes when
  /// all exist, with their common id and a lease: when its last copy is gone, release(id).
  asio::awaitable<per_worker_ref> create_iterators(std::string function);
  /// Makes per-worker variable `variable` on every ready worker, holding `initial_value`; as
  /// create_iterators.
  asio::awaitable<per_worker_ref> create_variables(variable_ref variable, tensor initial_value);
  /// Builds a resource of resource function `function` on every ready worker; as create_iterators.
  asio::awaitable<per_worker_ref> create_resources(std::string function);
  /// Every worker's value of per-worker variable `variable` (`ref`), in worker order; a worker
  /// that is not ready fails it with remote_error(errc::unavailable) naming the worker, except a
  /// drained one, which holds no copy: its value is none.
  asio::awaitable<std::vector<std::optional<tensor>>> read_variable(per_worker_ref ref, variable_ref variable,
                                                                    detail::lost_workers lost);
  /// Value `id` has no lease left: it is not rebuilt on workers that come back any more, and each
  /// connected worker is told to drop its own (queued on the connection now, not awaited).
  void release(std::uint64_t id);
  /// `worker` was drained: it drops its copy of every live value (queued on its connection now,
  /// not awaited). It is not given new ones while drained, and gets them all again if resumed.
  void release_on(std::size_t worker);
  /// Makes every live value of `self` (none when null: the chief is gone) on `worker`, which came
  /// back, in the order they were made.
  static asio::awaitable<void> prepare(std::shared_ptr<per_worker_values> self, std::size_t worker);
  /// How many values of each kind live (indexed by kind).
  std::array<std::size_t, 3> counts() const noexcept;

 private:
  /// A value as the chief remembers it to rebuild it on a worker that comes back: an iterator
  /// (ref.function: its dataset function), a variable (its initial value), a resource
  /// (ref.function: its resource function).
  struct entry {
    kind what = kind::iterator;
    per_worker_ref ref;  // without the lease
    variable_ref variable;
    tensor initial_value;
  };
  /// Makes `e` (its id not yet chosen) on every ready worker; completes with its ref and lease.
  asio::awaitable<per_worker_ref> create(entry e);
  /// Makes `e` on `worker`; a worker lost on the way is marked lost (it builds `e` when it comes
  /// back), not a failure. Throws the worker's refusal.
  static asio::awaitable<void> create_on(std::shared_ptr<per_worker_values> self, std::size_t worker, const entry& e);
  /// The request that makes `e` on `worker`.
  wire::frame create_request(const entry& e, std::size_t worker) const;
  /// Reads per-worker variable `variable` (`id`) on `worker` into `out`.
  static asio::awaitable<void> read_on(std::shared_ptr<per_worker_values> self, std::size_t worker, std::uint64_t id,
                                       variable_ref variable, detail::lost_workers lost, std::optional<tensor>& out);

  asio::any_io_executor executor_;
  std::shared_ptr<cluster_connections> connections_;
  std::uint64_t next_id_ = 1;  // iterators, variables and resources share the ids
  std::vector<entry> live_;    // every live one, in the order made: rebuilt on a worker that comes back
};

}  // namespace pscoro::chief

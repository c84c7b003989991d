// ParameterServerStrategy: the chief's view of a cluster and the factory of its variables.
//
//   asio::io_context io;
//   pscoro::parameter_server_strategy strategy(io.get_executor(), resolver,
//                                              pscoro::min_size_partitioner{1 << 20, 2});
//   co_await strategy.connect();                         // reach every ps and worker
//   auto scope = strategy.scope();
//   auto w = co_await scope.create_variable("w", xt::zeros<float>({784, 10}));
//   auto table = co_await scope.create_sharded_variable<float>("embedding", {1'000'000, 16},
//                                                              pscoro::initializers::random_normal{});
//
// Variables and shards are placed round robin over the ps, one counter per strategy (as in TF).
// create_variable never splits; create_sharded_variable splits as the partitioner says (TF applies
// the partitioner to every variable; C++ needs the two result types told apart).
#pragma once

#include <pscoro/config.hpp>

#include <pscoro/cluster_spec.hpp>
#include <pscoro/hash_table.hpp>
#include <pscoro/initializers.hpp>
#include <pscoro/partitioners.hpp>
#include <pscoro/sharded_variable.hpp>
#include <pscoro/transport_options.hpp>
#include <pscoro/variable.hpp>
#include <pscoro/xtensor.hpp>

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <variant>

namespace pscoro {

namespace detail {
class coordinator_core;

template <class F>
using shard_result_t = std::remove_cvref_t<std::invoke_result_t<F&, const shard_info&>>;

/// F can fill a shard: `f(const shard_info&)` returns a tensor or an xtensor expression.
template <class F>
concept shard_initializer_callable =
    std::is_invocable_v<F&, const shard_info&> &&
    (std::is_same_v<shard_result_t<F>, tensor> || xt::is_xexpression<shard_result_t<F>>::value);
}  // namespace detail

struct strategy_options {
  transport_options transport;
  /// Whether the ps and worker tasks keep serving when the chief closes, for a next chief (one
  /// restarted from a checkpoint, say), as TF's servers do. Off: close() ends the job, and every
  /// server started by run_server exits with the chief's code. PSCORO_KEEP_SERVERS=1 in the
  /// chief's environment turns it on, =0 off.
  bool keep_servers = false;
  /// Serve this process's metrics (<pscoro/metrics.hpp>) at http://HOST:PORT/metrics on this port
  /// (0: a free one; the chief logs the URL), on the host of the chief's cluster-spec address
  /// (loopback without one). Off when empty. PSCORO_METRICS_PORT in the environment overrides it.
  std::optional<std::uint16_t> metrics_port;
};

class PSCORO_API parameter_server_strategy {
 public:
  /// Validates the cluster as TF does (errc::invalid_argument with TF's message); connects nothing.
  /// `executor` runs one handler at a time (an io_context run by one thread, or a strand): the
  /// chief's state, its connections and the buffers replies are received into have no locks.
  parameter_server_strategy(asio::any_io_executor executor, const simple_cluster_resolver& resolver,
                            strategy_options options = {});
  /// The same, splitting variables made by create_sharded_variable as `partitioner` says.
  parameter_server_strategy(asio::any_io_executor executor, const simple_cluster_resolver& resolver,
                            variable_partitioner partitioner, strategy_options options = {});
  ~parameter_server_strategy();
  parameter_server_strategy(const parameter_server_strategy&) = delete;
  parameter_server_strategy& operator=(const parameter_server_strategy&) = delete;

  /// Connects to every ps and worker, retrying while they start (transport.connect_timeout).
  /// Throws errc::unavailable naming the task that could not be reached.
  [[nodiscard]] asio::awaitable<void> connect();

  /// Ends the chief's part of the job (call on the executor, at the end of training): cancels the
  /// closures still queued or running, tells every ps and worker it is connected to that the job
  /// ended with `exit_code` (0: success; unless strategy_options::keep_servers), and closes every
  /// connection once they have answered, so that the io_context runs out of work and returns.
  /// Servers started by run_server then exit with `exit_code`: a Slurm or Kubernetes job ends when
  /// its chief does, with the chief's code. The destructor closes without ending the job.
  void close(int exit_code = 0);

  /// Where a new variable's values come from: a value evaluated on the coordinator, an
  /// initializer each ps evaluates for its own shard, or user code on the coordinator asked for
  /// one shard at a time.
  using variable_source = std::variant<tensor, initializer, shard_initializer>;
  /// Where a new variable goes: split as the partitioner says (`partition`) or whole, on the next
  /// ps round robin, or whole on `colocated_ps` (colocate_vars_with).
  struct placement_request {
    bool partition = false;
    std::optional<int> colocated_ps;
  };

  /// Creates variables on the parameter servers. Names must be unique (errc::already_exists).
  class scope_type {
   public:
    /// Creates dense variable `name` from `initial_value` (evaluated once, here) on the next ps.
    template <class E>
    [[nodiscard]] asio::awaitable<variable<typename E::value_type>> create_variable(
        std::string name, const xt::xexpression<E>& initial_value) const {
      auto initial = to_tensor(initial_value);
      auto shape = initial.shape();
      return create_dense<typename E::value_type>(core_, colocated_ps_, std::move(name), std::move(shape),
                                                  std::move(initial));
    }
    /// Creates dense variable `name` of `shape`, filled by its ps with `init`.
    template <class T>
    [[nodiscard]] asio::awaitable<variable<T>> create_variable(std::string name, shape_type shape,
                                                               initializer init) const {
      return create_dense<T>(core_, colocated_ps_, std::move(name), std::move(shape), std::move(init));
    }
    /// Creates dense variable `name` of `shape` with the values `init(info)` returns, `info`
    /// describing the whole variable as its one shard (see the sharded overload).
    template <class T, class F>
      requires detail::shard_initializer_callable<F>
    [[nodiscard]] asio::awaitable<variable<T>> create_variable(std::string name, shape_type shape, F init) const {
      return create_dense<T>(core_, colocated_ps_, std::move(name), std::move(shape),
                             erase_shard_initializer(std::move(init)));
    }

    /// Creates variable `name` split along axis 0 into as many shards as the strategy's partitioner
    /// says (clamped to the row count; one without a partitioner or for a scalar), named
    /// "<name>/part_<i>" when there are several, each on the next ps in round-robin order. Each
    /// shard gets its rows of `initial_value` (evaluated once, here). A variable exists whole or
    /// not at all: when a shard cannot be created, those already created are removed and the
    /// shard's error is thrown.
    template <class E>
    [[nodiscard]] asio::awaitable<sharded_variable<typename E::value_type>> create_sharded_variable(
        std::string name, const xt::xexpression<E>& initial_value) const {
      auto initial = to_tensor(initial_value);
      auto shape = initial.shape();
      return create_sharded<typename E::value_type>(core_, colocated_ps_, std::move(name), std::move(shape),
                                                    std::move(initial));
    }
    /// The same with each shard filled by its ps with `init`: the values do not depend on the
    /// number of shards, and no full tensor is built here.
    template <class T>
    [[nodiscard]] asio::awaitable<sharded_variable<T>> create_sharded_variable(std::string name, shape_type shape,
                                                                               initializer init) const {
      return create_sharded<T>(core_, colocated_ps_, std::move(name), std::move(shape), std::move(init));
    }
    /// The same with each shard's values from `init(info)`, called here on the coordinator once per
    /// shard, in shard order, with where the shard lies (shard_info): it returns that shard's values
    /// (an xtensor expression or a tensor of T, shaped `info.shape`), which go to the shard's ps
    /// before the next shard is asked for: the whole tensor is never built here. A wrong dtype or
    /// shape is errc::invalid_argument naming the variable and the shard; whatever `init` throws
    /// is thrown; either way no shard is left behind. TF's partition-aware initializers.
    template <class T, class F>
      requires detail::shard_initializer_callable<F>
    [[nodiscard]] asio::awaitable<sharded_variable<T>> create_sharded_variable(std::string name, shape_type shape,
                                                                               F init) const {
      return create_sharded<T>(core_, colocated_ps_, std::move(name), std::move(shape),
                               erase_shard_initializer(std::move(init)));
    }

    /// Creates a dynamic embedding table (<pscoro/hash_table.hpp>) of rows of T, its buckets round
    /// robin over every ps. Throws errc::invalid_argument for options no table can have (dim 0,
    /// fewer buckets than ps, glorot_uniform, ...) and errc::already_exists when a variable or a
    /// table has the name; a table exists whole or not at all.
    template <class T>
      requires std::is_same_v<T, float> || std::is_same_v<T, double>
    [[nodiscard]] asio::awaitable<hash_table<T>> create_hash_table(std::string name, hash_table_options options) const {
      return create_table<T>(core_, colocated_ps_, std::move(name), std::move(options));
    }

    /// A scope whose variables go on the ps of `other` (TF's colocate_vars_with), whole: never
    /// partitioned, and the round-robin order of the others does not move. A hash table's buckets
    /// go to every ps, so creating one in it is errc::invalid_argument.
    template <class T>
    [[nodiscard]] scope_type colocate_vars_with(const variable<T>& other) const {
      return scope_type(core_, other.ps_task());
    }

   private:
    template <class F>
    static shard_initializer erase_shard_initializer(F init) {
      return [init = std::move(init)](const shard_info& info) mutable -> tensor {
        if constexpr (std::is_same_v<detail::shard_result_t<F>, tensor>) {
          return init(info);
        } else {
          const auto result = init(info);  // named: an expression may refer to what it returned
          return to_tensor(result);
        }
      };
    }

    friend class parameter_server_strategy;
    explicit scope_type(std::shared_ptr<detail::coordinator_core> core, std::optional<int> colocated_ps = {})
        : core_(std::move(core)), colocated_ps_(colocated_ps) {}

    template <class T>
    static asio::awaitable<hash_table<T>> create_table(std::shared_ptr<detail::coordinator_core> core,
                                                       std::optional<int> colocated_ps, std::string name,
                                                       hash_table_options options) {
      auto [ref, io] = co_await create_table_erased(core, colocated_ps, std::move(name), dtype_of<T>, std::move(options));
      co_return hash_table<T>(std::move(ref), std::move(io));
    }
    static asio::awaitable<std::pair<hash_table_ref, std::shared_ptr<detail::variable_io>>> create_table_erased(
        std::shared_ptr<detail::coordinator_core> core, std::optional<int> colocated_ps, std::string name, dtype type,
        hash_table_options options);

    template <class T>
    static asio::awaitable<variable<T>> create_dense(std::shared_ptr<detail::coordinator_core> core,
                                                     std::optional<int> colocated_ps, std::string name,
                                                     shape_type shape, variable_source source) {
      auto [ref, io] = co_await create_erased(core, std::move(name), dtype_of<T>, std::move(shape), std::move(source),
                                              {.partition = false, .colocated_ps = colocated_ps});
      co_return variable<T>(std::move(ref.shards.front()), std::move(io));
    }
    template <class T>
    static asio::awaitable<sharded_variable<T>> create_sharded(std::shared_ptr<detail::coordinator_core> core,
                                                               std::optional<int> colocated_ps, std::string name,
                                                               shape_type shape, variable_source source) {
      auto [ref, io] = co_await create_erased(core, std::move(name), dtype_of<T>, std::move(shape), std::move(source),
                                              {.partition = true, .colocated_ps = colocated_ps});
      co_return sharded_variable<T>(std::move(ref), std::move(io));
    }
    static asio::awaitable<std::pair<sharded_variable_ref, std::shared_ptr<detail::variable_io>>> create_erased(
        std::shared_ptr<detail::coordinator_core> core, std::string name, dtype type, shape_type shape,
        variable_source source, placement_request placement);

    std::shared_ptr<detail::coordinator_core> core_;
    std::optional<int> colocated_ps_;  // colocate_vars_with: every variable on this ps, whole
  };

  /// The object that creates variables (TF: `with strategy.scope():`).
  scope_type scope() const { return scope_type(core_); }

  const cluster_spec& cluster() const noexcept;
  std::size_t num_ps() const noexcept;
  std::size_t num_workers() const noexcept;
  const asio::any_io_executor& get_executor() const noexcept;
  /// "host:port" where the chief listens for workers announcing a new address (a worker whose
  /// cluster spec names the chief's address tells it where it runs when it starts), after
  /// connect(); "" when the cluster spec gives the chief no address. Use on the executor.
  std::string address() const;

  /// The shared state behind this strategy and its coordinator (an implementation detail).
  const std::shared_ptr<detail::coordinator_core>& core() const noexcept { return core_; }

 private:
  std::shared_ptr<detail::coordinator_core> core_;
};

}  // namespace pscoro

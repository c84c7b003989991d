// ParameterServerStrategy: the chief's view of a cluster and the factory of its variables.
//
//   asio::io_context io;
//   pscoro::parameter_server_strategy strategy(io.get_executor(), resolver);
//   co_await strategy.connect();                         // reach every ps and worker
//   auto scope = strategy.scope();
//   auto w = co_await scope.create_variable("w", xt::zeros<float>({784, 10}));
//
// Variables are placed round robin over the ps, one counter per strategy (as in TF).
#pragma once

#include <pscoro/cluster_spec.hpp>
#include <pscoro/transport_options.hpp>
#include <pscoro/variable.hpp>
#include <pscoro/xtensor.hpp>

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>

#include <memory>
#include <string>

namespace pscoro {

namespace detail {
class coordinator_core;
}

struct strategy_options {
  transport_options transport;
};

class parameter_server_strategy {
 public:
  /// Validates the cluster as TF does (errc::invalid_argument with TF's message); connects nothing.
  parameter_server_strategy(asio::any_io_executor executor, const simple_cluster_resolver& resolver,
                            strategy_options options = {});
  ~parameter_server_strategy();
  parameter_server_strategy(const parameter_server_strategy&) = delete;
  parameter_server_strategy& operator=(const parameter_server_strategy&) = delete;

  /// Connects to every ps and worker, retrying while they start (transport.connect_timeout).
  /// Throws errc::unavailable naming the task that could not be reached.
  [[nodiscard]] asio::awaitable<void> connect();

  /// Closes every connection of the chief, so its io_context can run out of work and return.
  /// Closures still running are cancelled. Call on the executor (e.g. at the end of training).
  void close();

  /// Creates variables on the parameter servers.
  class scope_type {
   public:
    /// Creates variable `name` with `initial_value` (evaluated once, here) on the next ps in
    /// round-robin order. Throws errc::already_exists if the ps already holds `name`.
    template <class E>
    [[nodiscard]] asio::awaitable<variable<typename E::value_type>> create_variable(
        std::string name, const xt::xexpression<E>& initial_value) const {
      return create_typed<typename E::value_type>(core_, std::move(name), to_tensor(initial_value));
    }

   private:
    friend class parameter_server_strategy;
    explicit scope_type(std::shared_ptr<detail::coordinator_core> core) : core_(std::move(core)) {}

    template <class T>
    static asio::awaitable<variable<T>> create_typed(std::shared_ptr<detail::coordinator_core> core,
                                                     std::string name, tensor initial) {
      auto [ref, io] = co_await create_erased(core, std::move(name), std::move(initial));
      co_return variable<T>(std::move(ref), std::move(io));
    }
    static asio::awaitable<std::pair<variable_ref, std::shared_ptr<detail::variable_io>>> create_erased(
        std::shared_ptr<detail::coordinator_core> core, std::string name, tensor initial);

    std::shared_ptr<detail::coordinator_core> core_;
  };

  /// The object that creates variables (TF: `with strategy.scope():`).
  scope_type scope() const { return scope_type(core_); }

  const cluster_spec& cluster() const noexcept;
  std::size_t num_ps() const noexcept;
  std::size_t num_workers() const noexcept;
  const asio::any_io_executor& get_executor() const noexcept;

  /// The shared state behind this strategy and its coordinator (an implementation detail).
  const std::shared_ptr<detail::coordinator_core>& core() const noexcept { return core_; }

 private:
  std::shared_ptr<detail::coordinator_core> core_;
};

}  // namespace pscoro

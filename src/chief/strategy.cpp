#include <pscoro/strategy.hpp>

#include "chief/coordinator_core.hpp"

#include <pscoro/error.hpp>

#include <fmt/format.h>

namespace pscoro {

parameter_server_strategy::parameter_server_strategy(asio::any_io_executor executor,
                                                     const simple_cluster_resolver& resolver,
                                                     strategy_options options)
    : core_(detail::coordinator_core::make(std::move(executor), resolver, std::move(options))) {}

parameter_server_strategy::parameter_server_strategy(asio::any_io_executor executor,
                                                     const simple_cluster_resolver& resolver,
                                                     variable_partitioner partitioner, strategy_options options)
    : parameter_server_strategy(std::move(executor), resolver, std::move(options)) {
  core_->set_partitioner(std::move(partitioner));
}

parameter_server_strategy::~parameter_server_strategy() {
  // Queued, not awaited: if the executor no longer runs, the connections go with its io_context.
  (void)detail::on_chief(core_, [](detail::coordinator_core& core) { core.close(std::nullopt); });
}

void parameter_server_strategy::close(int exit_code) { core_->close(exit_code); }

asio::awaitable<void> parameter_server_strategy::connect() { return core_->connect(); }

asio::awaitable<std::pair<sharded_variable_ref, std::shared_ptr<detail::variable_io>>>
parameter_server_strategy::scope_type::create_erased(std::shared_ptr<detail::coordinator_core> core, std::string name,
                                                     dtype type, shape_type shape, variable_source source,
                                                     placement_request placement) {
  auto ref = co_await core->create_variable(std::move(name), type, std::move(shape), std::move(source), placement);
  co_return std::pair{std::move(ref), std::shared_ptr<detail::variable_io>(core->ps())};
}

asio::awaitable<std::pair<hash_table_ref, std::shared_ptr<detail::variable_io>>>
parameter_server_strategy::scope_type::create_table_erased(std::shared_ptr<detail::coordinator_core> core,
                                                           std::optional<int> colocated_ps, std::string name, dtype type,
                                                           hash_table_options options) {
  if (colocated_ps) {
    throw error(errc::invalid_argument,
                fmt::format("hash table '{}' cannot be colocated with a variable (colocate_vars_with): its buckets go "
                            "to every ps",
                            name));
  }
  auto ref = co_await core->create_hash_table(std::move(name), type, std::move(options));
  co_return std::pair{std::move(ref), std::shared_ptr<detail::variable_io>(core->ps())};
}

const cluster_spec& parameter_server_strategy::cluster() const noexcept { return core_->cluster(); }
std::size_t parameter_server_strategy::num_ps() const noexcept { return core_->num_ps(); }
std::size_t parameter_server_strategy::num_workers() const noexcept { return core_->num_workers(); }
std::string parameter_server_strategy::address() const { return core_->address(); }
const asio::any_io_executor& parameter_server_strategy::get_executor() const noexcept { return core_->executor(); }

}  // namespace pscoro

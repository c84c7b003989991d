#include <pscoro/coordinator.hpp>
#include <pscoro/strategy.hpp>

#include "runtime/coordinator_core.hpp"

#include <future>

namespace pscoro {

parameter_server_strategy::parameter_server_strategy(asio::any_io_executor executor,
                                                     const simple_cluster_resolver& resolver,
                                                     strategy_options options)
    : core_(std::make_shared<detail::coordinator_core>(std::move(executor), resolver, options)) {}

parameter_server_strategy::parameter_server_strategy(asio::any_io_executor executor,
                                                     const simple_cluster_resolver& resolver,
                                                     variable_partitioner partitioner, strategy_options options)
    : parameter_server_strategy(std::move(executor), resolver, options) {
  core_->set_partitioner(std::move(partitioner));
}

parameter_server_strategy::~parameter_server_strategy() {
  // Queued, not awaited: if the executor no longer runs, the connections go with its io_context.
  asio::post(core_->executor(), [core = core_] { core->close(); });
}

void parameter_server_strategy::close() { core_->close(); }

asio::awaitable<void> parameter_server_strategy::connect() { return core_->connect(); }

asio::awaitable<std::pair<sharded_variable_ref, std::shared_ptr<detail::variable_io>>>
parameter_server_strategy::scope_type::create_erased(std::shared_ptr<detail::coordinator_core> core, std::string name,
                                                     dtype type, shape_type shape, variable_source source,
                                                     bool partition) {
  auto ref = co_await core->create_variable(std::move(name), type, std::move(shape), std::move(source), partition);
  co_return std::pair{std::move(ref), std::shared_ptr<detail::variable_io>(core->ps())};
}

const cluster_spec& parameter_server_strategy::cluster() const noexcept { return core_->cluster(); }
std::size_t parameter_server_strategy::num_ps() const noexcept { return core_->num_ps(); }
std::size_t parameter_server_strategy::num_workers() const noexcept { return core_->num_workers(); }
std::string parameter_server_strategy::address() const { return core_->address(); }
const asio::any_io_executor& parameter_server_strategy::get_executor() const noexcept { return core_->executor(); }

cluster_coordinator::cluster_coordinator(parameter_server_strategy& strategy, coordinator_options options)
    : core_(strategy.core()) {
  if (options.closures_per_worker == 0) {
    throw error(errc::invalid_argument, "coordinator_options::closures_per_worker must be at least 1");
  }
  // Queued, not awaited: the executor may not run yet; it handles this before later calls.
  asio::dispatch(core_->executor(), [core = core_, options] { core->set_options(options); });
}

std::shared_ptr<detail::remote_state> cluster_coordinator::schedule_erased(std::string name, std::string signature,
                                                                           std::vector<value> args) {
  if (detail::running_in_this_thread(core_->executor())) {
    return core_->schedule(std::move(name), std::move(signature), std::move(args));
  }
  // Another thread waits once: for the executor to take the closure and for room in the queue.
  std::promise<std::shared_ptr<detail::remote_state>> admitted;
  auto result = admitted.get_future();
  asio::post(core_->executor(), [&, core = core_] {
    core->schedule_when_room(std::move(name), std::move(signature), std::move(args),
                             detail::coordinator_core::admission_handler(
                                 [&admitted](std::exception_ptr e, std::shared_ptr<detail::remote_state> state) {
                                   e ? admitted.set_exception(e) : admitted.set_value(std::move(state));
                                 },
                                 core->executor()));
  });
  return result.get();
}

asio::awaitable<std::shared_ptr<detail::remote_state>> cluster_coordinator::wait_and_schedule_erased(
    std::shared_ptr<detail::coordinator_core> core, std::string name, std::string signature, std::vector<value> args) {
  // Runs on the coordinator's executor (the caller's coroutine); throws the pending error instead.
  co_return co_await asio::async_initiate<decltype(asio::use_awaitable),
                                          void(std::exception_ptr, std::shared_ptr<detail::remote_state>)>(
      [&](auto handler) {
        core->schedule_when_room(std::move(name), std::move(signature), std::move(args),
                                 detail::coordinator_core::admission_handler(std::move(handler), core->executor()));
      },
      asio::use_awaitable);
}

void cluster_coordinator::join_erased(detail::erased_handler<void(std::exception_ptr)> handler) {
  asio::dispatch(core_->executor(), [core = core_, h = std::move(handler)]() mutable { core->join(std::move(h)); });
}

asio::awaitable<per_worker_ref> detail::create_per_worker_iterators(std::shared_ptr<coordinator_core> core,
                                                                    std::string function) {
  co_return co_await core->create_iterators(std::move(function));
}

bool cluster_coordinator::done() {
  return detail::run_on(core_->executor(), [&] { return core_->done(); });
}

const asio::any_io_executor& cluster_coordinator::executor() const noexcept { return core_->executor(); }

}  // namespace pscoro

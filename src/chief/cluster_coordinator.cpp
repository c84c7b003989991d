#include <pscoro/coordinator.hpp>

#include "chief/coordinator_core.hpp"

#include <asio/dispatch.hpp>
#include <asio/use_future.hpp>


namespace pscoro {

namespace {

/// Queues `c` when there is room; completes with void(std::exception_ptr, std::shared_ptr<remote_state>):
/// its result state, or the pending error instead.
template <class CompletionToken>
auto async_admit(std::shared_ptr<detail::coordinator_core> core, std::shared_ptr<chief::closure> c,
                 CompletionToken&& token) {
  return asio::async_initiate<CompletionToken, void(std::exception_ptr, std::shared_ptr<detail::remote_state>)>(
      [core = std::move(core), c = std::move(c)](auto handler) mutable {
        chief::closure_queue::admission_handler admitted(std::move(handler), core->executor());
        (void)detail::on_chief(core, [c = std::move(c), admitted = std::move(admitted)](
                                         detail::coordinator_core& chief) mutable {
          chief.queue().schedule_when_room(std::move(c), std::move(admitted));
        });
      },
      token);
}

}  // namespace

metrics::coordinator_metrics cluster_coordinator::metrics() const { return core_->metrics(); }

void cluster_coordinator::speculate_erased(const std::string& function, const speculation_options& options) {
  detail::on_chief(core_, [function, options](detail::coordinator_core& core) {
    core.queue().speculate(function, options);
  }).get();
}

cluster_coordinator::cluster_coordinator(parameter_server_strategy& strategy) : core_(strategy.core()) {
  adopt(std::nullopt);
}

cluster_coordinator::cluster_coordinator(parameter_server_strategy& strategy, coordinator_options options)
    : core_(strategy.core()) {
  if (options.closures_per_worker == 0) {
    throw error(errc::invalid_argument, "coordinator_options::closures_per_worker must be at least 1");
  }
  adopt(options);
}

void cluster_coordinator::adopt(std::optional<coordinator_options> options) {
  // Only the first coordinator of the strategy sets the options; queued, not waited for: the
  // executor may not run yet, and it takes them before any later call.
  if (const auto first = core_->claim_options(options)) {
    (void)detail::on_chief(core_, [options = *first](detail::coordinator_core& core) { core.set_options(options); });
  }
}

std::shared_ptr<detail::remote_state> cluster_coordinator::schedule_erased(std::string name, std::string signature,
                                                                           std::vector<value> args) {
  auto c = core_->make_closure(std::move(name), std::move(signature), std::move(args));
  if (detail::running_in_this_thread(core_->executor())) return core_->queue().schedule(std::move(c));
  // Another thread waits: for the executor to take the closure, and for room in the queue (TF).
  auto admitted = async_admit(core_, std::move(c), asio::use_future);
  return admitted.get();
}

asio::awaitable<std::shared_ptr<detail::remote_state>> cluster_coordinator::wait_and_schedule_erased(
    std::shared_ptr<detail::coordinator_core> core, std::string name, std::string signature, std::vector<value> args) {
  // Runs on the coordinator's executor (the caller's coroutine); throws the pending error instead.
  auto c = core->make_closure(std::move(name), std::move(signature), std::move(args));
  co_return co_await async_admit(std::move(core), std::move(c), asio::use_awaitable);
}

void cluster_coordinator::join_erased(detail::erased_handler<void(std::exception_ptr)> handler) {
  (void)detail::on_chief(core_, [h = std::move(handler)](detail::coordinator_core& core) mutable {
    core.queue().join(std::move(h));
  });
}

void cluster_coordinator::drain_erased(std::size_t worker, detail::erased_handler<void(std::exception_ptr)> handler) {
  (void)detail::on_chief(core_, [worker, h = std::move(handler)](detail::coordinator_core& core) mutable {
    core.drain(worker, std::move(h));
  });
}

void cluster_coordinator::resume(std::size_t worker) {
  detail::on_chief(core_, [worker](detail::coordinator_core& core) { core.resume(worker); }).get();
}

asio::awaitable<per_worker_ref> detail::create_per_worker_iterators(std::shared_ptr<coordinator_core> core,
                                                                    std::string function) {
  co_return co_await core->per_worker().create_iterators(std::move(function));
}

asio::awaitable<per_worker_ref> detail::create_per_worker_variables(std::shared_ptr<coordinator_core> core,
                                                                    variable_ref variable, tensor initial_value) {
  co_return co_await core->per_worker().create_variables(std::move(variable), std::move(initial_value));
}

asio::awaitable<per_worker_ref> detail::create_per_worker_resources(std::shared_ptr<coordinator_core> core,
                                                                    std::string function) {
  co_return co_await core->per_worker().create_resources(std::move(function));
}

asio::awaitable<std::vector<std::optional<tensor>>> detail::read_per_worker_variable(
    std::weak_ptr<coordinator_core> core, per_worker_ref ref, variable_ref variable, lost_workers lost) {
  auto chief = core.lock();
  if (!chief) {
    throw error(errc::failed_precondition,
                "per-worker variable '" + variable.name +
                    "' has no coordinator to read it with (a handle decoded from a result, or the strategy is gone)");
  }
  co_return co_await chief->per_worker().read_variable(std::move(ref), std::move(variable), lost);
}

bool cluster_coordinator::done() {
  return detail::on_chief(core_, [](detail::coordinator_core& core) { return core.queue().done(); }).get();
}

const asio::any_io_executor& cluster_coordinator::executor() const noexcept { return core_->executor(); }

}  // namespace pscoro

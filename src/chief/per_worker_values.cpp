#include "chief/per_worker_values.hpp"

#include <pscoro/detail/parallel.hpp>
#include <pscoro/error.hpp>

#include "wire/connection.hpp"
#include "wire/status.hpp"
#include "wire/values.hpp"

#include <asio/experimental/as_tuple.hpp>
#include <asio/post.hpp>
#include <asio/use_awaitable.hpp>

#include <fmt/format.h>

#include <algorithm>

namespace pscoro::chief {

using asio::use_awaitable;
using asio::experimental::as_tuple;
using detail::run_all;

per_worker_values::per_worker_values(asio::any_io_executor executor, std::shared_ptr<cluster_connections> connections)
    : executor_(std::move(executor)), connections_(std::move(connections)) {}

std::array<std::size_t, 3> per_worker_values::counts() const noexcept {
  std::array<std::size_t, 3> counts{};
  for (const auto& e : live_) ++counts[static_cast<std::size_t>(e.what)];
  return counts;
}

wire::frame per_worker_values::create_request(const entry& e, std::size_t worker) const {
  wire::frame request;
  auto& body = *request.message.mutable_request();
  switch (e.what) {
    case kind::iterator: {
      auto* create = body.mutable_create_iterator();
      create->set_function(e.ref.function);
      create->set_id(e.ref.id);
      create->set_worker_index(static_cast<std::int64_t>(worker));
      create->set_num_workers(static_cast<std::int64_t>(connections_->num_workers()));
      break;
    }
    case kind::resource: {
      auto* create = body.mutable_create_resource();
      create->set_function(e.ref.function);
      create->set_id(e.ref.id);
      create->set_worker_index(static_cast<std::int64_t>(worker));
      create->set_num_workers(static_cast<std::int64_t>(connections_->num_workers()));
      break;
    }
    case kind::variable: {
      auto* create = body.mutable_create_per_worker_variable();
      create->set_id(e.ref.id);
      wire::encode_ref(*create->mutable_variable(), e.variable);
      // The chief's copy of the initial value goes out shared, not copied, to every worker.
      wire::put_tensor(request, *create->mutable_initial_value(), e.initial_value);
      break;
    }
  }
  return request;
}

asio::awaitable<per_worker_ref> per_worker_values::create_iterators(std::string function) {
  entry e;
  e.what = kind::iterator;
  e.ref.function = std::move(function);
  co_return co_await create(std::move(e));
}

asio::awaitable<per_worker_ref> per_worker_values::create_resources(std::string function) {
  entry e;
  e.what = kind::resource;
  e.ref.function = std::move(function);
  co_return co_await create(std::move(e));
}

asio::awaitable<per_worker_ref> per_worker_values::create_variables(variable_ref variable, tensor initial_value) {
  if (initial_value.type() != variable.type || initial_value.shape() != variable.shape) {
    throw error(errc::invalid_argument, fmt::format("per-worker variable '{}' is {} {} but its initial value is {} {}",
                                                    variable.name, name_of(variable.type), to_string(variable.shape),
                                                    name_of(initial_value.type()), to_string(initial_value.shape())));
  }
  entry e;
  e.what = kind::variable;
  e.ref.function = variable.name;
  e.variable = std::move(variable);
  e.initial_value = std::move(initial_value);
  co_return co_await create(std::move(e));
}

asio::awaitable<per_worker_ref> per_worker_values::create(entry e) {
  e.ref.id = next_id_++;
  // Listed first: a lost worker that comes back meanwhile builds it too (prepare), before it takes
  // a closure.
  live_.push_back(e);
  per_worker_ref ref = e.ref;
  std::vector<std::size_t> ready;
  for (std::size_t i = 0; i < connections_->num_workers(); ++i) {
    if (connections_->ready(i)) ready.push_back(i);
  }
  std::exception_ptr failure;
  try {
    const auto self = shared_from_this();
    co_await run_all(ready.size(), [&](std::size_t k) { return create_on(self, ready[k], e); });
  } catch (...) {
    failure = std::current_exception();
  }
  if (failure) {
    release(ref.id);  // the workers that built theirs drop them
    std::rethrow_exception(failure);
  }
  // The last copy of the lease, wherever it goes (any thread), has the chief release the values.
  // It only posts: locking the chief's parts here could make this thread their last owner.
  struct lease {
    lease(asio::any_io_executor on, std::weak_ptr<per_worker_values> of, std::uint64_t value)
        : executor(std::move(on)), values(std::move(of)), id(value) {}
    lease(const lease&) = delete;  // one release per value
    lease& operator=(const lease&) = delete;
    asio::any_io_executor executor;
    std::weak_ptr<per_worker_values> values;
    std::uint64_t id;
    ~lease() {
      asio::post(executor, [weak = values, value = id] {
        if (auto self = weak.lock()) self->release(value);
      });
    }
  };
  ref.lease = std::make_shared<const lease>(executor_, weak_from_this(), ref.id);
  co_return ref;
}

asio::awaitable<void> per_worker_values::create_on(std::shared_ptr<per_worker_values> self, std::size_t worker,
                                                   const entry& e) {
  const auto peer = self->connections_->worker(worker);
  // On the open connection only, as a closure: a worker that is gone may not come back soon.
  const auto connection = peer->connection();
  std::string lost = "not connected";
  if (connection) {
    auto request = self->create_request(e, worker);  // named: g++ 12 (temporaries)
    auto [ec, response] = co_await connection->async_call(std::move(request), as_tuple(use_awaitable));
    if (!ec) {
      // The worker's own refusal (an unbound or failing function) fails the creation.
      wire::throw_if_error(response.message.response().status(), peer->task());
      co_return;
    }
    lost = connection->close_reason();
  }
  if (self->connections_->closed()) {
    throw remote_error(
        make_error_code(errc::unavailable), peer->task(),
        fmt::format("'{}' could not be made on {}: the chief closed its connections", e.ref.function, peer->task()));
  }
  // A worker that came back meanwhile on a new connection was prepared there, with this value
  // (listed before any worker was asked).
  if (const auto current = peer->connection(); current && current != connection) co_return;
  // TF's contract: a lost worker costs only time. The value is listed already, so the worker
  // builds it in prepare() when it comes back, before it takes a closure.
  self->connections_->worker_failed(worker, lost);
}

void per_worker_values::release(std::uint64_t id) {
  std::erase_if(live_, [id](const entry& e) { return e.ref.id == id; });
  if (connections_->closed()) return;
  for (std::size_t i = 0; i < connections_->num_workers(); ++i) {
    // Only an open connection: a lost worker has lost its values, and one that comes back is not
    // given this one again.
    const auto connection = connections_->worker(i)->connection();
    if (!connection) continue;
    wire::frame request;
    request.message.mutable_request()->mutable_release_iterator()->set_id(id);
    connection->async_call(std::move(request), [](std::error_code, wire::frame) {});
  }
}

void per_worker_values::release_on(std::size_t worker) {
  const auto connection = connections_->worker(worker)->connection();
  if (!connection || connections_->closed()) return;  // a lost worker has lost its values
  for (const auto& e : live_) {
    wire::frame request;
    request.message.mutable_request()->mutable_release_iterator()->set_id(e.ref.id);
    connection->async_call(std::move(request), [](std::error_code, wire::frame) {});
  }
}

asio::awaitable<std::vector<std::optional<tensor>>> per_worker_values::read_variable(per_worker_ref ref,
                                                                                     variable_ref variable,
                                                                                     detail::lost_workers lost) {
  const auto workers = connections_->num_workers();
  for (std::size_t i = 0; i < workers && lost == detail::lost_workers::fail; ++i) {
    if (connections_->ready(i) || connections_->drained(i)) continue;
    // TF raises too (its per-worker variable's value on a lost worker is aborted). The chief does
    // not wait for the worker: it may never come back.
    const auto& task = connections_->worker(i)->task();
    throw remote_error(make_error_code(errc::unavailable), task,
                       fmt::format("per-worker variable '{}' cannot be read on {}: the chief has lost that worker (it "
                                   "gets the variable anew, from its initial value, when it comes back)",
                                   variable.name, task));
  }
  std::vector<std::optional<tensor>> values(workers);
  const auto self = shared_from_this();
  co_await run_all(workers, [&](std::size_t i) { return read_on(self, i, ref.id, variable, lost, values[i]); });
  co_return values;
}

asio::awaitable<void> per_worker_values::read_on(std::shared_ptr<per_worker_values> self, std::size_t worker,
                                                 std::uint64_t id, variable_ref variable, detail::lost_workers lost,
                                                 std::optional<tensor>& out) {
  // A drained worker holds no copy. A worker being prepared to come back does not hold the
  // variable yet: it counts as lost.
  if (self->connections_->drained(worker)) co_return;
  if (lost == detail::lost_workers::skip && !self->connections_->ready(worker)) co_return;
  wire::frame request;
  auto* read = request.message.mutable_request()->mutable_read_per_worker_variable();
  read->set_id(id);
  wire::encode_ref(*read->mutable_variable(), variable);
  const auto peer = self->connections_->worker(worker);
  // On the open connection only, never a new one: a worker that is gone may not come back soon.
  auto connection = peer->connection();
  if (!connection && lost == detail::lost_workers::skip) co_return;
  if (!connection) {
    throw remote_error(
        make_error_code(errc::unavailable), peer->task(),
        fmt::format("per-worker variable '{}' cannot be read on {}: it is not connected", variable.name, peer->task()));
  }
  auto [ec, response] = co_await connection->async_call(std::move(request), as_tuple(use_awaitable));
  if (ec && lost == detail::lost_workers::skip) co_return;
  if (ec) {
    throw remote_error(make_error_code(errc::unavailable), peer->task(),
                       fmt::format("per-worker variable '{}' cannot be read on {}: connection lost: {}", variable.name,
                                   peer->task(), connection->close_reason()));
  }
  wire::throw_if_error(response.message.response().status(), peer->task());
  const auto& result = response.message.response().result();
  tensor value;
  if (result.kind_case() == wire::Value::kTensor) value = wire::get_tensor(response, result.tensor());
  if (result.kind_case() != wire::Value::kTensor || value.type() != variable.type || value.shape() != variable.shape) {
    throw remote_error(make_error_code(errc::protocol_error), peer->task(),
                       fmt::format("{} answered a read of per-worker variable '{}' ({} {}) with something else",
                                   peer->task(), variable.name, name_of(variable.type), to_string(variable.shape)));
  }
  out = std::move(value);
}

asio::awaitable<void> per_worker_values::prepare(std::shared_ptr<per_worker_values> self, std::size_t worker) {
  if (!self) co_return;
  // By id from the live list, afresh after every call: a value released while this waits is
  // skipped, and one created meanwhile is built too (its create() did not send it here,
  // this worker not being ready yet). Ids only grow, and the list keeps their order.
  std::uint64_t built = 0;
  for (;;) {
    const auto& live = self->live_;
    const auto next = std::find_if(live.begin(), live.end(), [built](const entry& e) { return e.ref.id > built; });
    if (next == live.end()) co_return;
    built = next->ref.id;
    auto request = self->create_request(*next, worker);  // named: g++ 12 (temporaries)
    co_await self->connections_->worker(worker)->call(std::move(request));
  }
}

}  // namespace pscoro::chief

#include "worker/worker_service.hpp"

#include "common/log.hpp"
#include "common/text.hpp"
#include "wire/requests.hpp"
#include "wire/status.hpp"
#include "wire/values.hpp"

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_state.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cstring>

namespace pscoro::worker {

namespace {

// Connects to a ps ahead of the first variable operation, so a missing ps shows up in the log at
// once; operations still (re)connect on demand.
asio::awaitable<void> connect_early(std::shared_ptr<net::peer> ps) {
  try {
    co_await ps->get();
  } catch (const std::exception& e) {
    log::warning("cannot reach {} yet: {}", ps->task(), e.what());
  }
}

}  // namespace

worker_service::worker_service(asio::any_io_executor executor, std::string task, net::task_identity self,
                               transport_options options)
    : executor_(std::move(executor)),
      task_(std::move(task)),
      self_(std::move(self)),
      options_(options),
      ps_(std::make_shared<client::ps_client>(std::vector<std::shared_ptr<net::peer>>{})) {}

void worker_service::bind(std::string name, std::string signature, detail::erased_worker_function fn) {
  functions_[std::move(name)] = bound_function{std::move(signature), std::move(fn)};
}

void worker_service::bind_dataset(std::string name, detail::erased_dataset_function fn) {
  datasets_[std::move(name)] = std::move(fn);
}

void worker_service::bind_resource(std::string name, detail::erased_resource_function fn) {
  resources_[std::move(name)] = std::move(fn);
}

namespace {

// Runs `make` on the executor it is spawned on (the worker's build thread) and returns what it made.
asio::awaitable<std::shared_ptr<void>> make_here(std::function<std::shared_ptr<void>()> make) { co_return make(); }

// Throws errc::invalid_argument unless `worker_index` is a place among `num_workers`.
void check_input_context(const std::string& function, std::int64_t worker_index, std::int64_t num_workers) {
  if (num_workers < 1 || worker_index < 0 || worker_index >= num_workers) {
    throw error(errc::invalid_argument, fmt::format("input context of '{}': worker {} of {} is not a valid place",
                                                    function, worker_index, num_workers));
  }
}

}  // namespace

asio::awaitable<std::shared_ptr<void>> worker_service::run_on_build_thread(
    std::function<std::shared_ptr<void>()> make) {
  const auto builder = build_thread_->executor();
  if (!builder) throw error(errc::unavailable, fmt::format("{} is stopping", task_));
  auto made = make_here(std::move(make));  // named: g++ 12 (temporaries)
  co_return co_await asio::co_spawn(*builder, std::move(made), asio::use_awaitable);
}

void worker_service::abandon_creation(std::uint64_t id) {
  const auto it = creating_.find(id);
  if (it == creating_.end()) return;
  it->second->store(true, std::memory_order_release);
  creating_.erase(it);
}

void worker_service::check_same_session(std::uint64_t sessions_ended, const std::string& function) const {
  if (sessions_ended != sessions_ended_) {
    throw error(errc::aborted, fmt::format("the coordinator session that asked for '{}' ended while {} built it",
                                           function, task_));
  }
}

asio::awaitable<wire::Status> worker_service::create_value(std::uint64_t id, detail::per_worker_table::kind kind,
                                                           std::string function, const std::type_info* type,
                                                           std::function<std::shared_ptr<void>()> make,
                                                           std::string_view described) {
  const auto sessions_ended = sessions_ended_;
  abandon_creation(id);
  const auto abandoned = std::make_shared<std::atomic<bool>>(false);
  creating_[id] = abandoned;
  // Whether this request's value is still wanted once made: not if it was abandoned meanwhile, by
  // a ReleaseIterator (the chief dropped its last handle while a returning worker built it), by
  // the same id asked again (a worker back on a new connection: that request keeps its own), or
  // by the session's end (check_same_session). While it is not, the entry of `id` is this one's.
  const auto still_wanted = [this, id, abandoned] {
    if (abandoned->load(std::memory_order_relaxed)) return false;
    creating_.erase(id);
    return true;
  };
  // The build thread runs one function at a time, so this one may wait behind others (a slow
  // dataset of another request): if it is abandoned by then, the user's function is not run for a
  // value nobody keeps, and what queues behind it does not wait for it.
  auto unless_abandoned = [abandoned, make = std::move(make)]() -> std::shared_ptr<void> {
    if (abandoned->load(std::memory_order_acquire)) return nullptr;
    return make();
  };
  std::shared_ptr<void> value;
  try {
    auto made = run_on_build_thread(std::move(unless_abandoned));  // named: g++ 12 (temporaries)
    value = co_await std::move(made);
  } catch (...) {
    still_wanted();
    co_return wire::status_of(std::current_exception(), task_, fmt::format("{} '{}'", described, function));
  }
  check_same_session(sessions_ended, function);
  if (still_wanted()) per_worker_.put(id, {kind, std::move(function), type, std::move(value)});
  co_return wire::Status{};
}

asio::awaitable<wire::Status> worker_service::create_resource(const wire::CreateResource& create) {
  auto it = resources_.find(create.function());
  if (it == resources_.end()) {
    std::vector<std::string_view> known;
    for (const auto& entry : resources_) known.push_back(entry.first);
    throw error(errc::not_found, fmt::format("resource function '{}' is not bound on {} (it binds: {})",
                                             create.function(), task_, known.empty() ? "nothing" : common::join(known, ", ")));
  }
  check_input_context(create.function(), create.worker_index(), create.num_workers());
  const input_context context{create.worker_index(), create.num_workers()};
  // Named: g++ 12 destroys temporaries of a co_await expression too early.
  auto created = create_value(create.id(), detail::per_worker_table::kind::resource, create.function(),
                              it->second.type, [make = it->second.make, context] { return make(context); },
                              "resource function");
  co_return co_await std::move(created);
}

void worker_service::create_variable(const wire::frame& request, const wire::CreatePerWorkerVariable& create) {
  auto ref = decode_ref(create.variable());
  if (!create.has_initial_value()) {
    throw error(errc::invalid_argument, fmt::format("per-worker variable '{}' comes without an initial value", ref.name));
  }
  auto value = wire::get_tensor(request, create.initial_value());
  if (value.type() != ref.type || value.shape() != ref.shape) {
    throw error(errc::invalid_argument,
                fmt::format("per-worker variable '{}' is {} {} but its initial value is {} {}", ref.name,
                            name_of(ref.type), to_string(ref.shape), name_of(value.type()), to_string(value.shape())));
  }
  ref.ps_task = 0;
  const auto name = ref.name;
  // Copied once: the received bytes may be a slice of a frame's buffer that holds more, which a
  // kept slice would keep alive for as long as the variable lives.
  auto own = tensor::uninitialized(value.type(), value.shape());
  if (value.size_bytes() != 0) std::memcpy(own.bytes().data(), value.bytes().data(), value.size_bytes());
  per_worker_.put(create.id(), {detail::per_worker_table::kind::variable, name, nullptr,
                                std::make_shared<detail::local_variable>(
                                    detail::local_variable{std::move(ref), std::move(own)})});
}

void worker_service::read_variable(const wire::ReadPerWorkerVariable& read, wire::frame& response) const {
  const auto asked = decode_ref(read.variable());
  const auto local = per_worker_.variable(read.id(), asked.name);
  const auto& held = local->ref;
  if (held.name != asked.name || held.type != asked.type || held.shape != asked.shape) {
    throw error(errc::invalid_argument,
                fmt::format("per-worker variable {} is '{}' {} {} on {}, not '{}' {} {}", read.id(), held.name,
                            name_of(held.type), to_string(held.shape), task_, asked.name, name_of(asked.type),
                            to_string(asked.shape)));
  }
  // The reply shares the bytes; an update meanwhile copies them first (local_variable).
  wire::put_tensor(response, *response.message.mutable_response()->mutable_result()->mutable_tensor(), local->value);
}

asio::awaitable<wire::Status> worker_service::create_iterator(const wire::CreateIterator& create) {
  auto it = datasets_.find(create.function());
  if (it == datasets_.end()) {
    std::vector<std::string_view> known;
    for (const auto& entry : datasets_) known.push_back(entry.first);
    throw error(errc::not_found, fmt::format("dataset function '{}' is not bound on {} (it binds: {})",
                                             create.function(), task_, known.empty() ? "nothing" : common::join(known, ", ")));
  }
  check_input_context(create.function(), create.worker_index(), create.num_workers());
  const input_context context{create.worker_index(), create.num_workers()};
  // Named: g++ 12 destroys temporaries of a co_await expression too early.
  auto created = create_value(create.id(), detail::per_worker_table::kind::iterator, create.function(),
                              it->second.element_type,
                              [make = it->second.make_iterator, context, input = std::weak_ptr(input_)] {
                                return make(context, input);
                              },
                              "dataset function");
  co_return co_await std::move(created);
}

void worker_service::set_cluster(const wire::Hello& hello) {
  std::map<int, std::string> ps_addresses;
  for (const auto& job : hello.cluster()) {
    if (job.name() == "ps") ps_addresses.insert(job.tasks().begin(), job.tasks().end());
  }
  const auto ours = net::make_hello(self_, hello.session());
  // Keep open connections to ps that did not move; index i of the list is ps task i.
  const auto& old = ps_->peers();
  std::vector<std::shared_ptr<net::peer>> peers;
  for (const auto& [index, address] : ps_addresses) {
    if (index != static_cast<int>(peers.size())) break;  // ps tasks are dense (checked by the chief)
    const auto name = fmt::format("ps:{}", index);
    if (static_cast<std::size_t>(index) < old.size() && old[index]->address() == address) {
      peers.push_back(old[index]);
    } else {
      peers.push_back(std::make_shared<net::peer>(executor_, name, address, ours, options_));
      asio::co_spawn(executor_, connect_early(peers.back()), asio::detached);
    }
  }
  for (const auto& p : old) {
    if (std::find(peers.begin(), peers.end(), p) == peers.end()) p->close("the chief moved " + p->task());
  }
  ps_->set_peers(std::move(peers));
}

void worker_service::end_session() {
  ++sessions_ended_;
  per_worker_.clear();
  for (auto& [id, abandoned] : creating_) abandoned->store(true, std::memory_order_release);
  creating_.clear();
  cancel(std::nullopt);  // nobody waits for them any more
  const auto ended = std::make_exception_ptr(
      error(errc::aborted, fmt::format("the coordinator session of this function ended on {}", task_)));
  for (const auto& p : ps_->peers()) {
    p->fail_with(ended);
    p->close("the coordinator session ended");
  }
  // Closures of the ended session keep the old client; the next session gets its own.
  ps_ = std::make_shared<client::ps_client>(std::vector<std::shared_ptr<net::peer>>{});
}

void worker_service::close_connections() {
  const auto stopped = std::make_exception_ptr(error(errc::unavailable, fmt::format("{} stopped", task_)));
  for (const auto& p : ps_->peers()) {
    p->fail_with(stopped);
    p->close("the worker stopped");
  }
  build_thread_->stop();
  input_->stop();
}

asio::awaitable<value> worker_service::run_cancellable(worker_service* self, const wire::frame& request,
                                                       const wire::RunFunction& call) {
  // The closure's state records a cancellation, and that is all: asio would also abort the
  // operation it waits on (a timer, say: operation_aborted from the user's own code) and throw
  // operation_aborted from its next co_await. Instead, pscoro's operations throw errc::cancelled
  // before they start (this_closure::check_cancelled), which says why; what runs, finishes.
  co_await asio::this_coro::reset_cancellation_state(asio::enable_terminal_cancellation(),
                                                     asio::disable_cancellation());
  co_await asio::this_coro::throw_if_cancelled(false);
  co_return co_await self->run(request, call);
}

asio::awaitable<value> worker_service::run(const wire::frame& request, const wire::RunFunction& call) {
  auto it = functions_.find(call.name());
  if (it == functions_.end()) {
    std::vector<std::string_view> known;
    for (const auto& entry : functions_) known.push_back(entry.first);
    throw error(errc::not_found, fmt::format("worker function '{}' is not bound on {} (it binds: {})", call.name(),
                                             task_, known.empty() ? "nothing" : common::join(known, ", ")));
  }
  if (!call.signature().empty() && call.signature() != it->second.signature) {
    throw error(errc::invalid_argument,
                fmt::format("worker function '{}' is scheduled as {} but {} binds it as {}", call.name(),
                            call.signature(), task_, it->second.signature));
  }
  std::size_t budget = max_value_items;  // shared by every argument
  std::vector<value> args;
  // The number of arguments is the peer's: no more is reserved than the budget allows.
  args.reserve(std::min<std::size_t>(static_cast<std::size_t>(call.args_size()), max_value_items));
  for (const auto& arg : call.args()) args.push_back(decode_value(request, arg, budget));
  // Copy the function: a later bind() of the same name must not pull it from under this call.
  const auto fn = it->second.fn;
  // Named, not a temporary: g++ 12 destroys temporaries of a co_await expression too early.
  const decode_context context{ps_, &per_worker_};
  auto call_result = fn(std::move(args), context);
  co_return co_await std::move(call_result);
}

asio::awaitable<wire::frame> worker_service::handle(wire::frame request) {
  const auto& body = request.message.request();
  wire::frame response;
  auto* out = response.message.mutable_response();
  if (body.body_case() == wire::Request::kCreateIterator || body.body_case() == wire::Request::kCreateResource) {
    try {
      // Named: g++ 12 destroys temporaries of a co_await expression too early.
      auto created = body.body_case() == wire::Request::kCreateIterator ? create_iterator(body.create_iterator())
                                                                        : create_resource(body.create_resource());
      *out->mutable_status() = co_await std::move(created);
    } catch (...) {
      *out->mutable_status() = wire::status_of(std::current_exception(), task_);
    }
    co_return response;
  }
  if (body.body_case() == wire::Request::kCreatePerWorkerVariable ||
      body.body_case() == wire::Request::kReadPerWorkerVariable) {
    try {
      if (body.body_case() == wire::Request::kCreatePerWorkerVariable) {
        create_variable(request, body.create_per_worker_variable());
      } else {
        read_variable(body.read_per_worker_variable(), response);
      }
    } catch (...) {
      response = wire::frame{};
      *response.message.mutable_response()->mutable_status() = wire::status_of(std::current_exception(), task_);
    }
    co_return response;
  }
  if (body.body_case() == wire::Request::kReleaseIterator) {
    per_worker_.erase(body.release_iterator().id());
    abandon_creation(body.release_iterator().id());  // one being built is not kept (create_value)
    co_return response;
  }
  if (body.body_case() == wire::Request::kCancelClosures) {
    const auto& cancel_closures = body.cancel_closures();
    if (cancel_closures.closures_size() > 0) {
      const std::vector<std::uint64_t> numbers(cancel_closures.closures().begin(), cancel_closures.closures().end());
      if (const auto count = cancel_numbered(numbers)) {
        log::info("cancelled {} running closure(s): another attempt of each finished first", count);
      }
      co_return response;
    }
    const auto generation = cancel_closures.generation();
    if (const auto count = cancel(generation)) {
      log::info("cancelled {} running closure(s) of generation {}: an earlier closure failed", count, generation);
    }
    co_return response;
  }
  if (body.body_case() != wire::Request::kRunFunction) {  // the server refuses them first
    const error refused = wire::not_served(body, "worker", task_);
    wire::set_status(*out->mutable_status(), refused.code(), refused.what(), task_);
    co_return response;
  }
  co_return co_await run_function(std::move(request));
}

asio::awaitable<wire::frame> worker_service::run_function(wire::frame request) {
  const auto& call = request.message.request().run_function();
  auto closure = std::make_shared<running_closure>();
  closure->generation = call.generation();
  closure->number = call.closure();
  running_.push_back(closure);
  wire::frame response;
  std::exception_ptr failure;
  try {
    // Its own thread of execution, cancelled through closure->signal. Named: g++ 12 (temporaries).
    auto body = run_cancellable(this, request, call);
    const value result = co_await asio::co_spawn(
        executor_, std::move(body), asio::bind_cancellation_slot(closure->signal.slot(), asio::use_awaitable));
    std::erase(running_, closure);
    encode_value(response, *response.message.mutable_response()->mutable_result(), result);
    co_return response;
  } catch (...) {
    failure = std::current_exception();
  }
  std::erase(running_, closure);
  // A failure of a ps this function talked to keeps the ps as origin: the coordinator classifies it.
  auto status = wire::status_of(failure, task_, fmt::format("worker function '{}'", call.name()));
  if (closure->cancelled) {
    // Whatever it threw on the way out (its own reaction to errc::cancelled, say), it ended
    // because it was cancelled.
    wire::set_status(status, make_error_code(errc::cancelled),
                     fmt::format("worker function '{}' was cancelled on {}: {}", call.name(), task_, status.message()),
                     task_);
  }
  response = wire::frame{};
  *response.message.mutable_response()->mutable_status() = std::move(status);
  co_return response;
}

std::size_t worker_service::cancel(std::optional<std::uint64_t> generation) {
  std::size_t count = 0;
  for (const auto& closure : std::vector(running_)) {  // a copy: emit() may resume what it cancels
    if (closure->cancelled || (generation && closure->generation != *generation)) continue;
    cancel_one(*closure);
    ++count;
  }
  return count;
}

std::size_t worker_service::cancel_numbered(std::span<const std::uint64_t> numbers) {
  std::size_t count = 0;
  for (const auto& closure : std::vector(running_)) {  // a copy: emit() may resume what it cancels
    if (closure->cancelled || std::find(numbers.begin(), numbers.end(), closure->number) == numbers.end()) continue;
    cancel_one(*closure);
    ++count;
  }
  return count;
}

void worker_service::cancel_one(running_closure& closure) {
  closure.cancelled = true;
  closure.signal.emit(asio::cancellation_type::terminal);
  // A cancelled closure waiting for a connection to a ps (one that restarts, say) stops waiting
  // now rather than at the end of connect_timeout.
  for (const auto& p : ps_->peers()) p->wake_waiters();
}

}  // namespace pscoro::worker

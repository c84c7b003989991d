// The worker role: the registry of bound worker functions, and running them for the chief.
// Functions reach the parameter servers through this worker's own connections, learnt from the
// cluster the chief sends in its Hello.
#pragma once

#include <pscoro/detail/per_worker_values.hpp>
#include <pscoro/transport_options.hpp>
#include <pscoro/worker_function.hpp>

#include "client/ps_client.hpp"
#include "net/peer.hpp"
#include "wire/frame.hpp"

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/cancellation_signal.hpp>

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <typeinfo>
#include <vector>

namespace pscoro::worker {

class worker_service {
 public:
  /// The worker `task` ("worker:1"), which is `self` in its handshakes with the ps.
  worker_service(asio::any_io_executor executor, std::string task, net::task_identity self, transport_options options);
  /// This worker is `task` (`self`) from now on: the chief admitted it with that index (elastic
  /// admission), before any session.
  void set_identity(std::string task, net::task_identity self) {
    task_ = std::move(task);
    self_ = std::move(self);
  }

  /// Registers `fn` under `name`; binding a name twice replaces the first binding.
  void bind(std::string name, std::string signature, detail::erased_worker_function fn);
  /// Registers the dataset function `name` (same rule).
  void bind_dataset(std::string name, detail::erased_dataset_function fn);
  /// Registers the resource function `name` (same rule).
  void bind_resource(std::string name, detail::erased_resource_function fn);

  /// Takes the ps addresses and the coordinator session from the chief's Hello.
  void set_cluster(const wire::Hello& hello);
  /// The coordinator session ended: drops its per-worker values (iterators, variables, resources), and its ps connections for good (a
  /// closure of that session still running fails at its next ps call instead of touching the
  /// variables of the next session).
  void end_session();
  /// Closes this worker's connections to the ps and stops its build and input threads (the server
  /// stops), after the function or element each is making.
  void close_connections();

  /// How many per-worker values (iterators, variables, resources) this worker holds.
  std::size_t per_worker_values() const noexcept { return per_worker_.size(); }
  /// How many per-worker values are being built, or wait for the build thread to be built.
  std::size_t values_being_built() const noexcept { return creating_.size(); }

  /// The kinds of request a worker serves; the server refuses the rest (wire::not_served), as
  /// handle() does when given one.
  static constexpr std::array kinds_served{
      wire::Request::kRunFunction,     wire::Request::kCreateIterator,          wire::Request::kReleaseIterator,
      wire::Request::kCreateResource,  wire::Request::kCreatePerWorkerVariable, wire::Request::kReadPerWorkerVariable,
      wire::Request::kCancelClosures};

  /// Serves a request of one of kinds_served; failures come back as an error status.
  asio::awaitable<wire::frame> handle(wire::frame request);

 private:
  struct bound_function {
    std::string signature;
    detail::erased_worker_function fn;
  };

  // A closure running here: each runs as its own asio thread of execution, whose cancellation
  // slot is `signal`'s, so that the chief can cancel it.
  struct running_closure {
    std::uint64_t generation = 0;
    std::uint64_t number = 0;  // RunFunction.closure
    asio::cancellation_signal signal;
    bool cancelled = false;
  };

  asio::awaitable<wire::frame> run_function(wire::frame request);
  /// The body of a closure's own thread of execution: run(), with asio's own cancellation throw off.
  static asio::awaitable<value> run_cancellable(worker_service* self, const wire::frame& request,
                                                const wire::RunFunction& call);
  asio::awaitable<value> run(const wire::frame& request, const wire::RunFunction& call);
  /// Cancels the running closures of `generation` (every one when it is empty); returns how many.
  std::size_t cancel(std::optional<std::uint64_t> generation);
  /// Cancels the running closures numbered `numbers`; returns how many.
  std::size_t cancel_numbered(std::span<const std::uint64_t> numbers);
  /// Cancels `closure`: its next pscoro operation throws errc::cancelled.
  void cancel_one(running_closure& closure);
  /// Builds the iterator; the failure of the user's dataset function comes back as a status, naming
  /// the function; a request that is not valid here throws.
  asio::awaitable<wire::Status> create_iterator(const wire::CreateIterator& create);
  /// Builds the resource, as create_iterator its iterator.
  asio::awaitable<wire::Status> create_resource(const wire::CreateResource& create);
  /// Builds per-worker value `id` with `make` (run_on_build_thread) and keeps it, unless it was
  /// released or asked for again meanwhile; `make`'s failure is the status, naming `described`
  /// `function`. Throws errc::aborted if the session ended meanwhile (the value is dropped, not
  /// kept for the next session).
  asio::awaitable<wire::Status> create_value(std::uint64_t id, detail::per_worker_table::kind kind,
                                             std::string function, const std::type_info* type,
                                             std::function<std::shared_ptr<void>()> make, std::string_view described);
  /// Runs a user's dataset or resource function on the build thread and returns what it made. Such
  /// a function may take long (read a file list, load a vocabulary, decode a dataset into memory):
  /// on the executor it held up heartbeats past heartbeat_timeout, so the chief lost the worker,
  /// and lost it again each time it came back and was asked to build the value anew; on the input
  /// thread it held up every other iterator's next_async meanwhile. Throws errc::unavailable if the
  /// worker is stopping.
  asio::awaitable<std::shared_ptr<void>> run_on_build_thread(std::function<std::shared_ptr<void>()> make);
  /// Throws errc::aborted if a session ended since `sessions_ended` was read (the value built for
  /// `function` belongs to no session any more).
  void check_same_session(std::uint64_t sessions_ended, const std::string& function) const;
  /// Forgets the creation of per-worker value `id`, if any: its function does not run if the build
  /// thread has not started it yet, and what it makes is not kept.
  void abandon_creation(std::uint64_t id);
  /// Keeps a per-worker variable; throws errc::invalid_argument for a value that does not match it.
  void create_variable(const wire::frame& request, const wire::CreatePerWorkerVariable& create);
  /// Answers with the value of a per-worker variable; throws errc::not_found, errc::invalid_argument.
  void read_variable(const wire::ReadPerWorkerVariable& read, wire::frame& response) const;

  asio::any_io_executor executor_;
  std::string task_;
  net::task_identity self_;
  transport_options options_;
  std::map<std::string, bound_function, std::less<>> functions_;
  std::map<std::string, detail::erased_dataset_function, std::less<>> datasets_;
  std::map<std::string, detail::erased_resource_function, std::less<>> resources_;
  detail::per_worker_table per_worker_;
  // Where iterators' next_async() runs their pipelines.
  std::shared_ptr<detail::input_thread> input_ = std::make_shared<detail::input_thread>();
  // Where dataset and resource functions build per-worker values, one at a time.
  std::shared_ptr<detail::input_thread> build_thread_ = std::make_shared<detail::input_thread>();
  std::shared_ptr<client::ps_client> ps_;
  std::vector<std::shared_ptr<running_closure>> running_;
  std::uint64_t sessions_ended_ = 0;  // end_session() calls: what a creation on the build thread checks
  // Per-worker values being built on the build thread (create_value), by id: the flag that tells
  // the build thread, and the request, that the value is no longer wanted. A release, the same id
  // asked again, or a new session sets it and removes the entry (abandon_creation).
  std::map<std::uint64_t, std::shared_ptr<std::atomic<bool>>> creating_;
};

}  // namespace pscoro::worker

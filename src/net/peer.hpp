// Setting connections up: reaching a task (with retries while it starts) and the handshake from
// both ends (listening, the accepting side's checks), and a peer that reconnects on demand.
#pragma once

#include <pscoro/transport_options.hpp>

#include "common/address.hpp"
#include "common/log.hpp"
#include "wire/connection.hpp"

#include <asio/awaitable.hpp>
#include <asio/ip/tcp.hpp>

#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace pscoro::net {

/// The frame limits of an established connection.
wire::frame_limits limits_of(const transport_options& options);
/// The frame limits during a handshake: small frames without payload.
wire::frame_limits handshake_limits_of(const transport_options& options);

/// Where a task listens given its cluster-spec address: a loopback host is kept (local clusters);
/// any other host becomes the wildcard with the same port, as TF's server does (under Kubernetes
/// the address is a service name, which need not be an address of this pod).
std::string listen_address_for(const std::string& spec_address, const std::string& task);

/// Opens `acceptor` listening on `address` ("host:port"; port 0 picks a free port). Throws
/// errc::invalid_argument for a non-loopback address without a cluster secret (check_exposure).
void listen_on(asio::ip::tcp::acceptor& acceptor, const std::string& address, const std::string& task,
               const transport_options& options);

/// Who a task is in a handshake: its job, index and incarnation (random per process start).
struct task_identity {
  std::string job;
  int index = 0;
  std::uint64_t incarnation = 0;
  /// A worker that announced itself and serves no session yet: a chief's Hello that admits it
  /// (Hello.admits) may name another index, which becomes this worker's (elastic admission).
  bool awaiting_admission = false;
};

/// A random incarnation for a process starting now; never 0, which a Hello's session reserves for
/// "none" (a chief's incarnation is its session).
std::uint64_t new_incarnation();

/// The Hello with which `self` opens connections in coordinator session `session` (0: none, as a
/// worker announcing itself to the chief). The chief adds the cluster; an announcement, the address.
wire::Hello make_hello(const task_identity& self, std::uint64_t session);

/// The accepting side of a handshake on a fresh connection to `self`: reads the Hello and checks
/// that it is one and speaks our protocol version; with a cluster secret, proves it in a Challenge
/// and checks the peer's Proof. All within options.handshake_timeout, under the handshake frame
/// limits. Returns the Hello of a peer that passed, or nothing after refusing it or giving up on it
/// (logged either way). The caller then checks what the peer may do and sends welcome() or refuse().
/// The handshake's frames grow their read buffer from `budget` (handshake_gate::place::budget).
asio::awaitable<std::optional<wire::Hello>> receive_hello(std::shared_ptr<wire::connection> connection,
                                                          transport_options options, task_identity self,
                                                          std::shared_ptr<wire::byte_budget> budget);

/// Paces an accept loop: after a failed accept it waits (10 ms, doubling to 1 s) so that a lasting
/// failure, such as running out of file descriptors (EMFILE), does not spin, and logs failures at
/// most once per 10 s with how many it held back.
class accept_backoff {
 public:
  /// Logs `ec` (throttled) and waits before the next accept.
  asio::awaitable<void> failed(std::error_code ec, const std::string& task);
  void succeeded() noexcept { delay_ = initial_delay; }

 private:
  static constexpr std::chrono::milliseconds initial_delay{10};
  std::chrono::milliseconds delay_ = initial_delay;
  log::throttle throttle_{1, std::chrono::seconds(10)};
};

/// Refuses a peer in the handshake: a Welcome with `code` and `why` (best effort), then closes.
/// Logged, at most 20 lines per 10 s per thread (a flood of strangers must not flood the log).
void refuse(const std::shared_ptr<wire::connection>& connection, std::error_code code, const std::string& why,
            const std::string& task);

/// Refuses a peer before its handshake started: as refuse(), or, when it is to speak TLS (in which
/// a plain Welcome would be noise), by closing the connection, which the peer retries.
void refuse_early(const std::shared_ptr<wire::connection>& connection, const transport_options& options,
                  std::error_code code, const std::string& why, const std::string& task);

/// Accepts a peer in the handshake: an ok Welcome naming this task.
void welcome(const std::shared_ptr<wire::connection>& connection, const task_identity& self);

/// Connects to `task` ("ps:0") at `address`, sends `hello` and waits for the Welcome; with a cluster
/// secret, checks the task's proof of it and proves it in turn. Retries refused and failed
/// connections with backoff until options.connect_timeout, then throws errc::unavailable. Throws at
/// once: a refusal in the Welcome (a version mismatch, a wrong secret) as a remote_error;
/// errc::unauthenticated when the task fails to prove the secret; errc::failed_precondition when
/// another task than `task` answers (the cluster spec names the wrong address).
asio::awaitable<std::shared_ptr<wire::connection>> connect_to_task(std::string task, std::string address,
                                                                   wire::Hello hello, transport_options options);

/// One remote task: `get()` returns the open connection, connecting first when there is none.
/// Concurrent callers share one attempt, which runs on its own: a caller that stops waiting (its
/// closure was cancelled) leaves it to the others. Use on one executor only.
class peer {
 public:
  peer(asio::any_io_executor executor, std::string task, std::string address, wire::Hello hello,
       transport_options options)
      : executor_(std::move(executor)),
        task_(std::move(task)),
        address_(std::move(address)),
        hello_(std::move(hello)),
        options_(options) {}
  peer(const peer&) = delete;  // its connection's close handler refers to it
  peer& operator=(const peer&) = delete;

  const std::string& task() const noexcept { return task_; }
  const std::string& address() const noexcept { return address_; }
  void set_address(std::string address) { address_ = std::move(address); }
  /// The open connection, or null.
  std::shared_ptr<wire::connection> connection() const {
    return connection_ && connection_->is_open() ? connection_ : nullptr;
  }

  /// Called with the reason when a connection of this peer closes without close() (the task died,
  /// hung past the heartbeat timeout, or the network failed). Set before the first get().
  void on_lost(std::function<void(const std::string& reason)> handler) { on_lost_ = std::move(handler); }

  /// Called with every ok reply to the Heartbeats of this peer's connections, which are then sent
  /// every heartbeat interval (wire::connection::on_heartbeat_reply). Set before the first get().
  void on_heartbeat_reply(std::function<void(const wire::frame& reply)> handler) {
    on_heartbeat_reply_ = std::move(handler);
  }

  /// From now on get() and call() throw `failure` at once instead of connecting (a lost ps: its
  /// state is gone, and retrying for connect_timeout would only delay the error).
  void fail_with(std::exception_ptr failure) { failure_ = std::move(failure); }

  /// Closes the connection, if open, and fails the callers waiting for a connection attempt (the
  /// attempt's result is dropped); the next get() connects again.
  void close(const std::string& reason);

  /// The open connection; connects (with retries) if needed. Throws what connecting throws, or
  /// errc::cancelled when the caller's closure is cancelled while it waits (see wake_waiters()).
  asio::awaitable<std::shared_ptr<wire::connection>> get();

  /// Wakes the callers waiting for a connection attempt: those whose closure has been cancelled
  /// (their coroutine's cancellation state says so) throw errc::cancelled, the others wait on.
  /// A closure's state records a cancellation without aborting what it waits on (run_cancellable in
  /// worker_service), so whoever cancels closures calls this; the attempt itself goes on.
  void wake_waiters();

  /// One attempt to connect (no retries), for probing a task that may have come back: the open
  /// connection, or null. Throws what a refusing task says (a version mismatch).
  asio::awaitable<std::shared_ptr<wire::connection>> connect_once();

  /// Sends `request` and returns the response; a task that cannot be reached or a lost connection
  /// throws a remote_error of errc::unavailable whose origin is this task, naming the reason; an
  /// error status throws its remote_error. `receive_into`: as wire::connection::async_call's.
  asio::awaitable<wire::frame> call(wire::frame request, std::vector<wire::segment_target> receive_into = {});

 private:
  struct connect_attempt;
  void adopt(std::shared_ptr<wire::connection> fresh);
  /// Connects to `task` and hands the outcome to `attempt`'s waiters (and the connection to `self`,
  /// while `alive` says it lives).
  static asio::awaitable<void> run_attempt(peer* self, std::weak_ptr<void> alive,
                                           std::shared_ptr<connect_attempt> attempt, std::string task,
                                           std::string address, wire::Hello hello, transport_options options);

  asio::any_io_executor executor_;
  std::string task_;
  std::string address_;
  wire::Hello hello_;
  transport_options options_;
  // One connection attempt that concurrent get() calls share. Its waiters wait for `changed`, set
  // (and replaced by a fresh event) when they are woken, and set for good when the attempt ends.
  struct connect_attempt {
    explicit connect_attempt(const asio::any_io_executor& executor)
        : changed(std::make_shared<detail::async_event>(executor)) {}
    void finish(std::exception_ptr failure) {
      finished = true;
      error = std::move(failure);
      changed->set();
    }
    std::shared_ptr<detail::async_event> changed;
    bool finished = false;
    std::exception_ptr error;
  };

  std::shared_ptr<wire::connection> connection_;
  std::shared_ptr<connect_attempt> connecting_;
  std::function<void(const std::string&)> on_lost_;
  std::function<void(const wire::frame&)> on_heartbeat_reply_;
  bool closing_ = false;  // close() runs: the loss is ours, not the task's
  std::exception_ptr failure_;
  std::shared_ptr<int> lifetime_ = std::make_shared<int>(0);  // expires with the peer
};

}  // namespace pscoro::net

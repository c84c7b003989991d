// The client side of connections: reaching a task (with retries while it starts), the handshake,
// and a peer that reconnects on demand.
#pragma once

#include <pscoro/transport_options.hpp>

#include "wire/connection.hpp"

#include <asio/awaitable.hpp>

#include <functional>
#include <memory>
#include <string>

namespace pscoro::runtime {

wire::frame_limits limits_of(const transport_options& options);

/// Splits "host:port"; throws errc::invalid_argument naming `task` when it is malformed.
std::pair<std::string, std::string> split_address(const std::string& address, const std::string& task);

/// Connects to `task` at `address`, sends `hello` and waits for the Welcome. Retries refused and
/// failed connections with backoff until options.connect_timeout, then throws errc::unavailable;
/// a refusal in the Welcome (e.g. a version mismatch) throws at once as a remote_error.
asio::awaitable<std::shared_ptr<wire::connection>> connect_to_task(std::string task, std::string address,
                                                                   wire::Hello hello, transport_options options);

/// One remote task: `get()` returns the open connection, connecting first when there is none.
/// Concurrent callers share one attempt. Use on one executor only.
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

  /// From now on get() and call() throw `failure` at once instead of connecting (a lost ps: its
  /// state is gone, and retrying for connect_timeout would only delay the error).
  void fail_with(std::exception_ptr failure) { failure_ = std::move(failure); }

  /// Closes the connection, if open; the next get() connects again.
  void close(const std::string& reason) {
    closing_ = true;
    if (connection_) connection_->close(reason);
    closing_ = false;
  }

  /// The open connection; connects (with retries) if needed. Throws what connecting throws.
  asio::awaitable<std::shared_ptr<wire::connection>> get();

  /// One attempt to connect (no retries), for probing a task that may have come back: the open
  /// connection, or null. Throws what a refusing task says (a version mismatch).
  asio::awaitable<std::shared_ptr<wire::connection>> connect_once();

  /// Sends `request` and returns the response; a lost connection throws errc::unavailable naming
  /// the task and the reason, an error status throws its remote_error.
  asio::awaitable<wire::frame> call(wire::frame request, std::vector<byte_buffer> receive_into = {});

 private:
  void adopt(std::shared_ptr<wire::connection> fresh);

  asio::any_io_executor executor_;
  std::string task_;
  std::string address_;
  wire::Hello hello_;
  transport_options options_;
  std::shared_ptr<wire::connection> connection_;
  std::shared_ptr<detail::async_event> connecting_;
  std::exception_ptr connect_error_;
  std::function<void(const std::string&)> on_lost_;
  bool closing_ = false;  // close() runs: the loss is ours, not the task's
  std::exception_ptr failure_;
  std::shared_ptr<int> lifetime_ = std::make_shared<int>(0);  // expires with the peer
};

}  // namespace pscoro::runtime

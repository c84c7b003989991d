// One TCP connection between two tasks, multiplexed: every request carries an id, many are in
// flight at once, responses may come back in any order. Writes are queued and gathered (several
// frames per system call); reads run in one loop per connection. All members must be used on the
// connection's executor.
#pragma once

#include "metrics/library.hpp"
#include "wire/buffer_pool.hpp"
#include "wire/frame.hpp"
#include "wire/status.hpp"

#include <pscoro/detail/completion.hpp>

#include <asio/async_result.hpp>
#include <asio/awaitable.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/steady_timer.hpp>

#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>

namespace pscoro::wire {

class connection : public std::enable_shared_from_this<connection> {
 public:
  /// Serves one request; returns the response (status set). An exception becomes an error response
  /// (status_of, with no origin: the caller names the task it asked).
  using request_handler = std::function<asio::awaitable<frame>(frame request)>;
  using close_handler = std::function<void(const std::string& reason)>;
  /// An upper bound of the bytes a request's answer will hold (0: small or unknown), asked when
  /// the request arrives; a wrong guess only moves when reading pauses. It must not throw (it runs
  /// in the read loop).
  using answer_bound = std::function<std::uint64_t(const frame& request)>;

  connection(asio::ip::tcp::socket socket, frame_limits limits, std::string peer);

  /// "worker:1 at 127.0.0.1:4567": used in every message about this connection.
  const std::string& peer() const noexcept { return peer_; }
  void set_peer(std::string peer) { peer_ = std::move(peer); }
  asio::any_io_executor get_executor() { return socket_.get_executor(); }
  bool is_open() const noexcept { return !closed_; }
  /// Why the connection closed (empty while open).
  const std::string& close_reason() const noexcept { return close_reason_; }
  /// Whether reading waits for requests to be answered and answers to be written
  /// (max_bytes_in_flight).
  bool reading_paused() const noexcept { return room_ != nullptr; }
  /// Whether the peer has sent its last frame (it closed its sending side) while answers to it are
  /// still due: the connection closes once they are written.
  bool peer_finished() const noexcept { return peer_finished_.has_value(); }

  /// Runs a TLS handshake on the fresh connection (as the `side` that dialled or accepted) before
  /// anything else is sent or read; from then on every byte goes through TLS. Throws
  /// std::system_error with OpenSSL's reason when the handshake fails (an untrusted certificate,
  /// none, or a peer that does not speak TLS).
  asio::awaitable<void> start_tls(std::shared_ptr<asio::ssl::context> context, asio::ssl::stream_base::handshake_type side);
  bool uses_tls() const noexcept { return tls_ != nullptr; }
  /// Whether the peer's first byte (waited for, not consumed) starts a plain pscoro frame rather
  /// than a TLS record: a server that requires TLS answers such a peer in words it can read.
  asio::awaitable<bool> peer_sends_plain_frames();

  /// Reads one frame before start(), for the handshake. Same results as frame_reader::read.
  asio::awaitable<std::optional<frame>> read_frame() {
    if (tls_) return reader_.read(*tls_);
    return reader_.read(socket_);
  }
  /// Counts the frames and bytes of this connection from now on in `traffic` (its peer task's
  /// counters, which live as long as the process), and notes when the peer was heard from: set
  /// once the peer is known (its handshake has just arrived).
  void count_traffic(metrics::peer_traffic* traffic) noexcept {
    traffic_ = traffic;
    if (traffic_) traffic_->heard(std::chrono::steady_clock::now());
  }

  /// Receives the large segments of requests into buffers of `pool` when it has one of the right
  /// size (a ps's: see buffer_pool), instead of fresh ones. Set before start().
  void receive_requests_into(std::shared_ptr<buffer_pool> pool) noexcept { request_buffers_ = std::move(pool); }

  /// Counts `bound(request)` against max_bytes_in_flight from a request's arrival until its answer
  /// is queued (which then counts its own bytes until written): answers much larger than their
  /// requests (a ps's reads) are then bounded before they exist, not only once queued, so a peer
  /// cannot have more of them made at once than the limit holds. Set before start().
  void bound_answers_by(answer_bound bound) noexcept { answer_bound_ = std::move(bound); }

  /// The limits for the frames read from now on (the handshake runs under smaller ones).
  void set_limits(frame_limits limits) noexcept { reader_.set_limits(std::move(limits)); }

  /// Starts the read loop. Requests go to `on_request` (none: a request closes the connection);
  /// `on_close` runs once when the connection closes for any reason. A peer that closes its
  /// sending side gets the answers to every request it sent before the connection closes.
  void start(request_handler on_request, close_handler on_close);

  /// Queues `f` for writing. A frame with a producer is filled a step per turn from now on, and
  /// written as it is filled.
  void send(frame f);

  /// Sends `request` and completes with its response: void(std::error_code, frame). The code is
  /// errc::unavailable when the connection closes first (see close_reason()), or at once when the
  /// peer has finished sending (peer_finished()). Segment i of the
  /// response is read into `receive_into[i]` when that has its size (no copy after the read), its
  /// arrival told as segment_target says while the call is pending (never after it failed).
  template <class CompletionToken>
  auto async_call(frame request, std::vector<segment_target> receive_into, CompletionToken&& token) {
    return asio::async_initiate<CompletionToken, void(std::error_code, frame)>(
        [self = shared_from_this()](auto handler, frame request, std::vector<segment_target> receive_into) {
          detail::erased_handler<void(std::error_code, frame)> stored(std::move(handler), self->get_executor());
          // A peer that finished sending can answer nothing more.
          if (self->closed_ || self->peer_finished_) {
            stored(make_error_code(errc::unavailable), frame{});
            return;
          }
          request.kind = frame_kind::request;
          request.request_id = self->next_request_id_++;
          self->pending_.emplace(request.request_id, pending_call{std::move(stored), std::move(receive_into)});
          self->send(std::move(request));
        },
        token, std::move(request), std::move(receive_into));
  }
  template <class CompletionToken>
  auto async_call(frame request, CompletionToken&& token) {
    return async_call(std::move(request), {}, std::forward<CompletionToken>(token));
  }

  /// Sends a Heartbeat request whenever nothing has arrived for `interval`, and closes the
  /// connection when one has had no reply, and nothing else arrived, for `timeout`. A check that
  /// runs late because this side's executor was busy does not count against the peer. With a
  /// handler for the replies (on_heartbeat_reply), one every `interval` whatever else arrives.
  void start_heartbeat(std::chrono::milliseconds interval, std::chrono::milliseconds timeout);
  /// Hands every ok reply to a Heartbeat to `handler` (the chief reads a ps's totals there); the
  /// Heartbeats are then sent every interval even while other frames arrive, so that what they
  /// carry stays fresh. Set before start_heartbeat().
  void on_heartbeat_reply(std::function<void(const frame& reply)> handler) {
    on_heartbeat_reply_ = std::move(handler);
  }

  /// Closes the socket, fails pending calls, runs the close handler. Idempotent.
  void close(const std::string& reason);
  /// Closes once every queued frame is written (e.g. after a Welcome that refuses the peer).
  void close_after_flush(const std::string& reason);

 private:
  static asio::awaitable<void> read_loop(std::shared_ptr<connection> self);
  static asio::awaitable<void> serve(std::shared_ptr<connection> self, frame request, std::uint64_t bytes);
  static asio::awaitable<void> stall_watch(std::shared_ptr<connection> self);
  static asio::awaitable<void> heartbeat_loop(std::shared_ptr<connection> self, std::chrono::milliseconds interval,
                                              std::chrono::milliseconds timeout);
  void dispatch(frame f);
  void enqueue(encoded_frame f);
  /// Gives back `bytes` of max_bytes_in_flight; the read loop goes on when they are few enough.
  void release(std::uint64_t bytes);
  void write_next();
  /// Fills the next step of the first frame being filled (segment_producer), writes what is new.
  void produce_step();

  asio::ip::tcp::socket socket_;
  // With TLS, every read and write goes through it; it shares socket_ (and keeps its context).
  std::shared_ptr<asio::ssl::context> tls_context_;
  std::unique_ptr<tls_stream> tls_;
  frame_reader reader_;
  std::string peer_;
  request_handler on_request_;
  close_handler on_close_;
  std::function<void(const frame&)> on_heartbeat_reply_;
  std::shared_ptr<buffer_pool> request_buffers_;
  answer_bound answer_bound_;
  bool closed_ = false;
  std::string close_reason_;
  std::uint64_t next_request_id_ = 1;
  struct pending_call {
    detail::erased_handler<void(std::error_code, frame)> handler;
    std::vector<segment_target> receive_into;
  };
  std::unordered_map<std::uint64_t, pending_call> pending_;
  std::deque<encoded_frame> write_queue_;
  bool writing_ = false;       // a write is under way
  std::size_t finishing_ = 0;  // frames of write_queue_ that the write under way ends
  bool producing_ = false;     // a produce_step is queued
  std::vector<asio::const_buffer> write_buffers_;
  std::optional<std::string> close_when_flushed_;
  std::optional<std::string> peer_finished_;  // why to close once nothing is in flight (peer_finished())
  std::chrono::steady_clock::time_point last_received_ = std::chrono::steady_clock::now();
  std::optional<asio::steady_timer> heartbeat_timer_;
  std::optional<asio::steady_timer> stall_timer_;
  // Bytes of the requests being served (with their answers' bounds) and of the answers queued and
  // not written yet, and what the read loop waits on when they are too many.
  std::uint64_t bytes_in_flight_ = 0;
  std::shared_ptr<detail::async_event> room_;
  metrics::peer_traffic* traffic_ = nullptr;
};

/// Closes a connection that has not finished its handshake in time: a pending read on it then
/// ends. cancel() once the handshake is done; expired() tells whether it fired.
class handshake_deadline {
 public:
  handshake_deadline(const std::shared_ptr<connection>& c, std::chrono::milliseconds timeout, std::string reason)
      : timer_(c->get_executor(), timeout) {
    // The handler may run after the awaiting coroutine is gone: it holds only shared state. It may
    // also be queued already when cancel() comes (the same tick): then the flag stops it.
    timer_.async_wait([weak = std::weak_ptr(c), expired = expired_, cancelled = cancelled_,
                       reason = std::move(reason)](std::error_code ec) {
      if (auto open = weak.lock(); !ec && !*cancelled && open) {
        *expired = true;
        open->close(reason);
      }
    });
  }
  void cancel() {
    *cancelled_ = true;
    timer_.cancel();
  }
  bool expired() const noexcept { return *expired_; }

 private:
  std::shared_ptr<bool> expired_ = std::make_shared<bool>(false);
  std::shared_ptr<bool> cancelled_ = std::make_shared<bool>(false);
  asio::steady_timer timer_;
};

}  // namespace pscoro::wire

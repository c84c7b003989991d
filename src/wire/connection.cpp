#include "wire/connection.hpp"

#include "common/log.hpp"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/post.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/ssl/stream.hpp>
#include <asio/write.hpp>

#include <algorithm>
#include <limits>

namespace pscoro::wire {

connection::connection(asio::ip::tcp::socket socket, frame_limits limits, std::string peer)
    : socket_(std::move(socket)), reader_(limits), peer_(std::move(peer)) {
  std::error_code ignored;
  socket_.set_option(asio::ip::tcp::no_delay(true), ignored);
}

asio::awaitable<void> connection::start_tls(std::shared_ptr<asio::ssl::context> context,
                                            asio::ssl::stream_base::handshake_type side) {
  tls_context_ = std::move(context);
  tls_ = std::make_unique<tls_stream>(socket_, *tls_context_);
  co_await tls_->async_handshake(side, asio::use_awaitable);
}

asio::awaitable<bool> connection::peer_sends_plain_frames() {
  std::uint8_t first = 0;
  auto [ec, n] = co_await socket_.async_receive(asio::buffer(&first, 1), asio::socket_base::message_peek,
                                                asio::experimental::as_tuple(asio::use_awaitable));
  co_return !ec && n == 1 && first == (frame_magic & 0xff);  // a TLS record starts with 0x14..0x17
}

void connection::start(request_handler on_request, close_handler on_close) {
  on_request_ = std::move(on_request);
  on_close_ = std::move(on_close);
  asio::co_spawn(socket_.get_executor(), read_loop(shared_from_this()), asio::detached);
  if (reader_.limits().stall_timeout.count() > 0) {
    stall_timer_.emplace(socket_.get_executor());
    asio::co_spawn(socket_.get_executor(), stall_watch(shared_from_this()), asio::detached);
  }
}

asio::awaitable<void> connection::stall_watch(std::shared_ptr<connection> self) {
  using clock = std::chrono::steady_clock;
  const auto timeout = self->reader_.limits().stall_timeout;
  std::optional<std::uint64_t> seen;  // bytes received at the last check, if mid-frame then
  while (!self->closed_) {
    const auto scheduled = clock::now() + timeout;
    self->stall_timer_->expires_at(scheduled);
    co_await self->stall_timer_->async_wait(asio::experimental::as_tuple(asio::use_awaitable));
    if (self->closed_) break;
    // Woken late: this side's executor was busy and may not have read what arrived. Start over.
    if (clock::now() - scheduled > timeout || !self->reader_.mid_frame() || self->room_) {
      seen.reset();
      continue;
    }
    const auto received = self->reader_.bytes_received();
    std::error_code ignored;
    // Bytes waiting in the kernel are progress this side has not read yet (its executor was busy).
    if (seen && *seen == received && self->socket_.available(ignored) == 0) {
      log::warning("closing the connection of {}: it stalled in the middle of a frame for {} ms", self->peer_,
                   timeout.count());
      self->close(fmt::format("{} stalled in the middle of a frame: no byte for {} ms (frame_stall_timeout)",
                              self->peer_, timeout.count()));
      break;
    }
    seen = received;
  }
}

asio::awaitable<void> connection::read_loop(std::shared_ptr<connection> self) {
  std::string reason = "the peer closed the connection";
  // A response's segments go where its caller asked, if it did (see async_call); a request's into a
  // pooled buffer of their size, if there is one.
  const segment_destination destination = [raw = self.get()](const fixed_header& header, std::size_t index,
                                                              std::uint64_t size) -> segment_target {
    if (header.kind == frame_kind::request) {
      return {raw->request_buffers_ ? raw->request_buffers_->take(size) : byte_buffer{}, {}};
    }
    if (header.kind != frame_kind::response) return {};
    auto it = raw->pending_.find(header.request_id);
    if (it == raw->pending_.end() || index >= it->second.receive_into.size()) return {};
    segment_target target = std::move(it->second.receive_into[index]);
    if (target.on_arrival) {
      // A close fails the call (its caller may be gone by the time a read finished before the close
      // completes): from then on its segments' arrival is nobody's business.
      target.on_arrival = [raw, on_arrival = std::move(target.on_arrival)](std::span<const std::byte> arrived) {
        if (!raw->closed_) on_arrival(arrived);
      };
    }
    return target;
  };
  try {
    while (!self->closed_) {
      if (self->bytes_in_flight_ > self->reader_.limits().max_bytes_in_flight) {
        // Backpressure: read on once enough requests are answered (or the connection closes).
        const auto room = std::make_shared<detail::async_event>(self->socket_.get_executor());
        self->room_ = room;
        co_await room->async_wait(asio::use_awaitable);
        self->room_.reset();
        continue;
      }
      // Not a conditional expression: g++ 12 mishandles a co_await in each branch of one.
      std::optional<frame> f;
      if (self->tls_) {
        f = co_await self->reader_.read(*self->tls_, &destination);
      } else {
        f = co_await self->reader_.read(self->socket_, &destination);
      }
      if (!f && self->on_request_ && self->pending_.empty() && self->bytes_in_flight_ > 0) {
        // The peer sent its last frame and closed its side (a shutdown(SHUT_WR), or a client done
        // asking): what it asked is still answered (kernels, lanes and streamed replies included),
        // then release() closes the connection. One waiting on calls of ours closes now: their
        // answers can no longer come.
        self->peer_finished_ = reason;
        co_return;
      }
      if (!f) break;
      self->last_received_ = std::chrono::steady_clock::now();
      if (auto* traffic = self->traffic_) {
        traffic->heard(self->last_received_);
        traffic->frames_received.inc();
        traffic->bytes_received.inc(f->wire_bytes);
      }
      self->dispatch(std::move(*f));
    }
  } catch (const std::system_error& e) {
    reason = e.code().category() == error_category() ? e.what() : e.code().message();
  }
  self->close(reason);
}

void connection::dispatch(frame f) {
  switch (f.kind) {
    case frame_kind::response: {
      auto it = pending_.find(f.request_id);
      if (it == pending_.end()) {
        close(fmt::format("protocol error: response to request {} which is not pending", f.request_id));
        return;
      }
      auto handler = std::move(it->second.handler);
      pending_.erase(it);
      handler(std::error_code{}, std::move(f));
      return;
    }
    case frame_kind::request: {
      if (!on_request_) {
        close("protocol error: this side serves no requests");
        return;
      }
      // A bound past the limit pauses reading just as the limit does. Capped at it, and at 1 TiB
      // for a limit set near 2^64 (none), the sum stays far from overflowing: the bytes of frames
      // that did arrive, plus at most 2^40 per request in service.
      constexpr std::uint64_t largest_bound = std::uint64_t{1} << 40;
      const std::uint64_t cap = std::min(reader_.limits().max_bytes_in_flight, largest_bound);
      const std::uint64_t bytes = f.wire_bytes + (answer_bound_ ? std::min(answer_bound_(f), cap) : 0);
      bytes_in_flight_ += bytes;
      asio::co_spawn(socket_.get_executor(), serve(shared_from_this(), std::move(f), bytes), asio::detached);
      return;
    }
    case frame_kind::hello:
    case frame_kind::welcome:
    case frame_kind::challenge:
    case frame_kind::proof:
      close("protocol error: handshake frame after the handshake");
      return;
  }
}

asio::awaitable<void> connection::serve(std::shared_ptr<connection> self, frame request, std::uint64_t bytes) {
  const auto id = request.request_id;
  frame response;
  try {
    response = co_await self->on_request_(std::move(request));
  } catch (...) {
    response = frame{};
    // No origin: the connection does not know its task's name; the caller fills in whom it asked.
    *response.message.mutable_response()->mutable_status() = status_of(std::current_exception(), "");
  }
  response.kind = frame_kind::response;
  response.request_id = id;
  // The answer holds its bytes against max_bytes_in_flight until it is written, as its request did
  // while it was served: a peer that sends requests and never reads the answers is not read any
  // more once they are too many, rather than growing this side's write queue without limit.
  if (!self->closed_) {
    encoded_frame answer = encode(std::move(response));
    answer.held = answer.head.size();
    for (const auto& segment : answer.segments) answer.held += segment.size();
    self->bytes_in_flight_ += answer.held;
    self->enqueue(std::move(answer));
  }
  self->release(bytes);
}

void connection::release(std::uint64_t bytes) {
  bytes_in_flight_ -= bytes;
  if (bytes_in_flight_ == 0 && peer_finished_) {
    close(*peer_finished_);  // every request of a peer that finished sending is answered and written
    return;
  }
  if (auto room = room_; room && bytes_in_flight_ <= reader_.limits().max_bytes_in_flight) room->set();
}

void connection::send(frame f) {
  if (closed_) return;
  enqueue(encode(std::move(f)));
}

void connection::enqueue(encoded_frame f) {
  write_queue_.push_back(std::move(f));
  if (!write_queue_.back().complete() && !producing_) {
    producing_ = true;
    asio::post(socket_.get_executor(), [self = shared_from_this()] { self->produce_step(); });
  }
  if (!writing_) write_next();
}

void connection::produce_step() {
  producing_ = false;
  if (closed_) return;
  // The first frame still being filled: frames are filled in the order they are sent.
  const auto it = std::find_if(write_queue_.begin(), write_queue_.end(), [](const encoded_frame& f) { return !f.complete(); });
  if (it == write_queue_.end()) return;
  try {
    it->produced = it->produce_last();
  } catch (const std::exception& e) {
    close(fmt::format("could not fill a frame to send: {}", e.what()));
    return;
  } catch (...) {
    close("could not fill a frame to send");
    return;
  }
  if (it->produced >= it->segments.back().size()) it->produce_last = nullptr;  // done: what it holds goes now
  // Another turn for the rest, whatever the peer reads: a producer holds what it fills from (a
  // ps's variable waits for it), so it must end in bounded time.
  if (std::any_of(it, write_queue_.end(), [](const encoded_frame& f) { return !f.complete(); })) {
    producing_ = true;
    asio::post(socket_.get_executor(), [self = shared_from_this()] { self->produce_step(); });
  }
  if (!writing_) write_next();
}

void connection::write_next() {
  // Gather as many queued frames as fit in one write operation (asio hands at most 64 buffers to
  // each sendmsg; the kernel's IOV_MAX is 1024). A frame whose last segment is still being filled
  // goes out as far as it is filled, and the frames behind it wait.
  static constexpr std::size_t max_buffers = 256;
  write_buffers_.clear();
  finishing_ = 0;
  for (auto& f : write_queue_) {
    const std::size_t filled = f.complete() ? (f.segments.empty() ? 0 : f.segments.back().size()) : f.produced;
    if (!f.started) {
      if (!write_buffers_.empty() && write_buffers_.size() + 1 + f.segments.size() > max_buffers) break;
      write_buffers_.emplace_back(f.head.data(), f.head.size());
      for (std::size_t i = 0; i + 1 < f.segments.size(); ++i) {
        if (f.segments[i].size()) write_buffers_.emplace_back(f.segments[i].data(), f.segments[i].size());
      }
      f.started = true;
    }
    if (filled > f.sent) {
      write_buffers_.emplace_back(f.segments.back().data() + f.sent, filled - f.sent);
      f.sent = filled;
    }
    if (!f.complete() || f.sent < filled) break;  // the rest once it is filled
    ++finishing_;
  }
  if (write_buffers_.empty()) return;  // nothing filled yet: produce_step calls again
  writing_ = true;
  auto written = [self = shared_from_this()](std::error_code ec, std::size_t bytes) {
    self->writing_ = false;
    if (ec) {
      self->close(fmt::format("write failed: {}", ec.message()));
      return;
    }
    if (auto* traffic = self->traffic_) {
      traffic->frames_sent.inc(self->finishing_);
      traffic->bytes_sent.inc(bytes);
    }
    const auto written_end = self->write_queue_.begin() + static_cast<std::ptrdiff_t>(self->finishing_);
    std::uint64_t held = 0;
    for (auto it = self->write_queue_.begin(); it != written_end; ++it) held += it->held;
    self->write_queue_.erase(self->write_queue_.begin(), written_end);
    self->finishing_ = 0;
    self->release(held);
    if (self->write_queue_.empty() && self->close_when_flushed_) {
      self->close(*self->close_when_flushed_);
    } else if (!self->closed_) {
      self->write_next();
    }
  };
  // As much per system call as the socket takes (up to 64 buffers): asio's default completion
  // condition writes 64 KiB per operation, each completing through the scheduler (a sendmsg, an
  // epoll_wait and a handler per 64 KiB); one non-blocking sendmsg of a whole 3 MB reply costs the
  // sender ~25% less CPU on loopback (docs/design.md, "Writes in one call, reads in 64 KiB
  // steps"). Over TLS each operation still writes one record (~16 KiB): the condition changes
  // nothing there.
  const auto whole = [](const std::error_code& error, std::size_t) -> std::size_t {
    return error ? 0 : std::numeric_limits<std::size_t>::max();
  };
  if (tls_) {
    asio::async_write(*tls_, write_buffers_, whole, std::move(written));
  } else {
    asio::async_write(socket_, write_buffers_, whole, std::move(written));
  }
}

void connection::close_after_flush(const std::string& reason) {
  if (write_queue_.empty()) {
    close(reason);
  } else {
    close_when_flushed_ = reason;
  }
}

void connection::start_heartbeat(std::chrono::milliseconds interval, std::chrono::milliseconds timeout) {
  if (closed_ || heartbeat_timer_ || timeout.count() <= 0 || interval.count() <= 0) return;
  heartbeat_timer_.emplace(socket_.get_executor());
  asio::co_spawn(socket_.get_executor(), heartbeat_loop(shared_from_this(), interval, timeout), asio::detached);
}

asio::awaitable<void> connection::heartbeat_loop(std::shared_ptr<connection> self, std::chrono::milliseconds interval,
                                                 std::chrono::milliseconds timeout) {
  using clock = std::chrono::steady_clock;
  std::optional<clock::time_point> ping_sent;
  while (!self->closed_) {
    const auto scheduled = clock::now() + interval;
    self->heartbeat_timer_->expires_at(scheduled);
    co_await self->heartbeat_timer_->async_wait(asio::experimental::as_tuple(asio::use_awaitable));
    if (self->closed_) break;
    const auto now = clock::now();
    // Woken late: this side's executor was busy, and replies may sit unread. Start over.
    if (now - scheduled > interval) ping_sent.reset();
    if (ping_sent && self->last_received_ >= *ping_sent) ping_sent.reset();  // answered, or other traffic
    if (ping_sent && now - *ping_sent >= timeout) {
      self->close(fmt::format("no reply from {} for {} ms (heartbeat timeout {} ms): the task is hung or unreachable",
                              self->peer_, std::chrono::duration_cast<std::chrono::milliseconds>(now - *ping_sent).count(),
                              timeout.count()));
      break;
    }
    // Whoever wants the replies gets one every interval; otherwise any frame tells the peer lives.
    if (!ping_sent && (self->on_heartbeat_reply_ || now - self->last_received_ >= interval)) {
      frame ping;
      ping.message.mutable_request()->mutable_heartbeat();
      self->async_call(std::move(ping), [weak = std::weak_ptr<connection>(self)](std::error_code ec, frame reply) {
        const auto c = weak.lock();
        if (ec || !c || c->closed_ || !c->on_heartbeat_reply_) return;
        if (reply.message.response().status().code() == 0) c->on_heartbeat_reply_(reply);
      });
      ping_sent = now;
    }
  }
}

void connection::close(const std::string& reason) {
  if (closed_) return;
  closed_ = true;
  close_reason_ = reason;
  if (heartbeat_timer_) heartbeat_timer_->cancel();
  if (stall_timer_) stall_timer_->cancel();
  if (auto room = room_) room->set();
  log::debug("connection to {} closed: {}", peer_, reason);
  // Producers let go of what they fill from (a ps's variable) now: their frames will not be sent.
  for (auto& f : write_queue_) f.produce_last = nullptr;
  std::error_code ignored;
  socket_.shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
  socket_.close(ignored);
  auto pending = std::move(pending_);
  pending_.clear();
  for (auto& [id, call] : pending) call.handler(make_error_code(errc::unavailable), frame{});
  if (auto on_close = std::move(on_close_)) on_close(reason);
  on_request_ = nullptr;  // breaks the cycle handler -> service -> connection
  on_heartbeat_reply_ = nullptr;
}

}  // namespace pscoro::wire

// Large buffers kept for reuse: a ps gives back the storage an assign replaced, the request
// segments it is done with and its large replies once written, and takes them for the next
// request's segments (its connections receive into them), replies and copies.
// A steady stream of large assigns or updates then allocates nothing and frees nothing: no fresh
// pages to fault in, no munmap per operation. Buffers nothing has taken for a while go back to the
// system (release_idle), so a burst of large requests does not leave the process holding its memory.
// Single-threaded: it lives on the ps's executor.
#pragma once

#include <pscoro/tensor.hpp>

#include <chrono>
#include <cstdint>
#include <deque>
#include <utility>

namespace pscoro::wire {

class buffer_pool {
 public:
  using clock = std::chrono::steady_clock;

  /// Keeps buffers of at least `min_bytes`, at most `max_buffers` of them and `max_bytes` in all
  /// (the oldest go first).
  buffer_pool(std::uint64_t min_bytes, std::size_t max_buffers, std::uint64_t max_bytes) noexcept
      : min_bytes_(min_bytes), max_buffers_(max_buffers), max_bytes_(max_bytes) {}

  /// A kept buffer of exactly `size` bytes (its contents are stale), or an empty one.
  byte_buffer take(std::uint64_t size) {
    if (size < min_bytes_) return {};
    for (auto it = kept_.rbegin(); it != kept_.rend(); ++it) {
      if (it->buffer.size() != size) continue;
      byte_buffer out = std::move(it->buffer);
      kept_.erase(std::next(it).base());
      bytes_ -= size;
      ++reused_;
      return out;
    }
    return {};
  }

  /// Keeps `buffer` (as of `now`) if nothing else holds its bytes (a reply being written, a tensor
  /// in use), it is large enough and it fits; otherwise it is just released (a moved-from one too).
  void give(byte_buffer buffer, clock::time_point now = clock::now()) {
    const std::uint64_t size = buffer.size();
    if (!buffer.data() || !buffer.unique() || size < min_bytes_ || size > max_bytes_ || max_buffers_ == 0) return;
    while (!kept_.empty() && (kept_.size() >= max_buffers_ || bytes_ + size > max_bytes_)) {
      bytes_ -= kept_.front().buffer.size();
      kept_.pop_front();
    }
    kept_.push_back(kept{std::move(buffer), now});
    bytes_ += size;
  }

  /// Releases the buffers kept for longer than `idle` as of `now` (nothing has taken them since
  /// they were given). Returns the bytes released.
  std::uint64_t release_idle(clock::duration idle, clock::time_point now = clock::now()) noexcept {
    std::uint64_t released = 0;
    // Given in order, and take() only removes: the oldest is always in front.
    while (!kept_.empty() && now - kept_.front().since > idle) {
      released += kept_.front().buffer.size();
      kept_.pop_front();
    }
    bytes_ -= released;
    return released;
  }

  /// Releases every kept buffer.
  void clear() noexcept {
    kept_.clear();
    bytes_ = 0;
  }

  std::size_t size() const noexcept { return kept_.size(); }
  /// Bytes kept.
  std::uint64_t bytes() const noexcept { return bytes_; }
  /// How many take() calls were served from the pool.
  std::uint64_t reused() const noexcept { return reused_; }

 private:
  struct kept {
    byte_buffer buffer;
    clock::time_point since;  // when it was given
  };
  std::uint64_t min_bytes_;
  std::size_t max_buffers_;
  std::uint64_t max_bytes_;
  std::deque<kept> kept_;
  std::uint64_t bytes_ = 0;
  std::uint64_t reused_ = 0;
};

}  // namespace pscoro::wire

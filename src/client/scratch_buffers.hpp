// Large buffers of row operations, kept by the calling thread and reused (docs/design.md, "Lookups
// and scatters without fresh buffers"): a lookup's per-shard id lists and reply rows, a scatter's
// per-shard ids and rows. Fresh buffers of a few MiB cost a page fault per 4 KiB each time (and
// glibc trims them back to the kernel when they are freed), about half of a 100k-id lookup's time.
#pragma once

#include <pscoro/tensor.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <vector>

namespace pscoro::client {

/// One owner's buffers. A buffer is handed out as a slice that shares it; it is free again once no
/// slice lives (nothing else holds it: no frame being written, no reply), so a buffer is never
/// reused under a transfer. At most max_buffers and max_bytes are kept; larger or further ones are
/// allocated and freed. What one huge operation needed is not kept for the small ones after it: a
/// free buffer that no take() has used for idle_release goes at the next take(), and one over 4
/// times the size asked (past 1 MiB) serves no take, so it goes idle.
class scratch_cache {
 public:
  using clock = std::chrono::steady_clock;

  static constexpr std::size_t max_buffers = 8;
  static constexpr std::size_t max_bytes = std::size_t{256} << 20;
  /// As a ps's pooled buffers (server_options::ps_idle_buffers_release): training steps take them
  /// far more often.
  static constexpr clock::duration idle_release = std::chrono::seconds(10);

  /// `size` bytes (uninitialised), from a free buffer when one is large enough, as of `now`.
  byte_buffer take(std::size_t size, clock::time_point now) {
    if (size == 0) return {};
    kept* best = nullptr;
    for (auto& k : kept_) {
      const std::size_t have = k.buffer.size();
      const bool fits = have >= size && (have / 4 <= size || have <= (std::size_t{1} << 20));
      if (k.buffer.unique() && fits && (!best || have < best->buffer.size())) best = &k;
    }
    // Chosen before the idle ones go: a thread whose operations come more than idle_release apart
    // reuses its buffer rather than freeing it and allocating another of the same size.
    byte_buffer out;
    if (best) {
      best->last_taken = now;
      out = best->buffer.slice(0, size);
    }
    std::erase_if(kept_, [now](const kept& k) { return k.buffer.unique() && now - k.last_taken > idle_release; });
    if (out.data()) return out;
    byte_buffer fresh(size);
    if (size > max_bytes) return fresh;
    std::size_t held = bytes();
    // Room by dropping free buffers, smallest first, when needed.
    while (kept_.size() >= max_buffers || held + size > max_bytes) {
      auto victim = kept_.end();
      for (auto it = kept_.begin(); it != kept_.end(); ++it) {
        if (it->buffer.unique() && (victim == kept_.end() || it->buffer.size() < victim->buffer.size())) victim = it;
      }
      if (victim == kept_.end()) return fresh;  // all in use: not kept
      held -= victim->buffer.size();
      kept_.erase(victim);
    }
    kept_.push_back(kept{fresh, now});
    return fresh.slice(0, size);
  }

  /// Buffers kept, and their bytes (those in use included).
  std::size_t size() const noexcept { return kept_.size(); }
  std::size_t bytes() const noexcept {
    std::size_t held = 0;
    for (const auto& k : kept_) held += k.buffer.size();
    return held;
  }

 private:
  struct kept {
    byte_buffer buffer;
    clock::time_point last_taken;
  };
  std::vector<kept> kept_;
};

/// The calling thread's scratch_cache: the caller's executor is one thread (chief, workers), so the
/// thread is the owner that sees every call; handles are cheap copies used from many coroutines.
struct scratch_buffers {
  static constexpr std::size_t max_bytes = scratch_cache::max_bytes;  // kept per thread

  static byte_buffer take(std::size_t size) { return local().take(size, scratch_cache::clock::now()); }

  static scratch_cache& local() {
    thread_local scratch_cache cache;
    return cache;
  }
};

}  // namespace pscoro::client

// The buffers a thread keeps for its lookups and scatters (client::scratch_cache): reused while
// free, never while a slice lives, and not kept for ever after one huge operation.
#include "client/scratch_buffers.hpp"

#include <doctest/doctest.h>

using namespace pscoro;
using client::scratch_cache;
using namespace std::chrono_literals;

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;
const auto t0 = scratch_cache::clock::time_point{} + 1h;

}  // namespace

TEST_CASE("a free buffer is taken again; one whose slice is still held is not") {
  scratch_cache cache;
  const std::byte* first = nullptr;
  {
    const byte_buffer a = cache.take(3 * MiB, t0);
    first = a.data();
    const byte_buffer b = cache.take(3 * MiB, t0);  // `a` still lives: another buffer
    CHECK(b.data() != first);
    CHECK(cache.size() == 2);
  }
  CHECK(cache.take(3 * MiB, t0).data() == first);
  CHECK(cache.take(2 * MiB, t0).data() != nullptr);  // smaller: a kept one of 3 MiB serves it
  CHECK(cache.size() == 2);
  CHECK(cache.take(0, t0).data() == nullptr);
  // Taken again an hour later: the same buffer, not freed as idle first and allocated anew.
  CHECK(cache.take(3 * MiB, t0 + 1h).data() == first);
}

TEST_CASE("a buffer over 4 times the size asked serves no take, goes idle and is dropped after idle_release") {
  scratch_cache cache;
  const std::byte* huge = cache.take(64 * MiB, t0).data();
  // A small take after the huge one: a buffer of its own, not a slice of the huge one.
  const std::byte* small = cache.take(2 * MiB, t0 + 1s).data();
  CHECK(small != huge);
  CHECK(cache.size() == 2);
  CHECK(cache.bytes() == 66 * MiB);
  // Up to 4 times is fine.
  CHECK(cache.take(16 * MiB, t0 + 2s).data() == huge);  // taken again at t0 + 2 s
  CHECK(cache.take(2 * MiB, t0 + 11s).data() == small);
  CHECK(cache.size() == 2);  // the huge one was taken 9 s ago
  CHECK(cache.take(2 * MiB, t0 + 12500ms).data() == small);
  CHECK(cache.size() == 1);  // now idle for more than 10 s: released
  CHECK(cache.bytes() == 2 * MiB);
}

TEST_CASE("buffers of 1 MiB or less serve any smaller take; a buffer in use is never dropped, however old") {
  scratch_cache cache;
  const std::byte* one = cache.take(MiB, t0).data();
  CHECK(cache.take(16, t0).data() == one);
  const byte_buffer held = cache.take(8 * MiB, t0);
  CHECK(cache.take(64, t0 + 1h).data() == one);  // idle an hour, but it serves the take
  CHECK(cache.bytes() == 9 * MiB);                // (not freed and a 64-byte one made instead)
  CHECK(cache.take(2 * MiB, t0 + 2h).size() == 2 * MiB);  // the 1 MiB one, idle again, goes
  CHECK(cache.size() == 2);  // the held one stays
  CHECK(cache.bytes() == 10 * MiB);
}

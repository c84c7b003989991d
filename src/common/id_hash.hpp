// Where an id of a dynamic embedding table goes: a 64-bit mix of its bits (murmur3's fmix64: every
// input bit changes every output bit with probability 1/2, so strided, prefixed or negative ids
// spread evenly), its bucket from the mix's high half, its place within the bucket's map from the
// low half. The client routes ids by it and the ps checks them by it: one function for both.
#pragma once

#include <pscoro/value.hpp>

#include <cstddef>
#include <cstdint>

namespace pscoro::common {

constexpr std::uint64_t mix_id(std::int64_t id) noexcept {
  auto z = static_cast<std::uint64_t>(id);
  z ^= z >> 33;
  z *= 0xff51afd7ed558ccdULL;
  z ^= z >> 33;
  z *= 0xc4ceb9fe1a85ec53ULL;
  z ^= z >> 33;
  return z;
}

/// The bucket of an id whose mix is `mixed`, among `buckets` (Lemire's multiply-shift: no division).
constexpr std::uint32_t bucket_of_mix(std::uint64_t mixed, std::uint32_t buckets) noexcept {
  return static_cast<std::uint32_t>(((mixed >> 32) * buckets) >> 32);
}

constexpr std::uint32_t bucket_of(std::int64_t id, std::uint32_t buckets) noexcept {
  return bucket_of_mix(mix_id(id), buckets);
}

/// The index in table.ps_tasks of the ps that holds `id`'s bucket: bucket b is on ps_tasks[b % size].
inline std::size_t ps_index_of(std::int64_t id, const hash_table_ref& table) {
  return bucket_of(id, table.buckets) % table.ps_tasks.size();
}

}  // namespace pscoro::common

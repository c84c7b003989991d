// What a dynamic embedding table is made of: keyed by any int64 id, a row of `dim` values made on
// first sight, ids admitted by a policy and forgotten by another.
//
//   pscoro::hash_table_options options{
//       .dim = 16,
//       .initializer = pscoro::initializers::random_normal{.stddev = 0.01},  // f(seed, table, id)
//       .admission = pscoro::admission::min_count{.count = 2},
//       .eviction = pscoro::eviction::ttl{.max_idle = 100'000},
//   };
//
// Placement: an id goes to one of `buckets` virtual buckets by a 64-bit mix of its bits (strided or
// prefixed ids spread evenly), and buckets go to the parameter servers round robin. The bucket
// count is the table's for life: a checkpoint restores onto any number of ps.
#pragma once

#include <pscoro/config.hpp>

#include <pscoro/initializers.hpp>

#include <cstddef>
#include <cstdint>
#include <variant>

namespace pscoro {
namespace admission {

/// Every id gets a row the first time a lookup that may insert names it.
struct always {};
/// An id gets a row once lookups that may insert have named it `count` times (each request counts
/// once). Sightings are counted in a counting filter of `counters` one-byte counters per ps (three
/// per id, the smallest taken, saturating at 255): a few bytes per candidate, never a row. Ids that
/// share all three counters with others are admitted early; the filter never forgets.
struct min_count {
  std::uint32_t count = 2;
  std::size_t counters = std::size_t{1} << 22;
};
/// Each sighting admits an id not yet held with probability `p` (a stream seeded with `seed`).
struct probability {
  double p = 0.1;
  std::uint64_t seed = 0;
};

}  // namespace admission

using admission_policy = std::variant<admission::always, admission::min_count, admission::probability>;

namespace eviction {

/// Rows are kept until the table is full (then a lookup that would insert fails with
/// errc::resource_exhausted naming the table, the ps and its capacity, and inserts nothing).
struct none {};
/// A row not named for more than `max_idle` ticks of the table's clock (advance_clock) is dropped
/// when the clock moves past it.
struct ttl {
  std::uint64_t max_idle = 100'000;
};
/// At `rows_per_ps` rows on a ps, each new row replaces the least recently named of a sample of
/// held rows (sampled LRU: 8 rows of the new row's bucket).
struct capacity {
  std::uint64_t rows_per_ps = std::uint64_t{1} << 24;
};

}  // namespace eviction

using eviction_policy = std::variant<eviction::none, eviction::ttl, eviction::capacity>;

struct hash_table_options {
  /// Values per row (the table's row width).
  std::size_t dim = 0;
  /// The value of a new row: a function of the seed, the table's name and the id only (the same
  /// row whatever the ps count, the order ids are first seen, or an eviction in between): row `id`
  /// of a sharded variable of the same name and initializer, for ids in its range.
  /// glorot_uniform is refused: a table has no row count to take fans from.
  pscoro::initializer initializer = initializers::random_uniform{};
  admission_policy admission = admission::always{};
  eviction_policy eviction = eviction::none{};
  /// What a lookup returns for an id not admitted (every element); its gradients are dropped.
  double default_value = 0;
  /// Rows one ps may hold at most (with eviction::none or ttl; eviction::capacity sets its own).
  std::uint64_t max_rows_per_ps = std::uint64_t{1} << 26;
  /// Virtual buckets, at most 2^20: more than there will ever be ps, and a bucket moves whole.
  std::uint32_t buckets = 4096;
};

}  // namespace pscoro

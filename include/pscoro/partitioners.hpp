// Partitioners: into how many shards a variable is split along axis 0, computed exactly as TF does,
// and the "div" arithmetic that places rows and ids in shards.
//
//   pscoro::parameter_server_strategy strategy(executor, resolver, pscoro::min_size_partitioner{1 << 20, 2});
//   pscoro::fixed_shards_partitioner{2}(shape, pscoro::dtype::float32);   // 2 (clamped to shape[0])
//
// A partitioner is any copyable callable with the call shape `std::size_t(std::span<const
// std::size_t> shape, pscoro::dtype)`; the strategy clamps its answer to the row count and never
// splits a rank-0 variable.
#pragma once

#include <pscoro/config.hpp>

#include <pscoro/dtype.hpp>
#include <pscoro/error.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace pscoro {

/// The type-erased form the strategy keeps.
using variable_partitioner = std::function<std::size_t(std::span<const std::size_t> shape, dtype type)>;

namespace detail {

inline std::size_t require_positive(std::int64_t value, const char* argument, const char* separator = ": ") {
  // TF's wording (partitioners.py), so a message found in a TF log means the same here.
  if (value < 1) {
    throw error(errc::invalid_argument,
                std::string("Argument `") + argument + "` must be positive. Received" + separator + std::to_string(value));
  }
  return static_cast<std::size_t>(value);
}

inline std::size_t count_elements(std::span<const std::size_t> shape) noexcept {
  std::size_t n = 1;
  for (const auto d : shape) n *= d;
  return n;
}

}  // namespace detail

/// TF's FixedShardsPartitioner: `num_shards` shards, at most one per row.
class fixed_shards_partitioner {
 public:
  /// Throws errc::invalid_argument when `num_shards` < 1 (TF lets 0 through and fails later).
  explicit fixed_shards_partitioner(std::int64_t num_shards)
      : num_shards_(detail::require_positive(num_shards, "num_shards")) {}

  std::size_t operator()(std::span<const std::size_t> shape, dtype) const noexcept {
    if (shape.empty()) return 1;
    return std::min(num_shards_, shape[0]);
  }
  std::size_t num_shards() const noexcept { return num_shards_; }

 private:
  std::size_t num_shards_;
};

/// TF's MinSizePartitioner: as many shards as keep each at least `min_shard_bytes`, at most
/// `max_shards`.
class min_size_partitioner {
 public:
  /// Throws errc::invalid_argument (TF's message) when an argument is < 1.
  explicit min_size_partitioner(std::int64_t min_shard_bytes = 256 << 10, std::int64_t max_shards = 1)
      : min_shard_bytes_(detail::require_positive(min_shard_bytes, "min_shard_bytes")),
        max_shards_(detail::require_positive(max_shards, "max_shards")) {}

  std::size_t operator()(std::span<const std::size_t> shape, dtype type) const noexcept {
    if (shape.empty()) return 1;
    const std::size_t total = detail::count_elements(shape) * size_of(type);
    const std::size_t parts = (total + min_shard_bytes_ - 1) / min_shard_bytes_;  // ceil
    return std::max<std::size_t>(1, std::min({shape[0], max_shards_, parts}));
  }
  std::size_t min_shard_bytes() const noexcept { return min_shard_bytes_; }
  std::size_t max_shards() const noexcept { return max_shards_; }

 private:
  std::size_t min_shard_bytes_;
  std::size_t max_shards_;
};

/// TF's MaxSizePartitioner: as few shards as keep each at most `max_shard_bytes` (a single row
/// larger than that gets a shard of its own), at most `max_shards` (0: no limit; it wins over
/// `max_shard_bytes`).
class max_size_partitioner {
 public:
  /// Throws errc::invalid_argument (TF's message) when `max_shard_bytes` < 1 or `max_shards` < 0.
  explicit max_size_partitioner(std::int64_t max_shard_bytes, std::int64_t max_shards = 0)
      : max_shard_bytes_(detail::require_positive(max_shard_bytes, "max_shard_bytes", " ")),
        max_shards_(max_shards == 0 ? 0 : detail::require_positive(max_shards, "max_shards", " ")) {}

  std::size_t operator()(std::span<const std::size_t> shape, dtype type) const noexcept {
    if (shape.empty() || shape[0] == 0) return 1;
    const std::size_t bytes_per_slice = detail::count_elements(shape.subspan(1)) * size_of(type);
    if (bytes_per_slice == 0) return 1;
    const std::size_t slices_per_shard = std::max<std::size_t>(1, max_shard_bytes_ / bytes_per_slice);
    std::size_t shards = (shape[0] + slices_per_shard - 1) / slices_per_shard;
    if (max_shards_ != 0) shards = std::min(max_shards_, shards);
    return shards;
  }
  std::size_t max_shard_bytes() const noexcept { return max_shard_bytes_; }
  std::size_t max_shards() const noexcept { return max_shards_; }

 private:
  std::size_t max_shard_bytes_;
  std::size_t max_shards_;
};

/// The `shards + 1` row offsets of TF's "div" split of `rows` rows: the first `rows % shards`
/// shards get one row more. `div_offsets(13, 5) == {0, 3, 6, 9, 11, 13}`. `shards` must be >= 1.
inline std::vector<std::size_t> div_offsets(std::size_t rows, std::size_t shards) {
  if (shards == 0) throw error(errc::invalid_argument, "a variable cannot be split into 0 shards");
  std::vector<std::size_t> offsets(shards + 1);
  const std::size_t base = rows / shards;
  const std::size_t extra = rows % shards;
  for (std::size_t i = 0; i < shards; ++i) offsets[i + 1] = offsets[i] + base + (i < extra ? 1 : 0);
  return offsets;
}

/// Where a row lives: the shard and the row within it.
struct shard_location {
  std::size_t shard;
  std::size_t row;
  friend bool operator==(const shard_location&, const shard_location&) = default;
};

/// TF's "div" id -> (shard, local row) mapping for `rows` rows in `shards` shards (the layout of
/// div_offsets). `id` must be < `rows`; the caller checks the range, so this cannot fail.
constexpr shard_location div_locate(std::size_t id, std::size_t rows, std::size_t shards) noexcept {
  const std::size_t base = rows / shards;
  const std::size_t extra = rows % shards;
  // TF: p = max(id // (base + 1), (id - extra) // base); this is the same without signed
  // arithmetic or a division by zero when base == 0.
  const std::size_t long_rows = extra * (base + 1);
  if (id < long_rows) return {id / (base + 1), id % (base + 1)};
  return {extra + (id - long_rows) / base, (id - long_rows) % base};
}

}  // namespace pscoro

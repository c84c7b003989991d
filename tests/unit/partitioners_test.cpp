// Partitioner arithmetic against TF's published examples, and the "div" layout of rows and ids.
#include "test_support.hpp"

#include <pscoro/partitioners.hpp>

#include <array>

using namespace pscoro;

namespace {
template <class P, std::size_t N>
std::size_t shards(const P& p, const std::array<std::size_t, N>& shape, dtype type = dtype::float32) {
  return p(std::span<const std::size_t>(shape), type);
}
}  // namespace

TEST_CASE("fixed_shards_partitioner gives its count, at most one shard per row") {
  CHECK(shards(fixed_shards_partitioner{2}, std::array<std::size_t, 2>{10, 3}) == 2);  // TF's docstring
  CHECK(shards(fixed_shards_partitioner{5}, std::array<std::size_t, 2>{10, 10}) == 5);
  CHECK(shards(fixed_shards_partitioner{4}, std::array<std::size_t, 1>{20}, dtype::int64) == 4);
  CHECK(shards(fixed_shards_partitioner{8}, std::array<std::size_t, 2>{3, 100}) == 3);
  CHECK(shards(fixed_shards_partitioner{8}, std::array<std::size_t, 0>{}) == 1);
  CHECK_THROWS_WITH_AS(fixed_shards_partitioner{0}, "Argument `num_shards` must be positive. Received: 0", error);
}

TEST_CASE("min_size_partitioner keeps shards at least min_shard_bytes, up to max_shards") {
  // TF's docstring: MinSizePartitioner(min_shard_bytes=4, max_shards=2)(TensorShape([6, 1]), float32) == [2, 1].
  CHECK(shards(min_size_partitioner{4, 2}, std::array<std::size_t, 2>{6, 1}) == 2);
  // The defaults (256 KiB, 1 shard) never split.
  CHECK(shards(min_size_partitioner{}, std::array<std::size_t, 2>{1000000, 16}) == 1);
  // 1,000,000 x 16 floats = 64,000,000 bytes; 1 MiB shards -> ceil(61.04) = 62, capped by max_shards.
  CHECK(shards(min_size_partitioner{1 << 20, 100}, std::array<std::size_t, 2>{1000000, 16}) == 62);
  CHECK(shards(min_size_partitioner{1 << 20, 2}, std::array<std::size_t, 2>{1000000, 16}) == 2);
  // Ceil, as TF: 10 float64 = 80 bytes over a 24-byte minimum -> ceil(3.33) = 4 shards of 20 bytes.
  CHECK(shards(min_size_partitioner{24, 10}, std::array<std::size_t, 1>{10}, dtype::float64) == 4);
  // Never more shards than rows, never fewer than one.
  CHECK(shards(min_size_partitioner{1, 100}, std::array<std::size_t, 2>{3, 1000}) == 3);
  CHECK(shards(min_size_partitioner{1, 100}, std::array<std::size_t, 2>{0, 8}) == 1);
  CHECK_THROWS_WITH_AS(min_size_partitioner(0), "Argument `min_shard_bytes` must be positive. Received: 0", error);
  CHECK_THROWS_WITH_AS(min_size_partitioner(4, -1), "Argument `max_shards` must be positive. Received: -1", error);
}

TEST_CASE("max_size_partitioner keeps shards at most max_shard_bytes unless max_shards wins") {
  // TF's docstring: MaxSizePartitioner(max_shard_bytes=4) on [6, 1] float32 -> [6, 1];
  // with max_shards=2 -> [2, 1]; with max_shard_bytes=1024 -> [1, 1].
  CHECK(shards(max_size_partitioner{4}, std::array<std::size_t, 2>{6, 1}) == 6);
  CHECK(shards(max_size_partitioner{4, 2}, std::array<std::size_t, 2>{6, 1}) == 2);
  CHECK(shards(max_size_partitioner{1024}, std::array<std::size_t, 2>{6, 1}) == 1);
  // Floor then ceil: 100 rows of 12 bytes, 50-byte shards -> 4 rows per shard -> 25 shards.
  CHECK(shards(max_size_partitioner{50}, std::array<std::size_t, 2>{100, 3}) == 25);
  // A row larger than max_shard_bytes gets a shard of its own.
  CHECK(shards(max_size_partitioner{8}, std::array<std::size_t, 2>{7, 100}) == 7);
  CHECK(shards(max_size_partitioner{8, 0}, std::array<std::size_t, 2>{7, 100}) == 7);  // 0: no limit
  CHECK_THROWS_WITH_AS(max_size_partitioner(0), "Argument `max_shard_bytes` must be positive. Received 0", error);
  CHECK_THROWS_WITH_AS(max_size_partitioner(4, -2), "Argument `max_shards` must be positive. Received -2", error);
}

TEST_CASE("a partitioner converts to the strategy's variable_partitioner") {
  const variable_partitioner p = min_size_partitioner{4, 2};
  const std::array<std::size_t, 2> shape{6, 1};
  CHECK(p(shape, dtype::float32) == 2);
  // A user-defined partitioner is any callable of the same shape.
  const variable_partitioner custom = [](std::span<const std::size_t> s, dtype) { return s.empty() ? 1 : s[0]; };
  CHECK(custom(shape, dtype::float32) == 6);
}

TEST_CASE("div_offsets gives the first rows % shards shards one row more") {
  CHECK(div_offsets(13, 5) == std::vector<std::size_t>{0, 3, 6, 9, 11, 13});  // TF's example
  CHECK(div_offsets(10, 2) == std::vector<std::size_t>{0, 5, 10});
  CHECK(div_offsets(7, 1) == std::vector<std::size_t>{0, 7});
  CHECK(div_offsets(3, 3) == std::vector<std::size_t>{0, 1, 2, 3});
  CHECK_THROWS_AS(div_offsets(3, 0), error);
}

TEST_CASE("div_locate agrees with div_offsets for every id") {
  // TF's example: N=13, P=5 -> ids [[0,1,2],[3,4,5],[6,7,8],[9,10],[11,12]].
  CHECK(div_locate(0, 13, 5) == shard_location{0, 0});
  CHECK(div_locate(8, 13, 5) == shard_location{2, 2});
  CHECK(div_locate(9, 13, 5) == shard_location{3, 0});
  CHECK(div_locate(12, 13, 5) == shard_location{4, 1});
  for (std::size_t rows = 1; rows <= 40; ++rows) {
    for (std::size_t parts = 1; parts <= rows; ++parts) {
      const auto offsets = div_offsets(rows, parts);
      for (std::size_t id = 0; id < rows; ++id) {
        const auto where = div_locate(id, rows, parts);
        REQUIRE(where.shard < parts);
        CHECK(offsets[where.shard] + where.row == id);
        CHECK(id < offsets[where.shard + 1]);
      }
    }
  }
}

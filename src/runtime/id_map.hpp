// A flat open-addressing map from row ids to dense indices 0, 1, 2... in first-seen order, for
// grouping the ids of one request (lookups ask each row once; sparse optimizer steps sum a row's
// gradients). Several times faster than std::unordered_map at a million ids: one allocation, no
// nodes, linear probing.
#pragma once

#include <bit>
#include <cstdint>
#include <vector>

namespace pscoro::runtime {

class id_map {
 public:
  /// Room for `expected` distinct ids without growing.
  explicit id_map(std::size_t expected) {
    const std::size_t capacity = std::bit_ceil(std::max<std::size_t>(16, expected * 2));
    keys_.assign(capacity, empty);
    values_.resize(capacity);
    mask_ = capacity - 1;
  }

  /// The index of `id` (ids must be >= 0); a new id gets the next index.
  std::uint32_t index_of(std::int64_t id) {
    std::size_t slot = hash(id) & mask_;
    while (true) {
      if (keys_[slot] == id) return values_[slot];
      if (keys_[slot] == empty) {
        if (2 * (size_ + 1) > keys_.size()) {
          grow();
          return index_of(id);
        }
        keys_[slot] = id;
        values_[slot] = static_cast<std::uint32_t>(size_);
        return static_cast<std::uint32_t>(size_++);
      }
      slot = (slot + 1) & mask_;
    }
  }

  std::size_t size() const noexcept { return size_; }

 private:
  static constexpr std::int64_t empty = -1;

  static std::size_t hash(std::int64_t id) noexcept {
    auto z = static_cast<std::uint64_t>(id) * 0x9e3779b97f4a7c15ULL;
    return static_cast<std::size_t>(z ^ (z >> 32));
  }

  void grow() {
    std::vector<std::int64_t> keys = std::move(keys_);
    std::vector<std::uint32_t> values = std::move(values_);
    keys_.assign(keys.size() * 2, empty);
    values_.assign(keys.size() * 2, 0);
    mask_ = keys_.size() - 1;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (keys[i] == empty) continue;
      std::size_t slot = hash(keys[i]) & mask_;
      while (keys_[slot] != empty) slot = (slot + 1) & mask_;
      keys_[slot] = keys[i];
      values_[slot] = values[i];
    }
  }

  std::vector<std::int64_t> keys_;
  std::vector<std::uint32_t> values_;
  std::size_t mask_ = 0;
  std::size_t size_ = 0;
};

}  // namespace pscoro::runtime

// A dense tensor as it crosses process boundaries: element type, shape and bytes.
//
// The bytes are shared, immutable once published, and may live inside a received frame: handing a
// tensor on (to a variable, to a reply) never copies it. Conversion to and from xtensor is in
// <pscoro/xtensor.hpp>.
#pragma once

#include <pscoro/config.hpp>

#include <pscoro/dtype.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace pscoro {

using shape_type = std::vector<std::size_t>;

/// The number of elements of a tensor of shape `shape` (1 for a scalar).
inline std::size_t num_elements(std::span<const std::size_t> shape) noexcept {
  return std::accumulate(shape.begin(), shape.end(), std::size_t{1}, std::multiplies<>{});
}

/// The bytes of a tensor of `type` (valid) and `shape`, or nothing when the product of its non-zero
/// dimensions and the element size does not fit in 64 bits (a shape such as [0, 2^40, 2^40] is
/// refused although it is empty: then no part of an accepted shape, such as a row, can overflow
/// either). A shape from another process passes this before anything is allocated or indexed with
/// it. `checked_size_bytes(dtype::float32, shape_type{1 << 20, 4})` is 16 MiB; with 2^62 rows, nothing.
inline std::optional<std::uint64_t> checked_size_bytes(dtype type, std::span<const std::size_t> shape) noexcept {
  std::uint64_t bytes = size_of(type);
  bool empty = false;
  for (const std::uint64_t dim : shape) {
    if (dim == 0) {
      empty = true;
      continue;
    }
    if (bytes > std::numeric_limits<std::uint64_t>::max() / dim) return std::nullopt;
    bytes *= dim;
  }
  return empty ? 0 : bytes;
}

/// "[784, 10]".
PSCORO_API std::string to_string(std::span<const std::size_t> shape);

/// A byte buffer aligned for every dtype; shared so that frames and variables can hold it.
class PSCORO_API byte_buffer {
 public:
  byte_buffer() = default;
  /// Allocates `size` uninitialised bytes.
  /// `size` uninitialised bytes, aligned to a cache line (64 bytes); 4 MiB or more are advised
  /// transparent huge pages.
  explicit byte_buffer(std::size_t size);

  std::byte* data() const noexcept { return data_.get(); }
  std::size_t size() const noexcept { return size_; }
  /// True when no other byte_buffer shares these bytes (an in-place update is then invisible).
  bool unique() const noexcept { return data_.use_count() <= 1; }

  /// A buffer over `size` bytes at `data` that it does not own: the caller keeps them alive while
  /// any copy of the result lives. Lets a receive land in memory the caller already has.
  static byte_buffer borrow(std::byte* data, std::size_t size) {
    byte_buffer out;
    out.data_ = std::shared_ptr<std::byte[]>(data, [](std::byte*) {});
    out.size_ = size;
    return out;
  }

  /// A buffer over `size` bytes at `data` that keeps `owner` (whatever holds those bytes, e.g. another
  /// framework's tensor) alive while any copy of the result lives: another library's memory sent or
  /// held without a copy. `byte_buffer::share(std::make_shared<torch::Tensor>(t), bytes, size)`.
  static byte_buffer share(std::shared_ptr<const void> owner, std::byte* data, std::size_t size) noexcept {
    byte_buffer out;
    out.data_ = std::shared_ptr<std::byte[]>(std::move(owner), data);
    out.size_ = size;
    return out;
  }

  /// `size` bytes from `offset`, sharing (and keeping alive) this buffer's storage: no copy.
  byte_buffer slice(std::size_t offset, std::size_t size) const noexcept {
    byte_buffer out;
    out.data_ = std::shared_ptr<std::byte[]>(data_, data_.get() + offset);
    out.size_ = size;
    return out;
  }

 private:
  std::shared_ptr<std::byte[]> data_;
  std::size_t size_ = 0;
};

class PSCORO_API tensor {
 public:
  tensor() = default;

  /// A tensor of `type` and `shape` over `bytes`, which must hold exactly its elements.
  tensor(dtype type, shape_type shape, byte_buffer bytes)
      : type_(type), shape_(std::move(shape)), bytes_(std::move(bytes)) {}

  /// A tensor of `type` and `shape` with uninitialised elements.
  static tensor uninitialized(dtype type, shape_type shape) {
    const std::size_t size = num_elements(shape) * size_of(type);
    return {type, std::move(shape), byte_buffer(size)};
  }

  dtype type() const noexcept { return type_; }
  const shape_type& shape() const noexcept { return shape_; }
  std::size_t size() const noexcept { return num_elements(shape_); }
  std::size_t size_bytes() const noexcept { return bytes_.size(); }
  const byte_buffer& bytes() const noexcept { return bytes_; }

  template <class T>
  const T* data() const noexcept {
    return reinterpret_cast<const T*>(bytes_.data());
  }
  template <class T>
  T* mutable_data() noexcept {
    return reinterpret_cast<T*>(bytes_.data());
  }

 private:
  dtype type_ = dtype::float32;
  shape_type shape_;
  byte_buffer bytes_;
};

namespace detail {
/// `values` as a 1-D tensor of their own dtype (a copy).
template <class T>
  requires is_element_type_v<T>
tensor vector_tensor(const std::vector<T>& values) {
  tensor out = tensor::uninitialized(dtype_of<T>, {values.size()});
  if (!values.empty()) std::memcpy(out.template mutable_data<T>(), values.data(), values.size() * sizeof(T));
  return out;
}
}  // namespace detail

}  // namespace pscoro

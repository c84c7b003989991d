#include <pscoro/detail/sharded_io.hpp>

#include <pscoro/detail/parallel.hpp>

#include <fmt/format.h>

#include "runtime/id_map.hpp"
#include "runtime/rows.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <limits>
#include <optional>

namespace pscoro::detail {

namespace {

[[noreturn]] void invalid(std::string message) { throw error(errc::invalid_argument, std::move(message)); }

std::size_t row_elements_of(const shape_type& shape) {
  return shape.empty() ? 1 : num_elements(std::span(shape).subspan(1));
}

// The size of a transparent huge page, if the system has them (0: none, or unknown).
std::size_t huge_page_bytes() {
  static const std::size_t bytes = [] {
    std::ifstream in("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size");
    std::size_t size = 0;
    return in >> size && size > 0 && (size & (size - 1)) == 0 ? size : std::size_t{0};
  }();
  return bytes;
}

// Asks for transparent huge pages under a large array about to be filled for the first time (a
// read's result): the kernel then maps it in a few hundred faults, not one per 4 KiB page (16,384
// for 64 MiB, about half the time a read into a fresh array took beyond the transfer itself), and
// unmaps it as cheaply. Only the whole huge pages inside the array are advised; systems whose THP
// setting is "never" ignore it, and nothing depends on it but speed.
void advise_huge_pages(void* data, std::size_t bytes) {
#ifdef MADV_HUGEPAGE
  const std::size_t huge = huge_page_bytes();
  if (huge == 0 || bytes < 4 * huge) return;
  const auto first = reinterpret_cast<std::uintptr_t>(data);
  const std::uintptr_t begin = (first + huge - 1) & ~(std::uintptr_t{huge} - 1);
  const std::uintptr_t end = (first + bytes) & ~(std::uintptr_t{huge} - 1);
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
#else
  (void)data;
  (void)bytes;
#endif
}

}  // namespace

void check_id(std::int64_t id, std::size_t position, std::size_t rows, const sharded_layout& layout,
              std::string_view operation) {
  if (id < 0 || static_cast<std::uint64_t>(id) >= rows) {
    invalid(fmt::format("{} of '{}': id {} (position {}) is out of range [0, {})", operation, layout.ref.name, id,
                        position, rows));
  }
}

std::size_t sharded_layout::row_elements() const noexcept { return row_elements_of(ref.shape); }

std::shared_ptr<const sharded_layout> make_layout(sharded_variable_ref ref) {
  // TF's checks (ShardedVariable.__init__), then the "div" layout that the id mapping relies on.
  if (ref.shards.empty()) invalid(fmt::format("sharded variable '{}' has no shards", ref.name));
  std::vector<std::size_t> offsets{0};
  for (const auto& shard : ref.shards) {
    if (shard.type != ref.type) {
      invalid(fmt::format("all shards of '{}' must have its dtype {}; '{}' is {}", ref.name, name_of(ref.type),
                          shard.name, name_of(shard.type)));
    }
    if (shard.shape.size() != ref.shape.size() ||
        !std::equal(shard.shape.begin() + (shard.shape.empty() ? 0 : 1), shard.shape.end(),
                    ref.shape.begin() + (ref.shape.empty() ? 0 : 1))) {
      invalid(fmt::format("all shards of '{}' {} must have its shape except for the first axis; '{}' is {}",
                          ref.name, to_string(ref.shape), shard.name, to_string(shard.shape)));
    }
    offsets.push_back(offsets.back() + (shard.shape.empty() ? 1 : shard.shape[0]));
  }
  if (ref.shape.empty()) {
    if (ref.shards.size() != 1) invalid(fmt::format("scalar variable '{}' cannot have several shards", ref.name));
  } else if (offsets.back() != ref.shape[0]) {
    invalid(fmt::format("the shards of '{}' hold {} rows but its shape {} has {}", ref.name, offsets.back(),
                        to_string(ref.shape), ref.shape[0]));
  } else if (ref.shape[0] != 0 && offsets != div_offsets(ref.shape[0], ref.shards.size())) {
    invalid(fmt::format("the shards of '{}' are not TF's \"div\" partition of {} rows into {} shards", ref.name,
                        ref.shape[0], ref.shards.size()));
  }
  return std::make_shared<const sharded_layout>(sharded_layout{std::move(ref), std::move(offsets)});
}

std::shared_ptr<const sharded_layout> single_layout(variable_ref ref) {
  const std::size_t rows = ref.shape.empty() ? 1 : ref.shape[0];
  sharded_variable_ref whole{ref.name, ref.type, ref.shape, {}};
  whole.shards.push_back(std::move(ref));
  return std::make_shared<const sharded_layout>(sharded_layout{std::move(whole), {0, rows}});
}

void check_one_dimensional(const id_list& ids, std::string_view operation) {
  if (ids.shape.size() != 1) {
    // TF's wording (sharded_variable.py).
    invalid(fmt::format("{}: indices must be 1D Tensor for sparse operations. Received shape: {}", operation,
                        to_string(ids.shape)));
  }
}

void check_reply(const variable_ref& shard, const tensor& reply) {
  if (reply.type() != shard.type || reply.shape() != shard.shape) {
    throw error(errc::protocol_error,
                fmt::format("a read of '{}' ({} {}) was answered with {} {}", shard.name, name_of(shard.type),
                            to_string(shard.shape), name_of(reply.type()), to_string(reply.shape())));
  }
}

void check_rows(const sharded_layout& layout, std::size_t n, const tensor& rows, std::string_view operation) {
  const auto& ref = layout.ref;
  if (ref.shape.empty()) invalid(fmt::format("{} of '{}': a scalar variable has no rows", operation, ref.name));
  shape_type expected{n};
  expected.insert(expected.end(), ref.shape.begin() + 1, ref.shape.end());
  if (rows.type() != ref.type || rows.shape() != expected) {
    invalid(fmt::format("{} of '{}': {} ids need {} rows of shape {}, got {} {}", operation, ref.name, n,
                        name_of(ref.type), to_string(expected), name_of(rows.type()), to_string(rows.shape())));
  }
}

std::vector<tensor> split_dense(const sharded_layout& layout, const tensor& value, std::string_view operation) {
  const auto& ref = layout.ref;
  if (value.type() != ref.type || value.shape() != ref.shape) {
    invalid(fmt::format("{} to '{}': the value is {} {} but the variable is {} {}", operation, ref.name,
                        name_of(value.type()), to_string(value.shape()), name_of(ref.type), to_string(ref.shape)));
  }
  if (layout.num_shards() == 1) return {value};
  const std::size_t row_bytes = layout.row_elements() * size_of(ref.type);
  std::vector<tensor> parts;
  parts.reserve(layout.num_shards());
  for (std::size_t i = 0; i < layout.num_shards(); ++i) {
    const std::size_t begin = layout.offsets[i] * row_bytes;
    const std::size_t size = (layout.offsets[i + 1] - layout.offsets[i]) * row_bytes;
    parts.emplace_back(ref.type, ref.shards[i].shape, value.bytes().slice(begin, size));
  }
  return parts;
}

std::vector<shard_rows> split_by_shard(const sharded_layout& layout, const id_list& list, row_source source,
                                       std::string_view operation) {
  check_one_dimensional(list, operation);
  const std::span<const std::int64_t> ids(list.ids);
  const tensor& rows = source.rows;
  check_rows(layout, ids.size(), rows, operation);
  const std::size_t total = layout.rows();
  const std::size_t shards = layout.num_shards();
  for (std::size_t k = 0; k < ids.size(); ++k) check_id(ids[k], k, total, layout, operation);
  const std::size_t row_bytes = layout.row_elements() * size_of(layout.ref.type);
  if (shards == 1) {
    // One shard: the ids and rows go as they are, rows copied only if they are the caller's.
    tensor own = source.owned ? rows : tensor::uninitialized(rows.type(), rows.shape());
    if (!source.owned && rows.size_bytes()) std::memcpy(own.bytes().data(), rows.bytes().data(), rows.size_bytes());
    return {shard_rows{0, vector_tensor(list.ids), std::move(own), {}}};
  }
  std::vector<std::vector<std::int64_t>> local(shards);
  std::vector<std::vector<std::size_t>> positions(shards);
  for (std::size_t k = 0; k < ids.size(); ++k) {
    const auto where = div_locate(static_cast<std::size_t>(ids[k]), total, shards);
    local[where.shard].push_back(static_cast<std::int64_t>(where.row));
    positions[where.shard].push_back(k);
  }
  std::vector<shard_rows> out;
  for (std::size_t s = 0; s < shards; ++s) {
    if (local[s].empty()) continue;
    shard_rows part{s, vector_tensor(local[s]), {}, {}};
    shape_type shape = rows.shape();
    shape[0] = local[s].size();
    part.rows = tensor::uninitialized(rows.type(), std::move(shape));
    std::byte* to = part.rows.bytes().data();
    const std::byte* from = rows.bytes().data();
    runtime::with_row_size(row_bytes, [&](auto size) {
      for (std::size_t j = 0; j < positions[s].size(); ++j) std::memcpy(to + j * size, from + positions[s][j] * size, size);
    });
    out.push_back(std::move(part));
  }
  return out;
}

std::vector<shard_rows> plan_lookup(const sharded_layout& layout, std::span<const std::int64_t> ids,
                                    std::string_view operation) {
  const std::size_t total = layout.rows();
  const std::size_t shards = layout.num_shards();
  if (layout.ref.shape.empty()) invalid(fmt::format("{} of '{}': a scalar variable has no rows", operation, layout.ref.name));
  for (std::size_t k = 0; k < ids.size(); ++k) check_id(ids[k], k, total, layout, operation);
  std::vector<std::vector<std::int64_t>> local(shards);
  std::vector<std::vector<std::pair<std::size_t, std::size_t>>> places(shards);
  // Each (shard, row) is asked for once: skewed ids (the usual case for embeddings) travel once.
  runtime::id_map asked(ids.size());
  std::vector<std::size_t> reply_row;  // by first-seen index: the row of its shard's reply
  for (std::size_t k = 0; k < ids.size(); ++k) {
    const auto where = div_locate(static_cast<std::size_t>(ids[k]), total, shards);
    const std::size_t index = asked.index_of(ids[k]);
    if (index == reply_row.size()) {
      reply_row.push_back(local[where.shard].size());
      local[where.shard].push_back(static_cast<std::int64_t>(where.row));
    }
    places[where.shard].emplace_back(k, reply_row[index]);
  }
  std::vector<shard_rows> out;
  for (std::size_t s = 0; s < shards; ++s) {
    if (local[s].empty()) continue;
    out.push_back(shard_rows{s, vector_tensor(local[s]), {}, std::move(places[s])});
  }
  return out;
}

void place_rows(std::byte* out, const tensor& reply, const shard_rows& plan, std::size_t row_bytes) {
  const std::size_t asked = plan.ids.size();
  if (reply.size_bytes() != asked * row_bytes || reply.shape().empty() || reply.shape()[0] != asked) {
    throw error(errc::protocol_error, fmt::format("a lookup of {} rows was answered with {} {}", asked,
                                                  name_of(reply.type()), to_string(reply.shape())));
  }
  const std::byte* from = reply.bytes().data();
  runtime::with_row_size(row_bytes, [&](auto size) {
    for (const auto& [position, row] : plan.places) std::memcpy(out + position * size, from + row * size, size);
  });
}

std::vector<std::int64_t> slice_rows(std::uint64_t rows, std::optional<std::int64_t> begin,
                                     std::optional<std::int64_t> end, std::int64_t step) {
  if (step == 0) throw error(errc::invalid_argument, "slice step cannot be zero");
  if (rows > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
    throw error(errc::invalid_argument, fmt::format("{} rows are more than a slice can count", rows));
  }
  // Python's slice.indices: bounds clamped to [lower, upper]; a negative bound adds n first.
  const auto n = static_cast<std::int64_t>(rows);
  const std::int64_t lower = step > 0 ? 0 : -1;
  const std::int64_t upper = step > 0 ? n : n - 1;
  const auto clamped = [&](std::optional<std::int64_t> bound, std::int64_t absent) {
    if (!bound) return absent;
    std::int64_t i = *bound;
    if (i < 0) {
      i += n;  // i >= INT64_MIN and 0 <= n: no overflow
      return std::max(i, lower);
    }
    return std::min(i, upper);
  };
  const std::int64_t start = clamped(begin, step > 0 ? lower : upper);
  const std::int64_t stop = clamped(end, step > 0 ? upper : lower);
  // |step| as unsigned: -INT64_MIN does not fit in int64.
  const std::uint64_t magnitude = step > 0 ? static_cast<std::uint64_t>(step) : 0 - static_cast<std::uint64_t>(step);
  std::uint64_t count = 0;
  if (step > 0 && stop > start) count = (static_cast<std::uint64_t>(stop - start) - 1) / magnitude + 1;
  if (step < 0 && start > stop) count = (static_cast<std::uint64_t>(start - stop) - 1) / magnitude + 1;
  std::vector<std::int64_t> out;
  out.reserve(count);
  for (std::uint64_t k = 0; k < count; ++k) {
    const auto offset = static_cast<std::int64_t>(k * magnitude);  // at most |stop - start| <= n + 1
    out.push_back(step > 0 ? start + offset : start - offset);
  }
  return out;
}

// The coroutines of sharded_ops<T>, compiled once per element type (the header declares them and
// says `extern template`).

template <class T>
variable_io& sharded_ops<T>::bound(const io_ptr& io, const sharded_layout& layout) {
  if (!io) throw error(errc::failed_precondition, "variable handle '" + layout.ref.name + "' is not bound");
  return *io;
}

// The shard's bytes are received straight into `out`; a copy is only needed if the transport could
// not use it.
template <class T>
asio::awaitable<void> sharded_ops<T>::read_into(variable_io& io, variable_ref shard, std::byte* out) {
  const std::size_t bytes = num_elements(shard.shape) * sizeof(T);
  const tensor t = co_await io.read(shard, byte_buffer::borrow(out, bytes));
  check_reply(shard, t);
  if (t.size_bytes() && t.bytes().data() != out) std::memcpy(out, t.bytes().data(), t.size_bytes());
}

template <class T>
asio::awaitable<void> sharded_ops<T>::read_to(io_ptr io, layout_ptr layout, xt::xarray<T>& out) {
  auto& channel = bound(io, *layout);
  const auto& shape = layout->ref.shape;
  if (!std::equal(out.shape().begin(), out.shape().end(), shape.begin(), shape.end())) out.resize(shape);
  auto* bytes = reinterpret_cast<std::byte*>(out.data());
  const std::size_t row_bytes = layout->row_elements() * sizeof(T);
  co_await run_all(layout->num_shards(), [&](std::size_t i) {
    return read_into(channel, layout->ref.shards[i], bytes + layout->offsets[i] * row_bytes);
  });
}

template <class T>
asio::awaitable<xt::xarray<T>> sharded_ops<T>::read(io_ptr io, layout_ptr layout) {
  xt::xarray<T> out(layout->ref.shape);
  advise_huge_pages(out.data(), out.size() * sizeof(T));
  co_await read_to(std::move(io), std::move(layout), out);
  co_return out;
}

template <class T>
asio::awaitable<void> sharded_ops<T>::update(io_ptr io, layout_ptr layout, update_op op, tensor value,
                                             const char* operation) {
  auto& channel = bound(io, *layout);
  const auto parts = split_dense(*layout, value, operation);
  co_await run_all(parts.size(), [&](std::size_t i) { return channel.update(layout->ref.shards[i], op, parts[i]); });
}

template <class T>
asio::awaitable<void> sharded_ops<T>::lookup_shard(variable_io& io, variable_ref shard, const shard_rows& plan,
                                                   std::byte* out, std::size_t row_bytes) {
  const tensor reply = co_await io.gather(std::move(shard), plan.ids);
  place_rows(out, reply, plan, row_bytes);
}

template <class T>
asio::awaitable<xt::xarray<T>> sharded_ops<T>::gather(io_ptr io, layout_ptr layout, id_list ids, bool flat,
                                                      const char* operation) {
  auto& channel = bound(io, *layout);
  if (flat) check_one_dimensional(ids, operation);
  const auto plan = plan_lookup(*layout, ids.ids, operation);
  shape_type shape = std::move(ids.shape);
  shape.insert(shape.end(), layout->ref.shape.begin() + 1, layout->ref.shape.end());
  xt::xarray<T> out(shape);
  auto* bytes = reinterpret_cast<std::byte*>(out.data());
  const std::size_t row_bytes = layout->row_elements() * sizeof(T);
  co_await run_all(plan.size(), [&](std::size_t i) {
    return lookup_shard(channel, layout->ref.shards[plan[i].shard], plan[i], bytes, row_bytes);
  });
  co_return out;
}

template <class T>
asio::awaitable<xt::xarray<T>> sharded_ops<T>::slice(io_ptr io, layout_ptr layout, std::optional<std::int64_t> begin,
                                                     std::optional<std::int64_t> end, std::int64_t step) {
  if (layout->ref.shape.empty()) {
    throw error(errc::invalid_argument,
                fmt::format("read_rows of '{}': a scalar variable has no rows", layout->ref.name));
  }
  id_list rows;
  try {
    rows.ids = slice_rows(layout->ref.shape[0], begin, end, step);
  } catch (const error& e) {
    throw error(e.code(), fmt::format("read_rows of '{}': {}", layout->ref.name, e.what()));
  }
  rows.shape = {rows.ids.size()};
  co_return co_await gather(std::move(io), std::move(layout), std::move(rows), true, "read_rows");
}

template <class T>
asio::awaitable<void> sharded_ops<T>::failed(std::exception_ptr e) {
  std::rethrow_exception(e);
  co_return;
}

template <class T>
asio::awaitable<void> sharded_ops<T>::scatter(io_ptr io, layout_ptr layout, update_op op,
                                              std::vector<shard_rows> parts) {
  auto& channel = bound(io, *layout);
  co_await run_all(parts.size(), [&](std::size_t i) {
    return channel.scatter(layout->ref.shards[parts[i].shard], op, parts[i].ids, parts[i].rows);
  });
}

template <class T>
asio::awaitable<void> sharded_ops<T>::apply_dense(io_ptr io, layout_ptr layout, optimizer opt, tensor gradient) {
  auto& channel = bound(io, *layout);
  const auto parts = split_dense(*layout, gradient, "apply_gradient");
  co_await run_all(parts.size(), [&](std::size_t i) {
    return channel.apply_gradient(layout->ref.shards[i], opt, parts[i], std::nullopt);
  });
}

template <class T>
asio::awaitable<void> sharded_ops<T>::apply_sparse(io_ptr io, layout_ptr layout, optimizer opt,
                                                   std::vector<shard_rows> parts) {
  auto& channel = bound(io, *layout);
  co_await run_all(parts.size(), [&](std::size_t i) {
    return channel.apply_gradient(layout->ref.shards[parts[i].shard], opt, parts[i].rows, parts[i].ids);
  });
}

template struct sharded_ops<float>;
template struct sharded_ops<double>;
template struct sharded_ops<std::int32_t>;
template struct sharded_ops<std::int64_t>;

}  // namespace pscoro::detail

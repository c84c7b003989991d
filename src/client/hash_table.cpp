// The operations behind hash_table<T>: ids grouped by the ps that holds their bucket (the same mix
// as the ps checks them by, common/id_hash.hpp), one request per ps, all at once, and the rows
// placed back in the caller's order as they arrive (as a sharded variable's lookup places them).
#include <pscoro/hash_table.hpp>

#include <pscoro/detail/parallel.hpp>

#include "client/scratch_buffers.hpp"
#include "common/id_hash.hpp"
#include "common/memory.hpp"
#include "common/rows.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <span>

namespace pscoro::detail {

namespace {

variable_io& bound(const std::shared_ptr<variable_io>& io, const hash_table_ref& table) {
  if (!io) throw error(errc::failed_precondition, fmt::format("hash table handle '{}' is not bound", table.name));
  return *io;
}

// Puts one part's rows where the caller's ids want them (reply row r at position positions[r]),
// as they arrive: the rows already here are placed while the rest is on its way.
class rows_placer {
 public:
  rows_placer(std::byte* out, std::vector<std::size_t> positions, std::size_t row_bytes) noexcept
      : out_(out), positions_(std::move(positions)), row_bytes_(row_bytes) {}
  rows_placer(const rows_placer&) = delete;
  rows_placer& operator=(const rows_placer&) = delete;

  /// The reply's size.
  std::size_t bytes() const noexcept { return positions_.size() * row_bytes_; }

  // Places what the front of the reply that has arrived allows.
  void place(std::span<const std::byte> arrived) noexcept {
    told_from_ = arrived.data();
    const std::size_t rows = std::min(arrived.size() / row_bytes_, positions_.size());
    const std::byte* from = arrived.data();
    std::size_t r = placed_;
    common::with_row_size(row_bytes_, [&](auto size) {
      for (; r < rows; ++r) std::memcpy(out_ + positions_[r] * size, from + r * size, size);
    });
    placed_ = r;
  }

  // Places the rows not placed yet from the whole reply (its size checked by the io). Rows told as
  // they arrived came from the buffer given for the reply; a reply read elsewhere (the transport
  // could not use it) is placed again whole.
  void finish(const tensor& reply) noexcept {
    if (reply.bytes().data() != told_from_) placed_ = 0;
    place({reply.bytes().data(), reply.size_bytes()});
  }

 private:
  std::byte* out_;
  std::vector<std::size_t> positions_;
  std::size_t row_bytes_;
  std::size_t placed_ = 0;  // reply rows [0, placed_) are in place
  const std::byte* told_from_ = nullptr;
};

// One ps's share of a lookup: the parts it is sent (one per table with ids there) and, for each,
// where its rows go. The placers stay where they are while the reply arrives (told by address).
struct ps_share {
  int ps_task;
  std::vector<variable_io::table_ids> parts;
  std::vector<std::unique_ptr<rows_placer>> placers;
};

asio::awaitable<void> lookup_share(variable_io& io, ps_share& share, bool insert) {
  std::vector<variable_io::rows_target> into;
  into.reserve(share.placers.size());
  for (const auto& placer : share.placers) {
    rows_placer* to = placer.get();
    into.push_back({client::scratch_buffers::take(to->bytes()),
                    [to](std::span<const std::byte> arrived) { to->place(arrived); }});
  }
  auto parts = std::move(share.parts);
  const auto replies = co_await io.hash_lookup(share.ps_task, std::move(parts), insert, std::move(into));
  for (std::size_t j = 0; j < replies.size(); ++j) share.placers[j]->finish(replies[j]);
}

// One ps's share of a step: the parts of every table it holds ids of.
struct step_share {
  int ps_task;
  std::vector<variable_io::table_ids> parts;
};

asio::awaitable<void> apply_on(variable_io& io, const optimizer& opt, step_share& share) {
  auto parts = std::move(share.parts);
  co_await io.hash_apply_gradients(share.ps_task, std::move(parts), opt);
}

asio::awaitable<void> advance_on(variable_io& io, const hash_table_ref& table, int ps_task, std::uint64_t clock,
                                 std::uint64_t& dropped) {
  dropped = co_await io.advance_clock(ps_task, table, clock);
}

}  // namespace

void check_table(const hash_table_ref& ref, dtype type) {
  if (ref.type != type) {
    throw error(errc::invalid_argument, fmt::format("hash table '{}' holds {} rows, not {}", ref.name,
                                                    name_of(ref.type), name_of(type)));
  }
  if (ref.dim == 0 || ref.buckets == 0 || ref.ps_tasks.empty()) {
    throw error(errc::invalid_argument, fmt::format("hash table '{}' has dim {}, {} buckets and {} ps: none may be 0",
                                                    ref.name, ref.dim, ref.buckets, ref.ps_tasks.size()));
  }
}

std::vector<table_part> split_table_gradients(const hash_table_ref& table, std::span<const std::int64_t> ids,
                                              const shape_type& id_shape, const tensor& gradients) {
  check_table(table, table.type);
  if (id_shape.size() != 1) {
    throw error(errc::invalid_argument, fmt::format("apply_gradients of '{}': ids must be 1-D, not {}", table.name,
                                                    to_string(id_shape)));
  }
  if (gradients.type() != table.type || gradients.shape() != shape_type{ids.size(), table.dim}) {
    throw error(errc::invalid_argument,
                fmt::format("apply_gradients of '{}': {} ids need gradients {} [{}, {}], got {} {}", table.name,
                            ids.size(), name_of(table.type), ids.size(), table.dim, name_of(gradients.type()),
                            to_string(gradients.shape())));
  }
  const std::size_t n_ps = table.ps_tasks.size();
  const std::size_t row_bytes = table.dim * size_of(table.type);
  std::vector<std::size_t> count(n_ps, 0);
  for (const std::int64_t id : ids) ++count[common::ps_index_of(id, table)];
  std::vector<table_part> parts;
  std::vector<std::size_t> part_of(n_ps, n_ps);
  for (std::size_t p = 0; p < n_ps; ++p) {
    if (count[p] == 0) continue;
    part_of[p] = parts.size();
    parts.push_back({table.ps_tasks[p],
                     {table, tensor::uninitialized(dtype::int64, {count[p]}),
                      tensor::uninitialized(table.type, {count[p], table.dim})}});
  }
  std::vector<std::size_t> filled(parts.size(), 0);
  for (std::size_t k = 0; k < ids.size(); ++k) {
    const std::size_t q = part_of[common::ps_index_of(ids[k], table)];
    auto& part = parts[q].ids;
    const std::size_t j = filled[q]++;
    std::memcpy(part.ids.bytes().data() + j * sizeof(std::int64_t), &ids[k], sizeof(std::int64_t));
    std::memcpy(part.gradients.bytes().data() + j * row_bytes, gradients.bytes().data() + k * row_bytes, row_bytes);
  }
  return parts;
}

asio::awaitable<void> apply_table_gradients(std::shared_ptr<variable_io> io, std::string table, optimizer opt,
                                            std::vector<table_part> parts) {
  if (!io) throw error(errc::failed_precondition, fmt::format("hash table handle '{}' is not bound", table));
  std::vector<step_share> shares;
  for (auto& part : parts) {
    auto share = std::find_if(shares.begin(), shares.end(), [&](const step_share& s) { return s.ps_task == part.ps_task; });
    if (share == shares.end()) share = shares.insert(shares.end(), step_share{part.ps_task, {}});
    share->parts.push_back(std::move(part.ids));
  }
  variable_io& to = *io;
  co_await run_all(shares.size(), [&](std::size_t i) { return apply_on(to, opt, shares[i]); });
}

asio::awaitable<std::uint64_t> advance_table_clock(std::shared_ptr<variable_io> io, hash_table_ref table,
                                                   std::uint64_t clock) {
  variable_io& to = bound(io, table);
  std::vector<std::uint64_t> dropped(table.ps_tasks.size(), 0);
  co_await run_all(table.ps_tasks.size(),
                   [&](std::size_t p) { return advance_on(to, table, table.ps_tasks[p], clock, dropped[p]); });
  std::uint64_t total = 0;
  for (const auto d : dropped) total += d;
  co_return total;
}

asio::awaitable<void> failed_table_call(std::exception_ptr e) {
  std::rethrow_exception(e);
  co_return;
}

template <class T>
asio::awaitable<xt::xarray<T>> hash_table_ops<T>::lookup(std::shared_ptr<variable_io> io, hash_table_ref table,
                                                         id_list ids, bool insert) {
  std::vector<hash_table_ref> tables{std::move(table)};
  std::vector<id_list> lists;
  lists.push_back(std::move(ids));
  auto rows = co_await lookup_many(std::move(io), std::move(tables), std::move(lists), insert);
  co_return std::move(rows.front());
}

template <class T>
asio::awaitable<std::vector<xt::xarray<T>>> hash_table_ops<T>::lookup_many(std::shared_ptr<variable_io> io,
                                                                            std::vector<hash_table_ref> tables,
                                                                            std::vector<id_list> ids, bool insert) {
  if (tables.empty()) co_return std::vector<xt::xarray<T>>{};
  std::vector<ps_share> shares;  // in order of first use
  const auto share_of = [&](int ps_task) -> ps_share& {
    for (auto& s : shares) {
      if (s.ps_task == ps_task) return s;
    }
    return shares.emplace_back(ps_share{ps_task, {}, {}});
  };
  std::vector<xt::xarray<T>> out;
  out.reserve(tables.size());
  for (std::size_t t = 0; t < tables.size(); ++t) {
    const auto& table = tables[t];
    bound(io, table);
    check_table(table, dtype_of<T>);
    shape_type shape = ids[t].shape;
    shape.push_back(table.dim);
    auto& rows = out.emplace_back(xt::xarray<T>::from_shape(shape));
    // Fresh pages (glibc maps a large block anew each time): huge pages fault in far fewer times.
    common::advise_huge_pages(rows.data(), rows.size() * sizeof(T));
    const std::size_t n_ps = table.ps_tasks.size();
    std::vector<std::vector<std::int64_t>> ps_ids(n_ps);
    std::vector<std::vector<std::size_t>> positions(n_ps);
    for (std::size_t p = 0; p < n_ps; ++p) {
      // Room for an even share and some: ids spread evenly over the buckets.
      ps_ids[p].reserve(ids[t].ids.size() / n_ps + ids[t].ids.size() / (8 * n_ps) + 16);
      positions[p].reserve(ps_ids[p].capacity());
    }
    for (std::size_t k = 0; k < ids[t].ids.size(); ++k) {
      const std::size_t p = common::ps_index_of(ids[t].ids[k], table);
      ps_ids[p].push_back(ids[t].ids[k]);
      positions[p].push_back(k);
    }
    auto* bytes = reinterpret_cast<std::byte*>(rows.data());
    for (std::size_t p = 0; p < n_ps; ++p) {
      if (ps_ids[p].empty()) continue;
      auto& share = share_of(table.ps_tasks[p]);
      share.parts.push_back({table, vector_tensor(ps_ids[p]), {}});
      share.placers.push_back(std::make_unique<rows_placer>(bytes, std::move(positions[p]), table.dim * sizeof(T)));
    }
  }
  variable_io& from = *io;
  co_await run_all(shares.size(), [&](std::size_t i) { return lookup_share(from, shares[i], insert); });
  co_return out;
}

template <class T>
asio::awaitable<std::vector<xt::xarray<T>>> hash_table_ops<T>::failed_many(std::exception_ptr e) {
  std::rethrow_exception(e);
  co_return std::vector<xt::xarray<T>>{};
}

template <class T>
asio::awaitable<xt::xarray<T>> hash_table_ops<T>::failed(std::exception_ptr e) {
  std::rethrow_exception(e);
  co_return xt::xarray<T>{};
}

template struct hash_table_ops<float>;
template struct hash_table_ops<double>;

}  // namespace pscoro::detail

// What the handles' templates (variable<T>, sharded_variable<T>, row_operations) instantiate: the
// layout of a variable's shards, the caller's ids and rows as they travel, and the declarations of
// the coroutines behind every operation. Those coroutines, the checks and the planning of lookups
// and scatters are compiled once for each element type (src/client/sharded.cpp,
// src/client/sparse_lookup.cpp; their internal declarations: src/client/sharded.hpp); what depends
// on the caller's expression types is here.
#pragma once

#include <pscoro/config.hpp>

#include <pscoro/detail/variable_io.hpp>
#include <pscoro/detail/xtensor.hpp>
#include <pscoro/sparse_ids.hpp>
#include <pscoro/xtensor.hpp>

#include <asio/awaitable.hpp>

#include <cstdint>
#include <exception>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace pscoro::detail {

/// A sharded variable's shards and where their rows start.
struct PSCORO_API sharded_layout {
  sharded_variable_ref ref;
  std::vector<std::size_t> offsets;  // shards + 1 row offsets; the last is the row count

  std::size_t rows() const noexcept { return offsets.back(); }
  std::size_t num_shards() const noexcept { return ref.shards.size(); }
  /// Elements per row (1 for a scalar).
  std::size_t row_elements() const noexcept;
};

/// Checks `ref` as TF checks a ShardedVariable (shards present, one dtype, equal dims besides axis
/// 0, rows adding up) plus the "div" layout the id mapping needs; throws errc::invalid_argument.
PSCORO_API std::shared_ptr<const sharded_layout> make_layout(sharded_variable_ref ref);
/// The layout of a dense variable: one shard.
PSCORO_API std::shared_ptr<const sharded_layout> single_layout(variable_ref ref);

/// Row ids as they travel: int64, with the shape they came in (embedding_lookup keeps it).
struct id_list {
  std::vector<std::int64_t> ids;
  shape_type shape;
};

/// `id` as the int64 ids travel as; throws errc::invalid_argument for a value that does not fit.
template <class Id>
std::int64_t to_int64_id(Id id) {
  static_assert(std::is_integral_v<Id> && !std::is_same_v<Id, bool>, "ids must be integers");
  if constexpr (std::is_unsigned_v<Id> && sizeof(Id) >= sizeof(std::int64_t)) {
    if (id > static_cast<Id>(std::numeric_limits<std::int64_t>::max())) {
      throw error(errc::invalid_argument, "id " + std::to_string(id) + " does not fit in int64");
    }
  }
  return static_cast<std::int64_t>(id);
}

/// Whether a C's elements lie in its own storage, row-major and contiguous, as a tensor's bytes do.
template <class C>
inline constexpr bool is_dense_container_v = [] {
  if constexpr (std::is_base_of_v<xt::xcontainer<C>, C>) {
    return C::static_layout == xt::layout_type::row_major && is_element_type_v<typename C::value_type>;
  } else {
    return false;
  }
}();

/// Evaluates `ids` (an integral expression) once; throws errc::invalid_argument for a value that
/// does not fit in int64. A row-major container's storage is read straight, not through xtensor's
/// iterators.
template <class E>
id_list to_id_list(const xt::xexpression<E>& ids) {
  const auto& evaluated = detail::evaluated(ids.derived_cast());  // not xt::eval (see there)
  using C = std::remove_cvref_t<decltype(evaluated)>;
  id_list out{{}, shape_type(evaluated.shape().begin(), evaluated.shape().end())};
  if constexpr (is_dense_container_v<C>) {
    const auto* data = evaluated.data();
    if constexpr (std::is_same_v<typename C::value_type, std::int64_t>) {
      out.ids.assign(data, data + evaluated.size());
    } else {
      out.ids.resize(evaluated.size());
      for (std::size_t k = 0; k < out.ids.size(); ++k) out.ids[k] = to_int64_id(data[k]);
    }
  } else {
    out.ids.reserve(evaluated.size());
    for (const auto id : evaluated) out.ids.push_back(to_int64_id(id));
  }
  return out;
}

/// One shard's part of a scatter or sparse gradient: its local row ids as an int64 tensor (shards
/// with no ids get no request) and the matching rows.
struct shard_rows {
  std::size_t shard;
  tensor ids;
  tensor rows;
};

/// A lookup planned (its ids checked and grouped by shard), and one shard's part of it
/// (src/client/sharded.cpp).
struct lookup_plan;
struct lookup_part;

/// Rows as the caller gave them: a view of their storage when they are a row-major container (then
/// `owned` is false and the view is only valid during the call), else a copy.
struct row_source {
  tensor rows;
  bool owned;
};

/// A tensor over the elements of `c` (a dense container, see above): no copy.
template <class C>
tensor view_of(const C& c) {
  using value_type = typename C::value_type;
  auto* data = reinterpret_cast<std::byte*>(const_cast<value_type*>(c.data()));
  return tensor(dtype_of<value_type>, shape_type(c.shape().begin(), c.shape().end()),
                byte_buffer::borrow(data, c.size() * sizeof(value_type)));
}

template <class E>
row_source rows_of(const xt::xexpression<E>& e) {
  if constexpr (is_dense_container_v<E>) {
    return {view_of(e.derived_cast()), false};
  } else {
    return {to_tensor(e), true};
  }
}

/// `e` as the operand of a dense update, copied only when it must be: a view of the caller's
/// storage for a dense container passed as an lvalue (it must live, unchanged, until the awaited
/// operation completes, as read(out)'s array does); the container itself, moved into the tensor,
/// for a non-const rvalue (a temporary is never viewed: g++ 12 destroys a co_await's temporaries
/// early); anything else evaluated once into a new tensor.
template <class E>
tensor dense_operand(E&& e) {
  using C = std::remove_cvref_t<E>;
  if constexpr (is_dense_container_v<C> && std::is_lvalue_reference_v<E>) {
    return view_of(e);
  } else if constexpr (is_dense_container_v<C> && !std::is_const_v<std::remove_reference_t<E>>) {
    using value_type = typename C::value_type;
    auto owner = std::make_shared<C>(std::move(e));  // after the move: a fixed-size container's data moves too
    auto* data = reinterpret_cast<std::byte*>(owner->data());
    shape_type shape(owner->shape().begin(), owner->shape().end());
    const std::size_t bytes = owner->size() * sizeof(value_type);
    return tensor(dtype_of<value_type>, std::move(shape), byte_buffer::share(std::move(owner), data, bytes));
  } else {
    return to_tensor(e);
  }
}

/// Whether an E (a forwarding reference's type) is an xtensor expression.
template <class E>
inline constexpr bool is_expression_v = xt::is_xexpression<std::remove_cvref_t<E>>::value;

/// Checks a row operation (1-D ids of `id_shape` in range, rows of shape [n] + the row shape and the
/// variable's dtype) and splits ids and rows by shard, keeping their order within each shard. Rows are copied
/// once into per-shard buffers (not at all for one shard when `rows.owned`), so the result never
/// refers to the caller's storage; the buffers are reused from the calling thread's earlier row
/// operations once nothing holds them (src/client/scratch_buffers.hpp). Throws
/// errc::invalid_argument naming the operation, the variable, and the bad id with its position and
/// the row count: a bad id sends nothing.
PSCORO_API std::vector<shard_rows> split_by_shard(const sharded_layout& layout, std::span<const std::int64_t> ids,
                                                  const shape_type& id_shape, row_source rows,
                                                  std::string_view operation);

/// A sparse_ids as the compiled lookups take it: int64 ids, double weights (exact for float ones).
struct sparse_batch {
  std::vector<std::int64_t> rows;
  std::vector<std::int64_t> ids;
  std::vector<double> weights;  // empty: every weight is 1
  std::size_t dense_rows = 0;
};

/// Copies `in` (evaluated at call time, while it certainly exists); errc::invalid_argument for an id
/// that does not fit in int64.
template <class Id, class Weight>
sparse_batch to_sparse_batch(const sparse_ids<Id, Weight>& in) {
  sparse_batch out{in.rows, {}, std::vector<double>(in.weights.begin(), in.weights.end()), in.dense_rows};
  out.ids.reserve(in.ids.size());
  for (const Id id : in.ids) out.ids.push_back(to_int64_id(id));
  return out;
}

/// What a sparse lookup was asked for: TF's embedding_lookup_sparse (`safe` false) or
/// safe_embedding_lookup_sparse (`safe` true: ids < 0 dropped, non-positive weights dropped unless
/// the combiner is sum, rows left empty take `default_id`'s row when there is one).
struct sparse_request {
  combiner how = combiner::mean;
  bool safe = false;
  std::optional<std::int64_t> default_id;
  std::optional<double> max_norm;
};


/// The coroutines behind the handles. Static and by value: an awaitable must not depend on the
/// handle staying alive, and every failure (an unbound handle too) surfaces where it is awaited.
/// Compiled once for each element type in src/client/sharded.cpp (as fmt compiles its common
/// instantiations), so a program that reads variables does not compile these coroutines again.
template <class T>
struct PSCORO_API sharded_ops {
  using layout_ptr = std::shared_ptr<const sharded_layout>;
  using io_ptr = std::shared_ptr<variable_io>;

  static asio::awaitable<void> read_to(io_ptr io, layout_ptr layout, xt::xarray<T>& out);
  static asio::awaitable<xt::xarray<T>> read(io_ptr io, layout_ptr layout);
  static asio::awaitable<void> update(io_ptr io, layout_ptr layout, update_op op, tensor value, const char* operation);
  /// The rows `ids`, as an array of `shape` + the row shape. The ids are checked and planned now
  /// (they are not used once this returns: no copy of them is kept); a bad one fails where the
  /// result is awaited. `flat`: `shape` must be 1-D. `distinct`: the caller knows no id repeats
  /// (then none is looked for).
  static asio::awaitable<xt::xarray<T>> gather(io_ptr io, layout_ptr layout, std::span<const std::int64_t> ids,
                                               shape_type shape, bool flat, const char* operation,
                                               bool distinct = false);
  static asio::awaitable<xt::xarray<T>> slice(io_ptr io, layout_ptr layout, std::optional<std::int64_t> begin,
                                              std::optional<std::int64_t> end, std::int64_t step);
  /// An awaitable that fails with `e` where it is awaited (for checks done at call time).
  static asio::awaitable<void> failed(std::exception_ptr e);
  static asio::awaitable<void> scatter(io_ptr io, layout_ptr layout, update_op op, std::vector<shard_rows> parts);
  static asio::awaitable<void> apply_dense(io_ptr io, layout_ptr layout, optimizer opt, tensor gradient);
  static asio::awaitable<void> apply_sparse(io_ptr io, layout_ptr layout, optimizer opt,
                                            std::vector<shard_rows> parts);

 private:
  static variable_io& bound(const io_ptr& io, const sharded_layout& layout);
  static asio::awaitable<void> read_into(variable_io& io, variable_ref shard, std::byte* out);
  static asio::awaitable<xt::xarray<T>> send_lookup(io_ptr io, layout_ptr layout, lookup_plan plan, shape_type shape);
  static asio::awaitable<xt::xarray<T>> failed_lookup(std::exception_ptr e);
  static asio::awaitable<void> lookup_shard(variable_io& io, variable_ref shard, const lookup_part& part,
                                            std::byte* out, std::size_t row_bytes);
};

extern template struct sharded_ops<float>;
extern template struct sharded_ops<double>;
extern template struct sharded_ops<std::int32_t>;
extern template struct sharded_ops<std::int64_t>;

/// The sparse lookups (floating-point variables only), compiled in src/client/sparse_lookup.cpp: the plan,
/// one gather of the distinct ids (each shard asked once, for its rows), then the combination, in
/// entry order, on the caller's executor.
template <class T>
struct PSCORO_API sparse_ops {
  static asio::awaitable<xt::xarray<T>> lookup(std::shared_ptr<variable_io> io,
                                               std::shared_ptr<const sharded_layout> layout, sparse_batch batch,
                                               sparse_request request, const char* operation);
  /// An awaitable that fails with `e` where it is awaited (for failures at call time).
  static asio::awaitable<xt::xarray<T>> failed(std::exception_ptr e);
};

extern template struct sparse_ops<float>;
extern template struct sparse_ops<double>;


}  // namespace pscoro::detail

// The row and optimizer operations that variable<T> and sharded_variable<T> share: their contract.
//
//   auto rows = co_await table.embedding_lookup(ids);                  // ids.shape + row shape
//   co_await table.scatter_add(ids, deltas);                           // row ids[k] += deltas[k]
//   co_await table.apply_sparse_gradient(pscoro::optimizers::adagrad{.learning_rate = 0.1}, ids, grads);
//
// Every operation is checked whole before anything is sent: ids in range (any integer type that
// fits in int64), rows of shape [ids] + the row shape and the variable's dtype; a bad one is
// errc::invalid_argument naming the operation, the variable, the id and its position, and reads
// or writes nothing. Ids are asked of the shard that holds them only, each shard's part in one
// message, all shards at once; rows of one shard are applied in the order of their ids, so every
// result equals the same operation on a dense variable. The ids and rows are read when the
// operation is called: they need not outlive it (read(out)'s array and assign's operand do, see
// there). Failures, call-time checks included, surface where the operation is awaited.
#pragma once

#include <pscoro/config.hpp>

#include <pscoro/detail/sharded_io.hpp>
#include <pscoro/optimizers.hpp>
#include <pscoro/sparse_ids.hpp>
#include <pscoro/xtensor.hpp>

#include <asio/awaitable.hpp>

#include <cstdint>
#include <exception>
#include <optional>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

namespace pscoro {

/// The row and optimizer operations of variable<T> and sharded_variable<T> (a dense variable is a
/// sharded one of one shard), written once: Derived provides `row_layout()` and `row_io()`.
template <class Derived, class T>
class row_operations {
 public:
  /// The rows `ids` (1-D) in input order, duplicates allowed: shape [ids.size()] + row shape.
  template <class E>
  asio::awaitable<xt::xarray<T>> sparse_read(const xt::xexpression<E>& ids) const {
    return lookup(ids, true, "sparse_read");
  }
  /// The rows `ids` (any shape) in input order: shape ids.shape + row shape. Only those rows
  /// travel, each once per request however often it is named.
  template <class E>
  asio::awaitable<xt::xarray<T>> embedding_lookup(const xt::xexpression<E>& ids) const {
    return lookup(ids, false, "embedding_lookup");
  }

  /// TF's embedding_lookup_sparse: output row r combines the rows of the ids whose row index is r,
  /// each times its weight (see pscoro::combiner; "mean" is TF's default), into shape
  /// [ids.dense_rows] + row shape; a row no id names is zeros. Each distinct id's row is fetched
  /// once, from its shard. With `max_norm`, a fetched row longer than that (l2) is scaled down to
  /// it first. Ids out of range, row indices out of [0, dense_rows) or decreasing, and weights that
  /// are not one per id are errc::invalid_argument, found before anything is sent.
  template <class Id, class Weight>
    requires std::is_floating_point_v<T>
  asio::awaitable<xt::xarray<T>> embedding_lookup_sparse(const sparse_ids<Id, Weight>& ids,
                                                         combiner how = combiner::mean,
                                                         std::optional<double> max_norm = std::nullopt) const {
    return sparse_lookup(ids, {how, false, std::nullopt, max_norm}, "embedding_lookup_sparse");
  }
  /// TF's safe_embedding_lookup_sparse: embedding_lookup_sparse after dropping the ids < 0 and, when
  /// the combiner is not sum, the entries of weight <= 0 (TF's pruning); a row left with no entry
  /// is `default_id`'s row when one is given, else zeros. An id >= the row count is still an error,
  /// as is a default_id out of range (even when no row needs it).
  template <class Id, class Weight>
    requires std::is_floating_point_v<T>
  asio::awaitable<xt::xarray<T>> safe_embedding_lookup_sparse(const sparse_ids<Id, Weight>& ids,
                                                              combiner how = combiner::mean,
                                                              std::optional<std::int64_t> default_id = std::nullopt,
                                                              std::optional<double> max_norm = std::nullopt) const {
    return sparse_lookup(ids, {how, true, default_id, max_norm}, "safe_embedding_lookup_sparse");
  }

  /// Rows [begin:end:step] of axis 0, as Python slices them (TF's `sharded[begin:end:step]`):
  /// `read_rows(-3, std::nullopt)` is the last three rows, `read_rows(std::nullopt, std::nullopt,
  /// -1)` all rows backwards. Shape [selected rows] + row shape. Only the shards that hold selected
  /// rows are asked, each for those rows. errc::invalid_argument for step 0 or a scalar variable.
  asio::awaitable<xt::xarray<T>> read_rows(std::optional<std::int64_t> begin, std::optional<std::int64_t> end,
                                           std::int64_t step = 1) const {
    return ops::slice(io(), layout(), begin, end, step);
  }

  /// Row ids[k] = rows[k], in order (TF's scatter_update; rows: [ids.size()] + row shape).
  template <class I, class R>
  asio::awaitable<void> scatter_update(const xt::xexpression<I>& ids, const xt::xexpression<R>& rows) const {
    return scatter(update_op::assign, ids, rows, "scatter_update");
  }
  /// Row ids[k] += rows[k]; a repeated id receives every one of its rows.
  template <class I, class R>
  asio::awaitable<void> scatter_add(const xt::xexpression<I>& ids, const xt::xexpression<R>& rows) const {
    return scatter(update_op::add, ids, rows, "scatter_add");
  }
  template <class I, class R>
  asio::awaitable<void> scatter_sub(const xt::xexpression<I>& ids, const xt::xexpression<R>& rows) const {
    return scatter(update_op::sub, ids, rows, "scatter_sub");
  }
  template <class I, class R>
  asio::awaitable<void> scatter_mul(const xt::xexpression<I>& ids, const xt::xexpression<R>& rows) const {
    return scatter(update_op::mul, ids, rows, "scatter_mul");
  }
  /// Integer division by zero is refused before anything changes.
  template <class I, class R>
  asio::awaitable<void> scatter_div(const xt::xexpression<I>& ids, const xt::xexpression<R>& rows) const {
    return scatter(update_op::div, ids, rows, "scatter_div");
  }
  template <class I, class R>
  asio::awaitable<void> scatter_min(const xt::xexpression<I>& ids, const xt::xexpression<R>& rows) const {
    return scatter(update_op::min, ids, rows, "scatter_min");
  }
  template <class I, class R>
  asio::awaitable<void> scatter_max(const xt::xexpression<I>& ids, const xt::xexpression<R>& rows) const {
    return scatter(update_op::max, ids, rows, "scatter_max");
  }

  /// One optimizer step with a dense gradient of the variable's shape: one message per shard.
  template <class E>
    requires std::is_floating_point_v<T>
  asio::awaitable<void> apply_gradient(const optimizer& opt, const xt::xexpression<E>& gradient) const {
    return ops::apply_dense(io(), layout(), opt, to_tensor(gradient));
  }
  /// The same with a gradient already in wire form (from another framework: pscoro::from_torch),
  /// sent as it is: each shard's message carries a view of its rows, no conversion and no copy.
  /// Its dtype and shape must be the variable's (errc::invalid_argument, checked before sending).
  asio::awaitable<void> apply_gradient(const optimizer& opt, tensor gradient) const
    requires std::is_floating_point_v<T>
  {
    return ops::apply_dense(io(), layout(), opt, std::move(gradient));
  }
  /// One optimizer step on the rows `ids` (1-D; duplicates are summed on the ps): one message per
  /// shard that holds any of them.
  template <class I, class R>
    requires std::is_floating_point_v<T>
  asio::awaitable<void> apply_sparse_gradient(const optimizer& opt, const xt::xexpression<I>& ids,
                                              const xt::xexpression<R>& rows) const {
    const auto where = layout();
    std::vector<detail::shard_rows> parts;
    try {
      // Split now, while the caller's rows certainly exist; failures surface where awaited.
      detail::id_list converted;
      const auto int64_ids = ids_of(ids, converted);
      parts = detail::split_by_shard(*where, int64_ids, converted.shape, detail::rows_of(rows), "apply_sparse_gradient");
    } catch (...) {
      return ops::failed(std::current_exception());
    }
    return ops::apply_sparse(io(), where, opt, std::move(parts));
  }

 private:
  using ops = detail::sharded_ops<T>;

  // The ids of a row operation as int64, with their shape in `converted.shape`: an int64
  // container's read where they are (no copy: a million ids are 8 MiB of fresh pages per call
  // otherwise), others converted into `converted.ids`. Row operations plan or split at the call,
  // so the span is used before this call's caller returns.
  template <class E>
  static std::span<const std::int64_t> ids_of(const xt::xexpression<E>& ids, detail::id_list& converted) {
    using C = std::remove_cvref_t<E>;
    if constexpr (detail::is_dense_container_v<C> && std::is_same_v<typename C::value_type, std::int64_t>) {
      const C& container = ids.derived_cast();
      converted.shape.assign(container.shape().begin(), container.shape().end());
      return {container.data(), container.size()};
    } else {
      converted = detail::to_id_list(ids);
      return converted.ids;
    }
  }

  template <class E>
  asio::awaitable<xt::xarray<T>> lookup(const xt::xexpression<E>& ids, bool flat, const char* operation) const {
    detail::id_list converted;
    const auto int64_ids = ids_of(ids, converted);
    return ops::gather(io(), layout(), int64_ids, std::move(converted.shape), flat, operation);
  }

  std::shared_ptr<const detail::sharded_layout> layout() const { return static_cast<const Derived&>(*this).row_layout(); }
  const std::shared_ptr<detail::variable_io>& io() const { return static_cast<const Derived&>(*this).row_io(); }

  template <class Id, class Weight>
  asio::awaitable<xt::xarray<T>> sparse_lookup(const sparse_ids<Id, Weight>& ids, detail::sparse_request request,
                                               const char* operation) const {
    detail::sparse_batch batch;
    try {
      batch = detail::to_sparse_batch(ids);
    } catch (...) {
      return detail::sparse_ops<T>::failed(std::current_exception());
    }
    return detail::sparse_ops<T>::lookup(io(), layout(), std::move(batch), std::move(request), operation);
  }

  template <class I, class R>
  asio::awaitable<void> scatter(update_op op, const xt::xexpression<I>& ids, const xt::xexpression<R>& rows,
                                const char* operation) const {
    const auto where = layout();
    std::vector<detail::shard_rows> parts;
    try {
      // Split now, while the caller's rows certainly exist; failures surface where awaited.
      detail::id_list converted;
      const auto int64_ids = ids_of(ids, converted);
      parts = detail::split_by_shard(*where, int64_ids, converted.shape, detail::rows_of(rows), operation);
    } catch (...) {
      return ops::failed(std::current_exception());
    }
    return ops::scatter(io(), where, op, std::move(parts));
  }
};

}  // namespace pscoro

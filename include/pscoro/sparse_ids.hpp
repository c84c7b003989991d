// Ids with optional weights in a sparse layout, and how their rows are combined: the input of
// embedding_lookup_sparse and safe_embedding_lookup_sparse (row operations of variable<T> and
// sharded_variable<T>), TF's rank-2 SparseTensor as embeddings use it.
//
//   // Row 0 pools ids 0 and 3, row 1 id 4, row 2 id 1 (TF's sp_ids indices [0,0], [0,1], [1,0], [2,2]).
//   const pscoro::sparse_ids<std::int64_t> batch{.rows = {0, 0, 1, 2}, .ids = {0, 3, 4, 1}, .dense_rows = 3};
//   auto pooled = co_await table.embedding_lookup_sparse(batch);   // [3] + row shape, "mean"
//
// Entry k says: id ids[k], with weight weights[k] (1 when there are no weights), belongs to output
// row rows[k]. The weights live in the same value as the ids, so they cannot have other indices (TF
// checks that sp_weights has sp_ids' indices; here only their count can differ, and is checked). TF's
// second index column (the position within a row) is not kept: no combiner reads it.
//
// A sparse_ids is also a worker-function argument or result (its codec below): rows, ids and
// weights travel as three 1-D tensors, whatever their length, and the lookup on the worker checks
// them as it checks any.
#pragma once

#include <pscoro/config.hpp>
#include <pscoro/value.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace pscoro {

/// How the rows of one output row's ids are combined (TF's `combiner`), with w the weights:
/// `sum` Σ w·row, `mean` Σ w·row / Σ w (TF's default), `sqrtn` Σ w·row / √(Σ w²). A divisor of 0
/// gives 0 (TF's div_no_nan), so a row with no ids is zeros.
enum class combiner : std::uint8_t { sum, mean, sqrtn };

/// TF's name of `c` ("sum", "mean", "sqrtn"), or "invalid".
constexpr std::string_view name_of(combiner c) noexcept {
  switch (c) {
    case combiner::sum: return "sum";
    case combiner::mean: return "mean";
    case combiner::sqrtn: return "sqrtn";
  }
  return "invalid";
}

/// The combiner TF names `name` (from a configuration written for TF); errc::invalid_argument
/// with TF's message otherwise ("combiner must be one of 'mean', 'sqrtn' or 'sum', got 'max'").
PSCORO_API combiner parse_combiner(std::string_view name);

namespace detail {
/// Checks CSR row splits for `ids` ids: starting at 0, non-decreasing, ending at `ids`
/// (errc::invalid_argument naming the first bad split).
PSCORO_API void check_row_splits(std::span<const std::size_t> row_splits, std::size_t ids);
}  // namespace detail

/// A batch of ids grouped into output rows, each id with an optional weight (TF's SparseTensor of
/// rank 2: rows = indices[:, 0], ids = values, weights = sp_weights.values, dense_rows =
/// dense_shape[0]). Rows must be non-decreasing (TF's canonical order) and below dense_rows;
/// weights are one per id, or none for weights of 1. The lookups check all of it and say what is
/// wrong; a row no id names is an output row like any other.
template <class Id = std::int64_t, class Weight = float>
  requires(std::is_integral_v<Id> && !std::is_same_v<Id, bool> && std::is_floating_point_v<Weight>)
struct sparse_ids {
  // Every member has a default initializer, so a designated initializer may leave any out without
  // g++'s -Wmissing-field-initializers (which -Wextra enables).
  std::vector<std::int64_t> rows{};  ///< the output row of each id, non-decreasing
  std::vector<Id> ids{};             ///< the ids, rows of the variable
  std::vector<Weight> weights{};     ///< one per id, or empty: every weight is 1
  std::size_t dense_rows = 0;        ///< the number of output rows

  /// From CSR form (TF's RaggedTensor row_splits): the ids of output row r are
  /// entry_ids[row_splits[r] .. row_splits[r + 1]), so dense_rows is row_splits.size() - 1.
  /// errc::invalid_argument when the splits do not start at 0, decrease, or do not end at
  /// entry_ids.size().
  static sparse_ids from_row_splits(std::span<const std::size_t> row_splits, std::vector<Id> entry_ids,
                                    std::vector<Weight> entry_weights = {}) {
    detail::check_row_splits(row_splits, entry_ids.size());
    sparse_ids out{{}, std::move(entry_ids), std::move(entry_weights), row_splits.size() - 1};
    out.rows.reserve(out.ids.size());
    for (std::size_t r = 0; r + 1 < row_splits.size(); ++r) {
      out.rows.insert(out.rows.end(), row_splits[r + 1] - row_splits[r], static_cast<std::int64_t>(r));
    }
    return out;
  }
};

namespace detail {
/// The elements of item `index` (`part`) of a decoded sparse_ids, which must be a 1-D tensor of T's
/// dtype.
template <class T>
std::vector<T> from_vector_tensor(value&& v, const decode_context& context, std::string_view container,
                                  std::size_t index, std::string_view part) {
  const auto t = decode_item<tensor>(std::move(v), context, container, index);
  if (t.type() != dtype_of<T> || t.shape().size() != 1) {
    throw error(errc::invalid_argument, "item " + std::to_string(index) + " of " + std::string(container) + " (" +
                                            std::string(part) + ") must be a 1-D " + std::string(name_of(dtype_of<T>)) +
                                            " tensor, got " + std::string(name_of(t.type())) + " of shape " +
                                            to_string(t.shape()));
  }
  const T* data = t.template data<T>();
  return std::vector<T>(data, data + t.size());
}
}  // namespace detail

/// sparse_ids as a worker-function argument or result: [rows (int64), ids, weights, dense_rows].
template <class Id, class Weight>
  requires(is_element_type_v<Id> && is_element_type_v<Weight>)
struct codec<sparse_ids<Id, Weight>> {
  static constexpr std::string_view name = "sparse_ids";
  static value encode(const sparse_ids<Id, Weight>& x) {
    value_list list;
    list.items.reserve(4);
    list.items.push_back(detail::vector_tensor(x.rows));
    list.items.push_back(detail::vector_tensor(x.ids));
    list.items.push_back(detail::vector_tensor(x.weights));
    list.items.push_back(codec<std::size_t>::encode(x.dense_rows));
    return list;
  }
  static sparse_ids<Id, Weight> decode(value&& v, const decode_context& context) {
    auto& items = detail::items_of(v, name, 4);
    sparse_ids<Id, Weight> out;
    out.rows = detail::from_vector_tensor<std::int64_t>(std::move(items[0]), context, name, 0, "rows");
    out.ids = detail::from_vector_tensor<Id>(std::move(items[1]), context, name, 1, "ids");
    out.weights = detail::from_vector_tensor<Weight>(std::move(items[2]), context, name, 2, "weights");
    out.dense_rows = detail::decode_item<std::size_t>(std::move(items[3]), context, name, 3);
    return out;
  }
};

}  // namespace pscoro

// The library's side of the row operations (src/client/sharded.cpp, src/client/sparse_lookup.cpp):
// the checks, the splitting of dense values and the planning of slices and sparse lookups, which
// no handle template instantiates (those declarations are in <pscoro/detail/sharded_io.hpp>).
// pscoro::detail, as the code that defines them implements detail::sharded_ops.
#pragma once

#include <pscoro/detail/sharded_io.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace pscoro::detail {

/// The rows that [begin:end:step] selects of `rows`, in order, as Python's slice.indices(rows)
/// gives them: a negative bound counts from the end, a bound past either end is clamped, an absent
/// one is the start or the end in the step's direction, and a negative step walks backwards.
/// errc::invalid_argument for step 0 ("slice step cannot be zero", TF's message) and for more
/// rows than int64 counts. No arithmetic overflows, whatever the values.
std::vector<std::int64_t> slice_rows(std::uint64_t rows, std::optional<std::int64_t> begin,
                                     std::optional<std::int64_t> end, std::int64_t step);
/// Splits a dense value of the whole variable's shape into per-shard views (no copy); throws
/// errc::invalid_argument when its dtype or shape is not the variable's.
std::vector<tensor> split_dense(const sharded_layout& layout, const tensor& value, std::string_view operation);
/// Checks that `id` (at `position` of the caller's ids) names one of `rows` rows; errc::invalid_argument
/// naming the operation, the variable, the id, its position and the row count otherwise.
void check_id(std::int64_t id, std::size_t position, std::size_t rows, const sharded_layout& layout,
              std::string_view operation);
/// TF's check for sparse operations: ids (of `shape`) must be 1-D (errc::invalid_argument).
void check_one_dimensional(const shape_type& shape, std::string_view operation);
/// Checks that a ps answered a read of `shard` with its dtype and shape (errc::protocol_error).
void check_reply(const variable_ref& shard, const tensor& reply);
/// Checks `rows` against `ids` for a scatter: shape [n] + the row shape, the variable's dtype.
void check_rows(const sharded_layout& layout, std::size_t n, const tensor& rows, std::string_view operation);

/// A sparse lookup planned: each distinct id once, in first-seen order (TF's unique), and for each
/// entry kept (the dropped ones gone, a default_id entry of weight 1 in each row left empty) its
/// output row (non-decreasing), the index of its id in distinct_ids, and its weight.
struct sparse_plan {
  std::vector<std::int64_t> distinct_ids;
  std::vector<std::size_t> rows;
  std::vector<std::size_t> distinct;
  std::vector<double> weights;  // empty: every weight is 1
  std::size_t dense_rows = 0;
};

/// Checks a sparse lookup of `layout` as a whole before anything is sent (errc::invalid_argument
/// naming the operation, the variable and what is wrong: ids, row indices and weights that do not
/// match in number, a row index out of [0, dense_rows) or below the one before it, an id out of
/// range with its position, a default_id out of range, a max_norm that is not positive, a combiner
/// that is not one, a result too large to address) and plans it.
sparse_plan plan_sparse_lookup(const sharded_layout& layout, const sparse_batch& batch,
                               const sparse_request& request, std::string_view operation);

}  // namespace pscoro::detail

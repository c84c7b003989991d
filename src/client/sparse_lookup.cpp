// TF's embedding_lookup_sparse and safe_embedding_lookup_sparse over a variable's shards: the
// input checked and planned as a whole (ids made unique, as TF's array_ops.unique), one gather of
// the distinct rows through sharded_ops<T>, then TF's combination, entry by entry in input order so
// the sums are TF's and do not depend on which shard answered first.
#include "client/sharded.hpp"

#include <fmt/format.h>

#include "common/id_map.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace pscoro {

combiner parse_combiner(std::string_view name) {
  for (const combiner c : {combiner::sum, combiner::mean, combiner::sqrtn}) {
    if (name == name_of(c)) return c;
  }
  // TF's message (embedding_ops.py).
  throw error(errc::invalid_argument, fmt::format("combiner must be one of 'mean', 'sqrtn' or 'sum', got '{}'", name));
}

namespace detail {

void check_row_splits(std::span<const std::size_t> row_splits, std::size_t ids) {
  const auto invalid = [](const std::string& what) { throw error(errc::invalid_argument, "row_splits " + what); };
  if (row_splits.empty()) invalid("must have at least one entry (0), one more than there are rows");
  if (row_splits.front() != 0) invalid(fmt::format("must start at 0, not {}", row_splits.front()));
  for (std::size_t r = 1; r < row_splits.size(); ++r) {
    if (row_splits[r] < row_splits[r - 1]) {
      invalid(fmt::format("must be non-decreasing: split {} is {}, below {}", r, row_splits[r], row_splits[r - 1]));
    }
  }
  if (row_splits.back() != ids) invalid(fmt::format("must end at the number of ids {}, not {}", ids, row_splits.back()));
}

sparse_plan plan_sparse_lookup(const sharded_layout& layout, const sparse_batch& batch, const sparse_request& request,
                               std::string_view operation) {
  const auto invalid = [&](const std::string& what) {
    throw error(errc::invalid_argument, fmt::format("{} of '{}': {}", operation, layout.ref.name, what));
  };
  if (layout.ref.shape.empty()) invalid("a scalar variable has no rows");
  if (name_of(request.how) == "invalid") {
    invalid(fmt::format("unknown combiner {} (sum, mean or sqrtn)", static_cast<int>(request.how)));
  }
  if (request.max_norm && !(*request.max_norm > 0)) invalid(fmt::format("max_norm must be positive, got {}", *request.max_norm));
  const std::size_t n = batch.ids.size();
  if (batch.rows.size() != n) invalid(fmt::format("{} ids but {} row indices (one per id)", n, batch.rows.size()));
  const bool weighted = !batch.weights.empty();
  if (weighted && batch.weights.size() != n) {
    invalid(fmt::format("{} ids but {} weights (one per id, or none for weights of 1)", n, batch.weights.size()));
  }
  // id_map numbers distinct ids in 32 bits.
  if (n > std::numeric_limits<std::uint32_t>::max()) invalid(fmt::format("{} ids are more than one lookup takes", n));
  // The result, and a divisor per row: at least one element's bytes per row even for empty rows.
  const std::size_t row_bytes = std::max(layout.row_elements(), std::size_t{1}) * size_of(layout.ref.type);
  if (batch.dense_rows > std::numeric_limits<std::size_t>::max() / row_bytes) {
    invalid(fmt::format("a result of {} rows of {} bytes is more than memory can address", batch.dense_rows, row_bytes));
  }
  const std::size_t total = layout.rows();
  if (request.default_id && (*request.default_id < 0 || static_cast<std::uint64_t>(*request.default_id) >= total)) {
    invalid(fmt::format("default_id {} is out of range [0, {})", *request.default_id, total));
  }
  for (std::size_t k = 0; k < n; ++k) {
    const std::int64_t row = batch.rows[k];
    if (row < 0 || static_cast<std::uint64_t>(row) >= batch.dense_rows) {
      invalid(fmt::format("row index {} (position {}) is out of range [0, {}) (dense_rows)", row, k, batch.dense_rows));
    }
    if (k > 0 && row < batch.rows[k - 1]) {
      invalid(fmt::format("row indices must be non-decreasing (TF's canonical order): row index {} (position {}) "
                          "follows {}",
                          row, k, batch.rows[k - 1]));
    }
    // The safe lookup drops ids < 0 (TF's _prune_invalid_ids) but not ids past the end.
    if (!(request.safe && batch.ids[k] < 0)) check_id(batch.ids[k], k, total, layout, operation);
  }

  sparse_plan plan;
  plan.dense_rows = batch.dense_rows;
  common::id_map seen(n + 1);
  const auto keep = [&](std::size_t row, std::int64_t id, double weight) {
    const std::size_t index = seen.index_of(id);
    if (index == plan.distinct_ids.size()) plan.distinct_ids.push_back(id);
    plan.rows.push_back(row);
    plan.distinct.push_back(index);
    if (weighted) plan.weights.push_back(weight);
  };
  // TF's sparse_fill_empty_rows: a row left with no entry gets default_id with weight 1.
  std::size_t settled = 0;  // rows [0, settled) have an entry or their default
  const auto settle_rows_below = [&](std::size_t row) {
    if (request.default_id) {
      for (std::size_t r = settled; r < row; ++r) keep(r, *request.default_id, 1.0);
    }
    settled = std::max(settled, row);
  };
  // TF prunes weights only for mean and sqrtn (_prune_invalid_weights: kept when > 0, so NaN goes).
  const bool prune_weights = request.safe && weighted && request.how != combiner::sum;
  for (std::size_t k = 0; k < n; ++k) {
    if (request.safe && batch.ids[k] < 0) continue;
    if (prune_weights && !(batch.weights[k] > 0)) continue;
    const auto row = static_cast<std::size_t>(batch.rows[k]);
    settle_rows_below(row);
    settled = row + 1;
    keep(row, batch.ids[k], weighted ? batch.weights[k] : 1.0);
  }
  settle_rows_below(batch.dense_rows);
  return plan;
}

namespace {

// TF's clip_by_norm on one row: t * max_norm / max(|t|, max_norm), i.e. scaled down only when longer.
template <class T>
void clip_row(T* row, std::size_t elements, T max_norm) {
  T squares = 0;
  for (std::size_t j = 0; j < elements; ++j) squares += row[j] * row[j];
  const T norm = std::sqrt(squares);
  if (!(norm > max_norm)) return;
  for (std::size_t j = 0; j < elements; ++j) row[j] = row[j] * max_norm / norm;
}

// TF's segment sums (weighted: Σ w·row; unweighted: Σ row), then its divisors with div_no_nan.
template <class T>
void combine(const sparse_plan& plan, combiner how, const T* distinct_rows, std::size_t elements, T* out) {
  const bool weighted = !plan.weights.empty();
  std::vector<T> divisor(how == combiner::sum ? 0 : plan.dense_rows, T(0));
  for (std::size_t i = 0; i < plan.rows.size(); ++i) {
    T* to = out + plan.rows[i] * elements;
    const T* from = distinct_rows + plan.distinct[i] * elements;
    const T weight = weighted ? static_cast<T>(plan.weights[i]) : T(1);
    if (weighted) {
      for (std::size_t j = 0; j < elements; ++j) to[j] += from[j] * weight;
    } else {
      for (std::size_t j = 0; j < elements; ++j) to[j] += from[j];
    }
    if (how == combiner::mean) divisor[plan.rows[i]] += weight;
    if (how == combiner::sqrtn) divisor[plan.rows[i]] += weight * weight;
  }
  if (how == combiner::sum) return;
  for (std::size_t r = 0; r < plan.dense_rows; ++r) {
    const T d = how == combiner::sqrtn ? std::sqrt(divisor[r]) : divisor[r];
    T* row = out + r * elements;
    for (std::size_t j = 0; j < elements; ++j) row[j] = d == T(0) ? T(0) : row[j] / d;
  }
}

}  // namespace

template <class T>
asio::awaitable<xt::xarray<T>> sparse_ops<T>::lookup(std::shared_ptr<variable_io> io,
                                                     std::shared_ptr<const sharded_layout> layout, sparse_batch batch,
                                                     sparse_request request, const char* operation) {
  const sparse_plan plan = plan_sparse_lookup(*layout, batch, request, operation);
  batch = {};  // the plan has what is needed; the copy of the caller's ids can go before the wait
  // Planned as the call returns: the plan's ids are not used after it.
  auto gathered = sharded_ops<T>::gather(io, layout, plan.distinct_ids, {plan.distinct_ids.size()}, true, operation, true);
  xt::xarray<T> distinct_rows = co_await std::move(gathered);
  const std::size_t elements = layout->row_elements();
  if (request.max_norm) {
    const auto max_norm = static_cast<T>(*request.max_norm);
    for (std::size_t u = 0; u < plan.distinct_ids.size(); ++u) clip_row(distinct_rows.data() + u * elements, elements, max_norm);
  }
  shape_type shape{plan.dense_rows};
  shape.insert(shape.end(), layout->ref.shape.begin() + 1, layout->ref.shape.end());
  xt::xarray<T> out(shape);
  out.fill(T(0));
  combine(plan, request.how, distinct_rows.data(), elements, out.data());
  co_return out;
}

template <class T>
asio::awaitable<xt::xarray<T>> sparse_ops<T>::failed(std::exception_ptr e) {
  std::rethrow_exception(e);
  co_return xt::xarray<T>{};
}

template struct sparse_ops<float>;
template struct sparse_ops<double>;

}  // namespace detail
}  // namespace pscoro

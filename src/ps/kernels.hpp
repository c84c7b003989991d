// The math a parameter server runs on the bytes of its variables: initializers, element-wise and
// row-wise updates, optimizer steps. Callers (ps_service) decode requests into these domain types
// and validate shapes and ids first; the checks here are the ones only the math knows (parameters,
// divisors), and they run before any write.
#pragma once

#include <pscoro/detail/variable_io.hpp>
#include <pscoro/initializers.hpp>
#include <pscoro/optimizers.hpp>
#include <pscoro/tensor.hpp>

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace pscoro::ps::kernels {

// Initializers.

/// What fills one shard of a variable: the variable's initializer (its seed already mixed with the
/// variable's name, as the chief sends it), the whole variable's shape and the shard's first row.
struct shard_initializer {
  initializer init;
  shape_type full_shape;
  std::uint64_t row_offset = 0;
};

/// "random_normal".
std::string_view initializer_name(const initializer& init);
/// Throws errc::invalid_argument, naming `variable`, when `fill` cannot fill a shard of
/// `shard_shape` (whose size was checked) and `type`: the whole shape must have a size that fits in
/// 64 bits, the shard's rows must lie within it, and the parameters must suit the kind.
void check_initializer(const shard_initializer& fill, dtype type, const shape_type& shard_shape,
                       std::string_view variable);
/// Fills `out`, a shard of `shard_shape`, element i with the value of element
/// (row_offset * row size + i) of the whole variable.
void initialize(const shard_initializer& fill, dtype type, const shape_type& shard_shape, std::byte* out);

// Updates.

/// `destination[i] = destination[i] op source[i]` for n elements of `type`.
void combine(update_op op, dtype type, std::byte* destination, const std::byte* source, std::size_t n);
/// The same per row: row `ids[k]` of `destination` with row k of `rows`, in order.
void scatter(update_op op, dtype type, std::byte* destination, std::span<const std::int64_t> ids,
             const std::byte* rows, std::size_t row_elements);
/// Whether `type` is float32 or float64 (values that can be NaN or Inf, divisors that can be 0).
bool is_float(dtype type);
/// The index of the first zero among n divisors of `type` at `divisors` when `op` is an integer
/// division (n if none, and for other operations and floating types: they never divide by zero).
std::size_t first_zero_divisor(update_op op, dtype type, const std::byte* divisors, std::size_t n);
/// The index of the first NaN or infinity among n elements of `type` at `values` (n if none, and
/// for integer types).
std::size_t first_non_finite(dtype type, const std::byte* values, std::size_t n);

// Optimizers.

// optimizer_name and slots_of are in <pscoro/optimizers.hpp>: the chief names slots by them too.
/// True when `opt` keeps a step count ("<variable>/<optimizer>/iterations", an int64 scalar).
bool counts_steps(const optimizer& opt);
/// Throws errc::invalid_argument naming the bad hyper-parameter.
void check_optimizer(const optimizer& opt);

/// One step over a dense gradient of n elements. `step` is the count after this step (adam).
void apply_dense(const optimizer& opt, dtype type, std::byte* variable, std::span<std::byte* const> slots,
                 std::int64_t step, const std::byte* gradient, std::size_t n);
/// One step over the rows `ids` (valid: each below `variable_rows`; possibly repeated: their
/// gradient rows are summed first).
void apply_sparse(const optimizer& opt, dtype type, std::byte* variable, std::size_t variable_rows,
                  std::span<std::byte* const> slots, std::int64_t step, std::span<const std::int64_t> ids,
                  const std::byte* rows, std::size_t row_elements);

/// The standard normal distribution's quantile of p, for p in (0, 1) (Wichura's AS241: about
/// 1e-16 relative error). The normal initializers map one uniform draw through it.
double normal_quantile(double p) noexcept;

/// One step over the records of a hash table's rows: record k (`records[k]`) holds a row of
/// `row_elements` values followed by the optimizer's slots (slots_of(opt), in order), each a row of
/// as many; its gradient row is k of `gradients`, or gradient_rows[k] when given (as many as
/// records). The same arithmetic as apply_sparse on distinct ids, so a table and a variable holding
/// the same rows end equal, bit for bit.
void apply_records(const optimizer& opt, dtype type, std::span<std::byte* const> records, std::int64_t step,
                   const std::byte* gradients, std::size_t row_elements,
                   std::span<const std::uint32_t> gradient_rows = {});

}  // namespace pscoro::ps::kernels

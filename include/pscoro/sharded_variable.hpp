// A variable split into shards along axis 0, each shard a dense variable on some parameter server
// (TF's ShardedVariable), with whole-variable, row and optimizer operations fanned out to the shards
// concurrently.
//
//   auto table = co_await scope.create_sharded_variable<float>(
//       "embedding", {1'000'000, 16}, pscoro::initializers::random_normal{.stddev = 0.01});
//   auto rows = co_await table.embedding_lookup(ids);                 // ids.shape + [16], input order
//   co_await table.apply_sparse_gradient(pscoro::optimizers::adagrad{.learning_rate = 0.1}, ids, grads);
//
// The row and optimizer operations (sparse_read, embedding_lookup, embedding_lookup_sparse,
// safe_embedding_lookup_sparse, read_rows, scatter_*, apply_gradient, apply_sparse_gradient) and
// their contract are in <pscoro/row_operations.hpp>, shared with variable<T> (one shard).
//
// Rows are laid out as TF's "div" partition (div_offsets): shard i holds rows [offsets[i],
// offsets[i+1]). Handles are cheap to copy and can be worker-function arguments. Ids are checked
// against the row count before anything is sent: a bad id reads and writes nothing. Row operations
// on one shard keep the order of their ids, so every result equals the same operation on a dense
// variable.
#pragma once

#include <pscoro/config.hpp>

#include <pscoro/detail/sharded_io.hpp>
#include <pscoro/row_operations.hpp>
#include <pscoro/variable.hpp>

namespace pscoro {

class checkpoint;

template <class T>
  requires is_element_type_v<T>
class sharded_variable : public row_operations<sharded_variable<T>, T> {
 public:
  using value_type = T;

  /// One shard: its handle and the first row of the whole variable it holds.
  struct shard {
    variable<T> handle;
    std::size_t offset;
  };

  sharded_variable() = default;
  /// Binds `ref` to `io`; throws errc::invalid_argument when `ref` is not a valid "div" layout of T.
  sharded_variable(sharded_variable_ref ref, std::shared_ptr<detail::variable_io> io)
      : layout_(detail::make_layout(checked(std::move(ref)))), io_(std::move(io)) {}

  const std::string& name() const noexcept { return layout_->ref.name; }
  const shape_type& shape() const noexcept { return layout_->ref.shape; }
  static constexpr pscoro::dtype dtype() noexcept { return dtype_of<T>; }
  const sharded_variable_ref& ref() const noexcept { return layout_->ref; }
  std::size_t num_shards() const noexcept { return layout_->num_shards(); }
  /// The shards + 1 row offsets (the last is the row count).
  const std::vector<std::size_t>& offsets() const noexcept { return layout_->offsets; }
  /// The shards in row order, each a dense variable handle with its offset.
  std::vector<shard> shards() const {
    std::vector<shard> out;
    for (std::size_t i = 0; i < num_shards(); ++i) out.push_back({variable<T>(layout_->ref.shards[i], io_), offsets()[i]});
    return out;
  }

  /// The optimizer slot `slot_name` of `optimizer_name` ("adagrad", "accumulator"), sharded like
  /// this variable; it exists on the ps once that optimizer has updated the variable (before:
  /// not_found).
  sharded_variable slot(std::string_view optimizer_name, std::string_view slot_name) const {
    sharded_variable_ref out = ref();
    const std::string suffix = "/" + std::string(optimizer_name) + "/" + std::string(slot_name);
    out.name += suffix;
    for (auto& part : out.shards) part.name += suffix;
    return sharded_variable(std::move(out), io_);
  }

  /// Reads every shard concurrently into one array of shape().
  asio::awaitable<xt::xarray<T>> read() const { return ops::read(io_, layout_); }
  /// Reads into `out` (resized to shape() if it has another shape), reusing its storage: a loop that
  /// reads into the same array allocates nothing. `out` must live until the read completes.
  asio::awaitable<void> read(xt::xarray<T>& out) const { return ops::read_to(io_, layout_, out); }

  /// Replaces the value; `new_value` must have shape() (checked before anything is sent). A
  /// contiguous row-major xarray/xtensor of T passed as an lvalue is sent from its own storage (no
  /// copy): it must live, unchanged, until the returned awaitable completes; a temporary one is
  /// moved in; any other expression is evaluated once. The same holds for assign_add/assign_sub.
  template <class E>
    requires detail::is_expression_v<E>
  asio::awaitable<void> assign(E&& new_value) const {
    return ops::update(io_, layout_, update_op::assign, detail::dense_operand(std::forward<E>(new_value)), "assign");
  }
  template <class E>
    requires detail::is_expression_v<E>
  asio::awaitable<void> assign_add(E&& delta) const {
    return ops::update(io_, layout_, update_op::add, detail::dense_operand(std::forward<E>(delta)), "assign_add");
  }
  template <class E>
    requires detail::is_expression_v<E>
  asio::awaitable<void> assign_sub(E&& delta) const {
    return ops::update(io_, layout_, update_op::sub, detail::dense_operand(std::forward<E>(delta)), "assign_sub");
  }

 private:
  using ops = detail::sharded_ops<T>;

  static sharded_variable_ref checked(sharded_variable_ref ref) {
    if (ref.type != dtype_of<T>) detail::throw_dtype_mismatch(dtype_of<T>, "variable", ref.type, ref.name);
    return ref;
  }

  friend class row_operations<sharded_variable, T>;
  friend class pscoro::checkpoint;
  const std::shared_ptr<const detail::sharded_layout>& row_layout() const noexcept { return layout_; }
  const std::shared_ptr<detail::variable_io>& row_io() const noexcept { return io_; }

  std::shared_ptr<const detail::sharded_layout> layout_ = detail::single_layout({});
  std::shared_ptr<detail::variable_io> io_;
};

template <class T>
struct codec<sharded_variable<T>> {
  static constexpr std::string_view name = "sharded_variable";
  static value encode(const sharded_variable<T>& v) { return v.ref(); }
  static sharded_variable<T> decode(value&& v, const decode_context& context) {
    auto* ref = std::get_if<sharded_variable_ref>(&v);
    if (!ref) detail::throw_decode_mismatch(name, v);
    return sharded_variable<T>(std::move(*ref), context.variables);
  }
};

}  // namespace pscoro

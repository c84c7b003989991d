// A handle to a dense variable on a parameter server, usable from the coordinator and workers.
//
// Handles are cheap to copy and can be passed to worker functions: the worker gets a handle bound
// to its own connections to the parameter servers. Every operation is one round trip to the ps
// that holds the variable, which checks dtype, shape and ids before it changes anything. The row
// and optimizer operations (sparse_read, embedding_lookup, scatter_*, apply_gradient,
// apply_sparse_gradient) are those of sharded_variable<T>, a dense variable being one shard: see
// <pscoro/row_operations.hpp>.
#pragma once

#include <pscoro/config.hpp>

#include <pscoro/detail/variable_io.hpp>
#include <pscoro/detail/xtensor.hpp>
#include <pscoro/row_operations.hpp>
#include <pscoro/value.hpp>
#include <pscoro/xtensor.hpp>

#include <asio/awaitable.hpp>

#include <memory>
#include <string>
#include <string_view>

namespace pscoro {

class checkpoint;

template <class T>
  requires is_element_type_v<T>
class variable : public row_operations<variable<T>, T> {
 public:
  using value_type = T;

  variable() = default;
  variable(variable_ref ref, std::shared_ptr<detail::variable_io> io)
      : layout_(detail::single_layout(std::move(ref))), io_(std::move(io)) {}

  const std::string& name() const noexcept { return ref().name; }
  const shape_type& shape() const noexcept { return ref().shape; }
  static constexpr pscoro::dtype dtype() noexcept { return dtype_of<T>; }
  /// The index of the ps task that holds the variable.
  int ps_task() const noexcept { return ref().ps_task; }
  const variable_ref& ref() const noexcept { return layout_->ref.shards.front(); }

  /// The optimizer slot `slot_name` of `optimizer_name` ("adagrad", "accumulator"), on this
  /// variable's ps; it exists once that optimizer has updated the variable (before: not_found).
  variable slot(std::string_view optimizer_name, std::string_view slot_name) const {
    variable_ref out = ref();
    out.name += "/" + std::string(optimizer_name) + "/" + std::string(slot_name);
    return variable(std::move(out), io_);
  }

  /// Reads the current value (received straight into the result's storage).
  asio::awaitable<xt::xarray<T>> read() const { return detail::sharded_ops<T>::read(io_, layout_); }
  /// Reads into `out` (resized to shape() if it has another shape), reusing its storage: a loop that
  /// reads into the same array allocates nothing. `out` must live until the read completes.
  asio::awaitable<void> read(xt::xarray<T>& out) const { return detail::sharded_ops<T>::read_to(io_, layout_, out); }
  /// Reads the current value as a tensor (no conversion).
  asio::awaitable<tensor> read_tensor() const { return read_as_tensor(io_, ref()); }

  /// Replaces the value; `new_value` must have the variable's shape. A contiguous row-major
  /// xarray/xtensor of T passed as an lvalue is sent from its own storage (no copy): it must live,
  /// unchanged, until the returned awaitable completes; a temporary one is moved in; any other
  /// expression is evaluated once. The same holds for assign_add/assign_sub.
  template <class E>
    requires detail::is_expression_v<E>
  asio::awaitable<void> assign(E&& new_value) const {
    return apply(io_, ref(), update_op::assign, detail::dense_operand(std::forward<E>(new_value)));
  }
  /// Adds `delta` element-wise.
  template <class E>
    requires detail::is_expression_v<E>
  asio::awaitable<void> assign_add(E&& delta) const {
    return apply(io_, ref(), update_op::add, detail::dense_operand(std::forward<E>(delta)));
  }
  /// Subtracts `delta` element-wise.
  template <class E>
    requires detail::is_expression_v<E>
  asio::awaitable<void> assign_sub(E&& delta) const {
    return apply(io_, ref(), update_op::sub, detail::dense_operand(std::forward<E>(delta)));
  }
  /// Applies `op` with a tensor already in wire form (no conversion).
  asio::awaitable<void> update(update_op op, tensor operand) const { return apply(io_, ref(), op, std::move(operand)); }

 private:
  // Static and by value: an awaitable must not depend on the handle staying alive, and every
  // failure (an unbound handle too) surfaces where it is awaited.
  static detail::variable_io& bound(const std::shared_ptr<detail::variable_io>& io, const variable_ref& ref) {
    if (!io) throw error(errc::failed_precondition, "variable handle '" + ref.name + "' is not bound");
    return *io;
  }
  static asio::awaitable<tensor> read_as_tensor(std::shared_ptr<detail::variable_io> io, variable_ref ref) {
    co_return co_await bound(io, ref).read(std::move(ref), {});
  }
  static asio::awaitable<void> apply(std::shared_ptr<detail::variable_io> io, variable_ref ref, update_op op,
                                     tensor operand) {
    co_await bound(io, ref).update(std::move(ref), op, std::move(operand));
  }

  friend class row_operations<variable, T>;
  friend class pscoro::checkpoint;
  const std::shared_ptr<const detail::sharded_layout>& row_layout() const noexcept { return layout_; }
  const std::shared_ptr<detail::variable_io>& row_io() const noexcept { return io_; }

  // A dense variable is a sharded one of one shard: its layout, made once, serves every read and
  // row operation (and holds its ref, shards[0]).
  std::shared_ptr<const detail::sharded_layout> layout_ = detail::single_layout({});
  std::shared_ptr<detail::variable_io> io_;
};

template <class T>
struct codec<variable<T>> {
  static constexpr std::string_view name = "variable";
  static value encode(const variable<T>& v) { return v.ref(); }
  static variable<T> decode(value&& v, const decode_context& context) {
    auto* ref = std::get_if<variable_ref>(&v);
    if (!ref) detail::throw_decode_mismatch("variable", v);
    if (ref->type != dtype_of<T>) detail::throw_dtype_mismatch(dtype_of<T>, "variable", ref->type, ref->name);
    return variable<T>(std::move(*ref), context.variables);
  }
};

template <class T>
struct codec<xt::xarray<T>> {
  static constexpr std::string_view name = "xarray";
  static value encode(const xt::xarray<T>& v) { return to_tensor(v); }
  static xt::xarray<T> decode(value&& v, const decode_context&) {
    auto* t = std::get_if<tensor>(&v);
    if (!t) detail::throw_decode_mismatch("tensor", v);
    return to_xarray<T>(*t);
  }
};

}  // namespace pscoro

// Conversions between pscoro::tensor and xtensor containers (one copy each way).
#pragma once

#include <pscoro/config.hpp>

#include <pscoro/detail/xtensor.hpp>
#include <pscoro/dtype.hpp>
#include <pscoro/tensor.hpp>

#include <algorithm>
#include <type_traits>

namespace pscoro {

namespace detail {
/// `e` evaluated once: the container itself, or a new xarray of its values. Not xt::eval: xtensor
/// 0.24 evaluates `a * 2.0f` of a 2-D xarray `a` into a 4-D tensor of shape [2^64 - 1, 2^64 - 1] +
/// a's shape.
template <class E>
decltype(auto) evaluated(const E& e) {
  if constexpr (std::is_base_of_v<xt::xcontainer<E>, E>) {
    return (e);
  } else {
    return xt::xarray<typename E::value_type>(e);
  }
}
}  // namespace detail

/// Evaluates `expr` once and copies its elements into a new tensor.
template <class E>
tensor to_tensor(const xt::xexpression<E>& expr) {
  using value_type = typename E::value_type;
  static_assert(is_element_type_v<value_type>, "pscoro tensors hold float, double, int32 or int64");
  const auto& evaluated = detail::evaluated(expr.derived_cast());
  shape_type shape(evaluated.shape().begin(), evaluated.shape().end());
  tensor out = tensor::uninitialized(dtype_of<value_type>, std::move(shape));
  std::copy(evaluated.begin(), evaluated.end(), out.mutable_data<value_type>());
  return out;
}

/// Copies `t` into an xarray of T; throws errc::invalid_argument when its dtype is not T's.
template <class T>
xt::xarray<T> to_xarray(const tensor& t) {
  if (t.type() != dtype_of<T>) detail::throw_dtype_mismatch(dtype_of<T>, "tensor", t.type());
  xt::xarray<T> out(t.shape());
  std::copy_n(t.data<T>(), t.size(), out.data());
  return out;
}

}  // namespace pscoro

// Tensors, xtensor conversions and the codecs that carry worker-function arguments.
#include "test_support.hpp"

#include <pscoro/variable.hpp>
#include <pscoro/worker_function.hpp>
#include <pscoro/xtensor.hpp>

#include <cstdint>
#include <limits>

using namespace pscoro;

TEST_CASE_TEMPLATE("an xarray survives the trip through a tensor", T, float, double, std::int32_t, std::int64_t) {
  const xt::xarray<T> original{{1, 2, 3}, {4, 5, 6}};
  const tensor t = to_tensor(original);
  CHECK(t.type() == dtype_of<T>);
  CHECK(t.shape() == shape_type{2, 3});
  CHECK(t.size_bytes() == 6 * sizeof(T));
  const auto back = to_xarray<T>(t);
  CHECK((back == original));
  // An expression is evaluated once, into a tensor of its own.
  const tensor sum = to_tensor(original + original);
  CHECK(sum.data<T>()[5] == T(12));
}

TEST_CASE_TEMPLATE("reading a tensor as the wrong element type names both types", T, float, double) {
  const tensor t = to_tensor(xt::xarray<std::int32_t>{1, 2});
  const std::string expected = "expected a " + std::string(name_of(dtype_of<T>)) + " tensor, got int32";
  CHECK_THROWS_WITH_AS((void)to_xarray<T>(t), expected.c_str(), error);
}

TEST_CASE("a scalar tensor has one element and an empty shape") {
  const tensor t = to_tensor(xt::xarray<double>(3.5));
  CHECK(t.shape().empty());
  CHECK(t.size() == 1);
  CHECK(to_xarray<double>(t)() == 3.5);
}

TEST_CASE("integers are range-checked in both directions") {
  CHECK(std::get<std::int64_t>(codec<std::uint8_t>::encode(200)) == 200);
  CHECK_THROWS_WITH_AS(codec<std::uint64_t>::encode(std::numeric_limits<std::uint64_t>::max()),
                       doctest::Contains("does not fit in int64"), error);
  CHECK(codec<std::int8_t>::decode(value(std::int64_t{-128}), {}) == -128);
  CHECK_THROWS_WITH_AS((void)codec<std::int8_t>::decode(value(std::int64_t{300}), {}),
                       doctest::Contains("integer 300 is out of range"), error);
  CHECK_THROWS_WITH_AS((void)codec<std::uint32_t>::decode(value(std::int64_t{-1}), {}),
                       doctest::Contains("integer -1 is out of range"), error);
}

TEST_CASE("a value of another kind is refused with both kinds named") {
  CHECK_THROWS_WITH_AS((void)codec<std::string>::decode(value(2.5), {}), "expected string, got float64", error);
  CHECK_THROWS_WITH_AS((void)codec<bool>::decode(value(std::string("yes")), {}), "expected bool, got string", error);
  CHECK_THROWS_WITH_AS((void)codec<xt::xarray<float>>::decode(value(std::int64_t{1}), {}),
                       "expected tensor, got int64", error);
  const variable_ref ref{"w", dtype::float64, {3}, 1};
  CHECK_THROWS_WITH_AS((void)codec<variable<float>>::decode(value(ref), {}),
                       "expected a float32 variable, got 'w' of float64", error);
  CHECK(describe(value(ref)) == "variable 'w' <float64>[3]");
  CHECK(describe(value(to_tensor(xt::xarray<float>{{1, 2}}))) == "tensor<float32>[1, 2]");
}

TEST_CASE("a worker function's signature names its wire types") {
  const worker_function<double(variable<float>, std::int64_t, std::string, xt::xarray<float>)> f{"f"};
  CHECK(f.signature() == "float64(variable,int64,string,xarray)");
  CHECK(worker_function<void()>{"g"}.signature() == "void()");
}

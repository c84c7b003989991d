// Initializers that a parameter server evaluates itself, shard by shard.
//
//   auto table = co_await scope.create_sharded_variable<float>(
//       "embedding", {1'000'000, 16}, pscoro::initializers::random_normal{.stddev = 0.01, .seed = 7});
//
// The value of each element is a function of the seed, the variable's name and the element's index in
// the whole variable: a variable has the same values whatever the number of its shards, and no full
// tensor is ever built on the coordinator. Two variables with the same seed get different values
// (the name is mixed in). Defaults are Keras's. The random streams are pscoro's own (counter-based),
// not TF's: the same seed does not give TF's numbers.
#pragma once

#include <pscoro/config.hpp>

#include <cstdint>
#include <variant>

namespace pscoro {
namespace initializers {

struct zeros {};
struct ones {};
struct constant {
  double value = 0;
};
/// Uniform in [minval, maxval).
struct random_uniform {
  double minval = -0.05;
  double maxval = 0.05;
  std::uint64_t seed = 0;
};
struct random_normal {
  double mean = 0;
  double stddev = 0.05;
  std::uint64_t seed = 0;
};
/// Normal, redrawn until within two standard deviations of the mean.
struct truncated_normal {
  double mean = 0;
  double stddev = 0.05;
  std::uint64_t seed = 0;
};
/// Uniform in [-limit, limit), limit = sqrt(6 / (fan_in + fan_out)) of the whole variable's shape.
struct glorot_uniform {
  std::uint64_t seed = 0;
};

}  // namespace initializers

using initializer = std::variant<initializers::zeros, initializers::ones, initializers::constant,
                                 initializers::random_uniform, initializers::random_normal,
                                 initializers::truncated_normal, initializers::glorot_uniform>;

}  // namespace pscoro

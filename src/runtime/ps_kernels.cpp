#include "runtime/ps_kernels.hpp"

#include "runtime/id_map.hpp"

#include <pscoro/error.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <numeric>
#include <type_traits>

namespace pscoro::runtime::kernels {

namespace {

[[noreturn]] void invalid(std::string message) { throw error(errc::invalid_argument, std::move(message)); }

bool is_float(dtype type) { return type == dtype::float32 || type == dtype::float64; }

// ---- Initializers -------------------------------------------------------------------------------

// splitmix64's output function. Element i of a variable draws from the splitmix64 stream of its
// seed at position i (and, for its further draws, a second mix): a counter-based generator, so any
// element is computed without the ones before it.
constexpr std::uint64_t mix64(std::uint64_t z) noexcept {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

constexpr std::uint64_t random_bits(std::uint64_t seed, std::uint64_t element, std::uint64_t draw) noexcept {
  const std::uint64_t base = mix64(seed + 0x9e3779b97f4a7c15ULL * (element + 1));
  return draw == 0 ? base : mix64(base ^ (0xd1b54a32d192ed03ULL * draw));
}

// In [0, 1), 53 random bits.
double uniform01(std::uint64_t bits) noexcept { return static_cast<double>(bits >> 11) * 0x1.0p-53; }

// A standard normal by Box-Muller from draws 2k and 2k+1.
double standard_normal(std::uint64_t seed, std::uint64_t element, std::uint64_t k) noexcept {
  const double u1 = 1.0 - uniform01(random_bits(seed, element, 2 * k));  // (0, 1]: log is finite
  const double u2 = uniform01(random_bits(seed, element, 2 * k + 1));
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

double truncated_standard_normal(std::uint64_t seed, std::uint64_t element) noexcept {
  // Redrawn while beyond two standard deviations (4.6% of draws); 64 misses in a row have
  // probability 1e-85, and then the last draw is clamped rather than looping on.
  double z = 0;
  for (std::uint64_t k = 0; k < 64; ++k) {
    z = standard_normal(seed, element, k);
    if (std::abs(z) <= 2.0) return z;
  }
  return std::clamp(z, -2.0, 2.0);
}

// Keras's fans (initializers._compute_fans).
std::pair<double, double> fans(std::span<const std::uint64_t> shape) {
  if (shape.empty()) return {1, 1};
  if (shape.size() == 1) return {double(shape[0]), double(shape[0])};
  if (shape.size() == 2) return {double(shape[0]), double(shape[1])};
  double receptive = 1;
  for (std::size_t i = 0; i + 2 < shape.size(); ++i) receptive *= double(shape[i]);
  return {double(shape[shape.size() - 2]) * receptive, double(shape.back()) * receptive};
}

std::string_view kind_name(wire::Initializer::Kind kind) {
  switch (kind) {
    case wire::Initializer::ZEROS: return "zeros";
    case wire::Initializer::ONES: return "ones";
    case wire::Initializer::CONSTANT: return "constant";
    case wire::Initializer::RANDOM_UNIFORM: return "random_uniform";
    case wire::Initializer::RANDOM_NORMAL: return "random_normal";
    case wire::Initializer::TRUNCATED_NORMAL: return "truncated_normal";
    case wire::Initializer::GLOROT_UNIFORM: return "glorot_uniform";
    default: return "unknown";
  }
}

template <class T>
T cast_constant(double value) {
  if constexpr (std::is_integral_v<T>) {
    if (!(value >= double(std::numeric_limits<T>::min()) && value <= double(std::numeric_limits<T>::max())) ||
        std::trunc(value) != value) {
      invalid(fmt::format("constant initializer {} is not a value of an integer variable", value));
    }
  }
  return static_cast<T>(value);
}

// ---- Element-wise operations ----------------------------------------------------------------------

// Integers wrap (two's complement) instead of overflowing into undefined behaviour; x / -1 is a
// negation for the same reason. Divisors of zero are refused before any write (check_divisors).
template <class T>
struct ops {
  using U = std::make_unsigned_t<std::conditional_t<std::is_integral_v<T>, T, int>>;
  static T add(T a, T b) {
    if constexpr (std::is_integral_v<T>) return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
    else return a + b;
  }
  static T sub(T a, T b) {
    if constexpr (std::is_integral_v<T>) return static_cast<T>(static_cast<U>(a) - static_cast<U>(b));
    else return a - b;
  }
  static T mul(T a, T b) {
    if constexpr (std::is_integral_v<T>) return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
    else return a * b;
  }
  static T div(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      if (b == -1) return static_cast<T>(U{0} - static_cast<U>(a));
    }
    return a / b;
  }
};

// Calls f(binary operation) for `op`, so each loop is compiled per operation.
template <class T, class F>
void with_op(wire::UpdateVariable::Op op, F&& f) {
  switch (op) {
    case wire::UpdateVariable::ASSIGN: return f([](T, T b) { return b; });
    case wire::UpdateVariable::ADD: return f(&ops<T>::add);
    case wire::UpdateVariable::SUB: return f(&ops<T>::sub);
    case wire::UpdateVariable::MUL: return f(&ops<T>::mul);
    case wire::UpdateVariable::DIV: return f(&ops<T>::div);
    case wire::UpdateVariable::MIN: return f([](T a, T b) { return std::min(a, b); });
    case wire::UpdateVariable::MAX: return f([](T a, T b) { return std::max(a, b); });
    default: invalid(fmt::format("unknown update operation {}", static_cast<int>(op)));
  }
}

// ---- Optimizers ---------------------------------------------------------------------------------

// One optimizer's update of n elements; slot pointers are offset like the variable's.
template <class T>
struct step_math {
  const wire::Optimizer& opt;
  T lr;
  T adam_alpha;  // lr * sqrt(1 - beta_2^t) / (1 - beta_1^t)

  step_math(const wire::Optimizer& o, std::int64_t step) : opt(o), lr(static_cast<T>(o.learning_rate())), adam_alpha(0) {
    if (o.kind() == wire::Optimizer::ADAM) {
      const double t = static_cast<double>(step);
      adam_alpha = static_cast<T>(o.learning_rate() * std::sqrt(1 - std::pow(o.beta_2(), t)) /
                                  (1 - std::pow(o.beta_1(), t)));
    }
  }

  void operator()(T* var, T* const* slots, std::size_t offset, const T* g, std::size_t n) const {
    var += offset;
    switch (opt.kind()) {
      case wire::Optimizer::SGD:
        for (std::size_t i = 0; i < n; ++i) var[i] -= lr * g[i];
        return;
      case wire::Optimizer::MOMENTUM: {
        T* velocity = slots[0] + offset;
        const T momentum = static_cast<T>(opt.momentum());
        for (std::size_t i = 0; i < n; ++i) {
          velocity[i] = momentum * velocity[i] - lr * g[i];
          var[i] += opt.nesterov() ? momentum * velocity[i] - lr * g[i] : velocity[i];
        }
        return;
      }
      case wire::Optimizer::ADAGRAD: {
        T* accumulator = slots[0] + offset;
        const T epsilon = static_cast<T>(opt.epsilon());
        for (std::size_t i = 0; i < n; ++i) {
          accumulator[i] += g[i] * g[i];
          var[i] -= lr * g[i] / (std::sqrt(accumulator[i]) + epsilon);
        }
        return;
      }
      case wire::Optimizer::ADAM: {
        T* m = slots[0] + offset;
        T* v = slots[1] + offset;
        const T one_minus_beta_1 = static_cast<T>(1 - opt.beta_1());
        const T one_minus_beta_2 = static_cast<T>(1 - opt.beta_2());
        const T epsilon = static_cast<T>(opt.epsilon());
        for (std::size_t i = 0; i < n; ++i) {
          m[i] += (g[i] - m[i]) * one_minus_beta_1;
          v[i] += (g[i] * g[i] - v[i]) * one_minus_beta_2;
          var[i] -= m[i] * adam_alpha / (std::sqrt(v[i]) + epsilon);
        }
        return;
      }
      case wire::Optimizer::FTRL: {
        T* accumulator = slots[0] + offset;
        T* linear = slots[1] + offset;
        const T power = static_cast<T>(-opt.learning_rate_power());
        const T l1 = static_cast<T>(opt.l1());
        // Keras folds beta into l2: l2 + beta / (2 lr).
        const T l2 = static_cast<T>(opt.l2() + opt.beta() / (2 * opt.learning_rate()));
        for (std::size_t i = 0; i < n; ++i) {
          const T accumulated = accumulator[i] + g[i] * g[i];
          const T new_power = std::pow(accumulated, power);
          linear[i] += g[i] - (new_power - std::pow(accumulator[i], power)) / lr * var[i];
          const T quadratic = new_power / lr + 2 * l2;
          var[i] = std::abs(linear[i]) > l1 ? (std::copysign(l1, linear[i]) - linear[i]) / quadratic : T(0);
          accumulator[i] = accumulated;
        }
        return;
      }
      default: invalid(fmt::format("unknown optimizer {}", static_cast<int>(opt.kind())));
    }
  }
};

template <class T>
std::vector<T*> typed(std::span<std::byte* const> slots) {
  std::vector<T*> out;
  for (auto* s : slots) out.push_back(reinterpret_cast<T*>(s));
  return out;
}

void require(bool condition, const wire::Optimizer& opt, std::string_view what, double value) {
  if (!condition) invalid(fmt::format("{}: {} (got {})", optimizer_name(opt), what, value));
}

}  // namespace

void check_initializer(const wire::Initializer& init, dtype type, const shape_type& shard_shape,
                       std::string_view variable) {
  const auto name = kind_name(init.kind());
  auto refuse = [&](std::string_view what) { invalid(fmt::format("create of '{}': {}", variable, what)); };
  if (name == "unknown") refuse(fmt::format("unknown initializer {}", static_cast<int>(init.kind())));
  const auto& full = init.full_shape();
  const shape_type full_shape(full.begin(), full.end());
  const bool same_rank = full_shape.size() == shard_shape.size();
  if (!same_rank || !std::equal(shard_shape.begin() + (shard_shape.empty() ? 0 : 1), shard_shape.end(),
                                full_shape.begin() + (full_shape.empty() ? 0 : 1))) {
    refuse(fmt::format("{} initializer: a shard of shape {} cannot belong to a variable of shape {}", name,
                       to_string(shard_shape), to_string(full_shape)));
  }
  // Element i of the shard is element row_offset * row size + i of the whole variable: a whole
  // shape whose size fits in 64 bits keeps that index exact.
  if (!checked_size_bytes(type, full_shape)) {
    refuse(fmt::format("{} initializer: the whole variable's shape {} is too large (its size in bytes does not fit "
                       "in 64 bits)",
                       name, to_string(full_shape)));
  }
  if (!shard_shape.empty() && (init.row_offset() > full[0] || shard_shape[0] > full[0] - init.row_offset())) {
    refuse(fmt::format("{} initializer: {} rows from row {} are outside the variable's {} rows", name,
                       shard_shape[0], init.row_offset(), full[0]));
  }
  if (shard_shape.empty() && init.row_offset() != 0) refuse(fmt::format("{} initializer: a scalar has no rows", name));
  const bool random = init.kind() >= wire::Initializer::RANDOM_UNIFORM;
  if (random && !is_float(type)) {
    refuse(fmt::format("{} initializer needs a float32 or float64 variable, not {}", name, name_of(type)));
  }
  if (!std::isfinite(init.a()) || !std::isfinite(init.b())) {
    refuse(fmt::format("{} initializer: parameters must be finite (got {} and {})", name, init.a(), init.b()));
  }
  if (init.kind() == wire::Initializer::RANDOM_UNIFORM && init.a() > init.b()) {
    refuse(fmt::format("random_uniform initializer: minval {} is above maxval {}", init.a(), init.b()));
  }
  if ((init.kind() == wire::Initializer::RANDOM_NORMAL || init.kind() == wire::Initializer::TRUNCATED_NORMAL) &&
      init.b() < 0) {
    refuse(fmt::format("{} initializer: stddev must not be negative (got {})", name, init.b()));
  }
  if (init.kind() == wire::Initializer::CONSTANT) {
    visit_dtype(type, [&](auto zero) {
      try {
        (void)cast_constant<decltype(zero)>(init.a());
      } catch (const error& e) {
        refuse(e.what());
      }
    });
  }
}

void initialize(const wire::Initializer& init, dtype type, const shape_type& shard_shape, std::byte* out) {
  const std::size_t n = num_elements(shard_shape);
  const std::size_t row = shard_shape.empty() ? 1 : num_elements(std::span(shard_shape).subspan(1));
  const std::uint64_t first = init.row_offset() * row;
  const std::uint64_t seed = init.seed();
  visit_dtype(type, [&](auto zero) {
    using T = decltype(zero);
    T* values = reinterpret_cast<T*>(out);
    switch (init.kind()) {
      case wire::Initializer::ZEROS: std::fill_n(values, n, T(0)); return;
      case wire::Initializer::ONES: std::fill_n(values, n, T(1)); return;
      case wire::Initializer::CONSTANT: std::fill_n(values, n, cast_constant<T>(init.a())); return;
      default: break;
    }
    if constexpr (std::is_floating_point_v<T>) {
      const double a = init.a();
      const double b = init.b();
      switch (init.kind()) {
        case wire::Initializer::RANDOM_UNIFORM:
          for (std::size_t i = 0; i < n; ++i) values[i] = T(a + (b - a) * uniform01(random_bits(seed, first + i, 0)));
          return;
        case wire::Initializer::RANDOM_NORMAL:
          for (std::size_t i = 0; i < n; ++i) values[i] = T(a + b * standard_normal(seed, first + i, 0));
          return;
        case wire::Initializer::TRUNCATED_NORMAL:
          for (std::size_t i = 0; i < n; ++i) values[i] = T(a + b * truncated_standard_normal(seed, first + i));
          return;
        case wire::Initializer::GLOROT_UNIFORM: {
          const auto [fan_in, fan_out] = fans({init.full_shape().data(), static_cast<std::size_t>(init.full_shape().size())});
          const double limit = std::sqrt(6.0 / std::max(1.0, fan_in + fan_out));
          for (std::size_t i = 0; i < n; ++i) {
            values[i] = T(limit * (2 * uniform01(random_bits(seed, first + i, 0)) - 1));
          }
          return;
        }
        default: break;
      }
    }
    invalid(fmt::format("initializer {} cannot fill a {} variable", kind_name(init.kind()), name_of(type)));
  });
}

void combine(wire::UpdateVariable::Op op, dtype type, std::byte* destination, const std::byte* source, std::size_t n) {
  visit_dtype(type, [&](auto zero) {
    using T = decltype(zero);
    T* d = reinterpret_cast<T*>(destination);
    const T* s = reinterpret_cast<const T*>(source);
    with_op<T>(op, [&](auto f) {
      for (std::size_t i = 0; i < n; ++i) d[i] = f(d[i], s[i]);
    });
  });
}

void scatter(wire::UpdateVariable::Op op, dtype type, std::byte* destination, std::span<const std::int64_t> ids,
             const std::byte* rows, std::size_t row_elements) {
  visit_dtype(type, [&](auto zero) {
    using T = decltype(zero);
    T* d = reinterpret_cast<T*>(destination);
    const T* s = reinterpret_cast<const T*>(rows);
    with_op<T>(op, [&](auto f) {
      for (std::size_t k = 0; k < ids.size(); ++k) {
        T* row = d + static_cast<std::size_t>(ids[k]) * row_elements;
        const T* from = s + k * row_elements;
        for (std::size_t i = 0; i < row_elements; ++i) row[i] = f(row[i], from[i]);
      }
    });
  });
}

void check_divisors(wire::UpdateVariable::Op op, dtype type, const std::byte* source, std::size_t n) {
  if (op != wire::UpdateVariable::DIV || is_float(type)) return;
  visit_dtype(type, [&](auto zero) {
    using T = decltype(zero);
    const T* s = reinterpret_cast<const T*>(source);
    const auto* found = std::find(s, s + n, T(0));
    if (found != s + n) {
      invalid(fmt::format("integer division by zero (element {} of the divisor)", found - s));
    }
  });
}

std::size_t first_non_finite(dtype type, const std::byte* values, std::size_t n) {
  return visit_dtype(type, [&](auto zero) -> std::size_t {
    using T = decltype(zero);
    if constexpr (std::is_floating_point_v<T>) {
      const T* v = reinterpret_cast<const T*>(values);
      return static_cast<std::size_t>(std::find_if(v, v + n, [](T x) { return !std::isfinite(x); }) - v);
    } else {
      return n;
    }
  });
}

std::string optimizer_name(const wire::Optimizer& opt) {
  switch (opt.kind()) {
    case wire::Optimizer::SGD: return "sgd";
    case wire::Optimizer::MOMENTUM: return "momentum";
    case wire::Optimizer::ADAGRAD: return "adagrad";
    case wire::Optimizer::ADAM: return "adam";
    case wire::Optimizer::FTRL: return "ftrl";
    default: return fmt::format("optimizer {}", static_cast<int>(opt.kind()));
  }
}

std::vector<slot_spec> slots_of(const wire::Optimizer& opt) {
  switch (opt.kind()) {
    case wire::Optimizer::MOMENTUM: return {{"momentum", 0}};
    case wire::Optimizer::ADAGRAD: return {{"accumulator", opt.initial_accumulator_value()}};
    case wire::Optimizer::ADAM: return {{"m", 0}, {"v", 0}};
    case wire::Optimizer::FTRL: return {{"accumulator", opt.initial_accumulator_value()}, {"linear", 0}};
    default: return {};
  }
}

bool counts_steps(const wire::Optimizer& opt) { return opt.kind() == wire::Optimizer::ADAM; }

void check_optimizer(const wire::Optimizer& opt) {
  if (optimizer_name(opt).starts_with("optimizer ")) invalid(fmt::format("unknown optimizer {}", int(opt.kind())));
  const double lr = opt.learning_rate();
  require(std::isfinite(lr) && lr > 0, opt, "learning_rate must be positive", lr);
  switch (opt.kind()) {
    case wire::Optimizer::MOMENTUM:
      require(opt.momentum() >= 0 && opt.momentum() <= 1, opt, "momentum must be in [0, 1]", opt.momentum());
      break;
    case wire::Optimizer::ADAGRAD:
      require(opt.initial_accumulator_value() >= 0 && std::isfinite(opt.initial_accumulator_value()), opt,
              "initial_accumulator_value must not be negative", opt.initial_accumulator_value());
      require(opt.epsilon() >= 0 && std::isfinite(opt.epsilon()), opt, "epsilon must not be negative", opt.epsilon());
      break;
    case wire::Optimizer::ADAM:
      require(opt.beta_1() >= 0 && opt.beta_1() < 1, opt, "beta_1 must be in [0, 1)", opt.beta_1());
      require(opt.beta_2() >= 0 && opt.beta_2() < 1, opt, "beta_2 must be in [0, 1)", opt.beta_2());
      require(opt.epsilon() >= 0 && std::isfinite(opt.epsilon()), opt, "epsilon must not be negative", opt.epsilon());
      break;
    case wire::Optimizer::FTRL:
      // TF's conditions (ftrl.py): "needs to be negative or zero", "positive or zero".
      require(opt.learning_rate_power() <= 0, opt, "learning_rate_power needs to be negative or zero",
              opt.learning_rate_power());
      require(opt.initial_accumulator_value() >= 0 && std::isfinite(opt.initial_accumulator_value()), opt,
              "initial_accumulator_value needs to be positive or zero", opt.initial_accumulator_value());
      require(opt.l1() >= 0, opt, "l1 needs to be positive or zero", opt.l1());
      require(opt.l2() >= 0, opt, "l2 needs to be positive or zero", opt.l2());
      require(opt.beta() >= 0, opt, "beta needs to be positive or zero", opt.beta());
      // With power 0 and an empty accumulator, accum^0 = 1; with power < 0, 0^(-p) = 0: both fine.
      break;
    default: break;
  }
}

void apply_dense(const wire::Optimizer& opt, dtype type, std::byte* variable, std::span<std::byte* const> slots,
                 std::int64_t step, const std::byte* gradient, std::size_t n) {
  visit_dtype(type, [&](auto zero) {
    using T = decltype(zero);
    if constexpr (std::is_floating_point_v<T>) {
      const auto typed_slots = typed<T>(slots);
      step_math<T>(opt, step)(reinterpret_cast<T*>(variable), typed_slots.data(), 0,
                              reinterpret_cast<const T*>(gradient), n);
    } else {
      invalid(fmt::format("{} updates float32 or float64 variables, not {}", optimizer_name(opt), name_of(type)));
    }
  });
}

void apply_sparse(const wire::Optimizer& opt, dtype type, std::byte* variable, std::span<std::byte* const> slots,
                  std::int64_t step, std::span<const std::int64_t> ids, const std::byte* rows,
                  std::size_t row_elements) {
  visit_dtype(type, [&](auto zero) {
    using T = decltype(zero);
    if constexpr (std::is_floating_point_v<T>) {
      const T* g = reinterpret_cast<const T*>(rows);
      // Duplicates are summed first, in input order (TF's _deduplicate_indexed_slices): one step per
      // distinct row.
      id_map rows_seen(ids.size());
      std::vector<std::int64_t> distinct;
      std::vector<T> summed;
      for (std::size_t k = 0; k < ids.size(); ++k) {
        const std::size_t index = rows_seen.index_of(ids[k]);
        const T* from = g + k * row_elements;
        if (index == distinct.size()) {
          distinct.push_back(ids[k]);
          summed.insert(summed.end(), from, from + row_elements);
        } else {
          T* into = summed.data() + index * row_elements;
          for (std::size_t i = 0; i < row_elements; ++i) into[i] += from[i];
        }
      }
      const auto typed_slots = typed<T>(slots);
      const step_math<T> math(opt, step);
      for (std::size_t u = 0; u < distinct.size(); ++u) {
        math(reinterpret_cast<T*>(variable), typed_slots.data(), static_cast<std::size_t>(distinct[u]) * row_elements,
             summed.data() + u * row_elements, row_elements);
      }
    } else {
      invalid(fmt::format("{} updates float32 or float64 variables, not {}", optimizer_name(opt), name_of(type)));
    }
  });
}

}  // namespace pscoro::runtime::kernels

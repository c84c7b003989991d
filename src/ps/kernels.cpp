#include "ps/kernels.hpp"

#include "common/id_map.hpp"
#include "common/rows.hpp"

#include <pscoro/error.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <numbers>
#include <numeric>
#include <type_traits>
#include <variant>

namespace pscoro::ps::kernels {

double normal_quantile(double p) noexcept {
  // Wichura, "Algorithm AS241: The Percentage Points of the Normal Distribution" (PPND16),
  // Applied Statistics 37(3), 1988: rational approximations good to about 1e-16, central for
  // |p - 0.5| <= 0.425, then in sqrt(-log(tail)) up to 5 and beyond.
  const double q = p - 0.5;
  if (std::abs(q) <= 0.425) {
    const double r = 0.180625 - q * q;
    const double num = (((((((2509.0809287301226727 * r + 33430.575583588128105) * r + 67265.770927008700853) * r +
                            45921.953931549871457) * r + 13731.693765509461125) * r + 1971.5909503065514427) * r +
                         133.14166789178437745) * r + 3.387132872796366608) * q;
    const double den = (((((((5226.495278852854561 * r + 28729.085735721942674) * r + 39307.89580009271061) * r +
                            21213.794301586595867) * r + 5394.1960214247511077) * r + 687.1870074920579083) * r +
                         42.313330701600911252) * r + 1.0);
    return num / den;
  }
  double r = std::sqrt(-std::log(q < 0 ? p : 1.0 - p));
  double num;
  double den;
  if (r <= 5.0) {
    r -= 1.6;
    num = (((((((7.7454501427834140764e-4 * r + 2.2723844989269184583e-2) * r + 2.4178072517745061177e-1) * r +
               1.2704582524523683826) * r + 3.6478483247632045904) * r + 5.7694972214606914055) * r +
            4.6303378461565452959) * r + 1.42343711074968357734);
    den = (((((((1.05075007164441684324e-9 * r + 5.475938084995344946e-4) * r + 1.51986665636164571966e-2) * r +
               1.4810397642748007459e-1) * r + 6.8976733498510000455e-1) * r + 1.6763848301838038494) * r +
            2.05319162663775882187) * r + 1.0);
  } else {
    r -= 5.0;
    num = (((((((2.01033439929228813265e-7 * r + 2.71155556874348757815e-5) * r + 1.2426609473880784386e-3) * r +
               2.6532189526576123093e-2) * r + 2.9656057182850489123e-1) * r + 1.7848265399172913358) * r +
            5.4637849111641143699) * r + 6.6579046435011037772);
    den = (((((((2.04426310338993978564e-15 * r + 1.4215117583164458887e-7) * r + 1.8463183175100546818e-5) * r +
               7.868691311456132591e-4) * r + 1.48753612908506148525e-2) * r + 1.3692988092273580531e-1) * r +
            5.9983220655588793769e-1) * r + 1.0);
  }
  return q < 0 ? -num / den : num / den;
}

namespace {

[[noreturn]] void invalid(std::string message) { throw error(errc::invalid_argument, std::move(message)); }

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

// In (0, 1): 53 random bits, half a step off 0 (the quantile of 0 is -inf).
double open_uniform01(std::uint64_t bits) noexcept { return (static_cast<double>(bits >> 11) + 0.5) * 0x1.0p-53; }

// A standard normal: the quantile of one uniform draw (one log and one square root in 15% of
// draws and none in the rest, where Box-Muller took a log, a square root and a cosine each: a
// hash table's new rows are made while a lookup waits).
double standard_normal(std::uint64_t seed, std::uint64_t element) noexcept {
  return normal_quantile(open_uniform01(random_bits(seed, element, 0)));
}

// A standard normal within two standard deviations: the quantile of a uniform draw between the
// quantiles' probabilities at -2 and 2, so no draw is redrawn.
double truncated_standard_normal(std::uint64_t seed, std::uint64_t element) noexcept {
  constexpr double below = 0.02275013194817921;  // P(Z < -2)
  const double p = below + open_uniform01(random_bits(seed, element, 0)) * (1.0 - 2.0 * below);
  return std::clamp(normal_quantile(p), -2.0, 2.0);
}

// Keras's fans (initializers._compute_fans).
std::pair<double, double> fans(const shape_type& shape) {
  if (shape.empty()) return {1, 1};
  if (shape.size() == 1) return {double(shape[0]), double(shape[0])};
  if (shape.size() == 2) return {double(shape[0]), double(shape[1])};
  double receptive = 1;
  for (std::size_t i = 0; i + 2 < shape.size(); ++i) receptive *= double(shape[i]);
  return {double(shape[shape.size() - 2]) * receptive, double(shape.back()) * receptive};
}

bool is_random(const initializer& init) {
  return !std::holds_alternative<initializers::zeros>(init) && !std::holds_alternative<initializers::ones>(init) &&
         !std::holds_alternative<initializers::constant>(init);
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

// The parameter checks of each kind; `refuse` throws.
template <class Refuse>
struct parameter_check {
  dtype type;
  Refuse refuse;

  void operator()(const initializers::zeros&) const {}
  void operator()(const initializers::ones&) const {}
  void operator()(const initializers::glorot_uniform&) const {}
  void operator()(const initializers::constant& c) const {
    if (!std::isfinite(c.value)) {
      refuse(fmt::format("constant initializer: the value must be finite (got {})", c.value));
    }
    visit_dtype(type, [&](auto zero) {
      try {
        (void)cast_constant<decltype(zero)>(c.value);
      } catch (const error& e) {
        refuse(e.what());
      }
    });
  }
  void operator()(const initializers::random_uniform& r) const {
    if (!std::isfinite(r.minval) || !std::isfinite(r.maxval)) {
      refuse(fmt::format("random_uniform initializer: minval and maxval must be finite (got {} and {})", r.minval,
                         r.maxval));
    }
    if (r.minval > r.maxval) {
      refuse(fmt::format("random_uniform initializer: minval {} is above maxval {}", r.minval, r.maxval));
    }
  }
  void operator()(const initializers::random_normal& r) const { check_normal("random_normal", r.mean, r.stddev); }
  void operator()(const initializers::truncated_normal& r) const {
    check_normal("truncated_normal", r.mean, r.stddev);
  }
  void check_normal(std::string_view name, double mean, double stddev) const {
    if (!std::isfinite(mean) || !std::isfinite(stddev)) {
      refuse(fmt::format("{} initializer: mean and stddev must be finite (got {} and {})", name, mean, stddev));
    }
    if (stddev < 0) refuse(fmt::format("{} initializer: stddev must not be negative (got {})", name, stddev));
  }
};

// ---- Element-wise operations ----------------------------------------------------------------------

// Integers wrap (two's complement) instead of overflowing into undefined behaviour; x / -1 is a
// negation for the same reason. Divisors of zero are refused before any write (first_zero_divisor).
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

// Calls f(binary operation) for `op`, so each loop is compiled per operation. Each operation is a
// lambda of its own type: function pointers (&ops<T>::add, &ops<T>::sub...) share one type, so the
// loop was compiled once for all four with a call per element, and never vectorized.
template <class T, class F>
void with_op(update_op op, F&& f) {
  switch (op) {
    case update_op::assign: return f([](T, T b) { return b; });
    case update_op::add: return f([](T a, T b) { return ops<T>::add(a, b); });
    case update_op::sub: return f([](T a, T b) { return ops<T>::sub(a, b); });
    case update_op::mul: return f([](T a, T b) { return ops<T>::mul(a, b); });
    case update_op::div: return f([](T a, T b) { return ops<T>::div(a, b); });
    case update_op::min: return f([](T a, T b) { return std::min(a, b); });
    case update_op::max: return f([](T a, T b) { return std::max(a, b); });
  }
  invalid(fmt::format("unknown update operation {}", static_cast<int>(op)));
}

// ---- Optimizers ---------------------------------------------------------------------------------

// One optimizer's update of n elements from `offset`; slot pointers are offset like the variable's.
// What depends only on the step (adam's bias correction) is computed once per request.
template <class T>
class step_math {
 public:
  step_math(const optimizer& opt, std::int64_t step) : opt_(opt) {
    if (const auto* adam = std::get_if<optimizers::adam>(&opt)) {
      const double t = static_cast<double>(step);
      adam_alpha_ = static_cast<T>(adam->learning_rate * std::sqrt(1 - std::pow(adam->beta_2, t)) /
                                   (1 - std::pow(adam->beta_1, t)));
    }
  }

  void operator()(T* var, T* const* slots, std::size_t offset, const T* g, std::size_t n) const {
    std::visit([&](const auto& o) { step(o, var + offset, slots, offset, g, n); }, opt_);
  }

  /// Steps the rows `rows[u]` (of n elements; every one names a row) with gradient rows g, g + n...
  /// Rows named by random ids of a large variable are cache misses, in the variable and in each
  /// slot: their rows random_row_prefetch_distance ids ahead are loaded while this one is stepped.
  void rows(T* var, std::span<T* const> slots, std::span<const std::int64_t> rows, const T* g, std::size_t n) const {
    step_rows(var, slots, rows, g, n, rows.size(), [](std::size_t u) { return u; });
  }
  /// Steps record j (its row at records[j], its slots' rows right after it, n elements each) with
  /// gradient row g + at(j) * n: a hash table's rows, each with its slots in one record. A record
  /// spans several cache lines (a 16-float row and its Adagrad slot: three with the header), each a
  /// miss for a random id: all of them are loaded random_row_prefetch_distance records ahead.
  template <class Position>
  void records(std::span<std::byte* const> records, std::size_t slots, const T* g, std::size_t n,
               Position at) const {
    constexpr std::size_t ahead = common::random_row_prefetch_distance;
    const std::size_t record_bytes = (1 + slots) * n * sizeof(T);
    std::visit(
        [&](const auto& o) {
          std::array<T*, 2> slot_rows{};  // no optimizer keeps more than two slots
          for (std::size_t j = 0; j < records.size(); ++j) {
            if (j + ahead < records.size()) {
              const std::byte* next = records[j + ahead];
              for (std::size_t line = 0; line < record_bytes; line += 64) __builtin_prefetch(next + line, 1);
              __builtin_prefetch(next + record_bytes - 1, 1);
            }
            T* var = reinterpret_cast<T*>(records[j]);
            for (std::size_t k = 0; k < slots; ++k) slot_rows[k] = var + (k + 1) * n;
            step(o, var, slot_rows.data(), 0, g + at(j) * n, n);
          }
        },
        opt_);
  }
  /// As rows(), for the rows `rows[at[j]]` only, with gradient rows g + at[j] * n.
  void rows_at(T* var, std::span<T* const> slots, std::span<const std::int64_t> rows, const T* g, std::size_t n,
               std::span<const std::uint32_t> at) const {
    step_rows(var, slots, rows, g, n, at.size(), [at](std::size_t j) -> std::size_t { return at[j]; });
  }

 private:
  template <class Position>
  void step_rows(T* var, std::span<T* const> slots, std::span<const std::int64_t> rows, const T* g, std::size_t n,
                 std::size_t count, Position position) const {
    constexpr std::size_t ahead = common::random_row_prefetch_distance;
    std::visit(
        [&](const auto& o) {
          for (std::size_t j = 0; j < count; ++j) {
            if (j + ahead < count) {
              const std::size_t next = static_cast<std::size_t>(rows[position(j + ahead)]) * n;
              __builtin_prefetch(var + next, 1);
              for (T* slot : slots) __builtin_prefetch(slot + next, 1);
            }
            const std::size_t u = position(j);
            const std::size_t offset = static_cast<std::size_t>(rows[u]) * n;
            step(o, var + offset, slots.data(), offset, g + u * n, n);
          }
        },
        opt_);
  }

  // The variable, each slot and the gradient are separate buffers (a gradient comes off the wire or
  // is the kernel's sum of repeats): __restrict lets the compiler vectorize a step without checking
  // for overlap first.
  void step(const optimizers::sgd& o, T* __restrict var, T* const*, std::size_t, const T* __restrict g,
            std::size_t n) const {
    const T lr = static_cast<T>(o.learning_rate);
    for (std::size_t i = 0; i < n; ++i) var[i] -= lr * g[i];
  }
  void step(const optimizers::momentum& o, T* __restrict var, T* const* slots, std::size_t offset,
            const T* __restrict g, std::size_t n) const {
    T* __restrict velocity = slots[0] + offset;
    const T lr = static_cast<T>(o.learning_rate);
    const T momentum = static_cast<T>(o.momentum);
    for (std::size_t i = 0; i < n; ++i) {
      velocity[i] = momentum * velocity[i] - lr * g[i];
      var[i] += o.nesterov ? momentum * velocity[i] - lr * g[i] : velocity[i];
    }
  }
  void step(const optimizers::adagrad& o, T* __restrict var, T* const* slots, std::size_t offset,
            const T* __restrict g, std::size_t n) const {
    T* __restrict accumulator = slots[0] + offset;
    const T lr = static_cast<T>(o.learning_rate);
    const T epsilon = static_cast<T>(o.epsilon);
    for (std::size_t i = 0; i < n; ++i) {
      accumulator[i] += g[i] * g[i];
      var[i] -= lr * g[i] / (std::sqrt(accumulator[i]) + epsilon);
    }
  }
  void step(const optimizers::adam& o, T* __restrict var, T* const* slots, std::size_t offset,
            const T* __restrict g, std::size_t n) const {
    T* __restrict m = slots[0] + offset;
    T* __restrict v = slots[1] + offset;
    const T one_minus_beta_1 = static_cast<T>(1 - o.beta_1);
    const T one_minus_beta_2 = static_cast<T>(1 - o.beta_2);
    const T epsilon = static_cast<T>(o.epsilon);
    for (std::size_t i = 0; i < n; ++i) {
      m[i] += (g[i] - m[i]) * one_minus_beta_1;
      v[i] += (g[i] * g[i] - v[i]) * one_minus_beta_2;
      var[i] -= m[i] * adam_alpha_ / (std::sqrt(v[i]) + epsilon);
    }
  }
  void step(const optimizers::ftrl& o, T* __restrict var, T* const* slots, std::size_t offset,
            const T* __restrict g, std::size_t n) const {
    T* __restrict accumulator = slots[0] + offset;
    T* __restrict linear = slots[1] + offset;
    const T lr = static_cast<T>(o.learning_rate);
    const T power = static_cast<T>(-o.learning_rate_power);
    const T l1 = static_cast<T>(o.l1);
    // Keras folds beta into l2: l2 + beta / (2 lr).
    const T l2 = static_cast<T>(o.l2 + o.beta / (2 * o.learning_rate));
    for (std::size_t i = 0; i < n; ++i) {
      const T accumulated = accumulator[i] + g[i] * g[i];
      const T new_power = std::pow(accumulated, power);
      linear[i] += g[i] - (new_power - std::pow(accumulator[i], power)) / lr * var[i];
      const T quadratic = new_power / lr + 2 * l2;
      var[i] = std::abs(linear[i]) > l1 ? (std::copysign(l1, linear[i]) - linear[i]) / quadratic : T(0);
      accumulator[i] = accumulated;
    }
  }

  const optimizer& opt_;
  T adam_alpha_ = 0;  // lr * sqrt(1 - beta_2^t) / (1 - beta_1^t)
};

template <class T>
std::vector<T*> typed(std::span<std::byte* const> slots) {
  std::vector<T*> out;
  for (auto* s : slots) out.push_back(reinterpret_cast<T*>(s));
  return out;
}

// The hyper-parameter checks of each optimizer (TF's and Keras's conditions).
struct hyper_parameter_check {
  std::string_view name;

  void require(bool condition, std::string_view what, double value) const {
    if (!condition) invalid(fmt::format("{}: {} (got {})", name, what, value));
  }
  void operator()(const optimizers::sgd&) const {}
  void operator()(const optimizers::momentum& o) const {
    require(o.momentum >= 0 && o.momentum <= 1, "momentum must be in [0, 1]", o.momentum);
  }
  void operator()(const optimizers::adagrad& o) const {
    require(o.initial_accumulator_value >= 0 && std::isfinite(o.initial_accumulator_value),
            "initial_accumulator_value must not be negative", o.initial_accumulator_value);
    require(o.epsilon >= 0 && std::isfinite(o.epsilon), "epsilon must not be negative", o.epsilon);
  }
  void operator()(const optimizers::adam& o) const {
    require(o.beta_1 >= 0 && o.beta_1 < 1, "beta_1 must be in [0, 1)", o.beta_1);
    require(o.beta_2 >= 0 && o.beta_2 < 1, "beta_2 must be in [0, 1)", o.beta_2);
    require(o.epsilon >= 0 && std::isfinite(o.epsilon), "epsilon must not be negative", o.epsilon);
  }
  void operator()(const optimizers::ftrl& o) const {
    // TF's conditions (ftrl.py): "needs to be negative or zero", "positive or zero".
    require(o.learning_rate_power <= 0, "learning_rate_power needs to be negative or zero", o.learning_rate_power);
    require(o.initial_accumulator_value >= 0 && std::isfinite(o.initial_accumulator_value),
            "initial_accumulator_value needs to be positive or zero", o.initial_accumulator_value);
    require(o.l1 >= 0, "l1 needs to be positive or zero", o.l1);
    require(o.l2 >= 0, "l2 needs to be positive or zero", o.l2);
    require(o.beta >= 0, "beta needs to be positive or zero", o.beta);
    // With power 0 and an empty accumulator, accum^0 = 1; with power < 0, 0^(-p) = 0: both fine.
  }
};

}  // namespace

std::string_view initializer_name(const initializer& init) {
  struct namer {
    std::string_view operator()(const initializers::zeros&) const { return "zeros"; }
    std::string_view operator()(const initializers::ones&) const { return "ones"; }
    std::string_view operator()(const initializers::constant&) const { return "constant"; }
    std::string_view operator()(const initializers::random_uniform&) const { return "random_uniform"; }
    std::string_view operator()(const initializers::random_normal&) const { return "random_normal"; }
    std::string_view operator()(const initializers::truncated_normal&) const { return "truncated_normal"; }
    std::string_view operator()(const initializers::glorot_uniform&) const { return "glorot_uniform"; }
  };
  return std::visit(namer{}, init);
}

void check_initializer(const shard_initializer& fill, dtype type, const shape_type& shard_shape,
                       std::string_view variable) {
  const auto name = initializer_name(fill.init);
  auto refuse = [&](std::string_view what) { invalid(fmt::format("create of '{}': {}", variable, what)); };
  const auto& full = fill.full_shape;
  const bool same_rank = full.size() == shard_shape.size();
  if (!same_rank || !std::equal(shard_shape.begin() + (shard_shape.empty() ? 0 : 1), shard_shape.end(),
                                full.begin() + (full.empty() ? 0 : 1))) {
    refuse(fmt::format("{} initializer: a shard of shape {} cannot belong to a variable of shape {}", name,
                       to_string(shard_shape), to_string(full)));
  }
  // Element i of the shard is element row_offset * row size + i of the whole variable: a whole
  // shape whose size fits in 64 bits keeps that index exact.
  if (!checked_size_bytes(type, full)) {
    refuse(fmt::format("{} initializer: the whole variable's shape {} is too large (its size in bytes does not fit "
                       "in 64 bits)",
                       name, to_string(full)));
  }
  if (!shard_shape.empty() && (fill.row_offset > full[0] || shard_shape[0] > full[0] - fill.row_offset)) {
    refuse(fmt::format("{} initializer: {} rows from row {} are outside the variable's {} rows", name,
                       shard_shape[0], fill.row_offset, full[0]));
  }
  if (shard_shape.empty() && fill.row_offset != 0) refuse(fmt::format("{} initializer: a scalar has no rows", name));
  if (is_random(fill.init) && !is_float(type)) {
    refuse(fmt::format("{} initializer needs a float32 or float64 variable, not {}", name, name_of(type)));
  }
  std::visit(parameter_check<decltype(refuse)>{type, refuse}, fill.init);
}

void initialize(const shard_initializer& fill, dtype type, const shape_type& shard_shape, std::byte* out) {
  const std::size_t n = num_elements(shard_shape);
  const std::size_t row = shard_shape.empty() ? 1 : num_elements(std::span(shard_shape).subspan(1));
  const std::uint64_t first = fill.row_offset * row;
  visit_dtype(type, [&](auto zero) {
    using T = decltype(zero);
    T* values = reinterpret_cast<T*>(out);
    std::visit(
        [&](const auto& kind) {
          using kind_type = std::decay_t<decltype(kind)>;
          if constexpr (std::is_same_v<kind_type, initializers::zeros>) {
            std::fill_n(values, n, T(0));
          } else if constexpr (std::is_same_v<kind_type, initializers::ones>) {
            std::fill_n(values, n, T(1));
          } else if constexpr (std::is_same_v<kind_type, initializers::constant>) {
            std::fill_n(values, n, cast_constant<T>(kind.value));
          } else if constexpr (!std::is_floating_point_v<T>) {
            invalid(fmt::format("initializer {} cannot fill a {} variable", initializer_name(fill.init),
                                name_of(type)));
          } else if constexpr (std::is_same_v<kind_type, initializers::random_uniform>) {
            const double a = kind.minval;
            const double b = kind.maxval;
            for (std::size_t i = 0; i < n; ++i) {
              values[i] = T(a + (b - a) * uniform01(random_bits(kind.seed, first + i, 0)));
            }
          } else if constexpr (std::is_same_v<kind_type, initializers::random_normal>) {
            for (std::size_t i = 0; i < n; ++i) {
              values[i] = T(kind.mean + kind.stddev * standard_normal(kind.seed, first + i));
            }
          } else if constexpr (std::is_same_v<kind_type, initializers::truncated_normal>) {
            for (std::size_t i = 0; i < n; ++i) {
              values[i] = T(kind.mean + kind.stddev * truncated_standard_normal(kind.seed, first + i));
            }
          } else {
            static_assert(std::is_same_v<kind_type, initializers::glorot_uniform>);
            const auto [fan_in, fan_out] = fans(fill.full_shape);
            const double limit = std::sqrt(6.0 / std::max(1.0, fan_in + fan_out));
            for (std::size_t i = 0; i < n; ++i) {
              values[i] = T(limit * (2 * uniform01(random_bits(kind.seed, first + i, 0)) - 1));
            }
          }
        },
        fill.init);
  });
}

void combine(update_op op, dtype type, std::byte* destination, const std::byte* source, std::size_t n) {
  visit_dtype(type, [&](auto zero) {
    using T = decltype(zero);
    T* d = reinterpret_cast<T*>(destination);
    const T* s = reinterpret_cast<const T*>(source);
    with_op<T>(op, [&](auto f) {
      for (std::size_t i = 0; i < n; ++i) d[i] = f(d[i], s[i]);
    });
  });
}

void scatter(update_op op, dtype type, std::byte* destination, std::span<const std::int64_t> ids,
             const std::byte* rows, std::size_t row_elements) {
  visit_dtype(type, [&](auto zero) {
    using T = decltype(zero);
    T* d = reinterpret_cast<T*>(destination);
    const T* s = reinterpret_cast<const T*>(rows);
    // Rows named by random ids of a large variable are cache misses: the row
    // random_row_prefetch_distance ids ahead is loaded while this one is combined (ids are checked:
    // every one names a row). Common row sizes are compile-time constants, so a row's loop is a few
    // vector instructions.
    constexpr std::size_t ahead = common::random_row_prefetch_distance;
    common::with_row_size(row_elements * sizeof(T), [&](auto row_bytes) {
      const std::size_t elements = row_bytes / sizeof(T);
      with_op<T>(op, [&](auto f) {
        for (std::size_t k = 0; k < ids.size(); ++k) {
          if (k + ahead < ids.size()) __builtin_prefetch(d + static_cast<std::size_t>(ids[k + ahead]) * elements, 1);
          T* row = d + static_cast<std::size_t>(ids[k]) * elements;
          const T* from = s + k * elements;
          for (std::size_t i = 0; i < elements; ++i) row[i] = f(row[i], from[i]);
        }
      });
    });
  });
}

bool is_float(dtype type) { return type == dtype::float32 || type == dtype::float64; }

std::size_t first_zero_divisor(update_op op, dtype type, const std::byte* divisors, std::size_t n) {
  if (op != update_op::div || is_float(type)) return n;
  return visit_dtype(type, [&](auto zero) -> std::size_t {
    using T = decltype(zero);
    const T* d = reinterpret_cast<const T*>(divisors);
    return static_cast<std::size_t>(std::find(d, d + n, T(0)) - d);
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

bool counts_steps(const optimizer& opt) { return std::holds_alternative<optimizers::adam>(opt); }

void check_optimizer(const optimizer& opt) {
  const hyper_parameter_check check{optimizer_name(opt)};
  const double lr = std::visit([](const auto& o) { return o.learning_rate; }, opt);
  check.require(std::isfinite(lr) && lr > 0, "learning_rate must be positive", lr);
  std::visit(check, opt);
}

void apply_dense(const optimizer& opt, dtype type, std::byte* variable, std::span<std::byte* const> slots,
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

namespace {

// What a sparse optimizer step of element type T keeps between requests, per thread.
template <class T>
struct sparse_step_tables {
  common::id_map seen{0};        // every id, when there are too many rows for the bitmaps
  common::id_map seen_again{0};  // the repeated ids, next to the bitmaps: each map keeps its size (reset
                         // reallocates a table 8 times too large, and the two sizes differ a lot)
  std::vector<std::uint32_t> index;  // by position among those summed: the id's first-seen index
  std::vector<std::int64_t> distinct;
  std::vector<T> summed;
  std::vector<std::uint64_t> seen_bits, repeated_bits;  // a bit per row of the variable
  std::vector<std::uint32_t> once, again;                // positions of ids asked once, and of the others

  // Not inline: g++ would compute the thread-local's address (a __tls_get_addr call, with -fPIC) at
  // every use in the step's loops instead of keeping it (3% of a ps's samples in Adagrad steps).
  [[gnu::noinline]] static sparse_step_tables& local() {
    thread_local sparse_step_tables tables;
    return tables;
  }
};

}  // namespace

void apply_records(const optimizer& opt, dtype type, std::span<std::byte* const> records, std::int64_t step,
                   const std::byte* gradients, std::size_t row_elements, std::span<const std::uint32_t> gradient_rows) {
  const std::size_t slots = slots_of(opt).size();
  if (slots > 2) throw error(errc::internal, "an optimizer keeps more slots than a record has room for");
  visit_dtype(type, [&](auto zero) {
    using T = decltype(zero);
    if constexpr (std::is_floating_point_v<T>) {
      const auto* g = reinterpret_cast<const T*>(gradients);
      if (gradient_rows.empty()) {
        step_math<T>(opt, step).records(records, slots, g, row_elements, [](std::size_t j) { return j; });
      } else {
        step_math<T>(opt, step).records(records, slots, g, row_elements,
                                        [gradient_rows](std::size_t j) -> std::size_t { return gradient_rows[j]; });
      }
    } else {
      invalid(fmt::format("{} updates float32 or float64 tables, not {}", optimizer_name(opt), name_of(type)));
    }
  });
}

void apply_sparse(const optimizer& opt, dtype type, std::byte* variable, std::size_t variable_rows,
                  std::span<std::byte* const> slots, std::int64_t step, std::span<const std::int64_t> ids,
                  const std::byte* rows, std::size_t row_elements) {
  visit_dtype(type, [&](auto zero) {
    using T = decltype(zero);
    if constexpr (std::is_floating_point_v<T>) {
      const T* g = reinterpret_cast<const T*>(rows);
      const auto typed_slots = typed<T>(slots);
      const step_math<T> math(opt, step);
      // Duplicates are summed first, in input order (TF's _deduplicate_indexed_slices): one step per
      // distinct row. The tables are this thread's, kept between requests (no allocation, no fresh
      // pages for a steady stream of steps); ids asked once, the usual case, step the request's rows
      // as they are.
      auto& local = sparse_step_tables<T>::local();
      T* var = reinterpret_cast<T*>(variable);
      const std::size_t n = row_elements;
      // Numbers the ids at `count` positions (position(j), in input order) in first-seen order
      // (local.index); returns how many are distinct.
      const auto number_ids = [&](common::id_map& seen, std::size_t count, auto position) {
        seen.reset(count);
        local.index.resize(count);
        constexpr std::size_t ahead = 16;
        for (std::size_t j = 0; j < count; ++j) {
          if (j + ahead < count) seen.prefetch(ids[position(j + ahead)]);
          local.index[j] = seen.index_of(ids[position(j)]);
        }
        return seen.size();
      };
      // Sums the gradient rows of the ids number_ids numbered by id, and steps each of those rows
      // once.
      const auto sum_and_step = [&](std::size_t count, auto position, std::size_t distinct) {
        local.distinct.resize(distinct);
        local.summed.resize(distinct * n);
        std::size_t next = 0;
        for (std::size_t j = 0; j < count; ++j) {
          const std::size_t k = position(j);
          const std::uint32_t u = local.index[j];
          const T* from = g + k * n;
          T* into = local.summed.data() + u * n;
          if (u == next) {
            ++next;
            local.distinct[u] = ids[k];
            std::copy(from, from + n, into);
          } else {
            for (std::size_t i = 0; i < n; ++i) into[i] += from[i];
          }
        }
        math.rows(var, typed_slots, local.distinct, local.summed.data(), n);
      };
      if (variable_rows / 256 <= ids.size() && ids.size() <= std::numeric_limits<std::uint32_t>::max()) {
        // A bit per row (at most 64 bytes per id in two bitmaps, which stay in cache where random
        // probes of a hash table of all the ids miss it): a first pass marks the rows seen and those
        // seen again; rows asked once are stepped from the request's rows, and only the repeated ones
        // go through the hash table. 50k uniform ids over 500k rows (5% repeated): the hash pass over
        // every id took about as long as the steps.
        const std::size_t words = variable_rows / 64 + 1;
        local.seen_bits.assign(words, 0);
        local.repeated_bits.assign(words, 0);
        std::uint64_t* seen = local.seen_bits.data();
        std::uint64_t* repeated = local.repeated_bits.data();
        bool any_repeated = false;
        for (const std::int64_t id : ids) {
          const auto row = static_cast<std::size_t>(id);
          const std::uint64_t bit = std::uint64_t{1} << (row % 64);
          if (seen[row / 64] & bit) {
            repeated[row / 64] |= bit;
            any_repeated = true;
          }
          seen[row / 64] |= bit;
        }
        if (!any_repeated) {
          math.rows(var, typed_slots, ids, g, n);
        } else {
          local.once.clear();
          local.again.clear();
          for (std::size_t k = 0; k < ids.size(); ++k) {
            const auto row = static_cast<std::size_t>(ids[k]);
            const bool again = repeated[row / 64] & (std::uint64_t{1} << (row % 64));
            (again ? local.again : local.once).push_back(static_cast<std::uint32_t>(k));
          }
          math.rows_at(var, typed_slots, ids, g, n, local.once);
          const auto position = [&](std::size_t j) -> std::size_t { return local.again[j]; };
          sum_and_step(local.again.size(), position, number_ids(local.seen_again, local.again.size(), position));
        }
      } else {
        const auto position = [](std::size_t k) { return k; };
        const std::size_t distinct = number_ids(local.seen, ids.size(), position);
        if (distinct == ids.size()) {
          math.rows(var, typed_slots, ids, g, n);
        } else {
          sum_and_step(ids.size(), position, distinct);
        }
      }
      // A thread keeps about 64 MiB of each of these tables at most for the next request: one huge
      // step does not hold its memory for the life of the ps.
      constexpr std::size_t keep = std::size_t{64} << 20;
      if (ids.size() * 32 > keep) {  // an id_map takes up to 32 bytes per id
        local.seen = common::id_map(0);
        local.seen_again = common::id_map(0);
      }
      const auto trim = [keep](auto& table) {
        if (table.capacity() * sizeof(table[0]) > keep) table = std::decay_t<decltype(table)>();
      };
      trim(local.index);
      trim(local.distinct);
      trim(local.summed);
      trim(local.seen_bits);
      trim(local.repeated_bits);
      trim(local.once);
      trim(local.again);
    } else {
      invalid(fmt::format("{} updates float32 or float64 variables, not {}", optimizer_name(opt), name_of(type)));
    }
  });
}

}  // namespace pscoro::ps::kernels

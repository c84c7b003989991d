// A ps's sparse optimizer steps (ps::kernels::apply_sparse): repeated ids are summed first
// whichever way the kernel finds them (a bit per row for a variable of few rows per id, a hash table
// of the ids for a huge one), and ids asked once are stepped as they are.
#include "ps/kernels.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <vector>

using namespace pscoro;

namespace {

constexpr std::size_t width = 5;

// Rows compared: those the ids below name.
constexpr std::size_t compared = 1000;

// Steps rows `ids` of a variable of `rows` rows (all 0.5, its Adagrad accumulator 0.1) with Adagrad
// and returns the first `compared` rows and their accumulator.
std::pair<std::vector<float>, std::vector<float>> adagrad_step(std::size_t rows, const std::vector<std::int64_t>& ids,
                                                               const std::vector<float>& gradient) {
  std::vector<float> variable(rows * width, 0.5f), accumulator(rows * width, 0.1f);
  std::byte* slots[] = {reinterpret_cast<std::byte*>(accumulator.data())};
  const optimizer opt = optimizers::adagrad{.learning_rate = 0.1};
  ps::kernels::apply_sparse(opt, dtype::float32, reinterpret_cast<std::byte*>(variable.data()), rows, slots, 1,
                                 ids, reinterpret_cast<const std::byte*>(gradient.data()), width);
  return {std::vector<float>(variable.begin(), variable.begin() + compared * width),
          std::vector<float>(accumulator.begin(), accumulator.begin() + compared * width)};
}

std::vector<float> gradient_for(std::size_t n) {
  std::vector<float> g(n * width);
  for (std::size_t i = 0; i < g.size(); ++i) g[i] = static_cast<float>(std::sin(0.37 * double(i)));
  return g;
}

}  // namespace

TEST_CASE("a sparse step sums repeated ids first, the same with a bit per row or a hash table of the ids") {
  for (const auto& ids : std::vector<std::vector<std::int64_t>>{
           {3, 7, 3, 0, 9, 7, 3, 2},                     // repeats, in several orders
           {4, 1, 8, 0},                                 // none
           {6, 6, 6, 6},                                 // one row only
           {3, 700, 64, 700, 127, 3, 999, 63, 64, 128}}) {  // across the bitmaps' words
    CAPTURE(ids.size());
    const auto g = gradient_for(ids.size());
    // 1000 rows: the bitmaps (at most 256 rows per id); 1M: the hash table of the ids.
    const auto [by_bits, accumulated_by_bits] = adagrad_step(compared, ids, g);
    const auto [by_hash, accumulated_by_hash] = adagrad_step(1'000'000, ids, g);
    CHECK(std::memcmp(by_bits.data(), by_hash.data(), by_bits.size() * sizeof(float)) == 0);
    CHECK(std::memcmp(accumulated_by_bits.data(), accumulated_by_hash.data(), by_bits.size() * sizeof(float)) == 0);
    // Against the formula, each distinct row stepped once with its summed gradient.
    std::map<std::int64_t, std::vector<double>> summed;
    for (std::size_t k = 0; k < ids.size(); ++k) {
      auto& row = summed[ids[k]];
      row.resize(width);
      for (std::size_t j = 0; j < width; ++j) row[j] += g[k * width + j];
    }
    for (std::size_t row = 0; row < compared; ++row) {
      for (std::size_t j = 0; j < width; ++j) {
        double w = 0.5, a = 0.1;
        if (const auto it = summed.find(static_cast<std::int64_t>(row)); it != summed.end()) {
          const double s = it->second[j];
          a += s * s;
          w -= 0.1 * s / (std::sqrt(a) + 1e-7);
        }
        CHECK(by_bits[row * width + j] == doctest::Approx(w).epsilon(1e-5));
        CHECK(accumulated_by_bits[row * width + j] == doctest::Approx(a).epsilon(1e-5));
      }
    }
  }
}

TEST_CASE("the normal quantile is AS241's, so the normal initializers draw from the normal distribution") {
  // Reference values from CPython's statistics.NormalDist().inv_cdf, which implements the same
  // algorithm (AS241): a transcription error in a coefficient shows here.
  const std::vector<std::pair<double, double>> reference{
      {1e-300, -37.0470962993612},         {1e-20, -9.262340089798405},  {1e-10, -6.361340902404056},
      {0.001, -3.090232306167813},         {0.02, -2.0537489106318225},  {0.0749, -1.4402382675279632},
      {0.075, -1.4395314709384557},        {0.3, -0.5244005127080407},   {0.5, 0.0},
      {0.6, 0.2533471031357998},           {0.975, 1.9599639845400536},  {0.999999, 4.753424308817089},
      {0.9999999999999999, 8.209536151601386}};
  for (const auto& point : reference) {
    const double p = point.first;  // named: clang 14's CAPTURE cannot take a structured binding
    CAPTURE(p);
    CHECK(ps::kernels::normal_quantile(p) == doctest::Approx(point.second).epsilon(1e-14));
  }
  // The true quantile at 0.975 is 1.95996398454005423552...
  CHECK(std::abs(ps::kernels::normal_quantile(0.975) - 1.9599639845400542) < 1e-15);
  // Symmetric about 1/2, increasing.
  double previous = -INFINITY;
  for (int k = 1; k < 1000; ++k) {
    const double p = k / 1000.0;
    const double z = ps::kernels::normal_quantile(p);
    CHECK(z > previous);
    CHECK(z == doctest::Approx(-ps::kernels::normal_quantile(1.0 - p)).epsilon(1e-12));
    previous = z;
  }
}

TEST_CASE("truncated_normal draws stay within two standard deviations and spread as the truncated normal") {
  constexpr std::size_t n = 200'000;
  std::vector<double> values(n);
  ps::kernels::initialize({initializers::truncated_normal{.mean = 0, .stddev = 1, .seed = 3}, {n}, 0}, dtype::float64,
                          {n}, reinterpret_cast<std::byte*>(values.data()));
  double sum = 0;
  double squares = 0;
  std::size_t beyond_one = 0;
  for (const double v : values) {
    REQUIRE(std::abs(v) <= 2.0);
    sum += v;
    squares += v * v;
    beyond_one += std::abs(v) > 1.0 ? 1 : 0;
  }
  // The standard normal truncated to [-2, 2]: mean 0, variance 0.7737, P(|Z| > 1) = 0.2848.
  CHECK(std::abs(sum / n) < 0.01);
  CHECK(std::abs(squares / n - 0.7737) < 0.01);
  CHECK(std::abs(static_cast<double>(beyond_one) / n - 0.2848) < 0.01);
}

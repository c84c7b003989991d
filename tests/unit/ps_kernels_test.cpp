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

// The Fashion-MNIST model shared by the training example and its sidecar evaluator: softmax
// regression on the 784 pixels scaled to [0, 1], its data pipeline and its test accuracy.
#pragma once

#include <pscoro/data_formats.hpp>
#include <pscoro/dataset.hpp>

#include <xtensor/xarray.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <utility>

namespace examples::fashion_mnist {

inline constexpr std::size_t pixels = 28 * 28;
inline constexpr std::size_t classes = 10;

/// Where Debian's dataset-fashion-mnist package puts the files.
inline constexpr const char* default_data_dir = "/usr/share/datasets/fashion-mnist";

// A batch: pixels scaled to [0, 1], [n, 784], and labels, [n].
using batch = std::tuple<xt::xarray<float>, xt::xarray<std::int64_t>>;

// The examples of a Fashion-MNIST split ("train", "t10k") as (pixels [784] in [0, 1], label).
inline pscoro::dataset<batch> examples_of(const std::string& dir, const std::string& split) {
  return pscoro::zip(pscoro::idx<float>(dir + "/" + split + "-images-idx3-ubyte.gz"),
                     pscoro::idx<std::int64_t>(dir + "/" + split + "-labels-idx1-ubyte.gz"))
      .map([](std::tuple<xt::xarray<float>, xt::xarray<std::int64_t>> example) {
        auto& [image, label] = example;
        xt::xarray<float> pixels = image / 255.0f;
        pixels.reshape({pixels.size()});
        return batch{std::move(pixels), std::move(label)};
      });
}

// Rows of `x` (pixels scaled to [0, 1]) times `w` plus `b`, softmaxed in place. Returns [rows, 10].
inline xt::xarray<float> probabilities(const xt::xarray<float>& x, const xt::xarray<float>& w, const xt::xarray<float>& b) {
  const std::size_t rows = x.shape()[0];
  xt::xarray<float> p = xt::zeros<float>({rows, classes});
  for (std::size_t r = 0; r < rows; ++r) {
    float* out = &p(r, 0);
    for (std::size_t k = 0; k < classes; ++k) out[k] = b(k);
    const float* in = &x(r, 0);
    for (std::size_t i = 0; i < pixels; ++i) {
      if (in[i] == 0.0f) continue;  // most pixels are background
      const float* wi = &w(i, 0);
      for (std::size_t k = 0; k < classes; ++k) out[k] += in[i] * wi[k];
    }
    const float top = *std::max_element(out, out + classes);
    float sum = 0;
    for (std::size_t k = 0; k < classes; ++k) sum += out[k] = std::exp(out[k] - top);
    for (std::size_t k = 0; k < classes; ++k) out[k] /= sum;
  }
  return p;
}

// Accuracy over the test split, read through the same pipeline in batches of 1000.
inline std::pair<double, std::size_t> accuracy(const std::string& dir, const xt::xarray<float>& w, const xt::xarray<float>& b) {
  std::size_t correct = 0, total = 0;
  auto it = examples_of(dir, "t10k").batch(1000).make_iterator();
  while (auto next = it.next()) {
    const auto& [x, labels] = *next;
    const auto p = probabilities(x, w, b);
    for (std::size_t r = 0; r < labels.size(); ++r) {
      const float* row = &p(r, 0);
      correct += static_cast<std::int64_t>(std::max_element(row, row + classes) - row) == labels(r);
    }
    total += labels.size();
  }
  return {static_cast<double>(correct) / static_cast<double>(total), total};
}

}  // namespace examples::fashion_mnist

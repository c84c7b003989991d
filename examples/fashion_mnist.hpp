// The Fashion-MNIST model shared by the training example and its sidecar evaluator: softmax
// regression on the 784 pixels scaled to [0, 1], its data pipeline, its test accuracy, and the
// sidecar evaluator's loop.
#pragma once

#include <pscoro/checkpoint.hpp>
#include <pscoro/data_formats.hpp>
#include <pscoro/dataset.hpp>

#include <xtensor/xarray.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <thread>
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

struct evaluator_options {
  std::string checkpoint_dir;
  std::string data_dir = default_data_dir;
  std::int64_t until_step = 0;  // exit after a checkpoint of this step or later (0: never)
  double timeout = 600;         // exit 1 when no new checkpoint appears for this many seconds
  double poll = 0.2;            // seconds between looks at the directory
};

/// TF's SidecarEvaluator: evaluates each new checkpoint in the directory on the test set as it
/// appears, reading the weights straight from the file (no cluster). Returns the exit code.
inline int run_sidecar_evaluator(const evaluator_options& o) {
  std::int64_t last_number = -1;
  auto last_news = std::chrono::steady_clock::now();
  while (true) {
    for (const auto& path : pscoro::checkpoints_in(o.checkpoint_dir)) {
      const auto number = *pscoro::checkpoint_manager::number_of(path);
      if (number <= last_number) continue;
      last_number = number;
      last_news = std::chrono::steady_clock::now();
      try {
        // A checkpoint appears complete (renamed into place); one pruned while we read it stays
        // readable through the open file.
        const pscoro::checkpoint_reader reader(path);
        const auto w = reader.read<float>("softmax/weights");
        const auto b = reader.read<float>("softmax/bias");
        const auto [acc, images] = accuracy(o.data_dir, w, b);
        std::printf("evaluator: %s step %lld test accuracy %.4f on %zu images\n", path.filename().c_str(),
                    static_cast<long long>(reader.step()), acc, images);
        std::fflush(stdout);
        if (o.until_step > 0 && reader.step() >= o.until_step) return 0;
      } catch (const pscoro::error& e) {
        if (e.code() != pscoro::errc::not_found) {
          std::fprintf(stderr, "evaluator: %s\n", e.what());
          return 1;
        }
        std::printf("evaluator: %s was pruned before it could be read\n", path.filename().c_str());
      }
    }
    if (std::chrono::steady_clock::now() - last_news > std::chrono::duration<double>(o.timeout)) {
      std::fprintf(stderr, "evaluator: no new checkpoint in %s for %.0f s\n", o.checkpoint_dir.c_str(), o.timeout);
      return 1;
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(o.poll));
  }
}

}  // namespace examples::fashion_mnist

// The Fashion-MNIST model shared by the training example and its sidecar evaluator: softmax
// regression on the 784 pixels scaled to [0, 1], its data pipelines, the math of a training step,
// its test accuracy, and the sidecar evaluator's loop.
#pragma once

#include <pscoro/checkpoint.hpp>
#include <pscoro/data_formats.hpp>
#include <pscoro/dataset.hpp>
#include <pscoro/log.hpp>

#include <xtensor/xarray.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

namespace examples::fashion_mnist {

inline constexpr std::size_t pixels = 28 * 28;
inline constexpr std::size_t classes = 10;

/// Where Debian's dataset-fashion-mnist package puts the files.
inline constexpr const char* default_data_dir = "/usr/share/datasets/fashion-mnist";

// A batch: pixels scaled to [0, 1], [n, 784], and labels, [n].
using batch = std::tuple<xt::xarray<float>, xt::xarray<std::int64_t>>;
// An example as the files hold it: 28x28 pixel bytes and a label. 784 bytes an image is what a
// worker caches (scaled floats would be four times as much).
using raw_example = std::tuple<xt::xarray<std::uint8_t>, xt::xarray<std::int64_t>>;

inline std::string images_file(const std::string& dir, const std::string& split) {
  return dir + "/" + split + "-images-idx3-ubyte.gz";
}
inline std::string labels_file(const std::string& dir, const std::string& split) {
  return dir + "/" + split + "-labels-idx1-ubyte.gz";
}

// The examples of a Fashion-MNIST split ("train", "t10k") as they are in the files.
inline pscoro::dataset<raw_example> raw_examples_of(const std::string& dir, const std::string& split) {
  return pscoro::zip(pscoro::idx<std::uint8_t>(images_file(dir, split)), pscoro::idx<std::int64_t>(labels_file(dir, split)));
}

// An example for training: pixels [784] scaled to [0, 1], and its label.
inline batch scaled(raw_example example) {
  const auto& image = std::get<0>(example);
  xt::xarray<float> pixels = xt::xarray<float>::from_shape({image.size()});
  for (std::size_t i = 0; i < image.size(); ++i) pixels.data()[i] = static_cast<float>(image.data()[i]) / 255.0f;
  return batch{std::move(pixels), std::move(std::get<1>(example))};
}

// The examples of a split as (pixels [784] in [0, 1], label).
inline pscoro::dataset<batch> examples_of(const std::string& dir, const std::string& split) {
  return raw_examples_of(dir, split).map(scaled);
}

// An image as a worker keeps it: its 784 pixel bytes and its label, shared and immutable. A
// pipeline copies each element out of the cache and moves it several times a pass (shuffle buffer,
// batch): for a shared pointer that is a counter, for an xarray an allocation and its shape.
struct image {
  std::vector<std::uint8_t> pixels;
  std::int64_t label = 0;
};
using image_ptr = std::shared_ptr<const image>;

inline image_ptr compact(raw_example raw) {
  const auto& pixels = std::get<0>(raw);
  return std::make_shared<const image>(image{std::vector<std::uint8_t>(pixels.begin(), pixels.end()), std::get<1>(raw)()});
}

// Images to a training batch: pixels [n, 784] scaled to [0, 1], and labels [n]. One loop over the
// batch, not one array an image.
inline batch scaled_batch(const std::vector<image_ptr>& images) {
  // The 256 values a pixel can scale to, computed once: a load instead of a division a pixel.
  static const auto scale = [] {
    std::array<float, 256> out{};
    for (std::size_t v = 0; v < out.size(); ++v) out[v] = static_cast<float>(v) / 255.0f;
    return out;
  }();
  const std::size_t n = images.size();
  xt::xarray<float> x = xt::xarray<float>::from_shape({n, pixels});
  xt::xarray<std::int64_t> labels = xt::xarray<std::int64_t>::from_shape({n});
  for (std::size_t r = 0; r < n; ++r) {
    const std::uint8_t* in = images[r]->pixels.data();
    float* out = x.data() + r * pixels;
    for (std::size_t i = 0; i < pixels; ++i) out[i] = scale[in[i]];
    labels(r) = images[r]->label;
  }
  return batch{std::move(x), std::move(labels)};
}

// A worker's training batches: its share of the training split, decompressed and decoded once
// (cached after the shard, so each worker keeps only its share, as bytes), reshuffled every epoch,
// forever (the chief decides how many steps to take), scaled a batch at a time.
inline pscoro::dataset<batch> training_batches(const std::string& dir, std::int64_t num_workers, std::int64_t worker_index,
                                               std::size_t batch_size) {
  return raw_examples_of(dir, "train")
      .shard(num_workers, worker_index)
      .map(compact)
      .cache()
      .shuffle(10000, 42 + static_cast<std::uint64_t>(worker_index))
      .repeat()
      .batch(batch_size, /*drop_remainder=*/true)
      .map(scaled_batch)
      .prefetch(4);
}

// A whole split in memory, read once (pscoro::read_idx): pixels [n, 784] in [0, 1], labels [n].
struct split_data {
  xt::xarray<float> pixels;
  xt::xarray<std::int64_t> labels;
};
inline split_data load_split(const std::string& dir, const std::string& split) {
  split_data out{pscoro::read_idx<float>(images_file(dir, split)), pscoro::read_idx<std::int64_t>(labels_file(dir, split))};
  const std::size_t n = out.labels.size();
  out.pixels.reshape({n, pixels});
  out.pixels /= 255.0f;
  return out;
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

// One SGD step's math on a batch: the gradients of the mean cross-entropy, already scaled by the
// learning rate, the batch's mean loss and how many it classified right (before the update).
struct step_math {
  xt::xarray<float> grad_w;
  xt::xarray<float> grad_b;
  double loss = 0;
  std::size_t right = 0;
};
inline step_math sgd_step_math(const xt::xarray<float>& x, const xt::xarray<std::int64_t>& labels, const xt::xarray<float>& w,
                               const xt::xarray<float>& b, double learning_rate) {
  const std::size_t rows = labels.size();
  auto p = probabilities(x, w, b);
  // Cross-entropy loss; p becomes d(loss)/d(logits) = (p - onehot) / batch.
  step_math out;
  const float scale = 1.0f / static_cast<float>(rows);
  for (std::size_t r = 0; r < rows; ++r) {
    const auto label = static_cast<std::size_t>(labels(r));
    std::size_t best = 0;
    for (std::size_t k = 1; k < classes; ++k) best = p(r, k) > p(r, best) ? k : best;
    out.right += best == label ? 1 : 0;
    out.loss -= std::log(std::max(p(r, label), 1e-12f));
    p(r, label) -= 1.0f;
    for (std::size_t k = 0; k < classes; ++k) p(r, k) *= scale;
  }
  out.loss /= static_cast<double>(rows);
  out.grad_w = xt::zeros<float>({pixels, classes});
  out.grad_b = xt::zeros<float>({classes});
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t k = 0; k < classes; ++k) out.grad_b(k) += p(r, k);
    for (std::size_t i = 0; i < pixels; ++i) {
      const float xi = x(r, i);
      if (xi == 0.0f) continue;
      for (std::size_t k = 0; k < classes; ++k) out.grad_w(i, k) += xi * p(r, k);
    }
  }
  const auto lr = static_cast<float>(learning_rate);
  out.grad_w *= lr;
  out.grad_b *= lr;
  return out;
}

// Accuracy over a split held in memory (the test split: load_split once, evaluate often).
inline std::pair<double, std::size_t> accuracy(const split_data& data, const xt::xarray<float>& w, const xt::xarray<float>& b) {
  const auto p = probabilities(data.pixels, w, b);
  std::size_t correct = 0;
  const std::size_t total = data.labels.size();
  for (std::size_t r = 0; r < total; ++r) {
    const float* row = &p(r, 0);
    correct += static_cast<std::int64_t>(std::max_element(row, row + classes) - row) == data.labels(r);
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
  const auto test = load_split(o.data_dir, "t10k");  // read once, evaluated after every checkpoint
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
        const auto [acc, images] = accuracy(test, w, b);
        pscoro::print_line(fmt::format("evaluator: {} step {} test accuracy {:.4f} on {} images",
                                       path.filename().c_str(), static_cast<long long>(reader.step()), acc, images));
        if (o.until_step > 0 && reader.step() >= o.until_step) return 0;
      } catch (const pscoro::error& e) {
        if (e.code() != pscoro::errc::not_found) {
          pscoro::print_line(fmt::format("evaluator: {}", e.what()), pscoro::log_level::error);
          return 1;
        }
        pscoro::print_line(fmt::format("evaluator: {} was pruned before it could be read", path.filename().c_str()));
      }
    }
    if (std::chrono::steady_clock::now() - last_news > std::chrono::duration<double>(o.timeout)) {
      pscoro::print_line(
          fmt::format("evaluator: no new checkpoint in {} for {:.0f} s", o.checkpoint_dir.c_str(), o.timeout),
          pscoro::log_level::error);
      return 1;
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(o.poll));
  }
}

}  // namespace examples::fashion_mnist

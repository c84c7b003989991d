// Softmax regression on Fashion-MNIST, trained by a pscoro cluster.
//
// The weights live on the parameter servers; each worker pulls them, computes the gradient of a
// batch of the training set with xtensor and pushes the update; the chief schedules the steps,
// prints progress and the test-set accuracy. One binary plays every role, chosen by TF_CONFIG:
//
//   pscoro-launch --ps 2 --workers 2 -- fashion_mnist --steps 3000
#include <pscoro/pscoro.hpp>

#include "idx.hpp"

#include <CLI/CLI.hpp>
#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>

namespace {

constexpr std::size_t pixels = 28 * 28;
constexpr std::size_t classes = 10;

// Shared by the chief and the workers: (weights, bias, step, batch size, learning rate) -> loss.
const pscoro::worker_function<double(pscoro::variable<float>, pscoro::variable<float>, std::int64_t, std::int64_t,
                                     double)>
    train_step{"fashion_mnist.train_step"};

struct dataset {
  xt::xarray<std::uint8_t> images;  // [n, 28, 28]
  xt::xarray<std::uint8_t> labels;  // [n]
  std::size_t size() const { return labels.size(); }
};

dataset load(const std::string& dir, const std::string& prefix) {
  dataset d{examples::read_idx_gz(dir + "/" + prefix + "-images-idx3-ubyte.gz"),
            examples::read_idx_gz(dir + "/" + prefix + "-labels-idx1-ubyte.gz")};
  if (d.images.shape()[0] != d.labels.size()) {
    throw std::runtime_error(fmt::format("{}: {} images but {} labels", prefix, d.images.shape()[0], d.labels.size()));
  }
  return d;
}

// Rows of `x` (pixels scaled to [0, 1]) times `w` plus `b`, softmaxed in place. Returns [rows, 10].
xt::xarray<float> probabilities(const xt::xarray<float>& x, const xt::xarray<float>& w, const xt::xarray<float>& b) {
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

xt::xarray<float> rows_of(const dataset& d, const std::vector<std::size_t>& index) {
  xt::xarray<float> x = xt::zeros<float>({index.size(), pixels});
  for (std::size_t r = 0; r < index.size(); ++r) {
    const std::uint8_t* image = d.images.data() + index[r] * pixels;
    for (std::size_t i = 0; i < pixels; ++i) x(r, i) = image[i] / 255.0f;
  }
  return x;
}

// The worker side: a fixed shuffle of the training set; step s takes batch s of it.
class trainer {
 public:
  explicit trainer(dataset train) : train_(std::move(train)), order_(train_.size()) {
    std::iota(order_.begin(), order_.end(), std::size_t{0});
    std::shuffle(order_.begin(), order_.end(), std::mt19937_64(42));
  }

  asio::awaitable<double> step(pscoro::variable<float> w, pscoro::variable<float> b, std::int64_t step,
                               std::int64_t batch_size, double learning_rate) const {
    if (batch_size <= 0) throw pscoro::error(pscoro::errc::invalid_argument, "batch size must be positive");
    std::vector<std::size_t> index(static_cast<std::size_t>(batch_size));
    for (std::size_t i = 0; i < index.size(); ++i) {
      index[i] = order_[(static_cast<std::size_t>(step) * index.size() + i) % order_.size()];
    }
    const auto x = rows_of(train_, index);
    const auto weights = co_await w.read();
    const auto bias = co_await b.read();
    auto p = probabilities(x, weights, bias);

    // Cross-entropy loss; p becomes d(loss)/d(logits) = (p - onehot) / batch.
    double loss = 0;
    const float scale = 1.0f / static_cast<float>(index.size());
    for (std::size_t r = 0; r < index.size(); ++r) {
      const std::size_t label = train_.labels(index[r]);
      loss -= std::log(std::max(p(r, label), 1e-12f));
      p(r, label) -= 1.0f;
      for (std::size_t k = 0; k < classes; ++k) p(r, k) *= scale;
    }
    xt::xarray<float> grad_w = xt::zeros<float>({pixels, classes});
    xt::xarray<float> grad_b = xt::zeros<float>({classes});
    for (std::size_t r = 0; r < index.size(); ++r) {
      for (std::size_t k = 0; k < classes; ++k) grad_b(k) += p(r, k);
      for (std::size_t i = 0; i < pixels; ++i) {
        const float xi = x(r, i);
        if (xi == 0.0f) continue;
        for (std::size_t k = 0; k < classes; ++k) grad_w(i, k) += xi * p(r, k);
      }
    }
    const auto lr = static_cast<float>(learning_rate);
    grad_w *= lr;
    grad_b *= lr;
    co_await w.assign_sub(grad_w);
    co_await b.assign_sub(grad_b);
    co_return loss / static_cast<double>(index.size());
  }

 private:
  dataset train_;
  std::vector<std::size_t> order_;
};

double accuracy(const dataset& test, const xt::xarray<float>& w, const xt::xarray<float>& b) {
  std::vector<std::size_t> all(test.size());
  std::iota(all.begin(), all.end(), std::size_t{0});
  const auto p = probabilities(rows_of(test, all), w, b);
  std::size_t correct = 0;
  for (std::size_t r = 0; r < test.size(); ++r) {
    const float* row = &p(r, 0);
    correct += static_cast<std::size_t>(std::max_element(row, row + classes) - row) == test.labels(r);
  }
  return static_cast<double>(correct) / static_cast<double>(test.size());
}

struct options {
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  std::int64_t steps = 3000;
  std::int64_t batch_size = 100;
  double learning_rate = 0.3;
  double min_accuracy = 0.80;
  std::size_t closures_per_worker = 2;
  std::int64_t log_every = 500;
};

asio::awaitable<int> run_chief(pscoro::parameter_server_strategy& strategy, const options& o, const dataset& test) {
  co_await strategy.connect();
  pscoro::cluster_coordinator coordinator(strategy, {o.closures_per_worker});
  auto scope = strategy.scope();
  const xt::xarray<float> zero_weights = xt::zeros<float>({pixels, classes});
  const xt::xarray<float> zero_bias = xt::zeros<float>({classes});
  auto w = co_await scope.create_variable("softmax/weights", zero_weights);
  auto b = co_await scope.create_variable("softmax/bias", zero_bias);
  std::printf("chief: weights on ps:%d, bias on ps:%d; %lld steps of %lld images on %zu workers\n", w.ps_task(),
              b.ps_task(), static_cast<long long>(o.steps), static_cast<long long>(o.batch_size), strategy.num_workers());

  // Schedule everything at once; keep the losses we print.
  std::vector<std::pair<std::int64_t, pscoro::remote_value<double>>> progress;
  for (std::int64_t step = 0; step < o.steps; ++step) {
    // Linear decay to zero: the last steps settle instead of jumping around the optimum.
    const double learning_rate = o.learning_rate * static_cast<double>(o.steps - step) / static_cast<double>(o.steps);
    auto loss = coordinator.schedule(train_step, w, b, step, o.batch_size, learning_rate);
    if ((step + 1) % o.log_every == 0 || step + 1 == o.steps) progress.emplace_back(step + 1, std::move(loss));
  }
  for (auto& [step, loss] : progress) {
    std::printf("chief: step %lld/%lld loss %.4f\n", static_cast<long long>(step), static_cast<long long>(o.steps),
                co_await loss.get());
    std::fflush(stdout);
  }
  co_await coordinator.join();

  const double acc = accuracy(test, co_await w.read(), co_await b.read());
  std::printf("chief: test accuracy %.4f on %zu images\n", acc, test.size());
  strategy.close();
  if (acc < o.min_accuracy) {
    std::printf("chief: accuracy %.4f is below the required %.2f\n", acc, o.min_accuracy);
    co_return 1;
  }
  co_return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Softmax regression on Fashion-MNIST with a pscoro cluster (roles from TF_CONFIG)."};
  options o;
  app.add_option("--data-dir", o.data_dir, "directory of the gzipped IDX files");
  app.add_option("--steps", o.steps, "training steps")->check(CLI::PositiveNumber);
  app.add_option("--batch-size", o.batch_size, "images per step")->check(CLI::PositiveNumber);
  app.add_option("--learning-rate", o.learning_rate, "initial SGD learning rate (decays linearly to 0)")
      ->check(CLI::PositiveNumber);
  app.add_option("--min-accuracy", o.min_accuracy, "exit 1 if the test accuracy ends below this");
  app.add_option("--closures-per-worker", o.closures_per_worker, "closures in flight per worker")->check(CLI::PositiveNumber);
  app.add_option("--log-every", o.log_every, "print the loss every N steps")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  try {
    const auto resolver = pscoro::tf_config_cluster_resolver::from_environment();
    if (resolver.task_type() == "ps") return pscoro::run_server(resolver);
    if (resolver.task_type() == "worker") {
      auto worker = std::make_shared<trainer>(load(o.data_dir, "train"));
      return pscoro::run_server(resolver, [worker](pscoro::server& s) {
        s.bind(train_step, [worker](pscoro::variable<float> w, pscoro::variable<float> b, std::int64_t step,
                                    std::int64_t batch, double lr) { return worker->step(w, b, step, batch, lr); });
      });
    }
    const dataset test = load(o.data_dir, "t10k");
    asio::io_context io;
    pscoro::parameter_server_strategy strategy(io.get_executor(), resolver);
    int exit_code = 1;
    asio::co_spawn(io, run_chief(strategy, o, test), [&](std::exception_ptr e, int code) {
      exit_code = code;
      if (e) {
        try {
          std::rethrow_exception(e);
        } catch (const std::exception& failure) {
          std::fprintf(stderr, "chief: %s\n", failure.what());
        }
        exit_code = 1;
      }
      io.stop();
    });
    io.run();
    return exit_code;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fashion_mnist: %s\n", e.what());
    return 1;
  }
}

// The sidecar evaluator of the Fashion-MNIST example (TF's SidecarEvaluator): watches a checkpoint
// directory and evaluates each new checkpoint on the test set as it appears. It needs no cluster:
// it reads the weights straight from the checkpoint file.
//
//   fashion_mnist_evaluator --checkpoint-dir ckpts --until-step 3000
#include <pscoro/checkpoint.hpp>

#include "fashion_mnist.hpp"

#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <thread>

using namespace examples::fashion_mnist;

int main(int argc, char** argv) {
  CLI::App app{"Evaluates each new checkpoint of the Fashion-MNIST example on the test set."};
  std::string checkpoint_dir, data_dir = default_data_dir;
  std::int64_t until_step = 0;
  double timeout = 600, poll = 0.2;
  app.add_option("--checkpoint-dir", checkpoint_dir, "the directory the training chief saves into")->required();
  app.add_option("--data-dir", data_dir, "directory of the gzipped IDX files");
  app.add_option("--until-step", until_step, "exit after evaluating a checkpoint of this step or later (0: never)");
  app.add_option("--timeout", timeout, "exit 1 when no new checkpoint appears for this many seconds")
      ->check(CLI::PositiveNumber);
  app.add_option("--poll-interval", poll, "seconds between looks at the directory")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  std::int64_t last_number = -1;
  auto last_news = std::chrono::steady_clock::now();
  while (true) {
    for (const auto& path : pscoro::checkpoints_in(checkpoint_dir)) {
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
        const auto [acc, images] = accuracy(data_dir, w, b);
        std::printf("evaluator: %s step %lld test accuracy %.4f on %zu images\n", path.filename().c_str(),
                    static_cast<long long>(reader.step()), acc, images);
        std::fflush(stdout);
        if (until_step > 0 && reader.step() >= until_step) return 0;
      } catch (const pscoro::error& e) {
        if (e.code() != pscoro::errc::not_found) {
          std::fprintf(stderr, "evaluator: %s\n", e.what());
          return 1;
        }
        std::printf("evaluator: %s was pruned before it could be read\n", path.filename().c_str());
      }
    }
    if (std::chrono::steady_clock::now() - last_news > std::chrono::duration<double>(timeout)) {
      std::fprintf(stderr, "evaluator: no new checkpoint in %s for %.0f s\n", checkpoint_dir.c_str(), timeout);
      return 1;
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(poll));
  }
}

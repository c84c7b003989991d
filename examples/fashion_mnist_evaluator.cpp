// The sidecar evaluator of the Fashion-MNIST example (TF's SidecarEvaluator): watches a checkpoint
// directory and evaluates each new checkpoint on the test set as it appears. It needs no cluster:
// it reads the weights straight from the checkpoint file. (fashion_mnist run as an `evaluator`
// task does the same.)
//
//   fashion_mnist_evaluator --checkpoint-dir ckpts --until-step 3000
#include "command_line.hpp"
#include "fashion_mnist.hpp"

using namespace examples::fashion_mnist;

int main(int argc, char** argv) {
  CLI::App app{"Evaluates each new checkpoint of the Fashion-MNIST example on the test set."};
  evaluator_options o;
  app.add_option("--checkpoint-dir", o.checkpoint_dir, "the directory the training chief saves into")->required();
  app.add_option("--data-dir", o.data_dir, "directory of the gzipped IDX files");
  app.add_option("--until-step", o.until_step, "exit after evaluating a checkpoint of this step or later (0: never)");
  app.add_option("--timeout", o.timeout, "exit 1 when no new checkpoint appears for this many seconds")
      ->check(CLI::PositiveNumber);
  app.add_option("--poll-interval", o.poll, "seconds between looks at the directory")->check(CLI::PositiveNumber);
  if (const auto stop = pscoro::tools::parse_command_line(app, argc, argv)) return *stop;
  return run_sidecar_evaluator(o);
}

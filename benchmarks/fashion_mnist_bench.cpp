// End-to-end benchmark: Fashion-MNIST softmax regression trained by a cluster of processes (chief,
// 2 ps, 2 workers through pscoro-launch: the example as users run it) against the same math and
// batch size in one process with the data in memory, on one thread (`fashion_mnist --one-thread`)
// and on two (`--in-process-threads 2`: each thread reads the weights and applies its gradient as a
// worker does, so the two overlap as the cluster's workers do), in interleaved rounds of one run. Both run the one example binary, so their math is the same
// machine code: a reference compiled into this benchmark ran 0.81 or 0.94 ms a step depending on
// the build (code layout alone), moving the ratio by 15%. Prints steps/s of both, their ratio, and
// the CPU time per step (user + sys of every process), which tells how much work the cluster adds
// whatever else the machine is doing.
#include "command_line.hpp"
#include "fashion_mnist.hpp"
#include "raw_limits.hpp"

#include <fmt/chrono.h>
#include <fmt/format.h>

#include <cstdio>
#include <ctime>
#include <filesystem>
#include <regex>
#include <stdexcept>
#include <thread>

#include <sys/resource.h>
#include <sys/wait.h>

namespace {

using namespace examples::fashion_mnist;

double cpu_seconds(int who) {
  rusage usage{};
  ::getrusage(who, &usage);
  auto seconds = [](const timeval& t) { return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) / 1e6; };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

struct round_result {
  double steps_per_second;
  double cpu_ms_per_step;
  double accuracy;
};

// A worker's input pipeline alone, on this thread and its prefetch thread: CPU ms per batch over
// `steps` batches (the first epoch's decoding included, as in the cluster).
double pipeline_cpu_ms(const std::string& dir, std::int64_t steps, std::size_t batch_size) {
  const double cpu_start = cpu_seconds(RUSAGE_SELF);
  auto it = training_batches(dir, 2, 0, batch_size).make_iterator();
  for (std::int64_t step = 0; step < steps; ++step) {
    if (!it.next()) throw std::runtime_error("the training pipeline ended");
  }
  return (cpu_seconds(RUSAGE_SELF) - cpu_start) * 1e3 / static_cast<double>(steps);
}

// A run of the example: `command` (its output to read) prints "<label>step N/N loss L R steps/s
// done" when its N steps are done (R: from its first step to its last result, after every process
// is up) and "<label>test accuracy A on". CPU: user + sys of every process it started and waited for.
round_result run_example(const std::string& command, const std::string& label, std::int64_t steps) {
  const double cpu_start = cpu_seconds(RUSAGE_CHILDREN);
  std::FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (!pipe) throw std::runtime_error("cannot start " + command);
  std::string output;
  char buffer[4096];
  while (const auto n = std::fread(buffer, 1, sizeof buffer, pipe)) output.append(buffer, n);
  const int status = ::pclose(pipe);
  const double cpu = cpu_seconds(RUSAGE_CHILDREN) - cpu_start;
  std::smatch rate, acc;
  const std::regex done(fmt::format(R"({0}step {1}/{1} loss [0-9.]+ ([0-9.]+) steps/s done)", label, steps));
  const std::regex tested(label + R"(test accuracy ([0-9.]+) on)");
  if (status != 0 || !std::regex_search(output, rate, done) || !std::regex_search(output, acc, tested)) {
    throw std::runtime_error(fmt::format("{} failed (status {}):\n{}", command, status, output));
  }
  return {std::stod(rate[1]), cpu * 1e3 / static_cast<double>(steps), std::stod(acc[1])};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"pscoro end-to-end benchmark: Fashion-MNIST on 2 ps + 2 worker processes against 1 and 2 threads."};
  const auto build = std::filesystem::canonical("/proc/self/exe").parent_path().parent_path();
  std::filesystem::path launch = build / "tools" / "pscoro-launch";
  std::filesystem::path example = build / "examples" / "fashion_mnist";
  std::string data_dir = default_data_dir;
  std::int64_t steps = 3000;
  std::size_t batch_size = 100;
  double learning_rate = 0.3;
  int rounds = 3;
  app.add_option("--launch", launch, "the pscoro-launch program");
  app.add_option("--example", example, "the fashion_mnist example program");
  app.add_option("--data-dir", data_dir, "directory of the gzipped IDX files");
  app.add_option("--steps", steps, "training steps per run")->check(CLI::PositiveNumber);
  app.add_option("--batch-size", batch_size, "images per step")->check(CLI::PositiveNumber);
  app.add_option("--rounds", rounds, "interleaved rounds (medians are reported)")->check(CLI::PositiveNumber);
  if (const auto stop = pscoro::tools::parse_command_line(app, argc, argv)) return *stop;

  const auto training = fmt::format("--steps {0} --batch-size {1} --learning-rate {2} --log-every {0} --min-accuracy 0 "
                                     "--data-dir '{3}'",
                                     steps, batch_size, learning_rate, data_dir);
  const auto one_thread = fmt::format("'{}' --one-thread {}", example.string(), training);
  const auto two_threads = fmt::format("'{}' --in-process-threads 2 {}", example.string(), training);
  const auto cluster = fmt::format("'{}' --ps 2 --workers 2 -- '{}' {}", launch.string(), example.string(), training);
  std::vector<double> one_rate, one_cpu, two_rate, two_cpu, run_rate, run_cpu, to_one, to_two, input_cpu;
  double one_acc = 0, two_acc = 0, run_acc = 0;
  for (int r = 0; r < rounds; ++r) {
    const auto one = run_example(one_thread, "one thread: ", steps);
    const auto two = run_example(two_threads, "2 threads: ", steps);
    input_cpu.push_back(pipeline_cpu_ms(data_dir, steps / 2, batch_size));
    const auto many = run_example(cluster, "chief: ", steps);
    one_rate.push_back(one.steps_per_second);
    one_cpu.push_back(one.cpu_ms_per_step);
    two_rate.push_back(two.steps_per_second);
    two_cpu.push_back(two.cpu_ms_per_step);
    run_rate.push_back(many.steps_per_second);
    run_cpu.push_back(many.cpu_ms_per_step);
    to_one.push_back(many.steps_per_second / one.steps_per_second);
    to_two.push_back(many.steps_per_second / two.steps_per_second);
    one_acc = one.accuracy;
    two_acc = two.accuracy;
    run_acc = many.accuracy;
    std::fprintf(stderr, "round %d: one thread %.1f steps/s, 2 threads %.1f steps/s, cluster %.1f steps/s\n", r + 1,
                 one.steps_per_second, two.steps_per_second, many.steps_per_second);
  }
  fmt::print("pscoro end-to-end benchmark, {:%Y-%m-%d}, Fashion-MNIST softmax regression, {} steps of {} images, "
             "medians of {} interleaved rounds, {} hardware threads\n\n",
             fmt::localtime(std::time(nullptr)), steps, batch_size, rounds, std::thread::hardware_concurrency());
  fmt::print("{:<52} {:>10} {:>14} {:>8} {:>8} {:>14}\n", "", "steps/s", "CPU ms/step", "/ one", "/ two",
             "test accuracy");
  fmt::print("{:<52} {:>10.1f} {:>14.3f} {:>8.3f} {:>8} {:>14.4f}\n", "one thread, data in memory (--one-thread)",
             bench::median(one_rate), bench::median(one_cpu), 1.0, "", one_acc);
  fmt::print("{:<52} {:>10.1f} {:>14.3f} {:>8} {:>8.3f} {:>14.4f}\n", "2 threads, data in memory (--in-process-threads 2)",
             bench::median(two_rate), bench::median(two_cpu), "", 1.0, two_acc);
  fmt::print("{:<52} {:>10.1f} {:>14.3f} {:>8.3f} {:>8.3f} {:>14.4f}\n",
             "chief + 2 ps + 2 workers, processes (pscoro-launch)", bench::median(run_rate), bench::median(run_cpu),
             bench::median(to_one), bench::median(to_two), run_acc);
  fmt::print("{:<52} {:>10} {:>14.3f}\n", "a worker's input pipeline alone (per batch)", "", bench::median(input_cpu));
  fmt::print("\n(/ one, / two: the median of each round's ratio to the one-thread and the 2-thread reference, the "
             "same math in one process; targets: cluster >= 0.97x the 2-thread one; CPU: user + sys of every process "
             "from its start to its end, loading the data included)\n");
  return 0;
}

// Writes a TensorBoard event file with scalars and histograms of known values for
// tensorboard_test.sh, and prints what it wrote, for read_tfevents.py to check the file against:
//   file PATH
//   scalar TAG STEP VALUE         (the float32 TensorBoard stores, %.9g: exact)
//   histogram TAG STEP V1 V2 ...  (the values, %.17g: exact)
// usage: write_summaries LOGDIR
#include <pscoro/summary.hpp>

#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: write_summaries LOGDIR\n");
    return 2;
  }
  pscoro::summary_writer writer(argv[1]);
  std::printf("file %s\n", writer.path().c_str());
  const auto scalar = [&](const std::string& tag, double value, std::int64_t step) {
    writer.scalar(tag, value, step);
    std::printf("scalar %s %lld %s\n", tag.c_str(), static_cast<long long>(step),
                fmt::format("{:.9g}", static_cast<double>(static_cast<float>(value))).c_str());
  };
  for (std::int64_t step = 1; step <= 50; ++step) {
    scalar("train/loss", 2.0 / static_cast<double>(step), step);  // not exact in float32: rounded
    scalar("train/learning_rate", 0.1 * static_cast<double>(50 - step) / 50.0, step);
    if (step % 25 == 0) {
      // Spread over many buckets, both signs, zeros, tiny and huge values.
      std::vector<double> values;
      for (int i = 0; i < 200; ++i) {
        values.push_back(std::sin(i + static_cast<double>(step)) * std::pow(10.0, i % 7 - 3));
      }
      values.insert(values.end(), {0.0, 0.0, 1e-15, -1e30, 1e25});
      writer.histogram("weights", values, step);
      std::string line = fmt::format("histogram weights {}", step);
      for (const double v : values) line += fmt::format(" {:.17g}", v);
      std::printf("%s\n", line.c_str());
    }
  }
  scalar("test/accuracy", 0.8125, 50);
  writer.close();
  return 0;
}

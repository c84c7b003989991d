// Data benchmark: records/s for Criteo TSV and TFRecord parsing on one core, against reading the
// same bytes raw (read(2) in 1 MiB chunks from the page cache) in the same run.
#include "criteo.hpp"
#include "raw_limits.hpp"

#include <pscoro/data_formats.hpp>

#include <CLI/CLI.hpp>

#include <fmt/chrono.h>
#include <fmt/format.h>

#include <ctime>
#include <filesystem>
#include <fstream>

#include <fcntl.h>
#include <unistd.h>

namespace {

// Seconds to read `path` raw, 1 MiB at a time.
double raw_read_seconds(const std::string& path) {
  std::vector<char> buffer(1 << 20);
  const auto start = bench::clock_type::now();
  const int fd = ::open(path.c_str(), O_RDONLY);
  std::size_t total = 0;
  for (ssize_t n; (n = ::read(fd, buffer.data(), buffer.size())) > 0;) total += static_cast<std::size_t>(n);
  ::close(fd);
  asm volatile("" : : "r"(total) : "memory");
  return std::chrono::duration<double>(bench::clock_type::now() - start).count();
}

template <class T>
double pass_seconds(const pscoro::dataset<T>& d, std::size_t expected) {
  const auto start = bench::clock_type::now();
  auto it = d.make_iterator();
  std::size_t n = 0;
  while (auto item = it.next()) ++n;
  if (n != expected) throw std::runtime_error(fmt::format("read {} records, expected {}", n, expected));
  return std::chrono::duration<double>(bench::clock_type::now() - start).count();
}

template <class F>
double median_of(int rounds, F f) {
  std::vector<double> samples;
  for (int i = 0; i < rounds; ++i) samples.push_back(f());
  return bench::median(std::move(samples));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"pscoro data benchmark: Criteo TSV and TFRecord parsing against raw reads."};
  std::int64_t lines = 500000;
  int rounds = 5;
  app.add_option("--lines", lines, "records in each file")->check(CLI::PositiveNumber);
  app.add_option("--rounds", rounds, "passes per measurement (the median is reported)")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  const auto root = std::filesystem::temp_directory_path() / fmt::format("pscoro-data-bench-{}", ::getpid());
  namespace criteo = examples::criteo;
  const auto write = [&](criteo::file_format format) {
    return criteo::training_files(criteo::write_training_data(criteo::generator(1), root, lines, 1, format), 1, format)[0];
  };
  const std::string tsv = write(criteo::file_format::tsv), records = write(criteo::file_format::tfrecord);
  const auto n = static_cast<std::size_t>(lines);

  const double tsv_raw = median_of(rounds, [&] { return raw_read_seconds(tsv); });
  const double tsv_parse = median_of(rounds, [&] { return pass_seconds(pscoro::criteo_tsv({tsv}), n); });
  const double tsv_lines = median_of(rounds, [&] { return pass_seconds(pscoro::text_lines({tsv}), n); });
  const double rec_raw = median_of(rounds, [&] { return raw_read_seconds(records); });
  const double rec_read = median_of(rounds, [&] { return pass_seconds(pscoro::tfrecord({records}), n); });
  const double rec_parse = median_of(rounds, [&] {
    return pass_seconds(pscoro::tfrecord({records}).map([](const std::string& r) { return pscoro::parse_tf_example(r); }), n);
  });

  const auto size = [](const std::string& p) { return static_cast<double>(std::filesystem::file_size(p)); };
  fmt::print("pscoro data benchmark, {:%Y-%m-%d}, one core, {} records ({:.0f} MB TSV, {:.0f} MB TFRecord), "
             "medians of {}\n\n",
             fmt::localtime(std::time(nullptr)), lines, size(tsv) / 1e6, size(records) / 1e6, rounds);
  fmt::print("{:<44} {:>14} {:>10} {:>12}\n", "", "records/s", "MB/s", "/ raw read");
  auto row = [&](std::string_view name, double seconds, double bytes, double raw) {
    fmt::print("{:<44} {:>14.0f} {:>10.0f} {:>12.3f}\n", name, static_cast<double>(n) / seconds, bytes / seconds / 1e6,
               raw / seconds);
  };
  row("TSV: raw read (1 MiB reads)", tsv_raw, size(tsv), tsv_raw);
  row("TSV: text_lines", tsv_lines, size(tsv), tsv_raw);
  row("TSV: criteo_tsv (parsed records)", tsv_parse, size(tsv), tsv_raw);
  row("TFRecord: raw read (1 MiB reads)", rec_raw, size(records), rec_raw);
  row("TFRecord: tfrecord (framing + CRC-32C)", rec_read, size(records), rec_raw);
  row("TFRecord: tfrecord + parse_tf_example", rec_parse, size(records), rec_raw);
  std::filesystem::remove_all(root);
  return 0;
}

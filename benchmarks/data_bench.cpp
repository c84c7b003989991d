// Data benchmark: records/s for Criteo TSV and TFRecord parsing on one core, against reading the
// same bytes raw (read(2) in 1 MiB chunks from the page cache) in the same run; a pass over the
// TFRecord file's records kept by cache(filename) (1 MiB blocks, each checked against its
// CRC-32C), against a raw read of the cache file; and
// tf_example_parser (the CTR spec, into a reused batch) against parse_tf_example, in the pipeline
// and on records already in memory (thread CPU time: other processes on the machine do not count).
#include "command_line.hpp"
#include "criteo.hpp"
#include "raw_limits.hpp"

#include <pscoro/data_formats.hpp>

#include <fmt/chrono.h>
#include <fmt/format.h>

#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string_view>
#include <vector>

#include <time.h>

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

// Thread CPU seconds `f()` takes.
template <class F>
double cpu_seconds(F f) {
  const auto now = [] {
    timespec t{};
    ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
  };
  const double start = now();
  f();
  return now() - start;
}

// The CTR spec's parser with a batch it fills and clears every 512 records, as a pipeline's batch
// stage would.
struct batch_parser {
  pscoro::tf_example_parser parser{examples::criteo::tf_example_spec()};
  pscoro::tf_example_batch batch;
  std::size_t operator()(std::string_view record) {
    if (batch.size() == 512) batch.clear();
    parser.parse(record, batch);
    return batch.size();
  }
};

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
  if (const auto stop = pscoro::tools::parse_command_line(app, argc, argv)) return *stop;

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
  const double rec_fast = median_of(rounds, [&] {
    return pass_seconds(pscoro::tfrecord({records}).map([p = std::make_shared<batch_parser>()](const std::string& r) {
      return (*p)(r);
    }), n);
  });
  // The records kept in a cache file (the first pass writes it), then read from it.
  const std::string cache_file = (root / "records.cache").string();
  const auto cached = pscoro::tfrecord({records}).cache(cache_file);
  (void)pass_seconds(cached, n);
  const double cache_raw = median_of(rounds, [&] { return raw_read_seconds(cache_file); });
  const double cache_read = median_of(rounds, [&] { return pass_seconds(cached, n); });
  const double rec_reader = median_of(rounds, [&] {
    return pass_seconds(pscoro::tfrecord({records}).map([p = std::make_shared<criteo::tf_example_reader>()](
                                                            const std::string& r) { return (*p)(r); }),
                        n);
  });
  // The parse alone, on records in memory: at most 100,000 of them, each way in turn per round.
  std::vector<std::string> in_memory;
  for (auto it = pscoro::tfrecord({records}).make_iterator(); in_memory.size() < 100000;) {
    auto r = it.next();
    if (!r) break;
    in_memory.push_back(std::move(*r));
  }
  std::vector<double> old_cpu, new_cpu;
  for (int i = 0; i < rounds; ++i) {
    old_cpu.push_back(cpu_seconds([&] {
      std::size_t features = 0;
      for (const auto& r : in_memory) features += pscoro::parse_tf_example(r).features.size();
      asm volatile("" : : "r"(features) : "memory");
    }));
    new_cpu.push_back(cpu_seconds([&] {
      batch_parser p;
      std::size_t rows = 0;
      for (const auto& r : in_memory) rows += p(r);
      asm volatile("" : : "r"(rows) : "memory");
    }));
  }
  const double old_memory = bench::median(old_cpu), new_memory = bench::median(new_cpu);

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
  row("TFRecord: tfrecord + tf_example_parser", rec_fast, size(records), rec_raw);
  row("TFRecord: tfrecord + criteo tf_example_reader", rec_reader, size(records), rec_raw);
  row("cache file of the records: raw read", cache_raw, size(cache_file), cache_raw);
  row("cache file of the records: cache(filename)", cache_read, size(cache_file), cache_raw);
  const auto m = static_cast<double>(in_memory.size());
  fmt::print("\nparse alone, {} records in memory, thread CPU time (median of {}):\n", in_memory.size(), rounds);
  fmt::print("{:<44} {:>14.0f}\n", "parse_tf_example", m / old_memory);
  fmt::print("{:<44} {:>14.0f}\n", "tf_example_parser (batches of 512)", m / new_memory);
  fmt::print("\ntf_example_parser / parse_tf_example: {:.1f}x parse alone (CPU), {:.1f}x with tfrecord (wall)\n",
             old_memory / new_memory, rec_parse / rec_fast);
  std::filesystem::remove_all(root);
  return 0;
}

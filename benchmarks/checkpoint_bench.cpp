// Checkpoint throughput: save and restore of a sharded table (1 GiB by default, 4 shards on 2 ps of
// an in-process cluster on loopback) against the disk's own write and read bandwidth, measured in
// the same run on a file of the same size in the same directory (32 MiB pwrites + fsync; reads
// after the file's pages are dropped from the page cache). Medians of --rounds; ratios to raw.
//
// --hash-rows N: instead, a hash table of N rows of 16 floats with Adagrad slots on 2 ps, saved
// whole and then incrementally after --changed (a fraction) of its rows took a step: the bytes and
// seconds of each, and the increment's share of the whole (Check-N-Run's measure).
#include "command_line.hpp"
#include "local_cluster.hpp"
#include "raw_limits.hpp"

#include <pscoro/checkpoint.hpp>

#include <fmt/chrono.h>
#include <fmt/format.h>

#include <fcntl.h>
#include <unistd.h>

#include <ctime>
#include <filesystem>
#include <stdexcept>
#include <vector>

using namespace pscoro;
namespace fs = std::filesystem;

namespace {

double seconds_since(bench::clock_type::time_point start) {
  return std::chrono::duration<double>(bench::clock_type::now() - start).count();
}

// Drops `path`'s pages from the page cache, so the next read comes from the disk.
void drop_cache(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error("cannot open " + path.string());
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

// Raw disk write: `bytes` in 32 MiB pwrites, then fsync. Seconds.
double raw_write(const fs::path& path, std::size_t bytes) {
  std::vector<char> block(32 << 20, 'x');
  const auto start = bench::clock_type::now();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error("cannot write " + path.string());
  for (std::size_t done = 0; done < bytes;) {
    const auto n = ::pwrite(fd, block.data(), std::min(block.size(), bytes - done), static_cast<off_t>(done));
    if (n <= 0) throw std::runtime_error("write failed");
    done += static_cast<std::size_t>(n);
  }
  ::fsync(fd);
  ::close(fd);
  return seconds_since(start);
}

// Raw disk read of the whole file, cold. Seconds.
double raw_read(const fs::path& path) {
  drop_cache(path);
  std::vector<char> block(32 << 20);
  const auto start = bench::clock_type::now();
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  for (off_t done = 0;;) {
    const auto n = ::pread(fd, block.data(), block.size(), done);
    if (n <= 0) break;
    done += n;
  }
  ::close(fd);
  return seconds_since(start);
}

constexpr std::size_t hash_dim = 16;

// Looks up (inserting) and steps rows [first, first + count) of `table` with Adagrad, in batches
// (id k is k times a large odd number: spread over the int64 range).
asio::awaitable<void> step_rows(hash_table<float>& table, std::size_t first, std::size_t count) {
  constexpr std::size_t batch = 100'000;
  const optimizer opt = optimizers::adagrad{.learning_rate = 0.1};
  const hash_lookup_options inserting{.insert = true};
  for (std::size_t begin = first; begin < first + count; begin += batch) {
    const std::size_t n = std::min(batch, first + count - begin);
    const std::vector<std::size_t> ids_shape{n};
    const std::vector<std::size_t> rows_shape{n, hash_dim};
    xt::xarray<std::int64_t> ids = xt::xarray<std::int64_t>::from_shape(ids_shape);
    for (std::size_t k = 0; k < n; ++k) ids(k) = static_cast<std::int64_t>((begin + k) * 0x9e3779b97f4a7c15ULL);
    const xt::xarray<float> gradient = xt::ones<float>(rows_shape);
    co_await table.lookup(ids, inserting);
    co_await table.apply_gradients(opt, ids, gradient);
  }
}

// The --hash-rows mode: whole and incremental saves of a table of `rows` rows after `changed` of
// them stepped. Returns the exit code.
int hash_table_saves(std::size_t rows, double changed, int rounds, const fs::path& work) {
  std::vector<double> whole_seconds, increment_seconds;
  std::vector<double> whole_bytes, increment_bytes;
  hash_table_options options;
  options.dim = hash_dim;
  options.buckets = 4096;
  options.max_rows_per_ps = rows;
  const std::string name = "emb";
  const checkpoint_save_options incremental{.incremental = true};
  testing::local_cluster cluster(2, 1);
  cluster.run_chief([&](parameter_server_strategy& strategy, cluster_coordinator&) -> asio::awaitable<void> {
    auto table = co_await strategy.scope().create_hash_table<float>(name, options);
    co_await step_rows(table, 0, rows);
    checkpoint ckpt;
    ckpt.track(table);
    const auto stepped = static_cast<std::size_t>(changed * static_cast<double>(rows));
    for (int r = 0; r < rounds; ++r) {
      const fs::path whole = work / fmt::format("whole-{}.safetensors", r);
      const fs::path increment = work / fmt::format("increment-{}.safetensors", r);
      auto start = bench::clock_type::now();
      co_await ckpt.save(whole);
      whole_seconds.push_back(seconds_since(start));
      whole_bytes.push_back(static_cast<double>(fs::file_size(whole)));
      // A different slice each round, so that every round changes `stepped` rows.
      co_await step_rows(table, (static_cast<std::size_t>(r) * stepped) % (rows - stepped + 1), stepped);
      start = bench::clock_type::now();
      co_await ckpt.save(increment, incremental);
      increment_seconds.push_back(seconds_since(start));
      increment_bytes.push_back(static_cast<double>(fs::file_size(increment)));
      fs::remove(whole);
      fs::remove(increment);
    }
  });
  const double mib = double(1 << 20);
  fmt::print("pscoro checkpoint benchmark, {:%Y-%m-%d}: a hash table of {} rows of {} float32 with Adagrad slots "
             "on 2 ps (loopback), {:.1f}% of the rows stepped between a whole save and an incremental one, files in "
             "{}, medians of {}\n\n",
             fmt::localtime(std::time(nullptr)), rows, hash_dim, 100 * changed, work.parent_path().string(), rounds);
  fmt::print("{:<40} {:>10} {:>10}\n", "", "MiB", "seconds");
  fmt::print("{:<40} {:>10.1f} {:>10.3f}\n", "whole save", bench::median(whole_bytes) / mib,
             bench::median(whole_seconds));
  fmt::print("{:<40} {:>10.1f} {:>10.3f}\n", "incremental save", bench::median(increment_bytes) / mib,
             bench::median(increment_seconds));
  fmt::print("{:<40} {:>10.3f} {:>10.3f}\n", "increment / whole", bench::median(increment_bytes) / bench::median(whole_bytes),
             bench::median(increment_seconds) / bench::median(whole_seconds));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"pscoro checkpoint benchmark: save and restore of a sharded table against raw disk bandwidth."};
  std::size_t mib = 1024;
  int rounds = 3;
  std::string dir = fs::temp_directory_path().string();
  app.add_option("--mib", mib, "table size in MiB")->check(CLI::PositiveNumber);
  app.add_option("--rounds", rounds, "measurements of each kind (the median is reported)")->check(CLI::PositiveNumber);
  app.add_option("--dir", dir, "where the files go (the disk being measured)");
  std::size_t hash_rows = 0;
  double changed = 0.05;
  app.add_option("--hash-rows", hash_rows, "measure whole and incremental saves of a hash table of this many rows")
      ->check(CLI::PositiveNumber);
  app.add_option("--changed", changed, "with --hash-rows: the share of rows stepped between the two saves")
      ->check(CLI::Range(0.0, 1.0));
  if (const auto stop = pscoro::tools::parse_command_line(app, argc, argv)) return *stop;
  if (hash_rows > 0) {
    const fs::path work = fs::path(dir) / fmt::format("pscoro-checkpoint-bench-{}", ::getpid());
    fs::create_directories(work);
    const int code = hash_table_saves(hash_rows, changed, rounds, work);
    fs::remove_all(work);
    return code;
  }

  const std::size_t columns = 64;
  const std::size_t rows = (mib << 20) / (columns * sizeof(float));
  const std::size_t bytes = rows * columns * sizeof(float);
  const fs::path work = fs::path(dir) / fmt::format("pscoro-checkpoint-bench-{}", ::getpid());
  fs::create_directories(work);
  const fs::path raw_file = work / "raw.bin", checkpoint_file = work / "table.safetensors";

  std::vector<double> raw_writes, raw_reads, saves, restores, cold_restores;
  testing::local_cluster cluster(2, 1);
  cluster.run_chief(
      [&](parameter_server_strategy& strategy, cluster_coordinator&) -> asio::awaitable<void> {
        const shape_type shape{rows, columns};
        auto table = co_await strategy.scope().create_sharded_variable<float>("table", shape,
                                                                             initializers::constant{.value = 1.5});
        checkpoint ckpt;
        ckpt.track(table);
        for (int r = 0; r < rounds; ++r) {
          raw_writes.push_back(raw_write(raw_file, bytes));
          raw_reads.push_back(raw_read(raw_file));
          auto start = bench::clock_type::now();
          co_await ckpt.save(checkpoint_file);
          saves.push_back(seconds_since(start));
          start = bench::clock_type::now();
          co_await ckpt.restore(checkpoint_file);  // the file is in the page cache after the save
          restores.push_back(seconds_since(start));
          drop_cache(checkpoint_file);
          start = bench::clock_type::now();
          co_await ckpt.restore(checkpoint_file);
          cold_restores.push_back(seconds_since(start));
        }
      },
      {}, {}, fixed_shards_partitioner{4});
  fs::remove_all(work);

  const double gib = static_cast<double>(bytes) / double(1 << 30);
  const double write_s = bench::median(raw_writes), read_s = bench::median(raw_reads);
  fmt::print("pscoro checkpoint benchmark, {:%Y-%m-%d}: a {:.2f} GiB float32 table [{}, {}] in 4 shards on 2 ps "
             "(loopback), files in {}, medians of {}\n\n",
             fmt::localtime(std::time(nullptr)), gib, rows, columns, dir, rounds);
  fmt::print("{:<52} {:>10} {:>12}\n", "", "GiB/s", "/ raw disk");
  auto row = [&](std::string_view name, double s, double raw) {
    fmt::print("{:<52} {:>10.2f} {:>12.2f}\n", name, gib / s, raw / s);
  };
  row("raw disk write (32 MiB pwrites + fsync)", write_s, write_s);
  row("raw disk read (cold)", read_s, read_s);
  row("save (shards -> file, fsync, rename)", bench::median(saves), write_s);
  row("restore, file in page cache (checksums, then shards)", bench::median(restores), read_s);
  row("restore, cold file", bench::median(cold_restores), read_s);
  return 0;
}

// Checkpoint throughput: save and restore of a sharded table (1 GiB by default, 4 shards on 2 ps of
// an in-process cluster on loopback) against the disk's own write and read bandwidth, measured in
// the same run on a file of the same size in the same directory (32 MiB pwrites + fsync; reads
// after the file's pages are dropped from the page cache). Medians of --rounds; ratios to raw.
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

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"pscoro checkpoint benchmark: save and restore of a sharded table against raw disk bandwidth."};
  std::size_t mib = 1024;
  int rounds = 3;
  std::string dir = fs::temp_directory_path().string();
  app.add_option("--mib", mib, "table size in MiB")->check(CLI::PositiveNumber);
  app.add_option("--rounds", rounds, "measurements of each kind (the median is reported)")->check(CLI::PositiveNumber);
  app.add_option("--dir", dir, "where the files go (the disk being measured)");
  if (const auto stop = pscoro::tools::parse_command_line(app, argc, argv)) return *stop;

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

#include "metrics/library.hpp"

#include <pscoro/error.hpp>

#include "common/address.hpp"
#include "common/environment.hpp"
#include "common/log.hpp"

#include <fmt/format.h>

#include <sys/resource.h>
#include <unistd.h>

#include <charconv>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>

namespace pscoro::metrics {

namespace {

// When this process started, in seconds since the Unix epoch (Prometheus's
// process_start_time_seconds): field 22 of /proc/self/stat (clock ticks after boot) plus the boot
// time in /proc/stat. Read once: it never changes.
std::optional<double> process_start_time() {
  std::ifstream stat("/proc/self/stat");
  std::string line;
  if (!std::getline(stat, line)) return std::nullopt;
  // The command name (field 2) is in parentheses and may hold spaces: count fields after the last ')'.
  const auto close = line.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream fields(line.substr(close + 1));
  std::string field;
  for (int i = 3; i <= 22; ++i) {
    if (!(fields >> field)) return std::nullopt;
  }
  double ticks = 0;
  if (std::from_chars(field.data(), field.data() + field.size(), ticks).ec != std::errc{}) return std::nullopt;
  std::ifstream boot("/proc/stat");
  std::string key;
  double btime = -1;
  while (boot >> key) {
    if (key == "btime") {
      boot >> btime;
      break;
    }
    boot.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  const long hertz = ::sysconf(_SC_CLK_TCK);
  if (btime < 0 || hertz <= 0) return std::nullopt;
  return btime + ticks / static_cast<double>(hertz);
}

struct process_memory {
  std::uint64_t virtual_size = 0;
  std::uint64_t resident = 0;
};

// The process's virtual and resident memory in bytes, from /proc/self/statm (in pages).
std::optional<process_memory> memory_bytes() {
  std::FILE* statm = std::fopen("/proc/self/statm", "r");
  if (!statm) return std::nullopt;
  unsigned long long size = 0, resident = 0;
  const bool read = std::fscanf(statm, "%llu %llu", &size, &resident) == 2;
  std::fclose(statm);
  const long page = ::sysconf(_SC_PAGESIZE);
  if (!read || page <= 0) return std::nullopt;
  return process_memory{size * static_cast<std::uint64_t>(page), resident * static_cast<std::uint64_t>(page)};
}

// Resident and virtual memory from /proc/self/statm (pages), CPU time from getrusage, open file
// descriptors from /proc/self/fd and their limit, and the start time: Prometheus's process series.
std::vector<sample> process_samples() {
  std::vector<sample> out;
  static const std::optional<double> started = process_start_time();
  if (started) {
    out.push_back({"process_start_time_seconds", "Start time of the process since unix epoch in seconds.",
                   metric_type::gauge, {}, *started});
  }
  std::error_code ec;
  std::size_t open = 0;
  for (std::filesystem::directory_iterator it("/proc/self/fd", ec), end; !ec && it != end; it.increment(ec)) ++open;
  if (!ec) {
    // The iterator's own descriptor is among them while it reads: not one of the program's.
    out.push_back({"process_open_fds", "Number of open file descriptors.", metric_type::gauge, {},
                   static_cast<double>(open > 0 ? open - 1 : 0)});
  }
  rlimit files{};
  if (::getrlimit(RLIMIT_NOFILE, &files) == 0) {
    out.push_back({"process_max_fds", "Maximum number of open file descriptors.", metric_type::gauge, {},
                   static_cast<double>(files.rlim_cur)});
  }
  if (const auto memory = memory_bytes()) {
    out.push_back({"process_resident_memory_bytes", "Resident memory size in bytes.", metric_type::gauge, {},
                   static_cast<double>(memory->resident)});
    out.push_back({"process_virtual_memory_bytes", "Virtual memory size in bytes.", metric_type::gauge, {},
                   static_cast<double>(memory->virtual_size)});
  }
  rusage usage{};
  if (::getrusage(RUSAGE_SELF, &usage) == 0) {
    const auto seconds = [](const timeval& t) { return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) / 1e6; };
    out.push_back({"process_cpu_seconds_total", "Total user and system CPU time spent in seconds.",
                   metric_type::counter, {}, seconds(usage.ru_utime) + seconds(usage.ru_stime)});
  }
  return out;
}

struct library_metrics {
  std::mutex mutex;
  std::map<std::string, std::unique_ptr<peer_traffic>, std::less<>> peers;
  std::deque<registry::registration> registrations;
  counter dataset_elements;
  counter dataset_bytes;
  std::unique_ptr<exposer> served;
  std::string served_url;

  library_metrics() {
    auto& r = process_registry();
    registrations.push_back(r.add_collector(process_samples));
    registrations.push_back(r.add("pscoro_dataset_elements_total",
                                  "Elements taken from per-worker dataset iterators by worker functions.", {},
                                  dataset_elements));
    registrations.push_back(
        r.add("pscoro_dataset_bytes_read_total", "Bytes read from dataset files (uncompressed).", {}, dataset_bytes));
  }
};

// Never destroyed: connections and datasets may count until the very end of the process.
library_metrics& library() {
  static auto* the = new library_metrics;
  return *the;
}

constexpr std::size_t max_peers = 256;

}  // namespace

namespace detail {
counter& dataset_elements() { return library().dataset_elements; }
}  // namespace detail

counter& dataset_bytes_read() { return library().dataset_bytes; }

std::optional<std::uint64_t> resident_memory_bytes() {
  const auto memory = memory_bytes();
  return memory ? std::optional(memory->resident) : std::nullopt;
}

peer_traffic& traffic_of(std::string_view task) {
  auto& lib = library();
  const std::lock_guard lock(lib.mutex);
  if (auto it = lib.peers.find(task); it != lib.peers.end()) return *it->second;
  const std::string name = lib.peers.size() < max_peers ? std::string(task) : std::string("other");
  if (auto it = lib.peers.find(name); it != lib.peers.end()) return *it->second;
  auto& t = *lib.peers.emplace(name, std::make_unique<peer_traffic>()).first->second;
  auto& r = process_registry();
  const labels peer{{"peer", name}};
  lib.registrations.push_back(r.add("pscoro_peer_sent_bytes_total", "Bytes sent to a peer task, frame headers included.", peer, t.bytes_sent));
  lib.registrations.push_back(r.add("pscoro_peer_received_bytes_total", "Bytes received from a peer task, frame headers included.", peer, t.bytes_received));
  lib.registrations.push_back(r.add("pscoro_peer_sent_frames_total", "Frames sent to a peer task.", peer, t.frames_sent));
  lib.registrations.push_back(r.add("pscoro_peer_received_frames_total", "Frames received from a peer task.", peer, t.frames_received));
  // Computed when read: a peer that has gone silent shows a growing age with no update from us.
  lib.registrations.push_back(r.add_collector([&t, peer]() -> std::vector<sample> {
    const auto last = t.last_heard.load(std::memory_order_relaxed);
    if (last == 0) return {};
    const auto now = std::chrono::steady_clock::now().time_since_epoch().count();
    const std::chrono::steady_clock::duration age(now > last ? now - last : 0);
    return {{"pscoro_peer_heartbeat_age_seconds",
             "Seconds since a frame (a heartbeat, its reply or any other) last arrived from a peer task; a "
             "connection that opened heartbeats closes when this passes heartbeat_timeout with a heartbeat "
             "unanswered.",
             metric_type::gauge, peer, std::chrono::duration<double>(age).count()}};
  }));
  return t;
}

std::optional<std::uint16_t> metrics_port(std::optional<std::uint16_t> option) {
  const auto text = common::environment("PSCORO_METRICS_PORT");
  if (text.empty()) return option;
  unsigned value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc{} || end != text.data() + text.size() || value > 65535) {
    throw error(errc::invalid_argument,
                fmt::format("PSCORO_METRICS_PORT is '{}': expected a port number, 0..65535 (0 picks a free port)", text));
  }
  return static_cast<std::uint16_t>(value);
}

std::uint16_t serve_process_metrics(const std::string& task, const std::string& listen_host,
                                    const std::string& shown_host, std::uint16_t port) {
  auto& lib = library();
  const std::lock_guard lock(lib.mutex);
  if (!lib.served) {
    lib.served = std::make_unique<exposer>(common::format_address(listen_host, std::to_string(port)));
    lib.served_url =
        fmt::format("http://{}/metrics", common::format_address(shown_host, std::to_string(lib.served->port())));
  }
  log::info("{} metrics at {}", task, lib.served_url);
  return lib.served->port();
}

}  // namespace pscoro::metrics

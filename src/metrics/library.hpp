// The metrics pscoro keeps about itself that belong to no one object: traffic per peer task, the
// process's memory and CPU (collected when read), dataset input; and serving the process's
// registry when a task is asked to (PSCORO_METRICS_PORT, or an option in code).
#pragma once

#include <pscoro/metrics.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace pscoro::metrics {

/// Bytes and frames exchanged with one peer task, over all its connections in this process, and
/// when it was last heard from.
struct peer_traffic {
  counter bytes_sent;
  counter bytes_received;
  counter frames_sent;
  counter frames_received;

  /// Notes that a frame (a Heartbeat, its reply, or anything else) arrived from the peer at `when`.
  void heard(std::chrono::steady_clock::time_point when) noexcept {
    last_heard.store(when.time_since_epoch().count(), std::memory_order_relaxed);
  }
  /// steady_clock ticks of the last heard(); 0 before the first.
  std::atomic<std::chrono::steady_clock::rep> last_heard{0};
};

/// The traffic counters of peer `task` ("ps:0"), made and registered on first use and kept for the
/// process's life (a counter must not go back when a connection closes), with the gauge
/// pscoro_peer_heartbeat_age_seconds: the seconds since the peer was last heard from, computed
/// when read. At most 256 peers get their own; the next ones share peer="other", so no peer can
/// grow the registry without bound. Thread-safe; call it when a connection's peer is known, not
/// per frame.
peer_traffic& traffic_of(std::string_view task);

/// This process's resident memory, as process_resident_memory_bytes gives it (/proc/self/statm),
/// or none where that cannot be read.
std::optional<std::uint64_t> resident_memory_bytes();

/// Dataset input: elements taken from per-worker iterators and bytes read from files.
counter& dataset_bytes_read();

/// PSCORO_METRICS_PORT when set (0..65535), else `option`. Throws errc::invalid_argument naming the
/// variable when it is set to anything else.
std::optional<std::uint16_t> metrics_port(std::optional<std::uint16_t> option);

/// Serves process_registry() at http://HOST:`port`/metrics if it is not served yet (one responder
/// per process, whichever task asks first), listening on `listen_host`, and logs
/// "<task> metrics at http://<shown_host>:PORT/metrics". Throws std::system_error when it cannot
/// listen. Returns the port served.
std::uint16_t serve_process_metrics(const std::string& task, const std::string& listen_host,
                                    const std::string& shown_host, std::uint16_t port);

}  // namespace pscoro::metrics

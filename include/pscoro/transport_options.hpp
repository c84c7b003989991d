// Limits and deadlines of pscoro connections, shared by servers and the coordinator.
#pragma once

#include <chrono>
#include <cstdint>

namespace pscoro {

struct transport_options {
  /// Largest protobuf part of a frame; a larger frame closes the connection.
  std::uint32_t max_header_bytes = 16u << 20;
  /// Largest tensor payload of one frame (all segments).
  std::uint64_t max_payload_bytes = std::uint64_t{4} << 30;
  /// A peer that has not completed the handshake by then is disconnected.
  std::chrono::milliseconds handshake_timeout{std::chrono::seconds(10)};
  /// How long to keep retrying to reach a task that is not up yet (TF retries for ~3 minutes).
  std::chrono::milliseconds connect_timeout{std::chrono::minutes(3)};
  /// A connection this side opened sends a Heartbeat when nothing has arrived on it for this long,
  /// so a dead or hung task is noticed even while idle (TF notices only when a call fails).
  std::chrono::milliseconds heartbeat_interval{std::chrono::seconds(1)};
  /// The connection is closed as dead (errc::unavailable, naming the task) when a Heartbeat has had
  /// no reply, and nothing else arrived, for this long. 0 turns heartbeats off.
  std::chrono::milliseconds heartbeat_timeout{std::chrono::seconds(10)};
};

}  // namespace pscoro

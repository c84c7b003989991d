// Limits, deadlines and credentials of pscoro connections, shared by servers and the coordinator.
#pragma once

#include <pscoro/config.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace pscoro {

struct PSCORO_API transport_options {
  /// Largest protobuf part of a frame; a larger frame closes the connection.
  std::uint32_t max_header_bytes = 16u << 20;
  /// Largest tensor payload of one frame (all segments).
  std::uint64_t max_payload_bytes = std::uint64_t{4} << 30;
  /// Largest frame of a handshake (Hello, Challenge, Proof, Welcome), which carry no payload:
  /// all a peer can make a server hold before it has proved the cluster secret.
  std::uint32_t max_handshake_bytes = 256u << 10;
  /// A peer that has not completed the handshake by then is disconnected.
  std::chrono::milliseconds handshake_timeout{std::chrono::seconds(10)};
  /// A frame that has started to arrive and then gets no byte for this long closes the connection
  /// (a peer that stalls mid-frame would otherwise hold it, and what the frame needed, for ever).
  std::chrono::milliseconds frame_stall_timeout{std::chrono::seconds(30)};
  /// Connections a server (or the chief's announcement listener) holds at once, handshakes
  /// included; one more is refused with errc::resource_exhausted. Raise it (and the process's
  /// file descriptor limit) for clusters of more than a few thousand tasks.
  std::size_t max_connections = 4096;
  /// Handshakes a server (or the chief's announcement listener) has in progress at once: accepted
  /// connections whose peer has not yet proved who it is (or that it holds the secret). One more is
  /// refused with errc::resource_exhausted, which a pscoro peer retries. They count in
  /// max_connections too.
  std::size_t max_handshakes = 256;
  /// Of those, from one IP address (strangers from one machine cannot take every place; tasks of
  /// one machine that reach a server at once beyond it retry).
  std::size_t max_handshakes_per_address = 64;
  /// Bytes the frames of the handshakes in progress hold together (their messages, and their read
  /// buffers beyond the first 64 KiB; a Hello carries the cluster spec, up to
  /// max_handshake_bytes): a Hello that would need more is refused with errc::resource_exhausted.
  /// With max_handshakes, what strangers can make a server hold: about 256 x 115 KiB + 16 MiB by
  /// default.
  std::uint64_t max_handshake_bytes_total = std::uint64_t{16} << 20;
  /// Bytes a task holds for one connection's requests, from when they arrive until their answers
  /// are written (the request while it is served, with the most its answer can hold for a ps's
  /// reads, then its answer while it waits to be sent); past this it stops reading from that
  /// connection until some answers are written (backpressure, not an error). A peer, even one that
  /// never reads its answers, can so make a ps hold this plus the last request read and its answer.
  std::uint64_t max_bytes_in_flight = std::uint64_t{1} << 30;
  /// How long to keep retrying to reach a task that is not up yet (TF retries for ~3 minutes).
  std::chrono::milliseconds connect_timeout{std::chrono::minutes(3)};
  /// A connection this side opened sends a Heartbeat when nothing has arrived on it for this long,
  /// so a dead or hung task is noticed even while idle (TF notices only when a call fails).
  std::chrono::milliseconds heartbeat_interval{std::chrono::seconds(1)};
  /// The connection is closed as dead (errc::unavailable, naming the task) when a Heartbeat has had
  /// no reply, and nothing else arrived, for this long. 0 turns heartbeats off.
  std::chrono::milliseconds heartbeat_timeout{std::chrono::seconds(10)};

  /// The cluster secret every task of the job shares (at least 16 bytes; any bytes). With one,
  /// both ends of every connection prove that they hold it (HMAC-SHA256 challenge and response;
  /// the secret never crosses the wire) and a task that cannot is refused. Empty: read from the
  /// file named by the environment variable PSCORO_AUTH_SECRET_FILE, if set (trailing line breaks
  /// ignored). pscoro-launch makes a fresh one per job.
  std::string auth_secret;
  /// Without a secret a task listens on loopback only, because anyone who can reach its port could
  /// take the job over; true (or PSCORO_ALLOW_INSECURE=1) lets it listen anywhere, with a warning.
  bool allow_insecure = false;
  /// Mutual TLS (OpenSSL 3, TLS 1.3): with all three set, every connection is encrypted and both
  /// ends present a certificate (`tls_cert_file`, PEM chain; `tls_key_file`, its PEM key) that the
  /// other verifies against the cluster CA (`tls_ca_file`). A peer without one is refused. All
  /// empty: read from PSCORO_TLS_CERT_FILE, PSCORO_TLS_KEY_FILE, PSCORO_TLS_CA_FILE; all empty
  /// there too: no TLS. Use it with the cluster secret or alone.
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_ca_file;
};

}  // namespace pscoro

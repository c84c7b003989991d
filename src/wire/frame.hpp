// Frames as docs/protocol.md specifies them: a 32-byte fixed header, a protobuf wire::FrameHeader, then
// raw tensor segments. Reading checks every limit before allocating; bad input throws
// error(errc::protocol_error) naming what was wrong.
#pragma once

#include <pscoro/error.hpp>
#include <pscoro/tensor.hpp>

#include "pscoro.pb.h"

#include <asio/awaitable.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/ssl/stream.hpp>

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace pscoro::wire {

inline constexpr std::uint32_t frame_magic = 0x52435350;  // bytes "PSCR" in little-endian order
inline constexpr std::uint16_t protocol_version = 3;
inline constexpr std::size_t fixed_header_size = 32;

enum class frame_kind : std::uint16_t { hello = 1, welcome = 2, request = 3, response = 4, challenge = 5, proof = 6 };

/// Bytes that many connections draw from together: what the frame readers of strangers still in
/// their handshake may hold beyond their first buffer, over all of a server's connections
/// (transport_options::max_handshake_bytes_total). One executor uses it: no locking.
class byte_budget {
 public:
  explicit byte_budget(std::uint64_t total) noexcept : total_(total), left_(total) {}
  /// Draws `bytes` if that many are left.
  bool take(std::uint64_t bytes) noexcept {
    if (bytes > left_) return false;
    left_ -= bytes;
    return true;
  }
  void give(std::uint64_t bytes) noexcept { left_ += bytes; }
  std::uint64_t total() const noexcept { return total_; }
  std::uint64_t left() const noexcept { return left_; }

 private:
  std::uint64_t total_;
  std::uint64_t left_;
};

struct frame_limits {
  std::uint32_t max_header_bytes = 16u << 20;        ///< protobuf part
  std::uint64_t max_payload_bytes = std::uint64_t{4} << 30;  ///< all tensor segments together
  std::uint32_t max_segments = 1u << 16;
  /// A connection whose frame has started and then gets no byte for this long is closed (0: never).
  std::chrono::milliseconds stall_timeout{0};
  /// Bytes of requests being served and of their answers not yet written, per connection; past
  /// it, reading pauses.
  std::uint64_t max_bytes_in_flight = std::uint64_t{1} << 30;
  /// When set, a frame's header bytes (the message parsed from them) and the read buffer's growth
  /// past its first size are drawn from it (a frame that would need more than is left is refused:
  /// errc::resource_exhausted); they are given back when the limits change (the handshake is over)
  /// or the reader goes.
  std::shared_ptr<byte_budget> buffer_budget;
};

struct fixed_header {
  frame_kind kind = frame_kind::request;
  std::uint64_t request_id = 0;
  std::uint32_t header_bytes = 0;
  std::uint64_t payload_bytes = 0;
};

/// Checks magic, version, kind and limits; throws errc::protocol_error.
fixed_header parse_fixed_header(std::span<const std::byte, fixed_header_size> bytes,
                                const frame_limits& limits);
std::array<std::byte, fixed_header_size> encode_fixed_header(const fixed_header& header);

/// Fills the last segment of a frame being sent, a step at a time, so that each part is sent while
/// it is in cache: each call fills the next part (about segment_produce_step bytes) and returns how
/// much of the segment is filled now, all of it when done. A connection calls it on its executor,
/// once per turn whatever the peer reads (so what it holds, a ps's variable, is let go in bounded
/// time), and drops it when done, or with the frame when the connection closes (a producer of an
/// empty segment is dropped at once: encode()).
using segment_producer = std::function<std::size_t()>;

/// How much a segment_producer fills per call: a turn of the executor stays short (a heartbeat
/// waits at most this long), and the part is still in the L2 cache when it is sent.
inline constexpr std::size_t segment_produce_step = std::size_t{256} << 10;

struct frame {
  frame_kind kind = frame_kind::request;
  std::uint64_t request_id = 0;
  FrameHeader message;  ///< the protobuf part (the body and the segment sizes)
  std::vector<byte_buffer> segments;
  std::uint64_t wire_bytes = 0;  ///< of a frame read: its size on the wire, headers included
  /// Fills the last segment as it is sent (see segment_producer); empty: the segments are complete.
  segment_producer produce_last;
};

/// Runs `f`'s producer to the end, if it has one: for a frame used where it is not sent by a
/// connection (a test, a tool calling ps_service::serve).
void produce_whole(frame& f);

/// Checks that `message` fits `header`: its body matches the kind and its segment sizes add up to
/// the payload; throws errc::protocol_error.
void check_body(const FrameHeader& message, const fixed_header& header, const frame_limits& limits);

/// The bytes of a frame ready for one gather write: fixed header + protobuf, then the segments.
struct encoded_frame {
  std::string head;
  std::vector<byte_buffer> segments;
  segment_producer produce_last;  ///< the frame's, until the last segment is filled
  std::size_t produced = 0;       ///< bytes of the last segment filled, while produce_last runs
  std::size_t sent = 0;           ///< bytes of the last segment handed to a write, once it started
  bool started = false;           ///< whether its head went out (the rest follows as produced)
  /// Bytes its connection counts against max_bytes_in_flight until it is written (an answer's).
  std::uint64_t held = 0;
  /// Whether all of the last segment is filled.
  bool complete() const noexcept { return !produce_last; }
};
encoded_frame encode(frame f);

/// Attaches `t`'s bytes to `f` as a new segment (shared, not copied) and describes it in `ref`.
void put_tensor(frame& f, TensorRef& ref, const tensor& t);
/// The tensor `ref` describes; throws errc::invalid_argument if it does not match its segment.
tensor get_tensor(const frame& f, const TensorRef& ref);

/// Told, while a segment is read, the front of it that has arrived: a longer prefix each call, the
/// last one the whole segment, all before the frame is returned. A caller can so use the first rows
/// of a large reply while the rest is still on its way, while they are in cache. Runs inside the
/// read, on its executor; must not throw.
using arrival_handler = std::function<void(std::span<const std::byte> arrived)>;

/// Where a segment is read to: `buffer` when it has exactly the segment's size (else a fresh buffer,
/// and `on_arrival` is not called), telling `on_arrival` (if set) of its progress.
struct segment_target {
  byte_buffer buffer;
  arrival_handler on_arrival;
};

/// Where segment `index` (of `size` bytes) of the frame with `header` is read to (an empty target:
/// a fresh buffer).
using segment_destination =
    std::function<segment_target(const fixed_header& header, std::size_t index, std::uint64_t size)>;

/// At most this much of a segment per system call. Small steps tell the sender of freed buffer
/// space sooner, so on loopback both sides copy at once rather than in turns (likely): a 64 MiB
/// assign took 14.7-17.3 ms in 64 KiB steps, 15.7-18.1 in 128 KiB, 18.0-20.4 in 256 KiB (and more
/// in 1 and 4 MiB); a 100k-row lookup, whose rows are placed as they arrive, measured the same in 64
/// and 256 KiB steps (docs/design.md, "Writes in one call, reads in 64 KiB steps").
inline constexpr std::size_t segment_read_step = std::size_t{64} << 10;

/// Reads frames from a stream through a buffer; segments large enough are read straight into
/// their own storage, or into the destination the caller names (no copy), small frames arrive in
/// one read.
class frame_reader {
 public:
  /// The buffer is allocated by the first read: a connection refused before it reads (a stranger
  /// past a server's handshake limits) holds none.
  explicit frame_reader(frame_limits limits) : limits_(std::move(limits)) {}
  frame_reader(const frame_reader&) = delete;
  frame_reader& operator=(const frame_reader&) = delete;
  ~frame_reader() { give_back_drawn(); }

  /// The read buffer's size until a frame needs more.
  static constexpr std::size_t first_buffer_bytes = 64 * 1024;

  /// The next frame from `stream` (a TCP socket, or a TLS stream over one: both are instantiated),
  /// or nullopt when the peer closed cleanly between frames. Throws errc::protocol_error for bad
  /// input (including a frame cut short) and std::system_error for socket errors.
  /// `destination` (may be null) must outlive the read.
  template <class Stream>
  asio::awaitable<std::optional<frame>> read(Stream& stream, const segment_destination* destination = nullptr);

  const frame_limits& limits() const noexcept { return limits_; }
  /// Whether a frame has started to arrive and is not complete yet.
  bool mid_frame() const noexcept { return mid_frame_; }
  /// Bytes received so far, for telling a stalled peer from a slow one.
  std::uint64_t bytes_received() const noexcept { return bytes_received_ + segment_progress_; }
  /// The limits for the frames after this one (the handshake runs under smaller ones). What the
  /// buffer drew from a budget the new limits do not name goes back to it.
  void set_limits(frame_limits limits) noexcept {
    if (limits.buffer_budget != limits_.buffer_budget) give_back_drawn();
    limits_ = std::move(limits);
  }
  /// Bytes the buffer holds drawn from the limits' buffer_budget.
  std::uint64_t drawn() const noexcept { return drawn_; }

 private:
  template <class Stream>
  asio::awaitable<bool> fill(Stream& stream, std::size_t n, std::size_t frame_offset);
  std::size_t buffered() const noexcept { return end_ - begin_; }
  /// Draws `bytes` from the limits' buffer_budget, if they name one; errc::resource_exhausted,
  /// naming the `frame_part` that needs them, when fewer are left.
  void draw(std::uint64_t bytes, std::uint64_t frame_part);
  void give_back_drawn() noexcept {
    if (drawn_ && limits_.buffer_budget) limits_.buffer_budget->give(drawn_);
    drawn_ = 0;
  }

  frame_limits limits_;
  std::uint64_t drawn_ = 0;  // from limits_.buffer_budget
  bool mid_frame_ = false;
  std::uint64_t bytes_received_ = 0;
  std::uint64_t segment_progress_ = 0;  // of the segment read under way
  std::vector<std::byte> buffer_;
  std::size_t begin_ = 0;
  std::size_t end_ = 0;
};

/// A TLS stream over a connection's TCP socket.
using tls_stream = asio::ssl::stream<asio::ip::tcp::socket&>;

/// A protocol_error with a formatted message.
[[noreturn]] void protocol_violation(std::string message);

}  // namespace pscoro::wire

#include "wire/frame.hpp"

#include <fmt/format.h>

#include <asio/buffer.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/read.hpp>
#include <asio/ssl/error.hpp>
#include <asio/use_awaitable.hpp>

#include <cstring>
#include <limits>

namespace pscoro::wire {
namespace {

template <class T>
T load_le(const std::byte* p) {
  T value = 0;
  for (std::size_t i = 0; i < sizeof(T); ++i) value |= static_cast<T>(std::to_integer<std::uint8_t>(p[i])) << (8 * i);
  return value;
}

template <class T>
void store_le(std::byte* p, T value) {
  for (std::size_t i = 0; i < sizeof(T); ++i) p[i] = static_cast<std::byte>((value >> (8 * i)) & 0xff);
}

std::string_view kind_name(frame_kind kind) {
  switch (kind) {
    case frame_kind::hello: return "hello";
    case frame_kind::welcome: return "welcome";
    case frame_kind::request: return "request";
    case frame_kind::response: return "response";
    case frame_kind::challenge: return "challenge";
    case frame_kind::proof: return "proof";
  }
  return "unknown";
}

bool body_matches(FrameHeader::BodyCase body, frame_kind kind) {
  switch (kind) {
    case frame_kind::hello: return body == FrameHeader::kHello;
    case frame_kind::welcome: return body == FrameHeader::kWelcome;
    case frame_kind::request: return body == FrameHeader::kRequest;
    case frame_kind::response: return body == FrameHeader::kResponse;
    case frame_kind::challenge: return body == FrameHeader::kChallenge;
    case frame_kind::proof: return body == FrameHeader::kProof;
  }
  return false;
}

}  // namespace

void protocol_violation(std::string message) { throw error(errc::protocol_error, std::move(message)); }

fixed_header parse_fixed_header(std::span<const std::byte, fixed_header_size> bytes,
                                const frame_limits& limits) {
  const std::byte* p = bytes.data();
  if (const auto magic = load_le<std::uint32_t>(p); magic != frame_magic) {
    protocol_violation(fmt::format("bad magic 0x{:08x} (expected 0x{:08x}, \"PSCR\"): not a pscoro peer",
                                   magic, frame_magic));
  }
  if (const auto version = load_le<std::uint16_t>(p + 4); version != protocol_version) {
    protocol_violation(fmt::format("unsupported protocol version {} (this build speaks version {})",
                                   version, protocol_version));
  }
  fixed_header header;
  const auto kind = load_le<std::uint16_t>(p + 6);
  if (kind < 1 || kind > 6) protocol_violation(fmt::format("unknown frame kind {}", kind));
  header.kind = static_cast<frame_kind>(kind);
  header.request_id = load_le<std::uint64_t>(p + 8);
  header.header_bytes = load_le<std::uint32_t>(p + 16);
  if (const auto reserved = load_le<std::uint32_t>(p + 20); reserved != 0) {
    protocol_violation(fmt::format("reserved header field is 0x{:x}, must be 0", reserved));
  }
  header.payload_bytes = load_le<std::uint64_t>(p + 24);
  if (header.header_bytes > limits.max_header_bytes) {
    protocol_violation(fmt::format("frame header of {} bytes exceeds the limit of {} bytes",
                                   header.header_bytes, limits.max_header_bytes));
  }
  if (header.payload_bytes > limits.max_payload_bytes) {
    protocol_violation(fmt::format("frame payload of {} bytes exceeds the limit of {} bytes",
                                   header.payload_bytes, limits.max_payload_bytes));
  }
  return header;
}

std::array<std::byte, fixed_header_size> encode_fixed_header(const fixed_header& header) {
  std::array<std::byte, fixed_header_size> bytes{};
  std::byte* p = bytes.data();
  store_le<std::uint32_t>(p, frame_magic);
  store_le<std::uint16_t>(p + 4, protocol_version);
  store_le<std::uint16_t>(p + 6, static_cast<std::uint16_t>(header.kind));
  store_le<std::uint64_t>(p + 8, header.request_id);
  store_le<std::uint32_t>(p + 16, header.header_bytes);
  store_le<std::uint32_t>(p + 20, 0);
  store_le<std::uint64_t>(p + 24, header.payload_bytes);
  return bytes;
}

void check_body(const FrameHeader& message, const fixed_header& header, const frame_limits& limits) {
  if (!body_matches(message.body_case(), header.kind)) {
    protocol_violation(fmt::format("a {} frame carries a message of another kind (body case {})",
                                   kind_name(header.kind), static_cast<int>(message.body_case())));
  }
  if (static_cast<std::uint64_t>(message.segment_sizes_size()) > limits.max_segments) {
    protocol_violation(fmt::format("frame has {} segments, the limit is {}", message.segment_sizes_size(),
                                   limits.max_segments));
  }
  std::uint64_t total = 0;
  for (const auto size : message.segment_sizes()) {
    if (size > header.payload_bytes - total) {
      protocol_violation(fmt::format("segment sizes add up to more than the payload of {} bytes",
                                     header.payload_bytes));
    }
    total += size;
  }
  if (total != header.payload_bytes) {
    protocol_violation(fmt::format("segment sizes add up to {} bytes but the payload is {} bytes", total,
                                   header.payload_bytes));
  }
}

encoded_frame encode(frame f) {
  f.message.clear_segment_sizes();
  std::uint64_t payload = 0;
  for (const auto& segment : f.segments) {
    f.message.add_segment_sizes(segment.size());
    payload += segment.size();
  }
  const std::size_t header_bytes = f.message.ByteSizeLong();
  encoded_frame out;
  out.head.resize(fixed_header_size + header_bytes);
  const auto fixed = encode_fixed_header({f.kind, f.request_id, static_cast<std::uint32_t>(header_bytes), payload});
  std::memcpy(out.head.data(), fixed.data(), fixed.size());
  f.message.SerializeWithCachedSizesToArray(reinterpret_cast<std::uint8_t*>(out.head.data() + fixed_header_size));
  out.segments = std::move(f.segments);
  // A producer of an empty segment has nothing to fill: dropped here, with what it holds.
  if (f.produce_last && !out.segments.empty() && out.segments.back().size() > 0) {
    out.produce_last = std::move(f.produce_last);
  }
  return out;
}

void produce_whole(frame& f) {
  if (!f.produce_last) return;
  const std::size_t size = f.segments.empty() ? 0 : f.segments.back().size();
  for (std::size_t filled = 0; filled < size;) {
    const std::size_t now = f.produce_last();
    if (now <= filled) throw error(errc::internal, "a segment producer stopped short of its segment");
    filled = now;
  }
  f.produce_last = nullptr;
}

void put_tensor(frame& f, TensorRef& ref, const tensor& t) {
  ref.set_dtype(static_cast<std::uint32_t>(t.type()));
  ref.clear_shape();
  for (const auto dim : t.shape()) ref.add_shape(dim);
  ref.set_segment(static_cast<std::uint32_t>(f.segments.size()));
  f.segments.push_back(t.bytes());
}

tensor get_tensor(const frame& f, const TensorRef& ref) {
  const auto type = static_cast<dtype>(ref.dtype());
  if (ref.dtype() > 255 || !is_valid(type)) {
    throw error(errc::invalid_argument, fmt::format("tensor has unknown dtype {}", ref.dtype()));
  }
  if (ref.segment() >= f.segments.size()) {
    throw error(errc::invalid_argument, fmt::format("tensor refers to segment {} but the frame has {}",
                                                    ref.segment(), f.segments.size()));
  }
  shape_type shape(ref.shape().begin(), ref.shape().end());
  // A hostile shape must not wrap around to the segment size.
  const auto bytes = checked_size_bytes(type, shape);
  if (!bytes) throw error(errc::invalid_argument, fmt::format("tensor shape {} is too large", to_string(shape)));
  const auto& segment = f.segments[ref.segment()];
  if (*bytes != segment.size()) {
    throw error(errc::invalid_argument,
                fmt::format("{} tensor of shape {} needs {} bytes but its segment has {}", name_of(type),
                            to_string(shape), *bytes, segment.size()));
  }
  return {type, std::move(shape), segment};
}

namespace {

// The peer closed: a TCP end of file, or a TLS stream closed without a close_notify (pscoro closes
// sockets without one, as the frame protocol says where its data ends).
bool closed_by_peer(const std::error_code& ec) {
  return ec == asio::error::eof || ec == asio::ssl::error::stream_truncated;
}

}  // namespace

void frame_reader::draw(std::uint64_t bytes, std::uint64_t frame_part) {
  const auto& budget = limits_.buffer_budget;
  if (!budget || bytes == 0) return;
  if (!budget->take(bytes)) {
    throw error(errc::resource_exhausted,
                fmt::format("a {}-byte frame part does not fit: the connections still in their handshake hold {} of "
                            "the {} bytes they may (transport_options::max_handshake_bytes_total)",
                            frame_part, budget->total() - budget->left(), budget->total()));
  }
  drawn_ += bytes;
}

template <class Stream>
asio::awaitable<bool> frame_reader::fill(Stream& socket, std::size_t n, std::size_t frame_offset) {
  if (buffered() >= n) co_return true;
  if (buffer_.empty()) buffer_.resize(first_buffer_bytes);
  if (buffer_.size() - begin_ < n) {
    // Compact, then grow if the frame part is larger than the buffer (bounded by the limits).
    std::memmove(buffer_.data(), buffer_.data() + begin_, buffered());
    end_ -= begin_;
    begin_ = 0;
    if (buffer_.size() < n) {
      draw(n - buffer_.size(), n);
      buffer_.resize(n);
    }
  }
  while (buffered() < n) {
    mid_frame_ = frame_offset + buffered() > 0;
    auto [ec, got] = co_await socket.async_read_some(asio::buffer(buffer_.data() + end_, buffer_.size() - end_),
                                                     asio::experimental::as_tuple(asio::use_awaitable));
    bytes_received_ += got;
    if (closed_by_peer(ec)) {
      if (frame_offset == 0 && buffered() == 0) co_return false;
      protocol_violation(fmt::format("truncated frame: the peer closed the connection {} bytes into a frame",
                                     frame_offset + buffered()));
    }
    if (ec) throw std::system_error(ec);
    end_ += got;
  }
  co_return true;
}

template <class Stream>
asio::awaitable<std::optional<frame>> frame_reader::read(Stream& socket, const segment_destination* destination) {
  if (!co_await fill(socket, fixed_header_size, 0)) co_return std::nullopt;
  const auto header = parse_fixed_header(
      std::span<const std::byte, fixed_header_size>(buffer_.data() + begin_, fixed_header_size), limits_);
  begin_ += fixed_header_size;

  // Under a budget the message parsed from the header counts too: it lives as long as the frame.
  draw(header.header_bytes, header.header_bytes);
  co_await fill(socket, header.header_bytes, fixed_header_size);
  frame f;
  f.kind = header.kind;
  f.request_id = header.request_id;
  f.wire_bytes = fixed_header_size + header.header_bytes + header.payload_bytes;
  if (!f.message.ParseFromArray(buffer_.data() + begin_, static_cast<int>(header.header_bytes))) {
    protocol_violation(fmt::format("unparsable {}-byte frame header (not a pscoro.wire.FrameHeader)", header.header_bytes));
  }
  begin_ += header.header_bytes;
  check_body(f.message, header, limits_);

  // Segments: take what is already buffered, then read the rest straight into the segments.
  std::vector<asio::mutable_buffer> rest;
  std::size_t offset = fixed_header_size + header.header_bytes;
  // The segments whose destination follows their arrival; `unread_at`: where their unread part
  // starts within `rest`.
  struct followed_segment {
    std::span<const std::byte> bytes;
    std::size_t have;
    std::size_t unread_at;
    std::size_t told;
    arrival_handler on_arrival;
  };
  std::vector<followed_segment> followed;
  std::size_t unread = 0;
  for (const auto size : f.message.segment_sizes()) {
    segment_target target = destination ? (*destination)(header, f.segments.size(), size) : segment_target{};
    if (target.buffer.size() != size) target = {byte_buffer(size), {}};
    byte_buffer& segment = target.buffer;
    const std::size_t have = std::min<std::size_t>(size, buffered());
    if (have) std::memcpy(segment.data(), buffer_.data() + begin_, have);
    begin_ += have;
    if (target.on_arrival && size) {
      followed.push_back({std::span<const std::byte>(segment.data(), size), have, unread, 0, std::move(target.on_arrival)});
    }
    if (have < size) {
      rest.emplace_back(segment.data() + have, size - have);
      unread += size - have;
    }
    offset += size;
    f.segments.push_back(std::move(segment));
  }
  // Tells each followed segment how much of it has arrived once `transferred` bytes of `rest` have.
  const auto tell_arrivals = [&followed](std::size_t transferred) {
    for (auto& segment : followed) {
      const std::size_t missing = segment.bytes.size() - segment.have;
      const std::size_t arrived =
          segment.have + (transferred > segment.unread_at ? std::min(missing, transferred - segment.unread_at) : 0);
      if (arrived > segment.told) {
        segment.told = arrived;
        segment.on_arrival(segment.bytes.first(arrived));
      }
    }
  };
  if (!rest.empty()) {
    mid_frame_ = true;
    // Progress is counted as it arrives: a large segment that keeps coming is not a stall.
    auto [ec, got] = co_await asio::async_read(
        socket, rest,
        [this, &tell_arrivals](const std::error_code& error, std::size_t transferred) -> std::size_t {
          segment_progress_ = transferred;
          if (error) return 0;
          tell_arrivals(transferred);
          return segment_read_step;
        },
        asio::experimental::as_tuple(asio::use_awaitable));
    segment_progress_ = 0;
    bytes_received_ += got;
    if (closed_by_peer(ec)) {
      protocol_violation(fmt::format("truncated frame: the peer closed the connection {} bytes short of the "
                                     "{}-byte frame",
                                     asio::buffer_size(rest) - got, offset));
    }
    if (ec) throw std::system_error(ec);
  }
  // The last read is not shown to the completion condition (asio stops when the buffers are full).
  tell_arrivals(unread);
  if (begin_ == end_) begin_ = end_ = 0;
  mid_frame_ = buffered() > 0;
  co_return f;
}

template asio::awaitable<std::optional<frame>> frame_reader::read(asio::ip::tcp::socket&, const segment_destination*);
template asio::awaitable<std::optional<frame>> frame_reader::read(tls_stream&, const segment_destination*);

}  // namespace pscoro::wire

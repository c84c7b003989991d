// wire::frame_reader over whole byte streams from a real loopback socket: frames are read until
// the stream ends or one is refused. Every frame it returns must respect the limits it was given,
// every refusal must be a protocol_error, and nothing may be allocated beyond the limits.
//
// Byte 0 picks the limits (the handshake's, or small ones for frames with payload) and whether
// segments are read into buffers a segment_destination names (those at even indices followed as
// they arrive: longer prefixes of their own buffer, each already holding its final bytes, the last
// one whole); the rest is the stream.
#include "fuzz_support.hpp"

#include <asio/read.hpp>

#include <cstring>
#include <map>
#include <string>

using namespace pscoro;

namespace {

asio::awaitable<void> read_all(asio::ip::tcp::socket& socket, wire::frame_limits limits, bool with_destination) {
  wire::frame_reader reader(limits);
  // Segments at even indices go to a buffer of their size, their arrival followed; the others to
  // one of a wrong size, which the reader must replace (and then never tell of its arrival). Each
  // prefix told is copied when it is told: it must already hold its final bytes.
  struct arrival {
    const std::byte* data;
    std::size_t size;
    std::string bytes;  // as they were when told
  };
  std::map<std::size_t, std::vector<arrival>> told;  // by segment, of the frame being read
  const wire::segment_destination destination = [&told](const wire::fixed_header&, std::size_t index, std::uint64_t size) {
    wire::segment_target target{byte_buffer(index % 2 == 0 ? size : size / 2), {}};
    target.on_arrival = [&told, index](std::span<const std::byte> arrived) {
      if (index % 2 != 0) fuzz::broken("the arrival of a segment read into a fresh buffer was told");
      told[index].push_back({arrived.data(), arrived.size(),
                             std::string(reinterpret_cast<const char*>(arrived.data()), arrived.size())});
    };
    return target;
  };
  try {
    while (true) {
      told.clear();
      auto f = co_await reader.read(socket, with_destination ? &destination : nullptr);
      if (!f) break;
      for (std::size_t i = 0; with_destination && i < f->segments.size(); ++i) {
        const auto& segment = f->segments[i];
        const auto it = told.find(i);
        if (i % 2 != 0 || segment.size() == 0) {
          if (it != told.end()) fuzz::broken("the arrival of an empty or replaced segment was told");
          continue;
        }
        if (it == told.end() || it->second.back().size != segment.size()) {
          fuzz::broken("segment " + std::to_string(i) + "'s whole arrival was not told");
        }
        for (std::size_t k = 0; k < it->second.size(); ++k) {
          const auto& a = it->second[k];
          if (a.data != segment.data() || (k > 0 && a.size <= it->second[k - 1].size)) {
            fuzz::broken("an arrival told was not a longer prefix of segment " + std::to_string(i) + "'s buffer");
          }
          if (std::memcmp(a.bytes.data(), segment.data(), a.size) != 0) {
            fuzz::broken("segment " + std::to_string(i) + "'s arrival was told before its bytes were in place");
          }
        }
      }
      if (!with_destination && !told.empty()) fuzz::broken("an arrival was told without a destination");
      std::uint64_t payload = 0;
      for (const auto& segment : f->segments) payload += segment.size();
      if (f->segments.size() > limits.max_segments || payload > limits.max_payload_bytes ||
          // The protobuf part on the wire may be longer than the message re-encoded (unknown or
          // repeated fields), never longer than its limit.
          f->wire_bytes < wire::fixed_header_size + payload ||
          f->wire_bytes - wire::fixed_header_size - payload > limits.max_header_bytes ||
          static_cast<int>(f->segments.size()) != f->message.segment_sizes_size()) {
        fuzz::broken("a frame past the limits or inconsistent with its sizes: " + f->message.ShortDebugString());
      }
      for (int i = 0; i < f->message.segment_sizes_size(); ++i) {
        if (f->segments[static_cast<std::size_t>(i)].size() != f->message.segment_sizes(i)) {
          fuzz::broken("segment " + std::to_string(i) + " does not have its announced size");
        }
      }
    }
  } catch (const error& e) {
    if (e.code() != errc::protocol_error) fuzz::broken(std::string("not a protocol_error: ") + e.what());
  }
}

asio::awaitable<void> write_all(asio::ip::tcp::socket& socket, std::string_view bytes) {
  auto [ec, n] = co_await asio::async_write(socket, asio::buffer(bytes), asio::experimental::as_tuple(asio::use_awaitable));
  (void)n;
  std::error_code ignored;
  if (!ec) socket.shutdown(asio::ip::tcp::socket::shutdown_send, ignored);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static fuzz::loopback net;
  if (size == 0) return 0;
  wire::frame_limits limits;
  if (data[0] & 1) {  // the handshake's: small frames, no payload
    limits.max_header_bytes = 64u << 10;
    limits.max_payload_bytes = 0;
    limits.max_segments = 0;
  } else {
    limits.max_header_bytes = 64u << 10;
    limits.max_payload_bytes = 1u << 20;
    limits.max_segments = 64;
  }
  const bool with_destination = data[0] & 2;
  const std::string_view bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  auto pair = net.connect();
  // The writer runs beside the reader and shuts its end down when all is written; once the reader
  // is done, closing its end ends a write the reader left unread.
  bool written = false;
  asio::co_spawn(net.io(), write_all(pair.client, bytes), [&](std::exception_ptr) { written = true; });
  fuzz::run(net.io(), read_all(pair.server, limits, with_destination), "frame_reader over a stream");
  pair.server.close();
  fuzz::run_until(net.io(), written, "the writer's end");
  return 0;
}

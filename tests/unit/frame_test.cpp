#include "wire/frame.hpp"

#include "test_support.hpp"
#include "wire/values.hpp"

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/use_future.hpp>
#include <asio/write.hpp>

#include <cstring>

using namespace pscoro;
using namespace pscoro::wire;

namespace {

std::array<std::byte, fixed_header_size> header_bytes(const fixed_header& h) { return encode_fixed_header(h); }

template <class T>
void poke(std::array<std::byte, fixed_header_size>& bytes, std::size_t offset, T value) {
  std::memcpy(bytes.data() + offset, &value, sizeof(T));  // the test machine is little-endian
}

std::string protocol_error_of(const std::array<std::byte, fixed_header_size>& bytes, frame_limits limits = {}) {
  try {
    (void)parse_fixed_header(bytes, limits);
  } catch (const error& e) {
    CHECK(e.code() == errc::protocol_error);
    return e.what();
  }
  FAIL("expected a protocol error");
  return {};
}


// A connected pair of loopback sockets.
struct socket_pair {
  asio::io_context io;
  asio::ip::tcp::socket a{io}, b{io};
  socket_pair() {
    asio::ip::tcp::acceptor acceptor(io, {asio::ip::address_v4::loopback(), 0});
    a.connect(acceptor.local_endpoint());
    b = acceptor.accept();
  }
  void write(std::string_view bytes) { asio::write(a, asio::buffer(bytes)); }
  // Asynchronous: a large frame does not fit in the socket buffers before read() runs.
  void write(encoded_frame f) {
    auto owned = std::make_shared<encoded_frame>(std::move(f));
    std::vector<asio::const_buffer> buffers{asio::buffer(owned->head)};
    for (const auto& s : owned->segments) buffers.emplace_back(s.data(), s.size());
    asio::async_write(a, buffers, [owned](std::error_code ec, std::size_t) { REQUIRE_FALSE(ec); });
  }
  std::optional<frame> read(frame_reader& reader, const segment_destination* destination = nullptr) {
    auto result = asio::co_spawn(io, reader.read(b, destination), asio::use_future);
    io.run();
    io.restart();
    return result.get();
  }
};

std::string encoded_head_string(const fixed_header& h) {
  const auto bytes = header_bytes(h);
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

}  // namespace

TEST_CASE("a fixed header round-trips") {
  const fixed_header h{frame_kind::response, 0x0102030405060708ull, 77, 1u << 20};
  const auto parsed = parse_fixed_header(header_bytes(h), {});
  CHECK(parsed.kind == frame_kind::response);
  CHECK(parsed.request_id == h.request_id);
  CHECK(parsed.header_bytes == 77);
  CHECK(parsed.payload_bytes == (1u << 20));
}

TEST_CASE("every bad fixed header is refused with its reason") {
  auto bytes = header_bytes({frame_kind::request, 1, 10, 0});
  poke<std::uint32_t>(bytes, 0, 0x50545448);  // "HTTP"
  CHECK(contains(protocol_error_of(bytes), "bad magic 0x50545448"));

  bytes = header_bytes({frame_kind::request, 1, 10, 0});
  poke<std::uint16_t>(bytes, 4, 1);
  CHECK(contains(protocol_error_of(bytes), "unsupported protocol version 1 (this build speaks version 3)"));

  bytes = header_bytes({frame_kind::request, 1, 10, 0});
  poke<std::uint16_t>(bytes, 6, 9);
  CHECK(contains(protocol_error_of(bytes), "unknown frame kind 9"));

  bytes = header_bytes({frame_kind::request, 1, 10, 0});
  poke<std::uint32_t>(bytes, 20, 1);
  CHECK(contains(protocol_error_of(bytes), "reserved header field"));

  frame_limits small;
  small.max_header_bytes = 100;
  small.max_payload_bytes = 1000;
  CHECK(contains(protocol_error_of(header_bytes({frame_kind::request, 1, 101, 0}), small),
                 "frame header of 101 bytes exceeds the limit of 100 bytes"));
  CHECK(contains(protocol_error_of(header_bytes({frame_kind::request, 1, 10, 1001}), small),
                 "frame payload of 1001 bytes exceeds the limit of 1000 bytes"));
}

TEST_CASE("a frame body must match its kind and its payload") {
  FrameHeader message;
  message.mutable_request();
  message.add_segment_sizes(8);
  message.add_segment_sizes(8);
  CHECK_NOTHROW(check_body(message, {frame_kind::request, 1, 0, 16}, {}));
  CHECK_THROWS_WITH_AS(check_body(message, {frame_kind::response, 1, 0, 16}, {}),
                       doctest::Contains("a response frame carries a message of another kind"), error);
  CHECK_THROWS_WITH_AS(check_body(message, {frame_kind::request, 1, 0, 17}, {}),
                       doctest::Contains("segment sizes add up to 16 bytes but the payload is 17 bytes"), error);
  CHECK_THROWS_WITH_AS(check_body(message, {frame_kind::request, 1, 0, 12}, {}),
                       doctest::Contains("more than the payload of 12 bytes"), error);
  frame_limits one_segment;
  one_segment.max_segments = 1;
  CHECK_THROWS_WITH_AS(check_body(message, {frame_kind::request, 1, 0, 16}, one_segment),
                       doctest::Contains("frame has 2 segments, the limit is 1"), error);
}

TEST_CASE("tensor references are checked against their segments") {
  frame f;
  auto t = tensor::uninitialized(dtype::float32, {2, 3});
  TensorRef ref;
  put_tensor(f, ref, t);
  const tensor back = get_tensor(f, ref);
  CHECK(back.shape() == shape_type{2, 3});
  CHECK(back.bytes().data() == t.bytes().data());  // shared, not copied

  TensorRef bad = ref;
  bad.set_dtype(42);
  CHECK_THROWS_WITH_AS((void)get_tensor(f, bad), doctest::Contains("unknown dtype 42"), error);
  bad = ref;
  bad.set_segment(3);
  CHECK_THROWS_WITH_AS((void)get_tensor(f, bad), doctest::Contains("refers to segment 3 but the frame has 1"), error);
  bad = ref;
  bad.set_shape(1, 4);
  CHECK_THROWS_WITH_AS((void)get_tensor(f, bad), doctest::Contains("needs 32 bytes but its segment has 24"), error);
  bad = ref;
  bad.set_shape(0, 1ull << 62);
  CHECK_THROWS_WITH_AS((void)get_tensor(f, bad), doctest::Contains("is too large"), error);
}

TEST_CASE("a frame with segments crosses a real socket intact, small and large") {
  socket_pair pair;
  frame_reader reader({});
  for (std::size_t elements : {std::size_t{3}, std::size_t{1} << 20}) {
    frame f;
    f.kind = frame_kind::request;
    f.request_id = 42;
    auto* update = f.message.mutable_request()->mutable_update_variable();
    update->mutable_variable()->set_name("w");
    auto t = tensor::uninitialized(dtype::float64, {elements});
    for (std::size_t i = 0; i < elements; ++i) t.mutable_data<double>()[i] = static_cast<double>(i) * 0.5;
    put_tensor(f, *update->mutable_value(), t);
    pair.write(encode(f));
    auto got = pair.read(reader);
    REQUIRE(got);
    CHECK(got->request_id == 42);
    const tensor back = get_tensor(*got, got->message.request().update_variable().value());
    REQUIRE(back.size() == elements);
    CHECK(back.data<double>()[elements - 1] == static_cast<double>(elements - 1) * 0.5);
  }
}

TEST_CASE("a segment read into its destination's buffer is told as it arrives: longer prefixes, then all of it") {
  socket_pair pair;
  frame_reader reader({});
  // 8 MiB: more than the socket buffers hold, so it arrives in many reads.
  constexpr std::size_t elements = std::size_t{1} << 20;
  frame f;
  f.kind = frame_kind::response;
  f.request_id = 7;
  auto t = tensor::uninitialized(dtype::float64, {elements});
  for (std::size_t i = 0; i < elements; ++i) t.mutable_data<double>()[i] = static_cast<double>(i);
  put_tensor(f, *f.message.mutable_response()->mutable_result()->mutable_tensor(), t);
  pair.write(encode(f));

  byte_buffer into(elements * sizeof(double));
  std::vector<std::size_t> told;
  bool prefix_intact = true;  // each prefix told holds the bytes sent, in `into`
  const segment_destination destination = [&](const fixed_header& header, std::size_t index, std::uint64_t size) {
    CHECK(header.request_id == 7);
    CHECK(index == 0);
    CHECK(size == elements * sizeof(double));
    return segment_target{into, [&](std::span<const std::byte> arrived) {
                            prefix_intact = prefix_intact && arrived.data() == into.data() &&
                                            std::memcmp(arrived.data(), t.bytes().data(), arrived.size()) == 0;
                            told.push_back(arrived.size());
                          }};
  };
  auto got = pair.read(reader, &destination);
  REQUIRE(got);
  CHECK(got->segments.at(0).data() == into.data());
  CHECK(prefix_intact);
  REQUIRE(told.size() > 1);
  CHECK(std::is_sorted(told.begin(), told.end()));
  CHECK(std::adjacent_find(told.begin(), told.end()) == told.end());  // each one longer
  CHECK(told.back() == into.size());

  // A destination buffer of the wrong size is replaced by a fresh one, whose arrival is not told.
  pair.write(encode(f));
  told.clear();
  into = byte_buffer(16);
  got = pair.read(reader, &destination);
  REQUIRE(got);
  CHECK(got->segments.at(0).size() == elements * sizeof(double));
  CHECK(told.empty());
}

TEST_CASE("a clean close between frames is the end, a close inside a frame is a truncated frame") {
  {
    socket_pair pair;
    frame_reader reader({});
    pair.a.close();
    CHECK_FALSE(pair.read(reader).has_value());
  }
  socket_pair pair;
  frame_reader reader({});
  frame f;
  f.kind = frame_kind::request;
  f.message.mutable_request()->mutable_read_variable()->mutable_variable()->set_name("w");
  const auto encoded = encode(f);
  pair.write(std::string_view(encoded.head).substr(0, encoded.head.size() - 3));
  pair.a.close();
  CHECK_THROWS_WITH_AS(pair.read(reader), doctest::Contains("truncated frame"), error);
}

TEST_CASE("an unparsable protobuf header is a protocol error") {
  socket_pair pair;
  frame_reader reader({});
  pair.write(encoded_head_string({frame_kind::request, 1, 4, 0}) + "\xff\xff\xff\xff");
  CHECK_THROWS_WITH_AS(pair.read(reader), doctest::Contains("unparsable 4-byte frame header"), error);
}

TEST_CASE("lists nest up to max_value_depth on the wire; deeper is refused, not recursed into") {
  const auto nested = [](std::size_t depth) {
    value v = std::int64_t{42};
    for (std::size_t i = 0; i < depth; ++i) v = value_list{{std::move(v)}};
    return v;
  };
  for (const std::size_t depth : {std::size_t{1}, max_value_depth}) {
    wire::frame f;
    auto& out = *f.message.mutable_response()->mutable_result();
    wire::encode_value(f, out, nested(depth));
    std::size_t budget = max_value_items;
    value back = wire::decode_value(f, out, budget);
    CHECK(budget == max_value_items - depth - 1);  // each list and the number
    for (std::size_t i = 0; i < depth; ++i) {
      auto* list = std::get_if<value_list>(&back);
      REQUIRE(list);
      REQUIRE(list->items.size() == 1);
      value inner = std::move(list->items[0]);
      back = std::move(inner);
    }
    CHECK(std::get<std::int64_t>(back) == 42);
  }
  wire::frame f;
  auto& out = *f.message.mutable_response()->mutable_result();
  wire::encode_value(f, out, nested(max_value_depth + 1));
  std::size_t budget = max_value_items;
  CHECK_THROWS_WITH_AS((void)wire::decode_value(f, out, budget),
                       "a value nests lists more than 32 deep (pscoro::max_value_depth)", error);
}

TEST_CASE("the values of one request or answer are at most max_value_items, however split or nested") {
  const auto lists = [](std::size_t outer, std::size_t inner) {
    value_list all;
    for (std::size_t i = 0; i < outer; ++i) all.items.push_back(value_list{std::vector<value>(inner, true)});
    return value(std::move(all));
  };
  constexpr std::string_view too_many =
      "a request or answer holds more than 65536 values (pscoro::max_value_items); send numbers in bulk as a tensor";
  // Each in a frame of its own: encode_value adds to the value it is given.
  wire::frame fits_frame, over_frame, half_frame;
  auto& fits = *fits_frame.message.mutable_response()->mutable_result();
  wire::encode_value(fits_frame, fits, lists(256, 254));  // 1 + 256 + 256 * 254 = 65281 values
  std::size_t budget = max_value_items;
  CHECK(std::get<value_list>(wire::decode_value(fits_frame, fits, budget)).items.size() == 256);
  CHECK(budget == max_value_items - 65281);
  auto& over = *over_frame.message.mutable_response()->mutable_result();
  wire::encode_value(over_frame, over, lists(256, 255));  // 1 + 256 + 256 * 255 = 65537: one too many
  budget = max_value_items;
  CHECK_THROWS_WITH_AS((void)wire::decode_value(over_frame, over, budget), std::string(too_many).c_str(), error);
  // The arguments of one request share the budget: two halves that fit alone do not fit together.
  auto& half = *half_frame.message.mutable_response()->mutable_result();
  wire::encode_value(half_frame, half, value_list{std::vector<value>(40'000, true)});
  budget = max_value_items;
  (void)wire::decode_value(half_frame, half, budget);
  CHECK_THROWS_WITH_AS((void)wire::decode_value(half_frame, half, budget), std::string(too_many).c_str(), error);
}

TEST_CASE("frame readers under a shared budget grow their buffers only with what is left of it, and give it back") {
  // Three strangers' Hellos of ~200 KiB each: each reader draws the header's bytes (the message
  // parsed from them) and ~136 KiB past its first 64 KiB buffer, and the budget has room for two.
  const auto budget = std::make_shared<byte_budget>(700u << 10);
  frame_limits limits;
  limits.max_header_bytes = 256u << 10;
  limits.max_payload_bytes = 0;
  limits.buffer_budget = budget;
  frame hello;
  hello.kind = frame_kind::hello;
  hello.message.mutable_hello()->set_address(std::string(200u << 10, 'x'));
  const auto encoded = encode(hello);
  const std::uint64_t header = encoded.head.size() - fixed_header_size;
  const std::uint64_t needs = header + header - frame_reader::first_buffer_bytes;

  socket_pair first_pair, second_pair, third_pair;
  std::optional<frame_reader> first(std::in_place, limits);
  frame_reader second(limits), third(limits);
  first_pair.write(std::string_view(encoded.head));
  REQUIRE(first_pair.read(*first));
  CHECK(first->drawn() == needs);
  second_pair.write(std::string_view(encoded.head));
  REQUIRE(second_pair.read(second));
  CHECK(budget->left() == budget->total() - 2 * needs);

  third_pair.write(std::string_view(encoded.head));
  const auto refused = error_thrown_by([&] { (void)third_pair.read(third); });
  CHECK(refused.code() == errc::resource_exhausted);
  CHECK(contains(refused.what(), "(transport_options::max_handshake_bytes_total)"));
  CHECK(third.drawn() == 0);

  // A reader that is gone, or whose handshake is over (limits without the budget), gives back
  // what it drew.
  first.reset();
  CHECK(budget->left() == budget->total() - needs);
  second.set_limits({});
  CHECK(budget->left() == budget->total());
  CHECK(second.drawn() == 0);
}

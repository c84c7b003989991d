// A connection's write path with frames filled as they are sent (wire::segment_producer): over a
// real loopback socket, the frame arrives whole and in order, its producer is called a step per
// turn of the executor whatever the peer reads, and it is dropped when done or when the
// connection closes. Nothing here depends on timing: the executor is driven with poll().
#include "wire/connection.hpp"

#include "test_support.hpp"

#include <fmt/format.h>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/use_future.hpp>
#include <asio/write.hpp>

#include <future>
#include <limits>
#include <memory>
#include <random>
#include <stdexcept>
#include <optional>
#include <string>
#include <vector>

namespace {

using namespace pscoro;

// What `socket` reads next (a frame, or nothing at the end of the connection) while `io` runs the
// other side's handlers; fails, rather than hangs, when the read has not ended within 30 s (`what`
// names the read in that message: a writer that went idle with bytes left).
std::optional<wire::frame> read_within_30s(asio::io_context& io, wire::frame_reader& reader,
                                           asio::ip::tcp::socket& socket, const std::string& what) {
  auto got = asio::co_spawn(io, reader.read(socket), asio::use_future);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (got.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
    REQUIRE_MESSAGE(std::chrono::steady_clock::now() < deadline, what, " did not end within 30 s");
    io.restart();
    io.run_one_for(std::chrono::milliseconds(100));
  }
  return got.get();
}

// Writes Heartbeat requests with ids 1..count on `client` (a few dozen bytes each: the socket
// takes them all).
void send_heartbeats(asio::ip::tcp::socket& client, std::uint64_t count) {
  for (std::uint64_t id = 1; id <= count; ++id) {
    wire::frame request;
    request.kind = wire::frame_kind::request;
    request.request_id = id;
    request.message.mutable_request()->mutable_heartbeat();
    const auto encoded = wire::encode(std::move(request));
    asio::write(client, asio::buffer(encoded.head));
  }
}

// Checks an answer to one of send_heartbeats' requests: an id among them, not answered before
// (marked in `answered`, one flag per id), and one segment of `bytes`.
void check_answer(const wire::frame& answer, std::vector<bool>& answered, std::size_t bytes) {
  REQUIRE(answer.request_id >= 1);
  REQUIRE(answer.request_id < answered.size());
  CHECK(!answered[answer.request_id]);
  answered[answer.request_id] = true;
  REQUIRE(answer.segments.size() == 1);
  REQUIRE(answer.segments[0].size() == bytes);
}

// Reads the answers to send_heartbeats' requests 1..count from `socket`, each with a segment of
// `answer_bytes`, in any order, while `io` runs the other side's handlers.
void read_heartbeat_answers(asio::io_context& io, asio::ip::tcp::socket& socket, std::size_t count,
                            std::size_t answer_bytes) {
  wire::frame_reader reader{{}};
  std::vector<bool> answered(count + 1, false);
  for (std::size_t n = 0; n < count; ++n) {
    const auto answer = read_within_30s(io, reader, socket, fmt::format("the read of answer {}", n + 1));
    REQUIRE(answer);
    check_answer(*answer, answered, answer_bytes);
  }
}

// A connection that sends, and the raw socket at its other end, which reads frames when asked.
struct connection_pair {
  asio::io_context io;
  std::shared_ptr<wire::connection> sender;
  asio::ip::tcp::socket peer{io};
  wire::frame_reader reader{{}};
  std::string closed;

  connection_pair() {
    asio::ip::tcp::acceptor acceptor(io, {asio::ip::address_v4::loopback(), 0});
    asio::ip::tcp::socket socket(io);
    socket.connect(acceptor.local_endpoint());
    peer = acceptor.accept();
    sender = std::make_shared<wire::connection>(std::move(socket), wire::frame_limits{}, "the peer");
    sender->start(nullptr, [this](const std::string& reason) { closed = reason; });
  }
  ~connection_pair() { sender->close("test over"); }

  // Runs what can run now, without waiting (what those post included).
  void poll() {
    io.restart();
    io.poll();
  }
  // The next frame at the peer (the sender's handlers run meanwhile); fails, rather than hangs,
  // when none arrives within 30 s (a writer that went idle with bytes left).
  wire::frame read() {
    auto frame = read_within_30s(io, reader, peer, "the peer's read of a whole frame");
    REQUIRE(frame);
    return std::move(*frame);
  }
};

wire::frame response(std::uint64_t id, std::size_t segment_bytes) {
  wire::frame f;
  f.kind = wire::frame_kind::response;
  f.request_id = id;
  f.message.mutable_response();
  if (segment_bytes) f.segments.emplace_back(segment_bytes);
  return f;
}

std::byte pattern(std::size_t i) { return static_cast<std::byte>(i % 251); }

// Fills `segment` a step at a time with pattern(), counting the calls; `held` lives as long as
// the producer does.
wire::segment_producer filler(byte_buffer segment, std::shared_ptr<int> calls, std::shared_ptr<int> held) {
  return [segment, calls, held, filled = std::size_t{0}]() mutable {
    ++*calls;
    const std::size_t end = std::min(segment.size(), filled + wire::segment_produce_step);
    for (std::size_t i = filled; i < end; ++i) segment.data()[i] = pattern(i);
    filled = end;
    return filled;
  };
}

// A response of `bytes` that filler() fills: how often it was called, and whether it still lives.
struct watched_frame {
  wire::frame frame;
  std::shared_ptr<int> calls = std::make_shared<int>(0);
  std::weak_ptr<int> producer;
};
watched_frame filled_response(std::uint64_t id, std::size_t bytes) {
  auto held = std::make_shared<int>(0);
  watched_frame out{response(id, bytes), std::make_shared<int>(0), held};
  out.frame.produce_last = filler(out.frame.segments.back(), out.calls, std::move(held));
  return out;
}

}  // namespace

TEST_CASE("a frame filled as it is sent arrives whole, after the frames before it and before those after") {
  connection_pair pair;
  constexpr std::size_t bytes = std::size_t{8} << 20;  // more than the socket buffers hold
  auto filled = filled_response(2, bytes);
  pair.sender->send(response(1, 100));
  pair.sender->send(std::move(filled.frame));
  pair.sender->send(response(3, 0));

  const auto first = pair.read();
  CHECK(first.request_id == 1);
  const auto second = pair.read();
  CHECK(second.request_id == 2);
  REQUIRE(second.segments.size() == 1);
  const auto& got = second.segments[0];
  REQUIRE(got.size() == bytes);
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < bytes; ++i) wrong += got.data()[i] != pattern(i);
  CHECK(wrong == 0);
  CHECK(pair.read().request_id == 3);
  CHECK(*filled.calls == static_cast<int>(bytes / wire::segment_produce_step));  // a step per call
  CHECK(filled.producer.expired());  // dropped once done
  CHECK(pair.closed.empty());
}

TEST_CASE("a frame is filled to the end whatever the peer reads, and a closed connection drops its producer") {
  connection_pair pair;
  constexpr std::size_t bytes = std::size_t{64} << 20;  // far more than the socket buffers hold
  constexpr int steps = static_cast<int>(bytes / wire::segment_produce_step);
  auto filled = filled_response(1, bytes);
  pair.sender->send(std::move(filled.frame));
  // The peer reads nothing; a turn of the executor fills a step all the same.
  pair.poll();
  CHECK(*filled.calls == steps);
  CHECK(filled.producer.expired());  // what it held (a ps's variable) is let go
  CHECK(pair.closed.empty());

  // Another one, closed after its first step: the producer goes with the connection.
  auto unfinished = filled_response(2, bytes);
  pair.sender->send(std::move(unfinished.frame));
  pair.io.restart();
  pair.io.poll_one();  // the first step (a poll() would run every one: each posts the next)
  CHECK(*unfinished.calls == 1);
  REQUIRE_FALSE(unfinished.producer.expired());
  pair.sender->close("the peer went away");
  CHECK(unfinished.producer.expired());
  pair.poll();
  CHECK(*unfinished.calls == 1);  // no step after the close
}

TEST_CASE("frames filled as they are sent, mixed with whole ones of every size, all arrive intact and in order") {
  // 120 frames, a third of them filled in uneven steps (a step of 1 byte to 1 MiB, producers of
  // empty segments included), queued in bursts while earlier ones are being written: every byte
  // must arrive where it belongs, each frame whole and in the order sent, and every producer must
  // be dropped by the end. Seeded: the same frames each run.
  connection_pair pair;
  std::mt19937_64 random(2026);
  std::uniform_int_distribution<int> kind(0, 2), burst(1, 12);
  std::uniform_int_distribution<std::size_t> small(0, 300), large(0, std::size_t{3} << 19), step(1, std::size_t{1} << 20);
  struct sent_frame {
    std::uint64_t id;
    std::vector<std::size_t> sizes;
  };
  std::vector<sent_frame> sent;
  std::vector<std::weak_ptr<int>> producers;
  std::size_t read = 0;
  auto fill_byte = [](std::uint64_t id, std::size_t segment, std::size_t i) {
    return static_cast<std::byte>((id * 31 + segment * 7 + i) % 253);
  };
  // The next frame at the peer must be the next one sent, every byte as sent.
  auto check_next = [&] {
    const auto got = pair.read();
    const auto& expected = sent[read++];
    REQUIRE(got.request_id == expected.id);
    REQUIRE(got.segments.size() == expected.sizes.size());
    for (std::size_t s = 0; s < expected.sizes.size(); ++s) {
      REQUIRE(got.segments[s].size() == expected.sizes[s]);
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < expected.sizes[s]; ++i) wrong += got.segments[s].data()[i] != fill_byte(expected.id, s, i);
      REQUIRE_MESSAGE(wrong == 0, "frame ", expected.id, " segment ", s, ": ", wrong, " bytes wrong");
    }
  };
  for (std::uint64_t id = 1; id <= 120;) {
    for (int b = burst(random); b > 0 && id <= 120; --b, ++id) {
      auto f = response(id, 0);
      const std::size_t segments = static_cast<std::size_t>(kind(random));
      sent_frame record{id, {}};
      for (std::size_t s = 0; s <= segments; ++s) {
        const std::size_t size = kind(random) == 0 ? large(random) : small(random);
        byte_buffer segment(size);
        record.sizes.push_back(size);
        const bool produced = s == segments && kind(random) == 0;
        if (!produced) {
          for (std::size_t i = 0; i < size; ++i) segment.data()[i] = fill_byte(id, s, i);
        }
        f.segments.push_back(segment);
        if (produced) {
          auto held = std::make_shared<int>(0);
          producers.push_back(held);
          f.produce_last = [segment, held, id, s, filled = std::size_t{0}, by = step(random), fill_byte]() mutable {
            const std::size_t end = std::min(segment.size(), filled + by);
            for (std::size_t i = filled; i < end; ++i) segment.data()[i] = fill_byte(id, s, i);
            filled = end;
            return filled;
          };
        }
      }
      sent.push_back(std::move(record));
      pair.sender->send(std::move(f));
    }
    // Read some of what was sent before the next burst, so bursts land while writes are under way.
    for (int r = burst(random) / 4; r > 0 && read < sent.size(); --r) check_next();
  }
  while (read < sent.size()) check_next();
  for (const auto& producer : producers) CHECK(producer.expired());
  CHECK(pair.closed.empty());
}

TEST_CASE("a producer that fails closes its connection, saying why; one that stops short is refused by produce_whole") {
  connection_pair pair;
  auto held = std::make_shared<int>(0);
  const std::weak_ptr<int> producer = held;
  auto f = response(1, 1000);
  f.produce_last = [held]() -> std::size_t { throw std::runtime_error("the rows are gone"); };
  held.reset();
  pair.sender->send(std::move(f));
  pair.poll();
  CHECK(pair.closed == "could not fill a frame to send: the rows are gone");
  CHECK(producer.expired());

  // Outside a connection: a producer that makes no progress is a bug, not an endless loop.
  auto stuck = response(2, 1000);
  stuck.produce_last = [] { return std::size_t{10}; };
  try {
    wire::produce_whole(stuck);
    FAIL("produce_whole must refuse a producer that stops short");
  } catch (const error& e) {
    CHECK(e.code() == make_error_code(errc::internal));
    CHECK(std::string(e.what()) == "a segment producer stopped short of its segment");
  }
}

namespace {

// Answers any request with `answer_bytes` of segment, counting the requests served.
asio::awaitable<wire::frame> big_answer(std::shared_ptr<std::size_t> served, std::size_t answer_bytes, wire::frame) {
  ++*served;
  co_return response(0, answer_bytes);  // the connection sets the request's id
}

}  // namespace

TEST_CASE("a peer that never reads its answers is not read once they hold max_bytes_in_flight; reading, it gets all") {
  asio::io_context io;
  asio::ip::tcp::acceptor acceptor(io, {asio::ip::address_v4::loopback(), 0});
  // Small socket buffers, so what the kernel holds is known: answers beyond the limit, and beyond
  // what the buffers take, can only wait in the server's write queue.
  asio::ip::tcp::socket client(io);
  client.open(asio::ip::tcp::v4());
  client.set_option(asio::socket_base::receive_buffer_size(64 << 10));
  client.connect(acceptor.local_endpoint());
  asio::ip::tcp::socket accepted = acceptor.accept();
  accepted.set_option(asio::socket_base::send_buffer_size(64 << 10));
  asio::socket_base::send_buffer_size server_sends;
  asio::socket_base::receive_buffer_size client_receives;
  accepted.get_option(server_sends);
  client.get_option(client_receives);

  constexpr std::size_t answer_bytes = 256 << 10, limit = 1 << 20, requests = 64;
  wire::frame_limits limits;
  limits.max_bytes_in_flight = limit;
  auto served = std::make_shared<std::size_t>(0);
  auto server = std::make_shared<wire::connection>(std::move(accepted), limits, "the client");
  std::string closed;
  server->start([served](wire::frame request) { return big_answer(served, answer_bytes, std::move(request)); },
                [&closed](const std::string& reason) { closed = reason; });
  send_heartbeats(client, requests);
  // Serve until reading pauses (it never does if answers are not counted), then run what is
  // ready until nothing is: with the socket buffers full, nothing more can happen.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!server->reading_paused()) {
    REQUIRE_MESSAGE(std::chrono::steady_clock::now() < deadline, "reading never paused; ", *served, " of ", requests,
                    " requests were served for a peer that reads nothing");
    io.restart();
    io.run_one_for(std::chrono::milliseconds(100));
  }
  io.restart();
  while (io.poll() > 0) {
  }
  CHECK(server->reading_paused());
  // The limit's worth of answers, what the two socket buffers hold (a packet more than the send
  // buffer says, as the kernel allows), and the request whose answer went over the limit: 4-5 here
  // (without the answers counted, all 64).
  const auto in_kernel = static_cast<std::size_t>(server_sends.value() + client_receives.value());
  const std::size_t bound = (limit + in_kernel) / answer_bytes + 3;
  CHECK_MESSAGE(*served <= bound, *served, " of ", requests, " requests were served for a peer that reads nothing (at most ",
                bound, " fit the limit and the socket buffers)");

  read_heartbeat_answers(io, client, requests, answer_bytes);
  CHECK(*served == requests);
  CHECK(closed.empty());
  server->close("test over");
}

namespace {

// Answers a request with `answer_bytes` of segment once `go` is set: filled as it is sent (a
// streamed reply, filler()) for odd request ids, whole for even ones.
asio::awaitable<wire::frame> answer_when(std::shared_ptr<detail::async_event> go, std::size_t answer_bytes,
                                         wire::frame request) {
  co_await go->async_wait(asio::use_awaitable);
  // The connection sets the request's id.
  co_return request.request_id % 2 == 1 ? filled_response(0, answer_bytes).frame : response(0, answer_bytes);
}

// Counts a request as taken into service, then answers it as answer_when does.
asio::awaitable<wire::frame> count_then_answer_when(std::shared_ptr<std::size_t> served,
                                                    std::shared_ptr<detail::async_event> go, std::size_t answer_bytes,
                                                    wire::frame request) {
  ++*served;
  co_return co_await answer_when(std::move(go), answer_bytes, std::move(request));
}

// A server connection whose requests' answers are bounded at `bound` bytes ahead, under a limit of
// `limit`, taking `requests` Heartbeats from `client` into service (counted in `served`) and
// answering each with `answer_bytes` once `go` is set.
struct bounded_server {
  asio::io_context io;
  asio::ip::tcp::socket client{io};
  std::shared_ptr<wire::connection> server;
  std::shared_ptr<std::size_t> served = std::make_shared<std::size_t>(0);
  std::shared_ptr<detail::async_event> go = std::make_shared<detail::async_event>(io.get_executor());
  std::string closed;

  bounded_server(std::uint64_t bound, std::uint64_t limit, std::size_t answer_bytes) {
    asio::ip::tcp::acceptor acceptor(io, {asio::ip::address_v4::loopback(), 0});
    client.connect(acceptor.local_endpoint());
    wire::frame_limits limits;
    limits.max_bytes_in_flight = limit;
    server = std::make_shared<wire::connection>(acceptor.accept(), limits, "the client");
    server->bound_answers_by([bound](const wire::frame&) { return bound; });
    const auto serve = [served = served, go = go, answer_bytes](wire::frame request) {
      return count_then_answer_when(served, go, answer_bytes, std::move(request));
    };
    server->start(serve, [this](const std::string& reason) { closed = reason; });
  }
  ~bounded_server() { server->close("test over"); }

  // Runs until reading pauses or all `requests` are in service, then until nothing more can happen.
  void serve_until_paused(std::size_t requests) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!server->reading_paused() && *served < requests) {
      REQUIRE_MESSAGE(std::chrono::steady_clock::now() < deadline, "the server never read the requests");
      io.restart();
      io.run_one_for(std::chrono::milliseconds(100));
    }
    io.restart();
    while (io.poll() > 0) {
    }
  }

};

}  // namespace

TEST_CASE("requests with large answer bounds are not read past max_bytes_in_flight while they wait to be served") {
  // Each answer is bounded at 600 KiB before it exists (a ps's read: a few bytes asking for a
  // variable's worth), and none is made until `go` (as reads waiting for a variable's lane): the
  // first request fits the 1 MiB limit, the second takes the connection past it.
  constexpr std::size_t answer_bytes = 600 << 10, limit = 1 << 20, requests = 8;
  bounded_server s(answer_bytes, limit, answer_bytes);
  send_heartbeats(s.client, requests);
  s.serve_until_paused(requests);
  CHECK_MESSAGE(*s.served == 2, *s.served, " of ", requests, " requests were taken into service with answers of ",
                answer_bytes, " bytes bounded ahead and a limit of ", limit,
                " (2 fit: the limit, and the one past it)");
  CHECK(s.server->reading_paused());
  s.go->set();
  read_heartbeat_answers(s.io, s.client, requests, answer_bytes);
  CHECK(*s.served == requests);
  CHECK(s.closed.empty());
}

TEST_CASE("a request with an answer bound past max_bytes_in_flight (or 2^64) is served alone; all are answered") {
  constexpr std::size_t answer_bytes = 4 << 10, requests = 4;
  for (const std::uint64_t bound : {std::uint64_t{2} << 20, std::numeric_limits<std::uint64_t>::max()}) {
    CAPTURE(bound);
    bounded_server s(bound, 1 << 20, answer_bytes);
    send_heartbeats(s.client, requests);
    s.serve_until_paused(requests);
    CHECK(*s.served == 1);
    s.go->set();
    // Reading goes on as each answer is written: none is stuck.
    read_heartbeat_answers(s.io, s.client, requests, answer_bytes);
    CHECK(*s.served == requests);
    CHECK(s.closed.empty());
  }
}

TEST_CASE("a peer that closes its sending side gets every answer still due, streamed ones included, then the connection closes") {
  asio::io_context io;
  asio::ip::tcp::acceptor acceptor(io, {asio::ip::address_v4::loopback(), 0});
  asio::ip::tcp::socket client(io);
  client.connect(acceptor.local_endpoint());
  auto server = std::make_shared<wire::connection>(acceptor.accept(), wire::frame_limits{}, "the client");
  // Answers wait (as for a kernel or a variable's lane) until the peer has finished sending.
  auto go = std::make_shared<detail::async_event>(io.get_executor());
  constexpr std::size_t answer_bytes = 4 << 20, requests = 4;  // more than the socket buffers hold
  std::optional<std::string> closed;
  server->start([go](wire::frame request) { return answer_when(go, answer_bytes, std::move(request)); },
                [&closed](const std::string& reason) { closed = reason; });
  send_heartbeats(client, requests);
  client.shutdown(asio::ip::tcp::socket::shutdown_send);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!server->peer_finished()) {
    REQUIRE_MESSAGE(!closed, "the connection closed with answers still due: ", *closed);
    REQUIRE_MESSAGE(std::chrono::steady_clock::now() < deadline, "the server never read the end of the requests");
    io.restart();
    io.run_one_for(std::chrono::milliseconds(100));
  }
  CHECK(server->is_open());
  go->set();

  wire::frame_reader reader{{}};
  std::vector<bool> answered(requests + 1, false);
  for (std::size_t n = 0; n < requests; ++n) {
    const auto answer = read_within_30s(io, reader, client, fmt::format("the read of answer {}", n + 1));
    REQUIRE_MESSAGE(answer, "the connection ended after ", n, " of ", requests, " answers");
    check_answer(*answer, answered, answer_bytes);
    if (answer->request_id % 2 == 1) {  // filled as it was sent: every step arrived
      const auto& segment = answer->segments[0];
      for (const std::size_t i : {std::size_t{0}, answer_bytes / 2, answer_bytes - 1}) {
        CHECK_MESSAGE(segment.data()[i] == pattern(i), "byte ", i, " of streamed answer ", answer->request_id);
      }
    }
  }
  CHECK_MESSAGE(!read_within_30s(io, reader, client, "the read after the last answer"),
                "a frame after the last answer");
  REQUIRE(closed);
  CHECK(*closed == "the peer closed the connection");
}

TEST_CASE("a connection that wants its Heartbeats' replies sends one every interval while other frames arrive") {
  // The chief's connection to a ps: its replies carry the ps's totals, so a busy connection must
  // still ask. Here the client keeps a request in flight all the time, so something always
  // arrives; a connection without the handler would never send a Heartbeat.
  asio::io_context io;
  asio::ip::tcp::acceptor acceptor(io, {asio::ip::address_v4::loopback(), 0});
  asio::ip::tcp::socket client_socket(io);
  client_socket.connect(acceptor.local_endpoint());
  auto server = std::make_shared<wire::connection>(acceptor.accept(), wire::frame_limits{}, "the client");
  auto heartbeats_served = std::make_shared<std::uint64_t>(0);
  server->start(
      [heartbeats_served](wire::frame request) -> asio::awaitable<wire::frame> {
        wire::frame answer;
        auto& body = *answer.message.mutable_response();
        if (request.message.request().has_heartbeat()) body.mutable_ps_totals()->set_requests_served(++*heartbeats_served);
        co_return answer;
      },
      nullptr);
  auto client = std::make_shared<wire::connection>(std::move(client_socket), wire::frame_limits{}, "the server");
  std::vector<std::uint64_t> replies;
  client->on_heartbeat_reply([&replies](const wire::frame& reply) {
    replies.push_back(reply.message.response().ps_totals().requests_served());
  });
  client->start(nullptr, nullptr);
  client->start_heartbeat(std::chrono::milliseconds(20), std::chrono::minutes(1));
  bool done = false;
  std::uint64_t calls = 0;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        while (!done) {
          wire::frame request;
          request.message.mutable_request()->mutable_list_slots();
          co_await client->async_call(std::move(request), asio::use_awaitable);
          ++calls;
        }
      },
      asio::detached);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (replies.size() < 3 && std::chrono::steady_clock::now() < deadline) io.run_one_for(std::chrono::milliseconds(100));
  done = true;
  INFO(calls, " other requests answered meanwhile");
  REQUIRE(replies.size() >= 3);
  CHECK(replies[0] == 1);  // each reply handed over once, in order
  CHECK(replies[1] == 2);
  CHECK(replies[2] == 3);
  CHECK(calls > 0);
  client->close("done");
  server->close("done");
}

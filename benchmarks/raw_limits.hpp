// The machine's own limits, measured in the same run as what is compared with them: loopback TCP
// exchanges (round trips, and the "pull" of a large buffer by a small request), memcpy. Benchmarks print ratios to these.
#pragma once

#include <asio/awaitable.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/read.hpp>
#include <asio/write.hpp>

#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <system_error>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

namespace bench {

using clock_type = std::chrono::steady_clock;
using micros = std::chrono::duration<double, std::micro>;

struct percentiles {
  double p50;
  double p99;
};

inline percentiles summarize(std::vector<double> samples) {
  std::sort(samples.begin(), samples.end());
  auto at = [&](double q) { return samples[std::min(samples.size() - 1, static_cast<std::size_t>(q * samples.size()))]; };
  return {at(0.50), at(0.99)};
}

inline double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

/// The median time of `iterations` awaits of `f()` (after a tenth as many to warm up), in microseconds.
template <class F>
asio::awaitable<double> median_us(int iterations, F f) {
  std::vector<double> samples;
  for (int i = -std::max(1, iterations / 10); i < iterations; ++i) {
    const auto start = clock_type::now();
    co_await f();
    if (i >= 0) samples.push_back(micros(clock_type::now() - start).count());
  }
  co_return median(std::move(samples));
}

/// The median time of `iterations` calls of `f()` (after a tenth as many to warm up), in
/// microseconds; what `f` returns is kept from the optimizer.
template <class F>
double median_sync_us(int iterations, F f) {
  std::vector<double> samples;
  for (int i = -std::max(1, iterations / 10); i < iterations; ++i) {
    const auto start = clock_type::now();
    auto kept = f();
    asm volatile("" : : "g"(&kept) : "memory");
    if (i >= 0) samples.push_back(micros(clock_type::now() - start).count());
  }
  return median(std::move(samples));
}

/// Where the client receives each answer: into one buffer it reuses (as read(out) does), the same
/// in huge pages whatever its size (the best a receiver can do: the kernel's copy into 4 KiB pages
/// costs more; a reply of a few MiB is below the 4 MiB from which buffers are advised), or into a
/// fresh allocation per exchange, freed after it (as read() into a fresh array does: the kernel
/// clears every fresh page before the copy lands in it, and unmaps it after). Every receive goes in
/// asio's 64 KiB steps.
enum class receive_into { reused, reused_huge, fresh };

namespace detail {
struct free_deleter {
  void operator()(char* p) const noexcept { std::free(p); }
};

/// A buffer of `bytes`, not touched: from 4 MiB on advised transparent huge pages, as pscoro's
/// buffers and fresh results are (src/common/memory.hpp's threshold), so the raw exchanges and
/// pscoro pay the same per page. Every raw buffer is one of these.
inline std::unique_ptr<char, free_deleter> fresh_buffer(std::size_t bytes, bool huge_pages = false) {
  constexpr std::size_t huge = std::size_t{2} << 20;
  const bool advise = huge_pages || bytes >= 2 * huge;
  const std::size_t rounded = advise ? (bytes + huge - 1) / huge * huge : std::max<std::size_t>(bytes, 1);
  std::unique_ptr<char, free_deleter> buffer(
      static_cast<char*>(advise ? std::aligned_alloc(huge, rounded) : std::malloc(rounded)));
  if (!buffer) throw std::bad_alloc();
  if (advise) ::madvise(buffer.get(), rounded, MADV_HUGEPAGE);
  return buffer;
}

/// A buffer of `bytes`, each one `fill`: what is sent, or received into again and again.
inline std::unique_ptr<char, free_deleter> filled_buffer(std::size_t bytes, char fill) {
  auto buffer = fresh_buffer(bytes);
  std::memset(buffer.get(), fill, bytes);
  return buffer;
}

/// A receive buffer of 4 MiB (what `net.core.rmem_max` allows here; the kernel doubles it) for a
/// raw socket, set before it connects or listens (tcp(7)): pscoro's long-lived connections grow
/// theirs to 20-32 MB (TCP's autotuning, seen with `ss -m`), while a raw connection opened for a
/// round of 20 exchanges stayed at 355-443 KB in most rounds, and its 64 MiB pulls then took 18-22
/// ms instead of 13-14.5 ms (RESULTS.md, 2026-11-25 03:25): not the machine's limit. A set size
/// turns the autotuning off: the raw sockets stay at 8 MiB where pscoro's may grow to 32 MB.
template <class Socket>
void set_receive_buffer(Socket& socket) {
  socket.set_option(asio::socket_base::receive_buffer_size(4 << 20));
}

/// An acceptor listening on a free loopback port, its receive buffer (which the sockets it accepts
/// inherit) set before it listens.
inline asio::ip::tcp::acceptor loopback_acceptor(asio::io_context& io) {
  const asio::ip::tcp::endpoint endpoint{asio::ip::address_v4::loopback(), 0};
  asio::ip::tcp::acceptor acceptor(io, endpoint.protocol());
  set_receive_buffer(acceptor);
  acceptor.bind(endpoint);
  acceptor.listen();
  return acceptor;
}

/// A client socket connected to `endpoint`, its receive buffer set first, without Nagle's delay.
inline asio::ip::tcp::socket connect_to(asio::io_context& io, const asio::ip::tcp::endpoint& endpoint) {
  asio::ip::tcp::socket socket(io);
  socket.open(endpoint.protocol());
  set_receive_buffer(socket);
  socket.connect(endpoint);
  socket.set_option(asio::ip::tcp::no_delay(true));
  return socket;
}

/// Writes all of `bytes` (blocking) in as few system calls as the socket allows: asio's default
/// completion condition writes 64 KiB per call, and one call for all of a 3 MB reply takes ~25%
/// less time on loopback (measured; pscoro's connections write so too).
template <class Socket>
void write_all(Socket& socket, const char* bytes, std::size_t size, std::error_code& ec) {
  asio::write(socket, asio::buffer(bytes, size),
              [](const std::error_code& error, std::size_t) -> std::size_t { return error ? 0 : std::size_t{1} << 30; },
              ec);
}
template <class Socket>
void write_all(Socket& socket, const char* bytes, std::size_t size) {
  std::error_code ec;
  write_all(socket, bytes, size, ec);
  if (ec) throw std::system_error(ec, "write");
}

// The server's half: answers each `request` bytes with `response` bytes until the client closes.
inline void answer_exchanges(asio::ip::tcp::socket& s, std::size_t request, std::size_t response) {
  const auto in = filled_buffer(request, 0), out = filled_buffer(response, 'y');
  std::error_code ec;
  while (asio::read(s, asio::buffer(in.get(), request), ec), !ec) write_all(s, out.get(), response, ec);
}

// The client's half of an exchange: `iterations` timed exchanges (after a tenth as many to warm up).
// Reads go in asio's 64 KiB steps: larger ones measured no faster for a blocking reader.
inline std::vector<double> time_exchanges(asio::ip::tcp::socket& client, std::size_t request, std::size_t response,
                                          int iterations, receive_into where = receive_into::reused) {
  const auto out = filled_buffer(request, 'x');
  const bool reused = where != receive_into::fresh;
  const auto in = fresh_buffer(reused ? response : 0, where == receive_into::reused_huge);
  if (reused) std::memset(in.get(), 0, response);
  std::vector<double> samples;
  samples.reserve(static_cast<std::size_t>(iterations));
  for (int i = -std::max(1, iterations / 10); i < iterations; ++i) {
    const auto start = clock_type::now();
    write_all(client, out.get(), request);
    if (reused) {
      asio::read(client, asio::buffer(in.get(), response));
    } else {
      const auto fresh = fresh_buffer(response);
      asio::read(client, asio::buffer(fresh.get(), response));
    }
    if (i >= 0) samples.push_back(micros(clock_type::now() - start).count());
  }
  return samples;
}
}  // namespace detail

/// Blocking exchange over loopback TCP (TCP_NODELAY) between two threads: the client sends
/// `request` bytes, the server answers `response` bytes; returns the times of `iterations` exchanges
/// in microseconds (after a tenth as many to warm up). Ping-pong: request == response.
inline std::vector<double> raw_exchanges(std::size_t request, std::size_t response, int iterations,
                                         receive_into where = receive_into::reused) {
  asio::io_context io;
  auto acceptor = detail::loopback_acceptor(io);
  std::thread server([&] {
    asio::io_context server_io;
    asio::ip::tcp::socket s(server_io);
    acceptor.accept(s);
    s.set_option(asio::ip::tcp::no_delay(true));
    detail::answer_exchanges(s, request, response);
  });
  auto client = detail::connect_to(io, acceptor.local_endpoint());
  auto samples = detail::time_exchanges(client, request, response, iterations, where);
  client.close();
  server.join();
  return samples;
}

/// The raw exchanges of raw_exchanges() between two processes: a child process (forked by the
/// constructor, so construct it before the program starts any thread) answers each connection's
/// exchanges, whose sizes the connection's first 16 bytes give.
class raw_server_process {
 public:
  raw_server_process() : acceptor_(detail::loopback_acceptor(io_)) {
    pid_ = ::fork();
    if (pid_ < 0) throw std::system_error(errno, std::generic_category(), "fork");
    if (pid_ == 0) serve();
    acceptor_.close();
  }
  raw_server_process(const raw_server_process&) = delete;
  raw_server_process& operator=(const raw_server_process&) = delete;
  ~raw_server_process() {
    ::kill(pid_, SIGTERM);
    ::waitpid(pid_, nullptr, 0);
  }

  pid_t pid() const noexcept { return pid_; }

  /// As raw_exchanges(), with the server in the child process.
  std::vector<double> exchanges(std::size_t request, std::size_t response, int iterations,
                                receive_into where = receive_into::reused) {
    auto client = connect(request, response);
    auto samples = detail::time_exchanges(client, request, response, iterations, where);
    client.close();
    return samples;
  }

  /// Pipelined echo: `window` exchanges kept in flight on one connection (a new request written as
  /// each answer is read), `count` of them; returns exchanges per second. What a closure stream
  /// with `window` in flight per worker would reach if it cost only the bytes' trip, one write and
  /// one read a message on each side.
  double pipelined(std::size_t request, std::size_t response, std::size_t window, std::size_t count) {
    auto client = connect(request, response);
    const auto out = detail::filled_buffer(request, 'x');
    const auto in = detail::filled_buffer(response, 0);
    for (std::size_t k = 0; k < window; ++k) detail::write_all(client, out.get(), request);
    const auto start = clock_type::now();
    for (std::size_t done = 0; done < count; ++done) {
      asio::read(client, asio::buffer(in.get(), response));
      detail::write_all(client, out.get(), request);
    }
    const double seconds = std::chrono::duration<double>(clock_type::now() - start).count();
    for (std::size_t k = 0; k < window; ++k) asio::read(client, asio::buffer(in.get(), response));
    client.close();
    return static_cast<double>(count) / seconds;
  }

  /// A connection whose exchanges are `request` bytes answered by `response` bytes.
  asio::ip::tcp::socket connect(std::size_t request, std::size_t response) {
    auto client = detail::connect_to(io_, {asio::ip::address_v4::loopback(), port_});
    const std::array<std::uint64_t, 2> sizes{request, response};
    asio::write(client, asio::buffer(sizes));
    return client;
  }

 private:
  [[noreturn]] void serve() {
    try {
      for (;;) {
        asio::ip::tcp::socket s(io_);
        acceptor_.accept(s);
        s.set_option(asio::ip::tcp::no_delay(true));
        std::array<std::uint64_t, 2> sizes{};
        asio::read(s, asio::buffer(sizes));
        detail::answer_exchanges(s, sizes[0], sizes[1]);
      }
    } catch (...) {
    }
    std::_Exit(1);
  }

  asio::io_context io_;
  asio::ip::tcp::acceptor acceptor_;
  std::uint16_t port_ = acceptor_.local_endpoint().port();
  pid_t pid_ = -1;
};

/// Pulls from several raw servers at once, as a chief reads a sharded variable from its ps: each
/// exchange sends `request` bytes to every server and ends when every one has answered its
/// `response` bytes, all received by this one thread (poll, then non-blocking reads as data comes)
/// into reused buffers. Returns the times of `iterations` exchanges in microseconds (after a tenth
/// as many to warm up).
inline std::vector<double> concurrent_pulls(std::vector<raw_server_process*> servers, std::size_t request,
                                            std::size_t response, int iterations) {
  std::vector<asio::ip::tcp::socket> clients;
  for (auto* server : servers) clients.push_back(server->connect(request, response));
  const auto out = detail::filled_buffer(request, 'x');
  std::vector<std::unique_ptr<char, detail::free_deleter>> in;
  for (std::size_t c = 0; c < clients.size(); ++c) in.push_back(detail::filled_buffer(response, 0));
  std::vector<pollfd> polled(clients.size());
  std::vector<double> samples;
  for (int i = -std::max(1, iterations / 10); i < iterations; ++i) {
    const auto start = clock_type::now();
    for (auto& client : clients) detail::write_all(client, out.get(), request);
    std::vector<std::size_t> got(clients.size(), 0);
    std::size_t done = 0;
    while (done < clients.size()) {
      std::size_t waiting = 0;
      for (std::size_t c = 0; c < clients.size(); ++c) {
        if (got[c] < response) polled[waiting++] = {clients[c].native_handle(), POLLIN, 0};
      }
      if (::poll(polled.data(), waiting, -1) < 0 && errno != EINTR) throw std::system_error(errno, std::generic_category(), "poll");
      for (std::size_t c = 0; c < clients.size(); ++c) {
        if (got[c] == response) continue;
        const auto n = ::recv(clients[c].native_handle(), in[c].get() + got[c], response - got[c], MSG_DONTWAIT);
        if (n == 0) throw std::runtime_error("a raw server closed its connection");
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
          throw std::system_error(errno, std::generic_category(), "recv");
        }
        if (n > 0 && (got[c] += static_cast<std::size_t>(n)) == response) ++done;
      }
    }
    if (i >= 0) samples.push_back(micros(clock_type::now() - start).count());
  }
  return samples;
}

/// memcpy bandwidth (bytes/s, median) for `bytes`-byte buffers.
inline double memcpy_bandwidth(std::size_t bytes, int iterations) {
  std::vector<char> a(bytes, 'a'), b(bytes, 'b');
  std::vector<double> samples;
  for (int i = -1; i < iterations; ++i) {
    const auto start = clock_type::now();
    std::memcpy(b.data(), a.data(), bytes);
    asm volatile("" : : "r"(b.data()) : "memory");  // keep the copy
    if (i >= 0) samples.push_back(micros(clock_type::now() - start).count());
  }
  return static_cast<double>(bytes) / (median(samples) * 1e-6);
}

}  // namespace bench

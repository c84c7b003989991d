// A live ps (a real pscoro::server on 127.0.0.1, no secret) fed the input through a real
// connection. Byte 0, bit 0 set: a valid chief Hello of a new session goes first, so the input
// reaches the requests; clear: the input is the handshake too. The server must close the
// connection (never hang), never crash, keep within its limits, and answer a well-formed Hello and
// Heartbeat afterwards.
#include "fuzz_support.hpp"

#include <asio/detached.hpp>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static pscoro::fuzz::live_server ps("ps");
  if (size == 0) return 0;
  ps.feed(std::string_view(reinterpret_cast<const char*>(data) + 1, size - 1), data[0] & 1);
  ps.check_alive();
  return 0;
}

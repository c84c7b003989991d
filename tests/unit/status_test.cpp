// Failures on the wire: what status each kind of exception becomes, and back.
#include "wire/connection.hpp"
#include "wire/status.hpp"

#include "test_support.hpp"

#include <asio/co_spawn.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/io_context.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/use_future.hpp>

#include <new>
#include <stdexcept>

using namespace pscoro;

namespace {

template <class Exception>
wire::Status status_of(Exception e, std::string_view what = {}) {
  return wire::status_of(std::make_exception_ptr(std::move(e)), "worker:1", what);
}

errc code_of(const wire::Status& status) { return static_cast<errc>(status.code()); }

}  // namespace

TEST_CASE("a pscoro error keeps its code and its message, and names this task") {
  const auto status = status_of(error(errc::not_found, "no variable 'w'"));
  CHECK(code_of(status) == errc::not_found);
  CHECK(status.message() == "no variable 'w'");
  CHECK(status.origin_task() == "worker:1");
}

TEST_CASE("a remote error keeps its code, the task it came from and that task's message") {
  const auto status = status_of(remote_error(make_error_code(errc::unavailable), "ps:0", "connection lost"));
  CHECK(code_of(status) == errc::unavailable);
  CHECK(status.message() == "connection lost");
  CHECK(status.origin_task() == "ps:0");
  // One without an origin happened here, as far as anyone can tell.
  CHECK(status_of(remote_error(make_error_code(errc::aborted), "", "ended")).origin_task() == "worker:1");
}

TEST_CASE("exceptions that are not pscoro errors are classified by their type") {
  CHECK(code_of(status_of(std::bad_alloc())) == errc::resource_exhausted);
  CHECK(code_of(status_of(std::invalid_argument("stoi"))) == errc::invalid_argument);
  // errc::out_of_range says a dataset is exhausted; a bad .at() must not look like that.
  CHECK(code_of(status_of(std::out_of_range("vector::at"))) == errc::unknown);
  CHECK(code_of(status_of(std::runtime_error("boom"))) == errc::unknown);
  CHECK(code_of(status_of(42)) == errc::unknown);
  CHECK(code_of(wire::status_of(nullptr, "worker:1")) == errc::internal);
  const auto status = status_of(std::runtime_error("boom"));
  CHECK(status.message() == "boom");
  CHECK(status.origin_task() == "worker:1");
  const auto foreign = status_of(42);
  CHECK(contains(foreign.message(), "not a std::exception"));
}

TEST_CASE("a system error of another category is unknown, with its text") {
  const auto status = status_of(std::system_error(std::make_error_code(std::errc::no_such_file_or_directory), "open"));
  CHECK(code_of(status) == errc::unknown);
  CHECK(contains(status.message(), "open"));
}

TEST_CASE("what was running starts the message: failed for pscoro errors, raised for others") {
  const std::string_view what = "worker function 'f'";
  CHECK(status_of(error(errc::invalid_argument, "bad"), what).message() == "worker function 'f' failed: bad");
  CHECK(status_of(std::runtime_error("boom"), what).message() == "worker function 'f' raised: boom");
  CHECK(status_of(remote_error(make_error_code(errc::unavailable), "ps:0", "lost"), what).message() ==
        "worker function 'f' on worker:1 failed: lost");
  const auto out_of_memory = status_of(std::bad_alloc(), what).message();
  CHECK(contains(out_of_memory, "worker function 'f' raised: out of memory"));
}

TEST_CASE("a status read back is the remote error it describes") {
  const auto status = status_of(remote_error(make_error_code(errc::unavailable), "ps:0", "connection lost"));
  try {
    wire::throw_if_error(status, "worker:1");
    FAIL("an error status must throw");
  } catch (const remote_error& e) {
    CHECK(e.code() == errc::unavailable);
    CHECK(e.origin_task() == "ps:0");
    CHECK(e.remote_message() == "connection lost");
  }
  // An ok status throws nothing; a status without an origin names the task that was asked.
  CHECK_NOTHROW(wire::throw_if_error(wire::Status{}, "ps:0"));
  wire::Status anonymous;
  wire::set_status(anonymous, make_error_code(errc::aborted), "ended", "");
  try {
    wire::throw_if_error(anonymous, "ps:3");
    FAIL("an error status must throw");
  } catch (const remote_error& e) {
    CHECK(e.origin_task() == "ps:3");
  }
}

TEST_CASE("a request handler that throws is answered with the exception's status, not unknown") {
  asio::io_context io;
  asio::ip::tcp::acceptor acceptor(io, {asio::ip::address_v4::loopback(), 0});
  asio::ip::tcp::socket client_socket(io);
  client_socket.connect(acceptor.local_endpoint());
  auto client = std::make_shared<wire::connection>(std::move(client_socket), wire::frame_limits{}, "server");
  auto server = std::make_shared<wire::connection>(acceptor.accept(), wire::frame_limits{}, "client");
  // As a server whose task has stopped answers what was already on its way.
  server->start(
      [](wire::frame) -> asio::awaitable<wire::frame> {
        throw error(errc::unavailable, "server stopped");
        co_return wire::frame{};
      },
      [](const std::string&) {});
  client->start(nullptr, [](const std::string&) {});
  auto answer = asio::co_spawn(
      io,
      [client]() -> asio::awaitable<wire::frame> {
        wire::frame request;
        request.message.mutable_request()->mutable_heartbeat();
        auto [ec, response] =
            co_await client->async_call(std::move(request), asio::experimental::as_tuple(asio::use_awaitable));
        REQUIRE_FALSE(ec);
        client->close("done");
        co_return response;
      },
      asio::use_future);
  io.run();
  const auto status = answer.get().message.response().status();
  CHECK(code_of(status) == errc::unavailable);
  CHECK(status.message() == "server stopped");
  CHECK(status.origin_task().empty());  // the caller names the task it asked
}

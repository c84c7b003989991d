// A worker's per-worker values built on its build thread (worker_service::create_value): what
// arrives while the user's function still runs decides whether the value is kept.
#include "test_support.hpp"
#include "worker/worker_service.hpp"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>

#include <atomic>
#include <chrono>
#include <future>
#include <optional>
#include <string>

using namespace pscoro;

namespace {

// A worker with one resource function, "test.gated", whose builds wait for open() (on the build
// thread, as every build does).
struct gated_worker {
  asio::io_context io;
  worker::worker_service worker{io.get_executor(), "worker:0", net::task_identity{"worker", 0, 1}, {}};
  std::promise<void> gate;
  std::atomic<int> started{0};

  gated_worker() {
    worker.bind_resource("test.gated",
                         detail::erase_resource_function<std::string>(
                             [this, opened = gate.get_future().share()](input_context) {
                               ++started;
                               opened.wait();
                               return std::string("built");
                             }));
  }
  ~gated_worker() { open(); }

  void open() {
    try {
      gate.set_value();
    } catch (const std::future_error&) {  // already open
    }
  }

  // Runs what is ready on the executor, without waiting: a request just spawned runs until it
  // waits for the build thread.
  void run_ready() {
    io.restart();
    while (io.poll() > 0) {
    }
  }

  // Runs the executor until `done()`, for at most 30 s (a guard against a hang, not a margin).
  template <class Done>
  void run_until(Done done, const char* what) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!done()) {
      REQUIRE_MESSAGE(std::chrono::steady_clock::now() < deadline, what);
      io.restart();
      io.run_one_for(std::chrono::milliseconds(10));
    }
  }
};

wire::frame create_resource(std::uint64_t id) {
  wire::frame request;
  auto* create = request.message.mutable_request()->mutable_create_resource();
  create->set_function("test.gated");
  create->set_id(id);
  create->set_worker_index(0);
  create->set_num_workers(1);
  return request;
}

wire::frame release(std::uint64_t id) {
  wire::frame request;
  request.message.mutable_request()->mutable_release_iterator()->set_id(id);
  return request;
}

asio::awaitable<void> serve(worker::worker_service* worker, wire::frame request, std::optional<wire::frame>* answer) {
  *answer = co_await worker->handle(std::move(request));
}

// Asks for value `id` and runs the worker until its function has started building it.
std::optional<wire::frame>& start_building(gated_worker& w, std::uint64_t id, std::optional<wire::frame>& answer) {
  const int before = w.started;
  asio::co_spawn(w.io, serve(&w.worker, create_resource(id), &answer), asio::detached);
  w.run_until([&] { return w.started > before; }, "the resource function never started");
  return answer;
}

// Asks for value `id` while the build thread is held by another, and runs the worker until the
// request waits for the build thread.
void queue_behind(gated_worker& w, std::uint64_t id, std::optional<wire::frame>& answer) {
  const auto before = w.worker.values_being_built();
  asio::co_spawn(w.io, serve(&w.worker, create_resource(id), &answer), asio::detached);
  w.run_until([&] { return w.worker.values_being_built() > before; }, "the queued creation never reached the worker");
}

std::int32_t code_of(const std::optional<wire::frame>& answer) {
  return answer->message.response().status().code();
}

}  // namespace

TEST_CASE("a per-worker value is kept once its function returns on the build thread") {
  gated_worker w;
  std::optional<wire::frame> created;
  start_building(w, 5, created);
  CHECK_FALSE(created);  // the executor is free meanwhile: the answer waits for the function
  CHECK(w.worker.per_worker_values() == 0);
  w.open();
  w.run_until([&] { return created.has_value(); }, "the creation never answered");
  CHECK(code_of(created) == 0);
  CHECK(w.worker.per_worker_values() == 1);
}

TEST_CASE("a per-worker value released while its function still runs is not kept") {
  gated_worker w;
  std::optional<wire::frame> created, released;
  start_building(w, 5, created);
  asio::co_spawn(w.io, serve(&w.worker, release(5), &released), asio::detached);
  w.run_until([&] { return released.has_value(); }, "the release never answered");
  w.open();
  w.run_until([&] { return created.has_value(); }, "the creation never answered");
  CHECK(code_of(created) == 0);  // made, then released: nothing to report
  CHECK_MESSAGE(w.worker.per_worker_values() == 0, "the worker kept a value the chief released while it was built");
}

TEST_CASE("a per-worker value released while it waits for the build thread is never built") {
  gated_worker w;
  std::optional<wire::frame> running, queued, released;
  start_building(w, 5, running);  // holds the build thread
  queue_behind(w, 6, queued);
  asio::co_spawn(w.io, serve(&w.worker, release(6), &released), asio::detached);
  w.run_until([&] { return released.has_value(); }, "the release never answered");
  w.open();
  w.run_until([&] { return running.has_value() && queued.has_value(); }, "the creations never answered");
  CHECK(code_of(running) == 0);
  CHECK(code_of(queued) == 0);  // released before it was built: nothing to report
  CHECK_MESSAGE(w.started == 1, "the worker ran the function of a value the chief had released");
  CHECK(w.worker.per_worker_values() == 1);
}

TEST_CASE("a per-worker value asked for again while it waits for the build thread is built once, for the later one") {
  gated_worker w;
  std::optional<wire::frame> running, first, second;
  start_building(w, 5, running);
  queue_behind(w, 6, first);
  asio::co_spawn(w.io, serve(&w.worker, create_resource(6), &second), asio::detached);
  w.run_ready();  // the second request has taken value 6 over before the build thread gets to it
  w.open();
  w.run_until([&] { return running.has_value() && first.has_value() && second.has_value(); },
              "the creations never answered");
  CHECK(code_of(first) == 0);
  CHECK(code_of(second) == 0);
  CHECK_MESSAGE(w.started == 2, "value 6 was built ", w.started - 1, " times");
  CHECK(w.worker.per_worker_values() == 2);
}

TEST_CASE("per-worker values still waiting for the build thread when their session ends are never built") {
  gated_worker w;
  std::optional<wire::frame> running, queued;
  start_building(w, 5, running);
  queue_behind(w, 6, queued);
  w.worker.end_session();
  w.open();
  w.run_until([&] { return running.has_value() && queued.has_value(); }, "the creations never answered");
  CHECK(code_of(running) == static_cast<std::int32_t>(errc::aborted));
  CHECK(code_of(queued) == static_cast<std::int32_t>(errc::aborted));
  CHECK_MESSAGE(w.started == 1, "the worker ran a function for a session that had ended");
  CHECK(w.worker.per_worker_values() == 0);
}

TEST_CASE("a per-worker value asked for again while it is built is kept once, from the later request") {
  gated_worker w;
  std::optional<wire::frame> first, second;
  start_building(w, 5, first);
  asio::co_spawn(w.io, serve(&w.worker, create_resource(5), &second), asio::detached);
  w.open();
  w.run_until([&] { return first.has_value() && second.has_value(); }, "the creations never answered");
  CHECK(code_of(first) == 0);
  CHECK(code_of(second) == 0);
  CHECK(w.started == 2);
  CHECK(w.worker.per_worker_values() == 1);
}

TEST_CASE("a per-worker value finished after its coordinator session ended is dropped, and says so") {
  gated_worker w;
  std::optional<wire::frame> created;
  start_building(w, 5, created);
  w.worker.end_session();
  w.open();
  w.run_until([&] { return created.has_value(); }, "the creation never answered");
  CHECK(code_of(created) == static_cast<std::int32_t>(errc::aborted));
  CHECK(contains(created->message.response().status().message(),
                 "the coordinator session that asked for 'test.gated' ended while worker:0 built it"));
  CHECK(w.worker.per_worker_values() == 0);
}

TEST_CASE("a per-worker value asked for once the worker is stopping is refused as unavailable, and not built") {
  gated_worker w;
  w.worker.close_connections();  // the server stops: so does the build thread
  std::optional<wire::frame> created;
  asio::co_spawn(w.io, serve(&w.worker, create_resource(5), &created), asio::detached);
  w.run_until([&] { return created.has_value(); }, "the creation never answered");
  CHECK(code_of(created) == static_cast<std::int32_t>(errc::unavailable));
  CHECK(contains(created->message.response().status().message(), "worker:0 is stopping"));
  CHECK(w.started == 0);
  CHECK(w.worker.per_worker_values() == 0);
}

// The chief's JSON document (/api/cluster) of a live cluster in one process (2 workers, 1 ps, real
// loopback TCP): what the page draws comes from the metrics the chief keeps, the progress report,
// the summary writer, the checkpoint manager and the log, and the responder serves it.
#include "local_cluster.hpp"
#include "test_support.hpp"

#include <pscoro/checkpoint.hpp>
#include <pscoro/coordinator.hpp>
#include <pscoro/progress.hpp>
#include <pscoro/summary.hpp>
#include <pscoro/variable.hpp>

#include "common/log.hpp"
#include "metrics/cluster_view.hpp"

#include <asio/connect.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/read.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>

#include <chrono>
#include <filesystem>
#include <string>
#include <unistd.h>

using namespace pscoro;
using pscoro::testing::local_cluster;

// Named, not anonymous: the integration sources share unity translation units.
namespace cluster_page_test {

const worker_function<std::int64_t(std::int64_t)> increment{"test.increment"};

void bind_increment(server& s) {
  s.bind(increment, [](std::int64_t x) -> asio::awaitable<std::int64_t> { co_return x + 1; });
}

// One request to the variable's ps per closure: an update.
const worker_function<std::int64_t(variable<float>)> push_ones{"test.push_ones"};

void bind_push_ones(server& s) {
  s.bind(push_ones, [](variable<float> v) -> asio::awaitable<std::int64_t> {
    const xt::xarray<float> ones = xt::ones<float>(v.shape());
    co_await v.assign_add(ones);
    co_return 1;
  });
}

// The requests ps `task` served as its answers to the chief's heartbeats last reported them, or -1
// before its first report.
double reported_requests(const std::string& task) {
  return metrics::process_registry().value("pscoro_coordinator_ps_requests_total", {{"ps", task}}).value_or(-1);
}

// Waits on the chief's executor (its heartbeats' replies arrive there meanwhile) until ps `task`
// has reported `requests` served, for up to a generous minute; returns what it last reported.
asio::awaitable<double> until_reported(const std::string& task, double requests) {
  asio::steady_timer pause(co_await asio::this_coro::executor);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(1);
  while (reported_requests(task) != requests && std::chrono::steady_clock::now() < deadline) {
    pause.expires_after(std::chrono::milliseconds(20));
    co_await pause.async_wait(asio::use_awaitable);
  }
  co_return reported_requests(task);
}

struct scratch_dir {
  std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("pscoro-cluster-page-" + std::to_string(::getpid()));
  ~scratch_dir() { std::filesystem::remove_all(dir); }
};

// The document as the page would read it now, `later` after `base` on the steady clock (rates are
// computed between documents, so the test sets the time between them).
nlohmann::json document_at(std::chrono::steady_clock::time_point base, std::chrono::seconds later) {
  return metrics::process_view().document(metrics::process_registry(), std::chrono::system_clock::now(), base + later);
}

}  // namespace cluster_page_test

using namespace cluster_page_test;

TEST_CASE("the chief's document lists every worker and ps, the queue, the job's progress, curves, checkpoint and warnings") {
  local_cluster cluster(1, 2, bind_increment);
  scratch_dir logs;
  cluster.run_chief([&](parameter_server_strategy& strategy, cluster_coordinator& coordinator) -> asio::awaitable<void> {
    const xt::xarray<float> zeros = xt::zeros<float>({8, 4});
    auto v = co_await strategy.scope().create_variable("v", zeros);
    checkpoint ckpt(strategy);
    ckpt.track(v);
    ckpt.set_step(3);
    checkpoint_manager manager(ckpt, logs.dir / "checkpoints");
    const auto saved = co_await manager.save();
    progress_options quiet;
    quiet.output = [](std::string_view) {};
    pscoro::progress report(100, quiet);
    summary_writer summaries(logs.dir.string());
    for (int i = 0; i < 20; ++i) (void)coordinator.schedule(increment, std::int64_t{i});
    co_await coordinator.join();
    for (int step = 1; step <= 5; ++step) {
      summaries.scalar("train/loss", 1.0 / step, step);
      report.update(step);
    }
    log::warning("a warning for the page");

    const auto base = std::chrono::steady_clock::now();
    const auto first = document_at(base, std::chrono::seconds(0));
    INFO(first.dump(2));
    CHECK(first["view"] == "chief");
    CHECK(first["task"] == "chief:0");
    CHECK(first["role"] == "chief");
    CHECK(first["chief_page"].is_null());

    const auto& job = first["job"];
    CHECK(job["state"] == "running");
    CHECK(job["step"] == 5);
    CHECK(job["total_steps"] == 100);
    CHECK(job["steps_per_second"].is_null());  // no earlier document to count from
    CHECK(job["elapsed_seconds"].get<double>() >= 0);

    REQUIRE(first["workers"].size() == 2);
    double succeeded = 0;
    for (int i = 0; i < 2; ++i) {
      const auto& w = first["workers"][i];
      CHECK(w["task"] == "worker:" + std::to_string(i));
      CHECK(w["address"] == cluster.spec.task_address("worker", i));
      CHECK(w["state"] == "up");
      CHECK(w["closures_failed"] == 0);
      CHECK(w["in_flight"] == 0);
      CHECK(w["restarts"] == 0);
      CHECK(w["heartbeat_age_seconds"].is_number());
      succeeded += w["closures_succeeded"].get<double>();
    }
    CHECK(succeeded == 20);

    REQUIRE(first["ps"].size() == 1);
    const auto& ps = first["ps"][0];
    CHECK(ps["task"] == "ps:0");
    CHECK(ps["address"] == cluster.spec.task_address("ps", 0));
    CHECK(ps["variables"] == 1);
    CHECK(ps["bytes"] == 8 * 4 * 4);

    const auto& queue = first["queue"];
    CHECK(queue["queued"] == 0);
    CHECK(queue["in_flight"] == 0);
    CHECK(queue["scheduled_total"] == 20);
    CHECK(queue["done_total"] == 20);

    const auto& loss = first["scalars"]["train/loss"];
    REQUIRE(loss["points"].size() == 5);
    CHECK(loss["points"][0][0] == 1);
    CHECK(loss["points"][0][1] == 1.0);
    CHECK(loss["last_step"] == 5);
    CHECK(loss["last_value"].get<double>() == doctest::Approx(0.2));

    bool warned = false;
    for (const auto& p : first["problems"]["recent"]) {
      if (p["message"] == "a warning for the page" && p["level"] == "WARNING") warned = true;
    }
    CHECK(warned);
    CHECK(first["problems"]["logged"].get<std::uint64_t>() >= 1);
    const auto& newest = first["checkpoint"];
    CHECK(newest["path"] == saved.string());
    CHECK(newest["step"] == 3);
    CHECK(newest["seconds"].get<double>() >= 0);
    CHECK(newest["time"].get<double>() <= first["time"].get<double>());

    // Two seconds later by the clock the document is given, 10 more steps and 20 more closures:
    // rates over those two seconds, and the time left at that rate.
    for (int i = 0; i < 20; ++i) (void)coordinator.schedule(increment, std::int64_t{i});
    co_await coordinator.join();
    report.update(25);
    const auto second = document_at(base, std::chrono::seconds(2));
    INFO(second.dump(2));
    CHECK(second["job"]["steps_per_second"] == 10.0);
    CHECK(second["job"]["eta_seconds"] == 7.5);
    CHECK(second["queue"]["scheduled_per_second"] == 10.0);
    CHECK(second["queue"]["done_per_second"] == 10.0);
  });
  // Closed with exit code 0.
  const auto after = document_at(std::chrono::steady_clock::now(), std::chrono::seconds(0));
  CHECK(after["job"]["state"] == "finished");
}

TEST_CASE("the chief's document shows the requests a worker sends to a ps, as the ps itself reports them") {
  // Two ps in one process: the process's own ps series add both up, and the chief's frames to a ps
  // are its heartbeats. Only what each ps reports of itself tells them apart.
  local_cluster cluster(2, 1, bind_push_ones);
  cluster.run_chief([&](parameter_server_strategy& strategy, cluster_coordinator& coordinator) -> asio::awaitable<void> {
    const xt::xarray<float> zeros = xt::zeros<float>({16, 4});
    auto v = co_await strategy.scope().create_variable("v", zeros);
    const auto busy = task_name("ps", v.ps_task());
    const auto idle = task_name("ps", 1 - v.ps_task());
    constexpr int steps = 20;
    for (int i = 0; i < steps; ++i) (void)coordinator.schedule(push_ones, v);
    co_await coordinator.join();
    // The ps of `v` served its create and the worker's updates; the other one, nothing.
    const double busy_served = co_await until_reported(busy, 1 + steps);
    const double idle_served = co_await until_reported(idle, 0);
    CHECK(busy_served == 1 + steps);
    CHECK(idle_served == 0);

    const auto base = std::chrono::steady_clock::now();
    const auto first = document_at(base, std::chrono::seconds(0));
    INFO(first.dump(2));
    REQUIRE(first["ps"].size() == 2);
    for (const auto& ps : first["ps"]) {
      const bool holds_v = ps["task"] == busy;
      CHECK(ps["requests_total"] == (holds_v ? 1 + steps : 0));
      CHECK(ps["held_variables"] == (holds_v ? 1 : 0));
      if (holds_v) {
        CHECK(ps["held_bytes"].get<double>() >= 16 * 4 * 4);
      } else {
        CHECK(ps["held_bytes"] == 0);
      }
      CHECK(ps["resident_memory_bytes"].get<double>() > 0);
      CHECK(ps["requests_per_second"].is_null());  // no earlier document to count from
    }

    // 20 more updates, reported, and the document two seconds later by its clock: 10 requests/s.
    for (int i = 0; i < steps; ++i) (void)coordinator.schedule(push_ones, v);
    co_await coordinator.join();
    const double busy_served_again = co_await until_reported(busy, 1 + 2 * steps);
    CHECK(busy_served_again == 1 + 2 * steps);
    const auto second = document_at(base, std::chrono::seconds(2));
    INFO(second.dump(2));
    for (const auto& ps : second["ps"]) {
      CHECK(ps["requests_per_second"] == (ps["task"] == busy ? 10.0 : 0.0));
    }
  });
}

TEST_CASE("the responder serves the page at / and the document at /api/cluster, and 404 elsewhere") {
  metrics::registry r;
  metrics::exposer e("127.0.0.1:0", r);
  const auto get = [&](const std::string& request) {
    asio::io_context io;
    asio::ip::tcp::socket socket(io);
    socket.connect({asio::ip::make_address("127.0.0.1"), e.port()});
    std::error_code ec;
    asio::write(socket, asio::buffer(request), ec);
    std::string response;
    asio::read(socket, asio::dynamic_buffer(response), ec);
    return response;
  };
  const auto page = get("GET / HTTP/1.1\r\nHost: x\r\n\r\n");
  CHECK(starts_with(page, "HTTP/1.1 200 OK\r\n"));
  CHECK(contains(page, "Content-Type: text/html; charset=utf-8\r\n"));
  CHECK(contains(page, "Cache-Control: no-store\r\n"));
  CHECK(contains(page, "fetch(API"));
  // Self-contained: nothing is loaded from another origin.
  CHECK(!contains(page, "src=\"http"));
  CHECK(!contains(page, "href=\"http"));

  const auto api = get("GET /api/cluster?x=1 HTTP/1.0\r\n\r\n");
  REQUIRE(starts_with(api, "HTTP/1.1 200 OK\r\n"));
  CHECK(contains(api, "Content-Type: application/json\r\n"));
  const auto body = nlohmann::json::parse(api.substr(api.find("\r\n\r\n") + 4));
  CHECK(body.contains("view"));
  CHECK(body["problems"].contains("recent"));

  CHECK(starts_with(get("GET /api HTTP/1.1\r\n\r\n"), "HTTP/1.1 404 Not Found\r\n"));
  CHECK(starts_with(get("GET /index.html HTTP/1.1\r\n\r\n"), "HTTP/1.1 404 Not Found\r\n"));
  CHECK(starts_with(get("POST /api/cluster HTTP/1.1\r\n\r\n"), "HTTP/1.1 405 Method Not Allowed\r\n"));
  CHECK(starts_with(get("HEAD / HTTP/1.1\r\n\r\n"), "HTTP/1.1 405 Method Not Allowed\r\n"));
  CHECK(starts_with(get("GET /api/cluster HTTP/3\r\n\r\n"), "HTTP/1.1 400 Bad Request\r\n"));
}

// The chief's JSON document (/api/cluster) of a live cluster in one process (2 workers, 1 ps, real
// loopback TCP): what the page draws comes from the metrics the chief keeps, the progress report,
// the summary writer, the checkpoint manager and the log, and the responder serves it.
#include "local_cluster.hpp"
#include "test_support.hpp"

#include <pscoro/checkpoint.hpp>
#include <pscoro/coordinator.hpp>
#include <pscoro/progress.hpp>
#include <pscoro/summary.hpp>

#include "common/log.hpp"
#include "metrics/cluster_view.hpp"

#include <asio/connect.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/read.hpp>
#include <asio/write.hpp>

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

// Metrics: the counters, gauges and histograms, the registry's text exposition (format 0.0.4),
// the HTTP responder's answers to any request head, and the responder itself on a real socket,
// including clients that send too much, too little or nothing at all.
#include "test_support.hpp"

#include <pscoro/log.hpp>
#include <pscoro/metrics.hpp>
#include <pscoro/server.hpp>

#include "metrics/cluster_view.hpp"
#include "metrics/http.hpp"
#include "metrics/library.hpp"

#include <asio/connect.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/read.hpp>
#include <asio/write.hpp>

#include <fmt/format.h>

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <mutex>
#include <thread>
#include <vector>

using namespace pscoro;

namespace {

// Sends `request` to 127.0.0.1:`port` and reads until the server closes: the whole response.
std::string exchange(std::uint16_t port, const std::string& request) {
  asio::io_context io;
  asio::ip::tcp::socket socket(io);
  socket.connect({asio::ip::make_address("127.0.0.1"), port});
  std::error_code ec;
  if (!request.empty()) asio::write(socket, asio::buffer(request), ec);
  std::string response;
  asio::read(socket, asio::dynamic_buffer(response), ec);  // until EOF (or a reset)
  return response;
}

}  // namespace

TEST_CASE("a histogram counts an observation in the first bucket whose bound is not below it") {
  metrics::histogram h({1, 2, 5});
  h.observe(0.5);
  h.observe(1);  // le="1" includes 1
  h.observe(1.5);
  h.observe(7);
  const auto s = h.read();
  CHECK(s.counts == std::vector<std::uint64_t>{2, 1, 0, 1});
  CHECK(s.count == 4);
  CHECK(s.sum == doctest::Approx(10));
  CHECK_THROWS_AS(metrics::histogram({2, 1}), error);
}

TEST_CASE("the exposition groups series by name with HELP and TYPE once, escaped as the format says") {
  metrics::registry r;
  metrics::counter sent_a, sent_b;
  metrics::gauge held;
  metrics::histogram latency({0.1, 1});
  sent_a.inc(3);
  sent_b.inc(4);
  held.set(-2);
  latency.observe(0.05);
  latency.observe(0.5);
  latency.observe(0.5);
  latency.observe(3);
  auto r1 = r.add("x_sent_total", "Sent \\ per\npeer.", {{"peer", "ps:0"}}, sent_a);
  auto r2 = r.add("x_sent_total", "Sent \\ per\npeer.", {{"peer", "a\"b\\c\nd"}}, sent_b);
  auto r3 = r.add("x_held", "Held.", {}, held);
  auto r4 = r.add("x_seconds", "Latency.", {{"op", "read"}}, latency);
  CHECK(r.expose() ==
        "# HELP x_held Held.\n"
        "# TYPE x_held gauge\n"
        "x_held -2\n"
        "# HELP x_seconds Latency.\n"
        "# TYPE x_seconds histogram\n"
        "x_seconds_bucket{op=\"read\",le=\"0.1\"} 1\n"
        "x_seconds_bucket{op=\"read\",le=\"1\"} 3\n"
        "x_seconds_bucket{op=\"read\",le=\"+Inf\"} 4\n"
        "x_seconds_sum{op=\"read\"} 4.05\n"
        "x_seconds_count{op=\"read\"} 4\n"
        "# HELP x_sent_total Sent \\\\ per\\npeer.\n"
        "# TYPE x_sent_total counter\n"
        "x_sent_total{peer=\"a\\\"b\\\\c\\nd\"} 4\n"
        "x_sent_total{peer=\"ps:0\"} 3\n");
  CHECK(r.value("x_sent_total", {{"peer", "ps:0"}}) == 3);
  CHECK(r.value("x_held") == -2);
  CHECK_FALSE(r.value("x_sent_total").has_value());
  REQUIRE(r.histogram_value("x_seconds", {{"op", "read"}}).has_value());
  CHECK(r.histogram_value("x_seconds", {{"op", "read"}})->count == 4);
}

TEST_CASE("series with the same name and labels are exposed as their sum; a registration ends with its owner") {
  metrics::registry r;
  metrics::gauge a, b;
  a.set(2);
  b.set(5);
  auto first = r.add("held_bytes", "Held.", {}, a);
  {
    auto second = r.add("held_bytes", "Held.", {}, b);
    CHECK(r.value("held_bytes") == 7);
  }
  CHECK(r.value("held_bytes") == 2);
  first = {};
  CHECK_FALSE(r.value("held_bytes").has_value());
  CHECK(r.expose().empty());
}

TEST_CASE("bad names, reserved labels and a second meaning for a name are refused") {
  metrics::registry r;
  metrics::counter c;
  metrics::histogram h;
  CHECK_THROWS_AS((void)r.add("9lives", "", {}, c), error);
  CHECK_THROWS_AS((void)r.add("a-b", "", {}, c), error);
  CHECK_THROWS_AS((void)r.add("ok", "", {{"__name", "x"}}, c), error);
  CHECK_THROWS_AS((void)r.add("ok", "", {{"bad-label", "x"}}, c), error);
  CHECK_THROWS_AS((void)r.add("ok", "", {{"a", "x"}, {"a", "y"}}, c), error);
  CHECK_THROWS_AS((void)r.add("ok_seconds", "", {{"le", "1"}}, h), error);
  auto kept = r.add("ok", "Help.", {}, c);
  CHECK_THROWS_AS((void)r.add("ok", "Other help.", {{"x", "1"}}, c), error);
  CHECK_THROWS_AS((void)r.add("ok", "Help.", {{"x", "1"}}, h), error);
}

TEST_CASE("a collector's samples are read at each exposition") {
  metrics::registry r;
  double v = 1.5;
  auto registered = r.add_collector([&v] {
    return std::vector<metrics::sample>{{"y_value", "Y.", metrics::metric_type::gauge, {}, v}};
  });
  CHECK(contains(r.expose(), "y_value 1.5\n"));
  v = 2;
  CHECK(contains(r.expose(), "y_value 2\n"));
}

TEST_CASE("the process registry has Prometheus's process series: memory, CPU time, descriptors, start time") {
  // The library registers its process collector when it first counts anything.
  metrics::dataset_bytes_read().inc(0);
  const auto text = metrics::process_registry().expose();
  CHECK(contains(text, "# TYPE process_resident_memory_bytes gauge\n"));
  CHECK(contains(text, "# TYPE process_cpu_seconds_total counter\n"));
  const auto rss = metrics::process_registry().value("process_resident_memory_bytes");
  REQUIRE(rss.has_value());
  CHECK(*rss > 0);
  // A descriptor opened now is counted, and closing it takes it off again.
  const auto open_before = metrics::process_registry().value("process_open_fds");
  REQUIRE(open_before.has_value());
  const int fd = ::open("/dev/null", O_RDONLY);
  REQUIRE(fd >= 0);
  CHECK(metrics::process_registry().value("process_open_fds") == *open_before + 1);
  ::close(fd);
  CHECK(metrics::process_registry().value("process_open_fds") == *open_before);
  const auto limit = metrics::process_registry().value("process_max_fds");
  REQUIRE(limit.has_value());
  CHECK(*limit >= *open_before);
  // Started before now, and not before this year.
  const auto started = metrics::process_registry().value("process_start_time_seconds");
  REQUIRE(started.has_value());
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  CHECK(*started <= now + 1);
  CHECK(*started > now - 86400 * 365);
}

TEST_CASE("the responder answers GET /metrics, / and /api/cluster and says what it does not serve") {
  using metrics::resource;
  CHECK(metrics::answer_http("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").served == resource::metrics);
  CHECK(metrics::answer_http("GET /metrics?name[]=x HTTP/1.0\r\n\r\n").served == resource::metrics);
  CHECK(metrics::answer_http("GET / HTTP/1.1\r\n\r\n").served == resource::page);
  CHECK(metrics::answer_http("GET /?refresh=1 HTTP/1.1\r\n\r\n").served == resource::page);
  CHECK(metrics::answer_http("GET /api/cluster HTTP/1.1\r\n\r\n").served == resource::cluster);
  CHECK(metrics::answer_http("GET /api/cluster?pretty HTTP/1.0\r\n\r\n").served == resource::cluster);
  for (const char* unknown : {"GET /metricsx HTTP/1.1\r\n\r\n", "GET /api HTTP/1.1\r\n\r\n",
                              "GET /api/cluster/ HTTP/1.1\r\n\r\n", "GET /api/task HTTP/1.1\r\n\r\n",
                              "GET //api/cluster HTTP/1.1\r\n\r\n", "GET /index.html HTTP/1.1\r\n\r\n",
                              "GET /../etc/passwd HTTP/1.1\r\n\r\n"}) {
    const auto r = metrics::answer_http(unknown);
    CHECK_MESSAGE(r.status == "404 Not Found", unknown);
    CHECK_MESSAGE(r.served == resource::none, unknown);
  }
  for (const char* method : {"POST /metrics", "POST /api/cluster", "PUT /", "DELETE /", "HEAD /", "OPTIONS /api/cluster"}) {
    const auto post = metrics::answer_http(std::string(method) + " HTTP/1.1\r\n\r\n");
    CHECK_MESSAGE(post.status == "405 Method Not Allowed", method);
    CHECK_MESSAGE(post.allow_get, method);
    CHECK_MESSAGE(post.served == resource::none, method);
  }
  for (const char* bad : {"", "\r\n\r\n", "GET\r\n\r\n", "GET /metrics\r\n\r\n", "GET /metrics HTTP/2.0\r\n\r\n",
                          "GET  /metrics HTTP/1.1\r\n\r\n", "GET /metrics HTTP/1.1 x\r\n\r\n",
                          "G(T /metrics HTTP/1.1\r\n\r\n", "GET metrics HTTP/1.1\r\n\r\n"}) {
    CHECK_MESSAGE(metrics::answer_http(bad).status == "400 Bad Request", bad);
  }
}

TEST_CASE("a scrape of a live responder returns the registry's exposition with the 0.0.4 content type") {
  metrics::registry r;
  metrics::counter c;
  c.inc(42);
  auto registered = r.add("scraped_total", "Scraped.", {}, c);
  metrics::exposer e("127.0.0.1:0", r);
  REQUIRE(e.port() != 0);
  const auto response = exchange(e.port(), "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
  CHECK(starts_with(response, "HTTP/1.1 200 OK\r\n"));
  CHECK(contains(response, "Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"));
  const auto body = r.expose();
  CHECK(contains(response, fmt::format("Content-Length: {}\r\n", body.size())));
  CHECK(contains(response, "\r\n\r\n" + body));
  CHECK(contains(body, "scraped_total 42\n"));

  CHECK(starts_with(exchange(e.port(), "GET /other HTTP/1.1\r\n\r\n"), "HTTP/1.1 404 Not Found\r\n"));
  CHECK(starts_with(exchange(e.port(), "DELETE /metrics HTTP/1.1\r\n\r\n"), "HTTP/1.1 405 Method Not Allowed\r\n"));
  CHECK(starts_with(exchange(e.port(), std::string("\x16\x03\x01\x02\x00\r\n\r\n", 9)), "HTTP/1.1 400 Bad Request\r\n"));
}

TEST_CASE("a request head over 8 KiB is answered 400 and closed, whatever follows") {
  metrics::registry r;
  metrics::exposer e("127.0.0.1:0", r);
  const std::string flood = "GET /metrics HTTP/1.1\r\nX: " + std::string(64 * 1024, 'a');
  const auto response = exchange(e.port(), flood);
  CHECK(starts_with(response, "HTTP/1.1 400 Bad Request\r\n"));
  CHECK(contains(response, "exceeds 8192 bytes"));
  // Still serving.
  CHECK(starts_with(exchange(e.port(), "GET /metrics HTTP/1.1\r\n\r\n"), "HTTP/1.1 200 OK\r\n"));
}

TEST_CASE("a client that sends nothing is dropped at the timeout") {
  metrics::registry r;
  metrics::exposer e("127.0.0.1:0", r, std::chrono::milliseconds(100));
  // exchange() reads until the server closes: it returns only because the timeout closed it.
  CHECK(exchange(e.port(), "") == "");
  CHECK(exchange(e.port(), "GET /metrics HTTP/1.1\r\n") == "");  // an unfinished head too
}

TEST_CASE("connections beyond 64 are closed at accept, and the responder serves again once they go") {
  metrics::registry r;
  metrics::exposer e("127.0.0.1:0", r);
  asio::io_context io;
  std::vector<asio::ip::tcp::socket> idle;
  for (int i = 0; i < 64; ++i) {
    idle.emplace_back(io).connect({asio::ip::make_address("127.0.0.1"), e.port()});
  }
  // The 65th is closed without an answer (the 64 idle ones are accepted first: the listen queue
  // is in order, and each is accepted before the next).
  CHECK(exchange(e.port(), "GET /metrics HTTP/1.1\r\n\r\n") == "");
  for (auto& s : idle) s.close();
  // Their closes reach the responder in a while: try until it answers.
  std::string response;
  while (response.empty()) response = exchange(e.port(), "GET /metrics HTTP/1.1\r\n\r\n");
  CHECK(starts_with(response, "HTTP/1.1 200 OK\r\n"));
}

TEST_CASE("an exposer that cannot listen says where") {
  metrics::registry r;
  metrics::exposer first("127.0.0.1:0", r);
  try {
    metrics::exposer second(fmt::format("127.0.0.1:{}", first.port()), r);
    FAIL("a second exposer listened on a port in use");
  } catch (const std::system_error& e) {
    CHECK(contains(e.what(), fmt::format("metrics cannot listen on 127.0.0.1:{}", first.port())));
  }
}

TEST_CASE("PSCORO_METRICS_PORT takes a port number or 0, and refuses anything else naming itself") {
  ::unsetenv("PSCORO_METRICS_PORT");
  CHECK_FALSE(metrics::metrics_port(std::nullopt).has_value());
  CHECK(metrics::metrics_port(9100) == 9100);
  {
    const pscoro::testing::scoped_environment set("PSCORO_METRICS_PORT", "0");
    CHECK(metrics::metrics_port(std::nullopt) == 0);
  }
  for (const char* bad : {"x", "-1", "65536", "9100 ", "0x10"}) {
    const pscoro::testing::scoped_environment set("PSCORO_METRICS_PORT", bad);
    CHECK_THROWS_WITH_AS(metrics::metrics_port(std::nullopt),
                         doctest::Contains("PSCORO_METRICS_PORT"), error);
  }
}

TEST_CASE("the seconds since each peer was last heard from are a gauge, growing while it is silent") {
  using namespace std::chrono_literals;
  // Before the next test gives 300 peers their series: past 256 they share peer="other".
  auto& peer = metrics::traffic_of("heartbeat_test:0");
  const metrics::labels heard_peer{{"peer", "heartbeat_test:0"}};
  const auto& r = metrics::process_registry();
  CHECK_FALSE(r.value("pscoro_peer_heartbeat_age_seconds", heard_peer).has_value());  // never heard
  // A peer last heard 30 s ago (a stopped worker, say) shows 30 s and more, computed at the read.
  peer.heard(std::chrono::steady_clock::now() - 30s);
  const auto silent = r.value("pscoro_peer_heartbeat_age_seconds", heard_peer);
  REQUIRE_MESSAGE(silent.has_value(), "no pscoro_peer_heartbeat_age_seconds{peer=\"heartbeat_test:0\"} for a peer heard "
                                      "30 s ago");
  CHECK(*silent >= 30);
  peer.heard(std::chrono::steady_clock::now());
  const auto live = r.value("pscoro_peer_heartbeat_age_seconds", heard_peer);
  REQUIRE(live.has_value());
  CHECK(*live < *silent);
  CHECK(contains(r.expose(), "# TYPE pscoro_peer_heartbeat_age_seconds gauge\n"));
}

TEST_CASE("peer traffic counters are shared per task, and peers past the cap share one series") {
  auto& a = metrics::traffic_of("metrics_test:0");
  auto& again = metrics::traffic_of("metrics_test:0");
  CHECK(&a == &again);
  a.frames_sent.inc(2);
  CHECK(metrics::process_registry().value("pscoro_peer_sent_frames_total", {{"peer", "metrics_test:0"}}) >= 2);
  for (int i = 0; i < 300; ++i) (void)metrics::traffic_of(fmt::format("stranger:{}", i));
  const auto page = metrics::process_registry().expose();
  CHECK(contains(page, "pscoro_peer_sent_frames_total{peer=\"other\"}"));
  CHECK(!contains(page, "stranger:299"));
}

TEST_CASE("a server asked for metrics in code (metrics_port 0) serves the process's page and logs its URL") {
  ::unsetenv("PSCORO_METRICS_PORT");
  std::mutex mutex;
  std::vector<std::string> lines;
  set_log_sink([&](const log_record& r) {
    const std::lock_guard lock(mutex);
    lines.emplace_back(r.message);
  });
  cluster_spec spec;
  spec.add_task("ps", 0, "127.0.0.1:0");
  asio::io_context io;
  server_options options;
  options.metrics_port = 0;
  server s(io.get_executor(), simple_cluster_resolver(spec, "ps", 0), options);
  s.start();
  set_log_sink({});
  std::string url;
  for (const auto& line : lines) {
    if (line.starts_with("ps:0 metrics at http://127.0.0.1:")) url = line.substr(line.rfind(' ') + 1);
  }
  REQUIRE_MESSAGE(!url.empty(), "no 'ps:0 metrics at' line among ", lines.size(), " lines");
  REQUIRE(url.ends_with("/metrics"));
  const auto port_text = url.substr(std::string("http://127.0.0.1:").size(), url.size() - 8 - 17);
  const auto port = static_cast<std::uint16_t>(std::stoi(port_text));
  const auto response = exchange(port, "GET /metrics HTTP/1.1\r\n\r\n");
  CHECK(starts_with(response, "HTTP/1.1 200 OK\r\n"));
  // The ps registered its metrics: a page a Prometheus server can take at once.
  CHECK(contains(response, "\npscoro_ps_variables 0\n"));
  CHECK(contains(response, "pscoro_ps_operation_seconds_count{operation=\"read\"} 0\n"));
  // Its own view at /api/cluster: the task, its series, what it holds; no chief it could link to
  // (its metrics port was picked free).
  const auto api = exchange(port, "GET /api/cluster HTTP/1.1\r\n\r\n");
  REQUIRE(starts_with(api, "HTTP/1.1 200 OK\r\n"));
  const auto view = nlohmann::json::parse(api.substr(api.find("\r\n\r\n") + 4));
  INFO(view.dump(2));
  CHECK(view["view"] == "task");
  CHECK(view["task"] == "ps:0");
  CHECK(view["role"] == "ps");
  CHECK(view["chief_page"].is_null());
  CHECK(view["ps"]["variables"] == 0);
  CHECK(view["ps"]["bytes"] == 0);
  bool listed = false;
  for (const auto& series : view["series"]) listed = listed || series["name"] == "pscoro_ps_variables";
  CHECK(listed);
  CHECK_FALSE(view.contains("workers"));
}

TEST_CASE("quantile_bound: the smallest bound holding at least that share of the observations") {
  pscoro::metrics::histogram h({0, 1, 2, 4, 8});
  CHECK(pscoro::metrics::quantile_bound(h.read(), 0.5) == 0);  // nothing observed
  for (int i = 0; i < 90; ++i) h.observe(0);
  for (int i = 0; i < 9; ++i) h.observe(3);
  h.observe(100);
  const auto s = h.read();
  CHECK(pscoro::metrics::quantile_bound(s, 0.5) == 0);
  CHECK(pscoro::metrics::quantile_bound(s, 0.9) == 0);   // 90 of 100 are 0
  CHECK(pscoro::metrics::quantile_bound(s, 0.91) == 4);  // the 91st is 3: in (2, 4]
  CHECK(pscoro::metrics::quantile_bound(s, 0.99) == 4);
  CHECK(pscoro::metrics::quantile_bound(s, 1.0) == 8);   // above the last bound: the last bound
}
TEST_CASE("a server with a fixed metrics port links to the chief's page on the chief's host") {
  metrics::view_state state;
  state.set_task({"worker:1", "worker", "http://10.0.0.1:9100/", {}, {}});
  metrics::registry r;
  auto doc = state.document(r, std::chrono::system_clock::now(), std::chrono::steady_clock::now());
  CHECK(doc["chief_page"] == "http://10.0.0.1:9100/");
  CHECK(doc["view"] == "task");
  // A second server's view does not replace the first; a chief's does.
  state.set_task({"ps:0", "ps", "", {}, {}});
  CHECK(state.document(r, std::chrono::system_clock::now(), std::chrono::steady_clock::now())["task"] == "worker:1");
  state.set_task({"chief:0", "chief", "", {{"ps:0", "h:1"}}, {{"worker:0", "h:2"}}});
  doc = state.document(r, std::chrono::system_clock::now(), std::chrono::steady_clock::now());
  CHECK(doc["view"] == "chief");
  CHECK(doc["workers"][0]["state"] == "unknown");  // no series says yet
  CHECK(doc["ps"][0]["address"] == "h:1");
}

TEST_CASE("a server links to the chief's page at the URL the chief sent; the chief's own view links nowhere") {
  metrics::view_state state;
  state.set_task({"worker:0", "worker", "", {}, {}});  // a metrics port picked free: no URL to guess
  metrics::registry r;
  CHECK(state.document(r, std::chrono::system_clock::now(), std::chrono::steady_clock::now())["chief_page"].is_null());
  state.set_chief_page("http://127.0.0.1:41235/");
  CHECK(state.document(r, std::chrono::system_clock::now(), std::chrono::steady_clock::now())["chief_page"] ==
        "http://127.0.0.1:41235/");
  // A whole cluster in one process shows the chief's view, which a server's Hello does not change.
  state.set_task({"chief:0", "chief", "", {}, {}});
  state.set_chief_page("http://127.0.0.1:41235/");
  CHECK(state.document(r, std::chrono::system_clock::now(), std::chrono::steady_clock::now())["chief_page"].is_null());
}

TEST_CASE("the chief's view shows what each ps reports of itself, null before its first report, and its request rate") {
  metrics::view_state state;
  state.set_task({"chief:0", "chief", "", {{"ps:0", "h:1"}, {"ps:1", "h:2"}}, {}});
  metrics::registry r;
  // ps:0 has reported (coordinator_core registers these series at a ps's first report); ps:1 not yet.
  metrics::counter requests;
  metrics::gauge variables, held, memory;
  const metrics::labels ps0{{"ps", "ps:0"}};
  std::vector<metrics::registry::registration> registered;
  registered.push_back(r.add("pscoro_coordinator_ps_requests_total", "h", ps0, requests));
  registered.push_back(r.add("pscoro_coordinator_ps_held_variables", "h", ps0, variables));
  registered.push_back(r.add("pscoro_coordinator_ps_held_bytes", "h", ps0, held));
  registered.push_back(r.add("pscoro_coordinator_ps_resident_memory_bytes", "h", ps0, memory));
  requests.inc(100);
  variables.set(3);
  held.set(4096);
  memory.set(50 << 20);
  const auto base = std::chrono::steady_clock::now();
  const auto first = state.document(r, std::chrono::system_clock::now(), base);
  INFO(first.dump(2));
  const auto& reported = first["ps"][0];
  CHECK(reported["held_variables"] == 3);
  CHECK(reported["held_bytes"] == 4096);
  CHECK(reported["resident_memory_bytes"] == 50 << 20);
  CHECK(reported["requests_total"] == 100);
  CHECK(reported["requests_per_second"].is_null());  // no earlier document to count from
  for (const char* field : {"held_variables", "held_bytes", "resident_memory_bytes", "requests_total",
                            "requests_per_second"}) {
    CHECK_MESSAGE(first["ps"][1][field].is_null(), field);
  }
  requests.inc(50);
  const auto second = state.document(r, std::chrono::system_clock::now(), base + std::chrono::seconds(2));
  CHECK(second["ps"][0]["requests_per_second"] == 25.0);
}

TEST_CASE("a scalar curve keeps its whole shape in bounded points, and its last value exactly") {
  metrics::view_state state;
  const std::int64_t steps = 100'000;
  for (std::int64_t step = 1; step <= steps; ++step) state.record_scalar("loss", step, 1.0 / static_cast<double>(step));
  state.record_scalar("nan", 1, std::nan(""));
  for (std::size_t i = 0; i < metrics::view_state::max_curves + 5; ++i) state.record_scalar(fmt::format("t{}", i), 1, 1);
  metrics::registry r;
  const auto doc = state.document(r, std::chrono::system_clock::now(), std::chrono::steady_clock::now());
  const auto& loss = doc["scalars"]["loss"];
  const auto& points = loss["points"];
  CHECK(points.size() <= metrics::view_state::max_points);
  CHECK(points.size() >= metrics::view_state::max_points / 4);
  CHECK(points.front()[0] == 1);
  CHECK(points.back()[0].get<std::int64_t>() > steps * 9 / 10);  // it reaches the end of the run
  for (std::size_t i = 1; i < points.size(); ++i) CHECK(points[i][0] > points[i - 1][0]);
  CHECK(loss["last_step"] == steps);
  CHECK(doc["scalars"]["nan"]["last_value"].is_null());  // JSON has no NaN
  CHECK(doc["scalars"].size() == metrics::view_state::max_curves);
}


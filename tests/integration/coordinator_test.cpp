// Coordinator, 2 ps and 2 workers in one process over real loopback TCP.
#include "local_cluster.hpp"
#include "net/peer.hpp"
#include "test_support.hpp"

#include <pscoro/coordinator.hpp>

#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <set>
#include <vector>
#include <tuple>
#include <optional>
#include <map>
#include <stdexcept>
#include <thread>

using namespace pscoro;
using pscoro::testing::code_of;
using pscoro::testing::failure_of;
using pscoro::testing::message_of;
using pscoro::testing::local_cluster;

namespace {

const worker_function<std::int64_t(std::int64_t)> add_one{"test.add_one"};
const worker_function<void(std::string)> fail{"test.fail"};
const worker_function<void(std::string)> fail_with_code{"test.fail_with_code"};
const worker_function<void()> hold{"test.hold"};
const worker_function<double(variable<float>, double)> bump{"test.bump"};
const worker_function<std::string()> whoami{"test.whoami"};
const worker_function<double(variable<float>)> read_sum{"test.read_sum"};
// Bounded staleness probes: `mark_done` returns the lowest index of `done` still 0, then adds 1 at
// index k; `affine` sets x to x * 1.5 + k (read, then assign: the order of closures shows).
const worker_function<std::int64_t(variable<float>, std::int64_t)> mark_done{"test.mark_done"};
const worker_function<void(variable<float>, std::int64_t)> affine{"test.affine"};

std::atomic<bool> release_holds{false};

// Run until cancelled, or for spin_backstop (so that a failure of cancellation fails the test
// instead of hanging it): one computes, one reads a variable over and over.
const worker_function<std::string()> spin{"test.spin"};
const worker_function<std::string(variable<float>)> spin_reads{"test.spin_reads"};
constexpr auto spin_backstop = std::chrono::seconds(60);
std::atomic<int> spins_started{0};
std::atomic<int> spins_ended{0};
std::atomic<int> spins_cancelled{0};  // ended with errc::cancelled

// Polls `condition` every millisecond on the awaiting coroutine's executor until it holds.
asio::awaitable<void> poll_until(bool (*condition)()) {
  asio::steady_timer timer(co_await asio::this_coro::executor);
  while (!condition()) {
    timer.expires_after(std::chrono::milliseconds(1));
    co_await timer.async_wait(asio::use_awaitable);
  }
}

// Awaits `step()` over and over until it throws or spin_backstop has passed, counting how the spin
// ended. (`step` lives in this coroutine's frame, so a capturing lambda coroutine is safe.)
template <class Step>
asio::awaitable<std::string> spin_with(Step step) {
  ++spins_started;
  const auto end = std::chrono::steady_clock::now() + spin_backstop;
  try {
    while (std::chrono::steady_clock::now() < end) co_await step();
  } catch (const error& e) {
    if (e.code() == errc::cancelled) ++spins_cancelled;
    ++spins_ended;
    throw;
  }
  ++spins_ended;
  co_return "ran to its end";
}

// Fails as a worker function does when it cannot reach ps:0, while failures_left > 0.
const worker_function<std::int64_t()> reach_ps{"test.reach_ps"};
std::atomic<int> failures_left{0};

const worker_function<void(variable<float>)> hold_then_bump{"test.hold_then_bump"};
std::atomic<bool> held_bump_started{false};
std::atomic<int> held_bump_outcome{-1};  // the errc its assign_add ended with, 0 for success

void bind_test_functions(server& s) {
  s.bind(add_one, [](std::int64_t x) -> asio::awaitable<std::int64_t> { co_return x + 1; });
  s.bind(fail, [](std::string message) -> asio::awaitable<void> {
    throw std::runtime_error(message);
    co_return;
  });
  s.bind(fail_with_code, [](std::string message) -> asio::awaitable<void> {
    throw error(errc::invalid_argument, message);
    co_return;
  });
  s.bind(hold, []() -> asio::awaitable<void> { co_await poll_until([] { return release_holds.load(); }); });
  // Adds `x` to every element on the ps, then returns the sum it reads back.
  s.bind(bump, [](variable<float> v, double x) -> asio::awaitable<double> {
    xt::xarray<float> delta = xt::zeros<float>(v.shape());
    delta.fill(static_cast<float>(x));
    co_await v.assign_add(delta);
    const auto value = co_await v.read();
    co_return static_cast<double>(xt::sum(value)());
  });
  // Waits for release_holds, then adds 1 to `v`; records how that ended.
  s.bind(hold_then_bump, [](variable<float> v) -> asio::awaitable<void> {
    held_bump_started = true;
    co_await poll_until([] { return release_holds.load(); });
    try {
      xt::xarray<float> ones = xt::ones<float>(v.shape());
      co_await v.assign_add(ones);
      held_bump_outcome = 0;
    } catch (const error& e) {
      held_bump_outcome = e.code().value();
    }
  });
  s.bind(reach_ps, []() -> asio::awaitable<std::int64_t> {
    if (failures_left.fetch_sub(1) > 0) {
      throw remote_error(make_error_code(errc::unavailable), "ps:0", "connection to ps:0 at 127.0.0.1:1 lost: reset");
    }
    co_return 7;
  });
  s.bind(spin, []() {
    return spin_with([]() -> asio::awaitable<void> {
      co_await this_closure::check_cancelled();
      volatile double x = 0;
      for (int i = 0; i < 10000; ++i) x = x + 1;
    });
  });
  s.bind(spin_reads, [](variable<float> v) {
    return spin_with([v]() -> asio::awaitable<void> { (void)co_await v.read(); });
  });
  s.bind(whoami, [task = s.task()]() -> asio::awaitable<std::string> { co_return task; });
  s.bind(mark_done, [](variable<float> done, std::int64_t k) -> asio::awaitable<std::int64_t> {
    const xt::xarray<float> seen = co_await done.read();
    std::int64_t lowest = 0;
    while (lowest < static_cast<std::int64_t>(seen.size()) && seen(lowest) != 0) ++lowest;
    xt::xarray<float> mark = xt::zeros<float>(done.shape());
    mark(k) = 1;
    co_await done.assign_add(mark);
    co_return lowest;
  });
  s.bind(affine, [](variable<float> x, std::int64_t k) -> asio::awaitable<void> {
    xt::xarray<float> value = co_await x.read();
    value = value * 1.5f + static_cast<float>(k);
    co_await x.assign(value);
  });
  s.bind(read_sum, [](variable<float> v) -> asio::awaitable<double> {
    const auto value = co_await v.read();
    co_return static_cast<double>(xt::sum(value)());
  });
}

}  // namespace

TEST_CASE("scheduled closures return their results and join waits for all of them") {
  local_cluster cluster(2, 2, bind_test_functions);
  cluster.run_chief([](parameter_server_strategy&, cluster_coordinator& coordinator) -> asio::awaitable<void> {
    std::vector<remote_value<std::int64_t>> values;
    for (int i = 0; i < 100; ++i) values.push_back(coordinator.schedule(add_one, i));
    co_await coordinator.join();
    CHECK(coordinator.done());
    for (int i = 0; i < 100; ++i) {
      CHECK(values[i].status() == remote_status::ready);
      CHECK(co_await values[i].get() == i + 1);
    }
    const auto all = co_await cluster_coordinator::fetch(values);
    CHECK(all.size() == 100);
    CHECK(all[99] == 100);
  });
}

TEST_CASE("closures are spread over both workers") {
  local_cluster cluster(1, 2, bind_test_functions);
  cluster.run_chief([](parameter_server_strategy&, cluster_coordinator& coordinator) -> asio::awaitable<void> {
    std::vector<remote_value<std::string>> values;
    for (int i = 0; i < 64; ++i) values.push_back(coordinator.schedule(whoami));
    std::set<std::string> seen;
    for (auto& v : values) seen.insert(co_await v.get());
    CHECK(seen == std::set<std::string>{"worker:0", "worker:1"});
  });
}

TEST_CASE("a remote_value goes from not_ready to ready") {
  release_holds = false;
  local_cluster cluster(1, 1, bind_test_functions);
  cluster.run_chief([](parameter_server_strategy&, cluster_coordinator& coordinator) -> asio::awaitable<void> {
    auto held = coordinator.schedule(hold);
    CHECK(held.status() == remote_status::not_ready);
    CHECK_FALSE(coordinator.done());
    release_holds = true;
    co_await held.get();
    CHECK(held.status() == remote_status::ready);
  });
}

TEST_CASE("a worker function's exception comes back with its message, the function and the worker") {
  local_cluster cluster(1, 1, bind_test_functions);
  cluster.run_chief([](parameter_server_strategy&, cluster_coordinator& coordinator) -> asio::awaitable<void> {
    auto failed = coordinator.schedule(fail, std::string("boom"));
    auto e = co_await failure_of(failed.get());
    REQUIRE(e);
    CHECK(failed.status() == remote_status::error);
    try {
      std::rethrow_exception(e);
    } catch (const remote_error& r) {
      CHECK(r.code() == errc::unknown);
      CHECK(r.origin_task() == "worker:0");
      CHECK(contains(r.what(), "worker function 'test.fail' raised: boom"));
    }
    // The same error is raised once by join, then cleared.
    auto joined = co_await failure_of(coordinator.join());
    REQUIRE(joined);
    CHECK(code_of(joined) == errc::unknown);
    CHECK(co_await failure_of(coordinator.join()) == nullptr);
  });
}

TEST_CASE("a pscoro error keeps its code across the wire") {
  local_cluster cluster(1, 1, bind_test_functions);
  cluster.run_chief([](parameter_server_strategy&, cluster_coordinator& coordinator) -> asio::awaitable<void> {
    auto failed = coordinator.schedule(fail_with_code, std::string("bad input"));
    auto e = co_await failure_of(failed.get());
    CHECK(code_of(e) == errc::invalid_argument);
    CHECK_THROWS_AS((void)coordinator.done(), remote_error);
  });
}

TEST_CASE("the first error is raised once by done, then cleared") {
  local_cluster cluster(1, 2, bind_test_functions);
  cluster.run_chief([](parameter_server_strategy&, cluster_coordinator& coordinator) -> asio::awaitable<void> {
    auto first = coordinator.schedule(fail, std::string("first"));
    (void)co_await failure_of(first.get());
    CHECK_THROWS_WITH_AS((void)coordinator.done(), doctest::Contains("first"), remote_error);
    CHECK(coordinator.done());
  });
}

TEST_CASE("the pending error is raised by the next schedule, which queues nothing") {
  local_cluster cluster(1, 2, bind_test_functions);
  cluster.run_chief([](parameter_server_strategy&, cluster_coordinator& coordinator) -> asio::awaitable<void> {
    auto first = coordinator.schedule(fail, std::string("first"));
    (void)co_await failure_of(first.get());
    CHECK_THROWS_WITH_AS(coordinator.schedule(add_one, 1), doctest::Contains("first"), remote_error);
    // Cleared: scheduling works again and join reports nothing old.
    auto later = coordinator.schedule(add_one, 41);
    co_await coordinator.join();
    CHECK(co_await later.get() == 42);
  });
}

TEST_CASE("closures still queued or running when an error is raised are cancelled and say so") {
  release_holds = false;
  local_cluster cluster(1, 2, bind_test_functions);
  coordinator_options options;
  options.closures_per_worker = 2;
  cluster.run_chief(
      [](parameter_server_strategy&, cluster_coordinator& coordinator) -> asio::awaitable<void> {
        // Four slots: the failure and three holds take them all, so the rest stay queued.
        auto failed = coordinator.schedule(fail, std::string("boom"));
        std::vector<remote_value<void>> held;
        for (int i = 0; i < 3; ++i) held.push_back(coordinator.schedule(hold));
        std::vector<remote_value<std::int64_t>> queued;
        for (int i = 0; i < 20; ++i) queued.push_back(coordinator.schedule(add_one, i));
        (void)co_await failure_of(failed.get());
        auto joined = co_await failure_of(coordinator.join());
        release_holds = true;  // they ignore cancellation: they run to their end, unawaited
        REQUIRE(joined);
        CHECK(code_of(joined) == errc::unknown);
        for (auto& h : held) CHECK(h.status() == remote_status::cancelled);  // join did not wait for them
        for (auto& q : queued) {
          CHECK(q.status() == remote_status::cancelled);
          auto e = co_await failure_of(q.get());
          CHECK(code_of(e) == errc::cancelled);
        }
        // Nothing of the cancelled closures is reported again.
        CHECK(coordinator.done());
        co_await coordinator.join();
      },
      options);
}

TEST_CASE("an error cancels the closures still running: join raises at once, their worker stops them and runs the next") {
  spins_started = 0;
  spins_ended = 0;
  spins_cancelled = 0;
  local_cluster cluster(1, 1, bind_test_functions);
  coordinator_options options;
  options.closures_per_worker = 3;
  cluster.run_chief(
      [](parameter_server_strategy& strategy, cluster_coordinator& coordinator) -> asio::awaitable<void> {
        const xt::xarray<float> zeros = xt::zeros<float>({4});
        auto v = co_await strategy.scope().create_variable("v", zeros);
        auto computing = coordinator.schedule(spin);
        auto reading = coordinator.schedule(spin_reads, v);
        co_await poll_until([] { return spins_started == 2; });
        const auto start = std::chrono::steady_clock::now();
        (void)coordinator.schedule(fail, std::string("boom"));
        auto joined = co_await failure_of(coordinator.join());
        const auto waited = std::chrono::steady_clock::now() - start;
        REQUIRE(joined);
        CHECK_MESSAGE(contains(message_of(joined), "boom"), message_of(joined));
        // Far below what the running functions would take: join did not wait for them.
        CHECK(waited < spin_backstop / 2);
        for (const auto* value : {&computing, &reading}) {
          CHECK(value->status() == remote_status::cancelled);
          auto e = co_await failure_of(value->get());
          CHECK(code_of(e) == errc::cancelled);
          CHECK_MESSAGE(contains(message_of(e), "is cancelled"), message_of(e));
          CHECK_MESSAGE(contains(message_of(e), "boom"), message_of(e));
        }
        // On the worker, both stopped at their next pscoro operation, with errc::cancelled.
        co_await poll_until([] { return spins_ended == 2; });
        CHECK(spins_cancelled == 2);
        // The next generation is untouched: the worker runs the next closure normally.
        CHECK(co_await coordinator.schedule(add_one, 41).get() == 42);
        co_await coordinator.join();
      },
      options);
}

TEST_CASE("awaiting a queued closure after an earlier one failed ends at once, naming the cause") {
  // The natural loop over results: without a join, a queued closure's value must still resolve.
  local_cluster cluster(1, 1, bind_test_functions);
  coordinator_options options;
  options.closures_per_worker = 1;
  cluster.run_chief(
      [](parameter_server_strategy&, cluster_coordinator& coordinator) -> asio::awaitable<void> {
        auto failed = coordinator.schedule(fail, std::string("bad record at offset 5000"));
        std::vector<remote_value<std::int64_t>> queued;
        for (int i = 0; i < 5; ++i) queued.push_back(coordinator.schedule(add_one, i));
        auto e = co_await failure_of(queued.back().get());
        REQUIRE(e);
        CHECK(code_of(e) == errc::cancelled);
        CHECK(contains(message_of(e), "is cancelled"));
        CHECK(contains(message_of(e), "bad record at offset 5000"));
        for (auto& q : queued) CHECK(q.status() == remote_status::cancelled);
        CHECK(failed.status() == remote_status::error);
        // The error itself is still reported once.
        auto joined = co_await failure_of(coordinator.join());
        REQUIRE(joined);
        CHECK(contains(message_of(joined), "bad record at offset 5000"));
        CHECK(coordinator.done());
      },
      options);
}

TEST_CASE("scheduling a function no worker binds names the function and the worker") {
  const worker_function<void()> unknown{"test.not_bound"};
  local_cluster cluster(1, 1, bind_test_functions);
  cluster.run_chief([unknown](parameter_server_strategy&, cluster_coordinator& coordinator) -> asio::awaitable<void> {
    coordinator.schedule(unknown);
    auto e = co_await failure_of(coordinator.join());
    REQUIRE(e);
    CHECK(code_of(e) == errc::not_found);
    try {
      std::rethrow_exception(e);
    } catch (const remote_error& r) {
      CHECK(contains(r.what(), "worker function 'test.not_bound' is not bound on worker:0"));
      CHECK(contains(r.what(), "test.add_one"));  // lists what it does bind
    }
  });
}

TEST_CASE("a function scheduled with another signature than the worker binds is refused") {
  const worker_function<double(std::int64_t)> add_one_as_double{"test.add_one"};
  local_cluster cluster(1, 1, bind_test_functions);
  cluster.run_chief([add_one_as_double](parameter_server_strategy&, cluster_coordinator& coordinator) -> asio::awaitable<void> {
    auto v = coordinator.schedule(add_one_as_double, 1);
    auto e = co_await failure_of(v.get());
    CHECK(code_of(e) == errc::invalid_argument);
    CHECK_THROWS_WITH((void)coordinator.done(), doctest::Contains("scheduled as float64(int64) but worker:0 binds it as int64(int64)"));
  });
}

TEST_CASE("fetch from a plain thread blocks until the result is there") {
  local_cluster cluster(1, 2, bind_test_functions);
  pscoro::testing::threaded_chief chief(cluster.spec);
  cluster_coordinator coordinator(chief.strategy);
  std::vector<remote_value<std::int64_t>> values;
  for (int i = 0; i < 50; ++i) values.push_back(coordinator.schedule(add_one, i));
  for (int i = 0; i < 50; ++i) CHECK(values[i].fetch() == i + 1);
  coordinator.async_join(asio::use_future).get();
  CHECK(coordinator.done());
  auto failed = coordinator.schedule(fail, std::string("from a thread"));
  CHECK_THROWS_WITH_AS(failed.fetch(), doctest::Contains("from a thread"), remote_error);
  CHECK_THROWS_AS(coordinator.async_join(asio::use_future).get(), remote_error);  // the future throws
}

TEST_CASE("fetch on the coordinator's own executor is refused instead of deadlocking") {
  local_cluster cluster(1, 1, bind_test_functions);
  cluster.run_chief([](parameter_server_strategy&, cluster_coordinator& coordinator) -> asio::awaitable<void> {
    auto v = coordinator.schedule(add_one, 1);
    CHECK_THROWS_WITH_AS((void)v.fetch(), doctest::Contains("co_await get()"), error);
    try {
      (void)v.fetch();
    } catch (const error& e) {
      CHECK(e.code() == errc::failed_precondition);
    }
    co_await coordinator.join();
  });
}

TEST_CASE("variables are placed round robin and read, assigned and updated from the coordinator") {
  local_cluster cluster(2, 1, bind_test_functions);
  cluster.run_chief([](parameter_server_strategy& strategy, cluster_coordinator&) -> asio::awaitable<void> {
    // Array literals are named first: g++ 12 cannot keep an initializer_list across co_await.
    const xt::xarray<float> a0{{1, 2}, {3, 4}}, ones{{1, 1}, {1, 1}}, some{{0, 0}, {0, 2}};
    const xt::xarray<float> a1{{2, 3}, {4, 3}}, a2{{0, 0}, {0, 1}};
    const xt::xarray<double> b0{0.5};
    const xt::xarray<std::int64_t> c0{7, 8, 9}, c_ones{1, 1, 1}, c1{8, 9, 10};
    auto scope = strategy.scope();
    auto a = co_await scope.create_variable("a", a0);
    auto b = co_await scope.create_variable("b", b0);
    auto c = co_await scope.create_variable("c", c0);
    CHECK(a.ps_task() == 0);
    CHECK(b.ps_task() == 1);
    CHECK(c.ps_task() == 0);
    CHECK(a.shape() == shape_type{2, 2});
    CHECK((co_await a.read() == a0));
    co_await a.assign_add(ones);
    co_await a.assign_sub(some);
    CHECK((co_await a.read() == a1));
    co_await a.assign(a2);
    CHECK((co_await a.read() == a2));
    co_await c.assign_add(c_ones);
    CHECK((co_await c.read() == c1));
    CHECK((co_await b.read() == b0));
  });
}

TEST_CASE("workers read and update variables passed to them") {
  local_cluster cluster(2, 2, bind_test_functions);
  cluster.run_chief([](parameter_server_strategy& strategy, cluster_coordinator& coordinator) -> asio::awaitable<void> {
    auto scope = strategy.scope();
    const xt::xarray<float> zeros10 = xt::zeros<float>({10}), zeros44 = xt::zeros<float>({4, 4});
    xt::xarray<float> twenty = zeros10, ten = zeros44;
    twenty.fill(20.0f);
    ten.fill(10.0f);
    auto first = co_await scope.create_variable("first", zeros10);
    auto second = co_await scope.create_variable("second", zeros44);
    for (int i = 0; i < 20; ++i) {
      coordinator.schedule(bump, first, 1.0);
      coordinator.schedule(bump, second, 0.5);
    }
    co_await coordinator.join();
    CHECK((co_await first.read() == twenty));
    CHECK((co_await second.read() == ten));
  });
}

TEST_CASE("a shape or dtype mismatch is refused and leaves the variable unchanged") {
  local_cluster cluster(1, 1, bind_test_functions);
  cluster.run_chief([](parameter_server_strategy& strategy, cluster_coordinator& coordinator) -> asio::awaitable<void> {
    const xt::xarray<float> initial{1, 2, 3}, too_short{1, 2};
    const xt::xarray<std::int32_t> integers{1, 2, 3};
    auto v = co_await strategy.scope().create_variable("v", initial);
    auto e = co_await failure_of(v.assign_add(too_short));
    CHECK(code_of(e) == errc::invalid_argument);
    CHECK_THROWS_WITH(std::rethrow_exception(e), doctest::Contains("assign_add to 'v': shape [2] does not match the variable's [3]"));
    e = co_await failure_of(v.update(update_op::assign, to_tensor(integers)));
    CHECK_THROWS_WITH(std::rethrow_exception(e), doctest::Contains("assign to 'v': dtype int32 does not match the variable's float32"));
    // A handle whose idea of the variable is wrong is refused by the ps (sent via a worker, which
    // binds the handle to its own connections).
    variable_ref wrong = v.ref();
    wrong.shape = {3, 1};
    auto misread = coordinator.schedule(read_sum, variable<float>(wrong, nullptr));
    e = co_await failure_of(misread.get());
    CHECK(code_of(e) == errc::invalid_argument);
    CHECK_THROWS_WITH(std::rethrow_exception(e),
                      doctest::Contains("the handle says 'v' is float32 [3, 1] but ps:0 holds it as float32 [3]"));
    CHECK_THROWS_AS((void)coordinator.done(), remote_error);
    // An unbound handle fails before anything is sent.
    e = co_await failure_of(variable<float>(wrong, nullptr).read());
    CHECK(code_of(e) == errc::failed_precondition);
    CHECK((co_await v.read() == initial));
  });
}

TEST_CASE("creating a variable twice on the same ps is already_exists; an unknown one is not_found") {
  local_cluster cluster(1, 1, bind_test_functions);
  cluster.run_chief([](parameter_server_strategy& strategy, cluster_coordinator& coordinator) -> asio::awaitable<void> {
    const xt::xarray<float> one{1}, two{2};
    auto scope = strategy.scope();
    auto v = co_await scope.create_variable("dup", one);
    auto e = co_await failure_of(scope.create_variable("dup", two));
    CHECK(code_of(e) == errc::already_exists);
    CHECK_THROWS_WITH(std::rethrow_exception(e), doctest::Contains("variable 'dup' already exists on ps:0"));
    CHECK((co_await v.read() == one));
    variable_ref missing = v.ref();
    missing.name = "missing";
    auto read_missing = coordinator.schedule(read_sum, variable<float>(missing, nullptr));
    e = co_await failure_of(read_missing.get());
    CHECK(code_of(e) == errc::not_found);
    CHECK_THROWS_WITH(std::rethrow_exception(e), doctest::Contains("read: variable 'missing' does not exist on ps:0"));
    try {
      std::rethrow_exception(e);
    } catch (const remote_error& r) {
      CHECK(r.origin_task() == "ps:0");  // the ps's failure keeps its origin through the worker
    }
    CHECK_THROWS_AS((void)coordinator.done(), remote_error);
  });
}

TEST_CASE("connecting to a cluster that is not there fails with unavailable, naming the task") {
  cluster_spec spec{{"ps", {"127.0.0.1:1"}}, {"worker", {"127.0.0.1:1"}}};
  strategy_options options;
  options.transport.connect_timeout = std::chrono::milliseconds(200);
  const auto e = pscoro::testing::connect_failure(spec, options);
  CHECK(e.code() == errc::unavailable);
  CHECK(contains(e.what(), "cannot reach ps:0 at 127.0.0.1:1"));
}

TEST_CASE("a coordinator with no slot per worker is refused") {
  asio::io_context io;
  parameter_server_strategy strategy(io.get_executor(),
                                     simple_cluster_resolver(cluster_spec{{"ps", {"p:1"}}, {"worker", {"w:1"}}}));
  coordinator_options options;
  options.closures_per_worker = 0;
  CHECK_THROWS_WITH_AS(cluster_coordinator(strategy, options),
                       "coordinator_options::closures_per_worker must be at least 1", error);
}

TEST_CASE("the strategy validates its cluster like TF") {
  asio::io_context io;
  CHECK_THROWS_WITH_AS(parameter_server_strategy(io.get_executor(), simple_cluster_resolver(cluster_spec{{"worker", {"w:1"}}})),
                       "There must be at least one ps.", error);
  // The cluster is checked first, whoever runs the strategy (TF's order).
  CHECK_THROWS_WITH_AS(parameter_server_strategy(io.get_executor(),
                                                 simple_cluster_resolver(cluster_spec{{"worker", {"w:1"}}}, "worker", 0)),
                       "There must be at least one ps.", error);
  CHECK_THROWS_WITH_AS(parameter_server_strategy(io.get_executor(),
                                                 simple_cluster_resolver(cluster_spec{{"ps", {"p:1"}}}, "ps", 0)),
                       "There must be at least one worker.", error);
  CHECK_THROWS_WITH_AS(parameter_server_strategy(io.get_executor(),
                                                 simple_cluster_resolver(cluster_spec{{"ps", {"p:1"}}, {"worker", {"w:1"}}}, "worker", 0)),
                       doctest::Contains("coordinator runs as the 'chief' task"), error);
  // Kubeflow's TFJob has an Evaluator replica: the same program run there must not become a chief.
  CHECK_THROWS_WITH_AS(parameter_server_strategy(io.get_executor(),
                                                 simple_cluster_resolver(cluster_spec{{"ps", {"p:1"}}, {"worker", {"w:1"}}}, "evaluator", 0)),
                       doctest::Contains("the coordinator runs as the 'chief' task, not 'evaluator': an evaluator is a "
                                         "side job"),
                       error);
}

TEST_CASE("a second cluster_coordinator takes the first one's options; different ones are refused, naming both") {
  release_holds = false;
  local_cluster cluster(1, 1, bind_test_functions);
  coordinator_options options;
  options.closures_per_worker = 1;
  options.max_queued_closures = 1;
  cluster.run_chief(
      [options](parameter_server_strategy& strategy, cluster_coordinator&) -> asio::awaitable<void> {
        cluster_coordinator second(strategy);  // shares the first one's: one slot, one place in the queue
        auto held = second.schedule(hold);
        auto queued = second.schedule(add_one, 1);
        std::error_code full;
        try {
          (void)second.schedule(add_one, 2);
        } catch (const error& e) {
          full = e.code();
        }
        CHECK_MESSAGE(full == errc::resource_exhausted, "the second coordinator reset the options to the defaults");
        cluster_coordinator same(strategy, options);  // the same options: fine
        coordinator_options other = options;
        other.watchdog_timeout = std::chrono::seconds(5);
        std::string refusal;
        try {
          cluster_coordinator different(strategy, other);
        } catch (const error& e) {
          CHECK(e.code() == errc::invalid_argument);
          refusal = e.what();
        }
        CHECK_MESSAGE(contains(refusal, "already has a cluster_coordinator"), refusal);
        CHECK_MESSAGE(contains(refusal, "watchdog_timeout 0ms"), refusal);     // the shared ones
        CHECK_MESSAGE(contains(refusal, "watchdog_timeout 5000ms"), refusal);  // the ones given
        release_holds = true;
        co_await second.join();
        CHECK(co_await queued.get() == 2);
      },
      options);
}

TEST_CASE("closures of a lost worker run again on the other worker") {
  release_holds = false;
  local_cluster cluster(1, 2, bind_test_functions);
  coordinator_options options;
  options.closures_per_worker = 2;
  cluster.run_chief(
      [&cluster](parameter_server_strategy&, cluster_coordinator& coordinator) -> asio::awaitable<void> {
        std::vector<remote_value<void>> held;
        for (int i = 0; i < 4; ++i) held.push_back(coordinator.schedule(hold));  // two on each worker
        cluster.on_task("worker", 1, [&cluster] { cluster.task("worker", 1).stop(); });
        release_holds = true;
        co_await coordinator.join();  // no error: worker 1's closures ran again on worker 0
        for (auto& h : held) CHECK(h.status() == remote_status::ready);
        for (int i = 0; i < 8; ++i) CHECK(co_await coordinator.schedule(whoami).get() == "worker:0");
      },
      options);
}

TEST_CASE("losing every worker for the recovery timeout is reported as unavailable") {
  for (const auto timeout : {std::chrono::milliseconds(0), std::chrono::milliseconds(200)}) {
    CAPTURE(timeout.count());
    release_holds = false;
    local_cluster cluster(1, 1, bind_test_functions);
    coordinator_options options;
    options.worker_recovery_timeout = timeout;
    options.worker_probe_interval = std::chrono::milliseconds(20);
    cluster.run_chief(
        [&cluster](parameter_server_strategy&, cluster_coordinator& coordinator) -> asio::awaitable<void> {
          auto held = coordinator.schedule(hold);
          cluster.on_task("worker", 0, [&cluster] { cluster.task("worker", 0).stop(); });
          auto e = co_await failure_of(coordinator.join());
          release_holds = true;
          REQUIRE(e);
          CHECK(code_of(e) == errc::unavailable);
          CHECK(contains(message_of(e), "every worker is lost and none came back within"));
          CHECK(held.status() == remote_status::cancelled);
        },
        options);
  }
}

TEST_CASE("a full queue refuses schedule on the executor and admits wait_and_schedule when room frees") {
  release_holds = false;
  local_cluster cluster(1, 1, bind_test_functions);
  coordinator_options options;
  options.closures_per_worker = 1;
  options.max_queued_closures = 3;
  cluster.run_chief(
      [](parameter_server_strategy&, cluster_coordinator& coordinator) -> asio::awaitable<void> {
        auto held = coordinator.schedule(hold);  // takes the only slot
        std::vector<remote_value<std::int64_t>> queued;
        for (int i = 0; i < 3; ++i) queued.push_back(coordinator.schedule(add_one, i));
        try {
          coordinator.schedule(add_one, 3);
          FAIL("a fourth closure was queued");
        } catch (const error& e) {
          CHECK(e.code() == errc::resource_exhausted);
          CHECK(contains(e.what(), "co_await wait_and_schedule()"));
        }
        release_holds = true;  // the queue drains, so the wait below ends
        auto later = co_await coordinator.wait_and_schedule(add_one, 41);
        co_await coordinator.join();
        CHECK(co_await later.get() == 42);
        CHECK(co_await queued[2].get() == 3);
        CHECK(held.status() == remote_status::ready);
      },
      options);
}

TEST_CASE("a producer waiting for room gets the pending error") {
  release_holds = false;
  local_cluster cluster(1, 1, bind_test_functions);
  coordinator_options options;
  options.closures_per_worker = 2;
  options.max_queued_closures = 2;
  cluster.run_chief(
      [](parameter_server_strategy&, cluster_coordinator& coordinator) -> asio::awaitable<void> {
        auto held = coordinator.schedule(hold);                          // slot 1, held until the end
        auto failing = coordinator.schedule(fail, std::string("boom"));  // slot 2, fails
        auto first = coordinator.schedule(add_one, 1);                   // queued
        auto second = coordinator.schedule(add_one, 2);                  // queued: the queue is full
        // The failure stops new closures, so the queue cannot drain: the waiting producer reports it.
        auto e = co_await failure_of(coordinator.wait_and_schedule(add_one, 3));
        REQUIRE(e);
        CHECK(code_of(e) == errc::unknown);
        CHECK(failing.status() == remote_status::error);
        CHECK(first.status() == remote_status::cancelled);
        CHECK(second.status() == remote_status::cancelled);
        CHECK(held.status() == remote_status::cancelled);  // running when the error came
        co_await coordinator.join();  // reported once: nothing left to report
        release_holds = true;
      },
      options);
}

TEST_CASE("schedule from a plain thread waits for room in a full queue") {
  release_holds = false;
  local_cluster cluster(1, 1, bind_test_functions);
  pscoro::testing::threaded_chief chief(cluster.spec);
  coordinator_options options;
  options.closures_per_worker = 1;
  options.max_queued_closures = 2;
  cluster_coordinator coordinator(chief.strategy, options);
  coordinator.schedule(hold);
  coordinator.schedule(add_one, 0);
  coordinator.schedule(add_one, 1);  // full now
  std::optional<remote_value<std::int64_t>> late;
  std::thread producer([&] { late = coordinator.schedule(add_one, 99); });  // waits for room
  release_holds = true;
  producer.join();
  CHECK(late->fetch() == 100);
  coordinator.async_join(asio::use_future).get();
}

namespace {

// A train step's {loss, accuracy} and per-class counts, as a worker function returns them.
const worker_function<std::tuple<double, double, std::map<std::string, std::int64_t>>(
    std::vector<std::int64_t>, std::optional<std::string>)>
    summarize{"test.summarize"};

}  // namespace

TEST_CASE("worker functions take and return tuples, vectors, maps and optionals; fetch takes a tuple") {
  local_cluster cluster(1, 2, [](server& s) {
    s.bind(summarize, [](std::vector<std::int64_t> labels, std::optional<std::string> tag)
                          -> asio::awaitable<std::tuple<double, double, std::map<std::string, std::int64_t>>> {
      std::map<std::string, std::int64_t> counts;
      for (const auto label : labels) ++counts[tag.value_or("class") + std::to_string(label)];
      co_return std::tuple{0.5 * static_cast<double>(labels.size()), 0.75, counts};
    });
  });
  cluster.run_chief([](parameter_server_strategy&, cluster_coordinator& coordinator) -> asio::awaitable<void> {
    auto tagged = coordinator.schedule(summarize, std::vector<std::int64_t>{1, 2, 2}, std::optional<std::string>{"c"});
    auto untagged = coordinator.schedule(summarize, std::vector<std::int64_t>{}, std::optional<std::string>{});
    auto both = std::tuple{tagged, untagged};  // named: g++ 12 (temporaries)
    const auto [first, second] = co_await cluster_coordinator::fetch(std::move(both));
    const auto& [loss, accuracy, counts] = first;
    CHECK(loss == 1.5);
    CHECK(accuracy == 0.75);
    CHECK(counts == std::map<std::string, std::int64_t>{{"c1", 1}, {"c2", 2}});
    CHECK(std::get<0>(second) == 0.0);
    CHECK(std::get<2>(second).empty());
  });
}

TEST_CASE("closing the strategy cancels the closures still queued") {
  release_holds = false;
  local_cluster cluster(1, 1, bind_test_functions);
  coordinator_options options;
  options.closures_per_worker = 1;
  cluster.run_chief(
      [](parameter_server_strategy& strategy, cluster_coordinator& coordinator) -> asio::awaitable<void> {
        auto held = coordinator.schedule(hold);
        auto queued = coordinator.schedule(add_one, 1);
        strategy.close();
        release_holds = true;
        auto e = co_await failure_of(queued.get());
        CHECK(code_of(e) == errc::cancelled);
        e = co_await failure_of(held.get());  // its connection closed under it
        CHECK(code_of(e) == errc::cancelled);
      },
      options);
}

namespace {

// Counts the servers that stopped because the chief ended the job, with the codes they heard.
struct shutdowns {
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<int> codes;

  server_options options() {
    server_options o;
    o.on_shutdown = [this](int code) {
      const std::lock_guard lock(mutex);
      codes.push_back(code);
      changed.notify_all();
    };
    return o;
  }
  // The codes once `count` servers have stopped; a guard of a minute against a hang, not a margin.
  std::vector<int> wait_for(std::size_t count) {
    std::unique_lock lock(mutex);
    const bool all = changed.wait_for(lock, std::chrono::seconds(60), [&] { return codes.size() >= count; });
    REQUIRE_MESSAGE(all, codes.size(), " of ", count, " servers stopped within a minute of the chief's close()");
    return codes;
  }
};

}  // namespace

namespace {

// Heartbeats fast enough for a test; detection time is never asserted, only that it happens.
strategy_options fast_heartbeats() {
  strategy_options options;
  options.transport.heartbeat_interval = std::chrono::milliseconds(20);
  options.transport.heartbeat_timeout = std::chrono::milliseconds(300);
  return options;
}

// Blocks a task's executor, as SIGSTOP would, until release() or destruction (which must come
// before the cluster's: declare it after the cluster).
class hang {
 public:
  void start(local_cluster& cluster, const std::string& job, int index) {
    cluster.post_to_task(job, index, [wait = release_.get_future().share()] { wait.wait(); });
    started_ = true;
  }
  ~hang() { release(); }
  void release() {
    if (started_ && !released_) release_.set_value();
    released_ = true;
  }

 private:
  std::promise<void> release_;
  bool started_ = false, released_ = false;
};

// Polls done() until it raises (a loss is noticed in the background), up to a minute.
asio::awaitable<std::exception_ptr> until_done_raises(cluster_coordinator& coordinator) {
  asio::steady_timer timer(co_await asio::this_coro::executor);
  for (int i = 0; i < 6000; ++i) {
    try {
      (void)coordinator.done();
    } catch (...) {
      co_return std::current_exception();
    }
    timer.expires_after(std::chrono::milliseconds(10));
    co_await timer.async_wait(asio::use_awaitable);
  }
  co_return nullptr;
}

}  // namespace

TEST_CASE("a hung worker is noticed by heartbeats and its closures run on the other worker") {
  local_cluster cluster(1, 2, bind_test_functions);
  hang hung;
  cluster.run_chief(
      [&](parameter_server_strategy&, cluster_coordinator& coordinator) -> asio::awaitable<void> {
        hung.start(cluster, "worker", 1);  // after connecting
        std::vector<remote_value<std::int64_t>> results;
        for (int i = 0; i < 40; ++i) results.push_back(coordinator.schedule(add_one, i));
        co_await coordinator.join();  // no error: what worker 1 held ran again on worker 0
        for (int i = 0; i < 40; ++i) CHECK(co_await results[static_cast<std::size_t>(i)].get() == i + 1);
        for (int i = 0; i < 4; ++i) CHECK(co_await coordinator.schedule(whoami).get() == "worker:0");
      },
      {}, fast_heartbeats());
}

TEST_CASE("a worker the chief lost but that still runs is told that the job ended too") {
  shutdowns stopped;
  local_cluster cluster(1, 2, bind_test_functions, stopped.options());
  cluster.keep_servers = false;
  hang hung;
  coordinator_options options;
  options.worker_probe_interval = std::chrono::hours(1);  // the chief does not bring it back itself
  cluster.run_chief(
      [&](parameter_server_strategy&, cluster_coordinator& coordinator) -> asio::awaitable<void> {
        hung.start(cluster, "worker", 1);
        std::vector<remote_value<std::int64_t>> results;
        for (int i = 0; i < 40; ++i) results.push_back(coordinator.schedule(add_one, i));
        co_await coordinator.join();  // worker 1 held some: they ran again once it was lost
        hung.release();               // it runs again, unknown to the chief
      },  // run_chief's close() ends the job
      options, fast_heartbeats());
  CHECK(stopped.wait_for(3) == std::vector<int>{0, 0, 0});
}

TEST_CASE("a lost ps is raised by done, join and every later schedule, naming the ps, even while idle") {
  for (const bool hung : {false, true}) {
    CAPTURE(hung);
    local_cluster cluster(2, 1, bind_test_functions);
    hang stopped;
    cluster.run_chief(
        [&](parameter_server_strategy& strategy, cluster_coordinator& coordinator) -> asio::awaitable<void> {
          const xt::xarray<float> zeros = xt::zeros<float>({4});
          auto on_ps0 = co_await strategy.scope().create_variable("a", zeros);
          auto on_ps1 = co_await strategy.scope().create_variable("b", zeros);
          REQUIRE(on_ps1.ps_task() == 1);
          co_await coordinator.join();  // idle from here on
          if (hung) {
            stopped.start(cluster, "ps", 1);
          } else {
            cluster.on_task("ps", 1, [&cluster] { cluster.task("ps", 1).stop(); });
          }
          auto e = co_await until_done_raises(coordinator);
          REQUIRE(e);
          CHECK(code_of(e) == errc::unavailable);
          CHECK(contains(message_of(e), "parameter server ps:1 is unavailable"));
          try {
            std::rethrow_exception(e);
          } catch (const remote_error& r) {
            CHECK(r.origin_task() == "ps:1");
          }
          // Every later schedule says so too, and a read of a variable there fails at once.
          for (int i = 0; i < 2; ++i) {
            try {
              coordinator.schedule(add_one, 1);
              FAIL("schedule after a ps loss");
            } catch (const error& later) {
              CHECK(later.code() == errc::unavailable);
              CHECK(contains(later.what(), "ps:1"));
            }
          }
          auto read_failure = co_await failure_of(on_ps1.read());
          REQUIRE(read_failure);
          CHECK(code_of(read_failure) == errc::unavailable);
          CHECK(co_await on_ps0.read() == zeros);  // the other ps still serves
        },
        {}, fast_heartbeats());
  }
}

TEST_CASE("a restarted chief starts a new session: the old one's variables are gone and its closures cannot touch the new ones") {
  local_cluster cluster(1, 1, bind_test_functions);
  release_holds = false;
  held_bump_started = false;
  held_bump_outcome = -1;
  const xt::xarray<float> zeros = xt::zeros<float>({4});
  // The first chief leaves a closure running on the worker, as a chief killed mid-step does.
  cluster.run_chief([&](parameter_server_strategy& strategy, cluster_coordinator& coordinator) -> asio::awaitable<void> {
    auto v = co_await strategy.scope().create_variable("v", zeros);
    (void)coordinator.schedule(hold_then_bump, v);
    co_await poll_until([] { return held_bump_started.load(); });
  });
  cluster.run_chief([&](parameter_server_strategy& strategy, cluster_coordinator& coordinator) -> asio::awaitable<void> {
    auto v = co_await strategy.scope().create_variable("v", zeros);  // the old "v" was released
    CHECK(co_await coordinator.schedule(bump, v, 2.0).get() == 8.0);
    release_holds = true;  // the old closure goes on now, with the new session's "v" in place
    co_await poll_until([] { return held_bump_outcome != -1; });
    // Its session ended, which cancelled it: its next operation throws (and the ps would refuse it).
    CHECK(held_bump_outcome == static_cast<int>(errc::cancelled));
    CHECK(co_await v.read() == xt::xarray<float>(zeros + 2.0f));
  });
}

TEST_CASE("closures running when a ps is lost resolve with its error at once, and join does not wait for them") {
  local_cluster cluster(2, 1, bind_test_functions);
  release_holds = false;
  cluster.run_chief(
      [&](parameter_server_strategy& strategy, cluster_coordinator& coordinator) -> asio::awaitable<void> {
        const xt::xarray<float> zeros = xt::zeros<float>({4});
        (void)co_await strategy.scope().create_variable("a", zeros);
        (void)co_await strategy.scope().create_variable("b", zeros);  // on ps:1
        auto held = coordinator.schedule(hold);  // its worker would run it until release_holds
        cluster.on_task("ps", 1, [&cluster] { cluster.task("ps", 1).stop(); });
        auto e = co_await failure_of(held.get());
        REQUIRE(e);
        CHECK(code_of(e) == errc::unavailable);
        CHECK(contains(message_of(e), "parameter server ps:1 is unavailable"));
        auto joined = co_await failure_of(coordinator.join());
        REQUIRE(joined);
        CHECK(contains(message_of(joined), "ps:1"));
        release_holds = true;
      },
      {}, fast_heartbeats());
}

TEST_CASE("workers that cannot reach a ps past the tolerance fail the run as the lost ps, once the chief sees it gone") {
  // A hung ps: workers report it at once, the chief's own heartbeats only after their timeout. The
  // run still ends with the one error of a lost ps, not with whichever report came first.
  local_cluster cluster(1, 1, bind_test_functions);
  hang stopped;
  coordinator_options options;
  options.transient_ps_failures = 0;  // the first closure that cannot reach a ps is past the tolerance
  cluster.run_chief(
      [&](parameter_server_strategy&, cluster_coordinator& coordinator) -> asio::awaitable<void> {
        stopped.start(cluster, "ps", 0);
        failures_left = 1;  // reach_ps reports ps:0 unreachable
        auto e = co_await failure_of(coordinator.schedule(reach_ps).get());
        REQUIRE(e);
        CHECK(code_of(e) == errc::unavailable);
        CHECK(contains(message_of(e), "parameter server ps:0 is unavailable"));
        CHECK(contains(message_of(e), "heartbeat timeout"));
        auto joined = co_await failure_of(coordinator.join());
        REQUIRE(joined);
        CHECK(contains(message_of(joined), "parameter server ps:0 is unavailable"));
        stopped.release();
      },
      options, fast_heartbeats());
}

namespace {

// Sends this process's stderr (where log lines go) to a file until destroyed.
class captured_stderr {
 public:
  captured_stderr() : path_(std::filesystem::temp_directory_path() / ("pscoro-stderr-" + std::to_string(::getpid()))) {
    std::fflush(stderr);
    saved_ = ::dup(STDERR_FILENO);
    const int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    REQUIRE(fd >= 0);
    ::dup2(fd, STDERR_FILENO);
    ::close(fd);
  }
  ~captured_stderr() {
    std::fflush(stderr);
    ::dup2(saved_, STDERR_FILENO);
    ::close(saved_);
    std::filesystem::remove(path_);
  }
  std::string text() const {
    std::fflush(stderr);
    std::ifstream in(path_);
    return {std::istreambuf_iterator<char>(in), {}};
  }

 private:
  std::filesystem::path path_;
  int saved_ = -1;
};

}  // namespace

TEST_CASE("the watchdog logs what every worker runs when no closure finishes for its timeout") {
  for (const bool from_environment : {false, true}) {
    CAPTURE(from_environment);
    local_cluster cluster(1, 2, bind_test_functions);
    release_holds = false;
    coordinator_options options;
    options.closures_per_worker = 1;
    options.worker_probe_interval = std::chrono::milliseconds(20);
    if (from_environment) {
      ::setenv("TF_CLUSTER_COORDINATOR_WATCH_DOG_TIMEOUT", "0.2", 1);  // seconds, as TF reads it
    } else {
      options.watchdog_timeout = std::chrono::milliseconds(200);
    }
    captured_stderr log;
    std::string text;
    cluster.run_chief(
        [&](parameter_server_strategy&, cluster_coordinator& coordinator) -> asio::awaitable<void> {
          auto first = coordinator.schedule(hold);
          auto second = coordinator.schedule(hold);
          auto third = coordinator.schedule(add_one, 1);  // queued behind them
          asio::steady_timer timer(co_await asio::this_coro::executor);
          for (int i = 0; i < 6000 && !contains(text, "watchdog: worker:1"); ++i) {
            timer.expires_after(std::chrono::milliseconds(10));
            co_await timer.async_wait(asio::use_awaitable);
            text = log.text();
          }
          release_holds = true;
          co_await coordinator.join();
          CHECK(co_await third.get() == 2);
        },
        options);
    ::unsetenv("TF_CLUSTER_COORDINATOR_WATCH_DOG_TIMEOUT");
    CHECK(contains(text, "watchdog: no closure finished for 200ms (coordinator_options::watchdog_timeout): "
                         "1 queued, 2 running"));
    CHECK(contains(text, "watchdog: worker:0 (alive): 'test.hold' for "));
    CHECK(contains(text, "watchdog: worker:1 (alive): 'test.hold' for "));
  }
}


TEST_CASE("closing the strategy ends the job: every ps and worker stops with the chief's exit code") {
  shutdowns stopped;
  local_cluster cluster(2, 2, bind_test_functions, stopped.options());
  cluster.keep_servers = false;
  captured_stderr log;
  int result = 0;
  cluster.run_chief([&](parameter_server_strategy& strategy,
                        cluster_coordinator& coordinator) -> asio::awaitable<void> {
    result = co_await coordinator.schedule(add_one, 1).get();
    strategy.close(3);  // run_chief's own close() afterwards changes nothing
  });
  CHECK(result == 2);
  CHECK(stopped.wait_for(4) == std::vector<int>{3, 3, 3, 3});
  CHECK(contains(log.text(), "the job ends: telling 4 task(s) to exit with code 3"));
  // Nobody listens any more: a new chief cannot connect.
  strategy_options quick;
  quick.transport.connect_timeout = std::chrono::milliseconds(200);
  const auto e = pscoro::testing::connect_failure(cluster.spec, quick);
  CHECK(e.code() == errc::unavailable);
  CHECK(contains(e.what(), "cannot reach ps:0"));
}

TEST_CASE("with keep_servers (or PSCORO_KEEP_SERVERS=1) the servers outlive the chief, for a next one") {
  shutdowns stopped;
  local_cluster cluster(1, 1, bind_test_functions, stopped.options());
  cluster.keep_servers = false;
  strategy_options keep;
  keep.keep_servers = true;
  auto add = [](int x, int& out) {
    return [x, &out](parameter_server_strategy&, cluster_coordinator& coordinator) -> asio::awaitable<void> {
      out = co_await coordinator.schedule(add_one, x).get();
    };
  };
  int first = 0, second = 0, third = 0;
  cluster.run_chief(add(1, first), {}, keep);
  ::setenv("PSCORO_KEEP_SERVERS", "1", 1);
  cluster.run_chief(add(2, second));
  ::setenv("PSCORO_KEEP_SERVERS", "perhaps", 1);
  asio::io_context io;
  CHECK_THROWS_WITH_AS(parameter_server_strategy(io.get_executor(), simple_cluster_resolver(cluster.spec)),
                       "PSCORO_KEEP_SERVERS is 'perhaps': use 1 (the servers keep serving when the chief closes) or 0",
                       error);
  ::unsetenv("PSCORO_KEEP_SERVERS");
  cluster.run_chief(add(3, third));  // a next chief: the servers served on; this one ends the job
  CHECK(first == 2);
  CHECK(second == 3);
  CHECK(third == 4);
  CHECK(stopped.wait_for(2) == std::vector<int>{0, 0});
}

TEST_CASE("while a task cannot be reached yet, the chief says every few seconds which task it waits for") {
  local_cluster cluster(1, 1, bind_test_functions);
  const auto ps_address = cluster.spec.task_address("ps", 0);
  cluster.stop("ps", 0);  // a ps whose process has not started yet
  captured_stderr log;
  // The ps starts once the chief has said it waits for it: no assumption about how long anything takes.
  std::atomic<bool> chief_done{false};
  std::thread starter([&] {
    while (!chief_done && !contains(log.text(), "still waiting for")) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    cluster.restart("ps", 0);
  });
  int result = 0;
  try {
    cluster.run_chief([&](parameter_server_strategy&, cluster_coordinator& coordinator) -> asio::awaitable<void> {
      result = co_await coordinator.schedule(add_one, 1).get();
    });
  } catch (...) {
    chief_done = true;
    starter.join();
    throw;
  }
  chief_done = true;
  starter.join();
  const auto text = log.text();
  CHECK(result == 2);
  CHECK(contains(text, "still waiting for ps:0 at " + ps_address + " after "));
  CHECK(contains(text, " s (0 of 2 tasks connected; the chief gives up on a task after 180 s, "
                       "transport_options::connect_timeout)"));
  CHECK(contains(text, "connected to 1 ps and 1 workers"));
}

TEST_CASE("the watchdog stays quiet while the coordinator is idle") {
  local_cluster cluster(1, 1, bind_test_functions);
  coordinator_options options;
  options.watchdog_timeout = std::chrono::milliseconds(20);
  options.worker_probe_interval = std::chrono::milliseconds(5);
  captured_stderr log;
  std::string idle_text;
  cluster.run_chief(
      [&](parameter_server_strategy&, cluster_coordinator& coordinator) -> asio::awaitable<void> {
        CHECK(co_await coordinator.schedule(add_one, 1).get() == 2);
        co_await coordinator.join();
        const auto before = log.text().size();  // the closure may have been slow: only what follows counts
        asio::steady_timer timer(co_await asio::this_coro::executor, std::chrono::milliseconds(200));
        co_await timer.async_wait(asio::use_awaitable);
        idle_text = log.text().substr(before);
      },
      options);
  CHECK(!contains(idle_text, "watchdog"));
}

TEST_CASE("a worker that comes back at another address announces itself, and takes closures there") {
  local_cluster cluster(1, 2, bind_test_functions);
  cluster.chief_address = "127.0.0.1:0";  // the chief listens for announcements on a free port
  coordinator_options options;
  options.worker_probe_interval = std::chrono::milliseconds(20);
  cluster.run_chief(
      [&](parameter_server_strategy& strategy, cluster_coordinator& coordinator) -> asio::awaitable<void> {
        const auto chief = strategy.address();
        REQUIRE(starts_with(chief, "127.0.0.1:"));
        const auto old_address = cluster.spec.task_address("worker", 1);
        cluster.restart_elsewhere("worker", 1, chief);
        // Until it is back, closures run on worker 0; then on both. The old address has nothing
        // listening: only the announcement can bring worker 1 back.
        bool back = false;
        for (int round = 0; round < 3000 && !back; ++round) {
          std::vector<remote_value<std::string>> who;
          for (int i = 0; i < 8; ++i) who.push_back(coordinator.schedule(whoami));
          for (auto& w : who) back = back || co_await w.get() == "worker:1";
        }
        CHECK(back);
        CHECK(cluster.task("worker", 1).address() != old_address);
        co_await coordinator.join();
      },
      options);
}

TEST_CASE("the chief refuses announcements it cannot use, naming why") {
  local_cluster cluster(1, 1, bind_test_functions);
  cluster.chief_address = "127.0.0.1:0";
  cluster.run_chief([&](parameter_server_strategy& strategy, cluster_coordinator&) -> asio::awaitable<void> {
    auto refusal = [&](std::string job, int index, std::string address) -> asio::awaitable<std::string> {
      auto hello = net::make_hello({std::move(job), index, 0}, 0);
      hello.set_address(std::move(address));
      const transport_options options;  // named: g++ 12 destroys a co_await's temporaries early
      try {
        auto c = co_await net::connect_to_task("chief:0", strategy.address(), hello, options);
        c->close("done");
      } catch (const error& e) {
        co_return e.what();
      }
      co_return "";
    };
    // A worker the chief does not have asks to join, and admission is off.
    CHECK(contains(co_await refusal("worker", 1, "127.0.0.1:1"),
                   "worker:1 at 127.0.0.1:1 is not one of this job's workers (the cluster spec has workers 0..0), and "
                   "the job admits no worker beyond its cluster spec (coordinator_options::max_elastic_workers is 0)"));
    CHECK(contains(co_await refusal("worker", 0, "nowhere"), "address 'nowhere' of worker:0 is not host:port"));
    CHECK(contains(co_await refusal("worker", 0, ""), "without an address"));
    CHECK(contains(co_await refusal("ps", 0, "127.0.0.1:1"), "hears only workers announcing their address"));
  });
}

namespace {

// Elastic admission: a resource that says which worker index it was built for, of how many, and a
// function that returns the worker it runs on (its task now) with that resource.
const resource_function<std::string> placement{"test.placement"};
const worker_function<std::string(per_worker_resource<std::string>)> where{"test.where"};

void bind_elastic(server& s) {
  bind_test_functions(s);
  s.bind(placement, [](input_context context) {
    return std::to_string(context.worker_index) + "/" + std::to_string(context.num_workers);
  });
  s.bind(where, [&s](per_worker_resource<std::string> built) -> asio::awaitable<std::string> {
    co_return s.task() + " " + *built;
  });
}

// A worker the cluster spec does not list, in this process on a thread of its own: its spec names
// only the chief (at `chief`) and the ps; it listens on 127.0.0.1, port 0.
struct unlisted_worker {
  unlisted_worker(const cluster_spec& cluster, const std::string& chief) {
    cluster_spec spec;
    for (const int i : cluster.task_indices("ps")) spec.add_task("ps", i, cluster.task_address("ps", i));
    spec.add_task("chief", 0, chief);
    server_options options;
    options.listen_address = "127.0.0.1:0";
    options.on_shutdown = [this](int code) { exit_code = code; };
    srv = std::make_unique<server>(io.get_executor(), simple_cluster_resolver(spec, "worker", std::nullopt), options);
    bind_elastic(*srv);
    srv->start();
    thread = std::thread([this] { io.run(); });
  }
  ~unlisted_worker() {
    asio::post(io, [this] {
      srv->stop();
      io.stop();
    });
    thread.join();
  }
  asio::io_context io;
  asio::executor_work_guard<asio::io_context::executor_type> keep_running = asio::make_work_guard(io);
  std::unique_ptr<server> srv;
  std::atomic<int> exit_code{-1};  // what on_shutdown was told: 1 when the chief refused it
  std::thread thread;
};

}  // namespace

TEST_CASE("an unlisted worker is admitted as the next worker, gets its per-worker values, then closures; one past the cap is refused and stops") {
  local_cluster cluster(1, 1, bind_elastic);
  cluster.chief_address = "127.0.0.1:0";
  cluster.run_chief(
      [&](parameter_server_strategy& strategy, cluster_coordinator& coordinator) -> asio::awaitable<void> {
        auto built = co_await coordinator.create_per_worker_resource(placement);
        CHECK(co_await coordinator.schedule(where, built).get() == "worker:0 0/1");
        unlisted_worker joining(cluster.spec, strategy.address());
        CHECK(joining.srv->task() == "worker:unlisted");
        // Closures run on worker 0 until the admitted worker takes some, its resource made first
        // (for index 1 of 2 workers).
        std::string seen;
        for (const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
             !seen.starts_with("worker:1") && std::chrono::steady_clock::now() < until;) {
          seen = co_await coordinator.schedule(where, built).get();
        }
        CHECK(seen == "worker:1 1/2");
        CHECK(strategy.num_workers() == 2);
        // One past the cap is told why and stops.
        unlisted_worker refused(cluster.spec, strategy.address());
        asio::steady_timer timer(co_await asio::this_coro::executor);
        for (const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
             refused.exit_code == -1 && std::chrono::steady_clock::now() < until;) {
          timer.expires_after(std::chrono::milliseconds(1));
          co_await timer.async_wait(asio::use_awaitable);
        }
        CHECK(refused.exit_code == 1);
        CHECK(strategy.num_workers() == 2);
        // Drained, the admitted worker no longer counts against the cap: another is admitted.
        co_await coordinator.drain(1);
        unlisted_worker next(cluster.spec, strategy.address());
        for (const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
             !seen.starts_with("worker:2") && std::chrono::steady_clock::now() < until;) {
          seen = co_await coordinator.schedule(where, built).get();
        }
        CHECK(seen == "worker:2 2/3");
        CHECK(coordinator.metrics().worker_failures == 0);
        co_await coordinator.join();
      },
      coordinator_options{.max_elastic_workers = 1});
}

TEST_CASE("an unlisted worker needs the chief's address and an address of its own the chief can dial, or it does not start") {
  asio::io_context io;
  cluster_spec with_chief;
  with_chief.add_task("chief", 0, "127.0.0.1:4000");
  with_chief.add_task("ps", 0, "127.0.0.1:4001");
  cluster_spec without_chief;
  without_chief.add_task("ps", 0, "127.0.0.1:4001");
  const auto failure = [&](const cluster_spec& spec, std::string listen) {
    server_options options;
    options.listen_address = std::move(listen);
    return error_thrown_by([&] { server s(io.get_executor(), simple_cluster_resolver(spec, "worker", std::nullopt), options); });
  };
  const auto no_address = failure(with_chief, "");
  CHECK(no_address.code() == errc::invalid_argument);
  CHECK(contains(no_address.what(), "needs an address to listen on and announce"));
  CHECK(contains(failure(without_chief, "127.0.0.1:0").what(), "the cluster spec must give the chief's address"));
  CHECK(contains(failure(with_chief, "0.0.0.0:0").what(), "0.0.0.0:0 is every interface, which the chief cannot dial"));
  // An index the spec lacks is no index: the same rules.
  server_options listening;
  listening.listen_address = "127.0.0.1:0";
  server listed_elsewhere(io.get_executor(), simple_cluster_resolver(with_chief, "worker", 7), listening);
  CHECK(listed_elsewhere.task() == "worker:unlisted");
}

TEST_CASE("an unlisted worker announcing itself while an admitted worker is lost takes that index back, within the cap") {
  local_cluster cluster(1, 1, bind_elastic);
  cluster.chief_address = "127.0.0.1:0";
  cluster.run_chief(
      [&](parameter_server_strategy& strategy, cluster_coordinator& coordinator) -> asio::awaitable<void> {
        auto built = co_await coordinator.create_per_worker_resource(placement);
        auto first = std::make_unique<unlisted_worker>(cluster.spec, strategy.address());
        std::string seen;
        for (const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
             !seen.starts_with("worker:1") && std::chrono::steady_clock::now() < until;) {
          seen = co_await coordinator.schedule(where, built).get();
        }
        REQUIRE(seen == "worker:1 1/2");
        first.reset();  // its process ends: the chief loses worker:1
        asio::steady_timer timer(co_await asio::this_coro::executor);
        for (const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
             coordinator.metrics().worker_failures == 0 && std::chrono::steady_clock::now() < until;) {
          timer.expires_after(std::chrono::milliseconds(1));
          co_await timer.async_wait(asio::use_awaitable);
        }
        REQUIRE(coordinator.metrics().worker_failures == 1);
        // Restarted with no index of its own: it is worker:1 again, not refused at the cap of 1.
        unlisted_worker again(cluster.spec, strategy.address());
        seen.clear();
        for (const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
             !seen.starts_with("worker:1") && again.exit_code == -1 && std::chrono::steady_clock::now() < until;) {
          seen = co_await coordinator.schedule(where, built).get();
        }
        CHECK(seen == "worker:1 1/2");  // its resource made again, for the same index
        CHECK(again.exit_code == -1);
        CHECK(strategy.num_workers() == 2);
        co_await coordinator.join();
      },
      coordinator_options{.max_elastic_workers = 1});
}

TEST_CASE("a chief's Hello that admits a worker under another index is refused by a worker that did not ask to be admitted") {
  local_cluster cluster(1, 1, bind_test_functions);  // its workers know no chief address: they never announce
  asio::io_context io;
  auto hello = net::make_hello({"chief", 0, 77}, 77);
  hello.set_admits(true);
  auto dialled = asio::co_spawn(
      io,
      [&]() -> asio::awaitable<std::exception_ptr> {
        const transport_options options;  // named: g++ 12 destroys a co_await's temporaries early
        co_return co_await failure_of(net::connect_to_task("worker:3", cluster.spec.task_address("worker", 0), hello, options));
      },
      asio::use_future);
  io.run();
  const auto refused = dialled.get();
  CHECK_MESSAGE(code_of(refused) == errc::failed_precondition, refused);
  CHECK(contains(message_of(refused), "dialled worker:3 but reached worker:0"));
}

TEST_CASE("a closure that could not reach a ps the chief still reaches runs again, up to TF's threshold") {
  local_cluster cluster(1, 1, bind_test_functions);
  cluster.run_chief([&](parameter_server_strategy&, cluster_coordinator& coordinator) -> asio::awaitable<void> {
    failures_left = 2;  // the 1st and 2nd failure blaming ps:0 are transient
    CHECK(co_await coordinator.schedule(reach_ps).get() == 7);
    co_await coordinator.join();
    CHECK(coordinator.metrics().ps_failures == 2);  // closures that could not reach ps:0
    failures_left = 1;  // the 3rd, ever, is fatal (TF never resets the count)
    auto e = co_await failure_of(coordinator.schedule(reach_ps).get());
    REQUIRE(e);
    CHECK(coordinator.metrics().ps_failures == 3);
    CHECK(code_of(e) == errc::unavailable);
    try {
      std::rethrow_exception(e);
    } catch (const remote_error& r) {
      CHECK(r.origin_task() == "ps:0");
      CHECK(contains(r.remote_message(), "worker function 'test.reach_ps' on worker:0 failed: connection to ps:0"));
    }
    auto joined = co_await failure_of(coordinator.join());
    CHECK(joined);
  });
}

TEST_CASE("with transient_ps_failures 0 (or TF_COORDINATOR_IGNORE_TRANSIENT_PS_FAILURES=0) the first such failure is fatal") {
  for (const bool from_environment : {false, true}) {
    CAPTURE(from_environment);
    local_cluster cluster(1, 1, bind_test_functions);
    coordinator_options options;
    if (from_environment) {
      ::setenv("TF_COORDINATOR_IGNORE_TRANSIENT_PS_FAILURES", "0", 1);
    } else {
      options.transient_ps_failures = 0;
    }
    cluster.run_chief(
        [&](parameter_server_strategy&, cluster_coordinator& coordinator) -> asio::awaitable<void> {
          failures_left = 1;
          auto e = co_await failure_of(coordinator.schedule(reach_ps).get());
          REQUIRE(e);
          CHECK(code_of(e) == errc::unavailable);
          (void)co_await failure_of(coordinator.join());
        },
        options);
    ::unsetenv("TF_COORDINATOR_IGNORE_TRANSIENT_PS_FAILURES");
  }
}

TEST_CASE("a chief that cannot listen for announcements still runs, without them") {
  local_cluster cluster(1, 1, bind_test_functions);
  cluster.chief_address = cluster.spec.task_address("ps", 0);  // taken: ps:0 listens there
  cluster.run_chief([&](parameter_server_strategy& strategy, cluster_coordinator& coordinator) -> asio::awaitable<void> {
    CHECK(strategy.address().empty());
    CHECK(co_await coordinator.schedule(add_one, 41).get() == 42);
  });
}

TEST_CASE("an environment override that is not a number is ignored, and the log says so") {
  local_cluster cluster(1, 1, bind_test_functions);
  ::setenv("TF_CLUSTER_COORDINATOR_WATCH_DOG_TIMEOUT", "soon", 1);
  captured_stderr log;
  cluster.run_chief([&](parameter_server_strategy&, cluster_coordinator& coordinator) -> asio::awaitable<void> {
    CHECK(co_await coordinator.schedule(add_one, 1).get() == 2);
  });
  ::unsetenv("TF_CLUSTER_COORDINATOR_WATCH_DOG_TIMEOUT");
  const auto text = log.text();
  CHECK(contains(text, "TF_CLUSTER_COORDINATOR_WATCH_DOG_TIMEOUT='soon' is not a number; ignored"));
}

// TF's testSimpleMetrics and testInflightClosures (cluster_coordinator_test.py), on this
// coordinator's metrics(): no tracing here (C++ has nothing to trace), the rest as TF checks it.
TEST_CASE("the coordinator's metrics count closures as TF's testSimpleMetrics does") {
  local_cluster cluster(1, 1, bind_test_functions);
  cluster.run_chief([](parameter_server_strategy&, cluster_coordinator& coordinator) -> asio::awaitable<void> {
    auto m = coordinator.metrics();
    CHECK(m.queued_closures == 0);
    CHECK(m.inflight_closures == 0);
    coordinator.schedule(add_one, 1);
    auto result = coordinator.schedule(add_one, 2);
    co_await coordinator.join();
    m = coordinator.metrics();
    CHECK(m.queued_closures == 0);
    CHECK(m.inflight_closures == 0);
    CHECK(m.closure_execution.count == 2);
    CHECK(m.closure_execution.sum_seconds > 0);
    CHECK(m.remote_value_fetch.count == 2);
    CHECK(m.worker_failures == 0);
    CHECK(m.ps_failures == 0);
    CHECK(co_await result.get() == 3);
  });
}

TEST_CASE("closures waiting for a worker are queued, those it runs are in flight, in the metrics and the registry") {
  release_holds = false;
  local_cluster cluster(1, 1, bind_test_functions);
  cluster.run_chief([](parameter_server_strategy&, cluster_coordinator& coordinator) -> asio::awaitable<void> {
    const auto slots = static_cast<std::int64_t>(coordinator_options{}.closures_per_worker);
    for (std::int64_t i = 0; i < slots + 2; ++i) coordinator.schedule(hold);
    // Handed out as they are scheduled: the worker's slots fill, the rest waits.
    auto m = coordinator.metrics();
    CHECK(m.inflight_closures == slots);
    CHECK(m.queued_closures == 2);
    const auto& r = metrics::process_registry();
    CHECK(r.value("pscoro_coordinator_inflight_closures") == static_cast<double>(slots));
    CHECK(r.value("pscoro_coordinator_queued_closures") == 2.0);
    release_holds = true;
    co_await coordinator.join();
    m = coordinator.metrics();
    CHECK(m.inflight_closures == 0);
    CHECK(m.queued_closures == 0);
    CHECK(m.closure_execution.count == static_cast<std::uint64_t>(slots + 2));
  });
}

TEST_CASE("parameter-server operations and traffic with each peer are counted in the process registry") {
  local_cluster cluster(1, 1, bind_test_functions);
  cluster.run_chief([](parameter_server_strategy& strategy, cluster_coordinator& coordinator) -> asio::awaitable<void> {
    const auto& r = metrics::process_registry();
    const auto reads_before = r.histogram_value("pscoro_ps_operation_seconds", {{"operation", "read"}});
    const auto frames_before = r.value("pscoro_peer_sent_frames_total", {{"peer", "ps:0"}}).value_or(0);
    const xt::xarray<float> initial{1, 2, 3};
    auto w = co_await strategy.scope().create_variable("metered", initial);
    (void)co_await w.read();
    (void)co_await coordinator.schedule(read_sum, w).get();
    const auto reads = r.histogram_value("pscoro_ps_operation_seconds", {{"operation", "read"}});
    REQUIRE(reads.has_value());
    // One read from here, one from the worker (both in this process's registry).
    CHECK(reads->count >= (reads_before ? reads_before->count : 0) + 2);
    CHECK(r.value("pscoro_ps_variables") >= 1.0);
    CHECK(r.value("pscoro_ps_held_bytes") >= 12.0);
    CHECK(r.value("pscoro_peer_sent_frames_total", {{"peer", "ps:0"}}) >= frames_before + 2);
    CHECK(r.value("pscoro_peer_received_bytes_total", {{"peer", "worker:0"}}) > 0.0);
    CHECK(r.value("pscoro_peer_received_frames_total", {{"peer", "chief:0"}}) > 0.0);
    const auto page = r.expose();
    CHECK(contains(page, "# TYPE pscoro_ps_operation_seconds histogram\n"));
    CHECK(contains(page, "pscoro_ps_operation_seconds_bucket{operation=\"read\",le=\"+Inf\"}"));
  });
}

TEST_CASE("bounded staleness on a live cluster: closure k sees every update of closures up to k - s - 1") {
  constexpr std::int64_t n = 60;
  constexpr std::size_t s = 2;
  local_cluster cluster(1, 3, bind_test_functions);
  coordinator_options options;
  options.closures_per_worker = 4;
  options.max_staleness = s;
  cluster.run_chief([](parameter_server_strategy& strategy, cluster_coordinator& coordinator) -> asio::awaitable<void> {
    const xt::xarray<float> zeros = xt::zeros<float>({n});
    auto done = co_await strategy.scope().create_variable("done", zeros);
    std::vector<remote_value<std::int64_t>> lowest;
    for (std::int64_t k = 0; k < n; ++k) lowest.push_back(coordinator.schedule(mark_done, done, k));
    co_await coordinator.join();
    for (std::int64_t k = 0; k < n; ++k) {
      const std::int64_t seen = co_await lowest[k].get();
      CHECK_MESSAGE(seen >= k - static_cast<std::int64_t>(s), "closure ", k, " saw index ", seen, " not done yet");
    }
    const auto m = coordinator.metrics();
    CHECK(m.closure_staleness.count == static_cast<std::uint64_t>(n));
    CHECK(m.closure_staleness.max <= 2 * s);
  }, options);
}

TEST_CASE("bounded staleness 0 runs closures one at a time in order: the result is a one-thread run's, bit for bit") {
  constexpr std::int64_t n = 40;
  local_cluster cluster(1, 2, bind_test_functions);
  coordinator_options options;
  options.max_staleness = 0;
  cluster.run_chief([](parameter_server_strategy& strategy, cluster_coordinator& coordinator) -> asio::awaitable<void> {
    const xt::xarray<float> start = {0.25f, -1.0f, 3.0f};
    auto x = co_await strategy.scope().create_variable("x", start);
    for (std::int64_t k = 0; k < n; ++k) coordinator.schedule(affine, x, k);
    co_await coordinator.join();
    xt::xarray<float> expected = start;
    for (std::int64_t k = 0; k < n; ++k) expected = expected * 1.5f + static_cast<float>(k);
    const xt::xarray<float> got = co_await x.read();
    CHECK(got == expected);
    CHECK(coordinator.metrics().closure_staleness.max == 0);
  }, options);
}

// TF's ScheduleStartDelayTest: the coordinator works as before with TF's staggered start set (TF:
// 2 and 4 s over 3 workers; 1 s here, to keep the test short).
TEST_CASE("with TF_COORDINATOR_SCHEDULE_START_DELAY and _MAX set, closures run and join returns as before") {
  ::setenv("TF_COORDINATOR_SCHEDULE_START_DELAY", "1", 1);
  ::setenv("TF_COORDINATOR_SCHEDULE_START_DELAY_MAX", "1", 1);
  local_cluster cluster(2, 3, bind_test_functions);
  cluster.run_chief([](parameter_server_strategy&, cluster_coordinator& coordinator) -> asio::awaitable<void> {
    ::unsetenv("TF_COORDINATOR_SCHEDULE_START_DELAY");
    ::unsetenv("TF_COORDINATOR_SCHEDULE_START_DELAY_MAX");
    std::vector<remote_value<std::string>> where;
    for (int i = 0; i < 30; ++i) where.push_back(coordinator.schedule(whoami));
    co_await coordinator.join();
    std::set<std::string> seen;
    for (auto& w : where) seen.insert(co_await w.get());
    // Worker 0 takes closures at once; the others only after their delay.
    CHECK(seen.contains("worker:0"));
    const auto first = std::chrono::steady_clock::now();
    std::vector<remote_value<std::string>> later;
    // After the delay every worker takes closures: keep scheduling until each one has.
    while (seen.size() < 3) {
      for (int i = 0; i < 12; ++i) later.push_back(coordinator.schedule(whoami));
      co_await coordinator.join();
      for (auto& w : later) seen.insert(co_await w.get());
      later.clear();
      REQUIRE_MESSAGE(std::chrono::steady_clock::now() - first < std::chrono::seconds(60),
                      "a worker took no closure within a minute of its 1 s start delay");
    }
  });
}

TEST_CASE("speculation: closures held by a hung worker get backups on the other, and join returns before it is taken for lost") {
  local_cluster cluster(1, 2, bind_test_functions);
  hang hung;
  coordinator_options options;
  options.closures_per_worker = 2;
  options.worker_probe_interval = std::chrono::milliseconds(20);  // how often slow closures are looked for
  cluster.run_chief(
      [&](parameter_server_strategy&, cluster_coordinator& coordinator) -> asio::awaitable<void> {
        coordinator.speculate(add_one, {.multiplier = 4, .min_samples = 8, .min_run_time = std::chrono::milliseconds(50)});
        std::vector<remote_value<std::int64_t>> results;
        for (int i = 0; i < 20; ++i) results.push_back(coordinator.schedule(add_one, i));  // its recent runs
        co_await coordinator.join();
        hung.start(cluster, "worker", 1);
        for (int i = 20; i < 60; ++i) results.push_back(coordinator.schedule(add_one, i));
        co_await coordinator.join();  // what worker 1 holds ran again on worker 0
        for (int i = 0; i < 60; ++i) CHECK(co_await results[static_cast<std::size_t>(i)].get() == i + 1);
        const auto m = coordinator.metrics();
        // The heartbeats' timeout is seconds away: the backups, not the loss, finished the closures.
        CHECK(m.worker_failures == 0);
        CHECK(m.speculated_closures >= 1);
        CHECK(m.backup_wins == m.speculated_closures);
        hung.release();  // its late results are ignored
      },
      options);
}

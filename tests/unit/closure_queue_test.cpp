// The closure queue as a state machine: fake workers (a list of what was handed to whom), outcomes
// fed back by hand, no sockets. The executor only delivers completion handlers.
#include "test_support.hpp"

#include "chief/closure_queue.hpp"

#include <pscoro/error.hpp>

#include <asio/io_context.hpp>

#include <optional>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

using namespace pscoro;
using chief::closure;
using chief::closure_queue;
using testing::code_of;
using testing::message_of;

namespace {

struct handed {
  std::size_t worker;
  std::shared_ptr<closure> c;
};

// A queue over `workers` fake workers that only record what they are handed.
struct fake_cluster {
  explicit fake_cluster(std::size_t workers, coordinator_options options = {}) {
    std::vector<std::string> names;
    for (std::size_t i = 0; i < workers; ++i) names.push_back("worker:" + std::to_string(i));
    queue = std::make_shared<closure_queue>(
        io.get_executor(), std::move(names), [this](std::size_t w, const auto& c) { started.push_back({w, c}); },
        [this](std::size_t w, std::uint64_t generation) { cancels.push_back({w, generation}); },
        [this](std::size_t w, const auto& c) { cancelled_attempts.push_back({w, c}); });
    queue->set_options(options);
  }

  std::shared_ptr<closure> make(std::string name = "f") {
    return std::make_shared<closure>(
        closure{std::move(name), "void()", {}, std::make_shared<detail::remote_state>(io.get_executor(), decode_context{})});
  }
  /// Schedules a closure named `name`; returns it.
  std::shared_ptr<closure> schedule(std::string name = "f") {
    auto c = make(std::move(name));
    queue->schedule(c);
    return c;
  }
  /// What was handed out since the last call, in order.
  std::vector<handed> take_started() { return std::exchange(started, {}); }

  asio::io_context io;
  std::vector<handed> started;
  std::vector<std::pair<std::size_t, std::uint64_t>> cancels;  // (worker, generation) told to cancel
  std::vector<handed> cancelled_attempts;  // (worker, closure) told to cancel its attempt
  std::shared_ptr<closure_queue> queue;
};

std::exception_ptr failure(std::string what) {
  return std::make_exception_ptr(error(errc::internal, std::move(what)));
}

// The error that schedule() throws now, or null.
std::exception_ptr schedule_error(fake_cluster& cluster) {
  try {
    cluster.schedule();
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}

}  // namespace

TEST_CASE("closures go to the least busy live worker, closures_per_worker at most, the rest waits queued") {
  fake_cluster cluster(2, coordinator_options{.closures_per_worker = 2});
  for (int i = 0; i < 5; ++i) cluster.schedule();
  const auto started = cluster.take_started();
  REQUIRE(started.size() == 4);
  CHECK(started[0].worker == 0);
  CHECK(started[1].worker == 1);  // the other one is less busy
  CHECK(started[2].worker == 0);
  CHECK(started[3].worker == 1);
  CHECK(cluster.queue->queued() == 1);
  CHECK(cluster.queue->in_flight() == 4);

  cluster.queue->succeeded(1, started[1].c, std::int64_t{7});
  const auto next = cluster.take_started();
  REQUIRE(next.size() == 1);
  CHECK(next[0].worker == 1);  // the slot that came free
  CHECK(cluster.queue->queued() == 0);
  CHECK(started[1].c->result->status() == remote_status::ready);
  CHECK(started[1].c->result->result<std::int64_t>() == 7);
}

TEST_CASE("a lost worker takes nothing, and what it ran runs again elsewhere: at least once") {
  fake_cluster cluster(2, coordinator_options{.closures_per_worker = 1});
  cluster.schedule("a");
  cluster.schedule("b");
  auto started = cluster.take_started();
  REQUIRE(started.size() == 2);
  const auto on_1 = started[1].c;
  REQUIRE(started[1].worker == 1);

  cluster.queue->worker_lost(1);
  cluster.queue->lost(1, on_1);
  CHECK(on_1->result->status() == remote_status::not_ready);
  CHECK(cluster.queue->queued() == 1);  // worker 0 is busy: it waits
  CHECK(cluster.take_started().empty());

  cluster.queue->succeeded(0, started[0].c, value{});
  started = cluster.take_started();
  REQUIRE(started.size() == 1);
  CHECK(started[0].worker == 0);
  CHECK(started[0].c == on_1);

  cluster.queue->worker_up(1);
  cluster.schedule("c");
  started = cluster.take_started();
  REQUIRE(started.size() == 1);
  CHECK(started[0].worker == 1);  // back, and it takes closures again
}

TEST_CASE("the first error is reported once, by the next schedule, and what was queued is cancelled") {
  fake_cluster cluster(1, coordinator_options{.closures_per_worker = 2});
  for (int i = 0; i < 4; ++i) cluster.schedule();
  const auto started = cluster.take_started();
  REQUIRE(started.size() == 2);
  cluster.queue->failed(0, started[0].c, failure("first"));
  cluster.queue->failed(0, started[1].c, failure("second"));  // same generation: not reported
  CHECK(started[0].c->result->status() == remote_status::error);
  CHECK(cluster.queue->queued() == 0);
  CHECK(cluster.take_started().empty());  // nothing starts while an error waits

  const auto reported = schedule_error(cluster);
  REQUIRE(reported != nullptr);
  CHECK_MESSAGE(message_of(reported) == "first", message_of(reported));
  CHECK(schedule_error(cluster) == nullptr);  // once, then cleared: this closure runs
  CHECK(cluster.take_started().size() == 1);
}

TEST_CASE("closures queued when an error comes are cancelled with TF's message and the cause") {
  fake_cluster cluster(1, coordinator_options{.closures_per_worker = 1});
  const auto running = cluster.schedule("step");
  const auto queued = cluster.schedule("later");
  cluster.take_started();
  cluster.queue->failed(0, running, failure("the cause"));
  REQUIRE(queued->result->status() == remote_status::cancelled);
  const auto message = message_of(queued->result->error());
  CHECK(code_of(queued->result->error()) == errc::cancelled);
  CHECK_MESSAGE(contains(message, "The corresponding function 'later' is cancelled"), message);
  CHECK_MESSAGE(contains(message, "the cause"), message);
}

TEST_CASE("an error cancels the running closures of its generation at once and tells their workers; a newer one's run on") {
  fake_cluster cluster(2, coordinator_options{.closures_per_worker = 2});
  const auto failing = cluster.schedule();  // worker 0
  const auto on_1 = cluster.schedule();     // worker 1
  const auto on_0 = cluster.schedule();     // worker 0
  REQUIRE(cluster.take_started().size() == 3);
  int joined = 0;
  cluster.queue->join(closure_queue::join_handler([&](std::exception_ptr) { ++joined; }, cluster.io.get_executor()));
  cluster.queue->failed(0, failing, failure("boom"));
  CHECK(on_0->result->status() == remote_status::cancelled);
  CHECK(on_1->result->status() == remote_status::cancelled);
  CHECK_MESSAGE(contains(message_of(on_1->result->error()), "boom"), message_of(on_1->result->error()));
  CHECK(cluster.queue->in_flight() == 0);
  CHECK(cluster.cancels == std::vector<std::pair<std::size_t, std::uint64_t>>{{0, 0}, {1, 0}});
  cluster.io.poll();
  CHECK(joined == 1);  // it did not wait for them
  cluster.queue->succeeded(1, on_1, std::int64_t{1});  // their late outcomes are ignored
  CHECK(on_1->result->status() == remote_status::cancelled);

  // Generation 1 now; an error of generation 0 that comes late cancels nothing of it.
  const auto newer = cluster.schedule();
  REQUIRE(cluster.take_started().size() == 1);
  CHECK(newer->generation == 1);
  cluster.cancels.clear();
  cluster.queue->failed(0, on_0, failure("late, old generation"));  // ignored: already resolved
  CHECK(newer->result->status() == remote_status::not_ready);
  CHECK(cluster.cancels.empty());
}

TEST_CASE("the late failure of a closure cancelled by an earlier error is not reported") {
  fake_cluster cluster(1, coordinator_options{.closures_per_worker = 2});
  const auto first = cluster.schedule();
  const auto other = cluster.schedule();
  cluster.take_started();
  cluster.queue->failed(0, first, failure("reported"));
  CHECK(other->result->status() == remote_status::cancelled);
  CHECK(schedule_error(cluster) != nullptr);  // reported: a new generation starts
  cluster.queue->failed(0, other, failure("its worker's late answer"));
  CHECK(other->result->status() == remote_status::cancelled);  // resolved once
  CHECK(schedule_error(cluster) == nullptr);
}

TEST_CASE("a closure cancelled by an error does not run again when its worker is lost afterwards") {
  fake_cluster cluster(1, coordinator_options{.closures_per_worker = 2});
  const auto failing = cluster.schedule();
  const auto other = cluster.schedule();
  cluster.take_started();
  cluster.queue->failed(0, failing, failure("boom"));
  cluster.queue->worker_lost(0);
  cluster.queue->lost(0, other);
  CHECK(other->result->status() == remote_status::cancelled);
  CHECK(cluster.queue->queued() == 0);
}

TEST_CASE("a retried closure runs again from the tail of the queue") {
  fake_cluster cluster(1, coordinator_options{.closures_per_worker = 1});
  const auto first = cluster.schedule("first");
  cluster.schedule("second");
  cluster.take_started();
  cluster.queue->retry(0, first);
  auto started = cluster.take_started();
  REQUIRE(started.size() == 1);
  CHECK(started[0].c->function == "second");
  cluster.queue->succeeded(0, started[0].c, value{});
  started = cluster.take_started();
  REQUIRE(started.size() == 1);
  CHECK(started[0].c == first);
}

TEST_CASE("join completes only when nothing runs, with the pending error, once") {
  fake_cluster cluster(1);
  const auto c = cluster.schedule();
  cluster.take_started();
  int joined = 0;
  std::exception_ptr joined_with;
  cluster.queue->join(closure_queue::join_handler(
      [&](std::exception_ptr e) {
        ++joined;
        joined_with = e;
      },
      cluster.io.get_executor()));
  cluster.io.poll();
  CHECK(joined == 0);  // c still runs
  cluster.queue->failed(0, c, failure("boom"));
  cluster.io.poll();
  CHECK(joined == 1);
  CHECK_MESSAGE(message_of(joined_with) == "boom", message_of(joined_with));
  CHECK(cluster.queue->done());  // reported by join: not again
}

TEST_CASE("a full queue refuses schedule with resource_exhausted; waiting producers are admitted in order") {
  fake_cluster cluster(1, coordinator_options{.closures_per_worker = 1, .max_queued_closures = 1});
  const auto running = cluster.schedule();
  cluster.schedule();  // queued: the queue is full now
  cluster.take_started();
  const auto full = schedule_error(cluster);
  REQUIRE(full != nullptr);
  CHECK(code_of(full) == errc::resource_exhausted);
  CHECK_MESSAGE(contains(message_of(full), "max_queued_closures"), message_of(full));

  std::vector<std::string> admitted;
  for (const auto* name : {"w1", "w2"}) {
    cluster.queue->schedule_when_room(
        cluster.make(name), closure_queue::admission_handler(
                                [&admitted, name](std::exception_ptr e, std::shared_ptr<detail::remote_state> state) {
                                  admitted.push_back(e ? "error" : state ? name : "nothing");
                                },
                                cluster.io.get_executor()));
  }
  cluster.io.poll();
  CHECK(admitted.empty());
  CHECK(cluster.queue->waiting() == 2);
  cluster.queue->succeeded(0, running, value{});  // the queued one starts: room for w1
  cluster.io.poll();
  CHECK(admitted == std::vector<std::string>{"w1"});
  const auto started = cluster.take_started();
  REQUIRE(started.size() == 1);
  cluster.queue->succeeded(0, started[0].c, value{});
  cluster.io.poll();
  CHECK(admitted == std::vector<std::string>{"w1", "w2"});
}

TEST_CASE("a fatal failure resolves running closures at once, ignores their late outcomes, and fails every schedule") {
  fake_cluster cluster(2, coordinator_options{.closures_per_worker = 1});
  const auto a = cluster.schedule();
  const auto b = cluster.schedule();
  const auto queued = cluster.schedule();
  cluster.take_started();
  const auto lost_ps = std::make_exception_ptr(remote_error(make_error_code(errc::unavailable), "ps:0", "gone"));
  cluster.queue->fail(lost_ps);
  CHECK(a->result->status() == remote_status::error);
  CHECK(b->result->status() == remote_status::error);
  CHECK(queued->result->status() == remote_status::cancelled);
  CHECK(cluster.queue->in_flight() == 0);

  cluster.queue->succeeded(0, a, std::int64_t{1});  // its worker answers late: ignored
  CHECK(a->result->status() == remote_status::error);
  CHECK(schedule_error(cluster) == lost_ps);  // reported once as the error ...
  CHECK(schedule_error(cluster) == lost_ps);  // ... and the run stays failed
  CHECK(cluster.take_started().empty());
}

TEST_CASE("with every worker lost past worker_recovery_timeout, queued closures fail with unavailable") {
  fake_cluster cluster(1, coordinator_options{.closures_per_worker = 1, .worker_recovery_timeout = std::chrono::hours(1)});
  const auto running = cluster.schedule();
  const auto queued = cluster.schedule();
  cluster.take_started();
  cluster.queue->worker_lost(0);
  cluster.queue->lost(0, running);
  const auto now = closure_queue::clock::now();
  cluster.queue->tick(now);
  CHECK(queued->result->status() == remote_status::not_ready);  // it may still come back
  cluster.queue->tick(now + std::chrono::hours(2));
  CHECK(queued->result->status() == remote_status::cancelled);
  const auto reported = schedule_error(cluster);
  REQUIRE(reported != nullptr);
  CHECK(code_of(reported) == errc::unavailable);
  CHECK_MESSAGE(contains(message_of(reported), "worker_recovery_timeout"), message_of(reported));
}

TEST_CASE("close cancels what is queued and what waits for room, and what its lost workers ran") {
  fake_cluster cluster(1, coordinator_options{.closures_per_worker = 1, .max_queued_closures = 1});
  const auto running = cluster.schedule();
  const auto queued = cluster.schedule();
  cluster.take_started();
  std::exception_ptr admission;
  cluster.queue->schedule_when_room(cluster.make(), closure_queue::admission_handler(
                                                        [&](std::exception_ptr e, std::shared_ptr<detail::remote_state>) {
                                                          admission = e;
                                                        },
                                                        cluster.io.get_executor()));
  cluster.queue->close();
  cluster.io.poll();
  CHECK(queued->result->status() == remote_status::cancelled);
  CHECK(code_of(admission) == errc::cancelled);
  cluster.queue->worker_lost(0);
  cluster.queue->lost(0, running);
  CHECK(running->result->status() == remote_status::cancelled);
  CHECK_MESSAGE(contains(message_of(running->result->error()), "the coordinator closed"), message_of(running->result->error()));
}

TEST_CASE("done is true only with nothing queued or running, and throws the pending error once") {
  fake_cluster cluster(1);
  CHECK(cluster.queue->done());
  const auto c = cluster.schedule();
  CHECK_FALSE(cluster.queue->done());
  cluster.take_started();
  cluster.queue->failed(0, c, failure("boom"));
  CHECK_THROWS_WITH(cluster.queue->done(), "boom");
  CHECK(cluster.queue->done());
}

namespace {

// Drives `cluster` to the end with random outcomes: each step finishes one running closure (or,
// now and then, loses its worker, which comes back at once), and checks every closure handed out
// against the bound `s`: closure k starts only once every closure numbered k - s - 1 or lower has
// finished. Returns the closures in the order they finished.
std::vector<std::uint64_t> run_at_random(fake_cluster& cluster, std::size_t s, std::size_t closures,
                                         std::uint64_t seed) {
  std::mt19937_64 random(seed);
  std::set<std::uint64_t> finished;
  std::vector<std::uint64_t> order;
  std::vector<handed> running;
  const auto check_started = [&] {
    for (auto& h : cluster.take_started()) {
      const std::uint64_t k = h.c->number;
      for (std::uint64_t j = 0; j + s + 1 <= k; ++j) {
        REQUIRE_MESSAGE(finished.contains(j), "closure ", k, " started before closure ", j, " finished (bound ", s, ")");
      }
      running.push_back(std::move(h));
    }
  };
  for (std::size_t i = 0; i < closures; ++i) cluster.schedule();
  check_started();
  while (!running.empty()) {
    const std::size_t pick = std::uniform_int_distribution<std::size_t>(0, running.size() - 1)(random);
    const handed h = running[pick];
    running.erase(running.begin() + static_cast<std::ptrdiff_t>(pick));
    if (random() % 8 == 0) {
      // Its worker is lost: every closure it runs comes back to the queue.
      std::vector<handed> lost;
      std::erase_if(running, [&](const handed& r) {
        if (r.worker != h.worker) return false;
        lost.push_back(r);
        return true;
      });
      lost.push_back(h);
      cluster.queue->worker_lost(h.worker);
      for (const auto& r : lost) cluster.queue->lost(r.worker, r.c);
      cluster.queue->worker_up(h.worker);
    } else {
      cluster.queue->succeeded(h.worker, h.c, value{});
      finished.insert(h.c->number);
      order.push_back(h.c->number);
    }
    check_started();
  }
  CHECK(finished.size() == closures);
  CHECK(cluster.queue->done());
  return order;
}

}  // namespace

TEST_CASE("bounded staleness: closure k starts only after every closure up to k - s - 1, whatever the order they end in") {
  for (const std::size_t s : {0u, 1u, 4u, 16u}) {
    for (std::uint64_t seed = 1; seed <= 5; ++seed) {
      CAPTURE(s);
      CAPTURE(seed);
      fake_cluster cluster(3, coordinator_options{.closures_per_worker = 4, .max_staleness = s});
      const auto order = run_at_random(cluster, s, 120, seed);
      // Each closure's reads may miss the s before it and, while it runs, the s after it.
      CHECK(cluster.queue->staleness_max().value() <= static_cast<std::int64_t>(2 * s));
      CHECK(cluster.queue->staleness().read().count == 120);
      if (s == 0) {
        // One at a time, in the order they were scheduled.
        for (std::size_t i = 0; i < order.size(); ++i) CHECK(order[i] == i);
      }
    }
  }
}

TEST_CASE("without a bound closures start as workers have room, and their staleness is measured") {
  fake_cluster cluster(2, coordinator_options{.closures_per_worker = 4});
  for (int i = 0; i < 8; ++i) cluster.schedule();
  auto started = cluster.take_started();
  REQUIRE(started.size() == 8);  // no window holds any back
  // The first one ends last: the seven others finished while it ran.
  for (std::size_t i = 1; i < started.size(); ++i) cluster.queue->succeeded(started[i].worker, started[i].c, value{});
  cluster.queue->succeeded(started[0].worker, started[0].c, value{});
  CHECK(cluster.queue->staleness_max().value() == 7);
  const auto histogram = cluster.queue->staleness().read();
  CHECK(histogram.count == 8);
  // All started at once: the i-th to end (from 0) saw i others end before it.
  CHECK(histogram.sum == 0 + 1 + 2 + 3 + 4 + 5 + 6 + 7);
}

TEST_CASE("bounded staleness: a closure whose worker is lost runs again first, and the window does not deadlock") {
  fake_cluster cluster(2, coordinator_options{.closures_per_worker = 1, .max_staleness = 1});
  const auto c0 = cluster.schedule("c0");
  const auto c1 = cluster.schedule("c1");
  const auto c2 = cluster.schedule("c2");
  auto started = cluster.take_started();
  REQUIRE(started.size() == 2);  // c0 and c1; c2 waits for c0
  CHECK(started[0].c == c0);
  CHECK(started[1].c == c1);
  // c1's worker finishes it, but c2 may not start: c0 still runs.
  cluster.queue->succeeded(started[1].worker, c1, value{});
  CHECK(cluster.take_started().empty());
  // c0's worker is lost: c0 goes back to the head of the queue, ahead of c2, and runs on the other.
  cluster.queue->worker_lost(started[0].worker);
  cluster.queue->lost(started[0].worker, c0);
  started = cluster.take_started();
  REQUIRE(started.size() == 1);
  CHECK(started[0].c == c0);
  cluster.queue->succeeded(started[0].worker, c0, value{});
  started = cluster.take_started();
  REQUIRE(started.size() == 1);
  CHECK(started[0].c == c2);
  cluster.queue->succeeded(started[0].worker, c2, value{});
  CHECK(cluster.queue->done());
}

TEST_CASE("staggered start: worker i takes its first closure min(i x delay, max) after the options are set") {
  using std::chrono::milliseconds;
  coordinator_options options{.closures_per_worker = 2};
  options.schedule_start_delay = milliseconds(20);
  options.schedule_start_delay_max = milliseconds(30);
  fake_cluster cluster(4, options);
  for (int i = 0; i < 8; ++i) cluster.schedule();
  // Only worker 0 starts at once; the others' starts are 20, 30 (capped) and 30 ms away.
  auto started = cluster.take_started();
  REQUIRE(started.size() == 2);
  CHECK(started[0].worker == 0);
  CHECK(started[1].worker == 0);
  std::vector<std::size_t> order;
  while (order.size() < 6) {
    REQUIRE_MESSAGE(cluster.io.run_one() == 1, "the queue stopped waiting for a worker's start");
    for (const auto& h : cluster.take_started()) order.push_back(h.worker);
  }
  CHECK(order[0] == 1);  // 20 ms
  CHECK(order[1] == 1);
  CHECK(std::set<std::size_t>(order.begin() + 2, order.end()) == std::set<std::size_t>{2, 3});  // 30 ms each
  CHECK(cluster.queue->queued() == 0);
}

TEST_CASE("staggered start: closing the queue stops waiting for a worker's start") {
  coordinator_options options;
  options.schedule_start_delay = std::chrono::hours(1);
  fake_cluster cluster(2, options);
  for (int i = 0; i < 8; ++i) cluster.schedule();
  CHECK(cluster.queue->queued() == 4);  // worker 1 starts in an hour
  cluster.queue->close();
  cluster.io.run();  // returns: no timer left waiting
  CHECK(cluster.queue->queued() == 0);
}

namespace {

// Speculates closures of "f" in `cluster` as `options` say, after `samples` quick runs of it.
void speculate_after(fake_cluster& cluster, speculation_options options, int samples) {
  cluster.queue->speculate("f", options);
  for (int i = 0; i < samples; ++i) {
    const auto c = cluster.schedule("f");
    const auto started = cluster.take_started();
    REQUIRE(started.size() == 1);
    cluster.queue->succeeded(started[0].worker, c, value{});
  }
}

}  // namespace

TEST_CASE("speculation: a closure slower than its function's recent runs gets a backup, and the first outcome wins") {
  fake_cluster cluster(2, coordinator_options{.closures_per_worker = 1});
  speculate_after(cluster, {.multiplier = 2, .min_samples = 3, .min_run_time = {}}, 3);
  const auto slow = cluster.schedule("f");
  auto started = cluster.take_started();
  REQUIRE(started.size() == 1);
  const std::size_t primary = started[0].worker;
  // Not yet slow: no backup.
  cluster.queue->tick(slow->started);
  CHECK(cluster.take_started().empty());
  // Far past twice the median of runs that took microseconds: a backup on the other worker.
  cluster.queue->tick(slow->started + std::chrono::seconds(1));
  started = cluster.take_started();
  REQUIRE(started.size() == 1);
  CHECK(started[0].c == slow);
  const std::size_t backup = started[0].worker;
  CHECK(backup != primary);
  CHECK(cluster.queue->speculated().value() == 1);
  // Only one backup per closure.
  cluster.queue->tick(slow->started + std::chrono::seconds(2));
  CHECK(cluster.take_started().empty());
  // The backup finishes first: the closure has its value, the primary's attempt is cancelled on
  // its worker and its late outcome ignored.
  cluster.queue->succeeded(backup, slow, std::int64_t{7});
  CHECK(slow->result->status() == remote_status::ready);
  CHECK(slow->result->result<std::int64_t>() == 7);
  REQUIRE(cluster.cancelled_attempts.size() == 1);
  CHECK(cluster.cancelled_attempts[0].worker == primary);
  CHECK(cluster.cancelled_attempts[0].c == slow);
  CHECK(cluster.queue->backup_wins().value() == 1);
  CHECK(cluster.queue->in_flight() == 0);
  cluster.queue->failed(primary, slow, failure("late"));
  CHECK(slow->result->result<std::int64_t>() == 7);
  CHECK(cluster.queue->done());
}

TEST_CASE("speculation: no backup before enough samples, before the minimum run time, or for other functions") {
  fake_cluster cluster(2, coordinator_options{.closures_per_worker = 1});
  speculate_after(cluster, {.multiplier = 2, .min_samples = 3, .min_run_time = std::chrono::seconds(5)}, 2);
  const auto c = cluster.schedule("f");
  REQUIRE(cluster.take_started().size() == 1);
  cluster.queue->tick(c->started + std::chrono::seconds(10));  // 2 samples of 3
  CHECK(cluster.take_started().empty());
  cluster.queue->succeeded(0, c, value{});
  const auto next = cluster.schedule("f");
  REQUIRE(cluster.take_started().size() == 1);
  cluster.queue->tick(next->started + std::chrono::seconds(4));  // 3 samples, but under 5 s
  CHECK(cluster.take_started().empty());
  cluster.queue->tick(next->started + std::chrono::seconds(6));
  CHECK(cluster.take_started().size() == 1);
  const auto other = cluster.schedule("g");  // no room now, and "g" is not speculated anyway
  cluster.queue->succeeded(0, next, value{});
  const auto started = cluster.take_started();
  REQUIRE(started.size() == 1);
  CHECK(started[0].c == other);
  cluster.queue->tick(other->started + std::chrono::hours(1));
  CHECK(cluster.take_started().empty());
  CHECK(cluster.queue->speculated().value() == 1);
}

TEST_CASE("speculation: a lost primary does not run a third time while its backup runs; a lost backup leaves the primary") {
  fake_cluster cluster(3, coordinator_options{.closures_per_worker = 1});
  speculate_after(cluster, {.multiplier = 2, .min_samples = 1, .min_run_time = {}}, 1);
  const auto c = cluster.schedule("f");
  auto started = cluster.take_started();
  REQUIRE(started.size() == 1);
  const std::size_t primary = started[0].worker;
  cluster.queue->tick(c->started + std::chrono::seconds(1));
  started = cluster.take_started();
  REQUIRE(started.size() == 1);
  const std::size_t backup = started[0].worker;
  cluster.queue->worker_lost(primary);
  cluster.queue->lost(primary, c);
  CHECK(cluster.take_started().empty());  // not queued again: the backup runs it
  CHECK(cluster.queue->queued() == 0);
  cluster.queue->succeeded(backup, c, std::int64_t{1});
  CHECK(c->result->status() == remote_status::ready);
  CHECK(cluster.cancelled_attempts.empty());  // nothing else ran it

  // The other way round: the backup's worker is lost, the primary goes on and finishes.
  const auto d = cluster.schedule("f");
  started = cluster.take_started();
  REQUIRE(started.size() == 1);
  const std::size_t first = started[0].worker;
  cluster.queue->tick(d->started + std::chrono::seconds(1));
  started = cluster.take_started();
  REQUIRE(started.size() == 1);
  cluster.queue->worker_lost(started[0].worker);
  cluster.queue->lost(started[0].worker, d);
  CHECK(cluster.queue->queued() == 0);
  cluster.queue->succeeded(first, d, std::int64_t{2});
  CHECK(d->result->result<std::int64_t>() == 2);
  CHECK(cluster.queue->done());
}

TEST_CASE("speculation: a multiplier below 1 is refused") {
  fake_cluster cluster(1);
  CHECK_THROWS_WITH(cluster.queue->speculate("f", {.multiplier = 0.5, .min_samples = 1, .min_run_time = {}}),
                    doctest::Contains("the multiplier must be at least 1"));
}

TEST_CASE("while the queue is held (a lost ps being restored) join waits and done is false, even with nothing to run") {
  fake_cluster cluster(1);
  const auto c = cluster.schedule();
  REQUIRE(cluster.take_started().size() == 1);
  cluster.queue->hold();
  cluster.queue->succeeded(0, c, value{});
  int joined = 0;
  cluster.queue->join(closure_queue::join_handler([&](std::exception_ptr) { ++joined; }, cluster.io.get_executor()));
  cluster.io.poll();
  CHECK(joined == 0);  // what the program reads next may be on the ps being restored
  CHECK_FALSE(cluster.queue->done());
  cluster.queue->release();
  cluster.io.poll();
  CHECK(joined == 1);
  CHECK(cluster.queue->done());
}

TEST_CASE("a draining worker takes no new closure; the drain completes once what ran there finished, each closure run once") {
  fake_cluster cluster(2, coordinator_options{.closures_per_worker = 2});
  for (int i = 0; i < 4; ++i) cluster.schedule();
  auto started = cluster.take_started();
  REQUIRE(started.size() == 4);
  std::vector<std::shared_ptr<closure>> on_1;
  for (const auto& h : started) {
    if (h.worker == 1) on_1.push_back(h.c);
  }
  REQUIRE(on_1.size() == 2);
  int drained = 0;
  cluster.queue->drain(1, closure_queue::join_handler([&](std::exception_ptr e) { drained += e ? 100 : 1; },
                                                       cluster.io.get_executor()));
  CHECK(cluster.queue->draining(1));
  CHECK(cluster.queue->worker_stats(1).drained.value() == 1);
  CHECK(cluster.queue->worker_stats(1).up.value() == 0);
  // Four more: worker 0 is full, worker 1 draining: they wait, and go to worker 0 only.
  for (int i = 0; i < 4; ++i) cluster.schedule();
  CHECK(cluster.take_started().empty());
  cluster.queue->succeeded(1, on_1[0], std::int64_t{1});
  CHECK(cluster.take_started().empty());  // its free slot is not used
  cluster.io.poll();
  CHECK(drained == 0);  // on_1[1] still runs there
  cluster.queue->succeeded(1, on_1[1], std::int64_t{2});
  cluster.io.poll();
  CHECK(drained == 1);
  CHECK(on_1[0]->result->result<std::int64_t>() == 1);  // results count as usual
  CHECK(on_1[1]->result->result<std::int64_t>() == 2);
  // Everything left runs on worker 0, each closure once.
  std::set<closure*> ran;
  for (int round = 0; round < 8 && !cluster.queue->done(); ++round) {
    for (const auto& h : cluster.take_started()) {
      CHECK(h.worker == 0);
      CHECK(ran.insert(h.c.get()).second);
      cluster.queue->succeeded(0, h.c, value{});
    }
    for (const auto& h : started) {
      if (h.worker == 0 && ran.insert(h.c.get()).second) cluster.queue->succeeded(0, h.c, value{});
    }
  }
  CHECK(ran.size() == 6);  // 2 started there first, 4 queued
  CHECK(cluster.queue->done());
  CHECK(cluster.queue->worker_stats(1).succeeded.value() == 2);
}

TEST_CASE("a worker lost while draining: what it ran runs again elsewhere, once, and the drain completes") {
  fake_cluster cluster(2, coordinator_options{.closures_per_worker = 1});
  cluster.schedule("a");
  cluster.schedule("b");
  auto started = cluster.take_started();
  REQUIRE(started.size() == 2);
  REQUIRE(started[1].worker == 1);
  int drained = 0;
  cluster.queue->drain(1, closure_queue::join_handler([&](std::exception_ptr) { ++drained; }, cluster.io.get_executor()));
  cluster.queue->lost(1, started[1].c);  // its connection closed under the call
  cluster.io.poll();
  CHECK(drained == 1);
  CHECK(cluster.take_started().empty());  // worker 0 is busy: b waits for it, not for worker 1
  cluster.queue->succeeded(0, started[0].c, value{});
  const auto again = cluster.take_started();
  REQUIRE(again.size() == 1);
  CHECK(again[0].worker == 0);
  CHECK(again[0].c == started[1].c);
  cluster.queue->succeeded(0, again[0].c, value{});
  CHECK(cluster.take_started().empty());
  CHECK(cluster.queue->done());
}

TEST_CASE("a drained worker with nothing running drains at once; undrained, it takes closures from its worker_up") {
  fake_cluster cluster(2, coordinator_options{.closures_per_worker = 1});
  int drained = 0;
  cluster.queue->drain(1, closure_queue::join_handler([&](std::exception_ptr) { ++drained; }, cluster.io.get_executor()));
  cluster.io.poll();
  CHECK(drained == 1);
  cluster.schedule("a");
  cluster.schedule("b");
  auto started = cluster.take_started();
  REQUIRE(started.size() == 1);
  CHECK(started[0].worker == 0);
  CHECK_FALSE(cluster.queue->undrain(1));  // its drain had completed
  CHECK_FALSE(cluster.queue->draining(1));
  CHECK(cluster.take_started().empty());  // its per-worker values are made again first
  cluster.queue->worker_up(1);
  const auto next = cluster.take_started();
  REQUIRE(next.size() == 1);
  CHECK(next[0].worker == 1);
  CHECK(cluster.queue->worker_stats(1).restarts.value() == 0);  // resumed, not back from a loss
  CHECK(cluster.queue->worker_stats(1).up.value() == 1);
  CHECK(cluster.queue->worker_stats(1).drained.value() == 0);
}

TEST_CASE("with every worker drained, queued closures fail after worker_recovery_timeout as with every worker lost") {
  fake_cluster cluster(1, coordinator_options{.worker_recovery_timeout = std::chrono::milliseconds(0)});
  cluster.queue->drain(0, closure_queue::join_handler([](std::exception_ptr) {}, cluster.io.get_executor()));
  const auto c = cluster.schedule();
  cluster.queue->tick();
  CHECK(c->result->status() == remote_status::cancelled);
  CHECK(code_of(schedule_error(cluster)) == errc::unavailable);
}

TEST_CASE("undraining a worker whose drain is in progress calls the drain off: it fails with cancelled, the worker goes on") {
  fake_cluster cluster(2, coordinator_options{.closures_per_worker = 1});
  cluster.schedule("a");
  cluster.schedule("b");
  auto started = cluster.take_started();
  REQUIRE(started.size() == 2);
  REQUIRE(started[1].worker == 1);
  std::exception_ptr drain_outcome;
  int drained = 0;
  cluster.queue->drain(1, closure_queue::join_handler(
                              [&](std::exception_ptr e) {
                                ++drained;
                                drain_outcome = e;
                              },
                              cluster.io.get_executor()));
  cluster.schedule("c");
  CHECK(cluster.take_started().empty());
  CHECK(cluster.queue->undrain(1));  // in progress: called off
  cluster.io.poll();
  CHECK(drained == 1);
  CHECK_MESSAGE(code_of(drain_outcome) == errc::cancelled, drain_outcome);
  CHECK(cluster.queue->worker_stats(1).up.value() == 1);
  cluster.queue->succeeded(1, started[1].c, value{});
  const auto next = cluster.take_started();
  REQUIRE(next.size() == 1);
  CHECK(next[0].worker == 1);  // it takes closures at once: no worker_up needed
  CHECK_FALSE(cluster.queue->undrain(1));  // not draining: nothing to do
}

TEST_CASE("an added worker takes closures from its first worker_up, and that is no restart") {
  fake_cluster cluster(1, coordinator_options{.closures_per_worker = 1});
  cluster.schedule("a");
  cluster.schedule("b");
  REQUIRE(cluster.take_started().size() == 1);
  cluster.queue->add_worker("worker:1");
  CHECK(cluster.queue->workers() == 2);
  CHECK(cluster.take_started().empty());  // not up yet: its per-worker values come first
  cluster.queue->worker_up(1);
  const auto next = cluster.take_started();
  REQUIRE(next.size() == 1);
  CHECK(next[0].worker == 1);
  CHECK(cluster.queue->worker_stats(1).restarts.value() == 0);
  CHECK(cluster.queue->worker_stats(1).up.value() == 1);
}

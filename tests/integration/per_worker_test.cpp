// Per-worker datasets on an in-process cluster: every worker builds its own pipeline from its input
// context; scheduled functions read the iterator of the worker they run on.
#include "local_cluster.hpp"
#include "test_support.hpp"

#include <pscoro/coordinator.hpp>
#include <pscoro/per_worker.hpp>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <xtensor/xbuilder.hpp>
#include <xtensor/xmath.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <numeric>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>

using namespace pscoro;
using pscoro::testing::code_of;
using pscoro::testing::failure_of;
using pscoro::testing::local_cluster;
using pscoro::testing::message_of;

namespace {

// Loops that wait for a restarted worker to take closures again end on a deadline (60 s from
// come_back_deadline()), not after a count of round trips: a loaded machine only makes them slower.
std::chrono::steady_clock::time_point come_back_deadline() {
  return std::chrono::steady_clock::now() + std::chrono::seconds(60);
}
bool before(std::chrono::steady_clock::time_point deadline) { return std::chrono::steady_clock::now() < deadline; }

using element = std::vector<std::int64_t>;  // a batch of record numbers

const dataset_function<element> records{"test.records"};
const dataset_function<element> endless{"test.endless"};
const dataset_function<element> broken{"test.broken"};
const dataset_function<element> unbound{"test.unbound"};
// Takes one batch; returns the worker's index followed by the batch.
const worker_function<std::string(per_worker_iterator<element>)> take_batch{"test.take_batch"};
// Reads an iterator as if its elements were strings (they are not).
const worker_function<std::string(per_worker_iterator<std::string>)> take_text{"test.take_text"};

std::string encode(std::int64_t worker, const element& batch) {
  std::string out = std::to_string(worker);
  for (const auto x : batch) out += "," + std::to_string(x);
  return out;
}

// Records 0..99, sharded by record among the workers, in batches of 10, over and over.
dataset<element> endless_records(input_context context) {
  std::vector<std::int64_t> all(100);
  std::iota(all.begin(), all.end(), 0);
  return from_values(all).shard(context.num_workers, context.worker_index).batch(10).repeat();
}

// Schedules take_batch until a batch comes from worker 1 (a restarted worker that takes closures
// again), for at most come_back_deadline(); returns that batch, or "" if none came.
asio::awaitable<std::string> first_batch_from_one(cluster_coordinator& coordinator, per_worker_iterator<element> it) {
  for (const auto until = come_back_deadline(); before(until);) {
    auto batch = co_await coordinator.schedule(take_batch, it).get();
    if (batch.starts_with("1,")) co_return batch;
  }
  co_return std::string();
}

void bind_functions(server& s) {
  // Records 0..99, sharded by record among the workers, in batches of 10.
  s.bind(records, [](input_context context) {
    std::vector<std::int64_t> all(100);
    std::iota(all.begin(), all.end(), 0);
    return from_values(all).shard(context.num_workers, context.worker_index).batch(10);
  });
  s.bind(endless, endless_records);
  s.bind(broken, [](input_context) -> dataset<element> { throw std::runtime_error("no such files"); });
  const int index = s.task() == "worker:0" ? 0 : 1;
  s.bind(take_batch, [index](per_worker_iterator<element> it) -> asio::awaitable<std::string> {
    co_return encode(index, co_await it.next_async());
  });
  s.bind(take_text, [](per_worker_iterator<std::string> it) -> asio::awaitable<std::string> { co_return it.next(); });
}

}  // namespace

TEST_CASE("each worker reads its own shard through its own iterator, to the end of its data") {
  local_cluster cluster(1, 2, bind_functions);
  cluster.run_chief(
      [](parameter_server_strategy&, cluster_coordinator& coordinator) -> asio::awaitable<void> {
        const auto per_worker = coordinator.create_per_worker_dataset(records);
        // Two closures scheduled at once go to the two idle workers (the least busy takes each): each
        // reads the first batch of its own shard.
        auto both = co_await per_worker.iter();
        auto a = coordinator.schedule(take_batch, both);
        auto b = coordinator.schedule(take_batch, both);
        const auto first_a = co_await a.get();  // named: g++ 12 and co_await in a braced list
        const auto first_b = co_await b.get();
        const std::set<std::string> firsts{first_a, first_b};
        CHECK(firsts == std::set<std::string>{"0,0,2,4,6,8,10,12,14,16,18", "1,1,3,5,7,9,11,13,15,17,19"});

        auto it = co_await per_worker.iter();
        // 100 records in 2 shards of 5 batches. More closures than batches: some worker reaches the end
        // of its data, and that is errc::out_of_range (TF: OutOfRangeError), raised once.
        std::vector<remote_value<std::string>> results;
        for (int i = 0; i < 14; ++i) results.push_back(coordinator.schedule(take_batch, it));
        const auto e = co_await failure_of(coordinator.join());
        REQUIRE(e);
        CHECK(code_of(e) == errc::out_of_range);
        CHECK(contains(message_of(e), "End of sequence (the dataset of 'test.records' is exhausted)"));
        // What was read: each worker's own shard, its batches in order, none twice.
        std::map<std::int64_t, std::vector<std::int64_t>> by_worker;
        for (auto& r : results) {
          if (r.status() != remote_status::ready) continue;
          const std::string text = co_await r.get();
          std::stringstream parts(text);
          std::string field;
          std::getline(parts, field, ',');
          const std::int64_t worker = std::stoll(field);
          std::vector<std::int64_t> batch;
          while (std::getline(parts, field, ',')) batch.push_back(std::stoll(field));
          REQUIRE(batch.size() == 10);
          auto& seen = by_worker[worker];
          // The k-th batch of worker w holds records w + 2 * (10k .. 10k + 9).
          const auto k = static_cast<std::int64_t>(seen.size() / 10);
          for (std::size_t j = 0; j < batch.size(); ++j) {
            CHECK(batch[j] == worker + 2 * (10 * k + static_cast<std::int64_t>(j)));
          }
          seen.insert(seen.end(), batch.begin(), batch.end());
        }
        // Which results are ready is not fixed: the first worker to reach the end of its data cancels
        // what still runs on the other (its shard was checked above).
        REQUIRE(!by_worker.empty());
        std::size_t batches = 0;
        for (const auto& [worker, seen] : by_worker) batches += seen.size() / 10;
        CHECK(batches <= 10);
        // A new iter() starts every worker's pass afresh.
        auto again = co_await per_worker.iter();
        CHECK(again.ref().id != it.ref().id);
        auto first = coordinator.schedule(take_batch, again);
        const std::string text = co_await first.get();
        CHECK((text == "0,0,2,4,6,8,10,12,14,16,18" || text == "1,1,3,5,7,9,11,13,15,17,19"));
      },
      {1, 1000});  // one closure per worker at a time: results arrive in the order batches were read
}

TEST_CASE("an unbound or failing dataset function fails iter() with the worker's reason") {
  local_cluster cluster(1, 2, bind_functions);
  cluster.run_chief([](parameter_server_strategy&, cluster_coordinator& coordinator) -> asio::awaitable<void> {
    auto e = co_await failure_of(coordinator.create_per_worker_dataset(unbound).iter());
    CHECK(code_of(e) == errc::not_found);
    CHECK(contains(message_of(e), "dataset function 'test.unbound' is not bound on worker:"));
    CHECK(contains(message_of(e), "(it binds: test.broken, test.endless, test.records)"));
    e = co_await failure_of(coordinator.create_per_worker_dataset(broken).iter());
    CHECK(code_of(e) == errc::unknown);
    CHECK(contains(message_of(e), "dataset function 'test.broken' raised: no such files"));
    // An iterator read on the chief is refused.
    auto it = co_await coordinator.create_per_worker_dataset(records).iter();
    CHECK_THROWS_WITH_AS((void)it.next(),
                         "a per-worker iterator of 'test.records' is read inside a worker function, not on the chief",
                         error);
    // Read as another element type than its dataset function makes: refused on the worker.
    auto wrong = coordinator.schedule(take_text, per_worker_iterator<std::string>(it.ref()));
    e = co_await failure_of(wrong.get());
    CHECK(code_of(e) == errc::invalid_argument);
    CHECK(contains(message_of(e), "iterator of 'test.records' is read with another element type"));
    CHECK_THROWS_AS((void)coordinator.done(), remote_error);
    // An iterator no worker made.
    auto missing = coordinator.schedule(take_batch, per_worker_iterator<element>(per_worker_ref{999, "test.records"}));
    e = co_await failure_of(missing.get());
    CHECK(code_of(e) == errc::not_found);
    CHECK(contains(message_of(e), "iterator 999 of 'test.records' does not exist on this worker"));
    CHECK_THROWS_AS((void)coordinator.done(), remote_error);
  });
}

TEST_CASE("the workers drop an iterator once no copy is left on the chief; a closure keeps its own (TF's testRepeatedIteratorCreation)") {
  local_cluster cluster(1, 2, bind_functions);
  cluster.run_chief([](parameter_server_strategy&, cluster_coordinator& coordinator) -> asio::awaitable<void> {
    const auto per_worker = coordinator.create_per_worker_dataset(endless);
    const std::set<std::string> first_batches{"0,0,2,4,6,8,10,12,14,16,18", "1,1,3,5,7,9,11,13,15,17,19"};
    // Each iterator is gone from the chief before its closure runs: the closure's copy keeps it.
    std::vector<remote_value<std::string>> firsts;
    for (int i = 0; i < 20; ++i) {
      auto it = co_await per_worker.iter();
      firsts.push_back(coordinator.schedule(take_batch, it));
    }
    for (auto& r : firsts) CHECK(first_batches.count(co_await r.get()) == 1);

    // Without a copy on the chief, a reference to the same iterator finds it gone on the worker.
    per_worker_ref bare;
    {
      auto it = co_await per_worker.iter();
      bare = per_worker_ref{it.ref().id, it.ref().function};  // the id, without the lease
      auto first = coordinator.schedule(take_batch, it);
      CHECK(first_batches.count(co_await first.get()) == 1);
    }
    // The release travels ahead of the closures scheduled after it runs; when that is, is not
    // asserted: at most 1000 tries (a bound against a hang, not a timing margin).
    const auto executor = co_await asio::this_coro::executor;
    std::exception_ptr gone;
    for (int attempt = 0; attempt < 1000 && !gone; ++attempt) {
      co_await asio::post(executor, asio::use_awaitable);
      const per_worker_iterator<element> released(bare);
      auto late = coordinator.schedule(take_batch, released);  // named: g++ 12 (temporaries)
      gone = co_await failure_of(late.get());
    }
    REQUIRE_MESSAGE(gone, "the workers still hold the iterator after 1000 closures");
    CHECK(code_of(gone) == errc::not_found);
    CHECK(contains(message_of(gone),
                   "iterator " + std::to_string(bare.id) + " of 'test.endless' does not exist on this worker"));
    CHECK_THROWS_AS((void)coordinator.done(), remote_error);  // the error, raised once
  });
}

namespace {

// A pipeline whose element is ready only once `ping` has run on the same worker: a pipeline that
// held the worker's executor would wait for ever (60 s, then it fails, saying so).
std::atomic<bool> ping_ran{false};
const dataset_function<std::int64_t> gated{"test.gated"};
const worker_function<std::int64_t(per_worker_iterator<std::int64_t>)> take_gated{"test.take_gated"};
const worker_function<std::int64_t()> ping{"test.ping"};

void bind_gated(server& s) {
  s.bind(gated, [](input_context) {
    return from_values(std::vector<std::int64_t>{7}).map([](std::int64_t x) {
      for (int i = 0; i < 60'000 && !ping_ran; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      if (!ping_ran) throw std::runtime_error("ping did not run on this worker while its pipeline waited");
      return x;
    });
  });
  s.bind(take_gated, [](per_worker_iterator<std::int64_t> it) -> asio::awaitable<std::int64_t> {
    co_return co_await it.next_async();
  });
  s.bind(ping, []() -> asio::awaitable<std::int64_t> {
    ping_ran = true;
    co_return 1;
  });
}

}  // namespace

TEST_CASE("while next_async waits for its pipeline, the worker runs other closures") {
  ping_ran = false;
  local_cluster cluster(1, 1, bind_gated);
  coordinator_options options;
  options.closures_per_worker = 2;
  // No heartbeat timeout: a worker whose executor waits must not be taken for lost and retried.
  strategy_options patient;
  patient.transport.heartbeat_timeout = std::chrono::milliseconds(0);
  cluster.run_chief(
      [](parameter_server_strategy&, cluster_coordinator& coordinator) -> asio::awaitable<void> {
        auto it = co_await coordinator.create_per_worker_dataset(gated).iter();
        auto waiting = coordinator.schedule(take_gated, it);  // its element waits for ping
        auto other = coordinator.schedule(ping);
        CHECK(co_await other.get() == 1);
        CHECK(co_await waiting.get() == 7);
      },
      options, patient);
}

TEST_CASE("a worker restarted at the same address is reconnected and gets fresh iterators before closures") {
  local_cluster cluster(1, 2, bind_functions);
  coordinator_options options;
  options.worker_probe_interval = std::chrono::milliseconds(20);
  cluster.run_chief(
      [&cluster](parameter_server_strategy&, cluster_coordinator& coordinator) -> asio::awaitable<void> {
        auto it = co_await coordinator.create_per_worker_dataset(endless).iter();
        // Worker 1 reads its first batches, then its process "dies".
        std::set<std::string> seen;
        for (int i = 0; i < 4; ++i) seen.insert(co_await coordinator.schedule(take_batch, it).get());
        std::string batches;  // for the failure message
        for (const auto& batch : seen) batches += "[" + batch + "] ";
        CHECK_MESSAGE(seen.contains("1,1,3,5,7,9,11,13,15,17,19"), "the batches read: ", batches);
        cluster.on_task("worker", 1, [&cluster] { cluster.task("worker", 1).stop(); });
        // Meanwhile worker 0 carries on alone.
        CHECK(starts_with(co_await coordinator.schedule(take_batch, it).get(), "0,"));
        cluster.restart("worker", 1);
        // Worker 1 comes back with a fresh iterator: its first batch again (TF: rebuilt iterators
        // start fresh); no closure reached it before the iterator existed (that would fail).
        auto returned = first_batch_from_one(coordinator, it);  // named: g++ 12 (temporaries)
        CHECK(co_await std::move(returned) == "1,1,3,5,7,9,11,13,15,17,19");
        co_await coordinator.join();
        // TF's testWorkerFailureCount: the loss is counted once, and so is the iterator rebuilt.
        const auto m = coordinator.metrics();
        CHECK(m.worker_failures == 1);
        CHECK(m.iterator_rebuilds == 1);
        CHECK(m.ps_failures == 0);
      },
      options);
}

namespace {

// While stop_while_building is set, worker 1 stops its own server (its process "dies") in the middle
// of building this dataset, and clears the flag; otherwise it is `endless`. The function runs on
// the worker's build thread, so the stop is posted to the worker's executor (server::stop), where
// it runs before the worker can answer.
const dataset_function<element> dies_building{"test.dies_building"};
std::atomic<bool> stop_while_building{false};

void bind_dying(server& s) {
  bind_functions(s);
  s.bind(dies_building, [&s](input_context context) {
    if (context.worker_index == 1 && stop_while_building.exchange(false)) s.stop();
    return endless_records(context);
  });
}

// Worker 1 builds this dataset for longer than the chief's heartbeat timeout (below).
const dataset_function<element> slow_to_build{"test.slow_to_build"};
// Worker 1 builds this resource as slowly; it says which worker built it.
const resource_function<std::int64_t> slow_resource{"test.slow_resource"};
const worker_function<std::int64_t(per_worker_resource<std::int64_t>)> resource_builder{"test.resource_builder"};
constexpr auto slow_build_heartbeat_timeout = std::chrono::milliseconds(2000);

void bind_slow(server& s) {
  bind_functions(s);
  s.bind(slow_to_build, [](input_context context) {
    if (context.worker_index == 1) std::this_thread::sleep_for(slow_build_heartbeat_timeout * 3 / 2);
    return endless_records(context);
  });
  s.bind(slow_resource, [](input_context context) {
    if (context.worker_index == 1) std::this_thread::sleep_for(slow_build_heartbeat_timeout * 3 / 2);
    return context.worker_index;
  });
  s.bind(resource_builder,
         [](per_worker_resource<std::int64_t> built) -> asio::awaitable<std::int64_t> { co_return *built; });
}

}  // namespace

TEST_CASE("a worker lost while it builds its dataset costs only time: iter() completes, the others take the closures, and it builds the iterator when it comes back") {
  stop_while_building = true;
  local_cluster cluster(1, 2, bind_dying);
  coordinator_options options;
  options.worker_probe_interval = std::chrono::milliseconds(20);
  cluster.run_chief(
      [&cluster](parameter_server_strategy&, cluster_coordinator& coordinator) -> asio::awaitable<void> {
        auto created = coordinator.create_per_worker_dataset(dies_building).iter();  // named: g++ 12
        auto it = co_await std::move(created);
        REQUIRE_MESSAGE(!stop_while_building, "worker 1 never started building the dataset");
        // Worker 0 carries on alone.
        CHECK(starts_with(co_await coordinator.schedule(take_batch, it).get(), "0,"));
        CHECK_NOTHROW((void)coordinator.done());
        cluster.restart("worker", 1);
        // Worker 1 comes back with the iterator built afresh: its first batch.
        auto returned = first_batch_from_one(coordinator, it);  // named: g++ 12 (temporaries)
        CHECK(co_await std::move(returned) == "1,1,3,5,7,9,11,13,15,17,19");
        co_await coordinator.join();
        const auto m = coordinator.metrics();
        CHECK(m.worker_failures == 1);
        CHECK(m.iterator_rebuilds == 1);
      },
      options);
}

TEST_CASE("a dataset or resource function that takes longer than the heartbeat timeout does not lose its worker") {
  // The functions run on the worker's build thread, so its executor answers heartbeats meanwhile.
  // On the executor they held it 3 s: the chief lost the worker after 2 s, and again each time it
  // came back and built the value anew.
  local_cluster cluster(1, 2, bind_slow);
  coordinator_options options;
  options.worker_probe_interval = std::chrono::milliseconds(20);
  strategy_options heartbeats;
  heartbeats.transport.heartbeat_interval = std::chrono::milliseconds(50);
  heartbeats.transport.heartbeat_timeout = slow_build_heartbeat_timeout;
  cluster.run_chief(
      [](parameter_server_strategy&, cluster_coordinator& coordinator) -> asio::awaitable<void> {
        auto created = coordinator.create_per_worker_dataset(slow_to_build).iter();  // named: g++ 12
        auto it = co_await std::move(created);
        auto made = coordinator.create_per_worker_resource(slow_resource);  // named: g++ 12
        auto built = co_await std::move(made);
        REQUIRE_MESSAGE(coordinator.metrics().worker_failures == 0,
                        "the chief lost a worker while it built a value: its executor did not answer heartbeats");
        // Both workers hold both: worker 1 reads its own first batch and uses its own resource.
        auto returned = first_batch_from_one(coordinator, it);  // named: g++ 12 (temporaries)
        CHECK(co_await std::move(returned) == "1,1,3,5,7,9,11,13,15,17,19");
        std::set<std::int64_t> builders;
        for (const auto until = come_back_deadline(); builders.size() < 2 && before(until);) {
          builders.insert(co_await coordinator.schedule(resource_builder, built).get());
        }
        CHECK_MESSAGE(builders.size() == 2, "the resource was used on ", builders.size(), " worker(s)");
        co_await coordinator.join();
        const auto m = coordinator.metrics();
        CHECK(m.worker_failures == 0);
        CHECK(m.iterator_rebuilds == 0);
      },
      options, heartbeats);
}

// Per-worker variables and resources (TF's per_worker_variable=True and _create_per_worker_resources).
namespace {

const worker_function<std::int64_t()> worker_index{"test.worker_index"};
// Adds 1 to the worker's copy and returns {worker index, the copy's first element after the add}.
const worker_function<std::vector<double>(per_worker_variable<float>)> count_here{"test.count_here"};
// Assigns its argument to the worker's copy; returns the worker's index.
const worker_function<std::int64_t(per_worker_variable<float>, xt::xarray<float>)> assign_here{"test.assign_here"};
// Reads the copy as float64 (it is float32).
const worker_function<double(per_worker_variable<double>)> read_as_double{"test.read_as_double"};
// Calls read_all() inside a worker function.
const worker_function<double(per_worker_variable<float>)> read_all_here{"test.read_all_here"};

// A worker's resource: which worker built it, how many workers there were, and how often it was used.
struct counter {
  std::int64_t worker = -1;
  std::int64_t workers = 0;
  std::int64_t uses = 0;
};
std::atomic<int> counters_built[2];
const resource_function<counter> counters{"test.counters"};
const resource_function<counter> broken_counters{"test.broken_counters"};
const resource_function<counter> unbound_counters{"test.unbound_counters"};
const resource_function<std::string> texts{"test.texts"};
// Built at once, except while hold_slow_builds is set: then it waits (on its worker's build thread)
// until it is cleared, having said so in slow_build_waiting. It keeps a returning worker in preparation.
const resource_function<std::string> slow_texts{"test.slow_texts"};
std::atomic<bool> hold_slow_builds{false};
std::atomic<bool> slow_build_waiting{false};
// Uses the worker's counter: returns "worker:built-for:workers:uses".
const worker_function<std::string(per_worker_resource<counter>)> use_counter{"test.use_counter"};
// Uses a counter as a string (it is not).
const worker_function<std::string(per_worker_resource<std::string>)> use_as_text{"test.use_as_text"};

void bind_per_worker(server& s) {
  const std::int64_t index = s.task() == "worker:0" ? 0 : 1;
  s.bind(worker_index, [index]() -> asio::awaitable<std::int64_t> { co_return index; });
  s.bind(count_here, [index](per_worker_variable<float> v) -> asio::awaitable<std::vector<double>> {
    const xt::xarray<float> one = xt::ones<float>(v.shape());
    v.assign_add(one);
    co_return std::vector<double>{static_cast<double>(index), static_cast<double>(v.read().flat(0))};
  });
  s.bind(assign_here, [index](per_worker_variable<float> v, xt::xarray<float> x) -> asio::awaitable<std::int64_t> {
    v.assign(x);
    co_return index;
  });
  s.bind(read_as_double, [](per_worker_variable<double> v) -> asio::awaitable<double> { co_return v.read().flat(0); });
  s.bind(read_all_here, [](per_worker_variable<float> v) -> asio::awaitable<double> {
    const auto all = co_await v.read_all();
    co_return static_cast<double>(all.size());
  });
  s.bind(counters, [](input_context context) {
    ++counters_built[context.worker_index];
    return counter{context.worker_index, context.num_workers, 0};
  });
  s.bind(broken_counters, [](input_context) -> counter { throw std::runtime_error("no table file"); });
  s.bind(texts, [](input_context) { return std::string("text"); });
  s.bind(slow_texts, [](input_context) {
    while (hold_slow_builds) {
      slow_build_waiting = true;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return std::string("slow");
  });
  s.bind(use_counter, [index](per_worker_resource<counter> c) -> asio::awaitable<std::string> {
    ++c->uses;
    co_return std::to_string(index) + ":" + std::to_string(c->worker) + ":" + std::to_string(c->workers) + ":" +
        std::to_string(c->uses);
  });
  s.bind(use_as_text, [](per_worker_resource<std::string> t) -> asio::awaitable<std::string> { co_return *t; });
}

// The sum of every element of every worker's copy.
double sum_of(const std::vector<xt::xarray<float>>& values) {
  double sum = 0;
  for (const auto& v : values) sum += static_cast<double>(xt::sum(v)());
  return sum;
}

}  // namespace

TEST_CASE("a per-worker variable has a copy on every worker, each closure updates its own worker's, read_all returns each (TF's testPerWorkerVariableCreation)") {
  local_cluster cluster(1, 2, bind_per_worker);
  cluster.run_chief([](parameter_server_strategy&, cluster_coordinator& coordinator) -> asio::awaitable<void> {
    const xt::xarray<float> zero{0.0f};
    auto var = co_await coordinator.create_per_worker_variable("var", zero);
    CHECK(var.name() == "var");
    CHECK(var.shape() == shape_type{1});
    CHECK(var.dtype() == dtype::float32);
    auto initial = co_await var.read_all();
    REQUIRE(initial.size() == 2);
    CHECK(sum_of(initial) == 0);
    // TF's test: after each closure, the copies sum to the number of closures run.
    std::map<std::int64_t, double> last;  // per worker: its copy after its latest closure
    for (int ix = 0; ix < 10; ++ix) {
      auto r = coordinator.schedule(count_here, var);
      co_await coordinator.join();
      const auto got = co_await r.get();
      last[static_cast<std::int64_t>(got[0])] = got[1];
      const auto all = co_await var.read_all();
      CHECK(sum_of(all) == ix + 1);
    }
    std::vector<remote_value<std::vector<double>>> results;
    for (int ix = 0; ix < 10; ++ix) results.push_back(coordinator.schedule(count_here, var));
    co_await coordinator.join();
    for (auto& r : results) {
      const auto got = co_await r.get();
      auto& seen = last[static_cast<std::int64_t>(got[0])];
      seen = std::max(seen, got[1]);
    }
    const auto all = co_await var.read_all();
    CHECK(sum_of(all) == 20);
    // Each worker's copy counts the closures that ran there, and nothing else.
    for (std::size_t w = 0; w < 2; ++w) CHECK(static_cast<double>(all[w](0)) == last[static_cast<std::int64_t>(w)]);
    // Assigned on a worker, read back from the chief; the other copy is untouched.
    const xt::xarray<float> seven{7.0f};
    auto assigned = coordinator.schedule(assign_here, var, seven);
    const auto where = static_cast<std::size_t>(co_await assigned.get());
    const auto after = co_await var.read_all();
    CHECK(after[where](0) == 7.0f);
    CHECK(after[1 - where](0) == all[1 - where](0));

    // Two variables with the same name are two variables (as in TF).
    const xt::xarray<double> twos{{2.0, 2.0}, {2.0, 2.0}};
    auto other = co_await coordinator.create_per_worker_variable("var", twos);
    CHECK(other.ref().id != var.ref().id);
    const auto others = co_await other.read_all();
    REQUIRE(others.size() == 2);
    for (const auto& v : others) CHECK(v == twos);
  });
}

TEST_CASE("a per-worker variable refuses bad use, naming what was wrong") {
  local_cluster cluster(1, 2, bind_per_worker);
  cluster.run_chief([](parameter_server_strategy&, cluster_coordinator& coordinator) -> asio::awaitable<void> {
    const xt::xarray<float> initial{1.0f, 2.0f};
    auto var = co_await coordinator.create_per_worker_variable("pw", initial);
    // Its copies live on the workers.
    CHECK_THROWS_WITH_AS((void)var.read(),
                         "per-worker variable 'pw' is read or updated inside a worker function, not on the chief "
                         "(read_all() reads every worker's copy)",
                         error);
    CHECK_THROWS_AS(var.assign_add(initial), error);
    auto inside = coordinator.schedule(read_all_here, var);
    auto e = co_await failure_of(inside.get());
    CHECK(code_of(e) == errc::failed_precondition);
    CHECK(contains(message_of(e), "read_all() of per-worker variable 'pw' is called in a worker function"));
    CHECK_THROWS_AS((void)coordinator.done(), remote_error);
    // An assignment of another shape changes nothing.
    const xt::xarray<float> three{1.0f, 2.0f, 3.0f};
    auto misshapen = coordinator.schedule(assign_here, var, three);
    e = co_await failure_of(misshapen.get());
    CHECK(code_of(e) == errc::invalid_argument);
    CHECK(contains(message_of(e), "assign to per-worker variable 'pw': the value has shape [3], the variable [2]"));
    CHECK_THROWS_AS((void)coordinator.done(), remote_error);
    for (const auto& v : co_await var.read_all()) CHECK(v == initial);
    // Read as another dtype.
    const variable_ref as_double{"pw", dtype::float64, {2}, 0};
    const per_worker_variable<double> wrong_type(var.ref(), as_double);
    auto wrong = coordinator.schedule(read_as_double, wrong_type);
    e = co_await failure_of(wrong.get());
    CHECK(code_of(e) == errc::invalid_argument);
    CHECK(contains(message_of(e), "float32"));
    CHECK(contains(message_of(e), "'pw'"));
    CHECK_THROWS_AS((void)coordinator.done(), remote_error);
    // An id no worker has.
    const variable_ref nowhere{"nowhere", dtype::float32, {2}, 0};
    const per_worker_variable<float> missing(per_worker_ref{999, "nowhere"}, nowhere);
    auto unknown = coordinator.schedule(count_here, missing);
    e = co_await failure_of(unknown.get());
    CHECK(code_of(e) == errc::not_found);
    CHECK(contains(message_of(e), "per-worker variable 999 ('nowhere') does not exist on this worker"));
    CHECK_THROWS_AS((void)coordinator.done(), remote_error);
    // A handle made by hand has no coordinator to read it with.
    e = co_await failure_of(missing.read_all());
    CHECK(code_of(e) == errc::failed_precondition);
    // A resource is not a variable.
    auto c = co_await coordinator.create_per_worker_resource(counters);
    const variable_ref x{"x", dtype::float32, {2}, 0};
    const per_worker_variable<float> not_a_variable(per_worker_ref{c.ref().id, "x"}, x);
    auto mistaken = coordinator.schedule(count_here, not_a_variable);
    e = co_await failure_of(mistaken.get());
    CHECK(code_of(e) == errc::not_found);
    CHECK(contains(message_of(e), "('x') does not exist on this worker"));
    CHECK_THROWS_AS((void)coordinator.done(), remote_error);
  });
}

TEST_CASE("the workers drop a per-worker variable once no handle to it is left on the chief") {
  local_cluster cluster(1, 2, bind_per_worker);
  cluster.run_chief([](parameter_server_strategy&, cluster_coordinator& coordinator) -> asio::awaitable<void> {
    per_worker_ref bare;
    {
      const xt::xarray<float> zero{0.0f};
      auto var = co_await coordinator.create_per_worker_variable("short_lived", zero);
      bare = per_worker_ref{var.ref().id, var.ref().function};  // the id, without the lease
      // The closure's copy keeps it while the closure waits to run.
      auto first = coordinator.schedule(count_here, var);
      CHECK((co_await first.get())[1] == 1.0);
    }
    const auto executor = co_await asio::this_coro::executor;
    std::exception_ptr gone;
    for (int attempt = 0; attempt < 1000 && !gone; ++attempt) {
      co_await asio::post(executor, asio::use_awaitable);
      const variable_ref short_lived{"short_lived", dtype::float32, {1}, 0};
      const per_worker_variable<float> released(bare, short_lived);
      auto late = coordinator.schedule(count_here, released);  // named: g++ 12 (temporaries)
      gone = co_await failure_of(late.get());
    }
    REQUIRE_MESSAGE(gone, "the workers still hold the variable after 1000 closures");
    CHECK(code_of(gone) == errc::not_found);
    CHECK(contains(message_of(gone), "('short_lived') does not exist on this worker"));
    CHECK_THROWS_AS((void)coordinator.done(), remote_error);
  });
}

TEST_CASE("a per-worker resource is built on every worker by its function, and a closure uses its own worker's") {
  counters_built[0] = counters_built[1] = 0;
  local_cluster cluster(1, 2, bind_per_worker);
  cluster.run_chief([](parameter_server_strategy&, cluster_coordinator& coordinator) -> asio::awaitable<void> {
    auto c = co_await coordinator.create_per_worker_resource(counters);
    CHECK(counters_built[0] == 1);
    CHECK(counters_built[1] == 1);
    // Two closures at once go to the two idle workers: each uses its own instance.
    auto a = coordinator.schedule(use_counter, c);
    auto b = coordinator.schedule(use_counter, c);
    const auto first_a = co_await a.get();
    const auto first_b = co_await b.get();
    const std::set<std::string> firsts{first_a, first_b};
    CHECK(firsts == std::set<std::string>{"0:0:2:1", "1:1:2:1"});
    // A closure always finds the instance built for its worker; uses count per worker.
    std::map<std::string, int> uses;
    for (int i = 0; i < 20; ++i) {
      const auto got = co_await coordinator.schedule(use_counter, c).get();
      const auto worker = got.substr(0, 1);
      CHECK(got.substr(0, 6) == worker + ":" + worker + ":2:");
      CHECK(std::stoi(got.substr(6)) == 2 + uses[worker]++);
    }
    // Errors: unbound, failing, used on the chief, used as another type, an id no worker has.
    auto e = co_await failure_of(coordinator.create_per_worker_resource(unbound_counters));
    CHECK(code_of(e) == errc::not_found);
    CHECK(contains(message_of(e), "resource function 'test.unbound_counters' is not bound on worker:"));
    CHECK(contains(message_of(e), "(it binds: test.broken_counters, test.counters, test.slow_texts, test.texts)"));
    e = co_await failure_of(coordinator.create_per_worker_resource(broken_counters));
    CHECK(code_of(e) == errc::unknown);
    CHECK(contains(message_of(e), "resource function 'test.broken_counters' raised: no table file"));
    CHECK_THROWS_WITH_AS((void)c.get(),
                         "a per-worker resource of 'test.counters' is used inside a worker function, not on the chief",
                         error);
    const per_worker_resource<std::string> as_text(c.ref());
    auto misused = coordinator.schedule(use_as_text, as_text);
    e = co_await failure_of(misused.get());
    CHECK(code_of(e) == errc::invalid_argument);
    CHECK(contains(message_of(e), "per-worker resource of 'test.counters' is used as another type"));
    CHECK_THROWS_AS((void)coordinator.done(), remote_error);
    const per_worker_resource<counter> no_counter(per_worker_ref{999, "test.counters"});
    auto absent = coordinator.schedule(use_counter, no_counter);
    e = co_await failure_of(absent.get());
    CHECK(code_of(e) == errc::not_found);
    CHECK(contains(message_of(e), "per-worker resource 999 of 'test.counters' does not exist on this worker"));
    CHECK_THROWS_AS((void)coordinator.done(), remote_error);
    // Released with its last handle on the chief.
    per_worker_ref bare;
    {
      auto t = co_await coordinator.create_per_worker_resource(texts);
      bare = per_worker_ref{t.ref().id, t.ref().function};
    }
    const auto executor = co_await asio::this_coro::executor;
    std::exception_ptr gone;
    for (int attempt = 0; attempt < 1000 && !gone; ++attempt) {
      co_await asio::post(executor, asio::use_awaitable);
      const per_worker_resource<std::string> released(bare);
      auto late = coordinator.schedule(use_as_text, released);  // named: g++ 12 (temporaries)
      gone = co_await failure_of(late.get());
    }
    REQUIRE_MESSAGE(gone, "the workers still hold the resource after 1000 closures");
    CHECK(code_of(gone) == errc::not_found);
    CHECK_THROWS_AS((void)coordinator.done(), remote_error);
  });
}

TEST_CASE("a worker restarted at the same address gets its per-worker variable anew from the initial value and its resource rebuilt; read_all raises while it is lost, read_available skips it") {
  counters_built[0] = counters_built[1] = 0;
  local_cluster cluster(1, 2, bind_per_worker);
  coordinator_options options;
  options.worker_probe_interval = std::chrono::milliseconds(20);
  cluster.run_chief(
      [&cluster](parameter_server_strategy&, cluster_coordinator& coordinator) -> asio::awaitable<void> {
        const xt::xarray<float> initial{10.0f, 20.0f};
        auto var = co_await coordinator.create_per_worker_variable("steps", initial);
        auto c = co_await coordinator.create_per_worker_resource(counters);
        // Both workers count a few closures.
        std::map<double, double> copies;  // worker -> its copy's first element
        for (const auto until = come_back_deadline(); copies.size() < 2 && before(until);) {
          auto a = coordinator.schedule(count_here, var);
          auto b = coordinator.schedule(count_here, var);
          for (auto* r : {&a, &b}) {
            const auto got = co_await r->get();
            copies[got[0]] = got[1];
          }
        }
        REQUIRE(copies.size() == 2);
        CHECK(copies[1.0] > 10.0);
        (void)co_await coordinator.schedule(use_counter, c).get();
        co_await coordinator.join();

        // Worker 1's process "dies": read_all raises, naming it (TF raises too).
        cluster.on_task("worker", 1, [&cluster] { cluster.task("worker", 1).stop(); });
        auto e = co_await failure_of(var.read_all());
        REQUIRE(e);
        CHECK(code_of(e) == errc::unavailable);
        try {
          std::rethrow_exception(e);
        } catch (const remote_error& r) {
          CHECK(r.origin_task() == "worker:1");
        }
        CHECK(contains(message_of(e), "per-worker variable 'steps' cannot be read on worker:1"));
        // read_available() reads the workers that are there: worker 0's copy, nothing for worker 1.
        const auto available = co_await var.read_available();
        REQUIRE(available.size() == 2);
        REQUIRE(available[0].has_value());
        CHECK((*available[0])(1) == (*available[0])(0) + 10.0f);
        CHECK((*available[0])(0) > 10.0f);
        CHECK_FALSE(available[1].has_value());

        // It comes back: its copy starts again from the initial value, its resource is built again,
        // before any closure reaches it.
        cluster.restart("worker", 1);
        const int built_before = counters_built[1];
        std::vector<double> from_one;
        for (const auto until = come_back_deadline(); from_one.empty() && before(until);) {
          const auto got = co_await coordinator.schedule(count_here, var).get();
          if (got[0] == 1.0) from_one = got;
        }
        REQUIRE(!from_one.empty());
        CHECK(from_one[1] == 11.0);
        CHECK(counters_built[1] == built_before + 1);
        std::string used;
        for (const auto until = come_back_deadline(); !used.starts_with("1:") && before(until);) {
          used = co_await coordinator.schedule(use_counter, c).get();
        }
        CHECK(used == "1:1:2:1");  // a fresh instance, built for worker 1
        co_await coordinator.join();
        const auto all = co_await var.read_all();
        REQUIRE(all.size() == 2);
        CHECK(all[1](1) == all[1](0) + 10.0f);
        CHECK(all[1](0) >= 11.0f);
      },
      options);
}

TEST_CASE("a per-worker variable made while a worker is being prepared to come back reaches that worker too") {
  hold_slow_builds = false;
  slow_build_waiting = false;
  local_cluster cluster(1, 2, bind_per_worker);
  coordinator_options options;
  options.worker_probe_interval = std::chrono::milliseconds(20);
  cluster.run_chief(
      [&cluster](parameter_server_strategy&, cluster_coordinator& coordinator) -> asio::awaitable<void> {
        const auto slow = co_await coordinator.create_per_worker_resource(slow_texts);
        // Worker 1 goes and comes back; rebuilding `slow` holds it in preparation, not yet ready.
        hold_slow_builds = true;
        cluster.on_task("worker", 1, [&cluster] { cluster.task("worker", 1).stop(); });
        cluster.restart("worker", 1);
        asio::steady_timer timer(co_await asio::this_coro::executor);
        for (const auto until = come_back_deadline(); !slow_build_waiting && before(until);) {
          timer.expires_after(std::chrono::milliseconds(1));
          co_await timer.async_wait(asio::use_awaitable);
        }
        REQUIRE_MESSAGE(slow_build_waiting, "the returning worker never rebuilt its resource");
        // Made now, it goes to worker 0 only: worker 1 must get it from its preparation.
        const xt::xarray<float> initial{10.0f};
        auto var = co_await coordinator.create_per_worker_variable("late", initial);
        hold_slow_builds = false;
        std::vector<double> from_one;
        for (const auto until = come_back_deadline(); from_one.empty() && before(until);) {
          auto counted = coordinator.schedule(count_here, var);  // named: g++ 12 (temporaries)
          std::vector<double> got;
          std::exception_ptr failure;
          try {
            got = co_await counted.get();
          } catch (...) {
            failure = std::current_exception();  // worker 1 without the variable: not_found
          }
          REQUIRE_MESSAGE(!failure, pscoro::testing::describe_exception(failure));
          if (got[0] == 1.0) from_one = got;
        }
        REQUIRE_MESSAGE(!from_one.empty(), "worker 1 never ran a closure after it came back");
        CHECK(from_one[1] == 11.0);  // its own copy, from the initial value
        (void)slow;
      },
      options);
}

namespace {

// Makes a slow_texts resource; `failure` gets what that throws, `done` says it ended.
asio::awaitable<void> make_slow_texts(cluster_coordinator& coordinator, std::shared_ptr<std::exception_ptr> failure,
                                      std::shared_ptr<bool> done) {
  try {
    auto made = coordinator.create_per_worker_resource(slow_texts);  // named: g++ 12 (temporaries)
    (void)co_await std::move(made);
  } catch (...) {
    *failure = std::current_exception();
  }
  *done = true;
}

}  // namespace

TEST_CASE("a per-worker value still being made when the chief closes fails with unavailable, naming the worker") {
  hold_slow_builds = true;
  slow_build_waiting = false;
  local_cluster cluster(1, 2, bind_per_worker);
  cluster.run_chief([](parameter_server_strategy& strategy, cluster_coordinator& coordinator) -> asio::awaitable<void> {
    auto failure = std::make_shared<std::exception_ptr>();
    auto done = std::make_shared<bool>(false);
    const auto executor = co_await asio::this_coro::executor;
    asio::co_spawn(executor, make_slow_texts(coordinator, failure, done), asio::detached);
    asio::steady_timer timer(executor);
    for (const auto until = come_back_deadline(); !slow_build_waiting && before(until);) {
      timer.expires_after(std::chrono::milliseconds(1));
      co_await timer.async_wait(asio::use_awaitable);
    }
    REQUIRE_MESSAGE(slow_build_waiting, "no worker started building the resource");
    // The workers hold their answers; the chief closes (without ending the job: local_cluster's
    // servers outlive it), then lets them go.
    strategy.close();
    hold_slow_builds = false;
    for (const auto until = come_back_deadline(); !*done && before(until);) {
      timer.expires_after(std::chrono::milliseconds(1));
      co_await timer.async_wait(asio::use_awaitable);
    }
    REQUIRE_MESSAGE(*done, "the creation never ended after the chief closed");
    REQUIRE_MESSAGE(*failure, "the creation succeeded, though no worker holds the resource");
    CHECK(code_of(*failure) == errc::unavailable);
    CHECK(contains(message_of(*failure), "'test.slow_texts' could not be made on worker:"));
    CHECK(contains(message_of(*failure), "the chief closed its connections"));
  });
}

namespace {

// Set by the watchdog of the test below when it had to let a held build go.
std::atomic<bool> build_let_go_by_watchdog{false};

void bind_data_and_values(server& s) {
  bind_functions(s);
  bind_per_worker(s);
}

}  // namespace

TEST_CASE("while a worker builds a per-worker value, closures go on reading its iterators") {
  // Dataset and resource functions run on the worker's build thread, pipelines on its input thread:
  // a slow build (a resource that loads a table) does not stall the closures reading the worker's
  // data. When both shared one thread, next_async waited for the build; here that would be until
  // the watchdog lets the build go (60 s), and the test fails.
  hold_slow_builds = true;
  slow_build_waiting = false;
  build_let_go_by_watchdog = false;
  std::atomic<bool> finished{false};
  std::thread watchdog([&finished] {
    for (const auto until = come_back_deadline(); !finished && before(until);) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (!finished) {
      build_let_go_by_watchdog = true;
      hold_slow_builds = false;
    }
  });
  // However the test ends (a failed REQUIRE throws): the build is let go and the watchdog joined
  // (a joinable std::thread's destructor would end the program), and, declared after the cluster,
  // the build is let go before the cluster's workers join their build threads.
  struct end_watchdog {
    std::atomic<bool>& finished;
    std::thread& watchdog;
    ~end_watchdog() {
      finished = true;
      hold_slow_builds = false;
      watchdog.join();
    }
  } watchdog_ends{finished, watchdog};
  local_cluster cluster(1, 1, bind_data_and_values);
  struct let_build_go {
    ~let_build_go() { hold_slow_builds = false; }
  } build_goes_first;
  cluster.run_chief([](parameter_server_strategy&, cluster_coordinator& coordinator) -> asio::awaitable<void> {
    auto created = coordinator.create_per_worker_dataset(endless).iter();  // named: g++ 12
    auto it = co_await std::move(created);
    auto failure = std::make_shared<std::exception_ptr>();
    auto done = std::make_shared<bool>(false);
    const auto executor = co_await asio::this_coro::executor;
    asio::co_spawn(executor, make_slow_texts(coordinator, failure, done), asio::detached);
    asio::steady_timer timer(executor);
    while (!slow_build_waiting && !build_let_go_by_watchdog) {
      timer.expires_after(std::chrono::milliseconds(1));
      co_await timer.async_wait(asio::use_awaitable);
    }
    REQUIRE_MESSAGE(slow_build_waiting, "the worker never started building the resource");
    auto taken = coordinator.schedule(take_batch, it).get();  // named: g++ 12
    const auto batch = co_await std::move(taken);
    CHECK_MESSAGE(!build_let_go_by_watchdog, "next_async waited for the resource function to return");
    CHECK(batch == "0,0,1,2,3,4,5,6,7,8,9");
    hold_slow_builds = false;
    for (const auto until = come_back_deadline(); !*done && before(until);) {
      timer.expires_after(std::chrono::milliseconds(1));
      co_await timer.async_wait(asio::use_awaitable);
    }
    REQUIRE_MESSAGE(*done, "the resource was never made once its function was let go");
    CHECK_FALSE(*failure);
  });
}

namespace {

// Drain: a resource whose every instance says when it is dropped (the worker released it), and a
// function that counts its runs per worker, optionally held at a gate until it opens.
struct dropped_when_released {
  explicit dropped_when_released(std::int64_t worker)
      : token(new std::int64_t(worker), [](std::int64_t* w) {
          ++drain_resources_dropped[*w];
          delete w;
        }) {}
  std::shared_ptr<std::int64_t> token;  // moved-from copies hold nothing and count nothing
  static std::atomic<int> drain_resources_dropped[2];
};
std::atomic<int> dropped_when_released::drain_resources_dropped[2];
std::atomic<int> drain_resources_built[2];
std::atomic<int> drain_runs[2];
std::atomic<int> drain_gated_started{0};
std::atomic<bool> drain_gate_open{false};
const resource_function<dropped_when_released> drain_resources{"test.drain_resources"};
// Returns the index of the worker it ran on; with `gated`, waits for drain_gate_open first.
const worker_function<std::int64_t(per_worker_resource<dropped_when_released>, bool)> counted_run{"test.counted_run"};

asio::awaitable<void> wait_until(bool (*condition)()) {
  asio::steady_timer timer(co_await asio::this_coro::executor);
  while (!condition()) {
    timer.expires_after(std::chrono::milliseconds(1));
    co_await timer.async_wait(asio::use_awaitable);
  }
}

void bind_drain_functions(server& s) {
  bind_per_worker(s);
  const std::int64_t index = s.task() == "worker:0" ? 0 : 1;
  s.bind(drain_resources, [](input_context context) {
    ++drain_resources_built[context.worker_index];
    return dropped_when_released(context.worker_index);
  });
  s.bind(counted_run, [index](per_worker_resource<dropped_when_released>, bool gated) -> asio::awaitable<std::int64_t> {
    if (gated) {
      ++drain_gated_started;
      co_await wait_until([] { return drain_gate_open.load(); });
    }
    ++drain_runs[index];
    co_return index;
  });
}

}  // namespace

TEST_CASE("drain: a worker takes no new closure, what ran there finishes and counts once, and it drops its per-worker values; resume brings it back") {
  for (auto& n : dropped_when_released::drain_resources_dropped) n = 0;
  for (auto& n : drain_resources_built) n = 0;
  for (auto& n : drain_runs) n = 0;
  drain_gated_started = 0;
  drain_gate_open = false;
  local_cluster cluster(1, 2, bind_drain_functions);
  cluster.run_chief([](parameter_server_strategy& strategy, cluster_coordinator& coordinator) -> asio::awaitable<void> {
    auto resource = co_await coordinator.create_per_worker_resource(drain_resources);
    const xt::xarray<float> zero{0.0f};
    auto var = co_await coordinator.create_per_worker_variable("drained", zero);
    CHECK(drain_resources_built[0] == 1);
    CHECK(drain_resources_built[1] == 1);
    // One held closure on each worker (the least busy takes each): both run when the drain starts.
    std::vector<remote_value<std::int64_t>> results;
    results.push_back(coordinator.schedule(counted_run, resource, true));
    results.push_back(coordinator.schedule(counted_run, resource, true));
    co_await wait_until([] { return drain_gated_started.load() == 2; });
    bool drained = false;
    std::exception_ptr drain_failure;
    coordinator.async_drain(1, [&](std::exception_ptr e) {
      drained = true;
      drain_failure = e;
    });
    constexpr int more = 20;
    for (int k = 0; k < more; ++k) results.push_back(coordinator.schedule(counted_run, resource, false));
    // Worker 1 still runs its held closure: not drained yet; worker 0 takes every new one, after its own.
    CHECK_FALSE(drained);
    drain_gate_open = true;
    co_await coordinator.join();
    co_await coordinator.drain(1);  // drained already: completes at once, after the first drain
    CHECK(drained);
    CHECK_MESSAGE(drain_failure == nullptr, drain_failure);
    const auto where = co_await cluster_coordinator::fetch(results);
    CHECK(std::count(where.begin(), where.end(), 1) == 1);  // only its held closure
    CHECK(std::count(where.begin(), where.end(), 0) == more + 1);
    CHECK(drain_runs[0] == more + 1);  // each closure ran once
    CHECK(drain_runs[1] == 1);
    // It dropped its resource (told without waiting for its answer); worker 0 keeps its own.
    co_await wait_until([] { return dropped_when_released::drain_resources_dropped[1].load() == 1; });
    CHECK(dropped_when_released::drain_resources_dropped[0] == 0);
    // Its per-worker variable's copy is gone: read_all leaves it out, read_available has no value.
    CHECK((co_await var.read_all()).size() == 1);
    const auto available = co_await var.read_available();
    REQUIRE(available.size() == 2);
    CHECK(available[0].has_value());
    CHECK_FALSE(available[1].has_value());
    // A per-worker value made while it is drained is not made there.
    auto later = co_await coordinator.create_per_worker_resource(drain_resources);
    CHECK(drain_resources_built[0] == 2);
    CHECK(drain_resources_built[1] == 1);
    const auto metrics_now = coordinator.metrics();
    CHECK(metrics_now.worker_failures == 0);  // a drain is no failure
    CHECK(strategy.num_workers() == 2);

    const auto unknown = co_await failure_of(coordinator.drain(2));
    CHECK_MESSAGE(code_of(unknown) == errc::invalid_argument, unknown);
    CHECK_THROWS_WITH_AS(coordinator.resume(7), doctest::Contains("the cluster has workers 0..1"), error);

    // Resumed, it makes both live resources again before it takes a closure, then takes closures.
    coordinator.resume(1);
    bool back = false;
    for (const auto until = come_back_deadline(); !back && before(until);) {
      back = co_await coordinator.schedule(counted_run, later, false).get() == 1;
    }
    CHECK(back);
    CHECK(drain_resources_built[1] == 3);
    CHECK((co_await var.read_all()).size() == 2);
  });
}

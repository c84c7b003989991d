// A lost ps restored in place, on an in-process cluster of real servers: the chief holds the
// closures, waits for the ps to answer at its address again, makes its shards and table parts again
// and restores only them from the newest checkpoint; the other ps keep their values, and the held
// closures run. Without a checkpoint, or without the ps back in time, the run fails naming it.
#include "local_cluster.hpp"
#include "test_support.hpp"

#include <pscoro/checkpoint.hpp>
#include <pscoro/coordinator.hpp>
#include <pscoro/hash_table.hpp>
#include <pscoro/strategy.hpp>

#include "common/id_hash.hpp"

#include <asio/steady_timer.hpp>
#include <xtensor/xadapt.hpp>
#include <xtensor/xbuilder.hpp>

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <vector>

using namespace pscoro;
using pscoro::testing::code_of;
using pscoro::testing::failure_of;
using pscoro::testing::local_cluster;
using pscoro::testing::message_of;

namespace fs = std::filesystem;

namespace {

struct restore_scratch {
  fs::path dir = fs::temp_directory_path() / ("pscoro-ps-restore-" + std::to_string(::getpid()));
  restore_scratch() {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~restore_scratch() { fs::remove_all(dir); }
};

// Waits (up to a minute of 10 ms naps) until `done()`.
template <class F>
asio::awaitable<bool> eventually(F done) {
  asio::steady_timer nap(co_await asio::this_coro::executor);
  for (int i = 0; i < 6000 && !done(); ++i) {
    nap.expires_after(std::chrono::milliseconds(10));
    co_await nap.async_wait(asio::use_awaitable);
  }
  co_return done();
}

xt::xarray<float> filled_with(std::size_t n, float value) { return xt::xarray<float>(std::vector<std::size_t>{n}, value); }

const shape_type four{4};
const initializer zeros = initializers::zeros{};

// Restores that append their reports to `reports`, waiting up to a minute for the ps.
ps_restore_options recording_into(std::vector<ps_restore_report>& reports) {
  ps_restore_options options;
  options.wait_for_ps = std::chrono::minutes(1);
  options.on_restored = [&reports](const ps_restore_report& r) { reports.push_back(r); };
  return options;
}

}  // namespace

TEST_CASE("a lost ps is restored in place from the newest checkpoint; the other ps keep their values") {
  restore_scratch scratch;
  const std::string lost_task = "ps:1";
  local_cluster cluster(2, 1, pscoro::testing::bind_add_one);
  cluster.run_chief([&](parameter_server_strategy& strategy, cluster_coordinator& coordinator) -> asio::awaitable<void> {
    auto on_ps0 = co_await strategy.scope().create_variable<float>("on_ps0", four, zeros);
    auto on_ps1 = co_await strategy.scope().create_variable<float>("on_ps1", four, zeros);
    REQUIRE(on_ps0.ref().ps_task == 0);
    REQUIRE(on_ps1.ref().ps_task == 1);
    hash_table_options options;
    options.dim = 4;
    options.buckets = 16;
    auto table = co_await strategy.scope().create_hash_table<float>("emb", options);
    std::vector<std::int64_t> raw;
    for (std::int64_t id = 0; id < 64; ++id) raw.push_back(id * 1000003);
    const xt::xarray<std::int64_t> ids = xt::adapt(raw, {raw.size()});
    const hash_lookup_options inserting{.insert = true};
    const xt::xarray<float> gradient = xt::ones<float>(std::vector<std::size_t>{raw.size(), 4});
    const optimizer opt = optimizers::adagrad{.learning_rate = 0.1};

    checkpoint ckpt(strategy);
    ckpt.track(on_ps0).track(on_ps1).track(table);
    checkpoint_manager manager(ckpt, scratch.dir, 2);
    std::vector<ps_restore_report> reports;
    manager.restore_lost_ps(recording_into(reports));

    co_await on_ps0.assign(filled_with(4, 1.0f));
    co_await on_ps1.assign(filled_with(4, 2.0f));
    co_await table.lookup(ids, inserting);
    co_await table.apply_gradients(opt, ids, gradient);
    const auto saved_rows = co_await table.lookup(ids);
    ckpt.set_step(7);
    co_await manager.save();
    // After the save: values the lost ps loses, and the other keeps.
    co_await on_ps0.assign(filled_with(4, 10.0f));
    co_await on_ps1.assign(filled_with(4, 20.0f));
    co_await table.apply_gradients(opt, ids, gradient);
    const auto later_rows = co_await table.lookup(ids);

    // ps:1 goes down, then comes back empty at its address (its process restarted).
    cluster.stop("ps", 1);
    const bool noticed = co_await eventually([&] { return coordinator.metrics().ps_failures > 0; });
    CHECK(noticed);
    cluster.restart("ps", 1);
    const bool restored = co_await eventually([&] { return !reports.empty(); });
    REQUIRE(restored);
    CHECK(reports.front().ps == lost_task);
    CHECK(reports.front().step == 7);
    CHECK(reports.front().checkpoint == scratch.dir / "ckpt-1.safetensors");
    CHECK(reports.front().seconds > 0);

    // ps:1 holds the checkpoint's values, ps:0 what it had.
    CHECK((co_await on_ps1.read()) == filled_with(4, 2.0f));
    CHECK((co_await on_ps0.read()) == filled_with(4, 10.0f));
    const auto rows = co_await table.lookup(ids);
    std::size_t restored_rows = 0;
    for (std::size_t k = 0; k < raw.size(); ++k) {
      CAPTURE(raw[k]);
      const bool lost = common::ps_index_of(raw[k], table.ref()) == 1;
      const auto& expected = lost ? saved_rows : later_rows;
      CHECK(std::memcmp(&rows(k, 0), &expected(k, 0), 4 * sizeof(float)) == 0);
      restored_rows += lost ? 1 : 0;
    }
    CHECK(restored_rows > 0);
    CHECK(restored_rows < raw.size());
    // The slots came back too: one more step on ps:1's rows is the step after the checkpoint's.
    co_await table.apply_gradients(opt, ids, gradient);
    const auto stepped = co_await table.lookup(ids);
    for (std::size_t k = 0; k < raw.size(); ++k) {
      if (common::ps_index_of(raw[k], table.ref()) != 1) continue;
      CAPTURE(raw[k]);
      CHECK(std::memcmp(&stepped(k, 0), &later_rows(k, 0), 4 * sizeof(float)) == 0);
    }
    // Closures run again, on both ps.
    auto sum0 = coordinator.schedule(pscoro::testing::add_one, on_ps0);
    auto sum1 = coordinator.schedule(pscoro::testing::add_one, on_ps1);
    co_await coordinator.join();
    CHECK(co_await sum0.get() == 44.0);
    CHECK(co_await sum1.get() == 12.0);
    CHECK(coordinator.metrics().ps_failures >= 1);
  });
}

TEST_CASE("closures scheduled while a lost ps is restored wait, and run on the restored values") {
  restore_scratch scratch;
  local_cluster cluster(2, 1, pscoro::testing::bind_add_one);
  cluster.run_chief([&](parameter_server_strategy& strategy, cluster_coordinator& coordinator) -> asio::awaitable<void> {
    auto on_ps0 = co_await strategy.scope().create_variable<float>("on_ps0", four, zeros);
    auto on_ps1 = co_await strategy.scope().create_variable<float>("on_ps1", four, zeros);
    checkpoint ckpt(strategy);
    ckpt.track(on_ps0).track(on_ps1);
    checkpoint_manager manager(ckpt, scratch.dir, 2);
    std::vector<ps_restore_report> reports;
    manager.restore_lost_ps(recording_into(reports));
    co_await manager.save();  // both zeros
    cluster.stop("ps", 1);
    const bool noticed = co_await eventually([&] { return coordinator.metrics().ps_failures > 0; });
    CHECK(noticed);
    // Held: nothing reaches ps:1 while it is down.
    std::vector<remote_value<double>> sums;
    for (int i = 0; i < 5; ++i) sums.push_back(coordinator.schedule(pscoro::testing::add_one, on_ps1));
    cluster.restart("ps", 1);
    // A save while ps:1 is being restored (the chief probes its address every 250 ms) waits for
    // the restore: it does not read a ps that holds nothing yet.
    CHECK(reports.empty());
    const auto saved = co_await manager.save();
    CHECK(reports.size() == 1);
    CHECK(checkpoint_reader(saved).contains("on_ps1"));
    co_await coordinator.join();
    CHECK(reports.size() == 1);
    double last = 0;
    for (auto& s : sums) last = std::max(last, co_await s.get());
    CHECK(last == 20.0);  // 5 closures of +1 on 4 zeros: every one ran once, on the restored zeros
    CHECK((co_await on_ps1.read()) == filled_with(4, 5.0f));
  });
}

TEST_CASE("a lost ps with no checkpoint to restore from, or that does not come back, fails the run naming it") {
  restore_scratch scratch;
  const std::string no_checkpoint =
      "ps:1 was lost and there is no checkpoint in " + (scratch.dir / "empty").string() + " to restore it from";
  const std::string not_back = "parameter server ps:1 was lost and did not answer at";
  const std::string waited = "within 300 ms";
  local_cluster cluster(2, 1, pscoro::testing::bind_add_one);
  cluster.run_chief([&](parameter_server_strategy& strategy, cluster_coordinator& coordinator) -> asio::awaitable<void> {
    auto on_ps0 = co_await strategy.scope().create_variable<float>("on_ps0", four, zeros);
    auto on_ps1 = co_await strategy.scope().create_variable<float>("on_ps1", four, zeros);
    checkpoint ckpt(strategy);
    ckpt.track(on_ps0).track(on_ps1);
    checkpoint_manager manager(ckpt, scratch.dir / "empty", 2);  // nothing saved there
    std::vector<ps_restore_report> reports;
    manager.restore_lost_ps(recording_into(reports));
    cluster.restart("ps", 1);
    auto sum = coordinator.schedule(pscoro::testing::add_one, on_ps1);
    const auto failure = co_await failure_of(coordinator.join());
    CHECK(code_of(failure) == errc::failed_precondition);
    CHECK(contains(message_of(failure), no_checkpoint));
  });
  ps_restore_options briefly;
  briefly.wait_for_ps = std::chrono::milliseconds(300);
  local_cluster gone(2, 1, pscoro::testing::bind_add_one);
  gone.run_chief([&](parameter_server_strategy& strategy, cluster_coordinator& coordinator) -> asio::awaitable<void> {
    auto on_ps0 = co_await strategy.scope().create_variable<float>("on_ps0", four, zeros);
    auto on_ps1 = co_await strategy.scope().create_variable<float>("on_ps1", four, zeros);
    checkpoint ckpt(strategy);
    ckpt.track(on_ps0).track(on_ps1);
    checkpoint_manager manager(ckpt, scratch.dir / "gone", 2);
    co_await manager.save();
    manager.restore_lost_ps(briefly);
    gone.stop("ps", 1);  // and never back
    auto sum = coordinator.schedule(pscoro::testing::add_one, on_ps1);
    const auto failure = co_await failure_of(coordinator.join());
    CHECK(code_of(failure) == errc::unavailable);
    CHECK(contains(message_of(failure), not_back));
    CHECK(contains(message_of(failure), waited));
  });
}

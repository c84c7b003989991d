// Incremental saves of hash tables on in-process clusters of real servers: a whole save and three
// increments restore, onto another ps count, exactly the rows, slots, times and counters a whole
// save of the live table holds; an increment's chain missing a file, or holding a corrupt one, is
// data_loss naming it and changes nothing; a table no part can build on goes whole; the manager
// saves one file in N whole and keeps every file a kept one builds on.
#include "local_cluster.hpp"
#include "test_support.hpp"

#include <pscoro/checkpoint.hpp>
#include <pscoro/coordinator.hpp>
#include <pscoro/hash_table.hpp>
#include <pscoro/strategy.hpp>

#include <nlohmann/json.hpp>
#include <xtensor/xadapt.hpp>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

using namespace pscoro;
using pscoro::testing::code_of;
using pscoro::testing::failure_of;
using pscoro::testing::local_cluster;
using pscoro::testing::message_of;

namespace fs = std::filesystem;

namespace {

struct increments_scratch {
  fs::path dir = fs::temp_directory_path() / ("pscoro-table-increments-" + std::to_string(::getpid()));
  increments_scratch() {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~increments_scratch() { fs::remove_all(dir); }
};

// A table whose rows come and go: admission after two sightings, at most 300 rows per ps (a new
// row replaces the least recently named of a sample: a row dropped so is not merely idle, and a
// restore that kept it would show).
hash_table_options churning_table() {
  hash_table_options options;
  options.dim = 4;
  options.initializer = initializers::random_normal{.stddev = 0.1, .seed = 7};
  options.buckets = 32;
  options.admission = admission::min_count{.count = 2, .counters = 4096};
  options.eviction = eviction::capacity{.rows_per_ps = 300};
  return options;
}

// Round `r` of training at clock r: a window of 200 ids that moves by 50 a round and 20 ids seen in
// this round only, each seen twice; an Adam step on them; 30 ids of an older window read only; then
// the clock moves to r + 1. On 2 ps the
// table fills to about 600 rows; a round changes about 220 and drops about 70.
asio::awaitable<void> train_round(hash_table<float>& table, int r) {
  std::vector<std::int64_t> raw;
  for (std::int64_t k = 0; k < 200; ++k) raw.push_back((r * 50 + k) * 7919 - 1'000'000);
  for (std::int64_t k = 0; k < 20; ++k) raw.push_back(-(r * 20 + k) - 5);
  const xt::xarray<std::int64_t> ids = xt::adapt(raw, {raw.size()});
  const hash_lookup_options inserting{.insert = true};
  co_await table.lookup(ids, inserting);
  co_await table.lookup(ids, inserting);
  xt::xarray<float> gradient = xt::xarray<float>::from_shape({raw.size(), 4});
  for (std::size_t k = 0; k < gradient.size(); ++k) gradient.data()[k] = 0.01f * static_cast<float>(k % 13) - 0.05f;
  const optimizer opt = optimizers::adam{.learning_rate = 0.05};
  co_await table.apply_gradients(opt, ids, gradient);
  // Rows only read are named now, and that is state too (when they go idle).
  std::vector<std::int64_t> read_only;
  for (std::int64_t k = 0; k < 30; ++k) read_only.push_back((r * 50 - 100 + k) * 7919 - 1'000'000);
  const xt::xarray<std::int64_t> read_ids = xt::adapt(read_only, {read_only.size()});
  co_await table.lookup(read_ids);
  co_await table.advance_clock(static_cast<std::uint64_t>(r + 1));
}

// What a file holds of table `name`, by id: the row, its slots and when it was last named; and the
// table's record (clock, steps, optimizer) and admission counters.
struct table_contents {
  std::map<std::int64_t, std::vector<std::byte>> rows;  // values, then slots, then last named
  nlohmann::json record;
  std::vector<std::byte> counters;
};

table_contents contents_of(const fs::path& path, const std::string& name) {
  checkpoint_reader reader(path);
  table_contents out;
  out.record = nlohmann::json::parse(reader.metadata().at("tables"))[name];
  const auto ids = reader.read_tensor(name + "/ids");
  std::vector<tensor> columns{reader.read_tensor(name), reader.read_tensor(name + "/last_named")};
  for (const auto& slot : out.record["slots"]) columns.push_back(reader.read_tensor(name + "/" + slot.get<std::string>()));
  const std::size_t n = ids.size();
  for (std::size_t k = 0; k < n; ++k) {
    std::vector<std::byte> row;
    for (const auto& column : columns) {
      const std::size_t width = column.size_bytes() / n;
      const auto* at = column.bytes().data() + k * width;
      row.insert(row.end(), at, at + width);
    }
    out.rows.emplace(ids.data<std::int64_t>()[k], std::move(row));
  }
  if (reader.contains(name + "/admission_counters")) {
    const auto counters = reader.read_tensor(name + "/admission_counters");
    out.counters.assign(counters.bytes().data(), counters.bytes().data() + counters.size_bytes());
  }
  out.record.erase("increment");
  return out;
}

std::size_t rows_in(const fs::path& path, const std::string& name) {
  return checkpoint_reader(path).shape(name + "/ids")[0];
}

}  // namespace

TEST_CASE("a whole save and three increments restore, onto 3 ps, the rows, slots, times and counters of the live table") {
  increments_scratch scratch;
  const fs::path whole = scratch.dir / "ckpt-0.safetensors";
  const std::vector<fs::path> increments{scratch.dir / "ckpt-1.safetensors", scratch.dir / "ckpt-2.safetensors",
                                         scratch.dir / "ckpt-3.safetensors"};
  const fs::path live = scratch.dir / "live.safetensors";
  local_cluster two(2, 1);
  two.run_chief([&](parameter_server_strategy& strategy, cluster_coordinator&) -> asio::awaitable<void> {
    auto table = co_await strategy.scope().create_hash_table<float>("emb", churning_table());
    checkpoint ckpt;
    ckpt.track(table);
    ckpt.set_chunk_bytes(2048);  // many pieces per part
    int round = 0;
    for (; round < 4; ++round) co_await train_round(table, round);
    co_await ckpt.save(whole);
    for (const auto& path : increments) {
      co_await train_round(table, round++);
      co_await ckpt.save(path, {.incremental = true});
    }
    // The live table, whole, from another checkpoint (the first one's next increment would build on
    // increments.back(): a save of its own does not disturb it).
    checkpoint whole_now;
    whole_now.track(table);
    co_await whole_now.save(live);
  });
  // Each increment builds on the file before it and holds fewer rows than the table (a round's).
  const auto live_rows = rows_in(live, "emb");
  CHECK(live_rows > 0);
  std::size_t dropped = 0;
  fs::path previous = whole;
  for (const auto& path : increments) {
    CAPTURE(path);
    checkpoint_reader reader(path);
    REQUIRE(reader.base());
    CHECK(reader.base()->path == previous);
    CHECK(reader.base()->save_id == checkpoint_reader(previous).save_id());
    CHECK(rows_in(path, "emb") < live_rows);
    dropped += reader.shape("emb/dropped")[0];
    previous = path;
  }
  CHECK(dropped > 0);  // rows went between saves: the increments drop them
  CHECK_FALSE(checkpoint_reader(whole).base());

  const fs::path restored = scratch.dir / "restored.safetensors";
  local_cluster three(3, 1);
  three.run_chief([&](parameter_server_strategy& strategy, cluster_coordinator&) -> asio::awaitable<void> {
    auto table = co_await strategy.scope().create_hash_table<float>("emb", churning_table());
    checkpoint ckpt;
    ckpt.track(table);
    ckpt.set_chunk_bytes(2048);
    co_await ckpt.restore(increments.back());
    checkpoint whole_now;
    whole_now.track(table);
    co_await whole_now.save(restored);
  });
  const auto expected = contents_of(live, "emb");
  const auto got = contents_of(restored, "emb");
  CHECK(got.rows.size() == expected.rows.size());
  CHECK(got.rows == expected.rows);
  CHECK(got.record == expected.record);
  CHECK(got.counters == expected.counters);
}

TEST_CASE("an increment whose base is missing, replaced or corrupt is data_loss naming that file; nothing changes") {
  increments_scratch scratch;
  const fs::path base = scratch.dir / "base.safetensors";
  const fs::path increment = scratch.dir / "increment.safetensors";
  const xt::xarray<std::int64_t> probe{42, 43, 44};
  local_cluster cluster(2, 1);
  cluster.run_chief([&](parameter_server_strategy& strategy, cluster_coordinator&) -> asio::awaitable<void> {
    auto table = co_await strategy.scope().create_hash_table<float>("emb", churning_table());
    checkpoint ckpt;
    ckpt.track(table);
    co_await train_round(table, 0);
    co_await ckpt.save(base);
    co_await train_round(table, 1);
    co_await ckpt.save(increment, {.incremental = true});
    const hash_lookup_options inserting{.insert = true};
    co_await table.lookup(probe, inserting);
    co_await table.lookup(probe, inserting);
    const auto before = co_await table.lookup(probe);

    // Missing.
    fs::rename(base, scratch.dir / "elsewhere.safetensors");
    checkpoint restoring;
    restoring.track(table);
    const auto missing = co_await failure_of(restoring.restore(increment));
    CHECK(code_of(missing) == errc::data_loss);
    CHECK(contains(message_of(missing), "builds on " + base.string() + ", which is missing"));
    // Replaced: another save under its name.
    checkpoint other;
    other.track(table);
    co_await other.save(base);
    const auto replaced = co_await failure_of(restoring.restore(increment));
    CHECK(code_of(replaced) == errc::data_loss);
    CHECK(contains(message_of(replaced), "of " + base.string() + ", which holds save"));
    CHECK(contains(message_of(replaced), "(it was replaced)"));
    // Corrupt: the original back, one byte of its last tensor flipped.
    fs::rename(scratch.dir / "elsewhere.safetensors", base);
    {
      std::fstream file(base, std::ios::in | std::ios::out | std::ios::binary);
      file.seekg(-3, std::ios::end);
      char byte = 0;
      file.read(&byte, 1);
      byte = static_cast<char>(byte ^ 0x10);
      file.seekp(-3, std::ios::end);
      file.write(&byte, 1);
    }
    const auto corrupt = co_await failure_of(restoring.restore(increment));
    CHECK(code_of(corrupt) == errc::data_loss);
    CHECK(contains(message_of(corrupt), "checkpoint " + base.string() + ": tensor \"emb"));
    CHECK(contains(message_of(corrupt), "is corrupt"));
    // None of them changed the table.
    const auto after = co_await table.lookup(probe);
    CHECK(std::memcmp(after.data(), before.data(), before.size() * sizeof(float)) == 0);
  });
}

TEST_CASE("a table that no part can build an increment for is saved whole, and its file then needs no base") {
  increments_scratch scratch;
  local_cluster cluster(2, 1);
  cluster.run_chief([&](parameter_server_strategy& strategy, cluster_coordinator&) -> asio::awaitable<void> {
    auto table = co_await strategy.scope().create_hash_table<float>("emb", churning_table());
    co_await train_round(table, 0);
    checkpoint first;
    first.track(table);
    // No save yet: an incremental save is whole.
    co_await first.save(scratch.dir / "a.safetensors", {.incremental = true});
    CHECK_FALSE(checkpoint_reader(scratch.dir / "a.safetensors").base());
    // Another checkpoint's save in between: the parts are in its save now, not the first's.
    checkpoint second;
    second.track(table);
    co_await second.save(scratch.dir / "b.safetensors");
    co_await train_round(table, 1);
    co_await first.save(scratch.dir / "c.safetensors", {.incremental = true});
    checkpoint_reader c(scratch.dir / "c.safetensors");
    CHECK_FALSE(c.base());
    CHECK_FALSE(c.contains("emb/dropped"));
    CHECK(nlohmann::json::parse(c.metadata().at("tables"))["emb"]["increment"] == false);
    // It restores alone.
    fs::remove(scratch.dir / "a.safetensors");
    co_await first.restore(scratch.dir / "c.safetensors");
    // And an increment on it builds on it.
    co_await train_round(table, 2);
    co_await first.save(scratch.dir / "d.safetensors", {.incremental = true});
    checkpoint_reader d(scratch.dir / "d.safetensors");
    REQUIRE(d.base());
    CHECK(d.base()->path == scratch.dir / "c.safetensors");
  });
}

TEST_CASE("checkpoint_manager saves one file in full_every whole and keeps every file a kept one builds on") {
  increments_scratch scratch;
  local_cluster cluster(1, 1);
  cluster.run_chief([&](parameter_server_strategy& strategy, cluster_coordinator&) -> asio::awaitable<void> {
    auto table = co_await strategy.scope().create_hash_table<float>("emb", churning_table());
    checkpoint ckpt;
    ckpt.track(table);
    checkpoint_manager manager(ckpt, scratch.dir, /*max_to_keep=*/1, /*full_every=*/3);
    std::vector<bool> whole;
    std::vector<std::vector<std::string>> kept;
    for (int round = 0; round < 5; ++round) {
      co_await train_round(table, round);
      const auto path = co_await manager.save();
      whole.push_back(!checkpoint_reader(path).base());
      std::vector<std::string> names;
      for (const auto& file : manager.checkpoints()) names.push_back(file.filename().string());
      kept.push_back(names);
    }
    const std::vector<bool> expected_whole{true, false, false, true, false};
    CHECK(whole == expected_whole);
    const std::vector<std::vector<std::string>> expected_kept{
        {"ckpt-1.safetensors"},
        {"ckpt-1.safetensors", "ckpt-2.safetensors"},
        {"ckpt-1.safetensors", "ckpt-2.safetensors", "ckpt-3.safetensors"},
        {"ckpt-4.safetensors"},
        {"ckpt-4.safetensors", "ckpt-5.safetensors"}};
    CHECK(kept == expected_kept);
  });
}

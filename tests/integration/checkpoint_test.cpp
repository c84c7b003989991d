// Checkpoints on real in-process clusters: a round trip of variables, slots, step and scalars; a
// restore into other numbers of shards and ps with identical values (and identical training after
// it); every kind of bad file refused before anything changes; the manager's numbering and pruning.
#include "file_faults.hpp"
#include "local_cluster.hpp"
#include "test_support.hpp"

#include <pscoro/checkpoint.hpp>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

using namespace pscoro;
using pscoro::testing::code_of;
using pscoro::testing::failure_of;
using pscoro::testing::local_cluster;
using pscoro::testing::message_of;
namespace fs = std::filesystem;

namespace {

struct scratch {
  fs::path dir = fs::temp_directory_path() / ("pscoro-checkpoint-test-" + std::to_string(::getpid()));
  scratch() {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~scratch() { fs::remove_all(dir); }
};

xt::xarray<double> table_values(std::size_t rows, std::size_t columns) {
  xt::xarray<double> out = xt::zeros<double>({rows, columns});
  for (std::size_t i = 0; i < rows; ++i) {
    for (std::size_t j = 0; j < columns; ++j) out(i, j) = 0.5 * static_cast<double>(i) - 0.125 * static_cast<double>(j);
  }
  return out;
}

// The model of every test: a dense float weight [5, 3], a sharded double table [13, 4] and an int64
// scalar counter, created by a strategy with `shards` table shards.
struct model {
  variable<float> weights;
  sharded_variable<double> table;
  variable<std::int64_t> counter;

  static asio::awaitable<model> create(parameter_server_strategy& strategy) {
    auto scope = strategy.scope();
    const xt::xarray<float> w = {{1, 2, 3}, {4, 5, 6}, {7, 8, 9}, {10, 11, 12}, {13, 14, 15}};
    const xt::xarray<std::int64_t> c = 41;
    const auto t = table_values(13, 4);
    model m;
    m.weights = co_await scope.create_variable("model/weights", w);
    m.table = co_await scope.create_sharded_variable("model/table", t);
    m.counter = co_await scope.create_variable("model/counter", c);
    co_return m;
  }

  checkpoint tracked() const {
    checkpoint ckpt;
    ckpt.track(weights).track(table).track(counter);
    return ckpt;
  }

  // Optimizer steps that create slots: adagrad on the weights, adam on every shard of the table.
  asio::awaitable<void> train(int steps) const {
    const xt::xarray<float> grad_w = xt::ones<float>({5, 3}) * 0.25f;
    const xt::xarray<std::int64_t> ids = {0, 12, 6, 3, 9, 12};  // every shard of 2, 3, 4 or 5
    xt::xarray<double> grad_rows = xt::ones<double>({6, 4});
    for (int s = 0; s < steps; ++s) {
      co_await weights.apply_gradient(optimizers::adagrad{.learning_rate = 0.1}, grad_w);
      co_await table.apply_sparse_gradient(optimizers::adam{.learning_rate = 0.01}, ids, grad_rows);
      grad_rows *= -0.5;
    }
  }

  struct snapshot {
    xt::xarray<float> weights, accumulator;
    xt::xarray<double> table, m, v;
    xt::xarray<std::int64_t> counter;
  };
  asio::awaitable<snapshot> read() const {
    snapshot s;
    s.weights = co_await weights.read();
    s.accumulator = co_await weights.slot("adagrad", "accumulator").read();
    s.table = co_await table.read();
    s.m = co_await table.slot("adam", "m").read();
    s.v = co_await table.slot("adam", "v").read();
    s.counter = co_await counter.read();
    co_return s;
  }
};

// The code of what `f()` throws (none: an empty code).
template <class F>
std::error_code thrown_code(F f) {
  try {
    f();
  } catch (const std::system_error& e) {
    return e.code();
  }
  return {};
}

void check_same(const model::snapshot& a, const model::snapshot& b) {
  CHECK(a.weights == b.weights);
  CHECK(a.accumulator == b.accumulator);
  CHECK(a.table == b.table);
  CHECK(a.m == b.m);
  CHECK(a.v == b.v);
  CHECK(a.counter == b.counter);
}

// Runs `body(strategy)` as the chief of a fresh cluster of `ps` ps whose tables have `shards` shards.
template <class Body>
void with_cluster(int ps, std::size_t shards, Body body) {
  local_cluster cluster(ps, 1);
  cluster.run_chief(
      [&body](parameter_server_strategy& strategy, cluster_coordinator&) -> asio::awaitable<void> {
        co_await body(strategy);
      },
      {}, {}, fixed_shards_partitioner{static_cast<std::int64_t>(shards)});
}

std::string bytes_of_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

}  // namespace

TEST_CASE("a checkpoint round-trips variables, optimizer slots, the step and scalars") {
  scratch s;
  const auto path = s.dir / "one.safetensors";
  with_cluster(2, 3, [&](parameter_server_strategy& strategy) -> asio::awaitable<void> {
    const auto m = co_await model::create(strategy);
    co_await m.train(3);
    const auto before = co_await m.read();
    auto ckpt = m.tracked();
    ckpt.set_chunk_bytes(40);  // 1 row of the table per piece: many pieces per shard
    ckpt.set_step(1234);
    ckpt.set_scalar("epoch", 3);
    ckpt.set_scalar("best_loss", 0.1 + 0.2);
    co_await ckpt.save(path);
    CHECK(fs::exists(path));
    CHECK(std::distance(fs::directory_iterator(s.dir), fs::directory_iterator()) == 1);  // no temporary left

    // Change everything, then restore.
    const xt::xarray<float> zeros_w = xt::zeros<float>({5, 3});
    const xt::xarray<double> zeros_t = xt::zeros<double>({13, 4});
    const xt::xarray<std::int64_t> zero = 0;
    co_await m.weights.assign(zeros_w);
    co_await m.table.assign(zeros_t);
    co_await m.counter.assign(zero);
    co_await m.train(1);
    auto restored = m.tracked();
    co_await restored.restore(path);
    check_same(co_await m.read(), before);
    CHECK(restored.step() == 1234);
    CHECK(restored.scalar("epoch") == 3);
    CHECK(restored.scalar("best_loss") == 0.1 + 0.2);  // exactly: doubles round-trip
    CHECK_THROWS_AS((void)restored.scalar("missing"), error);
  });

  // The file read without a cluster: one tensor per variable and slot, of its full shape.
  checkpoint_reader reader(path);
  CHECK(reader.metadata().at("format") == "pscoro.checkpoint");
  CHECK(reader.metadata().at("format_version") == "2");
  CHECK(reader.metadata().at("header_crc32c").size() == 8);
  CHECK(reader.step() == 1234);
  CHECK(reader.scalars().at("epoch") == 3);
  CHECK(reader.names() == std::vector<std::string>{"model/weights", "model/weights/adagrad/accumulator", "model/table",
                                                   "model/table/adam/iterations", "model/table/adam/m",
                                                   "model/table/adam/v", "model/counter"});
  CHECK(reader.shape("model/table") == shape_type{13, 4});
  CHECK(reader.shape("model/table/adam/m") == shape_type{13, 4});
  CHECK(reader.shape("model/table/adam/iterations") == shape_type{3});  // one step count per shard
  CHECK(reader.dtype("model/counter") == dtype::int64);
  CHECK(reader.read<std::int64_t>("model/counter")() == 41);
  CHECK(reader.read<std::int64_t>("model/table/adam/iterations") == xt::xarray<std::int64_t>{3, 3, 3});
  CHECK(thrown_code([&] { (void)reader.read<float>("model/table"); }) == errc::invalid_argument);
  CHECK(thrown_code([&] { (void)reader.shape("model/nothing"); }) == errc::not_found);
}

TEST_CASE("a slot some shards do not have yet is saved with its starting value") {
  scratch s;
  const auto path = s.dir / "partial.safetensors";
  with_cluster(2, 2, [&](parameter_server_strategy& strategy) -> asio::awaitable<void> {
    const auto m = co_await model::create(strategy);
    // Rows 0 and 1 are in shard 0 (rows 0-6): shard 1 has no adagrad slot.
    const xt::xarray<std::int64_t> ids = {0, 1};
    const xt::xarray<double> grad = xt::ones<double>({2, 4});
    co_await m.table.apply_sparse_gradient(optimizers::adagrad{.learning_rate = 0.1, .initial_accumulator_value = 0.5},
                                           ids, grad);
    auto ckpt = m.tracked();
    co_await ckpt.save(path);
    const auto saved = checkpoint_reader(path).read<double>("model/table/adagrad/accumulator");
    CHECK(saved(0, 0) == 1.5);    // 0.5 + 1^2
    CHECK(saved(2, 0) == 0.5);    // shard 0, not updated
    CHECK(saved(12, 3) == 0.5);   // shard 1, no slot there: the starting value
    // Restoring creates the slot on shard 1 too.
    co_await ckpt.restore(path);
    CHECK(co_await m.table.slot("adagrad", "accumulator").read() == saved);
  });
}

TEST_CASE("a checkpoint restores into other numbers of shards and ps with identical values and training") {
  scratch s;
  const auto path = s.dir / "reshard.safetensors";
  model::snapshot saved, after_more_training;
  // Source: 2 shards on 2 ps; save after 3 steps, then train 2 more steps for the reference.
  with_cluster(2, 2, [&](parameter_server_strategy& strategy) -> asio::awaitable<void> {
    const auto m = co_await model::create(strategy);
    co_await m.train(3);
    saved = co_await m.read();
    auto ckpt = m.tracked();
    ckpt.set_chunk_bytes(100);
    co_await ckpt.save(path);
    co_await m.train(2);
    after_more_training = co_await m.read();
  });
  // 2 -> 4 shards on 4 ps, 2 -> 1 on 1 ps, 2 -> 5 on 3 ps; each trains the same 2 steps after.
  for (const auto& layout : std::vector<std::pair<int, std::size_t>>{{4, 4}, {1, 1}, {3, 5}}) {
    const int ps = layout.first;  // not a structured binding: clang 14 cannot capture those
    const std::size_t shards = layout.second;
    CAPTURE(ps);
    CAPTURE(shards);
    const auto resaved = s.dir / fmt::format("resaved-{}.safetensors", shards);
    with_cluster(ps, shards, [&](parameter_server_strategy& strategy) -> asio::awaitable<void> {
      const auto m = co_await model::create(strategy);
      CHECK(m.table.num_shards() == shards);
      auto ckpt = m.tracked();
      ckpt.set_chunk_bytes(64);
      co_await ckpt.restore(path);
      check_same(co_await m.read(), saved);
      co_await ckpt.save(resaved);  // and from this layout on
      co_await m.train(2);
      check_same(co_await m.read(), after_more_training);
    });
    // 4 -> 1, 1 -> 3, 5 -> 2: back from the new layout.
    const std::size_t back = shards == 4 ? 1 : shards == 1 ? 3 : 2;
    with_cluster(back == 1 ? 1 : 2, back, [&](parameter_server_strategy& strategy) -> asio::awaitable<void> {
      const auto m = co_await model::create(strategy);
      auto ckpt = m.tracked();
      co_await ckpt.restore(resaved);
      check_same(co_await m.read(), saved);
    });
  }
}

TEST_CASE("a bad checkpoint is refused before anything changes") {
  scratch s;
  const auto good = s.dir / "good.safetensors";
  with_cluster(2, 2, [&](parameter_server_strategy& strategy) -> asio::awaitable<void> {
    const auto m = co_await model::create(strategy);
    co_await m.train(2);
    auto ckpt = m.tracked();
    co_await ckpt.save(good);
    co_await m.train(1);  // the cluster now differs from the file
    const auto current = co_await m.read();
    const std::string bytes = bytes_of_file(good);
    const auto write = [&](const std::string& name, const std::string& content) {
      std::ofstream(s.dir / name, std::ios::binary) << content;
      return s.dir / name;
    };
    const auto refused = [&](fs::path path, errc code, std::string_view says) -> asio::awaitable<void> {
      CAPTURE(path.filename().string());
      auto ckpt = m.tracked();  // named: g++ 12 ends a co_await's temporaries too early
      auto e = co_await failure_of(ckpt.restore(path));
      REQUIRE(e);
      CHECK(code_of(e) == code);
      CHECK(contains(message_of(e), says));
      CHECK(contains(message_of(e), path.filename().string()));
      check_same(co_await m.read(), current);
    };
    co_await refused(s.dir / "missing.safetensors", errc::not_found, "cannot open");
    co_await refused(write("empty.safetensors", ""), errc::data_loss, "too short");
    co_await refused(write("truncated.safetensors", bytes.substr(0, bytes.size() - 10)), errc::data_loss, "truncated");
    co_await refused(write("header-cut.safetensors", bytes.substr(0, 100)), errc::data_loss, "truncated");
    std::string huge = bytes;
    huge[7] = '\x7f';
    co_await refused(write("huge-header.safetensors", huge), errc::data_loss, "beyond the limit");
    std::string not_json = bytes;
    not_json[8] = '[';
    co_await refused(write("not-json.safetensors", not_json), errc::data_loss, "not valid JSON");
    std::string flipped = bytes;
    flipped[flipped.size() - 3] ^= 0x20;  // a byte of the last tensor
    co_await refused(write("flipped.safetensors", flipped), errc::data_loss, "is corrupt");
    std::string grown = bytes + "xxxxxxxx";
    co_await refused(write("grown.safetensors", grown), errc::data_loss, "cover");

    // A variable the file lacks, or holds with another shape.
    auto scope = strategy.scope();
    const xt::xarray<float> other = xt::zeros<float>({2, 2});
    auto extra = co_await scope.create_variable("model/extra", other);
    auto with_extra = m.tracked();
    with_extra.track(extra);
    auto e = co_await failure_of(with_extra.restore(good));
    REQUIRE(e);
    CHECK(code_of(e) == errc::not_found);
    CHECK(contains(message_of(e), "model/extra"));
    check_same(co_await m.read(), current);
    // Tracking the same variable again does nothing; another variable of the same name is refused:
    // a dense "model/table/part_1" on the ps that does not hold the table's shard of that name.
    checkpoint twice;
    twice.track(m.weights);
    CHECK(thrown_code([&] { twice.track(m.weights); }) == std::error_code());
    const auto shard = m.table.shards()[1].handle;
    const xt::xarray<double> rows = xt::zeros<double>({6, 4});
    const auto namesake = co_await scope.create_variable("model/table/part_1", rows);
    REQUIRE(namesake.ps_task() != shard.ps_task());
    twice.track(shard);
    CHECK(thrown_code([&] { twice.track(namesake); }) == errc::already_exists);
  });
}

TEST_CASE("a variable the checkpoint holds with another dtype or shape is refused, naming both") {
  scratch s;
  const auto path = s.dir / "model.safetensors";
  with_cluster(1, 1, [&](parameter_server_strategy& strategy) -> asio::awaitable<void> {
    const auto m = co_await model::create(strategy);
    auto ckpt = m.tracked();
    co_await ckpt.save(path);
  });
  for (const bool other_dtype : {false, true}) {
    with_cluster(1, 1, [&](parameter_server_strategy& strategy) -> asio::awaitable<void> {
      auto scope = strategy.scope();
      checkpoint ckpt;
      std::string says;
      if (other_dtype) {
        const xt::xarray<double> w = xt::zeros<double>({5, 3});
        ckpt.track(co_await scope.create_variable("model/weights", w));
        says = "'model/weights' is float32 [5, 3] in the file but float64 [5, 3] here";
      } else {
        const xt::xarray<float> w = xt::zeros<float>({3, 5});
        ckpt.track(co_await scope.create_variable("model/weights", w));
        says = "'model/weights' is float32 [5, 3] in the file but float32 [3, 5] here";
      }
      auto e = co_await failure_of(ckpt.restore(path));
      REQUIRE(e);
      CHECK(code_of(e) == errc::invalid_argument);
      CHECK(contains(message_of(e), says));
    });
  }
}

TEST_CASE("checkpoint_manager numbers, finds and prunes checkpoints, and cleans up after a crashed save") {
  scratch s;
  with_cluster(1, 1, [&](parameter_server_strategy& strategy) -> asio::awaitable<void> {
    const auto m = co_await model::create(strategy);
    auto ckpt = m.tracked();
    // A crashed save of another (dead) process, and a file that is not a checkpoint.
    const auto dir = s.dir / "ckpts";
    fs::create_directories(dir);
    std::ofstream(dir / "ckpt-7.safetensors.tmp-999999999") << "partial";
    std::ofstream(dir / "notes.txt") << "hello";
    checkpoint_manager manager(ckpt, dir, 2);
    CHECK_FALSE(fs::exists(dir / "ckpt-7.safetensors.tmp-999999999"));
    CHECK_FALSE(manager.latest_checkpoint());
    CHECK(co_await manager.save() == dir / "ckpt-1.safetensors");
    CHECK(co_await manager.save() == dir / "ckpt-2.safetensors");
    ckpt.set_step(300);
    CHECK(co_await manager.save(300) == dir / "ckpt-300.safetensors");
    CHECK(manager.checkpoints() == std::vector<fs::path>{dir / "ckpt-2.safetensors", dir / "ckpt-300.safetensors"});
    CHECK(manager.latest_checkpoint() == dir / "ckpt-300.safetensors");
    CHECK(co_await manager.save() == dir / "ckpt-301.safetensors");
    CHECK(checkpoint_reader(*manager.latest_checkpoint()).step() == 300);
    CHECK(fs::exists(dir / "notes.txt"));
    CHECK(checkpoint_manager::number_of("ckpt-12.safetensors") == 12);
    CHECK_FALSE(checkpoint_manager::number_of("ckpt-.safetensors"));
    CHECK_FALSE(checkpoint_manager::number_of("ckpt-1x.safetensors"));
    CHECK_FALSE(checkpoint_manager::number_of("ckpt-3.safetensors.tmp-5"));
  });
}

namespace {

// A safetensors file made by hand: the 8-byte size, `header` (JSON), then `data_bytes` zero bytes.
fs::path handmade(const fs::path& dir, const std::string& name, const std::string& header, std::size_t data_bytes) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[static_cast<std::size_t>(i)] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  bytes += header;
  bytes.append(data_bytes, '\0');
  std::ofstream(dir / name, std::ios::binary) << bytes;
  return dir / name;
}

// What reading all of `path` fails with, code first; "" when it reads. Files of other tools are
// read (unverified) too, so that their structure is what is checked.
std::string reader_failure_by_default(const fs::path& path) {
  try {
    checkpoint_reader reader(path);
  } catch (const error& e) {
    return std::string(e.code() == errc::failed_precondition ? "failed_precondition: " : "other: ") + e.what();
  }
  return "";
}

std::string reader_failure(const fs::path& path) {
  try {
    checkpoint_reader reader(path, {.allow_unverified = true});
    for (const auto& name : reader.names()) (void)reader.read_tensor(name);
    (void)reader.step();
    (void)reader.scalars();
  } catch (const error& e) {
    return std::string(e.code() == errc::data_loss ? "data_loss: " : e.code() == errc::failed_precondition
                                                                          ? "failed_precondition: "
                                                                          : "other: ") +
           e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("a handmade file: other safetensors files read, malformed ones are refused, naming what is wrong") {
  scratch s;
  // Any safetensors file of supported dtypes reads, without pscoro metadata, when the caller says
  // so, and the log says it was read unverified; by default it is refused.
  const auto plain = handmade(s.dir, "plain.safetensors",
                              R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                              R"("b":{"dtype":"I64","shape":[],"data_offsets":[8,16]}})",
                              16);
  CHECK(reader_failure_by_default(plain) ==
        "failed_precondition: checkpoint " + plain.string() +
            ": not a pscoro checkpoint (its __metadata__ has no \"format\": \"pscoro.checkpoint\"; written by another "
            "tool?), so nothing verifies its tensors; to read it unverified, pass "
            "checkpoint_read_options{.allow_unverified = true}");
  const testing::captured_log log;
  checkpoint_reader reader(plain, {.allow_unverified = true});
  CHECK_MESSAGE(contains(log.text(), "checkpoint " + plain.string() +
                                         ": not a pscoro checkpoint, read unverified as asked (2 of its 2 tensors "
                                         "have no CRC-32C)"),
                log.text());
  CHECK(reader.names() == std::vector<std::string>{"a", "b"});
  CHECK(reader.read<float>("a") == xt::xarray<float>{0, 0});
  CHECK(reader.step() == 0);
  CHECK(reader.scalars().empty());

  const auto refused = [&](const std::string& name, const std::string& header, std::size_t data_bytes,
                           const std::string& says) {
    CAPTURE(name);
    const auto failure = reader_failure(handmade(s.dir, name, header, data_bytes));
    CHECK(contains(failure, says));
    CHECK(contains(failure, name));
  };
  refused("bf16.safetensors", R"({"a":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]}})", 4,
          "data_loss: checkpoint " + (s.dir / "bf16.safetensors").string() +
              ": tensor \"a\" has dtype \"BF16\"; pscoro reads F32, F64, I32 and I64");
  refused("hole.safetensors",
          R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
          12, "data_loss: checkpoint " + (s.dir / "hole.safetensors").string() +
                  ": tensor \"b\" starts at byte 8 of the data where 4 was expected (a hole or an overlap)");
  refused("size.safetensors", R"({"a":{"dtype":"F64","shape":[3],"data_offsets":[0,16]}})", 16,
          "tensor \"a\": data_offsets [0, 16) do not hold F64 [3] (24 bytes)");
  refused("shape.safetensors", R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4,
          "tensor \"a\": shape [-1] is not a list of sizes");
  refused("no-offsets.safetensors", R"({"a":{"dtype":"F32","shape":[1]}})", 4,
          "tensor \"a\" needs dtype, shape and data_offsets");
  refused("metadata.safetensors", R"({"__metadata__":{"step":7}})", 0, "__metadata__[\"step\"] is not a string");
  refused("newer.safetensors", R"({"__metadata__":{"format":"pscoro.checkpoint","format_version":"3"}})", 0,
          "failed_precondition: checkpoint " + (s.dir / "newer.safetensors").string() +
              ": format version 3 is not one this pscoro reads (1 to 2)");
  // A pscoro checkpoint is verified whole, even when unverified files are allowed: a checksum
  // record missing, for the file or for one tensor, or not 8 hex digits, is data loss.
  refused("no-crc.safetensors",
          R"({"__metadata__":{"format":"pscoro.checkpoint","format_version":"1"},)"
          R"("a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
          4, "data_loss: checkpoint " + (s.dir / "no-crc.safetensors").string() +
                 ": __metadata__ has no \"crc32c\" record, which every pscoro checkpoint has: its tensors cannot be "
                 "verified");
  refused("one-crc.safetensors",
          R"({"__metadata__":{"format":"pscoro.checkpoint","format_version":"1","crc32c":"{\"a\":\"00000000\"}"},)"
          R"("a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
          R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
          8, "data_loss: checkpoint " + (s.dir / "one-crc.safetensors").string() +
                 ": tensor \"b\" has no checksum in the \"crc32c\" record: it cannot be verified");
  refused("hex.safetensors",
          R"({"__metadata__":{"format":"pscoro.checkpoint","format_version":"1","crc32c":"{\"a\":\"0000000g\"}"},)"
          R"("a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
          4, "data_loss: checkpoint " + (s.dir / "hex.safetensors").string() + ": bad checksum record for \"a\"");
  refused("crc.safetensors",
          R"({"__metadata__":{"crc32c":"{\"missing\":\"00000000\"}"},"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
          4, "bad checksum record for \"missing\"");
  refused("step.safetensors", R"({"__metadata__":{"step":"seven"}})", 0, "step \"seven\" is not an integer");
  refused("scalars.safetensors", R"({"__metadata__":{"scalars":"{\"epoch\":\"three\"}"}})", 0,
          "scalar \"epoch\" is not a number");
}

TEST_CASE("a checkpoint whose slot records are malformed, or a save into a missing directory, fails cleanly") {
  scratch s;
  with_cluster(1, 1, [&](parameter_server_strategy& strategy) -> asio::awaitable<void> {
    const auto m = co_await model::create(strategy);
    auto ckpt = m.tracked();
    // A file whose "slots" record is not what pscoro writes: refused before anything changes.
    const auto path = handmade(s.dir, "slots.safetensors",
                               R"({"__metadata__":{"format":"pscoro.checkpoint","format_version":"1","crc32c":"{}",)"
                               R"("slots":"{\"model/weights/adam/m\":{\"variable\":1}}"}})",
                               0);
    auto e = co_await failure_of(ckpt.restore(path));
    REQUIRE(e);
    CHECK(code_of(e) == errc::data_loss);
    CHECK(contains(message_of(e), "the slot record of \"model/weights/adam/m\" is malformed"));

    const auto nowhere = s.dir / "no-such-dir" / "ckpt.safetensors";
    e = co_await failure_of(ckpt.save(nowhere));
    REQUIRE(e);
    CHECK(code_of(e) == errc::not_found);
    CHECK(contains(message_of(e), "no-such-dir"));
    CHECK_FALSE(fs::exists(s.dir / "no-such-dir"));
  });
}

namespace {

// `text` as a JSON string holds it (pscoro's names and hex digits need no other escape).
std::string json_escaped(const std::string& text) {
  std::string out;
  for (const char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

// The checkpoint `bytes` with `part` of its header removed and the header padded with as many
// spaces (as safetensors allows), so every tensor stays where it was.
std::string without_header_part(const std::string& bytes, const std::string& part) {
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[static_cast<std::size_t>(i)]);
  std::string header = bytes.substr(8, n);
  const auto at = header.find(part);
  REQUIRE_MESSAGE(at != std::string::npos, header);
  header.erase(at, part.size());
  header.append(part.size(), ' ');
  return bytes.substr(0, 8) + header + bytes.substr(8 + n);
}

// CRC-32C bit by bit (the Castagnoli polynomial, reflected), for a test to sign a header it edited.
std::uint32_t crc32c_bit_by_bit(std::string_view bytes) {
  std::uint32_t crc = ~0u;
  for (const unsigned char b : bytes) {
    crc ^= b;
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0x82f63b78u & (0u - (crc & 1u)));
  }
  return ~crc;
}

// The checkpoint `bytes` with its header's own checksum made right again, as a tool that edited the
// header on purpose would leave it: what is then wrong is what the edit took out.
std::string resigned(const std::string& bytes) {
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[static_cast<std::size_t>(i)]);
  std::string header = bytes.substr(8, n);
  const std::string key = "\"header_crc32c\":\"";
  const auto at = header.find(key);
  REQUIRE_MESSAGE(at != std::string::npos, header);
  header.replace(at + key.size(), 8, "00000000");
  header.replace(at + key.size(), 8, fmt::format("{:08x}", crc32c_bit_by_bit(bytes.substr(0, 8) + header)));
  return bytes.substr(0, 8) + header + bytes.substr(8 + n);
}

}  // namespace

TEST_CASE("a checkpoint without its checksums, or with a damaged header, is data loss naming it; nothing changes") {
  scratch s;
  const auto good = s.dir / "good.safetensors";
  with_cluster(2, 2, [&](parameter_server_strategy& strategy) -> asio::awaitable<void> {
    const auto m = co_await model::create(strategy);
    co_await m.train(2);
    auto ckpt = m.tracked();
    co_await ckpt.save(good);
    co_await m.train(1);  // the cluster now differs from the file
    const auto current = co_await m.read();
    const std::string bytes = bytes_of_file(good);
    const std::string record = checkpoint_reader(good).metadata().at("crc32c");
    const auto write = [&](const std::string& name, const std::string& content) {
      std::ofstream(s.dir / name, std::ios::binary) << content;
      return s.dir / name;
    };
    const auto refused = [&](fs::path path, std::string says,
                             checkpoint_read_options options) -> asio::awaitable<void> {
      CAPTURE(path.filename().string());
      auto ckpt = m.tracked();  // named: g++ 12 ends a co_await's temporaries too early
      auto e = co_await failure_of(ckpt.restore(path, options));
      CHECK_MESSAGE(e, "restored what it should have refused");  // not REQUIRE: every case reports
      if (!e) co_return;
      CHECK(code_of(e) == errc::data_loss);
      CHECK_MESSAGE(contains(message_of(e), "checkpoint " + path.string() + ": " + says), message_of(e));
      check_same(co_await m.read(), current);
    };
    // A byte of the last tensor, the counter, flipped: its checksum refuses it...
    std::string flipped = bytes;
    flipped[flipped.size() - 3] ^= 0x20;
    co_await refused(write("flipped.safetensors", flipped), "tensor \"model/counter\" is corrupt", {});
    // ...and without the record, or without the counter's checksum in it, the same flip is refused
    // all the same (it restored a wrong counter before), even when unverified files are allowed:
    // those are files of other tools, not pscoro checkpoints that lost their checksums. (The header
    // is signed again after each edit, or its own checksum would refuse it first.)
    const std::string no_record =
        resigned(without_header_part(flipped, "\"crc32c\":\"" + json_escaped(record) + "\","));
    for (const bool allow_unverified : {false, true}) {
      CAPTURE(allow_unverified);
      co_await refused(write("no-record.safetensors", no_record),
                       "__metadata__ has no \"crc32c\" record, which every pscoro checkpoint has: its tensors cannot "
                       "be verified",
                       {.allow_unverified = allow_unverified});
    }
    const auto counter_at = record.find("\"model/counter\":\"");
    REQUIRE(counter_at != std::string::npos);
    const std::string counter_crc = record.substr(counter_at, 17 + 8 + 2);  // name, 8 digits, quote, comma
    REQUIRE(counter_crc.back() == ',');
    const std::string no_counter_crc = resigned(without_header_part(flipped, json_escaped(counter_crc)));
    co_await refused(write("no-counter-crc.safetensors", no_counter_crc),
                     "tensor \"model/counter\" has no checksum in the \"crc32c\" record: it cannot be verified", {});
    // A flipped byte in the header, where the tensors' checksums do not reach (the step, here 0 -> 1):
    // the header's own checksum refuses it. A version 2 file without that checksum is refused too.
    const std::string step_key = "\"step\":\"";
    std::string other_step = bytes;
    other_step[other_step.find(step_key) + step_key.size()] ^= 0x01;
    co_await refused(write("step.safetensors", other_step), "its header is corrupt (CRC-32C", {});
    const auto crc_at = bytes.find("\"header_crc32c\":\"");
    REQUIRE(crc_at != std::string::npos);
    const std::string header_crc = bytes.substr(crc_at, 17 + 8 + 1);  // key, 8 digits, quote
    co_await refused(write("no-header-crc.safetensors", without_header_part(bytes, "," + header_crc)),
                     "__metadata__ has no \"header_crc32c\" record, which every pscoro checkpoint of format "
                     "version 2 has: its header cannot be verified",
                     {});
  });
  // A checkpoint of format version 1 (an older pscoro: no header checksum) still restores.
  with_cluster(2, 2, [&](parameter_server_strategy& strategy) -> asio::awaitable<void> {
    const auto m = co_await model::create(strategy);
    const std::string bytes = bytes_of_file(good);
    const auto crc_at = bytes.find("\"header_crc32c\":\"");
    REQUIRE(crc_at != std::string::npos);
    std::string version_1 = without_header_part(bytes, "," + bytes.substr(crc_at, 17 + 8 + 1));
    const std::string version_key = "\"format_version\":\"2\"";
    const auto version_at = version_1.find(version_key);
    REQUIRE(version_at != std::string::npos);
    version_1.replace(version_at, version_key.size(), "\"format_version\":\"1\"");
    std::ofstream(s.dir / "version-1.safetensors", std::ios::binary) << version_1;
    const auto saved = checkpoint_reader(good).read<float>("model/weights");
    const xt::xarray<float> zeros = xt::zeros<float>({5, 3});
    co_await m.weights.assign(zeros);
    auto ckpt = m.tracked();
    const fs::path version_1_path = s.dir / "version-1.safetensors";
    co_await ckpt.restore(version_1_path);
    CHECK((co_await m.weights.read() == saved));
  });
}

TEST_CASE("a safetensors file of another tool restores only when the caller allows it, and the log says unverified") {
  scratch s;
  // The weights as another tool writes them: no pscoro metadata, so no checksums (and zeros).
  const auto foreign = handmade(s.dir, "foreign.safetensors",
                                R"({"model/weights":{"dtype":"F32","shape":[5,3],"data_offsets":[0,60]}})", 60);
  with_cluster(1, 1, [&](parameter_server_strategy& strategy) -> asio::awaitable<void> {
    const auto m = co_await model::create(strategy);
    const auto before = co_await m.weights.read();
    checkpoint ckpt;
    ckpt.track(m.weights);
    auto e = co_await failure_of(ckpt.restore(foreign));
    REQUIRE(e);
    CHECK(code_of(e) == errc::failed_precondition);
    CHECK_MESSAGE(contains(message_of(e), "checkpoint " + foreign.string() + ": not a pscoro checkpoint"),
                  message_of(e));
    CHECK((co_await m.weights.read() == before));
    const testing::captured_log log;
    const pscoro::checkpoint_read_options unverified{.allow_unverified = true};
    co_await ckpt.restore(foreign, unverified);  // another tool's file: logged as unverified
    const xt::xarray<float> zeros = xt::zeros<float>({5, 3});
    CHECK((co_await m.weights.read() == zeros));
    CHECK_MESSAGE(contains(log.text(), "checkpoint " + foreign.string() +
                                           ": not a pscoro checkpoint, read unverified as asked (1 of its 1 tensors "
                                           "have no CRC-32C)"),
                  log.text());
  });
}

TEST_CASE("a FIFO or a directory given as a checkpoint path is refused at once, naming it and the setting") {
  scratch s;
  const testing::scoped_fifo fifo((s.dir / "fifo.safetensors").string());
  const std::string refused_for_reading =
      "checkpoint: " + fifo.path() +
      " is a FIFO, not a regular file (the path given to checkpoint::restore or checkpoint_reader must name a regular "
      "file)";
  const auto thrown =
      testing::thrown_without_blocking_on(fifo.path(), [&] { checkpoint_reader reader{fs::path(fifo.path())}; });
  // REQUIRE: a reader that blocks would block the restore below too, and the cluster with it.
  REQUIRE(code_of(thrown) == errc::invalid_argument);
  CHECK(message_of(thrown) == refused_for_reading);
  with_cluster(1, 1, [&](parameter_server_strategy& strategy) -> asio::awaitable<void> {
    const auto m = co_await model::create(strategy);
    auto ckpt = m.tracked();
    const fs::path fifo_path = fifo.path();
    auto e = co_await failure_of(ckpt.restore(fifo_path));
    REQUIRE(e);
    CHECK(code_of(e) == errc::invalid_argument);
    CHECK(message_of(e) == refused_for_reading);
    e = co_await failure_of(ckpt.restore(s.dir));
    REQUIRE(e);
    CHECK(code_of(e) == errc::invalid_argument);
    CHECK_MESSAGE(contains(message_of(e), "checkpoint: " + s.dir.string() + " is a directory, not a regular file"),
                  message_of(e));
    // A save there is refused before it starts, and leaves the FIFO as it was (a rename would
    // have replaced it).
    e = co_await failure_of(ckpt.save(fifo_path));
    REQUIRE(e);
    CHECK(code_of(e) == errc::invalid_argument);
    CHECK(message_of(e) == "checkpoint: " + fifo.path() +
                               " is a FIFO, not a regular file (the path given to checkpoint::save must name a regular "
                               "file)");
    CHECK(fs::is_fifo(fifo_path));
  });
}

namespace {

// The names a checkpoint of `model` holds, sorted.
const std::vector<std::string> model_names{"model/counter", "model/table", "model/weights"};

}  // namespace

TEST_CASE("a checkpoint restored before its variables exist restores each at creation, into any number of shards") {
  scratch s;
  const auto path = s.dir / "deferred.safetensors";
  model::snapshot saved, after_more_training;
  // Source: the table in 3 shards; saved after 3 steps (adagrad and adam slots), then 2 more steps.
  with_cluster(2, 3, [&](parameter_server_strategy& strategy) -> asio::awaitable<void> {
    const auto m = co_await model::create(strategy);
    co_await m.train(3);
    saved = co_await m.read();
    auto ckpt = m.tracked();
    ckpt.set_step(77);
    co_await ckpt.save(path);
    co_await m.train(2);
    after_more_training = co_await m.read();
  });
  // 3 -> 2 and 3 -> 1 shards, restored before anything exists; each saves again, and that file
  // restores back into 3 shards, also before anything exists.
  for (const std::size_t shards : {std::size_t{2}, std::size_t{1}}) {
    CAPTURE(shards);
    const auto resaved = s.dir / fmt::format("deferred-{}.safetensors", shards);
    with_cluster(2, shards, [&](parameter_server_strategy& strategy) -> asio::awaitable<void> {
      checkpoint ckpt(strategy);
      ckpt.set_chunk_bytes(64);
      co_await ckpt.restore(path);
      CHECK(ckpt.step() == 77);
      CHECK(ckpt.pending() == model_names);
      const auto m = co_await model::create(strategy);  // created from other values: the saved ones win
      CHECK(m.table.num_shards() == shards);
      CHECK(ckpt.pending().empty());
      ckpt.assert_consumed();
      check_same(co_await m.read(), saved);
      co_await ckpt.save(resaved);  // restored on creation, so tracked: every variable is saved
      co_await m.train(2);          // the slots (adam's step count too) came along
      check_same(co_await m.read(), after_more_training);
    });
    with_cluster(2, 3, [&](parameter_server_strategy& strategy) -> asio::awaitable<void> {
      checkpoint ckpt(strategy);
      co_await ckpt.restore(resaved);
      const auto m = co_await model::create(strategy);
      CHECK(m.table.num_shards() == 3);
      check_same(co_await m.read(), saved);
    });
  }
}

TEST_CASE("a restore takes tracked variables at once and leaves the others pending until they are created") {
  scratch s;
  const auto path = s.dir / "partial.safetensors";
  model::snapshot saved;
  with_cluster(2, 2, [&](parameter_server_strategy& strategy) -> asio::awaitable<void> {
    const auto m = co_await model::create(strategy);
    co_await m.train(2);
    saved = co_await m.read();
    auto ckpt = m.tracked();
    co_await ckpt.save(path);
  });
  with_cluster(2, 3, [&](parameter_server_strategy& strategy) -> asio::awaitable<void> {
    auto scope = strategy.scope();
    // The weights exist and are tracked: restored by restore() itself, as without pending values.
    const xt::xarray<float> w = xt::zeros<float>({5, 3});
    auto weights = co_await scope.create_variable("model/weights", w);
    checkpoint ckpt(strategy);
    ckpt.track(weights);
    co_await ckpt.restore(path);
    CHECK((co_await weights.read() == saved.weights));
    CHECK((co_await weights.slot("adagrad", "accumulator").read() == saved.accumulator));
    const std::vector<std::string> rest{"model/counter", "model/table"};
    CHECK(ckpt.pending() == rest);
    std::string consumed_message;
    try {
      ckpt.assert_consumed();
    } catch (const error& e) {
      CHECK(e.code() == errc::failed_precondition);
      consumed_message = e.what();
    }
    CHECK(contains(consumed_message, "partial.safetensors"));
    CHECK_MESSAGE(contains(consumed_message, "2 saved variables were not restored into any variable: 'model/counter', "
                                             "'model/table'"),
                  consumed_message);

    // The table's shard initializer is never asked: the saved value replaces it.
    int asked = 0;
    const auto init = [&asked](const shard_info& info) {
      ++asked;
      return xt::xarray<double>(xt::zeros<double>(info.shape));
    };
    const shape_type table_shape{13, 4};
    auto table = co_await scope.create_sharded_variable<double>("model/table", table_shape, init);
    CHECK(asked == 0);
    CHECK(table.num_shards() == 3);
    CHECK((co_await table.read() == saved.table));
    CHECK((co_await table.slot("adam", "m").read() == saved.m));
    CHECK(ckpt.pending() == std::vector<std::string>{"model/counter"});
    ckpt.track(table);  // tracked already, as the same variable: nothing to do

    // Forgotten: the counter keeps its own value.
    ckpt.discard_pending();
    CHECK(ckpt.pending().empty());
    ckpt.assert_consumed();
    const xt::xarray<std::int64_t> five = 5;
    auto counter = co_await scope.create_variable("model/counter", five);
    CHECK((co_await counter.read() == five));
  });
}

TEST_CASE("a variable created unlike its pending saved value is refused, naming both, and not created") {
  scratch s;
  const auto path = s.dir / "mismatch.safetensors";
  model::snapshot saved;
  with_cluster(1, 1, [&](parameter_server_strategy& strategy) -> asio::awaitable<void> {
    const auto m = co_await model::create(strategy);
    co_await m.train(1);
    saved = co_await m.read();
    auto ckpt = m.tracked();
    co_await ckpt.save(path);
  });
  with_cluster(2, 2, [&](parameter_server_strategy& strategy) -> asio::awaitable<void> {
    auto scope = strategy.scope();
    checkpoint ckpt(strategy);
    co_await ckpt.restore(path);
    const xt::xarray<float> transposed = xt::zeros<float>({3, 5});
    auto e = co_await failure_of(scope.create_variable("model/weights", transposed));
    REQUIRE(e);
    CHECK(code_of(e) == errc::invalid_argument);
    CHECK(message_of(e) == fmt::format("variable 'model/weights' is created as float32 [3, 5] but checkpoint {} "
                                       "(restored before it existed) holds it as float32 [5, 3]",
                                       path.string()));
    const shape_type table_shape{13, 4};
    e = co_await failure_of(scope.create_sharded_variable<float>("model/table", table_shape, initializers::zeros{}));
    REQUIRE(e);
    CHECK(code_of(e) == errc::invalid_argument);
    CHECK(contains(message_of(e), "created as float32 [13, 4]"));
    CHECK(contains(message_of(e), "holds it as float64 [13, 4]"));
    // Nothing was created, and the values still wait: the right shapes take them.
    CHECK(ckpt.pending() == model_names);
    const xt::xarray<float> w = xt::zeros<float>({5, 3});
    auto weights = co_await scope.create_variable("model/weights", w);
    CHECK((co_await weights.read() == saved.weights));
  });
  // A checkpoint without the strategy lists what it did not restore, but restores nothing later.
  with_cluster(1, 1, [&](parameter_server_strategy& strategy) -> asio::awaitable<void> {
    checkpoint detached;
    co_await detached.restore(path);
    CHECK(detached.pending() == model_names);
    const xt::xarray<std::int64_t> five = 5;
    auto counter = co_await strategy.scope().create_variable("model/counter", five);
    CHECK((co_await counter.read() == five));
    CHECK(detached.pending() == model_names);
  });
}

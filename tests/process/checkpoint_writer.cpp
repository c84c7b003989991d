// The process the crash test kills mid-save, and the check that runs after it.
//
//   checkpoint_writer save DIR     saves checkpoints 1, 2, 3, ... of a 64 MiB table and a counter
//                                  into DIR forever, in 1 MiB pieces (a save takes a while)
//   checkpoint_writer verify DIR   every complete checkpoint in DIR reads back with matching
//                                  checksums; the newest restores (into another number of shards)
//                                  to exactly the saved table and counter; a new manager removes
//                                  the killed save's temporary file
#include "local_cluster.hpp"

#include <pscoro/checkpoint.hpp>

#include <cstdio>
#include <filesystem>
#include <string>

using namespace pscoro;
namespace fs = std::filesystem;

namespace {

constexpr std::size_t rows = 1 << 20, columns = 16;

struct model {
  sharded_variable<float> table;
  variable<std::int64_t> counter;

  // The table's values come from a seeded initializer: the same for any number of shards.
  static asio::awaitable<model> create(parameter_server_strategy& strategy) {
    auto scope = strategy.scope();
    const shape_type shape{rows, columns}, scalar{};
    model m;
    m.table = co_await scope.create_sharded_variable<float>("table", shape, initializers::random_uniform{.seed = 7});
    m.counter = co_await scope.create_variable<std::int64_t>("counter", scalar, initializers::zeros{});
    co_return m;
  }
};

asio::awaitable<void> save_forever(parameter_server_strategy& strategy, fs::path dir) {
  const auto m = co_await model::create(strategy);
  checkpoint ckpt;
  ckpt.track(m.table).track(m.counter);
  ckpt.set_chunk_bytes(1 << 20);
  checkpoint_manager manager(ckpt, dir, 3);
  for (std::int64_t n = 1;; ++n) {
    const xt::xarray<std::int64_t> value = n;
    co_await m.counter.assign(value);
    ckpt.set_step(n);
    const auto path = co_await manager.save(n);
    std::printf("saved %s\n", path.c_str());
    std::fflush(stdout);
  }
}

asio::awaitable<void> verify(parameter_server_strategy& strategy, fs::path dir, int& failures) {
  const auto fail = [&](const std::string& what) {
    std::printf("FAILED: %s\n", what.c_str());
    ++failures;
  };
  const auto all = checkpoints_in(dir);
  if (all.empty()) fail("no complete checkpoint in " + dir.string());
  for (const auto& path : all) {
    const checkpoint_reader reader(path);
    for (const auto& name : reader.names()) (void)reader.read_tensor(name);  // every checksum
    if (reader.read<std::int64_t>("counter")() != reader.step()) fail(path.string() + ": counter is not the step");
  }
  const auto m = co_await model::create(strategy);  // another layout: 3 shards, see main
  const auto expected = co_await m.table.read();
  const xt::xarray<float> zeros = xt::zeros<float>({rows, columns});
  co_await m.table.assign(zeros);  // so that only the restore can bring the values back
  checkpoint ckpt;
  ckpt.track(m.table).track(m.counter);
  co_await ckpt.restore(all.back());
  if (co_await m.table.read() != expected) fail("the restored table differs from the saved one");
  if ((co_await m.counter.read())() != ckpt.step()) fail("the restored counter is not the step");
  std::printf("verified %zu checkpoints; the newest, %s, restores (step %lld)\n", all.size(),
              all.back().filename().c_str(), static_cast<long long>(ckpt.step()));
  checkpoint_manager cleanup(ckpt, dir);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 || (std::string(argv[1]) != "save" && std::string(argv[1]) != "verify")) {
    std::fprintf(stderr, "usage: checkpoint_writer save|verify DIR\n");
    return 2;
  }
  const bool saving = std::string(argv[1]) == "save";
  const fs::path dir = argv[2];
  int failures = 0;
  try {
    testing::local_cluster cluster(2, 1);
    cluster.run_chief(
        [&](parameter_server_strategy& strategy, cluster_coordinator&) -> asio::awaitable<void> {
          if (saving) {
            co_await save_forever(strategy, dir);
          } else {
            co_await verify(strategy, dir, failures);
          }
        },
        {}, {}, fixed_shards_partitioner{saving ? 4 : 3});
  } catch (const std::exception& e) {
    std::fprintf(stderr, "checkpoint_writer: %s\n", e.what());
    return 1;
  }
  return failures == 0 ? 0 : 1;
}

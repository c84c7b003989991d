// Micro-benchmarks of the per-message CPU cost: encoding a frame, reading one back through a
// socket pair, and a ps applying an update. Bytes/s are reported next to memcpy of the same size.
#include "metrics/library.hpp"
#include "ps/ps_service.hpp"
#include "wire/frame.hpp"
#include "wire/values.hpp"

#include <benchmark/benchmark.h>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/use_future.hpp>
#include <asio/write.hpp>

#include <cstring>

namespace {

using namespace pscoro;

wire::frame update_request(std::size_t floats) {
  wire::frame f;
  f.kind = wire::frame_kind::request;
  auto* update = f.message.mutable_request()->mutable_update_variable();
  wire::encode_ref(*update->mutable_variable(), variable_ref{"w", dtype::float32, {floats}, 0});
  update->set_op(wire::UpdateVariable::ADD);
  auto value = tensor::uninitialized(dtype::float32, {floats});
  std::fill_n(value.mutable_data<float>(), floats, 1.0f);
  wire::put_tensor(f, *update->mutable_value(), value);
  return f;
}

void memcpy_baseline(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0)) * sizeof(float);
  std::vector<char> from(bytes, 1), to(bytes);
  for (auto _ : state) {
    std::memcpy(to.data(), from.data(), bytes);
    benchmark::DoNotOptimize(to.data());
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * bytes));
}

void encode_frame(benchmark::State& state) {
  const auto request = update_request(static_cast<std::size_t>(state.range(0)));
  for (auto _ : state) benchmark::DoNotOptimize(wire::encode(request));
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * state.range(0) * sizeof(float)));
}

// Writes a frame into one end of a loopback pair and reads it back with frame_reader.
void read_frame(benchmark::State& state) {
  asio::io_context io;
  asio::ip::tcp::acceptor acceptor(io, {asio::ip::address_v4::loopback(), 0});
  asio::ip::tcp::socket writer(io), reader_socket(io);
  writer.connect(acceptor.local_endpoint());
  reader_socket = acceptor.accept();
  wire::frame_reader reader({});
  const auto encoded = wire::encode(update_request(static_cast<std::size_t>(state.range(0))));
  std::vector<asio::const_buffer> buffers{asio::buffer(encoded.head)};
  for (const auto& s : encoded.segments) buffers.emplace_back(s.data(), s.size());
  for (auto _ : state) {
    asio::async_write(writer, buffers, [](std::error_code, std::size_t) {});
    auto got = asio::co_spawn(io, reader.read(reader_socket), asio::use_future);
    io.run();
    io.restart();
    benchmark::DoNotOptimize(got.get());
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * state.range(0) * sizeof(float)));
}

void ps_assign_add(benchmark::State& state) {
  const auto floats = static_cast<std::size_t>(state.range(0));
  ps::ps_service ps("ps:0");
  {
    // Scoped like a received frame: the variable must own its bytes alone, or every update
    // would copy on write.
    wire::frame create;
    auto* body = create.message.mutable_request()->mutable_create_variable();
    wire::encode_ref(*body->mutable_variable(), variable_ref{"w", dtype::float32, {floats}, 0});
    wire::put_tensor(create, *body->mutable_initial_value(), tensor::uninitialized(dtype::float32, {floats}));
    if (ps.handle(create).message.response().status().code() != 0) state.SkipWithError("create failed");
  }
  const auto request = update_request(floats);
  for (auto _ : state) benchmark::DoNotOptimize(ps.handle(request));
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * floats * sizeof(float)));
}

// The metric updates one no-op closure causes in a cluster, all on one thread: a frame each way
// counted on both ends of two connections' sides (chief and worker: 8 counter adds), the queue's
// two gauges three times (scheduled, started, finished), two clock reads and two histogram
// observations on the chief. Compare with the time a closure takes (benchmarks/metrics_bench).
void metric_updates_per_closure(benchmark::State& state) {
  auto& traffic = metrics::traffic_of("bench:0");
  metrics::gauge queued, inflight;
  metrics::histogram execution, fetch;
  const auto started = std::chrono::steady_clock::now();
  for (auto _ : state) {
    for (int side = 0; side < 2; ++side) {
      traffic.frames_sent.inc();
      traffic.bytes_sent.inc(64);
      traffic.frames_received.inc();
      traffic.bytes_received.inc(64);
    }
    for (int i = 0; i < 3; ++i) {
      queued.set(i);
      inflight.set(i);
    }
    const auto outcome = std::chrono::steady_clock::now();
    execution.observe(std::chrono::duration<double>(outcome - started).count());
    fetch.observe(std::chrono::duration<double>(std::chrono::steady_clock::now() - outcome).count());
  }
}

}  // namespace

BENCHMARK(metric_updates_per_closure);
BENCHMARK(memcpy_baseline)->Arg(1 << 10)->Arg(1 << 18)->Arg(1 << 24);
BENCHMARK(encode_frame)->Arg(1 << 10)->Arg(1 << 18)->Arg(1 << 24);
BENCHMARK(read_frame)->Arg(1 << 10)->Arg(1 << 18)->Arg(1 << 22);
BENCHMARK(ps_assign_add)->Arg(1 << 10)->Arg(1 << 18)->Arg(1 << 24);

BENCHMARK_MAIN();

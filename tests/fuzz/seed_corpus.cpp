// Writes the fuzz targets' seed corpus with the library's own encoders, so every seed is a
// well-formed input (or a deliberately damaged one) of the current formats:
//
//   meson compile -C build seed_corpus && build/tests/fuzz/seed_corpus tests/fuzz/corpus
//
// Inputs the fuzzer found (crashes once fixed, new coverage worth keeping) are added by hand next
// to these; this program only rewrites the files it names.
#include "fuzz_support.hpp"
#include "tf_example_reference.hpp"

#include <pscoro/data_formats.hpp>
#include <pscoro/dataset.hpp>
#include <pscoro/per_worker.hpp>
#include <pscoro/tensor.hpp>
#include <pscoro/worker_function.hpp>

#include "checkpoint/safetensors.hpp"
#include "common/crc32c.hpp"
#include "wire/values.hpp"

#include <fmt/format.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>

using namespace pscoro;
namespace fs = std::filesystem;

namespace {

fs::path root;

void put(const std::string& target, const std::string& name, const std::string& bytes) {
  fs::create_directories(root / target);
  std::ofstream(root / target / name, std::ios::binary) << bytes;
}

std::string flag(int bits) { return std::string(1, static_cast<char>(bits)); }

tensor floats(std::vector<float> values, shape_type shape) {
  byte_buffer bytes(values.size() * sizeof(float));
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return {dtype::float32, std::move(shape), std::move(bytes)};
}

tensor int64s(std::vector<std::int64_t> values) {
  byte_buffer bytes(values.size() * sizeof(std::int64_t));
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return {dtype::int64, shape_type{values.size()}, std::move(bytes)};
}

wire::frame request(std::uint64_t id) {
  wire::frame f;
  f.kind = wire::frame_kind::request;
  f.request_id = id;
  return f;
}

void set_ref(wire::VariableRef& ref, const std::string& name, shape_type shape) {
  ref.set_name(name);
  ref.set_dtype(static_cast<std::uint32_t>(dtype::float32));
  for (const auto d : shape) ref.add_shape(d);
}

// A session of a chief with a ps: create, read, update, scatter, apply gradients, list slots.
std::string ps_requests() {
  std::string out;
  auto create = request(1);
  auto* c = create.message.mutable_request()->mutable_create_variable();
  set_ref(*c->mutable_variable(), "w", {2, 2});
  wire::put_tensor(create, *c->mutable_initial_value(), floats({1, 2, 3, 4}, {2, 2}));
  out += fuzz::wire_bytes(std::move(create));

  auto init = request(2);
  auto* i = init.message.mutable_request()->mutable_create_variable();
  set_ref(*i->mutable_variable(), "emb", {4, 3});
  i->mutable_initializer()->set_kind(wire::Initializer::RANDOM_UNIFORM);
  i->mutable_initializer()->set_a(-1);
  i->mutable_initializer()->set_b(1);
  i->mutable_initializer()->add_full_shape(4);
  i->mutable_initializer()->add_full_shape(3);
  out += fuzz::wire_bytes(std::move(init));

  auto read = request(3);
  set_ref(*read.message.mutable_request()->mutable_read_variable()->mutable_variable(), "w", {2, 2});
  out += fuzz::wire_bytes(std::move(read));

  auto sparse = request(4);
  auto* r = sparse.message.mutable_request()->mutable_read_variable();
  set_ref(*r->mutable_variable(), "emb", {4, 3});
  wire::put_tensor(sparse, *r->mutable_indices(), int64s({3, 0, 3}));
  out += fuzz::wire_bytes(std::move(sparse));

  auto add = request(5);
  auto* u = add.message.mutable_request()->mutable_update_variable();
  set_ref(*u->mutable_variable(), "w", {2, 2});
  u->set_op(wire::UpdateVariable::ADD);
  wire::put_tensor(add, *u->mutable_value(), floats({1, 1, 1, 1}, {2, 2}));
  out += fuzz::wire_bytes(std::move(add));

  auto scatter = request(6);
  auto* s = scatter.message.mutable_request()->mutable_update_variable();
  set_ref(*s->mutable_variable(), "emb", {4, 3});
  s->set_op(wire::UpdateVariable::SUB);
  wire::put_tensor(scatter, *s->mutable_value(), floats({1, 2, 3}, {1, 3}));
  wire::put_tensor(scatter, *s->mutable_indices(), int64s({2}));
  out += fuzz::wire_bytes(std::move(scatter));

  auto adam = request(7);
  auto* g = adam.message.mutable_request()->mutable_apply_gradient();
  set_ref(*g->mutable_variable(), "emb", {4, 3});
  g->mutable_optimizer()->set_kind(wire::Optimizer::ADAM);
  g->mutable_optimizer()->set_learning_rate(0.1);
  wire::put_tensor(adam, *g->mutable_gradient(), floats({1, 2, 3, 4, 5, 6}, {2, 3}));
  wire::put_tensor(adam, *g->mutable_indices(), int64s({1, 1}));
  out += fuzz::wire_bytes(std::move(adam));

  auto slots = request(8);
  set_ref(*slots.message.mutable_request()->mutable_list_slots()->mutable_variable(), "emb", {4, 3});
  out += fuzz::wire_bytes(std::move(slots));

  auto rows = request(9);
  auto* rr = rows.message.mutable_request()->mutable_read_variable();
  set_ref(*rr->mutable_variable(), "emb", {4, 3});
  rr->mutable_rows()->set_begin(1);
  rr->mutable_rows()->set_end(3);
  out += fuzz::wire_bytes(std::move(rows));
  return out;
}

// A session with a dynamic embedding table: create its part (every bucket), look up with and
// without insert, step, advance the clock, and delete it.
std::string ps_table_requests() {
  std::string out;
  const auto set_table = [](wire::HashTableRef& t) {
    t.set_name("users");
    t.set_dtype(static_cast<std::uint32_t>(dtype::float32));
    t.set_dim(2);
    t.set_buckets(4);
    t.add_ps_tasks(0);
  };
  auto create = request(1);
  auto* c = create.message.mutable_request()->mutable_create_hash_table();
  set_table(*c->mutable_table());
  c->mutable_initializer()->set_kind(wire::Initializer::RANDOM_NORMAL);
  c->mutable_initializer()->set_b(0.1);
  c->mutable_admission()->set_kind(wire::AdmissionPolicy::MIN_COUNT);
  c->mutable_admission()->set_count(2);
  c->mutable_admission()->set_counters(64);
  c->mutable_eviction()->set_kind(wire::EvictionPolicy::TTL);
  c->mutable_eviction()->set_max_idle(3);
  c->set_max_rows_per_ps(100);
  for (std::uint32_t b = 0; b < 4; ++b) c->add_buckets(b);
  out += fuzz::wire_bytes(std::move(create));

  for (std::uint64_t id = 2; id <= 3; ++id) {
    auto lookup = request(id);
    auto* l = lookup.message.mutable_request()->mutable_hash_lookup();
    l->set_insert(true);
    auto* part = l->add_parts();
    set_table(*part->mutable_table());
    wire::put_tensor(lookup, *part->mutable_ids(), int64s({-1, 0, std::numeric_limits<std::int64_t>::max(), 0}));
    out += fuzz::wire_bytes(std::move(lookup));
  }

  auto step = request(4);
  auto* a = step.message.mutable_request()->mutable_hash_apply_gradients();
  a->mutable_optimizer()->set_kind(wire::Optimizer::ADAGRAD);
  a->mutable_optimizer()->set_learning_rate(0.1);
  auto* part = a->add_parts();
  set_table(*part->mutable_table());
  wire::put_tensor(step, *part->mutable_ids(), int64s({0, 5}));
  wire::put_tensor(step, *part->mutable_gradients(), floats({1, 2, 3, 4}, {2, 2}));
  out += fuzz::wire_bytes(std::move(step));

  auto clock = request(5);
  auto* t = clock.message.mutable_request()->mutable_advance_clock();
  set_table(*t->mutable_table());
  t->set_clock(9);
  out += fuzz::wire_bytes(std::move(clock));

  auto exported = request(6);
  auto* e = exported.message.mutable_request()->mutable_hash_export();
  set_table(*e->mutable_table());
  e->set_first_bucket(0);
  e->set_max_bytes(64);
  out += fuzz::wire_bytes(std::move(exported));

  auto restored = request(7);
  auto* i = restored.message.mutable_request()->mutable_hash_import();
  set_table(*i->mutable_table());
  i->set_reset(true);
  i->mutable_state()->set_clock(9);
  i->mutable_state()->set_steps(1);
  i->mutable_state()->mutable_optimizer()->set_kind(wire::Optimizer::ADAGRAD);
  i->mutable_state()->mutable_optimizer()->set_learning_rate(0.1);
  i->mutable_state()->set_admission_counters(64);
  wire::put_tensor(restored, *i->mutable_state()->mutable_counters(), int64s(std::vector<std::int64_t>(8, 1)));
  wire::put_tensor(restored, *i->mutable_ids(), int64s({0, 5}));
  wire::put_tensor(restored, *i->mutable_last_named(), int64s({3, 9}));
  wire::put_tensor(restored, *i->mutable_values(), floats({1, 2, 3, 4, 5, 6, 7, 8}, {2, 4}));
  out += fuzz::wire_bytes(std::move(restored));

  // An incremental save: a whole save (9) starts, an increment (10) builds on it; a restore of an
  // increment's dropped ids and rows, replacing held ones.
  auto saved = request(9);
  auto* whole = saved.message.mutable_request()->mutable_hash_export();
  set_table(*whole->mutable_table());
  whole->set_max_bytes(64);
  whole->set_save(9);
  out += fuzz::wire_bytes(std::move(saved));
  auto increment = request(10);
  auto* changed = increment.message.mutable_request()->mutable_hash_export();
  set_table(*changed->mutable_table());
  changed->set_max_bytes(64);
  changed->set_save(10);
  changed->set_base(9);
  out += fuzz::wire_bytes(std::move(increment));
  auto replaced = request(11);
  auto* r = replaced.message.mutable_request()->mutable_hash_import();
  set_table(*r->mutable_table());
  r->set_replace(true);
  wire::put_tensor(replaced, *r->mutable_dropped(), int64s({0}));
  wire::put_tensor(replaced, *r->mutable_ids(), int64s({5}));
  wire::put_tensor(replaced, *r->mutable_last_named(), int64s({9}));
  wire::put_tensor(replaced, *r->mutable_values(), floats({1, 2, 3, 4}, {1, 4}));
  out += fuzz::wire_bytes(std::move(replaced));

  auto remove = request(12);
  remove.message.mutable_request()->mutable_delete_variable()->mutable_variable()->set_name("users");
  out += fuzz::wire_bytes(std::move(remove));
  return out;
}

// Request `id`: create float32 variable `name` of `shape` from a uniform [-1, 1) initializer (the
// ps fills it: nothing of its size travels).
std::string create_uniform(std::uint64_t id, const std::string& name, const shape_type& shape) {
  auto init = request(id);
  auto* i = init.message.mutable_request()->mutable_create_variable();
  set_ref(*i->mutable_variable(), name, shape);
  i->mutable_initializer()->set_kind(wire::Initializer::RANDOM_UNIFORM);
  i->mutable_initializer()->set_a(-1);
  i->mutable_initializer()->set_b(1);
  for (const auto d : shape) i->mutable_initializer()->add_full_shape(d);
  return fuzz::wire_bytes(std::move(init));
}

// Kernels on the fuzz ps's kernel thread (8 KiB each, past its 4 KiB ps_kernel_offload_bytes),
// sent at once: an initializer, then an Adam step, a read and a slot list that wait in the
// variable's lane, and a dense update.
std::string ps_kernel_requests() {
  const shape_type shape{64, 32};
  std::string out;
  out += create_uniform(1, "big", shape);

  auto adam = request(2);
  auto* g = adam.message.mutable_request()->mutable_apply_gradient();
  set_ref(*g->mutable_variable(), "big", shape);
  g->mutable_optimizer()->set_kind(wire::Optimizer::ADAM);
  g->mutable_optimizer()->set_learning_rate(0.1);
  wire::put_tensor(adam, *g->mutable_gradient(), floats(std::vector<float>(32, 0.5f), {1, 32}));
  wire::put_tensor(adam, *g->mutable_indices(), int64s({5}));
  out += fuzz::wire_bytes(std::move(adam));

  auto read = request(3);
  set_ref(*read.message.mutable_request()->mutable_read_variable()->mutable_variable(), "big", shape);
  out += fuzz::wire_bytes(std::move(read));

  auto slots = request(4);
  set_ref(*slots.message.mutable_request()->mutable_list_slots()->mutable_variable(), "big/adam/m", shape);
  out += fuzz::wire_bytes(std::move(slots));
  return out;
}

// Sparse reads whose replies the fuzz ps gathers as it sends them (wire::segment_producer: 2x the
// reply >= its 4 KiB ps_kernel_offload_bytes), sent at once: 2100 rows of 128 bytes (two produce
// steps), then an update, a read and a small sparse read of the same variable that wait in its
// lane until the last row is gathered. `cut`: the input ends in half a frame instead, so the
// connection closes while the reply is produced (the producer is dropped and lets the lane go).
std::string ps_streamed_reply_requests(bool cut) {
  const shape_type shape{64, 32};
  std::string out;
  out += create_uniform(1, "table", shape);

  std::vector<std::int64_t> ids(2100);
  for (std::size_t k = 0; k < ids.size(); ++k) ids[k] = static_cast<std::int64_t>((k * 37) % 64);
  auto sparse = request(2);
  auto* r = sparse.message.mutable_request()->mutable_read_variable();
  set_ref(*r->mutable_variable(), "table", shape);
  wire::put_tensor(sparse, *r->mutable_indices(), int64s(ids));
  out += fuzz::wire_bytes(std::move(sparse));

  auto add = request(3);
  auto* u = add.message.mutable_request()->mutable_update_variable();
  set_ref(*u->mutable_variable(), "table", shape);
  u->set_op(wire::UpdateVariable::ADD);
  wire::put_tensor(add, *u->mutable_value(), floats(std::vector<float>(32, 0.25f), {1, 32}));
  wire::put_tensor(add, *u->mutable_indices(), int64s({7}));
  const std::string update = fuzz::wire_bytes(std::move(add));
  if (cut) return out + update.substr(0, update.size() / 2);
  out += update;

  auto read = request(4);
  set_ref(*read.message.mutable_request()->mutable_read_variable()->mutable_variable(), "table", shape);
  out += fuzz::wire_bytes(std::move(read));

  auto small = request(5);
  auto* sr = small.message.mutable_request()->mutable_read_variable();
  set_ref(*sr->mutable_variable(), "table", shape);
  wire::put_tensor(small, *sr->mutable_indices(), int64s({7, 0, 7}));
  out += fuzz::wire_bytes(std::move(small));
  return out;
}

std::string run_function(std::uint64_t id, const std::string& name, const std::string& signature,
                         const std::vector<value>& args) {
  auto f = request(id);
  auto* run = f.message.mutable_request()->mutable_run_function();
  run->set_name(name);
  run->set_signature(signature);
  for (const auto& arg : args) wire::encode_value(f, *run->add_args(), arg);
  return fuzz::wire_bytes(std::move(f));
}

std::string worker_requests() {
  std::string out = run_function(1, "fuzz.add_one", worker_function<std::int64_t(std::int64_t)>::signature(),
                                 {value(std::int64_t{41})});
  out += run_function(2, "fuzz.describe", worker_function<std::string(std::string, double, bool)>::signature(),
                      {value(std::string("x")), value(2.5), value(true)});
  out += run_function(3, "fuzz.sum", worker_function<double(tensor)>::signature(), {value(floats({1, 2}, {2}))});
  auto create = request(4);
  auto* c = create.message.mutable_request()->mutable_create_iterator();
  c->set_function("fuzz.numbers");
  c->set_id(9);
  c->set_worker_index(0);
  c->set_num_workers(1);
  out += fuzz::wire_bytes(std::move(create));
  auto next = request(5);
  auto* run = next.message.mutable_request()->mutable_run_function();
  run->set_name("fuzz.next");
  run->set_signature(worker_function<std::int64_t(per_worker_iterator<std::int64_t>)>::signature());
  run->add_args()->mutable_per_worker()->set_id(9);
  run->mutable_args(0)->mutable_per_worker()->set_function("fuzz.numbers");
  out += fuzz::wire_bytes(std::move(next));
  // A per-worker variable and a resource, used by a function, read, then released.
  auto variable = request(6);
  auto* v = variable.message.mutable_request()->mutable_create_per_worker_variable();
  v->set_id(10);
  set_ref(*v->mutable_variable(), "fuzz.seen", {2});
  wire::put_tensor(variable, *v->mutable_initial_value(), floats({1, 2}, {2}));
  out += fuzz::wire_bytes(std::move(variable));
  auto resource = request(7);
  auto* r = resource.message.mutable_request()->mutable_create_resource();
  r->set_function("fuzz.names");
  r->set_id(11);
  r->set_worker_index(0);
  r->set_num_workers(1);
  out += fuzz::wire_bytes(std::move(resource));
  auto use = request(8);
  auto* u = use.message.mutable_request()->mutable_run_function();
  u->set_name("fuzz.count");
  u->set_signature(
      worker_function<double(per_worker_variable<float>, per_worker_resource<std::string>)>::signature());
  u->add_args()->mutable_per_worker()->set_id(10);
  u->mutable_args(0)->mutable_per_worker()->set_function("fuzz.seen");
  u->add_args()->mutable_per_worker()->set_id(11);
  u->mutable_args(1)->mutable_per_worker()->set_function("fuzz.names");
  out += fuzz::wire_bytes(std::move(use));
  auto read = request(9);
  auto* rd = read.message.mutable_request()->mutable_read_per_worker_variable();
  rd->set_id(10);
  set_ref(*rd->mutable_variable(), "fuzz.seen", {2});
  out += fuzz::wire_bytes(std::move(read));
  auto release = request(10);
  release.message.mutable_request()->mutable_release_iterator()->set_id(10);
  out += fuzz::wire_bytes(std::move(release));
  return out;
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::string be32(std::uint32_t v) { return {char(v >> 24), char(v >> 16), char(v >> 8), char(v)}; }

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: seed_corpus CORPUS_DIR\n");
    return 2;
  }
  root = argv[1];

  // frame_reader: byte 0 bit 0 = handshake limits, bit 1 = segment destination.
  const std::string hello_ps = fuzz::wire_bytes(fuzz::hello("ps", 1));
  const std::string requests = ps_requests();
  put("frame_reader", "hello", flag(1) + hello_ps);
  put("frame_reader", "hello_and_requests", flag(0) + hello_ps + requests);
  put("frame_reader", "requests_into_destinations", flag(2) + requests);
  put("frame_reader", "truncated_header", flag(0) + hello_ps.substr(0, 20));
  put("frame_reader", "truncated_segment", flag(0) + requests.substr(0, 60));
  put("frame_reader", "payload_in_handshake", flag(1) + requests.substr(0, 200));
  put("frame_reader", "heartbeats", flag(0) + fuzz::wire_bytes(fuzz::heartbeat(1)) + fuzz::wire_bytes(fuzz::heartbeat(2)));
  put("frame_reader", "not_pscoro", flag(0) + "GET / HTTP/1.1\r\nHost: x\r\n\r\n");

  // ps and worker: byte 0 bit 0 = a valid Hello of a new session goes first.
  put("ps", "requests", flag(1) + requests);
  put("ps", "kernel_pool", flag(1) + ps_kernel_requests());
  put("ps", "hash_table", flag(1) + ps_table_requests());
  put("ps", "streamed_reply", flag(1) + ps_streamed_reply_requests(false));
  put("ps", "streamed_reply_cut", flag(1) + ps_streamed_reply_requests(true));
  put("ps", "own_hello", flag(0) + hello_ps + fuzz::wire_bytes(fuzz::heartbeat(1)));
  put("ps", "worker_hello", flag(0) + [] {
    auto h = fuzz::hello("ps", 1);
    h.message.mutable_hello()->set_job("worker");
    return fuzz::wire_bytes(std::move(h));
  }());
  put("ps", "truncated_request", flag(1) + requests.substr(0, requests.size() / 2));
  put("ps", "run_function_on_ps", flag(1) + run_function(1, "fuzz.add_one", "int64(int64)", {value(std::int64_t{1})}));
  // The chief ends the job: the server obeys and stops; the harness starts a fresh one.
  const std::string shutdown = [] {
    wire::frame f;
    f.kind = wire::frame_kind::request;
    f.request_id = 99;
    f.message.mutable_request()->mutable_shutdown()->set_exit_code(3);
    return fuzz::wire_bytes(std::move(f));
  }();
  put("ps", "chief_shutdown", flag(1) + requests + shutdown);
  const std::string worker = worker_requests();
  put("worker", "chief_shutdown", flag(1) + shutdown + fuzz::wire_bytes(fuzz::heartbeat(100)));
  put("worker", "requests", flag(1) + worker);
  put("worker", "own_hello", flag(0) + fuzz::wire_bytes(fuzz::hello("worker", 1)) + worker);
  put("worker", "wrong_signature", flag(1) + run_function(1, "fuzz.add_one", "int64(float64)", {value(1.5)}));
  put("worker", "unknown_function", flag(1) + run_function(1, "fuzz.none", "void()", {}));
  put("worker", "truncated", flag(1) + worker.substr(0, worker.size() - 5));
  put("worker", "variable_request", flag(1) + requests.substr(0, 120));

  // tf_config.
  put("tf_config", "ps_cluster",
      R"({"cluster": {"chief": ["host0:2222"], "worker": ["host1:2222", "host2:2222"], "ps": ["host3:2222"]},)"
      R"( "task": {"type": "worker", "index": 1}, "rpc_layer": "grpc"})");
  put("tf_config", "sparse",
      R"({"cluster": {"chief": ["c:1"], "worker": {"1": "w1:2222", "7": "w7:2222"}, "ps": ["p:1"]},)"
      R"( "task": {"type": "ps", "index": 0}, "environment": "cloud"})");
  put("tf_config", "bare_cluster", R"({"worker": [], "ps": {"0": "[::1]:5"}, "evaluator": ["e:1"]})");
  put("tf_config", "broken", R"({"cluster": {"worker": ["a:1", 2]}, "task": {"type": "worker", "index": -1})");
  put("tf_config", "empty", "");
  put("tf_config", "huge_sparse_index", R"({"worker": [], "ps": {"33333300": "[wr1]B5"}, "eva": ["~e:00"]})");

  // safetensors: a pscoro-style checkpoint (two tensors, step, scalars, checksums) and plain files.
  {
    std::vector<safetensors::entry> entries{{"w", dtype::float32, {2, 2}, 0, 16}, {"step_ids", dtype::int64, {2}, 0, 16}};
    const std::vector<float> w{1, 2, 3, 4};
    const std::vector<std::int64_t> ids{7, 9};
    std::string data(reinterpret_cast<const char*>(w.data()), 16);
    data.append(reinterpret_cast<const char*>(ids.data()), 16);
    safetensors::metadata_map metadata{
        {"format", "pscoro.checkpoint"}, {"format_version", "1"}, {"step", "42"}, {"scalars", R"({"loss": 0.25})"},
        {"slots", "[]"},
        {"crc32c", fmt::format(R"({{"w": "{:08x}", "step_ids": "{:08x}"}})", common::crc32c(data.data(), 16),
                               common::crc32c(data.data() + 16, 16))}};
    const auto header = safetensors::encode_header(entries, metadata);
    put("safetensors", "checkpoint", header + data);
    put("safetensors", "truncated", (header + data).substr(0, header.size() + 20));
    std::vector<safetensors::entry> plain{{"x", dtype::float64, {1}, 0, 8}};
    put("safetensors", "plain", safetensors::encode_header(plain, {}) + std::string(8, '\x01'));
    put("safetensors", "short", std::string("\x10\0\0\0\0\0\0\0{}", 10));
    // Format version 2: the header signed by its own CRC-32C (its digits read as zeros), and the
    // same with a flipped byte of the step.
    {
      auto signed_metadata = metadata;
      signed_metadata["format_version"] = "2";
      signed_metadata["header_crc32c"] = "00000000";
      auto header_v2 = safetensors::encode_header(entries, signed_metadata);
      const std::string key = "\"header_crc32c\":\"";
      const auto at = header_v2.find(key) + key.size();
      header_v2.replace(at, 8, fmt::format("{:08x}", common::crc32c(header_v2.data(), header_v2.size())));
      put("safetensors", "checkpoint_v2", header_v2 + data);
      header_v2[header_v2.find("\"step\":\"4") + 8] = '5';
      put("safetensors", "checkpoint_v2_step_changed", header_v2 + data);
    }
    // A pscoro checkpoint without its checksums, or without one tensor's: refused whole.
    metadata.erase("crc32c");
    put("safetensors", "no_crc32c", safetensors::encode_header(entries, metadata) + data);
    metadata["crc32c"] = fmt::format(R"({{"w": "{:08x}"}})", common::crc32c(data.data(), 16));
    put("safetensors", "one_crc32c_missing", safetensors::encode_header(entries, metadata) + data);
  }

  // cache: byte 0 bit 0 clear, the file dataset::cache(filename) writes (in 1 MiB blocks and in
  // blocks of 16 bytes); set, a block size (byte 1, minus one) and the data, which the target frames.
  {
    const auto path = fs::temp_directory_path() / "pscoro-seed.cache";
    using example = std::tuple<xt::xarray<float>, std::int64_t, std::string>;
    const auto write = [&](auto elements, std::size_t block_size) {
      using codec = detail::cache_codec<typename decltype(elements)::value_type>;
      {
        detail::cache_file_writer out(path.string(), codec::signature(), block_size);
        for (const auto& e : elements) {
          out.begin_element();
          codec::write(out, e);
        }
        out.commit();
      }
      auto bytes = read_file(path);
      fs::remove(path);
      return bytes;
    };
    // The data of a file in blocks of 16: its bytes without the header and the checksums.
    const auto data_of = [](const std::string& file) {
      std::string out;
      for (std::size_t at = 16; at < file.size(); at += 20) {
        out += file.substr(at, std::min<std::size_t>(16, file.size() - at - 4));
      }
      return out;
    };
    const std::vector<std::string> texts{"abc", "", "defghijklmnopqrstuvwxyz"};
    const std::vector<example> examples{{xt::xarray<float>{{1, 2}, {3, 4}}, -7, "x"},
                                        {xt::xarray<float>(0.5f), 0, ""}};
    put("cache", "strings", flag(0) + write(texts, detail::cache_block_size));
    put("cache", "strings_small_blocks", flag(0) + write(texts, 16));
    const auto tuples = write(examples, 16);
    put("cache", "tuples_small_blocks", flag(0) + tuples);
    put("cache", "tuples", flag(0) + write(examples, detail::cache_block_size));
    put("cache", "truncated", flag(0) + tuples.substr(0, tuples.size() - 9));
    auto flipped = tuples;
    flipped[40] = static_cast<char>(flipped[40] ^ 1);
    put("cache", "flipped", flag(0) + flipped);
    put("cache", "framed_strings", flag(1) + flag(15) + data_of(write(texts, 16)));
    put("cache", "framed_tuples", flag(1) + flag(2) + data_of(tuples));
    // The format before checksums, which is never read.
    put("cache", "unchecked_format", flag(0) + "PSCACHE1" + std::string("\x06\0\0\0\0\0\0\0string", 14) +
                                         std::string("\x01\x01\0\0\0\0\0\0\0a\0\x01\0\0\0\0\0\0\0", 19));
  }

  // tfrecord: byte 0 bit 0 = the target gzips the rest.
  {
    const auto path = fs::temp_directory_path() / "pscoro-seed.tfrecord";
    {
      tfrecord_writer writer(path.string());
      tf_example example;
      example.features["label"] = std::vector<std::int64_t>{1};
      example.features["x"] = std::vector<float>{0.5f, -1.0f};
      example.features["id"] = std::vector<std::string>{"abc"};
      writer.write(serialize_tf_example(example));
      writer.write("not an example");
      writer.write("");
      writer.close();
    }
    const auto records = read_file(path);
    fs::remove(path);
    put("tfrecord", "examples", flag(0) + records);
    put("tfrecord", "examples_gzipped", flag(1) + records);
    put("tfrecord", "truncated", flag(0) + records.substr(0, records.size() - 7));
    auto flipped = records;
    flipped[20] = static_cast<char>(flipped[20] ^ 1);
    put("tfrecord", "bad_checksum", flag(0) + flipped);

    // Records only a hand-written writer produces, for tf_example_parser: unpacked lists, the key
    // after the value, unknown fields and a group, a repeated key, two Features, an empty Feature.
    namespace w = testing::wire;
    const auto entry = [](std::string_view key, std::string_view feature) {
      return w::len_field(1, w::len_field(1, key) + w::len_field(2, feature));
    };
    const std::string unusual =
        w::varint_field(5, 3) +
        w::len_field(1, entry("label", w::len_field(2, "")) + entry("label", w::len_field(3, w::varint_field(1, 1))) +
                            w::len_field(1, w::len_field(2, w::len_field(2, w::tag(1, 5) + w::float_bytes(0.5f) +
                                                                               w::tag(1, 5) + w::float_bytes(2))) +
                                                w::len_field(1, "x")) +
                            w::tag(7, 3) + w::varint_field(1, 9) + w::tag(7, 4) + entry("w", "")) +
        w::len_field(1, entry("id", w::len_field(1, w::len_field(1, "a") + w::tag(2, 1) + std::string(8, 'z') +
                                                       w::len_field(1, "b"))) +
                            entry("s", w::len_field(1, w::len_field(1, "one"))) + entry("unread", w::len_field(1, "")));
    const auto path2 = fs::temp_directory_path() / "pscoro-seed-unusual.tfrecord";
    {
      tfrecord_writer writer(path2.string());
      writer.write(unusual);
      writer.write(unusual.substr(0, unusual.size() - 3));
      writer.write(w::len_field(1, entry("label", w::len_field(3, w::len_field(1, w::varint(~std::uint64_t{0}))))));
      writer.write(w::len_field(1, entry("label", w::len_field(3, "")) + entry("unread", "\xff\xff")));
      writer.close();
    }
    put("tfrecord", "unusual_examples", flag(0) + read_file(path2));
    fs::remove(path2);
  }

  // idx: byte 0 bit 0 = the target gzips the rest.
  {
    std::string bytes = std::string("\0\0\x08\x03", 4) + be32(3) + be32(2) + be32(2);
    for (int i = 0; i < 12; ++i) bytes += char(i * 20);
    put("idx", "u8", flag(0) + bytes);
    put("idx", "u8_gzipped", flag(1) + bytes);
    std::string doubles = std::string("\0\0\x0e\x01", 4) + be32(2) + std::string(16, '\x3f');
    put("idx", "f64", flag(0) + doubles);
    put("idx", "truncated_gzipped", flag(1) + bytes.substr(0, bytes.size() - 3));
    put("idx", "huge_row_gzipped", flag(1) + std::string("\0\0\x0e\x02", 4) + be32(1) + be32(0xffffffffu) + "abc");
  }
  std::printf("wrote the seed corpus under %s\n", root.c_str());
  return 0;
}

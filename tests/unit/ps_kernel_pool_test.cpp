// The ps's kernel pool: big kernels run off the executor while requests for other variables pass,
// requests for one variable keep their arrival order, and a variable deleted, a session ended or a
// ps destroyed while a kernel runs gives its waiting requests a clear error. A test hook holds the
// kernel on the pool thread until the test lets it go, so nothing here depends on timing: the
// executor is driven with poll() (every request that can make progress does) before the release.
#include "ps/ps_service.hpp"
#include "wire/frame.hpp"
#include "wire/values.hpp"

#include <pscoro/server.hpp>

#include "test_support.hpp"

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>

#include <atomic>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace pscoro;

constexpr std::size_t kp_rows = 256, kp_cols = 4;  // 4 KiB of float32

variable_ref kp_ref(const std::string& name) { return {name, dtype::float32, {kp_rows, kp_cols}, 0}; }

tensor kp_values(float first, float step, std::size_t rows = kp_rows) {
  auto t = tensor::uninitialized(dtype::float32, {rows, kp_cols});
  for (std::size_t i = 0; i < t.size(); ++i) t.mutable_data<float>()[i] = first + step * static_cast<float>(i % 97);
  return t;
}

wire::frame kp_create(const std::string& name, const tensor& initial) {
  wire::frame f;
  f.kind = wire::frame_kind::request;
  auto* body = f.message.mutable_request()->mutable_create_variable();
  wire::encode_ref(*body->mutable_variable(), kp_ref(name));
  wire::put_tensor(f, *body->mutable_initial_value(), initial);
  return f;
}

wire::frame kp_update(const std::string& name, wire::UpdateVariable::Op op, const tensor& value,
                      std::optional<std::pair<std::uint64_t, std::uint64_t>> rows = std::nullopt) {
  wire::frame f;
  f.kind = wire::frame_kind::request;
  auto* body = f.message.mutable_request()->mutable_update_variable();
  wire::encode_ref(*body->mutable_variable(), kp_ref(name));
  body->set_op(op);
  if (rows) {
    body->mutable_rows()->set_begin(rows->first);
    body->mutable_rows()->set_end(rows->second);
  }
  wire::put_tensor(f, *body->mutable_value(), value);
  return f;
}

wire::frame kp_adagrad(const std::string& name, const tensor& gradient) {
  wire::frame f;
  f.kind = wire::frame_kind::request;
  auto* body = f.message.mutable_request()->mutable_apply_gradient();
  wire::encode_ref(*body->mutable_variable(), kp_ref(name));
  body->mutable_optimizer()->set_kind(wire::Optimizer::ADAGRAD);
  body->mutable_optimizer()->set_learning_rate(0.1);
  body->mutable_optimizer()->set_initial_accumulator_value(0.1);
  body->mutable_optimizer()->set_epsilon(1e-7);
  wire::put_tensor(f, *body->mutable_gradient(), gradient);
  return f;
}

wire::frame kp_read(const std::string& name) {
  wire::frame f;
  f.kind = wire::frame_kind::request;
  wire::encode_ref(*f.message.mutable_request()->mutable_read_variable()->mutable_variable(), kp_ref(name));
  return f;
}

// A sparse read of rows `ids`.
wire::frame kp_gather(const std::string& name, const std::vector<std::int64_t>& ids) {
  wire::frame f;
  f.kind = wire::frame_kind::request;
  auto* body = f.message.mutable_request()->mutable_read_variable();
  wire::encode_ref(*body->mutable_variable(), kp_ref(name));
  wire::put_tensor(f, *body->mutable_indices(), detail::vector_tensor(ids));
  return f;
}

wire::frame kp_delete(const std::string& name) {
  wire::frame f;
  f.kind = wire::frame_kind::request;
  wire::encode_ref(*f.message.mutable_request()->mutable_delete_variable()->mutable_variable(), kp_ref(name));
  return f;
}

using kp_list = std::vector<std::string>;

// "a, b, c": doctest prints a string, not a vector.
std::string kp_joined(const kp_list& tags) {
  std::string out;
  for (const auto& tag : tags) out += (out.empty() ? "" : ", ") + tag;
  return out;
}

int kp_code(const wire::frame& response) { return response.message.response().status().code(); }
std::string kp_message(const wire::frame& response) { return response.message.response().status().message(); }

std::vector<float> kp_floats(const wire::frame& response) {
  REQUIRE_MESSAGE(kp_code(response) == 0, kp_message(response));
  const auto t = wire::get_tensor(response, response.message.response().result().tensor());
  return {t.data<float>(), t.data<float>() + t.size()};
}

// A ps whose kernels of at least `offload_bytes` run on its pool, each held by the hook until
// release() (or run at once when the hook is off), and the executor the test drives.
struct kp_fixture {
  explicit kp_fixture(std::uint64_t offload_bytes = 1, bool check_numerics = false) {
    server_options options;
    options.ps_kernel_offload_bytes = offload_bytes;
    options.check_numerics = check_numerics;
    ps.emplace("ps:0", options);
    ps->set_kernel_hook([held = held, released = released] {
      held->fetch_add(1);
      while (!released->load()) std::this_thread::yield();
    });
  }
  ~kp_fixture() {
    release();
    ps.reset();
  }

  // Serves `request` through serve(); its response lands in responses[tag] and tag in `order`.
  void send(std::string tag, wire::frame request) {
    asio::co_spawn(io, ps->serve(std::move(request)), [this, tag](std::exception_ptr e, wire::frame response) {
      REQUIRE(e == nullptr);
      order.push_back(tag);
      responses.emplace(tag, std::move(response));
    });
  }
  // Runs every handler that can run now (a held kernel's continuation cannot), without waiting.
  void settle() {
    io.restart();
    io.poll();
  }
  void release() { released->store(true); }
  // Until `n` kernels have reached the hook (the pool thread picks them up in its own time).
  void wait_held(int n) const {
    while (held->load() < n) std::this_thread::yield();
  }
  void finish() {
    release();
    io.restart();
    io.run();
  }
  const wire::frame& response(const std::string& tag) {
    const auto it = responses.find(tag);
    REQUIRE_MESSAGE(it != responses.end(), "no response to " << tag);
    return it->second;
  }

  asio::io_context io;
  std::optional<ps::ps_service> ps;
  std::shared_ptr<std::atomic<int>> held = std::make_shared<std::atomic<int>>(0);
  std::shared_ptr<std::atomic<bool>> released = std::make_shared<std::atomic<bool>>(false);
  std::vector<std::string> order;
  std::map<std::string, wire::frame> responses;
};

}  // namespace

TEST_CASE("requests for one variable are applied in arrival order while its kernels run on the pool") {
  // Whole-variable updates (8 KiB of work) go to the pool; one-row updates and reads stay small but
  // must wait for them. The same requests served one by one by handle() give the expected values.
  const std::vector<std::pair<std::string, wire::frame>> requests = {
      {"add", kp_update("w", wire::UpdateVariable::ADD, kp_values(1, 0.5f))},
      {"mul row 0", kp_update("w", wire::UpdateVariable::MUL, kp_values(2, 0, 1), std::pair{0, 1})},
      {"read 1", kp_read("w")},
      {"adagrad", kp_adagrad("w", kp_values(-0.25f, 0.01f))},
      {"assign rows 3-5", kp_update("w", wire::UpdateVariable::ASSIGN, kp_values(7, 1, 2), std::pair{3, 5})},
      {"read slot", kp_read("w/adagrad/accumulator")},
      {"sub", kp_update("w", wire::UpdateVariable::SUB, kp_values(0.5f, 0.125f))},
      {"adagrad 2", kp_adagrad("w", kp_values(0.75f, -0.02f))},
      {"read 2", kp_read("w")},
  };
  ps::ps_service sequential("ps:1");
  REQUIRE(kp_code(sequential.handle(kp_create("w", kp_values(0, 1)))) == 0);
  std::map<std::string, wire::frame> expected;
  for (const auto& [tag, request] : requests) expected.emplace(tag, sequential.handle(request));

  kp_fixture f(4096);
  f.send("create", kp_create("w", kp_values(0, 1)));
  f.settle();
  for (const auto& [tag, request] : requests) f.send(tag, request);
  f.settle();
  // The first kernel holds the lane: nothing after it has been answered.
  f.wait_held(1);
  CHECK(kp_joined(f.order) == kp_joined(kp_list({"create"})));
  f.finish();
  std::vector<std::string> arrival{"create"};
  for (const auto& [tag, _] : requests) arrival.push_back(tag);
  CHECK(kp_joined(f.order) == kp_joined(arrival));
  for (const auto& request : requests) {
    const std::string& tag = request.first;  // a name, not a binding: doctest's lambdas capture it
    const auto& got = f.response(tag);
    CHECK_MESSAGE(kp_code(got) == kp_code(expected.at(tag)), tag << ": " << kp_message(got));
    if (got.message.response().has_result()) {
      CHECK_MESSAGE(kp_floats(got) == kp_floats(expected.at(tag)), tag);
    }
  }
  // Four whole-variable kernels ran on the pool; the small ones ran on the executor.
  CHECK(f.ps->offloaded_kernels() == 4);
}

TEST_CASE("a request for another variable is answered while a kernel runs") {
  kp_fixture f;
  f.send("create w", kp_create("w", kp_values(0, 1)));
  f.send("create v", kp_create("v", kp_values(5, 0)));
  f.settle();
  f.send("adagrad w", kp_adagrad("w", kp_values(1, 0)));
  f.send("read v", kp_read("v"));
  f.send("add v", kp_update("v", wire::UpdateVariable::ADD, kp_values(1, 0)));
  f.settle();
  // The kernel of w is held on the pool thread; v's read was answered meanwhile, and v's update
  // queued behind w's kernel on the one kernel thread (its lane is v's, not w's).
  f.wait_held(1);
  CHECK(kp_joined(f.order) == kp_joined(kp_list({"create w", "create v", "read v"})));
  CHECK(kp_floats(f.response("read v")) == std::vector<float>(kp_rows * kp_cols, 5.0f));
  f.finish();
  CHECK(f.order.size() == 5);
  CHECK(kp_code(f.response("adagrad w")) == 0);
  CHECK(kp_code(f.response("add v")) == 0);
}

TEST_CASE("a big sparse read's reply is gathered as it is sent: another variable's read passes, its update waits for the last row") {
  kp_fixture f;  // offload_bytes 1: every sparse read's reply is filled as it is sent
  f.release();
  const tensor initial = kp_values(0, 1);
  f.send("create w", kp_create("w", initial));
  f.send("create v", kp_create("v", kp_values(5, 0)));
  f.settle();
  const std::vector<std::int64_t> ids{3, 0, 3, 255};
  f.send("gather w", kp_gather("w", ids));
  f.send("add w", kp_update("w", wire::UpdateVariable::ADD, kp_values(1, 0)));
  f.send("read v", kp_read("v"));
  f.settle();
  // The gather's answer is out, with its rows still to be filled; the add waits for them.
  CHECK(kp_joined(f.order) == kp_joined(kp_list({"create w", "create v", "gather w", "read v"})));
  auto& gathered = f.responses.at("gather w");
  REQUIRE(gathered.produce_last);
  CHECK(f.ps->offloaded_kernels() == 0);  // the add's kernel was not handed to the pool either
  wire::produce_whole(gathered);  // what the connection does, a step per turn, as it sends it
  CHECK_FALSE(gathered.produce_last);
  f.finish();
  CHECK(kp_joined(f.order) == kp_joined(kp_list({"create w", "create v", "gather w", "read v", "add w"})));
  // The rows as they were before the add, which waited for the last of them.
  std::vector<float> expected;
  for (const auto id : ids) {
    const float* row = initial.data<float>() + static_cast<std::size_t>(id) * kp_cols;
    expected.insert(expected.end(), row, row + kp_cols);
  }
  CHECK(kp_floats(gathered) == expected);
  CHECK(kp_code(f.response("add w")) == 0);
}

TEST_CASE("a reply dropped before it is filled lets its variable go; an old session's reply does not touch the next's") {
  // Sparse reads of 2048 rows (32 KiB) are filled as they are sent; the 4 KiB adds run on the
  // executor at once when their turn comes, so every step here is decided by poll() alone.
  kp_fixture f(64 << 10);
  const std::vector<std::int64_t> many(2048, 5);
  f.send("create w", kp_create("w", kp_values(0, 1)));
  f.settle();
  f.send("gather w", kp_gather("w", many));
  f.send("add w", kp_update("w", wire::UpdateVariable::ADD, kp_values(1, 0)));
  f.settle();
  CHECK(kp_joined(f.order) == kp_joined(kp_list({"create w", "gather w"})));
  // As a connection that closes drops the frames it has not sent.
  REQUIRE(f.responses.at("gather w").produce_last);
  f.responses.at("gather w").produce_last = nullptr;
  f.settle();
  CHECK(kp_joined(f.order) == kp_joined(kp_list({"create w", "gather w", "add w"})));
  CHECK(kp_code(f.response("add w")) == 0);

  // A reply of a session that ended, dropped after the next session holds the same name's lane.
  f.send("gather old", kp_gather("w", many));
  f.settle();
  auto old = std::move(f.responses.at("gather old").produce_last);
  REQUIRE(old);
  f.ps->clear();
  f.send("create w again", kp_create("w", kp_values(7, 0)));
  f.send("gather new", kp_gather("w", many));
  f.send("add again", kp_update("w", wire::UpdateVariable::ADD, kp_values(1, 0)));
  f.settle();
  old = nullptr;  // must not let "add again" pass "gather new"'s unfilled rows
  f.settle();
  CHECK(kp_joined(f.order) ==
        kp_joined(kp_list({"create w", "gather w", "add w", "gather old", "create w again", "gather new"})));
  auto& fresh = f.responses.at("gather new");
  wire::produce_whole(fresh);
  f.settle();
  CHECK(kp_floats(fresh) == std::vector<float>(many.size() * kp_cols, 7.0f));
  CHECK(kp_code(f.response("add again")) == 0);
}

TEST_CASE("a small request on an idle variable runs on the executor at once; a big kernel goes to the pool") {
  kp_fixture f(1 << 20);  // the default threshold: 1 MiB of work
  f.release();
  f.send("create", kp_create("w", kp_values(0, 1)));
  f.send("add", kp_update("w", wire::UpdateVariable::ADD, kp_values(1, 0)));
  f.settle();  // no kernel thread needed: both answered here
  CHECK(kp_joined(f.order) == kp_joined(kp_list({"create", "add"})));
  CHECK(f.ps->offloaded_kernels() == 0);

  const std::size_t big_rows = (1 << 20) / (kp_cols * sizeof(float));  // 1 MiB
  auto big = [&](const std::string& name) { return variable_ref{name, dtype::float32, {big_rows, kp_cols}, 0}; };
  wire::frame create;
  create.kind = wire::frame_kind::request;
  wire::encode_ref(*create.message.mutable_request()->mutable_create_variable()->mutable_variable(), big("big"));
  wire::put_tensor(create, *create.message.mutable_request()->mutable_create_variable()->mutable_initial_value(),
                   kp_values(1, 0, big_rows));
  f.send("create big", std::move(create));
  wire::frame add;
  add.kind = wire::frame_kind::request;
  auto* body = add.message.mutable_request()->mutable_update_variable();
  wire::encode_ref(*body->mutable_variable(), big("big"));
  body->set_op(wire::UpdateVariable::ADD);
  wire::put_tensor(add, *body->mutable_value(), kp_values(2, 0, big_rows));
  f.send("add big", std::move(add));
  f.finish();
  CHECK(kp_code(f.response("add big")) == 0);
  CHECK(f.ps->offloaded_kernels() == 1);
}

TEST_CASE("a variable deleted while its kernel runs is deleted after it, and a later read finds it gone") {
  kp_fixture f;
  f.send("create", kp_create("w", kp_values(0, 1)));
  f.settle();
  f.send("adagrad", kp_adagrad("w", kp_values(1, 0)));
  f.send("delete", kp_delete("w"));
  f.send("read", kp_read("w"));
  f.settle();
  f.wait_held(1);
  CHECK(kp_joined(f.order) == kp_joined(kp_list({"create"})));
  f.finish();
  CHECK(kp_joined(f.order) == kp_joined(kp_list({"create", "adagrad", "delete", "read"})));
  CHECK(kp_code(f.response("adagrad")) == 0);
  CHECK(kp_code(f.response("delete")) == 0);
  CHECK(kp_code(f.response("read")) == static_cast<int>(errc::not_found));
  CHECK(f.ps->num_variables() == 0);
  CHECK(f.ps->held_bytes() == 0);
}

TEST_CASE("a session ended while a kernel runs fails its request and those waiting, and the next session starts clean") {
  kp_fixture f;
  f.send("create", kp_create("w", kp_values(0, 1)));
  f.settle();
  f.send("adagrad", kp_adagrad("w", kp_values(1, 0)));
  f.send("read", kp_read("w"));
  f.settle();
  f.wait_held(1);
  f.ps->clear();
  f.settle();
  CHECK(kp_joined(f.order) == kp_joined(kp_list({"create", "read"})));
  CHECK(kp_code(f.response("read")) == static_cast<int>(errc::aborted));
  CHECK(contains(kp_message(f.response("read")), "session ended"));
  // The next session's w is another variable: made at once, and its kernel queues behind the old
  // one on the kernel thread.
  f.send("create again", kp_create("w", kp_values(3, 0)));
  f.send("add again", kp_update("w", wire::UpdateVariable::ADD, kp_values(1, 0)));
  f.send("read again", kp_read("w"));
  f.settle();
  CHECK(kp_joined(f.order) == kp_joined(kp_list({"create", "read", "create again"})));
  f.finish();
  CHECK(kp_code(f.response("adagrad")) == static_cast<int>(errc::aborted));
  CHECK(contains(kp_message(f.response("adagrad")), "session ended"));
  CHECK(kp_code(f.response("add again")) == 0);
  CHECK(kp_floats(f.response("read again")) == std::vector<float>(kp_rows * kp_cols, 4.0f));
}

TEST_CASE("a ps destroyed while a kernel runs answers its request and those waiting with unavailable") {
  kp_fixture f;
  f.send("create", kp_create("w", kp_values(0, 1)));
  f.settle();
  f.send("adagrad", kp_adagrad("w", kp_values(1, 0)));
  f.send("read", kp_read("w"));
  f.settle();
  f.wait_held(1);
  f.release();
  f.ps.reset();  // waits for the kernel; the continuations run on the executor afterwards
  f.finish();
  REQUIRE(f.order.size() == 3);
  CHECK(kp_code(f.response("adagrad")) == static_cast<int>(errc::unavailable));
  CHECK(kp_code(f.response("read")) == static_cast<int>(errc::unavailable));
  CHECK(contains(kp_message(f.response("read")), "stopped"));
}

TEST_CASE("a ps whose kernels are stopped finishes the running one and runs later ones on the executor") {
  kp_fixture f;
  f.send("create", kp_create("w", kp_values(0, 1)));
  f.settle();
  f.send("add", kp_update("w", wire::UpdateVariable::ADD, kp_values(1, 0)));
  f.send("read", kp_read("w"));
  f.settle();
  f.wait_held(1);
  f.release();
  f.ps->stop_kernels();  // what a stopped server does: waits for the kernel
  CHECK(f.ps->offloaded_kernels() == 1);
  f.send("add again", kp_update("w", wire::UpdateVariable::ADD, kp_values(1, 0)));
  f.send("read again", kp_read("w"));
  f.finish();
  CHECK(kp_joined(f.order) == kp_joined(kp_list({"create", "add", "read", "add again", "read again"})));
  CHECK(f.ps->offloaded_kernels() == 1);
  auto expected = kp_floats(f.response("read"));
  for (auto& x : expected) x += 1;
  CHECK(kp_floats(f.response("read again")) == expected);
}

TEST_CASE("with check_numerics on, a big value is scanned on the pool before anything changes") {
  kp_fixture f(1, true);
  const tensor initial = kp_values(0, 1);
  f.send("create w", kp_create("w", initial));
  f.send("create v", kp_create("v", kp_values(5, 0)));
  f.settle();
  // The creates' initial values are being scanned on the pool, held by the hook: let them go.
  f.release();
  f.finish();
  REQUIRE(f.ps->offloaded_scans() == 2);
  f.released->store(false);

  auto with_nan = kp_values(1, 0);
  with_nan.mutable_data<float>()[1 * kp_cols + 2] = std::numeric_limits<float>::quiet_NaN();
  f.send("add NaN to w", kp_update("w", wire::UpdateVariable::ADD, with_nan));
  f.send("read v", kp_read("v"));
  f.send("read w", kp_read("w"));
  f.settle();
  // The scan is held on the pool thread: v's read passed it, w's read waits its turn.
  REQUIRE_MESSAGE(f.ps->offloaded_scans() == 3, "the add's value was not sent to the pool to be scanned");
  f.wait_held(3);
  CHECK(kp_joined(f.order) == kp_joined(kp_list({"create w", "create v", "read v"})));
  f.finish();
  CHECK(kp_joined(f.order) == kp_joined(kp_list({"create w", "create v", "read v", "add NaN to w", "read w"})));
  CHECK(kp_code(f.response("add NaN to w")) == static_cast<int>(errc::invalid_argument));
  CHECK(kp_message(f.response("add NaN to w")) ==
        "assign_add to 'w': element [1, 2] of the value is NaN (server_options::check_numerics is on)");
  CHECK(kp_floats(f.response("read w")) == std::vector<float>(initial.data<float>(), initial.data<float>() + initial.size()));
  CHECK(f.ps->offloaded_scans() == 3);
  CHECK(f.ps->offloaded_kernels() == 0);  // the add never ran

  // A finite value passes its scan, then its kernel runs, both on the pool.
  f.send("add 1 to w", kp_update("w", wire::UpdateVariable::ADD, kp_values(1, 0)));
  f.send("read w again", kp_read("w"));
  f.finish();
  CHECK(kp_code(f.response("add 1 to w")) == 0);
  auto expected = std::vector<float>(initial.data<float>(), initial.data<float>() + initial.size());
  for (auto& x : expected) x += 1;
  CHECK(kp_floats(f.response("read w again")) == expected);
  CHECK(f.ps->offloaded_scans() == 4);
  CHECK(f.ps->offloaded_kernels() == 1);
}

TEST_CASE("an integer division's divisors are scanned on the pool: a zero is refused, naming the element") {
  kp_fixture f;  // check_numerics off: only the divisors are scanned
  f.release();
  const variable_ref ref{"n", dtype::int32, {kp_rows, kp_cols}, 0};
  auto ints = [](std::int32_t value) {
    auto t = tensor::uninitialized(dtype::int32, {kp_rows, kp_cols});
    for (std::size_t i = 0; i < t.size(); ++i) t.mutable_data<std::int32_t>()[i] = value;
    return t;
  };
  wire::frame create;
  create.kind = wire::frame_kind::request;
  wire::encode_ref(*create.message.mutable_request()->mutable_create_variable()->mutable_variable(), ref);
  wire::put_tensor(create, *create.message.mutable_request()->mutable_create_variable()->mutable_initial_value(),
                   ints(12));
  f.send("create n", std::move(create));
  auto divide = [&](const tensor& divisors) {
    wire::frame div;
    div.kind = wire::frame_kind::request;
    auto* body = div.message.mutable_request()->mutable_update_variable();
    wire::encode_ref(*body->mutable_variable(), ref);
    body->set_op(wire::UpdateVariable::DIV);
    wire::put_tensor(div, *body->mutable_value(), divisors);
    return div;
  };
  auto with_zero = ints(3);
  with_zero.mutable_data<std::int32_t>()[2 * kp_cols + 1] = 0;
  f.send("divide by a zero", divide(with_zero));
  f.send("divide by 3", divide(ints(3)));
  wire::frame read;
  read.kind = wire::frame_kind::request;
  wire::encode_ref(*read.message.mutable_request()->mutable_read_variable()->mutable_variable(), ref);
  f.send("read n", std::move(read));
  f.finish();
  CHECK(kp_joined(f.order) == kp_joined(kp_list({"create n", "divide by a zero", "divide by 3", "read n"})));
  CHECK(kp_message(f.response("divide by a zero")) ==
        "assign_div to 'n': integer division by zero (element [2, 1] of the divisor)");
  REQUIRE(kp_code(f.response("read n")) == 0);
  const auto& got = f.response("read n");
  const auto values = wire::get_tensor(got, got.message.response().result().tensor());
  CHECK(std::vector<std::int32_t>(values.data<std::int32_t>(), values.data<std::int32_t>() + values.size()) ==
        std::vector<std::int32_t>(kp_rows * kp_cols, 4));  // 12 / 3 once: the refused division changed nothing
  CHECK(f.ps->offloaded_scans() == 2);  // the two divisions'; the create's int values need no scan
}

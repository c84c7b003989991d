// Servers refuse what their role cannot do, and configuration they cannot use, with clear errors.
#include "local_cluster.hpp"
#include "net/peer.hpp"
#include "raw_client.hpp"
#include "test_support.hpp"
#include "wire/values.hpp"


#include <chrono>
#include <future>
#include <optional>

using namespace pscoro;
using pscoro::testing::local_cluster;
using pscoro::testing::raw_client;

namespace {

const cluster_spec spec{{"ps", {"127.0.0.1:0"}}, {"worker", {"127.0.0.1:0"}}};

wire::Hello chief_hello(std::uint64_t session) { return net::make_hello({"chief", 0, 0}, session); }

// Sends `request` to `job`:0 of `cluster` after the handshake `hello` and returns the response
// status; call() sends it as the chief of coordinator session `session` would.
wire::Status call_as(local_cluster& cluster, const std::string& job, wire::frame request, const wire::Hello& hello) {
  return testing::call_task(job + ":0", cluster.spec.task_address(job, 0), std::move(request), hello)
      .message.response()
      .status();
}

wire::Status call(local_cluster& cluster, const std::string& job, wire::frame request, std::uint64_t session = 1) {
  return call_as(cluster, job, std::move(request), chief_hello(session));
}

// How `job`:0 of `cluster` refuses a connection with `hello` (it must refuse).
remote_error refusal_of(local_cluster& cluster, const std::string& job, const wire::Hello& hello) {
  asio::io_context io;
  const auto task = job + ":0";  // named: g++ 12 destroys a co_await's temporaries early
  const auto address = cluster.spec.task_address(job, 0);
  const transport_options options;
  auto refused = asio::co_spawn(
      io,
      [&]() -> asio::awaitable<std::optional<remote_error>> {
        try {
          co_await net::connect_to_task(task, address, hello, options);
        } catch (const remote_error& e) {
          co_return e;
        }
        co_return std::nullopt;
      },
      asio::use_future);
  io.run();
  auto e = refused.get();
  REQUIRE(e);
  return *e;
}

}  // namespace

TEST_CASE("a server runs only ps and worker tasks listed in the spec") {
  asio::io_context io;
  CHECK_THROWS_WITH_AS(server(io.get_executor(), simple_cluster_resolver(spec, "chief", 0)),
                       "a server runs a 'ps' or 'worker' task, not 'chief'", error);
  CHECK_THROWS_WITH_AS(server(io.get_executor(), simple_cluster_resolver(spec, "ps")), "the ps task has no index",
                       error);
  CHECK_THROWS_WITH_AS(server(io.get_executor(), simple_cluster_resolver(spec, "ps", 3)),
                       "No task with index 3 in job 'ps'", error);
}

TEST_CASE("a malformed listen address is refused with the task and the address") {
  asio::io_context io;
  server_options options;
  options.listen_address = "no-port-here";
  server bad_host(io.get_executor(), simple_cluster_resolver(spec, "ps", 0), options);
  CHECK_THROWS_WITH_AS(bad_host.start(), "address 'no-port-here' of ps:0 is not host:port", error);
  options.listen_address = "127.0.0.1:99999";
  server bad_port(io.get_executor(), simple_cluster_resolver(spec, "ps", 0), options);
  CHECK_THROWS_WITH_AS(bad_port.start(), "address '127.0.0.1:99999' of ps:0 has an invalid port", error);
}

TEST_CASE("a server that cannot listen says on which address and which step failed") {
  asio::io_context io;
  server first(io.get_executor(), simple_cluster_resolver(spec, "ps", 0));
  first.start();
  server_options options;
  options.listen_address = first.address();  // taken
  server second(io.get_executor(), simple_cluster_resolver(spec, "ps", 0), options);
  try {
    second.start();
    FAIL("two servers listen on ", first.address());
  } catch (const error& e) {
    CHECK(e.code() == errc::unavailable);
    CHECK(contains(e.what(), fmt::format("ps:0 cannot listen on {} ({}): bind failed: ", first.address(),
                                         first.address())));
  }
  options.listen_address = "no-such-host.invalid:0";
  server unresolved(io.get_executor(), simple_cluster_resolver(spec, "ps", 0), options);
  try {
    unresolved.start();
    FAIL("a server listens on an address that does not resolve");
  } catch (const error& e) {
    CHECK(e.code() == errc::unavailable);
    CHECK(contains(e.what(), "ps:0 cannot listen on no-such-host.invalid:0: the address does not resolve: "));
  }
}

TEST_CASE("a server with a cluster secret listens on all interfaces unless its address is loopback, like TF's") {
  asio::io_context io;
  server_options options;
  options.transport.auth_secret = "a cluster secret of 32 bytes....";
  // A Kubernetes service name need not resolve to an address of this pod: only its port is used.
  const cluster_spec service{{"ps", {"test-tfjob-ps-0.ns2.svc.invalid:0"}}, {"worker", {"127.0.0.1:0"}}};
  server ps(io.get_executor(), simple_cluster_resolver(service, "ps", 0), options);
  ps.start();
  CHECK(starts_with(ps.address(), "0.0.0.0:"));
  CHECK(ps.port() != 0);
  server worker(io.get_executor(), simple_cluster_resolver(service, "worker", 0), options);
  worker.start();
  CHECK(starts_with(worker.address(), "127.0.0.1:"));
  options.listen_address = "127.0.0.1:0";
  server ps_on_loopback(io.get_executor(), simple_cluster_resolver(service, "ps", 0), options);
  ps_on_loopback.start();
  CHECK(starts_with(ps_on_loopback.address(), "127.0.0.1:"));
}

TEST_CASE("without a cluster secret a server listens on loopback only, unless the user accepts the risk") {
  asio::io_context io;
  const cluster_spec service{{"ps", {"test-tfjob-ps-0.ns2.svc.invalid:0"}}, {"worker", {"127.0.0.1:0"}}};
  server exposed(io.get_executor(), simple_cluster_resolver(service, "ps", 0));
  try {
    exposed.start();
    FAIL("a server without a secret listened on every interface");
  } catch (const error& e) {
    CHECK(e.code() == errc::invalid_argument);
    CHECK(contains(e.what(), "ps:0 will not listen on 0.0.0.0:0 without a cluster secret: anyone who can "
                             "reach that port could take the job over"));
    CHECK(contains(e.what(), "PSCORO_ALLOW_INSECURE=1"));
  }
  server_options insecure;
  insecure.transport.allow_insecure = true;
  server allowed(io.get_executor(), simple_cluster_resolver(service, "ps", 0), insecure);
  allowed.start();
  CHECK(starts_with(allowed.address(), "0.0.0.0:"));

  ::setenv("PSCORO_ALLOW_INSECURE", "1", 1);
  server allowed_by_environment(io.get_executor(), simple_cluster_resolver(service, "ps", 0));
  allowed_by_environment.start();
  CHECK(starts_with(allowed_by_environment.address(), "0.0.0.0:"));
  ::setenv("PSCORO_ALLOW_INSECURE", "perhaps", 1);
  CHECK_THROWS_WITH_AS(server(io.get_executor(), simple_cluster_resolver(service, "ps", 0)),
                       "PSCORO_ALLOW_INSECURE is 'perhaps': use 1 (listen anywhere without a cluster secret) or 0",
                       error);
  ::unsetenv("PSCORO_ALLOW_INSECURE");
}

TEST_CASE("only the chief ends the job or deletes a variable: a worker is refused, the chief's Shutdown stops the server") {
  std::promise<int> shutdown_code;
  server_options options;
  options.on_shutdown = [&](int code) { shutdown_code.set_value(code); };
  local_cluster cluster(1, 1, {}, options);
  wire::frame create;
  auto* variable = create.message.mutable_request()->mutable_create_variable();
  wire::encode_ref(*variable->mutable_variable(), variable_ref{"w", dtype::float32, {2}, 0});
  variable->mutable_initializer()->set_kind(wire::Initializer::ONES);
  variable->mutable_initializer()->add_full_shape(2);
  REQUIRE(call(cluster, "ps", std::move(create)).code() == 0);  // opens session 1

  auto shutdown = [](int code) {
    wire::frame f;
    f.message.mutable_request()->mutable_shutdown()->set_exit_code(code);
    return f;
  };
  const auto refused = call_as(cluster, "ps", shutdown(0), net::make_hello({"worker", 0, 7}, 1));
  CHECK(refused.code() == static_cast<int>(errc::permission_denied));
  CHECK(contains(refused.message(), "ps:0 takes Shutdown only from the chief; worker:0 at 127.0.0.1:"));
  CHECK(contains(refused.message(), " may not end the job"));
  wire::frame read;
  wire::encode_ref(*read.message.mutable_request()->mutable_read_variable()->mutable_variable(),
                      variable_ref{"w", dtype::float32, {2}, 0});
  CHECK(call(cluster, "ps", read).code() == 0);  // the variable is still there
  wire::frame remove;
  wire::encode_ref(*remove.message.mutable_request()->mutable_delete_variable()->mutable_variable(),
                      variable_ref{"w", dtype::float32, {2}, 0});
  const auto not_removed = call_as(cluster, "ps", remove, net::make_hello({"worker", 0, 7}, 1));
  CHECK(not_removed.code() == static_cast<int>(errc::permission_denied));
  CHECK(contains(not_removed.message(), " may not delete variables"));
  CHECK(call(cluster, "ps", read).code() == 0);
  CHECK(call(cluster, "ps", remove).code() == 0);  // the chief may
  const auto gone = call(cluster, "ps", read);
  CHECK(gone.code() == static_cast<int>(errc::not_found));
  CHECK(gone.message() == "read: variable 'w' does not exist on ps:0");

  CHECK(call(cluster, "ps", shutdown(3)).code() == 0);
  auto stopped = shutdown_code.get_future();
  REQUIRE_MESSAGE(stopped.wait_for(std::chrono::seconds(60)) == std::future_status::ready,
                  "ps:0 did not stop within a minute of answering the chief's Shutdown");
  CHECK(stopped.get() == 3);
  try {
    raw_client late(cluster.spec.task_address("ps", 0));
    FAIL("ps:0 still accepts connections after the chief ended the job");
  } catch (const std::system_error& e) {
    CHECK(e.code() == asio::error::connection_refused);
  }
}

TEST_CASE("only workers bind worker functions") {
  asio::io_context io;
  server ps(io.get_executor(), simple_cluster_resolver(spec, "ps", 0));
  const worker_function<void()> f{"test.f"};
  try {
    ps.bind(f, []() -> asio::awaitable<void> { co_return; });
    FAIL("a ps bound a worker function");
  } catch (const error& e) {
    CHECK(e.code() == errc::failed_precondition);
    CHECK(contains(e.what(), "ps:0 is not a worker: it cannot bind 'test.f'"));
  }
  const dataset_function<std::int64_t> d{"test.d"};
  try {
    ps.bind(d, [](input_context) { return from_values(std::vector<std::int64_t>{1}); });
    FAIL("a ps bound a dataset function");
  } catch (const error& e) {
    CHECK(e.code() == errc::failed_precondition);
    CHECK(contains(e.what(), "ps:0 is not a worker: it cannot bind 'test.d'"));
  }
}

TEST_CASE("a ps runs no functions and a worker holds no variables") {
  local_cluster cluster(1, 1);
  wire::frame run;
  run.message.mutable_request()->mutable_run_function()->set_name("model.step");
  auto status = call(cluster, "ps", std::move(run));
  CHECK(status.code() == static_cast<int>(errc::failed_precondition));
  CHECK(contains(status.message(), "ps:0 is a parameter server and runs no worker functions ('model.step'"));

  wire::frame release;
  release.message.mutable_request()->mutable_release_iterator()->set_id(1);
  status = call(cluster, "ps", std::move(release));
  CHECK(status.code() == static_cast<int>(errc::failed_precondition));
  CHECK(status.message() == "ps:0 is a parameter server and holds no iterators");

  wire::frame read;
  wire::encode_ref(*read.message.mutable_request()->mutable_read_variable()->mutable_variable(),
                      variable_ref{"w", dtype::float32, {2}, 0});
  status = call(cluster, "worker", std::move(read));
  CHECK(status.code() == static_cast<int>(errc::failed_precondition));
  CHECK(status.message() == "worker:0 is a worker and holds no variables");
}

TEST_CASE("a ps builds no datasets and a worker refuses an impossible input context") {
  const dataset_function<std::int64_t> numbers{"test.numbers"};
  local_cluster cluster(1, 1, [&](server& s) {
    s.bind(numbers, [](input_context) { return from_values(std::vector<std::int64_t>{1, 2}); });
  });
  auto create = [](std::int64_t index, std::int64_t workers) {
    wire::frame f;
    auto* body = f.message.mutable_request()->mutable_create_iterator();
    body->set_function("test.numbers");
    body->set_id(1);
    body->set_worker_index(index);
    body->set_num_workers(workers);
    return f;
  };
  auto status = call(cluster, "ps", create(0, 1));
  CHECK(status.code() == static_cast<int>(errc::failed_precondition));
  CHECK(contains(status.message(), "ps:0 is a parameter server and builds no datasets ('test.numbers'"));
  status = call(cluster, "worker", create(2, 2));
  CHECK(status.code() == static_cast<int>(errc::invalid_argument));
  CHECK(status.message() == "input context of 'test.numbers': worker 2 of 2 is not a valid place");
  CHECK(call(cluster, "worker", create(0, 1)).code() == 0);
}

TEST_CASE("a worker keeps a per-worker variable only with a matching initial value and answers only a matching reader; a ps holds none") {
  local_cluster cluster(1, 1);
  auto create = [](std::uint64_t id, shape_type shape, std::optional<shape_type> initial) {
    wire::frame f;
    auto* body = f.message.mutable_request()->mutable_create_per_worker_variable();
    body->set_id(id);
    wire::encode_ref(*body->mutable_variable(), variable_ref{"v", dtype::float32, std::move(shape), 0});
    if (initial) {
      auto value = tensor::uninitialized(dtype::float32, *initial);
      for (std::size_t i = 0; i < value.size(); ++i) value.mutable_data<float>()[i] = static_cast<float>(i);
      wire::put_tensor(f, *body->mutable_initial_value(), value);
    }
    return f;
  };
  auto read = [](std::uint64_t id, dtype type) {
    wire::frame f;
    auto* body = f.message.mutable_request()->mutable_read_per_worker_variable();
    body->set_id(id);
    wire::encode_ref(*body->mutable_variable(), variable_ref{"v", type, {2}, 0});
    return f;
  };
  auto status = call(cluster, "ps", create(5, {2}, shape_type{2}));
  CHECK(status.code() == static_cast<int>(errc::failed_precondition));
  CHECK(status.message() == "ps:0 is a parameter server and holds no per-worker variables");
  status = call(cluster, "worker", create(5, {2}, shape_type{3}));
  CHECK(status.code() == static_cast<int>(errc::invalid_argument));
  CHECK(status.message() == "per-worker variable 'v' is float32 [2] but its initial value is float32 [3]");
  status = call(cluster, "worker", create(5, {2}, std::nullopt));
  CHECK(status.code() == static_cast<int>(errc::invalid_argument));
  CHECK(status.message() == "per-worker variable 'v' comes without an initial value");
  // Nothing was kept by the refusals.
  status = call(cluster, "worker", read(5, dtype::float32));
  CHECK(status.code() == static_cast<int>(errc::not_found));
  CHECK(contains(status.message(), "per-worker variable 5 ('v') does not exist on this worker"));
  REQUIRE(call(cluster, "worker", create(5, {2}, shape_type{2})).code() == 0);
  CHECK(call(cluster, "worker", read(5, dtype::float32)).code() == 0);
  status = call(cluster, "worker", read(5, dtype::float64));
  CHECK(status.code() == static_cast<int>(errc::invalid_argument));
  CHECK(status.message() == "per-worker variable 5 is 'v' float32 [2] on worker:0, not 'v' float64 [2]");
  status = call(cluster, "worker", read(6, dtype::float32));
  CHECK(status.code() == static_cast<int>(errc::not_found));

  wire::frame resource;
  resource.message.mutable_request()->mutable_create_resource()->set_function("test.table");
  status = call(cluster, "ps", std::move(resource));
  CHECK(status.code() == static_cast<int>(errc::failed_precondition));
  CHECK(contains(status.message(), "ps:0 is a parameter server and builds no per-worker resources ('test.table'"));
}

TEST_CASE("a tensor that does not match its segment fails that request only") {
  local_cluster cluster(1, 1);
  wire::frame create;
  auto* body = create.message.mutable_request()->mutable_create_variable();
  wire::encode_ref(*body->mutable_variable(), variable_ref{"w", dtype::float32, {4}, 0});
  wire::put_tensor(create, *body->mutable_initial_value(), tensor::uninitialized(dtype::float32, {4}));
  body->mutable_initial_value()->set_shape(0, 5);  // claims 20 bytes, the segment has 16
  auto status = call(cluster, "ps", std::move(create));
  CHECK(status.code() == static_cast<int>(errc::invalid_argument));
  CHECK(contains(status.message(), "float32 tensor of shape [5] needs 20 bytes but its segment has 16"));
  CHECK(status.origin_task() == "ps:0");

  // The ps still serves, and holds no half-made variable.
  cluster.run_chief([](parameter_server_strategy& strategy, cluster_coordinator&) -> asio::awaitable<void> {
    const xt::xarray<float> initial{1, 2, 3, 4};
    auto w = co_await strategy.scope().create_variable("w", initial);
    CHECK((co_await w.read() == initial));
  });
}

TEST_CASE("an unknown dtype in a variable handle is invalid_argument") {
  local_cluster cluster(1, 1);
  wire::frame read;
  auto* ref = read.message.mutable_request()->mutable_read_variable()->mutable_variable();
  ref->set_name("w");
  ref->set_dtype(99);
  const auto status = call(cluster, "ps", std::move(read));
  CHECK(status.code() == static_cast<int>(errc::invalid_argument));
  CHECK(status.message() == "variable 'w' has unknown dtype 99");
}

TEST_CASE("row ranges and slots on a ps: bad ranges, shapes and owners are refused") {
  local_cluster cluster(1, 1);
  const variable_ref w{"w", dtype::float32, {3, 2}, 0};
  wire::frame make_w;
  auto* make = make_w.message.mutable_request()->mutable_create_variable();
  wire::encode_ref(*make->mutable_variable(), w);
  make->mutable_initializer()->set_kind(wire::Initializer::ONES);
  make->mutable_initializer()->add_full_shape(3);
  make->mutable_initializer()->add_full_shape(2);
  REQUIRE(call(cluster, "ps", std::move(make_w)).code() == 0);
  auto read_rows = [&](std::uint64_t begin, std::uint64_t end) {
    wire::frame f;
    auto* read = f.message.mutable_request()->mutable_read_variable();
    wire::encode_ref(*read->mutable_variable(), w);
    read->mutable_rows()->set_begin(begin);
    read->mutable_rows()->set_end(end);
    return call(cluster, "ps", std::move(f));
  };
  CHECK(read_rows(1, 3).code() == 0);
  auto status = read_rows(2, 4);
  CHECK(status.code() == static_cast<int>(errc::invalid_argument));
  CHECK(status.message() == "read of 'w': rows [2, 4) are not within [0, 3)");
  CHECK(read_rows(2, 1).code() == static_cast<int>(errc::invalid_argument));
  wire::frame both;
  auto* read = both.message.mutable_request()->mutable_read_variable();
  wire::encode_ref(*read->mutable_variable(), w);
  read->mutable_rows()->set_end(1);
  wire::put_tensor(both, *read->mutable_indices(), tensor::uninitialized(dtype::int64, {1}));
  status = call(cluster, "ps", std::move(both));
  CHECK(status.code() == static_cast<int>(errc::invalid_argument));
  CHECK(status.message() == "read of 'w': rows and indices exclude each other");

  wire::frame assign;
  auto* update = assign.message.mutable_request()->mutable_update_variable();
  wire::encode_ref(*update->mutable_variable(), w);
  update->mutable_rows()->set_begin(1);
  update->mutable_rows()->set_end(3);
  wire::put_tensor(assign, *update->mutable_value(), tensor::uninitialized(dtype::float32, {1, 2}));
  status = call(cluster, "ps", std::move(assign));
  CHECK(status.code() == static_cast<int>(errc::invalid_argument));
  CHECK(status.message() == "assign to rows [1, 3) of 'w': shape [1, 2] is not [2, 2]");

  wire::frame slot;
  auto* create = slot.message.mutable_request()->mutable_create_variable();
  wire::encode_ref(*create->mutable_variable(), variable_ref{"v/adam/m", dtype::float32, {3, 2}, 0});
  create->mutable_initializer()->set_kind(wire::Initializer::ZEROS);
  create->mutable_initializer()->add_full_shape(3);
  create->mutable_initializer()->add_full_shape(2);
  create->mutable_slot_of()->set_variable("v");
  status = call(cluster, "ps", std::move(slot));
  CHECK(status.code() == static_cast<int>(errc::invalid_argument));
  CHECK(contains(status.message(), "'v/adam/m' cannot be a slot of 'v'"));

  wire::frame list;
  wire::encode_ref(*list.message.mutable_request()->mutable_list_slots()->mutable_variable(), w);
  CHECK(call(cluster, "ps", std::move(list)).code() == 0);
}

TEST_CASE("a new coordinator session releases the old one's variables; the old session is refused from then on") {
  local_cluster cluster(1, 1);
  auto create_w = [] {
    wire::frame f;
    auto* make = f.message.mutable_request()->mutable_create_variable();
    wire::encode_ref(*make->mutable_variable(), variable_ref{"w", dtype::float32, {2}, 0});
    make->mutable_initializer()->set_kind(wire::Initializer::ONES);
    make->mutable_initializer()->add_full_shape(2);
    return f;
  };
  REQUIRE(call(cluster, "ps", create_w(), 1).code() == 0);
  CHECK(call(cluster, "ps", create_w(), 1).code() == static_cast<int>(errc::already_exists));  // same session
  // A restarted chief (session 2) finds nothing of session 1 and can create the same names again.
  REQUIRE(call(cluster, "ps", create_w(), 2).code() == 0);

  // Session 1 has ended: a Hello of it is refused, naming both sessions.
  const auto ended = refusal_of(cluster, "ps", chief_hello(1));
  CHECK(ended.code() == errc::aborted);
  CHECK(ended.origin_task() == "ps:0");
  const auto& message = ended.remote_message();
  CHECK(contains(message, "coordinator session 0000000000000001 of chief:0 at 127.0.0.1:"));
  CHECK(contains(message, "has ended on ps:0: a newer coordinator (session 0000000000000002) took over"));
  CHECK(call(cluster, "ps", create_w(), 2).code() == static_cast<int>(errc::already_exists));  // session 2 goes on

  // A chief's Hello that names no session checks who answers: welcomed, and no session changes. A
  // worker's is refused.
  {
    asio::io_context io;
    const auto address = cluster.spec.task_address("ps", 0);
    auto checked = asio::co_spawn(io, net::connect_to_task("ps:0", address, chief_hello(0), {}), asio::use_future);
    io.run();
    checked.get()->close("checked");
  }
  CHECK(call(cluster, "ps", create_w(), 2).code() == static_cast<int>(errc::already_exists));  // session 2 goes on
  CHECK(contains(refusal_of(cluster, "ps", net::make_hello({"worker", 0, 0}, 0)).what(),
                 "names no coordinator session"));
}

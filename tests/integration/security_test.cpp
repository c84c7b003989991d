// Who may talk to a task: with a cluster secret every connection proves it both ways; a stranger
// without it (or with another, or replaying a recorded handshake) is refused and changes nothing;
// only the chief opens a session; the chief checks who answered.
#include "file_faults.hpp"
#include "local_cluster.hpp"
#include "net/peer.hpp"
#include "net/security.hpp"
#include "raw_client.hpp"

#include <asio/experimental/as_tuple.hpp>
#include <asio/read.hpp>
#include <asio/write.hpp>

#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

using namespace pscoro;
using pscoro::testing::code_of;
using pscoro::testing::hello_of;
using pscoro::testing::local_cluster;
using pscoro::testing::message_of;
using pscoro::testing::refusal_of;
using pscoro::testing::raw_client;

namespace {

const std::string secret = "the test cluster's secret, 41 bytes long";
const std::string other_secret = "a stranger's secret that is not the job's";

server_options servers_with(const std::string& s) {
  server_options options;
  options.transport.auth_secret = s;
  return options;
}

strategy_options chief_with(const std::string& s) {
  strategy_options options;
  options.transport.auth_secret = s;
  return options;
}

transport_options stranger_with(const std::string& s) {
  transport_options options;
  options.auth_secret = s;
  options.connect_timeout = std::chrono::seconds(5);
  return options;
}

// The job's variable is untouched and its workers still run functions in its session.
asio::awaitable<void> check_job_untouched(cluster_coordinator& coordinator, variable<float>& v, float expected_sum) {
  CHECK(static_cast<double>(xt::sum(co_await v.read())()) == doctest::Approx(expected_sum));
  auto result = coordinator.schedule(testing::add_one, v);
  CHECK(co_await result.get() == doctest::Approx(expected_sum + 2));
}

// A scoped environment variable.
struct environment_variable {
  environment_variable(const char* name, const std::string& value) : name_(name) { ::setenv(name, value.c_str(), 1); }
  ~environment_variable() { ::unsetenv(name_); }
  const char* name_;
};

}  // namespace

TEST_CASE("a cluster whose tasks share the secret trains: the chief, workers and ps all prove it") {
  local_cluster cluster(2, 2, testing::bind_add_one, servers_with(secret));
  cluster.run_chief(
      [](parameter_server_strategy& strategy, cluster_coordinator& coordinator) -> asio::awaitable<void> {
        const xt::xarray<float> zeros = xt::zeros<float>({2});
        auto v0 = co_await strategy.scope().create_variable("v0", zeros);
        auto v1 = co_await strategy.scope().create_variable("v1", zeros);  // on ps:1
        std::vector<remote_value<double>> sums;
        for (int i = 0; i < 10; ++i) sums.push_back(coordinator.schedule(testing::add_one, i % 2 ? v1 : v0));
        co_await coordinator.join();
        CHECK(xt::sum(co_await v0.read())() == doctest::Approx(10));
        CHECK(xt::sum(co_await v1.read())() == doctest::Approx(10));
      },
      {}, chief_with(secret));
}

TEST_CASE("a stranger without the secret, or with another, cannot open a session; the job is untouched") {
  local_cluster cluster(1, 1, testing::bind_add_one, servers_with(secret));
  cluster.run_chief(
      [&](parameter_server_strategy& strategy, cluster_coordinator& coordinator) -> asio::awaitable<void> {
        const xt::xarray<float> initial{1, 2};
        auto v = co_await strategy.scope().create_variable("v", initial);
        for (const std::string job : {"ps", "worker"}) {
          const auto task = job + ":0";
          const auto address = cluster.spec.task_address(job, 0);
          INFO("stranger at ", task);
          // A new session would end the job's: the servers would drop its variables and iterators.
          const auto hello = hello_of("chief", 0x5742414e47455231);

          const auto without_secret = stranger_with(""), with_other_secret = stranger_with(other_secret);
          const auto no_secret_refusal = co_await refusal_of(task, address, hello, without_secret);
          CHECK(no_secret_refusal.code == errc::unauthenticated);
          CHECK(contains(no_secret_refusal.text, "sent no proof of the cluster secret and " + task +
                                                " requires one"));

          // The stranger checks the server's proof first and gives up; the server refuses it as well.
          const auto wrong_refusal = co_await refusal_of(task, address, hello, with_other_secret);
          CHECK(wrong_refusal.code == errc::unauthenticated);
          CHECK(contains(wrong_refusal.text, task + " at " + address + " failed to prove the cluster secret"));
        }
        co_await check_job_untouched(coordinator, v, 3);
      },
      {}, chief_with(secret));
}

TEST_CASE("the handshake proofs are HMAC-SHA256 over the transcript docs/protocol.md describes") {
  // Expected values computed independently (Python's hmac) from the description in protocol.md §4.
  wire::Hello hello;
  hello.set_protocol_version(3);
  hello.set_job("chief");
  hello.set_incarnation(1);
  hello.set_session(1);
  hello.set_to_job("ps");
  auto* ps = hello.add_cluster();
  ps->set_name("ps");
  (*ps->mutable_tasks())[0] = "127.0.0.1:1";
  auto* workers = hello.add_cluster();
  workers->set_name("worker");
  (*workers->mutable_tasks())[1] = "127.0.0.1:3";  // inserted out of order: the transcript sorts them
  (*workers->mutable_tasks())[0] = "127.0.0.1:2";
  hello.set_nonce(std::string(32, 'a'));
  wire::Challenge challenge;
  challenge.set_job("ps");
  challenge.set_incarnation(2);
  challenge.set_nonce(std::string(32, 'b'));
  const auto hex = [](const std::string& bytes) {
    std::string out;
    for (const unsigned char b : bytes) out += fmt::format("{:02x}", b);
    return out;
  };
  const std::string key = "0123456789abcdef";
  CHECK(hex(net::handshake_proof(key, net::handshake_side::accepting, hello, challenge)) ==
        "25753d1b5767d75db1f034d3b9408a4b7d9ffa9edf2b962a83040fb4a40e2384");
  CHECK(hex(net::handshake_proof(key, net::handshake_side::connecting, hello, challenge)) ==
        "6bef5fef8a24821ab0c188e81c29794b76fd567cb29977fe3e95f92235439902");
}

TEST_CASE("a stranger who proves a wrong secret to a server is refused by it") {
  // The stranger skips its own check of the server's proof, as a hostile peer would.
  local_cluster cluster(1, 1, testing::bind_add_one, servers_with(secret));
  raw_client c(cluster.spec.task_address("ps", 0));
  wire::frame f;
  f.kind = wire::frame_kind::hello;
  auto& hello = *f.message.mutable_hello() = hello_of("chief", 7);
  hello.set_to_job("ps");
  hello.set_nonce(net::random_nonce());
  const wire::Hello sent = hello;
  c.send(wire::encode(std::move(f)));
  const auto challenge = c.read_frame();
  REQUIRE(challenge.kind == wire::frame_kind::challenge);
  wire::frame proof;
  proof.kind = wire::frame_kind::proof;
  proof.message.mutable_proof()->set_proof(net::handshake_proof(
      other_secret, net::handshake_side::connecting, sent, challenge.message.challenge()));
  c.send(wire::encode(std::move(proof)));
  const auto refused = pscoro::testing::refusal(c.read_until_closed());
  CHECK(contains(refused, "failed to prove the cluster secret (a different secret, or a replayed handshake)"));
}

TEST_CASE("a recorded handshake replayed on a new connection is refused") {
  local_cluster cluster(1, 1, testing::bind_add_one, servers_with(secret));
  const auto ps = cluster.spec.task_address("ps", 0);
  // A real handshake, as the chief would do it, recorded byte for byte.
  wire::Hello hello = hello_of("chief", 7);
  hello.set_to_job("ps");
  hello.set_nonce(net::random_nonce());
  wire::frame hello_frame;
  hello_frame.kind = wire::frame_kind::hello;
  *hello_frame.message.mutable_hello() = hello;
  const auto recorded_hello = pscoro::testing::as_string(wire::encode(std::move(hello_frame)));
  std::string recorded_proof;
  {
    raw_client c(ps);
    c.send(recorded_hello);
    const auto challenge = c.read_frame();
    REQUIRE(challenge.kind == wire::frame_kind::challenge);
    CHECK(net::verify_handshake_proof(secret, net::handshake_side::accepting, hello,
                                          challenge.message.challenge(), challenge.message.challenge().proof()));
    wire::frame proof;
    proof.kind = wire::frame_kind::proof;
    proof.message.mutable_proof()->set_proof(net::handshake_proof(
        secret, net::handshake_side::connecting, hello, challenge.message.challenge()));
    recorded_proof = pscoro::testing::as_string(wire::encode(std::move(proof)));
    c.send(recorded_proof);
    const auto welcome = c.read_frame();
    REQUIRE(welcome.kind == wire::frame_kind::welcome);
    CHECK(welcome.message.welcome().status().code() == 0);
  }
  // The replay: the server's new nonce makes the old proof worthless.
  raw_client replay(ps);
  replay.send(recorded_hello);
  CHECK(replay.read_frame().kind == wire::frame_kind::challenge);
  replay.send(recorded_proof);
  const auto refused = pscoro::testing::refusal(replay.read_until_closed());
  CHECK(contains(refused, "failed to prove the cluster secret (a different secret, or a replayed handshake)"));
}

TEST_CASE("a task with a secret and a task without one refuse each other, naming why") {
  SUBCASE("servers with a secret, a chief without") {
    local_cluster cluster(1, 1, testing::bind_add_one, servers_with(secret));
    const auto e = pscoro::testing::connect_failure(cluster.spec, {});
    CHECK(e.code() == errc::unauthenticated);
    CHECK(contains(e.what(), "sent no proof of the cluster secret and ps:0 requires one"));
  }
  SUBCASE("servers without a secret, a chief with one") {
    local_cluster cluster(1, 1, testing::bind_add_one);
    const auto e = pscoro::testing::connect_failure(cluster.spec, chief_with(secret));
    CHECK(e.code() == errc::unauthenticated);
    CHECK(contains(e.what(), "authenticates with a cluster secret but ps:0 has none"));
  }
}

TEST_CASE("only the chief opens a session: an evaluator, or a worker of another session, is refused") {
  local_cluster cluster(1, 1, testing::bind_add_one, servers_with(secret));
  cluster.run_chief(
      [&](parameter_server_strategy& strategy, cluster_coordinator& coordinator) -> asio::awaitable<void> {
        const xt::xarray<float> initial{1, 2};
        auto v = co_await strategy.scope().create_variable("v", initial);
        // An evaluator started against the live job holds the job's secret: its role is what is refused.
        for (const std::string job : {"ps", "worker"}) {
          const auto task = job + ":0";
          // Named: g++ 12 destroys a co_await's temporaries early.
          const auto address = cluster.spec.task_address(job, 0);
          const auto evaluator = hello_of("evaluator", 99);
          const auto with_secret = stranger_with(secret);
          const auto evaluator_refusal = co_await refusal_of(task, address, evaluator, with_secret);
          CHECK(evaluator_refusal.code == errc::permission_denied);
          CHECK(contains(evaluator_refusal.text, task + " does not accept connections from 'evaluator' tasks: "
                                                 "only the chief opens a coordinator session"));
        }
        const std::string ps = "ps:0";
        const auto ps_address = cluster.spec.task_address("ps", 0);
        const auto worker = hello_of("worker", 99);
        const auto with_secret = stranger_with(secret);
        const auto worker_refusal = co_await refusal_of(ps, ps_address, worker, with_secret);
        CHECK(worker_refusal.code == errc::aborted);
        CHECK(contains(worker_refusal.text, "is not open on ps:0: only the chief opens a session"));
        co_await check_job_untouched(coordinator, v, 3);
      },
      {}, chief_with(secret));
}

TEST_CASE("the chief checks who answered: a spec naming the wrong task's address fails at once") {
  for (const auto& s : {std::string(), secret}) {
    const std::string which = s.empty() ? "without a secret" : "with a secret";
    INFO(which);
    local_cluster cluster(1, 1, testing::bind_add_one, servers_with(s));
    const cluster_spec swapped{{"ps", {cluster.spec.task_address("worker", 0)}},
                               {"worker", {cluster.spec.task_address("ps", 0)}}};
    const auto e = pscoro::testing::connect_failure(swapped, chief_with(s));
    CHECK(e.code() == errc::failed_precondition);
    // Refused by the task reached, before it acted on the Hello: it joined no session.
    CHECK(contains(e.what(), "(claims chief:0) dialled ps:0 but reached worker:0: its cluster spec names the "
                             "wrong address for ps:0"));
  }
}

TEST_CASE("the secret comes from the file PSCORO_AUTH_SECRET_FILE names") {
  const auto dir = std::filesystem::temp_directory_path() / ("pscoro-secret-test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto write = [&](const std::string& name, const std::string& content) {
    std::ofstream(dir / name, std::ios::binary) << content;
    return (dir / name).string();
  };
  {
    // A line break at the end (as `echo` writes it) is not part of the secret.
    environment_variable file("PSCORO_AUTH_SECRET_FILE", write("secret", secret + "\n"));
    local_cluster cluster(1, 1, testing::bind_add_one);
    cluster.run_chief(
        [&](parameter_server_strategy& strategy, cluster_coordinator& coordinator) -> asio::awaitable<void> {
          const xt::xarray<float> initial{1, 2};
          auto v = co_await strategy.scope().create_variable("v", initial);
          // Named: g++ 12 destroys a co_await's temporaries early.
          const std::string ps = "ps:0", worker = "worker:0";
          const auto ps_address = cluster.spec.task_address("ps", 0);
          const auto worker_address = cluster.spec.task_address("worker", 0);
          const auto chief_hello = hello_of("chief", 5), worker_hello = hello_of("worker", 5);
          const auto without_secret = stranger_with(""), with_secret = stranger_with(secret);
          const auto stranger_refusal = co_await refusal_of(ps, ps_address, chief_hello, without_secret);
          CHECK(stranger_refusal.code == errc::unauthenticated);
          // The file's secret less its line break: a peer holding it passes authentication (and is
          // then refused for its role, which is checked only after).
          const auto role_refusal = co_await refusal_of(worker, worker_address, worker_hello, with_secret);
          CHECK_MESSAGE(role_refusal.code == errc::permission_denied, role_refusal.text);
          co_await check_job_untouched(coordinator, v, 3);
        });
  }
  asio::io_context io;
  const cluster_spec spec{{"ps", {"127.0.0.1:0"}}, {"worker", {"127.0.0.1:0"}}};
  {
    environment_variable file("PSCORO_AUTH_SECRET_FILE", (dir / "missing").string());
    CHECK_THROWS_WITH_AS(server(io.get_executor(), simple_cluster_resolver(spec, "ps", 0)),
                         ("cannot read the cluster secret file '" + (dir / "missing").string() +
                          "' (PSCORO_AUTH_SECRET_FILE): No such file or directory")
                             .c_str(),
                         error);
  }
  {
    environment_variable file("PSCORO_AUTH_SECRET_FILE", write("short", "hunter2\n"));
    try {
      parameter_server_strategy strategy(io.get_executor(), simple_cluster_resolver(spec));
      FAIL("a 7-byte secret was accepted");
    } catch (const error& e) {
      CHECK(e.code() == errc::invalid_argument);
      CHECK(contains(e.what(), "has 7 bytes; at least 16 are needed"));
    }
  }
  server_options short_in_code;
  short_in_code.transport.auth_secret = "hunter2";
  CHECK_THROWS_WITH_AS(server(io.get_executor(), simple_cluster_resolver(spec, "ps", 0), short_in_code),
                       "transport_options::auth_secret has 7 bytes; at least 16 are needed", error);
  std::filesystem::remove_all(dir);
}

TEST_CASE("a secret file that is a FIFO, a directory, a device or too large is refused, naming it and the variable") {
  const auto dir = std::filesystem::temp_directory_path() / ("pscoro-secret-kinds-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  asio::io_context io;
  const cluster_spec spec{{"ps", {"127.0.0.1:0"}}, {"worker", {"127.0.0.1:0"}}};
  const auto refusal = [&](const std::string& path) {
    environment_variable file("PSCORO_AUTH_SECRET_FILE", path);
    try {
      server ps(io.get_executor(), simple_cluster_resolver(spec, "ps", 0));
      FAIL("the secret file '" << path << "' was accepted");
    } catch (const error& e) {
      CHECK(e.code() == errc::invalid_argument);
      return std::string(e.what());
    }
    return std::string();
  };
  const auto not_regular = [](const std::string& path, const std::string& kind) {
    return "the cluster secret file: " + path + " is " + kind +
           ", not a regular file (PSCORO_AUTH_SECRET_FILE must name a regular file)";
  };
  // A directory once failed with "basic_filebuf::underflow", /dev/zero read until std::bad_alloc.
  CHECK(refusal(dir.string()) == not_regular(dir.string(), "a directory"));
  CHECK(refusal("/dev/zero") == not_regular("/dev/zero", "a character device"));
  // A secret is tens of bytes: a file past 64 KiB is not one.
  const auto big = (dir / "big").string();
  std::ofstream(big, std::ios::binary) << std::string((64 << 10) + 1, 'x');
  CHECK(refusal(big) == "the cluster secret file '" + big + "' (PSCORO_AUTH_SECRET_FILE) holds more than 64 KiB, the "
                        "most a secret file may: is it the right file? (e.g. `openssl rand -hex 32 > " + big + "`)");
  std::ofstream(big, std::ios::binary) << std::string(64 << 10, 'x');  // at the cap: a secret
  environment_variable at_cap("PSCORO_AUTH_SECRET_FILE", big);
  CHECK(net::with_environment({}).auth_secret.size() == (64 << 10));
  // A FIFO with no writer once blocked the open for ever: the server is made on a thread that a
  // minute's watchdog fails and frees (it opens the FIFO's other end), so a regression fails.
  const testing::scoped_fifo fifo((dir / "fifo").string());
  {
    environment_variable file("PSCORO_AUTH_SECRET_FILE", fifo.path());
    const auto thrown = testing::thrown_without_blocking_on(
        fifo.path(), [&] { server ps(io.get_executor(), simple_cluster_resolver(spec, "ps", 0)); });
    REQUIRE_MESSAGE(thrown, "the secret file " << fifo.path() << ", a FIFO, was accepted");
    CHECK(code_of(thrown) == errc::invalid_argument);
    CHECK(message_of(thrown) == not_regular(fifo.path(), "a FIFO"));
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("before it proves the secret a peer can make a server hold no more than a small handshake frame") {
  local_cluster cluster(1, 1, testing::bind_add_one, servers_with(secret));
  const auto ps = cluster.spec.task_address("ps", 0);
  {
    raw_client c(ps);
    c.send(pscoro::testing::fixed_header(wire::frame_kind::hello, 1u << 20, 0));
    const auto refused = pscoro::testing::refusal(c.read_until_closed());
    CHECK(contains(refused, "frame header of 1048576 bytes exceeds the limit of 262144 bytes"));
  }
  {
    raw_client c(ps);
    c.send(pscoro::testing::fixed_header(wire::frame_kind::hello, 0, std::uint64_t{4} << 30));
    const auto refused = pscoro::testing::refusal(c.read_until_closed());
    CHECK(contains(refused, "frame payload of 4294967296 bytes exceeds the limit of 0 bytes"));
  }
}

TEST_CASE("a task that answers as another than the one dialled is not trusted") {
  // A rogue listener that welcomes anyone as worker:0 (a stale address, or something worse).
  asio::io_context io;
  asio::ip::tcp::acceptor rogue(io, {asio::ip::address_v4::loopback(), 0});
  const auto address = fmt::format("127.0.0.1:{}", rogue.local_endpoint().port());
  std::thread answer([&] {
    auto socket = rogue.accept();
    std::array<std::byte, wire::fixed_header_size> fixed;
    asio::read(socket, asio::buffer(fixed));
    std::string hello(wire::parse_fixed_header(fixed, {}).header_bytes, '\0');
    asio::read(socket, asio::buffer(hello));
    wire::frame welcome;
    welcome.kind = wire::frame_kind::welcome;
    welcome.message.mutable_welcome()->set_job("worker");
    asio::write(socket, asio::buffer(wire::encode(std::move(welcome)).head));
    char byte;
    std::error_code closed;
    socket.read_some(asio::buffer(&byte, 1), closed);  // until the chief hangs up
  });
  const cluster_spec spec{{"ps", {address}}, {"worker", {address}}};
  const auto e = pscoro::testing::connect_failure(spec, {});
  answer.join();
  CHECK(e.code() == errc::failed_precondition);
  CHECK(contains(e.what(), "dialled ps:0 at " + address +
                               " but worker:0 answered: the cluster spec names the wrong address for ps:0"));
}

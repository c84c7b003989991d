// Mutual TLS: a cluster whose tasks hold certificates of one CA trains over encrypted connections;
// a peer without TLS, or with a certificate of another CA, is refused on both sides and changes
// nothing. Certificates are made at test time with the `openssl` command.
#include "local_cluster.hpp"
#include "net/peer.hpp"
#include "raw_client.hpp"
#include "test_certificates.hpp"

using namespace pscoro;
using pscoro::testing::certificates;
using pscoro::testing::hello_of;
using pscoro::testing::local_cluster;
using pscoro::testing::refusal_of;

TEST_CASE("a cluster whose tasks hold certificates of one CA trains over TLS, with and without a secret") {
  const certificates certs;
  for (const std::string secret : {"", "the cluster secret next to TLS, 40 bytes"}) {
    const std::string which = secret.empty() ? "TLS alone" : "TLS and a secret";
    INFO(which);
    server_options servers;
    servers.transport = certs.transport();
    servers.transport.auth_secret = secret;
    strategy_options chief;
    chief.transport = servers.transport;
    local_cluster cluster(2, 2, testing::bind_add_one, servers);
    cluster.run_chief(
        [](parameter_server_strategy& strategy, cluster_coordinator& coordinator) -> asio::awaitable<void> {
          const xt::xarray<float> zeros = xt::zeros<float>({2});
          auto v0 = co_await strategy.scope().create_variable("v0", zeros);
          auto v1 = co_await strategy.scope().create_variable("v1", zeros);
          for (int i = 0; i < 10; ++i) coordinator.schedule(testing::add_one, i % 2 ? v1 : v0);
          co_await coordinator.join();
          CHECK(xt::sum(co_await v0.read())() == doctest::Approx(10));
          CHECK(xt::sum(co_await v1.read())() == doctest::Approx(10));
          // A large tensor crosses TLS records whole.
          const xt::xarray<float> big = xt::arange<float>(1 << 20);
          auto b = co_await strategy.scope().create_variable("big", big);
          CHECK((co_await b.read() == big));
        },
        {}, chief);
  }
}

TEST_CASE("a peer without TLS, or with a certificate of another CA, is refused; the job is untouched") {
  const certificates certs;
  server_options servers;
  servers.transport = certs.transport();
  strategy_options chief;
  chief.transport = servers.transport;
  local_cluster cluster(1, 1, testing::bind_add_one, servers);
  cluster.run_chief(
      [&](parameter_server_strategy& strategy, cluster_coordinator& coordinator) -> asio::awaitable<void> {
        const xt::xarray<float> initial{1, 2};
        auto v = co_await strategy.scope().create_variable("v", initial);
        for (const std::string job : {"ps", "worker"}) {
          const auto task = job + ":0";
          const auto address = cluster.spec.task_address(job, 0);
          const auto stranger = hello_of("chief", 0x5354524e47);  // of a new session
          INFO("stranger at ", task);
          const transport_options without_tls;  // named: g++ 12 destroys a co_await's temporaries early
          const auto plain_refusal = co_await refusal_of(task, address, stranger, without_tls);
          CHECK(plain_refusal.code == errc::unauthenticated);
          CHECK(contains(plain_refusal.text, task + " requires TLS with a certificate of the cluster CA"));

          // Its certificate is of another CA: the server refuses it, and it refuses the server's.
          const auto foreign_certificate = certs.transport("stranger", "cluster-ca");
          const auto foreign_refusal = co_await refusal_of(task, address, stranger, foreign_certificate);
          CHECK(foreign_refusal.code == errc::unauthenticated);
          CHECK(contains(foreign_refusal.text, "TLS handshake with " + task));
          const auto foreign_ca = certs.transport("stranger", "stranger-ca");
          const auto distrusting_refusal = co_await refusal_of(task, address, stranger, foreign_ca);
          CHECK(distrusting_refusal.code == errc::unauthenticated);
          CHECK(contains(distrusting_refusal.text, "certificate verify failed"));
        }
        CHECK(static_cast<double>(xt::sum(co_await v.read())()) == doctest::Approx(3));
        auto result = coordinator.schedule(testing::add_one, v);
        CHECK(co_await result.get() == doctest::Approx(5));
      },
      {}, chief);
}

TEST_CASE("a task with TLS meeting one without it fails at once, saying so") {
  const certificates certs;
  local_cluster cluster(1, 1, testing::bind_add_one);
  strategy_options chief;
  chief.transport = certs.transport();
  const auto e = pscoro::testing::connect_failure(cluster.spec, chief);
  CHECK(e.code() == errc::unauthenticated);
  CHECK(contains(e.what(), "TLS handshake with ps:0"));
  CHECK(contains(e.what(), "does it use TLS with a certificate of the same cluster CA?"));
}

TEST_CASE("TLS files that cannot be used are refused at start, naming the file") {
  const certificates certs;
  asio::io_context io;
  const cluster_spec spec{{"ps", {"127.0.0.1:0"}}, {"worker", {"127.0.0.1:0"}}};
  server_options options;
  options.transport = certs.transport();
  options.transport.tls_ca_file.clear();
  CHECK_THROWS_WITH_AS(server(io.get_executor(), simple_cluster_resolver(spec, "ps", 0), options),
                       doctest::Contains("TLS needs a certificate, its key and the cluster CA"), error);
  options.transport = certs.transport();
  options.transport.tls_cert_file = certs.file("missing.crt");
  const std::string missing = "cannot use the certificate (tls_cert_file) '" + certs.file("missing.crt") + "'";
  CHECK_THROWS_WITH_AS(server(io.get_executor(), simple_cluster_resolver(spec, "ps", 0), options),
                       doctest::Contains(missing.c_str()), error);
  options.transport = certs.transport();
  options.transport.tls_key_file = certs.file("stranger.key");
  CHECK_THROWS_WITH_AS(server(io.get_executor(), simple_cluster_resolver(spec, "ps", 0), options),
                       doctest::Contains("cannot use the private key (tls_key_file)"), error);  // another's key
}

TEST_CASE("with TLS a server may listen beyond loopback without a secret") {
  const certificates certs;
  asio::io_context io;
  const cluster_spec service{{"ps", {"test-tfjob-ps-0.ns2.svc.invalid:0"}}, {"worker", {"127.0.0.1:0"}}};
  server_options options;
  options.transport = certs.transport();
  server ps(io.get_executor(), simple_cluster_resolver(service, "ps", 0), options);
  ps.start();
  CHECK(starts_with(ps.address(), "0.0.0.0:"));
}

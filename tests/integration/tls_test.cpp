// Mutual TLS: a cluster whose tasks hold certificates of one CA trains over encrypted connections;
// a peer without TLS, or with a certificate of another CA, is refused on both sides and changes
// nothing. A task whose own certificate is not valid now, or whose TLS files are not regular files,
// refuses to start. Certificates are made at test time with the `openssl` command (and OpenSSL's
// API for validity dates it cannot set).
#include "file_faults.hpp"
#include "local_cluster.hpp"
#include "net/peer.hpp"
#include "raw_client.hpp"
#include "test_certificates.hpp"

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <cmath>
#include <cstdio>
#include <memory>

using namespace pscoro;
using pscoro::testing::certificates;
using pscoro::testing::code_of;
using pscoro::testing::hello_of;
using pscoro::testing::local_cluster;
using pscoro::testing::message_of;
using pscoro::testing::refusal_of;

namespace {

// Writes `name`.crt and `name`.key beside the cluster CA of `certs`: a certificate of that CA valid
// from now + `from` to now + `to` (the `openssl` command of Debian 12 cannot date one ahead).
void write_certificate_valid_between(const certificates& certs, const std::string& name, std::chrono::seconds from,
                                     std::chrono::seconds to) {
  const auto read_pem = [](const std::string& path, auto read) {
    std::unique_ptr<FILE, int (*)(FILE*)> file(std::fopen(path.c_str(), "r"), &std::fclose);
    REQUIRE(file);
    return read(file.get(), nullptr, nullptr, nullptr);
  };
  std::unique_ptr<X509, void (*)(X509*)> ca(read_pem(certs.file("cluster-ca.crt"), PEM_read_X509), &X509_free);
  std::unique_ptr<EVP_PKEY, void (*)(EVP_PKEY*)> ca_key(read_pem(certs.file("cluster-ca.key"), PEM_read_PrivateKey),
                                                        &EVP_PKEY_free);
  std::unique_ptr<EVP_PKEY, void (*)(EVP_PKEY*)> key(EVP_EC_gen("P-256"), &EVP_PKEY_free);
  std::unique_ptr<X509, void (*)(X509*)> certificate(X509_new(), &X509_free);
  REQUIRE((ca && ca_key && key && certificate));
  X509* c = certificate.get();
  X509_set_version(c, 2);
  ASN1_INTEGER_set(X509_get_serialNumber(c), 7);
  X509_NAME_add_entry_by_txt(X509_get_subject_name(c), "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(name.c_str()), -1, -1, 0);
  X509_set_issuer_name(c, X509_get_subject_name(ca.get()));
  X509_gmtime_adj(X509_getm_notBefore(c), static_cast<long>(from.count()));
  X509_gmtime_adj(X509_getm_notAfter(c), static_cast<long>(to.count()));
  X509_set_pubkey(c, key.get());
  REQUIRE(X509_sign(c, ca_key.get(), EVP_sha256()) > 0);
  const auto write = [](const std::string& path, auto write_pem) {
    std::unique_ptr<FILE, int (*)(FILE*)> file(std::fopen(path.c_str(), "w"), &std::fclose);
    REQUIRE(file);
    REQUIRE(write_pem(file.get()) == 1);
  };
  write(certs.file(name + ".crt"), [&](FILE* f) { return PEM_write_X509(f, c); });
  write(certs.file(name + ".key"),
        [&](FILE* f) { return PEM_write_PrivateKey(f, key.get(), nullptr, nullptr, 0, nullptr, nullptr); });
}

}  // namespace

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
  // A FIFO once blocked OpenSSL's open for ever (made on a thread that a minute's watchdog fails
  // and frees, so a regression fails); a directory is refused alike.
  const testing::scoped_fifo fifo(certs.file("fifo.crt"));
  options.transport = certs.transport();
  options.transport.tls_cert_file = fifo.path();
  const std::string not_regular = "the certificate (tls_cert_file): " + fifo.path() +
                                  " is a FIFO, not a regular file (tls_cert_file or PSCORO_TLS_CERT_FILE must name a "
                                  "regular file)";
  const auto thrown = testing::thrown_without_blocking_on(
      fifo.path(), [&] { server ps(io.get_executor(), simple_cluster_resolver(spec, "ps", 0), options); });
  REQUIRE_MESSAGE(thrown, "the certificate " << fifo.path() << ", a FIFO, was accepted");
  CHECK(code_of(thrown) == errc::invalid_argument);
  CHECK(message_of(thrown) == not_regular);
  options.transport = certs.transport();
  options.transport.tls_ca_file = certs.file("");
  CHECK_THROWS_WITH_AS(server(io.get_executor(), simple_cluster_resolver(spec, "ps", 0), options),
                       doctest::Contains("is a directory, not a regular file (tls_ca_file or PSCORO_TLS_CA_FILE"), error);
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

TEST_CASE("a task whose own certificate has expired or is not yet valid refuses to start, naming the file") {
  using namespace std::chrono_literals;
  const certificates certs;
  const cluster_spec spec{{"ps", {"127.0.0.1:0"}}, {"worker", {"127.0.0.1:0"}}};
  asio::io_context io;
  const auto refusal = [&](const std::string& name) {
    server_options options;
    options.transport = certs.transport(name);
    try {
      server ps(io.get_executor(), simple_cluster_resolver(spec, "ps", 0), options);
      FAIL("the certificate " << name << " was accepted");
    } catch (const error& e) {
      CHECK(e.code() == errc::invalid_argument);
      return std::string(e.what());
    }
    return std::string();
  };
  // Once such a task started and served, and every peer's handshake with it failed.
  write_certificate_valid_between(certs, "expired", -48h, -24h);
  const auto expired = refusal("expired");
  CHECK_MESSAGE(contains(expired, "cannot use the certificate (tls_cert_file) '" + certs.file("expired.crt") +
                                      "' for TLS: it expired on "),
                expired);
  CHECK_MESSAGE(contains(expired, "; renew it"), expired);
  write_certificate_valid_between(certs, "early", 24h, 48h);
  const auto early = refusal("early");
  CHECK_MESSAGE(contains(early, "cannot use the certificate (tls_cert_file) '" + certs.file("early.crt") +
                                    "' for TLS: it is not valid before "),
                early);
  // The chief checks its own certificate too.
  strategy_options chief;
  chief.transport = certs.transport("expired");
  CHECK_THROWS_WITH_AS(parameter_server_strategy(io.get_executor(), simple_cluster_resolver(spec), chief),
                       doctest::Contains("it expired on"), error);
}

TEST_CASE("a task's own certificate's expiry is a metric, and one that expires within a week is a warning") {
  using namespace std::chrono_literals;
  const certificates certs;
  write_certificate_valid_between(certs, "soon", -1h, 72h);
  const auto soon = certs.file("soon.crt");
  const cluster_spec spec{{"ps", {"127.0.0.1:0"}}, {"worker", {"127.0.0.1:0"}}};
  asio::io_context io;
  server_options options;
  options.transport = certs.transport("soon");
  const pscoro::testing::captured_log log;
  const auto before = std::chrono::system_clock::now();
  server ps(io.get_executor(), simple_cluster_resolver(spec, "ps", 0), options);
  CHECK_MESSAGE(contains(log.text(), "the TLS certificate (tls_cert_file) '" + soon + "' expires on "), log.text());
  const auto not_after =
      metrics::process_registry().value("pscoro_tls_certificate_not_after_seconds", {{"file", soon}});
  REQUIRE_MESSAGE(not_after.has_value(), "no pscoro_tls_certificate_not_after_seconds{file=\"" << soon << "\"}");
  const double expected = std::chrono::duration<double>((before + 72h).time_since_epoch()).count();
  CHECK(std::abs(*not_after - expected) < 120);  // the certificate's seconds, against this test's clock
  // A certificate valid for 30 days (the test CA's) is exported without a warning.
  server_options fresh;
  fresh.transport = certs.transport();
  server other(io.get_executor(), simple_cluster_resolver(spec, "ps", 0), fresh);
  CHECK_FALSE(contains(log.text(), "'" + certs.file("node.crt") + "' expires on"));
  CHECK(metrics::process_registry().value("pscoro_tls_certificate_not_after_seconds", {{"file", certs.file("node.crt")}}));
}

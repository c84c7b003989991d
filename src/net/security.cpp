#include "net/security.hpp"

#include "common/address.hpp"
#include "common/environment.hpp"
#include "common/log.hpp"
#include "common/regular_file.hpp"
#include "metrics/library.hpp"

#include <pscoro/error.hpp>

#include <fmt/chrono.h>
#include <fmt/format.h>

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>
#include <tuple>

namespace pscoro::net {
namespace {

// The handshake as bytes both ends compute alike: a label, then each field with its length, so no
// two different handshakes give the same bytes.
class transcript {
 public:
  explicit transcript(std::string_view label) { add(label); }

  void add(std::string_view field) {
    add_integer(field.size(), 4);
    bytes_.append(field);
  }
  void add_integer(std::uint64_t value, std::size_t width = 8) {
    for (std::size_t i = 0; i < width; ++i) bytes_.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
  }
  const std::string& bytes() const noexcept { return bytes_; }

 private:
  std::string bytes_;
};

std::string_view label_of(handshake_side side) {
  return side == handshake_side::accepting ? "pscoro-v3 accepting side" : "pscoro-v3 connecting side";
}

}  // namespace

std::string read_secret_file(const std::string& path, std::string_view setting) {
  const auto unreadable = [&](int why) {
    throw error(errc::invalid_argument,
                fmt::format("cannot read the cluster secret file '{}' ({}): {}", path, setting, std::strerror(why)));
  };
  // A FIFO would block the open until a writer came, a device (/dev/zero) never end: refused,
  // like a directory, before a byte is read.
  const int fd = common::open_regular_file("the cluster secret file", path, O_RDONLY, 0, setting);
  if (fd < 0) unreadable(errno);
  std::string secret(max_secret_file_bytes + 1, '\0');
  std::size_t size = 0;
  while (size < secret.size()) {
    const auto got = ::read(fd, secret.data() + size, secret.size() - size);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      const int why = errno;
      ::close(fd);
      unreadable(why);
    }
    if (got == 0) break;
    size += static_cast<std::size_t>(got);
  }
  ::close(fd);
  if (size > max_secret_file_bytes) {
    throw error(errc::invalid_argument,
                fmt::format("the cluster secret file '{}' ({}) holds more than {} KiB, the most a secret file may: "
                            "is it the right file? (e.g. `openssl rand -hex 32 > {}`)",
                            path, setting, max_secret_file_bytes >> 10, path));
  }
  secret.resize(size);
  while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r')) secret.pop_back();
  if (secret.size() < min_secret_bytes) {
    throw error(errc::invalid_argument,
                fmt::format("the cluster secret in '{}' has {} bytes; at least {} are needed (e.g. `openssl rand -hex "
                            "32 > {}`)",
                            path, secret.size(), min_secret_bytes, path));
  }
  return secret;
}

transport_options with_environment(transport_options options) {
  if (options.auth_secret.empty()) {
    if (const auto path = common::environment("PSCORO_AUTH_SECRET_FILE"); !path.empty()) {
      options.auth_secret = read_secret_file(path);
    }
  } else if (options.auth_secret.size() < min_secret_bytes) {
    throw error(errc::invalid_argument,
                fmt::format("transport_options::auth_secret has {} bytes; at least {} are needed",
                            options.auth_secret.size(), min_secret_bytes));
  }
  if (!options.allow_insecure) {
    options.allow_insecure =
        common::flag_from_environment("PSCORO_ALLOW_INSECURE", "listen anywhere without a cluster secret").value_or(false);
  }
  if (options.tls_cert_file.empty() && options.tls_key_file.empty() && options.tls_ca_file.empty()) {
    options.tls_cert_file = common::environment("PSCORO_TLS_CERT_FILE");
    options.tls_key_file = common::environment("PSCORO_TLS_KEY_FILE");
    options.tls_ca_file = common::environment("PSCORO_TLS_CA_FILE");
  }
  const int tls_files = !options.tls_cert_file.empty() + !options.tls_key_file.empty() + !options.tls_ca_file.empty();
  if (tls_files != 0 && tls_files != 3) {
    throw error(errc::invalid_argument,
                fmt::format("TLS needs a certificate, its key and the cluster CA (tls_cert_file '{}', tls_key_file "
                            "'{}', tls_ca_file '{}'; or PSCORO_TLS_CERT_FILE, PSCORO_TLS_KEY_FILE, PSCORO_TLS_CA_FILE)",
                            options.tls_cert_file, options.tls_key_file, options.tls_ca_file));
  }
  if (uses_tls(options)) (void)tls_context_for(options);  // unusable files fail here, at start
  return options;
}

namespace {

// The reason OpenSSL gives for the last failure on this thread.
std::string openssl_reason(const std::system_error& e) {
  std::string reason = e.code().message();
  if (const unsigned long last = ERR_peek_last_error(); last != 0) {
    char text[256];
    ERR_error_string_n(last, text, sizeof(text));
    reason = text;
  }
  ERR_clear_error();
  return reason;
}

// An ASN.1 time (a certificate's notBefore or notAfter) in seconds since the Unix epoch.
std::optional<std::int64_t> epoch_seconds(const ASN1_TIME* time) {
  std::tm parts{};
  if (!time || ASN1_TIME_to_tm(time, &parts) != 1) return std::nullopt;
  return static_cast<std::int64_t>(::timegm(&parts));
}

std::string utc_text(std::int64_t seconds) {
  const auto t = static_cast<std::time_t>(seconds);
  std::tm parts{};
  ::gmtime_r(&t, &parts);
  return fmt::format("{:%Y-%m-%d %H:%M:%S} UTC", parts);
}

// When each certificate file this process presents expires, as a metric users alert on: one
// series per file, kept for the process's life.
void export_expiry(const std::string& file, std::int64_t not_after) {
  struct expiry {
    metrics::gauge not_after;
    metrics::registry::registration registered;
  };
  static auto* expiries = new std::map<std::string, std::unique_ptr<expiry>>;  // under tls_context_for's lock
  auto& e = (*expiries)[file];
  if (!e) {
    e = std::make_unique<expiry>();
    e->registered = metrics::process_registry().add(
        "pscoro_tls_certificate_not_after_seconds",
        "When this task's own TLS certificate (tls_cert_file) expires, in seconds since the Unix epoch.",
        {{"file", file}}, e->not_after);
  }
  e->not_after.set(not_after);
}

// A task's own certificate outside its validity would fail every handshake, and its peers would
// report it without naming the file: it is refused at start. One that expires within
// certificate_warning_days is logged, so it is renewed before the job stops.
void check_own_certificate(asio::ssl::context& context, const std::string& file) {
  X509* certificate = SSL_CTX_get0_certificate(context.native_handle());
  if (!certificate) return;
  const auto not_before = epoch_seconds(X509_get0_notBefore(certificate));
  const auto not_after = epoch_seconds(X509_get0_notAfter(certificate));
  const auto now = static_cast<std::int64_t>(std::time(nullptr));
  if (not_before && now < *not_before) {
    throw error(errc::invalid_argument,
                fmt::format("cannot use the certificate (tls_cert_file) '{}' for TLS: it is not valid before {} (now "
                            "{}; is this machine's clock right?)",
                            file, utc_text(*not_before), utc_text(now)));
  }
  if (!not_after) return;
  if (now > *not_after) {
    throw error(errc::invalid_argument,
                fmt::format("cannot use the certificate (tls_cert_file) '{}' for TLS: it expired on {} (now {}); renew it",
                            file, utc_text(*not_after), utc_text(now)));
  }
  export_expiry(file, *not_after);
  constexpr std::int64_t day = 24 * 60 * 60;
  if (*not_after - now < certificate_warning_days * day) {
    log::warning("the TLS certificate (tls_cert_file) '{}' expires on {}, in {:.1f} days: renew it before then (a "
                 "task refuses to start with an expired certificate, and its peers refuse it once it has expired)",
                 file, utc_text(*not_after), static_cast<double>(*not_after - now) / static_cast<double>(day));
  }
}

}  // namespace

std::shared_ptr<asio::ssl::context> tls_context_for(const transport_options& options) {
  static std::mutex mutex;  // servers and chiefs of one process may run on several threads
  static std::map<std::tuple<std::string, std::string, std::string>, std::shared_ptr<asio::ssl::context>> made;
  const auto key = std::tuple(options.tls_cert_file, options.tls_key_file, options.tls_ca_file);
  std::lock_guard lock(mutex);
  if (auto it = made.find(key); it != made.end()) return it->second;
  auto context = std::make_shared<asio::ssl::context>(asio::ssl::context::tls);
  SSL_CTX_set_min_proto_version(context->native_handle(), TLS1_3_VERSION);
  const auto load = [&](const char* what, const std::string& file, std::string_view setting, auto&& step) {
    // OpenSSL's fopen of a FIFO would wait for a writer for ever: refused first, as a directory.
    (void)common::regular_file_exists(what, file, setting);
    try {
      step();
    } catch (const std::system_error& e) {
      throw error(errc::invalid_argument,
                  fmt::format("cannot use {} '{}' for TLS: {}", what, file, openssl_reason(e)));
    }
  };
  load("the certificate (tls_cert_file)", options.tls_cert_file, "tls_cert_file or PSCORO_TLS_CERT_FILE",
       [&] { context->use_certificate_chain_file(options.tls_cert_file); });
  check_own_certificate(*context, options.tls_cert_file);
  // OpenSSL also checks here that the key belongs to the certificate.
  load("the private key (tls_key_file)", options.tls_key_file, "tls_key_file or PSCORO_TLS_KEY_FILE",
       [&] { context->use_private_key_file(options.tls_key_file, asio::ssl::context::pem); });
  load("the cluster CA (tls_ca_file)", options.tls_ca_file, "tls_ca_file or PSCORO_TLS_CA_FILE", [&] { context->load_verify_file(options.tls_ca_file); });
  // Both ends verify the other against the cluster CA; a peer without a certificate is refused.
  context->set_verify_mode(asio::ssl::verify_peer | asio::ssl::verify_fail_if_no_peer_cert);
  made.emplace(key, context);
  return context;
}

void check_exposure(const asio::ip::tcp::endpoint& endpoint, const transport_options& options,
                    const std::string& task) {
  if (!options.auth_secret.empty() || uses_tls(options) || endpoint.address().is_loopback()) return;
  const auto address = common::format_address(endpoint);
  if (!options.allow_insecure) {
    throw error(errc::invalid_argument,
                fmt::format("{} will not listen on {} without a cluster secret: anyone who can reach that port could "
                            "take the job over. Give every task the same secret (PSCORO_AUTH_SECRET_FILE; "
                            "pscoro-launch does) or TLS certificates (PSCORO_TLS_*_FILE), or accept the risk with "
                            "PSCORO_ALLOW_INSECURE=1",
                            task, address));
  }
  log::warning("{} listens on {} without a cluster secret (allow_insecure): anyone who can reach it can take the job "
               "over",
               task, address);
}

std::string random_nonce() {
  std::string nonce(nonce_bytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(nonce.data()), static_cast<int>(nonce.size())) != 1) {
    throw error(errc::internal, "OpenSSL could not produce random bytes for a handshake nonce");
  }
  return nonce;
}

std::string handshake_proof(const std::string& secret, handshake_side side, const wire::Hello& hello,
                            const wire::Challenge& challenge) {
  transcript t(label_of(side));
  t.add_integer(hello.protocol_version());
  t.add(hello.job());
  t.add_integer(static_cast<std::uint32_t>(hello.task_index()), 4);
  t.add_integer(hello.incarnation());
  t.add_integer(hello.session());
  t.add(hello.address());
  t.add(hello.to_job());
  t.add_integer(static_cast<std::uint32_t>(hello.to_task_index()), 4);
  t.add_integer(static_cast<std::uint32_t>(hello.cluster_size()), 4);
  for (const auto& job : hello.cluster()) {
    t.add(job.name());
    const std::map<int, std::string> tasks(job.tasks().begin(), job.tasks().end());  // protobuf maps are unordered
    t.add_integer(tasks.size(), 4);
    for (const auto& [index, address] : tasks) {
      t.add_integer(static_cast<std::uint32_t>(index), 4);
      t.add(address);
    }
  }
  t.add(hello.nonce());
  t.add(challenge.job());
  t.add_integer(static_cast<std::uint32_t>(challenge.task_index()), 4);
  t.add_integer(challenge.incarnation());
  t.add(challenge.nonce());

  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (!HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
            reinterpret_cast<const unsigned char*>(t.bytes().data()), t.bytes().size(), mac, &length)) {
    throw error(errc::internal, "OpenSSL could not compute HMAC-SHA256 for the handshake");
  }
  return std::string(reinterpret_cast<const char*>(mac), length);
}

bool verify_handshake_proof(const std::string& secret, handshake_side side, const wire::Hello& hello,
                            const wire::Challenge& challenge, const std::string& proof) {
  const auto expected = handshake_proof(secret, side, hello, challenge);
  return proof.size() == expected.size() && CRYPTO_memcmp(proof.data(), expected.data(), expected.size()) == 0;
}

}  // namespace pscoro::net

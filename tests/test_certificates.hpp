// Certificates for TLS tests and benchmarks, made with the `openssl` command in a scratch
// directory: a cluster CA with one certificate every task uses, and a stranger CA with its own.
#pragma once

#include <pscoro/transport_options.hpp>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>

#include <unistd.h>

namespace pscoro::testing {

class certificates {
 public:
  certificates() {
    std::filesystem::create_directories(dir_);
    make_ca("cluster-ca");
    make_certificate("node", "cluster-ca");
    make_ca("stranger-ca");
    make_certificate("stranger", "stranger-ca");
  }
  ~certificates() {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  certificates(const certificates&) = delete;
  certificates& operator=(const certificates&) = delete;

  std::string file(const std::string& name) const { return (dir_ / name).string(); }

  /// Transport options for a task holding `who`'s certificate and trusting `ca`.
  transport_options transport(const std::string& who = "node", const std::string& ca = "cluster-ca") const {
    transport_options options;
    options.tls_cert_file = file(who + ".crt");
    options.tls_key_file = file(who + ".key");
    options.tls_ca_file = file(ca + ".crt");
    return options;
  }

 private:
  void run(const std::string& command) const {
    const auto full = "cd '" + dir_.string() + "' && " + command + " 2>/dev/null >/dev/null";
    if (std::system(full.c_str()) != 0) throw std::runtime_error("could not make test certificates: " + full);
  }
  void make_ca(const std::string& name) const {
    run("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout " + name + ".key -out " +
        name + ".crt -subj /CN=" + name + " -days 30");
  }
  void make_certificate(const std::string& name, const std::string& ca) const {
    run("openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout " + name + ".key -out " + name +
        ".csr -subj /CN=" + name);
    run("openssl x509 -req -in " + name + ".csr -CA " + ca + ".crt -CAkey " + ca + ".key -CAcreateserial -out " +
        name + ".crt -days 30");
  }

  std::filesystem::path dir_ =
      std::filesystem::temp_directory_path() / ("pscoro-certificates-" + std::to_string(::getpid()) + "-" +
                                                std::to_string(reinterpret_cast<std::uintptr_t>(this)));
};

}  // namespace pscoro::testing

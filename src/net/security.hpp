// Who may talk to a task: the cluster secret (from the options or the environment), the proofs of
// it that both ends of a handshake exchange (HMAC-SHA256, OpenSSL 3), and the rule that a task
// without a secret listens on loopback only. docs/protocol.md §4 specifies the handshake;
// docs/design.md "Security" says what this protects and what it does not.
#pragma once

#include <pscoro/transport_options.hpp>

#include "pscoro.pb.h"

#include <asio/ip/tcp.hpp>
#include <asio/ssl/context.hpp>

#include <array>
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

namespace pscoro::net {

/// The shortest cluster secret accepted (128 bits).
inline constexpr std::size_t min_secret_bytes = 16;
/// Bytes of a handshake nonce.
inline constexpr std::size_t nonce_bytes = 32;

/// `options` completed from the environment: PSCORO_AUTH_SECRET_FILE (read when no secret is set
/// in code), PSCORO_ALLOW_INSECURE and PSCORO_TLS_*_FILE (when no TLS file is set in code). Throws
/// errc::invalid_argument naming the variable or file when one is unusable, the secret is shorter
/// than min_secret_bytes, or only some of the TLS files are given.
transport_options with_environment(transport_options options);

/// The most a cluster secret file may hold: a secret is tens of bytes; a larger file is not one.
inline constexpr std::size_t max_secret_file_bytes = std::size_t{64} << 10;

/// The secret in `path`, which `setting` names: its bytes, less trailing line breaks. Throws
/// errc::invalid_argument naming the file and the setting when it cannot be read, is not a
/// regular file (a FIFO, a directory, a device: refused without an open that could block), holds
/// more than max_secret_file_bytes, or is too short.
std::string read_secret_file(const std::string& path, std::string_view setting = "PSCORO_AUTH_SECRET_FILE");

/// Refuses (errc::invalid_argument) to let `task` listen on a non-loopback `endpoint` without a
/// cluster secret or TLS unless options.allow_insecure, which logs a warning naming the address.
void check_exposure(const asio::ip::tcp::endpoint& endpoint, const transport_options& options,
                    const std::string& task);

/// Whether `options` ask for TLS (all three files set; with_environment checked that).
inline bool uses_tls(const transport_options& options) noexcept { return !options.tls_cert_file.empty(); }

/// A task's own certificate that expires within this many days is logged as a warning at start.
inline constexpr int certificate_warning_days = 7;

/// The TLS context for `options` (mutual: both sides present and verify certificates of the cluster
/// CA; TLS 1.3), made once per process for each set of files. Throws errc::invalid_argument naming
/// the file OpenSSL could not use and why, or the certificate file when this task's certificate is
/// not valid now (expired, or not yet valid); exports its expiry time
/// (pscoro_tls_certificate_not_after_seconds) and warns when that is within
/// certificate_warning_days.
std::shared_ptr<asio::ssl::context> tls_context_for(const transport_options& options);

/// Fresh random bytes for a Hello or a Challenge.
std::string random_nonce();

/// Which end of the handshake a proof is for: the two ends prove over the same handshake under
/// different labels, so one end's proof is never valid as the other's.
enum class handshake_side { accepting, connecting };

/// HMAC-SHA256 with `secret` over `side`'s label and the handshake: the Hello (identity, session,
/// address, cluster, nonce) and the Challenge (identity, nonce; its proof excluded).
std::string handshake_proof(const std::string& secret, handshake_side side, const wire::Hello& hello,
                            const wire::Challenge& challenge);

/// Whether `proof` is `side`'s proof of `secret` over the handshake, compared in constant time.
bool verify_handshake_proof(const std::string& secret, handshake_side side, const wire::Hello& hello,
                            const wire::Challenge& challenge, const std::string& proof);

}  // namespace pscoro::net

// Network addresses as the cluster spec writes them ("host:port", an IPv6 host in brackets): the
// one place that takes them apart and puts them together, for the transport, the handshake and the
// metrics endpoint alike.
#pragma once

#include <pscoro/config.hpp>  // before Asio: its coroutine settings (clang)

#include <asio/ip/tcp.hpp>

#include <string>
#include <string_view>
#include <utility>

namespace pscoro::common {

/// Splits "host:port"; throws errc::invalid_argument naming `task` when it is malformed.
std::pair<std::string, std::string> split_address(const std::string& address, const std::string& task);
/// "host:port", an IPv6 host in brackets ("[::1]:4567"): what split_address takes apart.
std::string format_address(std::string_view host, std::string_view port);
/// The address of `endpoint` in the same form ("127.0.0.1:4567").
std::string format_address(const asio::ip::tcp::endpoint& endpoint);

}  // namespace pscoro::common

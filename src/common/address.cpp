#include "common/address.hpp"

#include <pscoro/error.hpp>

#include <fmt/format.h>

namespace pscoro::common {

std::pair<std::string, std::string> split_address(const std::string& address, const std::string& task) {
  const auto colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) {
    throw error(errc::invalid_argument, fmt::format("address '{}' of {} is not host:port", address, task));
  }
  std::string host = address.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  const std::string port = address.substr(colon + 1);
  if (port.find_first_not_of("0123456789") != std::string::npos || port.size() > 5 || std::stoul(port) > 65535) {
    throw error(errc::invalid_argument, fmt::format("address '{}' of {} has an invalid port", address, task));
  }
  return {host, port};
}

std::string format_address(std::string_view host, std::string_view port) {
  return host.find(':') == std::string_view::npos ? fmt::format("{}:{}", host, port)
                                                  : fmt::format("[{}]:{}", host, port);
}

std::string format_address(const asio::ip::tcp::endpoint& endpoint) {
  return format_address(endpoint.address().to_string(), std::to_string(endpoint.port()));
}

}  // namespace pscoro::common

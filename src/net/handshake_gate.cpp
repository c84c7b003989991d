#include "net/handshake_gate.hpp"

#include <fmt/format.h>

namespace pscoro::net {

void handshake_gate::place::give_back() noexcept {
  if (!state_) return;  // moved from, or given back
  --state_->in_progress;
  if (const auto it = state_->per_address.find(address_); it != state_->per_address.end() && --it->second == 0) {
    state_->per_address.erase(it);
  }
  state_.reset();
}

handshake_gate::handshake_gate(std::string task, const transport_options& options)
    : task_(std::move(task)),
      max_connections_(options.max_connections),
      max_handshakes_(options.max_handshakes),
      max_handshakes_per_address_(options.max_handshakes_per_address),
      budget_(std::make_shared<wire::byte_budget>(options.max_handshake_bytes_total)) {}

std::variant<handshake_gate::place, std::string> handshake_gate::enter(const std::string& host,
                                                                       std::size_t established) {
  auto& s = *state_;
  if (established + s.in_progress >= max_connections_) {
    return fmt::format("{} holds {} connections, its limit (transport_options::max_connections)", task_,
                       established + s.in_progress);
  }
  if (s.in_progress >= max_handshakes_) {
    return fmt::format("{} has {} handshakes in progress, its limit (transport_options::max_handshakes)", task_,
                       s.in_progress);
  }
  const auto from = in_progress_from(host);
  if (from >= max_handshakes_per_address_) {
    return fmt::format("{} has {} handshakes in progress from {}, its limit per address "
                       "(transport_options::max_handshakes_per_address)",
                       task_, from, host);
  }
  ++s.in_progress;
  ++s.per_address[host];
  return place(state_, host, budget_);
}

std::size_t handshake_gate::in_progress_from(const std::string& host) const {
  const auto it = state_->per_address.find(host);
  return it == state_->per_address.end() ? 0 : it->second;
}

}  // namespace pscoro::net

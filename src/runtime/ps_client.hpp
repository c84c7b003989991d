// Variable operations over connections to the parameter servers: the variable_io behind every
// variable handle, on the coordinator and on workers alike.
#pragma once

#include <pscoro/value.hpp>

#include "runtime/peer.hpp"

#include <memory>
#include <vector>

namespace pscoro::runtime {

class ps_client final : public detail::variable_io {
 public:
  explicit ps_client(std::vector<std::shared_ptr<peer>> ps) : ps_(std::move(ps)) {}

  /// Replaces the ps list (a new coordinator session may move them).
  void set_peers(std::vector<std::shared_ptr<peer>> ps) { ps_ = std::move(ps); }
  const std::vector<std::shared_ptr<peer>>& peers() const noexcept { return ps_; }

  asio::awaitable<void> create(variable_ref variable, tensor initial_value);
  asio::awaitable<tensor> read(variable_ref variable) override;
  asio::awaitable<void> update(variable_ref variable, update_op op, tensor value) override;

 private:
  peer& ps_of(const variable_ref& variable) const;
  std::vector<std::shared_ptr<peer>> ps_;
};

}  // namespace pscoro::runtime

// Variable operations over connections to the parameter servers: the variable_io behind every
// variable handle, on the coordinator and on workers alike.
#pragma once

#include <pscoro/detail/variable_io.hpp>

#include "net/peer.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace pscoro::client {

class ps_client final : public detail::variable_io {
 public:
  explicit ps_client(std::vector<std::shared_ptr<net::peer>> ps) : ps_(std::move(ps)) {}

  /// Replaces the ps list (a new coordinator session may move them).
  void set_peers(std::vector<std::shared_ptr<net::peer>> ps) { ps_ = std::move(ps); }
  const std::vector<std::shared_ptr<net::peer>>& peers() const noexcept { return ps_; }

  /// Creates `variable` from a value.
  asio::awaitable<void> create(variable_ref variable, tensor initial_value);
  /// Creates `variable` filled by its ps.
  asio::awaitable<void> create(variable_ref variable, wire::Initializer initializer);
  /// Removes `variable` and its optimizer slots from its ps (the chief only).
  asio::awaitable<void> remove(variable_ref variable);

  asio::awaitable<tensor> read(variable_ref variable, byte_buffer into) override;
  asio::awaitable<tensor> gather(variable_ref variable, tensor ids, byte_buffer into, arrival_handler on_arrival) override;
  asio::awaitable<void> update(variable_ref variable, update_op op, tensor value) override;
  asio::awaitable<void> scatter(variable_ref variable, update_op op, tensor ids, tensor rows) override;
  asio::awaitable<void> apply_gradient(variable_ref variable, optimizer opt, tensor gradient,
                                       std::optional<tensor> ids) override;
  asio::awaitable<tensor> read_rows(variable_ref variable, std::uint64_t begin, std::uint64_t end,
                                    byte_buffer into) override;
  asio::awaitable<void> update_rows(variable_ref variable, update_op op, std::uint64_t begin, tensor rows) override;
  asio::awaitable<std::vector<slot_info>> list_slots(variable_ref variable) override;
  asio::awaitable<void> create_slot(variable_ref variable, variable_ref slot, double initial_value) override;

  /// Creates the part of a table that ps `ps_task` holds (`create` names the buckets).
  asio::awaitable<void> create_table_part(int ps_task, wire::CreateHashTable create);
  /// Removes the part of table `name` on ps `ps_task` (the chief only).
  asio::awaitable<void> remove_table_part(int ps_task, std::string name);
  asio::awaitable<std::vector<tensor>> hash_lookup(int ps_task, std::vector<table_ids> parts, bool insert,
                                                   std::vector<rows_target> into) override;
  asio::awaitable<void> hash_apply_gradients(int ps_task, std::vector<table_ids> parts, optimizer opt) override;
  asio::awaitable<std::uint64_t> advance_clock(int ps_task, hash_table_ref table, std::uint64_t clock) override;
  asio::awaitable<table_export> hash_export(int ps_task, hash_table_ref table, std::uint32_t first_bucket,
                                            std::uint64_t max_bytes, table_save save) override;
  asio::awaitable<void> hash_import(int ps_task, hash_table_ref table, table_import import) override;

 private:
  net::peer& ps_of(const variable_ref& variable) const;
  net::peer& ps_of(int ps_task, const std::string& table) const;
  asio::awaitable<tensor> read_tensor(net::peer& ps, wire::frame request, const variable_ref& variable,
                                      byte_buffer into = {}, arrival_handler on_arrival = {});
  std::vector<std::shared_ptr<net::peer>> ps_;
};

}  // namespace pscoro::client

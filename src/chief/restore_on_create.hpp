// The seam between a checkpoint restored before its variables existed and the chief's variable
// placement (TF's delayed restoration): each variable or hash table the strategy creates asks every
// checkpoint still holding values whether one waits for it, and takes it right after its shards or
// parts exist.
#pragma once

#include <pscoro/detail/variable_io.hpp>
#include <pscoro/value.hpp>

#include <asio/awaitable.hpp>

#include <memory>
#include <string>

namespace pscoro::chief {

class restore_on_create {
 public:
  virtual ~restore_on_create() = default;
  /// Whether a saved value waits for variable `name`. Called before the variable is created:
  /// throws (nothing is created then) when it waits with another dtype or shape, or when its
  /// tensors are corrupt.
  virtual asio::awaitable<bool> claims(const std::string& name, dtype type, const shape_type& shape) = 0;
  /// Restores the saved value (and its optimizer slots) into the new variable `ref`, reached
  /// through `io`, and tracks it from then on. A failure leaves it to the caller to remove `ref`.
  virtual asio::awaitable<void> restore(const sharded_variable_ref& ref, std::shared_ptr<detail::variable_io> io) = 0;
  /// Whether saved rows wait for hash table `ref` (by its name). Called before its parts are
  /// created: throws (nothing is created then) when they wait with another dtype or row width, or
  /// when their tensors are corrupt.
  virtual asio::awaitable<bool> claims_table(const hash_table_ref& ref) = 0;
  /// Restores the saved rows (slots, clock, counters) into the new table `ref`, reached through
  /// `io`, and tracks it from then on. A failure leaves it to the caller to remove the table.
  virtual asio::awaitable<void> restore_table(const hash_table_ref& ref, std::shared_ptr<detail::variable_io> io) = 0;
};

}  // namespace pscoro::chief

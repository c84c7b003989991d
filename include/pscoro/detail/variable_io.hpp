// The seam between variable handles and the connections behind them: implemented by the coordinator
// and by the worker runtime, each over its own connections to the parameter servers.
#pragma once

#include <pscoro/optimizers.hpp>
#include <pscoro/value.hpp>

#include <asio/awaitable.hpp>

#include <optional>

namespace pscoro {

/// How a parameter server combines a value with a variable, element by element (dense updates) or
/// row by row (scatters). Integer division by zero is refused before anything changes.
enum class update_op { assign, add, sub, mul, div, min, max };

namespace detail {

class variable_io {
 public:
  virtual ~variable_io() = default;
  /// The whole variable, received straight into `into` when that has the variable's size (then the
  /// result shares it); else into a buffer of its own.
  virtual asio::awaitable<tensor> read(variable_ref variable, byte_buffer into) = 0;
  /// The rows `ids` (a 1-D int64 tensor) in that order, duplicates allowed.
  virtual asio::awaitable<tensor> gather(variable_ref variable, tensor ids) = 0;
  /// `value` has the variable's shape.
  virtual asio::awaitable<void> update(variable_ref variable, update_op op, tensor value) = 0;
  /// `rows` holds one row per id of `ids`; applied in order, so a repeated id sees every row.
  virtual asio::awaitable<void> scatter(variable_ref variable, update_op op, tensor ids, tensor rows) = 0;
  /// One optimizer step: a dense gradient (no ids) or one gradient row per id.
  virtual asio::awaitable<void> apply_gradient(variable_ref variable, optimizer opt, tensor gradient,
                                               std::optional<tensor> ids) = 0;
};

}  // namespace detail
}  // namespace pscoro

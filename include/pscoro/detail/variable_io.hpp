// The seam between variable handles and the connections behind them: implemented by the coordinator
// and by the worker runtime, each over its own connections to the parameter servers.
#pragma once

#include <pscoro/config.hpp>

#include <pscoro/optimizers.hpp>
#include <pscoro/value.hpp>

#include <asio/awaitable.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

namespace pscoro {

/// How a parameter server combines a value with a variable, element by element (dense updates) or
/// row by row (scatters). Integer division by zero is refused before anything changes.
enum class update_op { assign, add, sub, mul, div, min, max };

namespace detail {

/// What a table's part holds besides its rows (a checkpoint saves it with them).
struct table_state {
  std::uint64_t clock = 0;
  std::int64_t steps = 0;            // optimizer steps taken (adam's bias correction)
  std::optional<optimizer> owner;    // whose slots the rows carry; none before any step
  std::vector<std::uint8_t> filter;  // admission::min_count's one-byte counters; empty otherwise
  /// The save these rows belong to: in an export, the save the part is in; in a restore, the save
  /// the rows come from, on which the next incremental save may build (0: none).
  std::uint64_t save = 0;
};

class PSCORO_API variable_io {
 public:
  virtual ~variable_io() = default;
  /// The whole variable, received straight into `into` when that has the variable's size (then the
  /// result shares it); else into a buffer of its own.
  virtual asio::awaitable<tensor> read(variable_ref variable, byte_buffer into) = 0;
  /// Told, while rows are received into the buffer a caller gave, the front of the reply that has
  /// arrived (a longer prefix each call; the last, the whole reply): the caller can use the first
  /// rows while the rest is on its way. Runs on the io's executor before the operation completes,
  /// only while it has not failed; must not throw. An io may call it never, or only once at the end.
  using arrival_handler = std::function<void(std::span<const std::byte> arrived)>;
  /// The rows `ids` (a 1-D int64 tensor) in that order, duplicates allowed, received straight into
  /// `into` when that has their size (then the result shares it, and `on_arrival`, if set, is told
  /// of their arrival); else into a buffer of its own.
  virtual asio::awaitable<tensor> gather(variable_ref variable, tensor ids, byte_buffer into,
                                         arrival_handler on_arrival) = 0;
  /// `value` has the variable's shape.
  virtual asio::awaitable<void> update(variable_ref variable, update_op op, tensor value) = 0;
  /// `rows` holds one row per id of `ids`; applied in order, so a repeated id sees every row.
  virtual asio::awaitable<void> scatter(variable_ref variable, update_op op, tensor ids, tensor rows) = 0;
  /// One optimizer step: a dense gradient (no ids) or one gradient row per id.
  virtual asio::awaitable<void> apply_gradient(variable_ref variable, optimizer opt, tensor gradient,
                                               std::optional<tensor> ids) = 0;

  // Row ranges and slots, for checkpoints: a table moves in pieces, never whole.

  /// Rows [begin, end), received straight into `into` when that has their size.
  virtual asio::awaitable<tensor> read_rows(variable_ref variable, std::uint64_t begin, std::uint64_t end,
                                            byte_buffer into) = 0;
  /// `op` on rows [begin, begin + rows.shape()[0]) with `rows`.
  virtual asio::awaitable<void> update_rows(variable_ref variable, update_op op, std::uint64_t begin,
                                            tensor rows) = 0;
  struct slot_info {
    variable_ref slot;  // on the variable's ps
    double initial_value = 0;
  };
  /// The optimizer slots the variable's ps holds for it, by name.
  virtual asio::awaitable<std::vector<slot_info>> list_slots(variable_ref variable) = 0;
  /// Creates `slot` of `variable` beside it, every element `initial_value`.
  virtual asio::awaitable<void> create_slot(variable_ref variable, variable_ref slot, double initial_value) = 0;

  // Dynamic embedding tables (hash_table<T>): each request goes to one ps, for the buckets it holds.

  /// One table's ids on one ps (int64, 1-D) and, for a step, their gradient rows.
  struct table_ids {
    hash_table_ref table;
    tensor ids;
    tensor gradients;
  };
  /// Where one part's rows are received: `into` when that has their size (then the result shares
  /// it, and `on_arrival`, if set, is told of their arrival, as for gather); else a buffer of its
  /// own.
  struct rows_target {
    byte_buffer into;
    arrival_handler on_arrival;
  };
  /// The rows of each part's ids on ps `ps_task`, in their order: one tensor per part, the k-th
  /// received as `into[k]` says (when there is one). With `insert`, ids not held are admitted by
  /// their table's policy.
  virtual asio::awaitable<std::vector<tensor>> hash_lookup(int ps_task, std::vector<table_ids> parts, bool insert,
                                                           std::vector<rows_target> into) = 0;
  /// One optimizer step on each part's rows on ps `ps_task`.
  virtual asio::awaitable<void> hash_apply_gradients(int ps_task, std::vector<table_ids> parts, optimizer opt) = 0;
  /// Moves `table`'s clock on ps `ps_task` to `clock`; returns the rows that dropped.
  virtual asio::awaitable<std::uint64_t> advance_clock(int ps_task, hash_table_ref table, std::uint64_t clock) = 0;

  /// Rows of a table's part: ids (int64 [n]), the table's clock when each was last named (int64
  /// [n]) and values ([n, (1 + slots) * dim] of the table's dtype: each row, then its slot rows).
  struct table_rows {
    tensor ids;
    tensor last_named;
    tensor values;
  };
  /// A piece of a part's rows for a checkpoint: whole buckets, and the part's state.
  struct table_export {
    table_state state;  // its filter only in the piece from bucket 0
    std::uint32_t next_bucket = 0;  // where the next piece starts: the bucket count when done
    table_rows rows;
    tensor dropped;  // an increment's: int64 [m], ids of these buckets dropped since its base
  };
  /// Which save an export belongs to (the chief's only): `save` 0 is none (a plain read); `base`
  /// not 0 exports only what changed since that save (an incremental save).
  struct table_save {
    std::uint64_t save = 0;
    std::uint64_t base = 0;
  };
  /// The rows of the buckets ps `ps_task` holds from `first_bucket` on, as many whole buckets as
  /// fit in `max_bytes` of values (one at least). The piece from bucket 0 of a save starts it on
  /// that part; errc::failed_precondition when the part cannot tell what changed since `base`.
  virtual asio::awaitable<table_export> hash_export(int ps_task, hash_table_ref table, std::uint32_t first_bucket,
                                                    std::uint64_t max_bytes, table_save save) = 0;
  /// What a restore sends a table's part: with `reset`, the part first drops every row and takes
  /// that state; then the held rows of the `dropped` ids go; then `rows` come in (with `replace`,
  /// replacing held ones).
  struct table_import {
    std::optional<table_state> reset;
    std::vector<std::int64_t> dropped;
    table_rows rows;
    bool replace = false;
  };
  /// Restores rows of a table's part on ps `ps_task`. The chief's only.
  virtual asio::awaitable<void> hash_import(int ps_task, hash_table_ref table, table_import import) = 0;
};

}  // namespace detail
}  // namespace pscoro

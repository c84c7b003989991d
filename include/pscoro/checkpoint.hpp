// Checkpoints: variables (dense and sharded), hash tables, their optimizer slots, a step counter and
// user scalars, saved to one safetensors file and restored into any number of shards on any number
// of ps.
//
//   pscoro::checkpoint ckpt;
//   ckpt.track(weights).track(embedding);                  // slots come along by themselves
//   pscoro::checkpoint_manager manager(ckpt, "ckpts", /*max_to_keep=*/3);
//   if (auto latest = manager.latest_checkpoint()) co_await ckpt.restore(*latest);
//   ...
//   ckpt.set_step(step);
//   co_await manager.save();                               // ckpts/ckpt-<n>.safetensors
//
// The file is safetensors (https://github.com/huggingface/safetensors): every variable and slot is
// ONE tensor of its full shape, whatever its sharding, streamed shard by shard in row chunks so that
// no process holds a whole table. A hash table is the tensors `<name>` (its rows, [rows, dim]),
// `<name>/ids`, `<name>/last_named` and `<name>/<optimizer>/<slot>` (row k of each for the same id)
// and `<name>/admission_counters`, whatever its ps count; its rows are spooled to an unnamed file
// beside the checkpoint as they arrive (their count is known only at the end). `__metadata__` names
// the format, its version, the pscoro version, the step, the user scalars, the slots, the tables'
// clocks and optimizers, a CRC-32C per tensor and one of the header itself. A save writes a
// temporary file, fsyncs it and renames it into place: a crash leaves the previous checkpoint as it
// was. A restore checks the whole file (header, sizes, every tracked variable's dtype and shape,
// checksums) before it changes anything; a pscoro checkpoint without its checksums is refused as
// damaged, and a safetensors file another tool wrote is read only when the caller says so
// (checkpoint_read_options). docs/design.md ("Checkpoints", "Dynamic embedding tables") has the
// details.
//
// A checkpoint made with the strategy also restores variables and hash tables that do not exist yet
// (TF's delayed restoration): restore() keeps the saved values nothing tracked took, and each
// variable or table the strategy creates later under one of those names takes its value, and its
// optimizer slots, at creation, into whatever number of shards or ps it gets; the checkpoint
// tracks it from then on.
//
//   pscoro::checkpoint ckpt(strategy);
//   co_await ckpt.restore(path);                           // nothing exists yet: all pending
//   auto w = co_await scope.create_variable<float>("w", {784, 10}, pscoro::initializers::zeros{});
//   // w holds its saved value; ckpt.pending() lists what is still waiting
#pragma once

#include <pscoro/config.hpp>

#include <pscoro/detail/variable_io.hpp>
#include <pscoro/hash_table.hpp>
#include <pscoro/sharded_variable.hpp>
#include <pscoro/value.hpp>
#include <pscoro/variable.hpp>
#include <pscoro/xtensor.hpp>

#include <asio/awaitable.hpp>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace pscoro {

class parameter_server_strategy;

/// The format name written in every checkpoint's `__metadata__["format"]`.
inline constexpr std::string_view checkpoint_format = "pscoro.checkpoint";
/// Its version (`__metadata__["format_version"]`); a reader refuses a newer one. Version 2 added
/// the header's own checksum (`header_crc32c`); version 1 files still read, their header unchecked.
inline constexpr int checkpoint_format_version = 2;

/// What a lost ps cost, once the chief has restored it in place (checkpoint_manager::restore_lost_ps).
struct ps_restore_report {
  std::string ps;                    // "ps:1"
  std::filesystem::path checkpoint;  // the file its values came from
  std::int64_t step = 0;             // that file's step: what the ps's variables lost is since then
  double seconds = 0;                // from the loss to closures running again
};

/// How the chief restores a lost ps (checkpoint_manager::restore_lost_ps).
struct ps_restore_options {
  /// How long the chief waits for the ps to answer at its address again (restarted in place: by
  /// `pscoro-launch --restart-ps`, Kubernetes, Slurm's --requeue); past it the run fails with
  /// errc::unavailable naming the ps.
  std::chrono::milliseconds wait_for_ps{std::chrono::minutes(5)};
  /// Called on the chief's executor after each restore.
  std::function<void(const ps_restore_report&)> on_restored;
};

namespace detail {

/// A variable a checkpoint saves and restores: its shards (one for a dense variable) and the
/// connections that reach them.
struct checkpoint_variable {
  sharded_variable_ref ref;
  std::shared_ptr<variable_io> io;
};

/// A hash table a checkpoint saves and restores: its parts and the connections that reach them.
struct checkpoint_table {
  hash_table_ref ref;
  std::shared_ptr<variable_io> io;
};

struct checkpoint_state;
struct checkpoint_reader_access;
class lost_ps_recovery;

}  // namespace detail

/// Which files checkpoint::restore and checkpoint_reader read.
struct checkpoint_read_options {
  /// Also read a safetensors file that is not a pscoro checkpoint (its `__metadata__` has no
  /// `"format": "pscoro.checkpoint"`: another tool wrote it), whose tensors nothing verifies; the
  /// log says it is read unverified. Off (the default), such a file is errc::failed_precondition.
  /// A pscoro checkpoint is verified whole either way: one without its checksums is
  /// errc::data_loss.
  bool allow_unverified = false;
};

/// How checkpoint::save writes.
struct checkpoint_save_options {
  /// Write only what the hash tables changed since the file this checkpoint saved or restored
  /// last (its rows changed, with their slots, and the ids dropped), beside every variable whole:
  /// an increment, which restores together with the files it builds on (named in its
  /// `__metadata__["base"]`; keep them). A table some part of which cannot tell what changed (a
  /// ps restarted, a table tracked since) is written whole in it; with no file to build on, the
  /// save is whole.
  bool incremental = false;
};

class PSCORO_API checkpoint {
 public:
  /// A checkpoint of the variables it is told to track.
  checkpoint();
  /// The same, and the variables `strategy` creates after a restore() take the values that
  /// restore left pending (see restore()). The strategy may go first: then nothing more is
  /// created.
  explicit checkpoint(const parameter_server_strategy& strategy);
  ~checkpoint();
  /// Moves keep the pending values and the link to the strategy; a moved-from checkpoint may only
  /// be assigned to or destroyed. Not copyable: two copies would share the pending values.
  checkpoint(checkpoint&&) noexcept;
  checkpoint& operator=(checkpoint&&) noexcept;
  checkpoint(const checkpoint&) = delete;
  checkpoint& operator=(const checkpoint&) = delete;

  /// Saves and restores `v` (and the optimizer slots its ps holds for it) under its name.
  /// Throws errc::already_exists when another variable of that name is tracked already (tracking
  /// the same variable again does nothing: a variable restored on creation is tracked already).
  template <class T>
  checkpoint& track(const variable<T>& v) {
    return track_ref(v.row_layout()->ref, v.row_io());  // a dense variable is one shard
  }
  template <class T>
  checkpoint& track(const sharded_variable<T>& v) {
    return track_ref(v.ref(), v.row_io());
  }

  /// Saves and restores hash table `t`: every row it holds with its optimizer slots, when each was
  /// last named, the table's clock and its admission counters. A restore replaces the rows every
  /// part holds with the file's, onto any number of ps (each row goes to the ps that holds its
  /// bucket now). Throws errc::already_exists when something else of that name is tracked.
  template <class T>
  checkpoint& track(const hash_table<T>& t) {
    return track_table(t.ref(), t.io());
  }

  std::int64_t step() const noexcept { return step_; }
  void set_step(std::int64_t step) noexcept { step_ = step; }
  /// A named number saved with the checkpoint (an epoch, a best metric).
  void set_scalar(std::string name, double value);
  /// Throws errc::not_found when there is no scalar `name`.
  double scalar(std::string_view name) const;
  const std::map<std::string, double, std::less<>>& scalars() const noexcept { return scalars_; }

  /// Writes every tracked variable, its slots, the step and the scalars to `path`, atomically: the
  /// file appears complete or not at all. For a consistent snapshot, save when no closure updates
  /// the variables (after join()); a save during training is as fuzzy as TF's. With
  /// `options.incremental`, the hash tables' rows only as far as they changed (see
  /// checkpoint_save_options).
  asio::awaitable<void> save(std::filesystem::path path, checkpoint_save_options options = {}) const;

  /// Loads `path` into the tracked variables (any number of shards on any ps), their slots (created
  /// where missing), the step and the scalars; for an incremental save, each hash table from the
  /// files it builds on too (its last whole save, then every increment in order). A file of that
  /// chain missing, replaced or corrupt is errc::data_loss naming it. The file is checked in full
  /// first (with its chain): a missing,
  /// truncated or corrupt file, a tracked variable it lacks or holds with another dtype or shape,
  /// is an error before anything changes. Every tensor restored matches its CRC-32C: a
  /// checkpoint without the `crc32c` record, or without one tensor's checksum in it, is
  /// errc::data_loss naming the file (and the tensor); a file that is not a pscoro checkpoint is
  /// errc::failed_precondition unless `options` allow it (checkpoint_read_options). A path that
  /// is not a regular file (a FIFO, a directory) is errc::invalid_argument, and never opened in a
  /// way that could block.
  ///
  /// The file's variables that no tracked variable takes stay pending (TF's delayed restoration):
  /// with a checkpoint made with the strategy, a variable the strategy creates later under one of
  /// their names is created with its saved value (its initial value or initializer is not
  /// evaluated) and its optimizer slots, in any number of shards, and is tracked from then on.
  /// Creating it with another dtype or shape fails (errc::invalid_argument, naming the variable,
  /// the file and both shapes) and creates nothing; so does a corrupt tensor (errc::data_loss).
  /// A variable that exists already is restored only when tracked. Pending values are kept until
  /// taken, until the next restore() (which replaces them), or until discard_pending(); the file
  /// stays open meanwhile (a checkpoint_manager may delete it: the open file still reads).
  asio::awaitable<void> restore(std::filesystem::path path, checkpoint_read_options options = {});

  /// The names of the variables the last restore() found in its file and no variable has taken
  /// yet, sorted (TF keeps them silently; here one can ask). A checkpoint without a strategy lists
  /// them too, though nothing will take them.
  std::vector<std::string> pending() const;
  /// Throws errc::failed_precondition naming the file and the pending variables when there are any
  /// (TF's assert_consumed): for a program that expects every saved variable to be recreated.
  void assert_consumed() const;
  /// Forgets the pending values (and closes the file): variables created from now on keep their
  /// own initial values.
  void discard_pending();

  /// Bytes per piece a table moves in (rows are never split); tests make it small.
  void set_chunk_bytes(std::size_t bytes) noexcept;

 private:
  checkpoint& track_ref(sharded_variable_ref ref, std::shared_ptr<detail::variable_io> io);
  checkpoint& track_table(hash_table_ref ref, std::shared_ptr<detail::variable_io> io);

  friend class checkpoint_manager;  // asks how many increments the last file builds on

  std::shared_ptr<detail::checkpoint_state> state_;  // the tracked variables, the pending values
  std::int64_t step_ = 0;
  std::map<std::string, double, std::less<>> scalars_;
};

/// Numbered checkpoints in a directory: `<directory>/ckpt-<n>.safetensors`, the newest `max_to_keep`
/// kept (0 keeps all). The directory is the state: the newest complete file is the latest
/// checkpoint (an interrupted save leaves only a temporary file, removed by the next manager).
///
/// With `full_every` N above 1, a save is incremental (checkpoint_save_options) when the file
/// saved or restored last builds on fewer than N - 1 increments: one save in N is whole, and the
/// hash tables' rows in the others are only those changed since the save before. A file that a
/// kept file builds on is kept too, whatever `max_to_keep` says.
class PSCORO_API checkpoint_manager {
 public:
  checkpoint_manager(checkpoint& ckpt, std::filesystem::path directory, std::size_t max_to_keep = 5,
                     std::size_t full_every = 1);

  /// Saves as number (latest number + 1), TF's save counter; returns the path.
  asio::awaitable<std::filesystem::path> save();
  /// Saves as `number` (for instance the step); an existing file of that number is replaced.
  asio::awaitable<std::filesystem::path> save(std::int64_t number);

  /// The newest checkpoint, if any.
  std::optional<std::filesystem::path> latest_checkpoint() const;
  /// Every checkpoint in the directory, oldest first.
  std::vector<std::filesystem::path> checkpoints() const;
  const std::filesystem::path& directory() const noexcept { return directory_; }

  /// The number in a checkpoint file's name ("ckpt-12.safetensors" -> 12), if it is one.
  static std::optional<std::int64_t> number_of(const std::filesystem::path& path);

  /// From now on, while this manager lives, the strategy's chief restores a ps it loses in place
  /// instead of ending the run (TF's behaviour, and the default without this call): closures wait,
  /// the chief waits up to `options.wait_for_ps` for the ps to answer at its address again, makes
  /// its shards and hash table parts again, restores only them from the newest checkpoint here
  /// (the other ps keep their values: nothing is rolled back but what was lost), and the waiting
  /// closures, and those that failed because of the loss, run. Reported in the log, in metrics
  /// (`pscoro_coordinator_ps_restores_total`, `_ps_restore_seconds`,
  /// `_ps_restore_checkpoint_step`) and to `options.on_restored`. The run fails as before when no
  /// checkpoint is here (errc::failed_precondition naming the ps), when the ps held a variable or
  /// table the checkpoint does not track (the same), or when no ps answers in time
  /// (errc::unavailable naming it). The checkpoint must be made with the strategy
  /// (checkpoint(strategy)); errc::failed_precondition otherwise.
  void restore_lost_ps(ps_restore_options options = {});

 private:
  checkpoint* checkpoint_;
  std::filesystem::path directory_;
  std::size_t max_to_keep_;
  std::size_t full_every_;
  std::shared_ptr<detail::lost_ps_recovery> recovery_;  // held by the chief weakly
};

/// The checkpoints a checkpoint_manager saved in `directory` ("ckpt-<n>.safetensors"), oldest
/// first; none when the directory does not exist. For watchers that do not save (an evaluator).
PSCORO_API std::vector<std::filesystem::path> checkpoints_in(const std::filesystem::path& directory);
/// The newest of them (TF's tf.train.latest_checkpoint).
PSCORO_API std::optional<std::filesystem::path> latest_checkpoint(const std::filesystem::path& directory);

/// Reads a checkpoint (or, when `options` allow it, any safetensors file of float32/float64/int32/
/// int64 tensors) without a cluster: an evaluator, a converter, a test. The header is parsed and
/// checked on construction.
class PSCORO_API checkpoint_reader {
 public:
  /// Throws errc::not_found (no file), errc::data_loss (not safetensors, truncated, bad header, a
  /// pscoro checkpoint without a checksum for every tensor), errc::failed_precondition (a newer
  /// format version; a file of another tool unless `options.allow_unverified`) or
  /// errc::invalid_argument (`path` is a FIFO, a directory or a device).
  explicit checkpoint_reader(std::filesystem::path path, checkpoint_read_options options = {});
  ~checkpoint_reader();
  checkpoint_reader(checkpoint_reader&&) noexcept;
  checkpoint_reader& operator=(checkpoint_reader&&) noexcept;

  const std::filesystem::path& path() const noexcept;
  /// Tensor names in file order.
  std::vector<std::string> names() const;
  bool contains(std::string_view name) const;
  /// Throw errc::not_found for an unknown name.
  pscoro::dtype dtype(std::string_view name) const;
  const shape_type& shape(std::string_view name) const;

  /// `__metadata__`, as stored.
  const std::map<std::string, std::string, std::less<>>& metadata() const;
  /// The step and the scalars of a pscoro checkpoint (0 and none for another file).
  std::int64_t step() const;
  std::map<std::string, double, std::less<>> scalars() const;
  /// The save's id (`__metadata__["save_id"]`), 0 for a file without one.
  std::uint64_t save_id() const noexcept;
  /// For an incremental save, the file it builds on (`__metadata__["base"]`, resolved from this
  /// file's directory) and that file's save id; its hash tables' tensors hold only what changed
  /// since (the rows, and `<table>/dropped`). None for a whole save.
  struct base_file {
    std::filesystem::path path;
    std::uint64_t save_id = 0;
    std::size_t depth = 0;  // increments from the last whole save to this file, this one included
  };
  const std::optional<base_file>& base() const noexcept;

  /// Tensor `name`, checked against its CRC-32C (errc::data_loss if it does not match); a file of
  /// another tool, read with allow_unverified, may have none.
  tensor read_tensor(std::string_view name) const;
  /// The same as an xarray of T; errc::invalid_argument when the dtype is not T's.
  template <class T>
  xt::xarray<T> read(std::string_view name) const {
    return to_xarray<T>(read_tensor(name));
  }

  struct state;

 private:
  friend class checkpoint;  // restore reads ranges of the open file
  friend struct detail::checkpoint_state;
  friend struct detail::checkpoint_reader_access;  // a restore follows an increment's bases
  std::unique_ptr<state> state_;
};

}  // namespace pscoro

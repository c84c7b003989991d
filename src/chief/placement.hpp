// Where the chief puts variables: a variable, or each shard of a partitioned one, on the next ps
// round robin (one counter per strategy, as in TF), created there from a value or from an
// initializer that the ps runs itself.
#pragma once

#include <pscoro/hash_table_options.hpp>
#include <pscoro/metrics.hpp>
#include <pscoro/strategy.hpp>

#include "chief/restore_on_create.hpp"
#include "client/ps_client.hpp"

#include <asio/awaitable.hpp>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace pscoro::chief {

class variable_placement {
 public:
  explicit variable_placement(std::shared_ptr<client::ps_client> ps);

  /// What the variables created so far placed on one ps, as gauges any thread may read: their
  /// shards and the bytes of their values (optimizer slots, made by the ps, are not counted).
  struct ps_usage {
    metrics::gauge shards;
    metrics::gauge bytes;
  };
  const ps_usage& usage(std::size_t ps) const { return *usage_.at(ps); }

  void set_partitioner(variable_partitioner partitioner) { partitioner_ = std::move(partitioner); }

  /// From now on, every variable created asks `restorer` (while it lives) whether a saved value
  /// waits for it. Adding one already there does nothing.
  void add_restorer(const std::shared_ptr<restore_on_create>& restorer);

  /// Creates a variable of `shards` (1 unless `placement` asks for a partition and the partitioner
  /// says otherwise) on their ps (the next round robin, or placement.colocated_ps), concurrently. When one shard fails, the shards already created are removed (the
  /// failure is rethrown): a variable exists whole or not at all. When a restorer holds a saved
  /// value for `name`, the shards are made empty (the source is never evaluated) and then take
  /// that value. A shard_initializer is called for one shard at a time, each result sent before
  /// the next is asked for. The placement must outlive the call.
  asio::awaitable<sharded_variable_ref> create(std::string name, dtype type, shape_type shape,
                                               parameter_server_strategy::variable_source source,
                                               parameter_server_strategy::placement_request placement);
  /// Creates a hash table's parts: its buckets round robin over every ps (bucket b on ps
  /// b % num_ps), concurrently; a table exists whole or not at all, as a variable.
  asio::awaitable<hash_table_ref> create_table(std::string name, dtype type, hash_table_options options);

  /// What ps `ps_task` held of the variables and tables created so far: the names of the variables
  /// with a shard there and of the tables with a part there.
  struct held_on {
    std::vector<std::string> variables;
    std::vector<std::string> tables;
  };
  held_on held_by(int ps_task) const;
  /// Makes again, on ps `ps_task` (a ps that was lost and answers again), every shard and table
  /// part the lost one held: a shard empty (zeros, its slots none), a table part with no rows.
  /// Whatever that ps still holds under those names is dropped first: a ps that never died, whose
  /// connection was lost, holds an older state, which is not mixed in. The caller restores values.
  asio::awaitable<void> recreate_on(int ps_task);

 private:
  // What became of a shard's creation.
  static constexpr char no = 0, yes = 1, maybe = 2;
  /// Awaits `operation`; `outcome` becomes yes, or maybe when the answer was lost (unavailable,
  /// deadline_exceeded), and stays no when the ps refused.
  static asio::awaitable<void> recorded(asio::awaitable<void> operation, char& outcome);
  /// Removes `shard`, logging (not throwing) a failure, unless it is not_found and was not
  /// `certain` to exist: the caller reports the first error.
  static asio::awaitable<void> removed(client::ps_client& ps, variable_ref shard, bool certain);
  /// The same for the part of hash table `table` on ps `ps_task` whose creation had `outcome`.
  static asio::awaitable<void> removed_part(client::ps_client& ps, int ps_task, std::string table, char outcome);

  /// Creates every shard of `ref` from `source`; `created[i]` records what became of shard i.
  asio::awaitable<void> create_shards(const sharded_variable_ref& ref, const std::vector<std::size_t>& offsets,
                                      const parameter_server_strategy::variable_source& source,
                                      std::vector<char>& created);
  /// The live restorers (add_restorer) whose checkpoint holds what is being created, asked in
  /// turn: claims(restorer) is an awaitable<bool>, and throws on a mismatch (before anything is
  /// made).
  template <class Claims>
  asio::awaitable<std::vector<std::shared_ptr<restore_on_create>>> claiming_restorers(Claims claims);

  std::shared_ptr<client::ps_client> ps_;
  variable_partitioner partitioner_;
  // Everything created, to make a lost ps's part again: variables never go while the session
  // lives, and a table part is made from its creation request.
  std::vector<sharded_variable_ref> variables_;
  struct created_table {
    hash_table_ref ref;
    std::vector<wire::CreateHashTable> parts;  // by ps index
  };
  std::vector<created_table> tables_;
  std::vector<std::weak_ptr<restore_on_create>> restorers_;
  std::size_t next_ = 0;
  std::vector<std::unique_ptr<ps_usage>> usage_;  // by ps index; atomics: neither copied nor moved
};

/// What a ps needs to fill a shard of variable `name` (of full shape `shape`) that starts at row
/// `row_offset` with `init`: the kind and its parameters, and a seed mixed with a hash of the name
/// (two variables created with the same seed still differ).
wire::Initializer encode_initializer(const initializer& init, const std::string& name, const shape_type& shape,
                                     std::size_t row_offset);

}  // namespace pscoro::chief

#include "chief/placement.hpp"

#include "common/log.hpp"
#include "wire/values.hpp"

#include <pscoro/detail/parallel.hpp>
#include "client/sharded.hpp"
#include <pscoro/error.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <exception>
#include <vector>
#include <variant>

namespace pscoro::chief {

namespace {

// FNV-1a: a stable hash of the variable's name, mixed into initializer seeds.
std::uint64_t name_hash(std::string_view name) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (const char c : name) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ULL;
  return h;
}

}  // namespace

wire::Initializer encode_initializer(const initializer& init, const std::string& name, const shape_type& shape,
                                     std::size_t row_offset) {
  wire::Initializer out;
  std::uint64_t seed = 0;
  struct visitor {
    wire::Initializer& out;
    std::uint64_t& seed;
    void operator()(const initializers::zeros&) const { out.set_kind(wire::Initializer::ZEROS); }
    void operator()(const initializers::ones&) const { out.set_kind(wire::Initializer::ONES); }
    void operator()(const initializers::constant& c) const {
      out.set_kind(wire::Initializer::CONSTANT);
      out.set_a(c.value);
    }
    void operator()(const initializers::random_uniform& r) const {
      out.set_kind(wire::Initializer::RANDOM_UNIFORM);
      out.set_a(r.minval);
      out.set_b(r.maxval);
      seed = r.seed;
    }
    void operator()(const initializers::random_normal& r) const {
      out.set_kind(wire::Initializer::RANDOM_NORMAL);
      out.set_a(r.mean);
      out.set_b(r.stddev);
      seed = r.seed;
    }
    void operator()(const initializers::truncated_normal& r) const {
      out.set_kind(wire::Initializer::TRUNCATED_NORMAL);
      out.set_a(r.mean);
      out.set_b(r.stddev);
      seed = r.seed;
    }
    void operator()(const initializers::glorot_uniform& r) const {
      out.set_kind(wire::Initializer::GLOROT_UNIFORM);
      seed = r.seed;
    }
  };
  std::visit(visitor{out, seed}, init);
  out.set_seed(seed ^ name_hash(name));
  for (const auto d : shape) out.add_full_shape(d);
  out.set_row_offset(row_offset);
  return out;
}

template <class Claims>
asio::awaitable<std::vector<std::shared_ptr<restore_on_create>>> variable_placement::claiming_restorers(Claims claims) {
  std::vector<std::shared_ptr<restore_on_create>> restorers;
  std::erase_if(restorers_, [](const auto& r) { return r.expired(); });
  const auto candidates = restorers_;  // a copy: another creation may add to it while this awaits
  for (const auto& weak : candidates) {
    auto restorer = weak.lock();
    if (!restorer) continue;
    const bool claimed = co_await claims(*restorer);
    if (claimed) restorers.push_back(std::move(restorer));
  }
  co_return restorers;
}

asio::awaitable<sharded_variable_ref> variable_placement::create(std::string name, dtype type, shape_type shape,
                                                                 parameter_server_strategy::variable_source source,
                                                                 parameter_server_strategy::placement_request placement) {
  if (name.empty()) throw error(errc::invalid_argument, "a variable needs a name");
  const std::size_t num_ps = ps_->peers().size();
  if (placement.colocated_ps &&
      (*placement.colocated_ps < 0 || static_cast<std::size_t>(*placement.colocated_ps) >= num_ps)) {
    throw error(errc::invalid_argument, fmt::format("'{}' cannot be colocated on ps:{}: the cluster has {} ps", name,
                                                    *placement.colocated_ps, num_ps));
  }
  std::size_t shards = 1;
  // TF: a colocated variable is never partitioned.
  if (placement.partition && !placement.colocated_ps && partitioner_ && !shape.empty()) {
    const std::size_t asked = partitioner_(shape, type);
    if (asked == 0) {
      throw error(errc::invalid_argument,
                  fmt::format("variable_partitioner must return a non-zero number of shards, got 0 for '{}' {} {}",
                              name, name_of(type), to_string(shape)));
    }
    shards = std::max<std::size_t>(1, std::min(asked, shape[0]));  // TF clamps to the row count
  }
  const auto offsets = div_offsets(shape.empty() ? 1 : shape[0], shards);
  sharded_variable_ref ref{name, type, shape, {}};
  for (std::size_t i = 0; i < shards; ++i) {
    shape_type part = shape;
    if (!part.empty()) part[0] = offsets[i + 1] - offsets[i];
    // A colocated variable does not move the round robin (TF places it before counting).
    const int ps_task = placement.colocated_ps ? *placement.colocated_ps : static_cast<int>(next_++ % num_ps);
    ref.shards.push_back(
        variable_ref{shards == 1 ? name : fmt::format("{}/part_{}", name, i), type, std::move(part), ps_task});
  }
  // Checkpoints restored before this variable existed: any mismatch is an error before anything
  // is made, and the source is not evaluated when a saved value replaces it (TF does not run the
  // initializer of a variable restored on creation either).
  const auto holds_variable = [&](restore_on_create& r) { return r.claims(name, type, shape); };
  const auto restorers = co_await claiming_restorers(holds_variable);
  if (!restorers.empty()) source = initializer{initializers::zeros{}};
  std::vector<char> created(shards, no);  // char: a vector<bool> element cannot be referred to
  std::exception_ptr failure;
  try {
    co_await create_shards(ref, offsets, source, created);
    for (const auto& restorer : restorers) co_await restorer->restore(ref, ps_);
  } catch (...) {
    failure = std::current_exception();
  }
  if (failure) {
    // A variable exists whole or not at all: the shards already made go, and the name is free again.
    // Also those whose answer was lost: the ps may have made them.
    std::vector<variable_ref> made;
    std::vector<char> certain;
    for (std::size_t i = 0; i < shards; ++i) {
      if (created[i] == no) continue;
      made.push_back(ref.shards[i]);
      certain.push_back(created[i] == yes);
    }
    if (!made.empty()) {
      log::warning("creating '{}' failed; removing the {} of its {} shards that were or may have been created", name,
                   made.size(), shards);
      co_await detail::run_all(made.size(), [&](std::size_t i) { return removed(*ps_, made[i], certain[i] != 0); });
    }
    std::rethrow_exception(failure);
  }
  variables_.push_back(ref);
  for (const auto& shard : ref.shards) {
    auto& used = *usage_.at(static_cast<std::size_t>(shard.ps_task));
    used.shards.add(1);
    used.bytes.add(static_cast<std::int64_t>(num_elements(shard.shape) * size_of(shard.type)));
  }
  co_return ref;
}

namespace {

wire::AdmissionPolicy encode_admission(const admission_policy& policy) {
  wire::AdmissionPolicy out;
  if (const auto* m = std::get_if<admission::min_count>(&policy)) {
    out.set_kind(wire::AdmissionPolicy::MIN_COUNT);
    out.set_count(m->count);
    out.set_counters(m->counters);
  } else if (const auto* p = std::get_if<admission::probability>(&policy)) {
    out.set_kind(wire::AdmissionPolicy::PROBABILITY);
    out.set_p(p->p);
    out.set_seed(p->seed);
  } else {
    out.set_kind(wire::AdmissionPolicy::ALWAYS);
  }
  return out;
}

wire::EvictionPolicy encode_eviction(const eviction_policy& policy) {
  wire::EvictionPolicy out;
  if (const auto* t = std::get_if<eviction::ttl>(&policy)) {
    out.set_kind(wire::EvictionPolicy::TTL);
    out.set_max_idle(t->max_idle);
  } else if (const auto* c = std::get_if<eviction::capacity>(&policy)) {
    out.set_kind(wire::EvictionPolicy::CAPACITY);
    out.set_rows_per_ps(c->rows_per_ps);
  } else {
    out.set_kind(wire::EvictionPolicy::NONE);
  }
  return out;
}

}  // namespace

asio::awaitable<hash_table_ref> variable_placement::create_table(std::string name, dtype type,
                                                                 hash_table_options options) {
  const std::size_t num_ps = ps_->peers().size();
  if (name.empty()) throw error(errc::invalid_argument, "a hash table needs a name");
  if (num_ps == 0) throw error(errc::failed_precondition, fmt::format("hash table '{}': the cluster has no ps", name));
  if (options.dim == 0) throw error(errc::invalid_argument, fmt::format("hash table '{}': dim must be at least 1", name));
  if (options.buckets < num_ps) {
    throw error(errc::invalid_argument, fmt::format("hash table '{}': {} buckets cannot spread over {} ps (buckets "
                                                    "must be at least the ps count)",
                                                    name, options.buckets, num_ps));
  }
  hash_table_ref ref{name, type, options.dim, options.buckets, {}};
  for (std::size_t i = 0; i < num_ps; ++i) ref.ps_tasks.push_back(static_cast<int>(i));
  std::vector<wire::CreateHashTable> parts(num_ps);
  for (std::size_t i = 0; i < num_ps; ++i) {
    auto& create = parts[i];
    wire::encode_table_ref(*create.mutable_table(), ref);
    // The seed mixed with the table's name as a variable's is: a table's row `id` is row `id` of a
    // variable of the same name and initializer.
    *create.mutable_initializer() = encode_initializer(options.initializer, name, {0, options.dim}, 0);
    *create.mutable_admission() = encode_admission(options.admission);
    *create.mutable_eviction() = encode_eviction(options.eviction);
    create.set_default_value(options.default_value);
    create.set_max_rows_per_ps(options.max_rows_per_ps);
    for (std::uint32_t b = static_cast<std::uint32_t>(i); b < options.buckets; b += static_cast<std::uint32_t>(num_ps)) {
      create.add_buckets(b);
    }
  }
  // Checkpoints restored before this table existed: a mismatch is an error before anything is made.
  const auto holds_table = [&](restore_on_create& r) { return r.claims_table(ref); };
  const auto restorers = co_await claiming_restorers(holds_table);
  std::vector<char> created(num_ps, no);
  std::exception_ptr failure;
  try {
    co_await detail::run_all(num_ps, [&](std::size_t i) {
      return recorded(ps_->create_table_part(static_cast<int>(i), parts[i]), created[i]);
    });
    for (const auto& restorer : restorers) co_await restorer->restore_table(ref, ps_);
  } catch (...) {
    failure = std::current_exception();
  }
  if (failure) {
    if (std::ranges::any_of(created, [](char c) { return c != no; })) {
      log::warning("creating hash table '{}' failed; removing the parts that were or may have been created", name);
    }
    co_await detail::run_all(num_ps, [&](std::size_t i) {
      return removed_part(*ps_, static_cast<int>(i), name, created[i]);
    });
    std::rethrow_exception(failure);
  }
  tables_.push_back({ref, std::move(parts)});
  co_return ref;
}

variable_placement::variable_placement(std::shared_ptr<client::ps_client> ps) : ps_(std::move(ps)) {
  for (std::size_t i = 0; i < ps_->peers().size(); ++i) usage_.push_back(std::make_unique<ps_usage>());
}

variable_placement::held_on variable_placement::held_by(int ps_task) const {
  held_on out;
  for (const auto& v : variables_) {
    if (std::ranges::any_of(v.shards, [&](const auto& shard) { return shard.ps_task == ps_task; })) {
      out.variables.push_back(v.name);
    }
  }
  for (const auto& t : tables_) {
    if (std::ranges::find(t.ref.ps_tasks, ps_task) != t.ref.ps_tasks.end()) out.tables.push_back(t.ref.name);
  }
  return out;
}

namespace {

// Runs `make`; when the ps holds the name already (a ps that never died: its connection was lost,
// and it kept an older state), runs `drop`, then `make` again.
template <class Make, class Drop>
asio::awaitable<void> made_afresh(Make make, Drop drop) {
  bool held = false;
  try {
    co_await make();
  } catch (const error& e) {
    if (e.code() != errc::already_exists) throw;
    held = true;
  }
  if (!held) co_return;
  co_await drop();
  co_await make();
}

}  // namespace

asio::awaitable<void> variable_placement::recreate_on(int ps_task) {
  const initializer zeros = initializers::zeros{};
  // Copies: a variable created meanwhile (the chief's code goes on) would move the lists.
  const auto variables = variables_;
  const auto tables = tables_;
  for (const auto& v : variables) {
    std::size_t row_offset = 0;
    for (const auto& shard : v.shards) {
      if (shard.ps_task == ps_task) {
        const auto init = encode_initializer(zeros, v.name, v.shape, row_offset);
        co_await made_afresh([&] { return ps_->create(shard, init); }, [&] { return ps_->remove(shard); });
      }
      row_offset += shard.shape.empty() ? 1 : shard.shape[0];
    }
  }
  for (const auto& t : tables) {
    for (std::size_t i = 0; i < t.ref.ps_tasks.size(); ++i) {
      if (t.ref.ps_tasks[i] != ps_task) continue;
      co_await made_afresh([&] { return ps_->create_table_part(ps_task, t.parts[i]); },
                           [&] { return ps_->remove_table_part(ps_task, t.ref.name); });
    }
  }
}

void variable_placement::add_restorer(const std::shared_ptr<restore_on_create>& restorer) {
  for (const auto& r : restorers_) {
    if (r.lock() == restorer) return;
  }
  restorers_.push_back(restorer);
}

asio::awaitable<void> variable_placement::create_shards(const sharded_variable_ref& ref,
                                                        const std::vector<std::size_t>& offsets,
                                                        const parameter_server_strategy::variable_source& source,
                                                        std::vector<char>& created) {
  const std::size_t shards = ref.shards.size();
  if (const auto* value = std::get_if<tensor>(&source)) {
    const auto layout = detail::make_layout(ref);
    const auto parts = detail::split_dense(*layout, *value, "create_variable");
    co_await detail::run_all(shards, [&](std::size_t i) {
      return recorded(ps_->create(ref.shards[i], parts[i]), created[i]);
    });
  } else if (const auto* init = std::get_if<initializer>(&source)) {
    co_await detail::run_all(shards, [&](std::size_t i) {
      return recorded(ps_->create(ref.shards[i], encode_initializer(*init, ref.name, ref.shape, offsets[i])),
                      created[i]);
    });
  } else {
    // One shard at a time: its value is asked for, checked and sent before the next is asked for,
    // so that the chief never holds more than one shard of it.
    const auto& make = std::get<shard_initializer>(source);
    for (std::size_t i = 0; i < shards; ++i) {
      const auto& shard = ref.shards[i];
      shard_info info{.full_shape = ref.shape, .offset = shape_type(ref.shape.size(), 0), .shape = shard.shape,
                      .index = i, .count = shards};
      if (!info.offset.empty()) info.offset[0] = offsets[i];
      tensor value = make(info);
      if (value.type() != ref.type || value.shape() != shard.shape) {
        throw error(errc::invalid_argument,
                    fmt::format("the initializer of '{}' returned {} {} for shard {} of {} (offset {}), which is {} {}",
                                ref.name, name_of(value.type()), to_string(value.shape()), i, shards,
                                to_string(info.offset), name_of(ref.type), to_string(shard.shape)));
      }
      if (value.size_bytes() != num_elements(value.shape()) * size_of(value.type())) {
        throw error(errc::invalid_argument,
                    fmt::format("the initializer of '{}' returned {} bytes for shard {} of {} ({} {})", ref.name,
                                value.size_bytes(), i, shards, name_of(ref.type), to_string(shard.shape)));
      }
      co_await recorded(ps_->create(shard, std::move(value)), created[i]);
    }
  }
}

asio::awaitable<void> variable_placement::recorded(asio::awaitable<void> operation, char& outcome) {
  try {
    co_await std::move(operation);
    outcome = yes;
  } catch (const error& e) {
    // The request may have reached the ps and only the answer been lost.
    if (e.code() == errc::unavailable || e.code() == errc::deadline_exceeded) outcome = maybe;
    throw;
  }
}

asio::awaitable<void> variable_placement::removed(client::ps_client& ps, variable_ref shard, bool certain) {
  try {
    co_await ps.remove(shard);
  } catch (const error& e) {
    if (!certain && e.code() == errc::not_found) co_return;  // it was never made
    log::warning("could not remove shard '{}' of a variable that failed to be created: {}", shard.name, e.what());
  }
}

asio::awaitable<void> variable_placement::removed_part(client::ps_client& ps, int ps_task, std::string table,
                                                      char outcome) {
  if (outcome == no) co_return;
  try {
    co_await ps.remove_table_part(ps_task, table);
  } catch (const error& e) {
    if (outcome == maybe && e.code() == errc::not_found) co_return;  // it was never made
    log::warning("could not remove the part on ps {} of hash table '{}' that failed to be created: {}", ps_task, table,
                 e.what());
  }
}

}  // namespace pscoro::chief

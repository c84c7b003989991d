// A dynamic embedding table on the parameter servers: rows keyed by any int64 id, made on first
// sight, admitted and evicted by the table's policies (<pscoro/hash_table_options.hpp>).
//
//   auto users = co_await strategy.scope().create_hash_table<float>("user_emb", {
//       .dim = 16,
//       .initializer = pscoro::initializers::random_normal{.stddev = 0.01},
//       .admission = pscoro::admission::min_count{.count = 2},
//       .eviction = pscoro::eviction::ttl{.max_idle = 100'000},
//   });
//   xt::xarray<float> rows = co_await users.lookup(ids, {.insert = true});  // ids.shape + [16]
//   co_await users.apply_gradients(pscoro::optimizers::adagrad{.learning_rate = 0.1}, ids, grads);
//   co_await users.advance_clock(step);
//
// Handles are cheap to copy and can be worker-function arguments. Each operation sends each ps the
// ids of the buckets it holds, all ps at once. An id travels as it is: 0, negative ids and
// INT64_MIN/MAX are ids like any other. Checks before anything is sent: ids that do not fit in
// int64, gradients that are not [ids] x dim of T; the ps checks the rest (errc::invalid_argument,
// or errc::resource_exhausted for a full table) before it changes anything.
#pragma once

#include <pscoro/config.hpp>

#include <pscoro/detail/sharded_io.hpp>
#include <pscoro/detail/variable_io.hpp>
#include <pscoro/hash_table_options.hpp>
#include <pscoro/optimizers.hpp>
#include <pscoro/value.hpp>
#include <pscoro/xtensor.hpp>

#include <asio/awaitable.hpp>

#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace pscoro {

struct hash_lookup_options {
  /// Ids not held are admitted by the table's policy and get their initial row; without, and for
  /// ids not admitted, a lookup returns the table's default row for them and stores nothing.
  bool insert = false;
};

namespace detail {

/// One ps's part of a table operation: its task and what it is sent.
struct table_part {
  int ps_task;
  variable_io::table_ids ids;
};

/// Checks that `ref` describes a table of `type` a handle can use (errc::invalid_argument).
PSCORO_API void check_table(const hash_table_ref& ref, dtype type);
/// Splits a step's 1-D ids (of `id_shape`) and their gradient rows by the ps that hold them, copying
/// the rows (the caller's need not outlive the call); errc::invalid_argument naming the table when
/// the ids are not 1-D or the gradients not [ids] x dim of the table's dtype.
PSCORO_API std::vector<table_part> split_table_gradients(const hash_table_ref& table, std::span<const std::int64_t> ids,
                                                         const shape_type& id_shape, const tensor& gradients);
/// Sends the parts' steps, one request per ps for all the parts it holds, every ps at once.
/// `table` names the (first) table in a failure.
PSCORO_API asio::awaitable<void> apply_table_gradients(std::shared_ptr<variable_io> io, std::string table,
                                                       optimizer opt, std::vector<table_part> parts);
/// Moves the table's clock on every ps that holds a part; the rows they dropped in all.
PSCORO_API asio::awaitable<std::uint64_t> advance_table_clock(std::shared_ptr<variable_io> io, hash_table_ref table,
                                                              std::uint64_t clock);
/// An awaitable that fails with `e` where it is awaited (for checks done at call time).
PSCORO_API asio::awaitable<void> failed_table_call(std::exception_ptr e);

/// The lookups, compiled once per element type (src/client/hash_table.cpp).
template <class T>
struct PSCORO_API hash_table_ops {
  /// The rows of `ids` in their order: ids.shape + [dim].
  static asio::awaitable<xt::xarray<T>> lookup(std::shared_ptr<variable_io> io, hash_table_ref table, id_list ids,
                                               bool insert);
  static asio::awaitable<xt::xarray<T>> failed(std::exception_ptr e);
  /// The rows of `ids[i]` of `tables[i]`, every table's ids on one ps in one request.
  static asio::awaitable<std::vector<xt::xarray<T>>> lookup_many(std::shared_ptr<variable_io> io,
                                                                 std::vector<hash_table_ref> tables,
                                                                 std::vector<id_list> ids, bool insert);
  static asio::awaitable<std::vector<xt::xarray<T>>> failed_many(std::exception_ptr e);
};

extern template struct hash_table_ops<float>;
extern template struct hash_table_ops<double>;

}  // namespace detail

template <class T>
  requires std::is_same_v<T, float> || std::is_same_v<T, double>
class hash_table {
 public:
  using value_type = T;

  hash_table() = default;
  /// Binds `ref` to `io`; throws errc::invalid_argument when `ref` is not a table of T.
  hash_table(hash_table_ref ref, std::shared_ptr<detail::variable_io> io) : ref_(std::move(ref)), io_(std::move(io)) {
    detail::check_table(ref_, dtype_of<T>);
  }

  const std::string& name() const noexcept { return ref_.name; }
  /// Values per row.
  std::size_t dim() const noexcept { return ref_.dim; }
  static constexpr pscoro::dtype dtype() noexcept { return dtype_of<T>; }
  const hash_table_ref& ref() const noexcept { return ref_; }
  /// The connections it uses (those of the strategy or worker that made or received it).
  const std::shared_ptr<detail::variable_io>& io() const noexcept { return io_; }

  /// The rows of `ids` (any shape, any integer type) in input order: ids.shape + [dim]. Marks the
  /// rows held as named now (eviction::ttl and capacity go by it).
  template <class E>
  asio::awaitable<xt::xarray<T>> lookup(const xt::xexpression<E>& ids, hash_lookup_options options = {}) const {
    detail::id_list converted;
    try {
      converted = detail::to_id_list(ids);  // now, while the caller's ids certainly exist
    } catch (...) {
      return ops::failed(std::current_exception());
    }
    return ops::lookup(io_, ref_, std::move(converted), options.insert);
  }

  /// One optimizer step on the rows of `ids` (1-D) with `gradients` ([ids] x dim): repeated ids'
  /// gradients are summed first; gradients of ids the table does not hold are dropped. A table
  /// keeps the slots of the first optimizer that steps it, beside each row; another optimizer later
  /// is errc::failed_precondition.
  template <class I, class G>
  asio::awaitable<void> apply_gradients(const optimizer& opt, const xt::xexpression<I>& ids,
                                        const xt::xexpression<G>& gradients) const {
    std::vector<detail::table_part> parts;
    try {
      const detail::id_list converted = detail::to_id_list(ids);
      parts = detail::split_table_gradients(ref_, converted.ids, converted.shape, detail::rows_of(gradients).rows);
    } catch (...) {
      return detail::failed_table_call(std::current_exception());
    }
    return detail::apply_table_gradients(io_, ref_.name, opt, std::move(parts));
  }

  /// Moves the table's clock to `clock` (steps or event time: never backwards) on every ps; with
  /// eviction::ttl the rows idle for longer than max_idle are gone at once, and each ps sweeps a
  /// share of its rows to take their memory back, as far as the clock moved calls for (all of
  /// them for every max_idle / 4 ticks). Returns how many the sweeps dropped.
  asio::awaitable<std::uint64_t> advance_clock(std::uint64_t clock) const {
    return detail::advance_table_clock(io_, ref_, clock);
  }

 private:
  using ops = detail::hash_table_ops<T>;

  hash_table_ref ref_;
  std::shared_ptr<detail::variable_io> io_;
};

/// The rows of `ids[i]` in `tables[i]` for every i (each as hash_table::lookup gives them), in one
/// request per ps for all the tables: a model with 26 tables pays one round trip per ps per step,
/// not 26. The tables must come from one strategy; errc::invalid_argument when the counts differ.
template <class T, class E>
asio::awaitable<std::vector<xt::xarray<T>>> lookup_tables(const std::vector<hash_table<T>>& tables,
                                                          const std::vector<E>& ids,
                                                          hash_lookup_options options = {}) {
  std::vector<hash_table_ref> refs;
  std::vector<detail::id_list> converted;
  std::shared_ptr<detail::variable_io> io;
  try {
    if (tables.size() != ids.size()) {
      throw error(errc::invalid_argument, "lookup_tables: " + std::to_string(tables.size()) + " tables but " +
                                              std::to_string(ids.size()) + " lists of ids");
    }
    for (std::size_t i = 0; i < tables.size(); ++i) {
      refs.push_back(tables[i].ref());
      converted.push_back(detail::to_id_list(ids[i]));
      if (i == 0) io = tables[i].io();
      if (tables[i].io() != io) {
        throw error(errc::invalid_argument, "lookup_tables: table '" + tables[i].name() + "' comes from another " +
                                                "strategy or worker than '" + tables[0].name() + "'");
      }
    }
  } catch (...) {
    return detail::hash_table_ops<T>::failed_many(std::current_exception());
  }
  return detail::hash_table_ops<T>::lookup_many(std::move(io), std::move(refs), std::move(converted), options.insert);
}

/// One optimizer step on the rows of `ids[i]` of `tables[i]` with `gradients[i]` for every i (each
/// as hash_table::apply_gradients takes them), in one request per ps for all the tables. Checked
/// whole before anything is sent.
template <class T, class I, class G>
asio::awaitable<void> apply_gradients_to_tables(const optimizer& opt, const std::vector<hash_table<T>>& tables,
                                                const std::vector<I>& ids, const std::vector<G>& gradients) {
  std::vector<detail::table_part> parts;
  std::shared_ptr<detail::variable_io> io;
  try {
    if (tables.size() != ids.size() || tables.size() != gradients.size()) {
      throw error(errc::invalid_argument, "apply_gradients_to_tables: " + std::to_string(tables.size()) +
                                              " tables, " + std::to_string(ids.size()) + " lists of ids and " +
                                              std::to_string(gradients.size()) + " of gradients");
    }
    for (std::size_t i = 0; i < tables.size(); ++i) {
      if (i == 0) io = tables[i].io();
      if (tables[i].io() != io) {
        throw error(errc::invalid_argument, "apply_gradients_to_tables: table '" + tables[i].name() +
                                                "' comes from another strategy or worker than '" + tables[0].name() + "'");
      }
      const detail::id_list converted = detail::to_id_list(ids[i]);
      auto table_parts = detail::split_table_gradients(tables[i].ref(), converted.ids, converted.shape,
                                                       detail::rows_of(gradients[i]).rows);
      for (auto& part : table_parts) parts.push_back(std::move(part));
    }
  } catch (...) {
    return detail::failed_table_call(std::current_exception());
  }
  return detail::apply_table_gradients(std::move(io), tables.empty() ? std::string() : tables[0].name(), opt,
                                       std::move(parts));
}

template <class T>
struct codec<hash_table<T>> {
  static constexpr std::string_view name = "hash_table";
  static value encode(const hash_table<T>& t) { return t.ref(); }
  static hash_table<T> decode(value&& v, const decode_context& context) {
    auto* ref = std::get_if<hash_table_ref>(&v);
    if (!ref) detail::throw_decode_mismatch(name, v);
    return hash_table<T>(std::move(*ref), context.variables);
  }
};

}  // namespace pscoro

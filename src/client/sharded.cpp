#include "client/sharded.hpp"

#include <pscoro/detail/parallel.hpp>
#include <pscoro/partitioners.hpp>

#include <fmt/format.h>

#include "client/scratch_buffers.hpp"
#include "common/id_map.hpp"
#include "common/memory.hpp"
#include "common/rows.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <optional>

namespace pscoro::detail {

namespace {

[[noreturn]] void invalid(std::string message) { throw error(errc::invalid_argument, std::move(message)); }

std::size_t row_elements_of(const shape_type& shape) {
  return shape.empty() ? 1 : num_elements(std::span(shape).subspan(1));
}

// Tables used while a lookup or a scatter is planned, kept between calls, as their storage is. Each
// planning step runs without suspending, so one set per thread is enough; what a lookup keeps
// between its steps is its own (lookup_plan).
struct plan_tables {
  common::id_map asked{0};
  std::vector<std::uint32_t> shard_of;  // by position in the request (group_ids, counting first)
  std::vector<std::uint64_t> seen, repeated;  // bit per row of a shard (plan_part)
  std::vector<std::uint32_t> reply_row;       // by index in `asked`
  std::vector<std::uint32_t> row_index;       // by row of a shard: reply row + 1, or 0; zero between calls

  // Not inline: g++ would compute the thread-local's address (a call, with -fPIC) at every use in
  // the planning loops instead of keeping it (a third of a lookup's planning time).
  [[gnu::noinline]] static plan_tables& local() {
    thread_local plan_tables tables;
    return tables;
  }
};

// The shard of a valid row id (div_locate's answer, as the offsets are TF's "div" partition) without
// a division per id (a 64-bit division was a third of the time of locating ids): an estimate by one
// multiplication, corrected against the offsets.
struct shard_locator {
  explicit shard_locator(const sharded_layout& layout)
      : offsets(layout.offsets.data()),
        scale(static_cast<double>(layout.num_shards()) / static_cast<double>(std::max<std::size_t>(1, layout.rows()))),
        last(layout.num_shards() - 1) {}
  std::size_t operator()(std::size_t id) const noexcept {
    std::size_t s = std::min(static_cast<std::size_t>(static_cast<double>(id) * scale), last);
    while (id < offsets[s]) --s;
    while (id >= offsets[s + 1]) ++s;
    return s;
  }
  const std::size_t* offsets;
  double scale;
  std::size_t last;
};

// Whether `id` names one of `rows` rows: the range test inline (check_id is an exported function, a
// call through the PLT per id), check_id only to word the error.
inline bool in_rows(std::int64_t id, std::size_t rows) noexcept {
  return id >= 0 && static_cast<std::uint64_t>(id) < rows;
}

// Positions and reply rows are 32-bit (row_place): one request takes at most 2^32 - 1 ids.
void check_id_count(const sharded_layout& layout, std::size_t n, std::string_view operation) {
  if (n > std::numeric_limits<std::uint32_t>::max()) {
    invalid(fmt::format("{} of '{}': {} ids are more than one request takes (at most {})", operation,
                        layout.ref.name, n, std::numeric_limits<std::uint32_t>::max()));
  }
}

// Up to this many shards, a request's ids are checked, located and grouped in one pass, each
// shard's entries into a region with room for all of them (touched only where written); more shards
// are counted first, then grouped into regions of their exact sizes. For 100k ids over 2 shards the
// counting pass was a third of a lookup's planning before its first request could leave, time in
// which the ps have nothing to do.
constexpr std::size_t one_pass_max_shards = 8;

// Where group_ids puts a request's ids: shard s's entries are [start[s], start[s] + count[s]) of
// arrays of `entries` entries.
struct id_groups {
  std::size_t entries;
  std::vector<std::size_t> start, count;
  bool sorted = true;  // the ids are non-decreasing
};

// The arrays of n ids over `shards` shards, `entry_bytes` each in all: a region of n entries per
// shard when they are grouped in one pass (up to one_pass_max_shards, and scratch of at most half
// what a thread keeps, so a scatter of large rows over 8 shards is not 8 times its size), else n.
id_groups id_groups_for(std::size_t shards, std::size_t n, std::size_t entry_bytes) {
  const bool regions = shards > 1 && shards <= one_pass_max_shards &&
                       n <= client::scratch_buffers::max_bytes / 2 / shards / std::max<std::size_t>(entry_bytes, 1);
  return id_groups{regions ? shards * n : n, std::vector<std::size_t>(shards), std::vector<std::size_t>(shards)};
}

// Checks every id (errc::invalid_argument naming the bad one and its position; `put` only fills
// the caller's arrays, so a bad id sends nothing) and groups the ids by shard in input order: put(k, at, s,
// local) for ids[k], which is row `local` of shard s, goes to entry `at`. `groups` comes from
// id_groups_for(layout.num_shards(), ids.size(), ...).
template <class Put>
void group_ids(const sharded_layout& layout, std::span<const std::int64_t> ids, std::string_view operation,
               id_groups& groups, Put&& put) {
  const std::size_t shards = layout.num_shards();
  const std::size_t n = ids.size();
  const std::size_t rows = layout.rows();
  check_id_count(layout, n, operation);
  bool sorted = true;
  if (shards == 1) {
    for (std::size_t k = 0; k < n; ++k) {
      if (!in_rows(ids[k], rows)) check_id(ids[k], k, rows, layout, operation);
      sorted = sorted && (k == 0 || ids[k - 1] <= ids[k]);
      put(k, k, std::size_t{0}, ids[k]);
    }
    groups.count[0] = n;
    groups.sorted = sorted;
    return;
  }
  const shard_locator shard_of(layout);
  const std::size_t* first_row = layout.offsets.data();
  if (groups.entries > n) {
    std::array<std::size_t, one_pass_max_shards> next{};
    for (std::size_t s = 0; s < shards; ++s) next[s] = groups.start[s] = s * n;
    for (std::size_t k = 0; k < n; ++k) {
      const std::int64_t id = ids[k];
      if (!in_rows(id, rows)) check_id(id, k, rows, layout, operation);
      sorted = sorted && (k == 0 || ids[k - 1] <= id);
      const std::size_t s = shard_of(static_cast<std::size_t>(id));
      put(k, next[s]++, s, id - static_cast<std::int64_t>(first_row[s]));
    }
    for (std::size_t s = 0; s < shards; ++s) groups.count[s] = next[s] - groups.start[s];
    groups.sorted = sorted;
    return;
  }
  // Counted first: regions of their exact sizes.
  auto& shard_of_id = plan_tables::local().shard_of;
  shard_of_id.resize(n);
  std::vector<std::size_t>& count = groups.count;
  for (std::size_t k = 0; k < n; ++k) {
    if (!in_rows(ids[k], rows)) check_id(ids[k], k, rows, layout, operation);
    sorted = sorted && (k == 0 || ids[k - 1] <= ids[k]);
    const std::size_t s = shard_of(static_cast<std::size_t>(ids[k]));
    shard_of_id[k] = static_cast<std::uint32_t>(s);
    ++count[s];
  }
  for (std::size_t s = 1; s < shards; ++s) groups.start[s] = groups.start[s - 1] + count[s - 1];
  std::vector<std::size_t> next(groups.start);
  for (std::size_t k = 0; k < n; ++k) {
    const std::uint32_t s = shard_of_id[k];
    put(k, next[s]++, std::size_t{s}, ids[k] - static_cast<std::int64_t>(first_row[s]));
  }
  groups.sorted = sorted;
}

}  // namespace

void check_id(std::int64_t id, std::size_t position, std::size_t rows, const sharded_layout& layout,
              std::string_view operation) {
  if (id < 0 || static_cast<std::uint64_t>(id) >= rows) {
    invalid(fmt::format("{} of '{}': id {} (position {}) is out of range [0, {})", operation, layout.ref.name, id,
                        position, rows));
  }
}

std::size_t sharded_layout::row_elements() const noexcept { return row_elements_of(ref.shape); }

std::shared_ptr<const sharded_layout> make_layout(sharded_variable_ref ref) {
  // TF's checks (ShardedVariable.__init__), then the "div" layout that the id mapping relies on.
  if (ref.shards.empty()) invalid(fmt::format("sharded variable '{}' has no shards", ref.name));
  std::vector<std::size_t> offsets{0};
  for (const auto& shard : ref.shards) {
    if (shard.type != ref.type) {
      invalid(fmt::format("all shards of '{}' must have its dtype {}; '{}' is {}", ref.name, name_of(ref.type),
                          shard.name, name_of(shard.type)));
    }
    if (shard.shape.size() != ref.shape.size() ||
        !std::equal(shard.shape.begin() + (shard.shape.empty() ? 0 : 1), shard.shape.end(),
                    ref.shape.begin() + (ref.shape.empty() ? 0 : 1))) {
      invalid(fmt::format("all shards of '{}' {} must have its shape except for the first axis; '{}' is {}",
                          ref.name, to_string(ref.shape), shard.name, to_string(shard.shape)));
    }
    offsets.push_back(offsets.back() + (shard.shape.empty() ? 1 : shard.shape[0]));
  }
  if (ref.shape.empty()) {
    if (ref.shards.size() != 1) invalid(fmt::format("scalar variable '{}' cannot have several shards", ref.name));
  } else if (offsets.back() != ref.shape[0]) {
    invalid(fmt::format("the shards of '{}' hold {} rows but its shape {} has {}", ref.name, offsets.back(),
                        to_string(ref.shape), ref.shape[0]));
  } else if (ref.shape[0] != 0 && offsets != div_offsets(ref.shape[0], ref.shards.size())) {
    invalid(fmt::format("the shards of '{}' are not TF's \"div\" partition of {} rows into {} shards", ref.name,
                        ref.shape[0], ref.shards.size()));
  }
  return std::make_shared<const sharded_layout>(sharded_layout{std::move(ref), std::move(offsets)});
}

std::shared_ptr<const sharded_layout> single_layout(variable_ref ref) {
  const std::size_t rows = ref.shape.empty() ? 1 : ref.shape[0];
  sharded_variable_ref whole{ref.name, ref.type, ref.shape, {}};
  whole.shards.push_back(std::move(ref));
  return std::make_shared<const sharded_layout>(sharded_layout{std::move(whole), {0, rows}});
}

void check_one_dimensional(const shape_type& shape, std::string_view operation) {
  if (shape.size() != 1) {
    // TF's wording (sharded_variable.py).
    invalid(fmt::format("{}: indices must be 1D Tensor for sparse operations. Received shape: {}", operation,
                        to_string(shape)));
  }
}

void check_reply(const variable_ref& shard, const tensor& reply) {
  if (reply.type() != shard.type || reply.shape() != shard.shape) {
    throw error(errc::protocol_error,
                fmt::format("a read of '{}' ({} {}) was answered with {} {}", shard.name, name_of(shard.type),
                            to_string(shard.shape), name_of(reply.type()), to_string(reply.shape())));
  }
}

void check_rows(const sharded_layout& layout, std::size_t n, const tensor& rows, std::string_view operation) {
  const auto& ref = layout.ref;
  if (ref.shape.empty()) invalid(fmt::format("{} of '{}': a scalar variable has no rows", operation, ref.name));
  shape_type expected{n};
  expected.insert(expected.end(), ref.shape.begin() + 1, ref.shape.end());
  if (rows.type() != ref.type || rows.shape() != expected) {
    invalid(fmt::format("{} of '{}': {} ids need {} rows of shape {}, got {} {}", operation, ref.name, n,
                        name_of(ref.type), to_string(expected), name_of(rows.type()), to_string(rows.shape())));
  }
}

std::vector<tensor> split_dense(const sharded_layout& layout, const tensor& value, std::string_view operation) {
  const auto& ref = layout.ref;
  if (value.type() != ref.type || value.shape() != ref.shape) {
    invalid(fmt::format("{} to '{}': the value is {} {} but the variable is {} {}", operation, ref.name,
                        name_of(value.type()), to_string(value.shape()), name_of(ref.type), to_string(ref.shape)));
  }
  if (layout.num_shards() == 1) return {value};
  const std::size_t row_bytes = layout.row_elements() * size_of(ref.type);
  std::vector<tensor> parts;
  parts.reserve(layout.num_shards());
  for (std::size_t i = 0; i < layout.num_shards(); ++i) {
    const std::size_t begin = layout.offsets[i] * row_bytes;
    const std::size_t size = (layout.offsets[i + 1] - layout.offsets[i]) * row_bytes;
    parts.emplace_back(ref.type, ref.shards[i].shape, value.bytes().slice(begin, size));
  }
  return parts;
}

std::vector<shard_rows> split_by_shard(const sharded_layout& layout, std::span<const std::int64_t> ids,
                                       const shape_type& id_shape, row_source source, std::string_view operation) {
  check_one_dimensional(id_shape, operation);
  const tensor& rows = source.rows;
  check_rows(layout, ids.size(), rows, operation);
  const std::size_t shards = layout.num_shards();
  const std::size_t row_bytes = layout.row_elements() * size_of(layout.ref.type);
  id_groups groups = id_groups_for(shards, ids.size(), sizeof(std::int64_t) + row_bytes);
  // One buffer for all shards' ids and one for their rows, reused once the sends are done; each
  // shard's part is a slice.
  const byte_buffer id_storage = client::scratch_buffers::take(groups.entries * sizeof(std::int64_t));
  auto* local = reinterpret_cast<std::int64_t*>(id_storage.data());
  if (shards == 1) {
    // One shard: the ids as they are, the rows copied only if they are the caller's.
    group_ids(layout, ids, operation, groups, [local](std::size_t, std::size_t at, std::size_t, std::int64_t id) {
      local[at] = id;
    });
    tensor own = rows;
    if (!source.owned) {
      own = tensor(rows.type(), rows.shape(), client::scratch_buffers::take(rows.size_bytes()));
      if (rows.size_bytes()) std::memcpy(own.bytes().data(), rows.bytes().data(), rows.size_bytes());
    }
    return {shard_rows{0, tensor(dtype::int64, {ids.size()}, id_storage), std::move(own)}};
  }
  const byte_buffer row_storage = client::scratch_buffers::take(groups.entries * row_bytes);
  std::byte* to = row_storage.data();
  const std::byte* from = rows.bytes().data();
  common::with_row_size(row_bytes, [&](auto size) {
    group_ids(layout, ids, operation, groups, [&](std::size_t k, std::size_t at, std::size_t, std::int64_t id) {
      local[at] = id;
      std::memcpy(to + at * size, from + k * size, size);
    });
  });
  std::vector<shard_rows> out;
  for (std::size_t s = 0; s < shards; ++s) {
    const std::size_t n = groups.count[s];
    if (n == 0) continue;
    const std::size_t start = groups.start[s];
    shape_type shape = rows.shape();
    shape[0] = n;
    out.push_back(shard_rows{
        s, tensor(dtype::int64, {n}, id_storage.slice(start * sizeof(std::int64_t), n * sizeof(std::int64_t))),
        tensor(rows.type(), std::move(shape), row_storage.slice(start * row_bytes, n * row_bytes))});
  }
  return out;
}

// Where a reply row goes: output row `position` takes row `row` of its shard's reply. 32 bits each
// (group_ids refuses more than 2^32 - 1 ids): the planning and placing passes stream these, and 8
// bytes per id instead of 16 halve that traffic.
struct row_place {
  std::uint32_t position;
  std::uint32_t row;
};

// One shard's part of a lookup: the distinct rows it is asked for, in first-seen order, and where
// its reply rows go. `direct`: the reply is output rows [places[0].position, + ids) as they are (no
// id repeated, positions consecutive: sorted ids, or one shard's distinct ones), so it is received
// straight into the result.
struct lookup_part {
  std::size_t shard;
  tensor ids;
  std::span<const row_place> places;
  bool direct;
};

// A lookup with its ids checked and grouped by shard; each shard's part is planned (plan_part) just
// before its request is sent. Owns its storage: the planning of one part and the sending of
// another may interleave with other lookups on the same thread.
struct lookup_plan {
  byte_buffer ids;     // each part's ids, shard-local, from start[s]: all of them until plan_part keeps the distinct
  byte_buffer places;  // each part's places, from start[s]; their rows are set by plan_part
  std::vector<std::size_t> start, count;  // per shard
  bool sorted;
  bool distinct;
  std::vector<lookup_part> parts;  // room for every shard's: a part's address never changes

  row_place* places_of(std::size_t s) const noexcept { return reinterpret_cast<row_place*>(places.data()) + start[s]; }
  std::int64_t* ids_of(std::size_t s) const noexcept { return reinterpret_cast<std::int64_t*>(ids.data()) + start[s]; }
};

namespace {

// Checks every id (errc::invalid_argument naming the bad one and its position) and groups the ids
// by shard, in input order. `distinct`: the caller knows no id repeats (a sparse lookup's ids, made
// unique already).
lookup_plan prepare_lookup(const sharded_layout& layout, std::span<const std::int64_t> ids,
                           std::string_view operation, bool distinct) {
  if (layout.ref.shape.empty()) invalid(fmt::format("{} of '{}': a scalar variable has no rows", operation, layout.ref.name));
  const std::size_t shards = layout.num_shards();
  id_groups groups = id_groups_for(shards, ids.size(), sizeof(std::int64_t) + sizeof(row_place));
  lookup_plan plan{client::scratch_buffers::take(groups.entries * sizeof(std::int64_t)),
                   client::scratch_buffers::take(groups.entries * sizeof(row_place)),
                   {},
                   {},
                   false,
                   distinct,
                   {}};
  plan.parts.reserve(shards);
  auto* places = reinterpret_cast<row_place*>(plan.places.data());
  auto* local = reinterpret_cast<std::int64_t*>(plan.ids.data());
  group_ids(layout, ids, operation, groups, [=](std::size_t k, std::size_t at, std::size_t, std::int64_t id) {
    places[at].position = static_cast<std::uint32_t>(k);  // k < 2^32: group_ids refuses more ids
    local[at] = id;
  });
  plan.start = std::move(groups.start);
  plan.count = std::move(groups.count);
  plan.sorted = groups.sorted;
  return plan;
}

// Whether a shard's `n` ids (over `shard_rows` rows) are better asked for as they are, repeats
// included, than made distinct first. Finding the repeats costs two passes over the ids with random
// probes of a bitmap (~10 ns per id on a 2-core VM: 0.5 ms for 50k ids), while each repeat asked
// again costs only its row's bytes on the wire and in the gather; so unless repeats are common the
// passes cost more than they save (100k uniform ids over 1M rows: 5% repeats). The first ids tell:
// among the first k, uniform ids over R rows repeat at about k / 2R, and the share grows with the
// count, so the share among all n is estimated as (repeats among k / k) * (n / k); only an estimate
// of 1/4 or more is worth the passes. Skewed ids (the usual for embeddings) repeat often within the
// first few thousand and are made distinct. A reply of repeats is never larger than the shard
// (n <= shard_rows), so it passes any limit the shard itself passed. The bitmap is the bits path's
// (a bit per row), so only shards that path would take are sampled.
bool repeats_not_worth_finding(const std::int64_t* ids, std::size_t n, std::size_t shard_rows, plan_tables& tables) {
  constexpr std::size_t sample = 2048;
  // Only where the bitmap would be used anyway (n >= shard_rows / 256): a few ids over a huge shard
  // keep the hash table, whose size is the ids', not the rows'.
  if (n <= sample || n > shard_rows || n * 256 < shard_rows) return false;
  tables.seen.assign(shard_rows / 64 + 1, 0);
  std::uint64_t* seen = tables.seen.data();
  std::size_t repeats = 0;
  for (std::size_t j = 0; j < sample; ++j) {
    const auto row = static_cast<std::size_t>(ids[j]);
    const std::uint64_t bit = std::uint64_t{1} << (row % 64);
    repeats += (seen[row / 64] & bit) != 0;
    seen[row / 64] |= bit;
  }
  return 4 * repeats * n < sample * sample;
}

// Plans shard `s`'s part of `plan`: each of its rows asked once, in first-seen order (skewed ids,
// the usual case for embeddings, travel once), and where each reply row goes. Sorted ids need no
// table (their repeats are neighbours), distinct ones none at all, and ids whose first few thousand
// hardly repeat are asked as they are (repeats_not_worth_finding). Others, by what costs least for
// the shard's rows against the ids (each at most the 32 bytes per id of a hash table):
// - rows <= 8 ids: a reply index per row (4 bytes each), looked up directly (random ids over
//   most of a shard repeat a lot: 1M ids over 1M rows, 63% of them);
// - rows <= 256 ids: a bit per row (64 KiB for 500k rows stays in cache, where random probes of a
//   2 MiB hash table of 50k ids miss it): a first pass marks the rows seen and the rows seen
//   again, and only those repeated go through the hash table;
// - else the hash table.
//
// The part's ids (shard-local, one per place) are read from the front of the array that then keeps
// the distinct ones: the k-th distinct id is written at k <= j once id j is read. Reply rows and
// their counts are below n <= 2^32 - 1: 32 bits.
const lookup_part& plan_part(lookup_plan& plan, std::size_t s, std::size_t shard_rows) {
  const std::size_t n = plan.count[s];
  row_place* places = plan.places_of(s);
  std::int64_t* asked_ids = plan.ids_of(s);
  const std::int64_t* ids = asked_ids;
  std::uint32_t asked = 0;
  auto& tables = plan_tables::local();
  if (plan.distinct || (!plan.sorted && repeats_not_worth_finding(ids, n, shard_rows, tables))) {
    for (std::size_t j = 0; j < n; ++j) places[j].row = static_cast<std::uint32_t>(j);
    asked = static_cast<std::uint32_t>(n);
  } else if (plan.sorted) {
    for (std::size_t j = 0; j < n; ++j) {
      const std::int64_t id = ids[j];
      if (asked == 0 || asked_ids[asked - 1] != id) asked_ids[asked++] = id;
      places[j].row = asked - 1;
    }
  } else if (shard_rows / 8 <= n) {
    auto& row_index = tables.row_index;
    if (row_index.size() < shard_rows || row_index.size() / 4 > shard_rows) {
      row_index = std::vector<std::uint32_t>(shard_rows, 0);  // a new vector: shrinking frees the old storage
    }
    std::uint32_t* index = row_index.data();
    constexpr std::size_t ahead = 16;
    for (std::size_t j = 0; j < n; ++j) {
      if (j + ahead < n) __builtin_prefetch(index + ids[j + ahead], 1);
      const std::int64_t row = ids[j];
      std::uint32_t& at = index[row];
      if (at == 0) {  // its first time; asked < n <= 2^32 - 1, so asked + 1 fits
        asked_ids[asked] = row;
        at = ++asked;
      }
      places[j].row = at - 1;
    }
    if (row_index.size() * sizeof(std::uint32_t) > (std::size_t{64} << 20)) {
      row_index = std::vector<std::uint32_t>();  // a thread keeps at most 64 MiB of it between calls
    } else {
      for (std::size_t u = 0; u < asked; ++u) index[asked_ids[u]] = 0;  // zero again for the next call
    }
  } else if (shard_rows / 256 <= n) {  // the bits: at most 64 bytes per id, as the hash table's 32
    const std::size_t words = shard_rows / 64 + 1;
    tables.seen.assign(words, 0);
    tables.repeated.assign(words, 0);
    std::uint64_t* seen = tables.seen.data();
    std::uint64_t* repeated = tables.repeated.data();
    std::size_t repeated_rows = 0;
    for (std::size_t j = 0; j < n; ++j) {
      const auto row = static_cast<std::size_t>(ids[j]), word = row / 64;
      const std::uint64_t bit = std::uint64_t{1} << (row % 64);
      if ((seen[word] & bit) && !(repeated[word] & bit)) {
        repeated[word] |= bit;
        ++repeated_rows;
      }
      seen[word] |= bit;
    }
    common::id_map& first = tables.asked;
    first.reset(repeated_rows);
    tables.reply_row.resize(repeated_rows);
    std::uint32_t* reply_row = tables.reply_row.data();
    std::size_t known = 0;  // repeated rows met so far
    for (std::size_t j = 0; j < n; ++j) {
      const std::int64_t id = ids[j];
      const auto row = static_cast<std::size_t>(id);
      if (!(repeated[row / 64] & (std::uint64_t{1} << (row % 64)))) {
        asked_ids[asked] = id;
        places[j].row = asked++;
        continue;
      }
      const std::uint32_t index = first.index_of(id);
      if (index == known) {  // its first time
        ++known;
        reply_row[index] = asked;
        asked_ids[asked++] = id;
      }
      places[j].row = reply_row[index];
    }
  } else {
    // This shard's own table: first-seen indices are reply rows.
    common::id_map& seen = tables.asked;
    seen.reset(n);
    constexpr std::size_t ahead = 16;  // ids whose slots are being loaded while one is looked up
    for (std::size_t j = 0; j < n; ++j) {
      if (j + ahead < n) seen.prefetch(ids[j + ahead]);
      const std::int64_t id = ids[j];
      const std::uint32_t index = seen.index_of(id);
      if (index == asked) asked_ids[asked++] = id;
      places[j].row = index;
    }
  }
  const bool direct = asked == n && places[n - 1].position - places[0].position == n - 1;
  return plan.parts.emplace_back(lookup_part{
      s, tensor(dtype::int64, {asked}, plan.ids.slice(plan.start[s] * sizeof(std::int64_t), asked * sizeof(std::int64_t))),
      std::span<const row_place>(places, n), direct});
}

// Copies a part's reply rows to their places in `out` (rows of `row_bytes`) as they arrive, while
// they are in cache and while the rest of the reply is still on its way. A part's places come in
// first-seen order: a place waits only for reply rows before its own.
class row_placer {
 public:
  row_placer(std::byte* out, const lookup_part& part, std::size_t row_bytes) noexcept
      : out_(out), part_(part), row_bytes_(row_bytes) {}

  // Places what the front of the reply that has arrived allows.
  void place(std::span<const std::byte> arrived) noexcept {
    if (row_bytes_ == 0) return;  // rows of no elements: nothing to copy
    told_from_ = arrived.data();
    const std::size_t rows = arrived.size() / row_bytes_;
    const std::byte* from = arrived.data();
    const row_place* places = part_.places.data();
    const std::size_t n = part_.places.size();
    std::size_t j = placed_;
    common::with_row_size(row_bytes_, [&](auto size) {
      for (; j < n && places[j].row < rows; ++j) {
        std::memcpy(out_ + places[j].position * size, from + places[j].row * size, size);
      }
    });
    placed_ = j;
  }

  // Checks the whole reply (a reply of the wrong size is errc::protocol_error) and places the rows
  // not placed yet.
  void finish(const tensor& reply) {
    const std::size_t asked = part_.ids.size();
    if (reply.size_bytes() != asked * row_bytes_ || reply.shape().empty() || reply.shape()[0] != asked) {
      throw error(errc::protocol_error, fmt::format("a lookup of {} rows was answered with {} {}", asked,
                                                    name_of(reply.type()), to_string(reply.shape())));
    }
    const std::byte* from = reply.bytes().data();
    if (part_.direct) {
      // Received into place, unless the transport could not use the result's storage.
      std::byte* to = out_ + part_.places[0].position * row_bytes_;
      if (from != to && reply.size_bytes()) std::memcpy(to, from, reply.size_bytes());
      return;
    }
    // Rows told as they arrived came from the buffer given for the reply; a ps that put its
    // tensor in another segment (a protocol violation the checks above cannot see) is placed
    // again whole, from the tensor.
    if (from != told_from_) placed_ = 0;
    place({from, reply.size_bytes()});
  }

 private:
  std::byte* out_;
  const lookup_part& part_;
  std::size_t row_bytes_;
  std::size_t placed_ = 0;  // places [0, placed_) are done
  const std::byte* told_from_ = nullptr;  // where the rows placed so far were read
};

}  // namespace

std::vector<std::int64_t> slice_rows(std::uint64_t rows, std::optional<std::int64_t> begin,
                                     std::optional<std::int64_t> end, std::int64_t step) {
  if (step == 0) throw error(errc::invalid_argument, "slice step cannot be zero");
  if (rows > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
    throw error(errc::invalid_argument, fmt::format("{} rows are more than a slice can count", rows));
  }
  // Python's slice.indices: bounds clamped to [lower, upper]; a negative bound adds n first.
  const auto n = static_cast<std::int64_t>(rows);
  const std::int64_t lower = step > 0 ? 0 : -1;
  const std::int64_t upper = step > 0 ? n : n - 1;
  const auto clamped = [&](std::optional<std::int64_t> bound, std::int64_t absent) {
    if (!bound) return absent;
    std::int64_t i = *bound;
    if (i < 0) {
      i += n;  // i >= INT64_MIN and 0 <= n: no overflow
      return std::max(i, lower);
    }
    return std::min(i, upper);
  };
  const std::int64_t start = clamped(begin, step > 0 ? lower : upper);
  const std::int64_t stop = clamped(end, step > 0 ? upper : lower);
  // |step| as unsigned: -INT64_MIN does not fit in int64.
  const std::uint64_t magnitude = step > 0 ? static_cast<std::uint64_t>(step) : 0 - static_cast<std::uint64_t>(step);
  std::uint64_t count = 0;
  if (step > 0 && stop > start) count = (static_cast<std::uint64_t>(stop - start) - 1) / magnitude + 1;
  if (step < 0 && start > stop) count = (static_cast<std::uint64_t>(start - stop) - 1) / magnitude + 1;
  std::vector<std::int64_t> out;
  out.reserve(count);
  for (std::uint64_t k = 0; k < count; ++k) {
    const auto offset = static_cast<std::int64_t>(k * magnitude);  // at most |stop - start| <= n + 1
    out.push_back(step > 0 ? start + offset : start - offset);
  }
  return out;
}

// The coroutines of sharded_ops<T>, compiled once per element type (the header declares them and
// says `extern template`).

template <class T>
variable_io& sharded_ops<T>::bound(const io_ptr& io, const sharded_layout& layout) {
  if (!io) throw error(errc::failed_precondition, "variable handle '" + layout.ref.name + "' is not bound");
  return *io;
}

// The shard's bytes are received straight into `out`; a copy is only needed if the transport could
// not use it.
template <class T>
asio::awaitable<void> sharded_ops<T>::read_into(variable_io& io, variable_ref shard, std::byte* out) {
  const std::size_t bytes = num_elements(shard.shape) * sizeof(T);
  const tensor t = co_await io.read(shard, byte_buffer::borrow(out, bytes));
  check_reply(shard, t);
  if (t.size_bytes() && t.bytes().data() != out) std::memcpy(out, t.bytes().data(), t.size_bytes());
}

template <class T>
asio::awaitable<void> sharded_ops<T>::read_to(io_ptr io, layout_ptr layout, xt::xarray<T>& out) {
  auto& channel = bound(io, *layout);
  const auto& shape = layout->ref.shape;
  if (!std::equal(out.shape().begin(), out.shape().end(), shape.begin(), shape.end())) out.resize(shape);
  auto* bytes = reinterpret_cast<std::byte*>(out.data());
  const std::size_t row_bytes = layout->row_elements() * sizeof(T);
  co_await run_all(layout->num_shards(), [&](std::size_t i) {
    return read_into(channel, layout->ref.shards[i], bytes + layout->offsets[i] * row_bytes);
  });
}

template <class T>
asio::awaitable<xt::xarray<T>> sharded_ops<T>::read(io_ptr io, layout_ptr layout) {
  xt::xarray<T> out(layout->ref.shape);
  // Fresh pages (glibc maps a large block anew each time): huge pages fault in far fewer times.
  common::advise_huge_pages(out.data(), out.size() * sizeof(T));
  co_await read_to(std::move(io), std::move(layout), out);
  co_return out;
}

template <class T>
asio::awaitable<void> sharded_ops<T>::update(io_ptr io, layout_ptr layout, update_op op, tensor value,
                                             const char* operation) {
  auto& channel = bound(io, *layout);
  const auto parts = split_dense(*layout, value, operation);
  co_await run_all(parts.size(), [&](std::size_t i) { return channel.update(layout->ref.shards[i], op, parts[i]); });
}

// A shard's reply is received straight into the result when its rows land there as they are (the
// part is direct), else into a reused buffer of this thread, its rows placed as they arrive.
template <class T>
asio::awaitable<void> sharded_ops<T>::lookup_shard(variable_io& io, variable_ref shard, const lookup_part& part,
                                                   std::byte* out, std::size_t row_bytes) {
  const std::size_t bytes = part.ids.size() * row_bytes;
  row_placer placer(out, part, row_bytes);
  byte_buffer into = part.direct ? byte_buffer::borrow(out + part.places[0].position * row_bytes, bytes)
                                 : client::scratch_buffers::take(bytes);
  variable_io::arrival_handler on_arrival;
  if (!part.direct) on_arrival = [&placer](std::span<const std::byte> arrived) { placer.place(arrived); };
  const tensor reply = co_await io.gather(std::move(shard), part.ids, std::move(into), std::move(on_arrival));
  placer.finish(reply);
}

template <class T>
asio::awaitable<xt::xarray<T>> sharded_ops<T>::gather(io_ptr io, layout_ptr layout, std::span<const std::int64_t> ids,
                                                      shape_type shape, bool flat, const char* operation,
                                                      bool distinct) {
  std::optional<lookup_plan> plan;
  try {
    bound(io, *layout);
    if (flat) check_one_dimensional(shape, operation);
    plan.emplace(prepare_lookup(*layout, ids, operation, distinct));
  } catch (...) {
    return failed_lookup(std::current_exception());
  }
  return send_lookup(std::move(io), std::move(layout), std::move(*plan), std::move(shape));
}

template <class T>
asio::awaitable<xt::xarray<T>> sharded_ops<T>::failed_lookup(std::exception_ptr e) {
  std::rethrow_exception(e);
  co_return xt::xarray<T>{};
}

template <class T>
asio::awaitable<xt::xarray<T>> sharded_ops<T>::send_lookup(io_ptr io, layout_ptr layout, lookup_plan plan,
                                                           shape_type shape) {
  auto& channel = bound(io, *layout);
  shape.insert(shape.end(), layout->ref.shape.begin() + 1, layout->ref.shape.end());
  xt::xarray<T> out(shape);
  // Fresh pages, as for a read into a fresh array.
  common::advise_huge_pages(out.data(), out.size() * sizeof(T));
  auto* bytes = reinterpret_cast<std::byte*>(out.data());
  const std::size_t row_bytes = layout->row_elements() * sizeof(T);
  std::vector<std::size_t> shards;  // those asked for rows
  for (std::size_t s = 0; s < layout->num_shards(); ++s) {
    if (plan.count[s] > 0) shards.push_back(s);
  }
  const auto rows_of_shard = [&](std::size_t s) { return layout->offsets[s + 1] - layout->offsets[s]; };
  if (shards.size() == 1) {
    const lookup_part& part = plan_part(plan, shards[0], rows_of_shard(shards[0]));
    co_await lookup_shard(channel, layout->ref.shards[shards[0]], part, bytes, row_bytes);
    co_return out;
  }
  // A part's request goes out before the next part is planned: a ps gathers its rows while this
  // thread finds the next shard's repeats (docs/design.md, "Lookups and scatters without fresh
  // buffers").
  const auto executor = co_await asio::this_coro::executor;
  task_group requests(executor);
  std::exception_ptr failure;
  for (std::size_t i = 0; i < shards.size() && !failure; ++i) {
    try {
      const lookup_part& part = plan_part(plan, shards[i], rows_of_shard(shards[i]));
      requests.spawn(lookup_shard(channel, layout->ref.shards[shards[i]], part, bytes, row_bytes));
    } catch (...) {
      failure = std::current_exception();
    }
    if (!failure && i + 1 < shards.size()) co_await requests.let_run();
  }
  co_await requests.wait(!failure);
  if (failure) std::rethrow_exception(failure);
  co_return out;
}

template <class T>
asio::awaitable<xt::xarray<T>> sharded_ops<T>::slice(io_ptr io, layout_ptr layout, std::optional<std::int64_t> begin,
                                                     std::optional<std::int64_t> end, std::int64_t step) {
  if (layout->ref.shape.empty()) {
    throw error(errc::invalid_argument,
                fmt::format("read_rows of '{}': a scalar variable has no rows", layout->ref.name));
  }
  std::vector<std::int64_t> rows;
  try {
    rows = slice_rows(layout->ref.shape[0], begin, end, step);
  } catch (const error& e) {
    throw error(e.code(), fmt::format("read_rows of '{}': {}", layout->ref.name, e.what()));
  }
  // Named: g++ 12 destroys a co_await's temporaries early.
  auto gathered = gather(std::move(io), std::move(layout), rows, {rows.size()}, true, "read_rows");
  co_return co_await std::move(gathered);
}

template <class T>
asio::awaitable<void> sharded_ops<T>::failed(std::exception_ptr e) {
  std::rethrow_exception(e);
  co_return;
}

template <class T>
asio::awaitable<void> sharded_ops<T>::scatter(io_ptr io, layout_ptr layout, update_op op,
                                              std::vector<shard_rows> parts) {
  auto& channel = bound(io, *layout);
  co_await run_all(parts.size(), [&](std::size_t i) {
    return channel.scatter(layout->ref.shards[parts[i].shard], op, parts[i].ids, parts[i].rows);
  });
}

template <class T>
asio::awaitable<void> sharded_ops<T>::apply_dense(io_ptr io, layout_ptr layout, optimizer opt, tensor gradient) {
  auto& channel = bound(io, *layout);
  const auto parts = split_dense(*layout, gradient, "apply_gradient");
  co_await run_all(parts.size(), [&](std::size_t i) {
    return channel.apply_gradient(layout->ref.shards[i], opt, parts[i], std::nullopt);
  });
}

template <class T>
asio::awaitable<void> sharded_ops<T>::apply_sparse(io_ptr io, layout_ptr layout, optimizer opt,
                                                   std::vector<shard_rows> parts) {
  auto& channel = bound(io, *layout);
  co_await run_all(parts.size(), [&](std::size_t i) {
    return channel.apply_gradient(layout->ref.shards[parts[i].shard], opt, parts[i].rows, parts[i].ids);
  });
}

template struct sharded_ops<float>;
template struct sharded_ops<double>;
template struct sharded_ops<std::int32_t>;
template struct sharded_ops<std::int64_t>;

}  // namespace pscoro::detail

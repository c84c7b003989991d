// A dynamic embedding table's part on one ps: the buckets it holds, each an open-addressing map
// from id to a record in the part's slab, where a record holds the id, when it was last named, the
// row and the optimizer's slots together (no allocation per row). Admission, eviction and the
// table's clock are decided here. Pure: no executor, no wire; ps_service decodes requests and
// answers.
//
// What happens to the rows on each failure: a request refused (bad id, capacity, limits) changes
// nothing, not even admission counts: every check runs before the first write, and the held rows a
// refused lookup had marked named are named back (a row idle past its time is dropped when met,
// refused or not: it was gone already). The end of the chief's session drops the part with the
// ps's variables; a ps that dies loses its part and the run fails, as for variables; a checkpoint
// holds the rows and the state beside them (state(), export_rows(); reset() and insert_rows()
// restore them onto any split of the buckets).
#pragma once

#include <pscoro/detail/variable_io.hpp>
#include <pscoro/hash_table_options.hpp>
#include <pscoro/optimizers.hpp>
#include <pscoro/tensor.hpp>

#include "common/id_hash.hpp"

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace pscoro::ps {

/// The most virtual buckets a table may have: a part keeps a pointer per bucket of the table.
inline constexpr std::uint32_t max_hash_table_buckets = std::uint32_t{1} << 20;

/// How a table's records are laid out: [int64 id][uint64 last named][row: dim values][slot rows...],
/// padded to 8 bytes.
struct record_layout {
  static constexpr std::size_t header_bytes = 16;
  std::size_t row_bytes = 0;
  std::size_t slots = 0;

  std::size_t bytes() const noexcept { return (header_bytes + (1 + slots) * row_bytes + 7) / 8 * 8; }
};

/// A table part's records in one address range reserved for the most the part may hold and
/// committed as it fills: a record is at base + index * record size (no chunk table to read), rows
/// never move as the part grows, and a large part lies in transparent huge pages (a random row
/// misses the TLB far less). A released record is reused by the next allocation (it names the next
/// free one).
class record_slab {
 public:
  /// Reserves room for `most` records (at least one) of `record_bytes`; nothing is committed yet.
  /// Throws errc::resource_exhausted when the address space cannot be reserved.
  record_slab(std::size_t record_bytes, std::uint64_t most);
  ~record_slab();
  record_slab(const record_slab&) = delete;
  record_slab& operator=(const record_slab&) = delete;

  std::byte* at(std::uint32_t i) const noexcept { return base_ + std::size_t{i} * record_bytes_; }
  /// The index of record `r` (at(index_of(r)) == r).
  std::uint32_t index_of(const std::byte* r) const noexcept {
    return static_cast<std::uint32_t>(static_cast<std::size_t>(r - base_) / record_bytes_);
  }
  std::size_t record_bytes() const noexcept { return record_bytes_; }
  std::uint64_t most() const noexcept { return most_; }
  /// A record's index, its bytes unset. Throws errc::resource_exhausted past most() records.
  std::uint32_t allocate();
  void release(std::uint32_t i) noexcept;
  /// Records ever handed out, held or released: every index below it is one.
  std::uint32_t allocated() const noexcept { return allocated_; }
  /// Memory the slab takes: what it has committed.
  std::uint64_t bytes_held() const noexcept { return committed_ + sizeof(*this); }
  /// A slab of records of `record_bytes` bytes (more: new slots) holding these records at the same
  /// indices, each with its first bytes and fill(record) called to set the rest (a free record
  /// too: harmless).
  template <class F>
  std::unique_ptr<record_slab> widened(std::size_t record_bytes, F&& fill) const {
    auto wider = std::make_unique<record_slab>(record_bytes, most_);
    wider->commit(allocated_);
    for (std::uint32_t i = 0; i < allocated_; ++i) {
      std::byte* to = wider->at(i);
      copy_bytes(to, at(i), record_bytes_);
      fill(to);
    }
    wider->allocated_ = allocated_;
    wider->free_ = free_;
    return wider;
  }

 private:
  static constexpr std::uint32_t no_record = ~std::uint32_t{0};
  /// Records past this many bytes lie in huge pages.
  static constexpr std::uint64_t huge_records_from = std::uint64_t{4} << 20;
  static void copy_bytes(std::byte* to, const std::byte* from, std::size_t n) noexcept;
  /// Commits room for at least `records` records.
  void commit(std::uint64_t records);

  std::size_t record_bytes_;
  std::uint64_t most_;
  std::byte* reserved_ = nullptr;  // the mapping: base_ rounded down
  std::size_t reserved_bytes_ = 0;
  std::byte* base_ = nullptr;       // aligned to a huge page
  std::uint64_t committed_ = 0;     // bytes from base_ readable and writable
  std::uint32_t allocated_ = 0;     // records ever handed out (held or free)
  std::uint32_t free_ = no_record;
};

/// One bucket's map from id to record (in its part's slab). Linear probing over 8-byte entries
/// (the low half of the id's mix as a tag, which also gives an entry's home, and the record's
/// index), deleted by shifting back (no tombstones), grown by half at 9/10 full: the map costs
/// 8.9-13.3 bytes per row. Under a quarter full it shrinks to half full (to nothing when empty), so
/// that a table whose rows are evicted gives their map memory back as well as their records.
class hash_bucket {
 public:
  explicit hash_bucket(record_slab* slab) : slab_(slab) {}
  /// Its records moved to `slab`, at the same indices.
  void use_slab(record_slab* slab) noexcept { slab_ = slab; }

  std::size_t size() const noexcept { return size_; }
  /// The record of `id` (whose mix is `mixed`), or nullptr.
  std::byte* find(std::int64_t id, std::uint64_t mixed) const noexcept;
  /// Starts loading the map entry where `mixed`'s id would be (a find about to ask for it soon).
  void prefetch(std::uint64_t mixed) const noexcept {
    if (!map_.empty()) __builtin_prefetch(&map_[home(static_cast<std::uint32_t>(mixed))]);
  }
  /// Starts loading the record the first entry with `mixed`'s tag names, once prefetch() has
  /// brought its map entries in: the second of a find's two cache misses, taken early.
  void prefetch_record(std::uint64_t mixed) const noexcept {
    if (size_ == 0) return;
    const auto tag = static_cast<std::uint32_t>(mixed);
    for (std::size_t at = home(tag);; at = next(at)) {
      const entry& e = map_[at];
      if (e.record == empty_entry) return;
      if (e.tag == tag) {
        // The header and a 64-byte row take two cache lines at most records' offsets.
        const std::byte* r = slab_->at(e.record);
        __builtin_prefetch(r);
        __builtin_prefetch(r + 64);
        return;
      }
    }
  }
  /// A new record for `id`, which is not held: its header set (last named 0), the rest unset.
  std::byte* insert(std::int64_t id, std::uint64_t mixed);
  /// Drops `id`'s record, if held, and shrinks the map left under a quarter full (best effort: with
  /// no memory for the smaller map, the larger one stays).
  void erase(std::int64_t id, std::uint64_t mixed) noexcept;
  /// A held record chosen by `random` (uniform over the map's entries, retried past empty ones),
  /// or nullptr when the bucket is empty.
  std::byte* sample(std::uint64_t random) const noexcept;
  /// Calls f(record) for every held record; f may not insert or erase.
  template <class F>
  void for_each(F&& f) const {
    for (const entry& e : map_) {
      if (e.record != empty_entry) f(slab_->at(e.record));
    }
  }
  /// Memory the map takes (the records are the slab's).
  std::uint64_t bytes_held() const noexcept { return map_.capacity() * sizeof(entry); }

  static std::int64_t id_of(const std::byte* record) noexcept;
  static std::uint64_t last_named(const std::byte* record) noexcept;
  static void set_last_named(std::byte* record, std::uint64_t clock) noexcept;
  /// Whether a record of the slab is one erase() gave back (its last-named time says so: a held
  /// row's is a clock, below 2^63), so that a walk in the slab's order can tell held from free.
  static bool released(const std::byte* record) noexcept { return last_named(record) == released_mark; }

 private:
  struct entry {
    std::uint32_t tag;
    std::uint32_t record;  // empty_entry: no entry
  };
  static constexpr std::uint32_t empty_entry = ~std::uint32_t{0};
  static constexpr std::uint64_t released_mark = ~std::uint64_t{0};

  std::size_t home(std::uint32_t tag) const noexcept {
    return static_cast<std::size_t>((std::uint64_t{tag} * map_.size()) >> 32);
  }
  std::size_t next(std::size_t at) const noexcept { return at + 1 == map_.size() ? 0 : at + 1; }
  /// The same entries in a map of `capacity` (0: none; else more than size()).
  void rehash(std::size_t capacity);

  record_slab* slab_;
  std::vector<entry> map_;
  std::uint32_t size_ = 0;
};

/// Rows of a table's part as a checkpoint holds them: the ids, when each was last named, and each
/// row's values followed by its slots' (as many slot rows as the part lays out), row after row.
struct part_rows {
  std::vector<std::int64_t> ids;
  std::vector<std::uint64_t> last_named;
  std::vector<std::byte> values;
};

/// A piece of a part's export: whole buckets, and where the next piece starts.
struct exported_rows {
  part_rows rows;
  std::vector<std::int64_t> dropped;  // an increment's: ids of these buckets dropped since its base
  std::uint32_t next_bucket = 0;  // options.buckets when the part is done
};

/// What changed in a part since some point: the records written (one bit per record of the slab)
/// and the ids dropped. An incremental save writes the rows of the marked records that are still
/// held, and the dropped ids, which a restore drops before it puts the rows back.
class part_changes {
 public:
  void mark(std::uint32_t record) {
    const std::size_t word = record / 64;
    if (word >= bits_.size()) bits_.resize(word + 1, 0);
    bits_[word] |= std::uint64_t{1} << (record % 64);
  }
  bool marked(std::uint32_t record) const noexcept {
    const std::size_t word = record / 64;
    return word < bits_.size() && (bits_[word] >> (record % 64) & 1) != 0;
  }
  void drop(std::int64_t id) { dropped_.push_back(id); }
  const std::vector<std::int64_t>& dropped() const noexcept { return dropped_; }
  /// Adds `other`'s marks and dropped ids to these.
  void merge(const part_changes& other);
  void clear() noexcept;
  std::uint64_t bytes_held() const noexcept { return bits_.capacity() * 8 + dropped_.capacity() * 8; }

 private:
  std::vector<std::uint64_t> bits_;
  std::vector<std::int64_t> dropped_;
};

/// Counts of what a table's part did, for metrics and tests.
struct hash_table_counts {
  std::uint64_t admitted = 0;   // rows inserted
  std::uint64_t evicted = 0;    // rows dropped by eviction
  std::uint64_t not_admitted = 0;  // sightings of ids not admitted (a lookup returned the default)
  std::uint64_t gradients_dropped = 0;  // gradient rows for ids not held
};

/// One table's part on one ps.
class hash_table_part {
 public:
  /// The part of table `name` on `task` ("ps:0", named in refusals), of `type` (float32 or float64)
  /// and `options` (the initializer's seed already mixed with the table's name, as the chief sends
  /// it), holding the buckets `held` of options.buckets. Throws errc::invalid_argument for options
  /// no table can have (dim 0, a bucket count of 0, a held bucket out of range, glorot_uniform, an
  /// admission count of 0, a probability outside [0, 1], a filter of no counters).
  hash_table_part(std::string name, std::string task, dtype type, hash_table_options options,
                  std::span<const std::uint32_t> held);

  const std::string& name() const noexcept { return name_; }
  dtype type() const noexcept { return type_; }
  const hash_table_options& options() const noexcept { return options_; }
  std::size_t row_bytes() const noexcept { return layout_.row_bytes; }
  /// The rows held (with eviction::ttl, expired rows no sweep has reached yet included).
  std::uint64_t rows() const noexcept { return rows_; }
  /// The memory the part takes: buckets, records, the admission filter (kept as it grows: no walk
  /// over the buckets, so the ps can count it after every request).
  std::uint64_t bytes_held() const noexcept;
  const hash_table_counts& counts() const noexcept { return counts_; }
  std::uint64_t clock() const noexcept { return clock_; }
  /// The optimizer whose slots the records hold, once one has stepped the table.
  const std::optional<optimizer>& slot_owner() const noexcept { return slot_owner_; }

  /// Writes the rows of `ids` in input order into `out` (ids.size() rows of row_bytes()), marking
  /// each held one named now. With `insert`, ids not held are admitted by the table's policy and
  /// get their initial row; without, and for ids not admitted, the row is options.default_value.
  /// Checks first, changing nothing when it throws: an id of a bucket this part does not hold is
  /// errc::invalid_argument; rows that would not fit (eviction::none or ttl at max_rows_per_ps, or
  /// more new bytes than `room`, what the ps may still hold) are errc::resource_exhausted naming
  /// the table, the ps and the limit.
  void lookup(std::span<const std::int64_t> ids, bool insert, std::byte* out,
              std::uint64_t room = std::numeric_limits<std::uint64_t>::max());
  /// The most bytes `rows` new rows take (their records and map entries, a new chunk each at worst
  /// amortized): what a lookup checks against its room.
  std::uint64_t bytes_for_rows(std::uint64_t rows) const noexcept;
  /// One optimizer step on the rows of `ids` with `gradients` (ids.size() rows): repeated ids'
  /// gradients summed first, in input order; gradients of ids not held are dropped (counted). The
  /// first optimizer to step the table lays its slots out in every record (initial values as the
  /// optimizer's); another one later is errc::failed_precondition naming both. Checks run first.
  void apply_gradients(const optimizer& opt, std::span<const std::int64_t> ids, const std::byte* gradients);
  /// Sets the table's clock to `now` (never backwards: errc::invalid_argument). With eviction::ttl,
  /// the rows not named for more than max_idle ticks are gone at once (a lookup or a step finds
  /// them no more), and their memory comes back as sweeps reach them: each call sweeps the next
  /// records of the slab, in its order, in proportion to how far the clock moved (the whole part
  /// for every max_idle / 4 ticks), sweep_rows at most. Returns the rows this call's sweep dropped.
  std::uint64_t advance_clock(std::uint64_t now);
  /// Records a clock advance visits at most, so that moving the clock every step pauses the ps for
  /// a bounded time however large the part.
  static constexpr std::uint64_t sweep_rows = 65'536;

  /// The slot rows each record holds (those of slot_owner(); 0 before any step).
  std::size_t slots() const noexcept { return layout_.slots; }
  /// The rows of bucket `b` (held), the expired ones aside.
  part_rows rows_of(std::uint32_t b) const;
  /// The same, only those of records `only` marks (all when nullptr).
  part_rows rows_of(std::uint32_t b, const part_changes* only) const;
  /// The admission filter's counters (empty unless admission::min_count).
  std::span<const std::uint8_t> filter() const noexcept { return filter_; }
  /// The clock, step count, slot owner and filter: what a checkpoint saves beside the rows.
  detail::table_state state() const;
  /// The rows of the buckets held from `first` on, whole buckets, as many as fit in `max_bytes` of
  /// values (one bucket at least, even past it): a checkpoint reads a part in pieces. With
  /// `changed_only`, only the rows an incremental save writes (changed since the base named to
  /// start_save), with the ids of those buckets dropped since (8 bytes each of `max_bytes`).
  exported_rows export_rows(std::uint32_t first, std::uint64_t max_bytes, bool changed_only = false) const;

  /// Starts save `save` (not 0) of the part (docs/design.md, "Incremental saves"): from now on
  /// changes count toward the save after it. With `base` (not 0), the save writes only what
  /// changed since save `base`, which must be the part's previous save (then known written: the
  /// caller builds on its file) or the last one known written (the previous one failed); else,
  /// and for a part that was never saved or restored with an id, errc::failed_precondition naming
  /// the table and the ps, changing nothing: the caller saves the table whole instead.
  void start_save(std::uint64_t save, std::uint64_t base);
  /// The save start_save started last (0: none since the part was made or restored).
  std::uint64_t save_in_progress() const noexcept { return cut_save_; }
  /// The save the part last knew written whole or in part (restored from, or built on).
  std::uint64_t last_save() const noexcept { return committed_save_; }
  /// Whether the part counts changes (it has been saved, or restored from a save with an id).
  bool tracks_changes() const noexcept { return tracking_; }
  /// Most ids a part remembers as dropped between two saves, beyond its rows: past it the part
  /// stops counting changes (the next save is whole, which is then the smaller one; a save in
  /// progress goes on).
  static constexpr std::uint64_t dropped_ids_beyond_rows = 65'536;

  /// Starts a restore: drops every row and takes `state`, as if made anew with it (state.save, if
  /// not 0, is the save the rows come from: the next save may build on it). Checks first
  /// (errc::invalid_argument naming the table, changing nothing): an optimizer the ps does not
  /// step, a filter not of the part's size, a clock at 2^63 or past.
  void reset(const detail::table_state& state);
  /// Inserts the rows of a checkpoint (after reset(), a bucket or several at a time). Checks
  /// everything first (errc::invalid_argument naming the table, or errc::resource_exhausted for
  /// more rows than max_rows_per_ps or more bytes than `room`; changing nothing): sizes that do
  /// not match the part's slots, an id twice or (unless `replace`) held already, an id of a bucket
  /// this part does not hold, a last-named time past the clock. With `replace` (an incremental
  /// save's rows), a held id's row, slots and time are replaced.
  void insert_rows(const part_rows& rows, std::uint64_t room = std::numeric_limits<std::uint64_t>::max(),
                   bool replace = false);
  /// Drops the rows of `ids` that are held (an incremental save's dropped ids). Checks first: an id
  /// of a bucket this part does not hold is errc::invalid_argument, changing nothing.
  void drop_rows(std::span<const std::int64_t> ids);

  /// Whether this part holds bucket `b`.
  bool holds(std::uint32_t b) const noexcept { return b < slot_of_.size() && slot_of_[b] != not_held; }
  /// Calls f(id, last named, row, slot rows) for every row of bucket `b` (held).
  template <class F>
  void for_each_row(std::uint32_t b, F&& f) const {
    buckets_[slot_of_[b]].for_each([&](const std::byte* r) {
      const std::byte* row = r + record_layout::header_bytes;
      f(hash_bucket::id_of(r), hash_bucket::last_named(r), row, row + layout_.row_bytes);
    });
  }

 private:
  static constexpr std::uint32_t not_held = ~std::uint32_t{0};
  /// Whether a held record is idle past eviction::ttl's max_idle: gone, swept or not.
  bool expired(const std::byte* record) const noexcept;
  /// The record of `id` if it is held and not expired; an expired one is dropped on the way.
  std::byte* find_live(std::int64_t id, std::uint64_t mixed);
  /// Calls f(k, find_live(ids[k], mixes[k])) for each id in order, each id's bucket, map entry and
  /// record loaded a few ids before its turn (a find's cache misses, taken early).
  template <class F>
  void find_each(std::span<const std::int64_t> ids, const std::uint64_t* mixes, F&& f);
  hash_bucket& bucket_of(std::uint64_t mixed) const {
    return buckets_[slot_of_[common::bucket_of_mix(mixed, options_.buckets)]];
  }
  /// Throws errc::invalid_argument naming the first id of a bucket this part does not hold; writes
  /// each id's mix to `mixes` when given.
  void check_held(std::span<const std::int64_t> ids, std::uint64_t* mixes = nullptr) const;
  void initialize_row(std::int64_t id, std::byte* row) const;
  void initialize_slots(std::byte* slots) const;
  /// Makes room for one more row (capacity eviction), near bucket `near`.
  void evict_one(std::uint32_t near);
  void lay_out_slots(const optimizer& opt);
  /// Inserts `id` into bucket `b`, counting what the bucket grew by.
  std::byte* insert_record(std::uint32_t b, std::int64_t id, std::uint64_t mixed);
  /// Erases `id` from `bucket`, counting what the bucket shrank by.
  void erase_record(hash_bucket& bucket, std::int64_t id, std::uint64_t mixed) noexcept;
  /// Sums the held buckets' maps again.
  void count_bucket_bytes() noexcept;
  /// Counts record `r` as changed, for the next incremental save.
  void note_changed(const std::byte* r) {
    if (tracking_) changes_.mark(slab_->index_of(r));
  }
  /// Counts `id` as dropped, for the next incremental save (and the one in progress).
  void note_dropped(std::int64_t id);

  std::string name_;
  std::string task_;
  dtype type_;
  hash_table_options options_;
  record_layout layout_;
  std::unique_ptr<record_slab> slab_;  // its own address: the buckets point to it as the part moves
  /// Points every bucket at `slab`, which becomes the part's.
  void use_slab(std::unique_ptr<record_slab> slab);
  mutable std::vector<hash_bucket> buckets_;  // the held ones, in held_'s order
  std::vector<std::uint32_t> slot_of_;   // by bucket number: its index in buckets_, or not_held
  std::vector<std::uint32_t> held_;
  std::uint64_t rows_ = 0;
  std::uint64_t bucket_bytes_ = 0;  // the held buckets' maps, kept as they change size
  std::uint64_t clock_ = 0;
  std::uint32_t sweep_cursor_ = 0;  // the record the next clock advance sweeps first
  std::int64_t steps_ = 0;  // optimizer steps, for adam
  std::optional<optimizer> slot_owner_;
  std::vector<double> slot_initial_values_;
  std::vector<std::uint8_t> filter_;  // admission::min_count's counters
  std::mt19937_64 random_;            // admission::probability's draws; the capacity sample
  hash_table_counts counts_;
  // Incremental saves: nothing is counted until the first save (or a restore from one).
  bool tracking_ = false;
  std::uint64_t committed_save_ = 0;  // known written: the base of a save after it
  std::uint64_t cut_save_ = 0;        // started last, not yet known written
  part_changes cut_;                  // changes since committed_save_ up to cut_save_'s start
  part_changes changes_;              // changes since cut_save_'s start
};

}  // namespace pscoro::ps

#include "ps/hash_table.hpp"

#include "common/id_hash.hpp"
#include "common/id_map.hpp"
#include "common/memory.hpp"
#include "ps/kernels.hpp"

#include <pscoro/error.hpp>

#include <fmt/format.h>

#include <sys/mman.h>

#include <cerrno>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

namespace pscoro::ps {

namespace {

[[noreturn]] void invalid(std::string message) { throw error(errc::invalid_argument, std::move(message)); }

// The three counters of an id in a filter of `m`, from a second mix of its bits (independent of
// the bits that chose its bucket and its place in the bucket's map).
std::array<std::size_t, 3> filter_counters(std::uint64_t mixed, std::size_t m) noexcept {
  const std::uint64_t a = common::mix_id(static_cast<std::int64_t>(mixed ^ 0x9e3779b97f4a7c15ULL));
  const std::uint64_t b = common::mix_id(static_cast<std::int64_t>(a));
  const auto scaled = [m](std::uint64_t bits32) { return static_cast<std::size_t>((bits32 * m) >> 32); };
  return {scaled(a & 0xffffffffU), scaled(a >> 32), scaled(b & 0xffffffffU)};
}

std::uint8_t filter_estimate(const std::vector<std::uint8_t>& filter, std::uint64_t mixed) noexcept {
  const auto at = filter_counters(mixed, filter.size());
  return std::min({filter[at[0]], filter[at[1]], filter[at[2]]});
}

}  // namespace

// ---- record_slab ------------------------------------------------------------------------------------

record_slab::record_slab(std::size_t record_bytes, std::uint64_t most)
    : record_bytes_(record_bytes), most_(std::clamp<std::uint64_t>(most, 1, no_record - 1)) {
  // Reserved, not committed (PROT_NONE costs no memory and no commit charge), with a huge page to
  // spare so that the records start on one.
  const std::size_t huge = std::max<std::size_t>(common::huge_page_bytes(), 4096);
  if (most_ > (std::numeric_limits<std::size_t>::max() - 2 * huge) / record_bytes_) {
    throw error(errc::resource_exhausted, fmt::format("a hash table part of {} rows of {} bytes cannot be addressed",
                                                      most_, record_bytes_));
  }
  reserved_bytes_ = (most_ * record_bytes_ + huge - 1) / huge * huge + huge;
  void* p = ::mmap(nullptr, reserved_bytes_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    throw error(errc::resource_exhausted,
                fmt::format("a hash table part of up to {} rows needs {} bytes of address space, and mmap refused: {}",
                            most_, reserved_bytes_, std::strerror(errno)));
  }
  reserved_ = static_cast<std::byte*>(p);
  const auto address = reinterpret_cast<std::uintptr_t>(reserved_);
  base_ = reserved_ + ((huge - address % huge) % huge);
}

record_slab::~record_slab() {
  if (reserved_) ::munmap(reserved_, reserved_bytes_);
}

void record_slab::copy_bytes(std::byte* to, const std::byte* from, std::size_t n) noexcept { std::memcpy(to, from, n); }

void record_slab::commit(std::uint64_t records) {
  const std::uint64_t needed = records * record_bytes_;
  if (needed <= committed_) return;
  // 64 KiB at a time, then whole huge pages once past huge_page_threshold (advised: a large part's
  // random rows miss the TLB far less), so that a small part wastes little.
  const std::size_t huge = common::huge_page_bytes();
  const bool large = huge && needed >= huge_records_from;
  const std::uint64_t step = large ? huge : std::uint64_t{64} << 10;
  std::uint64_t bytes = (needed + step - 1) / step * step;
  bytes = std::min<std::uint64_t>(bytes, reserved_bytes_ - static_cast<std::uint64_t>(base_ - reserved_));
  if (::mprotect(base_ + committed_, bytes - committed_, PROT_READ | PROT_WRITE) != 0) {
    throw error(errc::resource_exhausted, fmt::format("a hash table part could not commit {} more bytes: {}",
                                                      bytes - committed_, std::strerror(errno)));
  }
  if (large) ::madvise(base_ + committed_ / huge * huge, bytes - committed_ / huge * huge, MADV_HUGEPAGE);
  committed_ = bytes;
}

std::uint32_t record_slab::allocate() {
  if (free_ != no_record) {
    const std::uint32_t i = free_;
    std::memcpy(&free_, at(i), sizeof free_);
    return i;
  }
  if (allocated_ >= most_) {
    throw error(errc::resource_exhausted, fmt::format("a hash table part cannot hold more than {} rows", most_));
  }
  commit(std::uint64_t{allocated_} + 1);
  return allocated_++;
}

void record_slab::release(std::uint32_t i) noexcept {
  std::memcpy(at(i), &free_, sizeof free_);
  free_ = i;
}

// ---- hash_bucket ------------------------------------------------------------------------------------

std::int64_t hash_bucket::id_of(const std::byte* record) noexcept {
  std::int64_t id;
  std::memcpy(&id, record, sizeof id);
  return id;
}

std::uint64_t hash_bucket::last_named(const std::byte* record) noexcept {
  std::uint64_t clock;
  std::memcpy(&clock, record + 8, sizeof clock);
  return clock;
}

void hash_bucket::set_last_named(std::byte* record, std::uint64_t clock) noexcept {
  std::memcpy(record + 8, &clock, sizeof clock);
}

std::byte* hash_bucket::find(std::int64_t id, std::uint64_t mixed) const noexcept {
  if (size_ == 0) return nullptr;
  const auto tag = static_cast<std::uint32_t>(mixed);
  for (std::size_t at = home(tag);; at = next(at)) {
    const entry& e = map_[at];
    if (e.record == empty_entry) return nullptr;
    if (e.tag == tag) {
      std::byte* r = slab_->at(e.record);
      if (id_of(r) == id) return r;
    }
  }
}

void hash_bucket::rehash(std::size_t capacity) {
  std::vector<entry> old(capacity, entry{0, empty_entry});
  old.swap(map_);
  for (const entry& e : old) {
    if (e.record == empty_entry) continue;
    std::size_t at = home(e.tag);
    while (map_[at].record != empty_entry) at = next(at);
    map_[at] = e;
  }
}

std::byte* hash_bucket::insert(std::int64_t id, std::uint64_t mixed) {
  if ((std::size_t{size_} + 1) * 10 > map_.size() * 9) {
    rehash(std::max<std::size_t>(8, map_.size() + map_.size() / 2));
  }
  const std::uint32_t i = slab_->allocate();
  std::byte* r = slab_->at(i);
  std::memcpy(r, &id, sizeof id);
  set_last_named(r, 0);
  const auto tag = static_cast<std::uint32_t>(mixed);
  std::size_t at = home(tag);
  while (map_[at].record != empty_entry) at = next(at);
  map_[at] = entry{tag, i};
  ++size_;
  return r;
}

void hash_bucket::erase(std::int64_t id, std::uint64_t mixed) noexcept {
  if (size_ == 0) return;
  const auto tag = static_cast<std::uint32_t>(mixed);
  std::size_t at = home(tag);
  while (true) {
    const entry& e = map_[at];
    if (e.record == empty_entry) return;
    if (e.tag == tag && id_of(slab_->at(e.record)) == id) break;
    at = next(at);
  }
  set_last_named(slab_->at(map_[at].record), released_mark);
  slab_->release(map_[at].record);
  --size_;
  // Backward shift: move each following entry of the run back into the hole when its home does not
  // lie strictly between the hole and it (cyclically), so every entry stays reachable from its home.
  const std::size_t n = map_.size();
  std::size_t hole = at;
  for (std::size_t j = next(hole);; j = next(j)) {
    const entry e = map_[j];
    if (e.record == empty_entry) break;
    const std::size_t h = home(e.tag);
    const std::size_t distance_to_j = (j + n - h) % n;
    const std::size_t distance_to_hole = (hole + n - h) % n;
    if (distance_to_hole <= distance_to_j) {
      map_[hole] = e;
      hole = j;
    }
  }
  map_[hole] = entry{0, empty_entry};
  if (std::size_t{size_} * 4 < map_.size()) {
    try {
      rehash(size_ == 0 ? 0 : std::max<std::size_t>(8, std::size_t{size_} * 2));
    } catch (const std::bad_alloc&) {
      // The smaller map could not be made: the larger one serves as well.
    }
  }
}

std::byte* hash_bucket::sample(std::uint64_t random) const noexcept {
  if (size_ == 0) return nullptr;
  // The map is at least 3/5 full once grown (a bucket that lost rows may be emptier): a few draws
  // find an entry; the scan is the rare fallback.
  for (int attempt = 0; attempt < 16; ++attempt) {
    const auto at = static_cast<std::size_t>(((random & 0xffffffffU) * map_.size()) >> 32);
    random = common::mix_id(static_cast<std::int64_t>(random));
    if (map_[at].record != empty_entry) return slab_->at(map_[at].record);
  }
  for (const entry& e : map_) {
    if (e.record != empty_entry) return slab_->at(e.record);
  }
  return nullptr;
}

// ---- part_changes -----------------------------------------------------------------------------------

void part_changes::merge(const part_changes& other) {
  if (other.bits_.size() > bits_.size()) bits_.resize(other.bits_.size(), 0);
  for (std::size_t w = 0; w < other.bits_.size(); ++w) bits_[w] |= other.bits_[w];
  dropped_.insert(dropped_.end(), other.dropped_.begin(), other.dropped_.end());
}

void part_changes::clear() noexcept {
  std::fill(bits_.begin(), bits_.end(), 0);
  dropped_.clear();
}

// ---- hash_table_part --------------------------------------------------------------------------------

hash_table_part::hash_table_part(std::string name, std::string task, dtype type, hash_table_options options,
                                 std::span<const std::uint32_t> held)
    : name_(std::move(name)), task_(std::move(task)), type_(type), options_(std::move(options)) {
  const auto refuse = [&](std::string what) { invalid(fmt::format("hash table '{}': {}", name_, what)); };
  if (type_ != dtype::float32 && type_ != dtype::float64) {
    refuse(fmt::format("rows must be float32 or float64, not {}", name_of(type_)));
  }
  if (options_.dim == 0 || options_.dim > (std::size_t{1} << 20)) {
    refuse(fmt::format("dim must be in [1, {}] (got {})", std::size_t{1} << 20, options_.dim));
  }
  if (options_.buckets == 0 || options_.buckets > max_hash_table_buckets) {
    refuse(fmt::format("buckets must be in [1, {}] (got {})", max_hash_table_buckets, options_.buckets));
  }
  if (std::holds_alternative<initializers::glorot_uniform>(options_.initializer)) {
    refuse("glorot_uniform takes its scale from a row count, which a hash table does not have");
  }
  if (!std::isfinite(options_.default_value)) {
    refuse(fmt::format("default_value must be finite (got {})", options_.default_value));
  }
  if (options_.max_rows_per_ps == 0) refuse("max_rows_per_ps must be at least 1");
  layout_.row_bytes = options_.dim * size_of(type_);
  kernels::check_initializer({options_.initializer, {1, options_.dim}, 0}, type_, {1, options_.dim}, name_);
  if (const auto* m = std::get_if<admission::min_count>(&options_.admission)) {
    if (m->count == 0 || m->count > 255) refuse(fmt::format("admission::min_count: count must be in [1, 255] (got {})", m->count));
    if (m->counters == 0 || m->counters > (std::size_t{1} << 32)) {
      refuse(fmt::format("admission::min_count: counters must be in [1, 2^32] (got {})", m->counters));
    }
    filter_.assign(m->counters, 0);
  } else if (const auto* p = std::get_if<admission::probability>(&options_.admission)) {
    if (!(p->p >= 0 && p->p <= 1)) refuse(fmt::format("admission::probability: p must be in [0, 1] (got {})", p->p));
    random_.seed(p->seed);
  }
  if (const auto* c = std::get_if<eviction::capacity>(&options_.eviction); c && c->rows_per_ps == 0) {
    refuse("eviction::capacity: rows_per_ps must be at least 1");
  }
  // Every row a part may hold: max_rows_per_ps, or the capacity's rows (never past 2^32).
  const auto* capacity = std::get_if<eviction::capacity>(&options_.eviction);
  slab_ = std::make_unique<record_slab>(layout_.bytes(), capacity ? capacity->rows_per_ps : options_.max_rows_per_ps);
  slot_of_.assign(options_.buckets, not_held);
  buckets_.reserve(held.size());
  for (const std::uint32_t b : held) {
    if (b >= options_.buckets) refuse(fmt::format("bucket {} is not one of its {} buckets", b, options_.buckets));
    if (slot_of_[b] != not_held) refuse(fmt::format("bucket {} is held twice", b));
    slot_of_[b] = static_cast<std::uint32_t>(buckets_.size());
    buckets_.emplace_back(slab_.get());
    held_.push_back(b);
  }
  count_bucket_bytes();
}

std::uint64_t hash_table_part::bytes_held() const noexcept {
  return filter_.capacity() + buckets_.capacity() * sizeof(buckets_[0]) + slot_of_.capacity() * sizeof(slot_of_[0]) +
         held_.capacity() * sizeof(held_[0]) + sizeof(*this) + slab_->bytes_held() + bucket_bytes_ +
         cut_.bytes_held() + changes_.bytes_held();
}

void hash_table_part::note_dropped(std::int64_t id) {
  if (!tracking_) return;
  changes_.drop(id);
  // The save in progress drops it too, if its bucket is still to be exported (a row it marked
  // changed must not come back from its base).
  if (cut_save_ != 0) cut_.drop(id);
  if (changes_.dropped().size() > rows_ + dropped_ids_beyond_rows) {
    // More dropped ids than a whole save holds rows: the next save goes whole (nothing builds on
    // the saves this part knows). A save in progress goes on with what it cut.
    tracking_ = false;
    committed_save_ = 0;
    changes_ = part_changes();
  }
}

void hash_table_part::start_save(std::uint64_t save, std::uint64_t base) {
  if (save == 0) invalid(fmt::format("hash table '{}' on {}: a save needs an id other than 0", name_, task_));
  if (base != 0 && !(tracking_ && (base == cut_save_ || base == committed_save_))) {
    const std::string why =
        !tracking_ ? std::string("it has not been saved, or restored from a save, since it was made (or since it "
                                 "dropped more ids than it holds rows)")
                   : fmt::format("its saves are {:016x} (last started) and {:016x} (last known written)", cut_save_,
                                 committed_save_);
    throw error(errc::failed_precondition,
                fmt::format("hash table '{}' on {} cannot tell what changed since save {:016x}: {}; save it whole",
                            name_, task_, base, why));
  }
  if (base != 0 && base == cut_save_) {
    // The save started last was written: this one holds what changed since its start.
    committed_save_ = cut_save_;
    std::swap(cut_, changes_);
    changes_.clear();
  } else {
    // The last one started was not written (or this save is whole): its changes stay counted.
    cut_.merge(changes_);
    changes_.clear();
  }
  cut_save_ = save;
  tracking_ = true;
}

void hash_table_part::use_slab(std::unique_ptr<record_slab> slab) {
  slab_ = std::move(slab);
  for (auto& bucket : buckets_) bucket.use_slab(slab_.get());
}

void hash_table_part::count_bucket_bytes() noexcept {
  bucket_bytes_ = 0;
  for (const auto& bucket : buckets_) bucket_bytes_ += bucket.bytes_held();
}

std::byte* hash_table_part::insert_record(std::uint32_t b, std::int64_t id, std::uint64_t mixed) {
  hash_bucket& bucket = buckets_[slot_of_[b]];
  const std::uint64_t before = bucket.bytes_held();
  std::byte* r = bucket.insert(id, mixed);
  bucket_bytes_ += bucket.bytes_held() - before;  // an insert only grows a map
  return r;
}

void hash_table_part::erase_record(hash_bucket& bucket, std::int64_t id, std::uint64_t mixed) noexcept {
  const std::uint64_t before = bucket.bytes_held();
  bucket.erase(id, mixed);
  bucket_bytes_ = bucket_bytes_ - before + bucket.bytes_held();  // an erase only shrinks one
}

void hash_table_part::check_held(std::span<const std::int64_t> ids, std::uint64_t* mixes) const {
  for (std::size_t k = 0; k < ids.size(); ++k) {
    const std::uint64_t mixed = common::mix_id(ids[k]);
    if (mixes) mixes[k] = mixed;
    const std::uint32_t b = common::bucket_of_mix(mixed, options_.buckets);
    if (!holds(b)) {
      invalid(fmt::format("hash table '{}' on {}: id {} (position {}) is in bucket {}, which this ps does not hold",
                          name_, task_, ids[k], k, b));
    }
  }
}

void hash_table_part::initialize_row(std::int64_t id, std::byte* row) const {
  // Row `id` of a variable of rows of dim values: the same values as a sharded variable's row
  // `id`, whatever the ps count. A negative id wraps, as any id names a stream.
  kernels::initialize({options_.initializer, {1, options_.dim}, static_cast<std::uint64_t>(id)}, type_,
                      {1, options_.dim}, row);
}

void hash_table_part::initialize_slots(std::byte* slots) const {
  visit_dtype(type_, [&](auto zero) {
    using T = decltype(zero);
    auto* values = reinterpret_cast<T*>(slots);
    for (std::size_t k = 0; k < slot_initial_values_.size(); ++k) {
      std::fill_n(values + k * options_.dim, options_.dim, static_cast<T>(slot_initial_values_[k]));
    }
  });
}

void hash_table_part::evict_one(std::uint32_t near) {
  // Sampled LRU: the least recently named of 8 records of the new row's bucket (or, when that one
  // is empty, of the next bucket this part holds that is not).
  std::size_t start = 0;
  while (start < held_.size() && held_[start] != near) ++start;
  for (std::size_t k = 0; k < held_.size(); ++k) {
    hash_bucket& b = buckets_[(start + k) % held_.size()];
    if (b.size() == 0) continue;
    std::byte* oldest = nullptr;
    for (int draw = 0; draw < 8; ++draw) {
      std::byte* r = b.sample(random_());
      if (r && (!oldest || hash_bucket::last_named(r) < hash_bucket::last_named(oldest))) oldest = r;
    }
    const std::int64_t id = hash_bucket::id_of(oldest);
    erase_record(b, id, common::mix_id(id));
    --rows_;
    ++counts_.evicted;
    note_dropped(id);
    return;
  }
}

std::uint64_t hash_table_part::bytes_for_rows(std::uint64_t rows) const noexcept {
  // A record, and up to 8 / 0.6 bytes of map (a bucket just grown is 3/5 full).
  return rows * (layout_.bytes() + 14);
}

template <class F>
void hash_table_part::find_each(std::span<const std::int64_t> ids, const std::uint64_t* mixes, F&& f) {
  // Three stages, each a cache miss taken early: the bucket (its map's address) 3 * ahead ids
  // before an id's turn, its map entry 2 * ahead before, its record ahead before.
  constexpr std::size_t ahead = 16;
  const std::size_t n = ids.size();
  for (std::size_t k = 0; k < std::min(3 * ahead, n); ++k) __builtin_prefetch(&bucket_of(mixes[k]));
  for (std::size_t k = 0; k < std::min(2 * ahead, n); ++k) bucket_of(mixes[k]).prefetch(mixes[k]);
  for (std::size_t k = 0; k < std::min(ahead, n); ++k) bucket_of(mixes[k]).prefetch_record(mixes[k]);
  for (std::size_t k = 0; k < n; ++k) {
    if (k + 3 * ahead < n) __builtin_prefetch(&bucket_of(mixes[k + 3 * ahead]));
    if (k + 2 * ahead < n) bucket_of(mixes[k + 2 * ahead]).prefetch(mixes[k + 2 * ahead]);
    if (k + ahead < n) bucket_of(mixes[k + ahead]).prefetch_record(mixes[k + ahead]);
    f(k, find_live(ids[k], mixes[k]));
  }
}

void hash_table_part::lookup(std::span<const std::int64_t> ids, bool insert, std::byte* out, std::uint64_t room) {
  const std::size_t row_bytes = layout_.row_bytes;
  // This thread's tables, kept between requests (a steady stream of lookups allocates nothing).
  thread_local std::vector<std::byte*> found;
  thread_local std::vector<std::uint64_t> mixes;
  thread_local std::vector<std::uint64_t> previous;  // a held row's last-named time before this request
  thread_local std::vector<std::size_t> missing;     // positions of ids not held
  mixes.resize(ids.size());
  check_held(ids, mixes.data());
  found.resize(ids.size());
  if (insert) previous.resize(ids.size());
  missing.clear();
  // Held ids first, the usual case: each one's row is copied out and it is named now while its
  // record is in cache (an insert refused below names it back).
  find_each(ids, mixes.data(), [&](std::size_t k, std::byte* r) {
    found[k] = r;
    if (r) {
      std::memcpy(out + k * row_bytes, r + record_layout::header_bytes, row_bytes);
      const std::uint64_t named = hash_bucket::last_named(r);
      if (insert) previous[k] = named;
      if (named != clock_) {
        hash_bucket::set_last_named(r, clock_);
        note_changed(r);
      }
    } else {
      missing.push_back(k);
    }
  });
  // A refusal below leaves the held rows as they were: named back, last first (a repeated id's
  // first time holds its time before the request).
  const auto name_back = [&] {
    if (!insert) return;  // (nothing refuses a read)
    for (std::size_t k = ids.size(); k-- > 0;) {
      if (found[k]) hash_bucket::set_last_named(found[k], previous[k]);
    }
  };
  // The ids not held, each once in first-seen order: a request counts once per id for
  // admission, and repeats copy the first one's row. Everything is decided before the first write.
  thread_local common::id_map seen(0);
  thread_local std::vector<std::uint32_t> index;
  thread_local std::vector<std::size_t> first;  // the first position of each distinct missing id
  thread_local std::vector<char> admit;
  seen.reset(missing.size());
  index.resize(missing.size());
  first.clear();
  for (std::size_t j = 0; j < missing.size(); ++j) {
    if (j + 8 < missing.size()) seen.prefetch(ids[missing[j + 8]]);
    index[j] = seen.index_of(ids[missing[j]]);
    if (index[j] == first.size()) first.push_back(missing[j]);
  }
  admit.assign(first.size(), 0);
  std::uint64_t admitted = 0;
  // Draws come from a copy, committed only when the request goes through.
  std::optional<std::mt19937_64> draws;
  if (insert && std::holds_alternative<admission::probability>(options_.admission)) draws = random_;
  if (insert) {
    for (std::size_t u = 0; u < first.size(); ++u) {
      const std::uint64_t mixed = mixes[first[u]];
      if (const auto* m = std::get_if<admission::min_count>(&options_.admission)) {
        admit[u] = filter_estimate(filter_, mixed) + 1u >= m->count;
      } else if (const auto* p = std::get_if<admission::probability>(&options_.admission)) {
        admit[u] = std::uniform_real_distribution<double>(0, 1)(*draws) < p->p;
      } else {
        admit[u] = 1;
      }
      admitted += admit[u] ? 1 : 0;
    }
  }
  const auto* capacity = std::get_if<eviction::capacity>(&options_.eviction);
  if (!capacity && rows_ + admitted > options_.max_rows_per_ps) {
    name_back();
    throw error(errc::resource_exhausted,
                fmt::format("hash table '{}' on {} is full: it holds {} rows of its max_rows_per_ps {}, and this "
                            "lookup would add {} (an eviction policy makes room: eviction::ttl or capacity)",
                            name_, task_, rows_, options_.max_rows_per_ps, admitted));
  }
  // At capacity a new row replaces one: only the rows below it take more memory.
  const std::uint64_t growth =
      capacity ? std::min(admitted, capacity->rows_per_ps - std::min(rows_, capacity->rows_per_ps)) : admitted;
  if (bytes_for_rows(growth) > room) {
    name_back();
    throw error(errc::resource_exhausted,
                fmt::format("hash table '{}' on {}: this lookup would add {} rows, about {} bytes, and the ps may hold "
                            "{} more (server_options::max_ps_bytes)",
                            name_, task_, growth, bytes_for_rows(growth), room));
  }
  if (draws) random_ = *draws;
  for (std::size_t u = 0; u < first.size(); ++u) {
    const std::int64_t id = ids[first[u]];
    const std::uint64_t mixed = mixes[first[u]];
    std::byte* row_out = out + first[u] * row_bytes;
    if (insert && !filter_.empty()) {
      for (const std::size_t at : filter_counters(mixed, filter_.size())) {
        if (filter_[at] < 255) ++filter_[at];
      }
    }
    if (!admit[u]) {
      visit_dtype(type_, [&](auto zero) {
        using T = decltype(zero);
        std::fill_n(reinterpret_cast<T*>(row_out), options_.dim, static_cast<T>(options_.default_value));
      });
      ++counts_.not_admitted;
      continue;
    }
    const std::uint32_t b = common::bucket_of_mix(mixed, options_.buckets);
    if (capacity && rows_ >= capacity->rows_per_ps) evict_one(b);
    std::byte* r = insert_record(b, id, mixed);
    hash_bucket::set_last_named(r, clock_);
    note_changed(r);
    std::byte* row = r + record_layout::header_bytes;
    initialize_row(id, row);
    if (layout_.slots > 0) initialize_slots(row + row_bytes);
    ++rows_;
    ++counts_.admitted;
    std::memcpy(row_out, row, row_bytes);
  }
  for (std::size_t j = 0; j < missing.size(); ++j) {
    const std::size_t f = first[index[j]];
    if (f != missing[j]) std::memcpy(out + missing[j] * row_bytes, out + f * row_bytes, row_bytes);
  }
}

void hash_table_part::lay_out_slots(const optimizer& opt) {
  const auto slots = slots_of(opt);
  slot_initial_values_.clear();
  for (const auto& slot : slots) slot_initial_values_.push_back(slot.initial_value);
  layout_.slots = slots.size();
  const std::size_t slot_offset = record_layout::header_bytes + layout_.row_bytes;
  use_slab(slab_->widened(layout_.bytes(), [&](std::byte* record) { initialize_slots(record + slot_offset); }));
  slot_owner_ = opt;
}

void hash_table_part::apply_gradients(const optimizer& opt, std::span<const std::int64_t> ids,
                                      const std::byte* gradients) {
  // This thread's tables, kept between requests (a steady stream of steps allocates nothing).
  thread_local std::vector<std::uint64_t> mixes;
  thread_local std::vector<std::uint64_t> seen_bits;
  thread_local std::vector<std::uint64_t> repeated_bits;
  thread_local std::vector<std::byte*> once;          // rows of ids named once, stepped from the request's rows
  thread_local std::vector<std::uint32_t> once_at;    // their positions in the request
  thread_local std::vector<std::uint32_t> again;      // positions of ids that may be named again
  thread_local std::vector<std::byte*> again_rows;    // their rows (nullptr: not held)
  thread_local common::id_map seen(0);
  thread_local std::vector<std::uint32_t> index;
  thread_local std::vector<std::byte*> stepped;
  thread_local std::vector<std::byte> summed;
  const std::size_t n = ids.size();
  mixes.resize(n);
  check_held(ids, mixes.data());
  kernels::check_optimizer(opt);
  if (slot_owner_ && optimizer_name(*slot_owner_) != optimizer_name(opt)) {
    throw error(errc::failed_precondition,
                fmt::format("hash table '{}' on {}: its rows hold the slots of {}, so {} cannot step it (one "
                            "optimizer per table)",
                            name_, task_, optimizer_name(*slot_owner_), optimizer_name(opt)));
  }
  // Checked: nothing refuses from here on.
  if (n == 0) return;
  if (!slot_owner_) lay_out_slots(opt);  // moves the records: before any is found
  // Repeated ids' gradients are summed first, in input order (the dense path's arithmetic: the
  // first row copied, the others added in turn), and stepped once. Most ids come once: a bitmap
  // of at least 16 bits per id, indexed by the id's mix and small enough to stay in cache, sends
  // those straight to their step with the request's gradient row; the ids whose bit is hit twice
  // (the repeated ones, and about 1 in 16 others by collision) are told apart exactly below.
  const std::size_t bits = std::max<std::size_t>(std::bit_ceil(16 * n), 64);
  const std::uint64_t bit_mask = bits - 1;
  seen_bits.assign(bits / 64, 0);
  repeated_bits.assign(bits / 64, 0);
  for (std::size_t k = 0; k < n; ++k) {
    const std::uint64_t at = mixes[k] & bit_mask;
    const std::uint64_t bit = std::uint64_t{1} << (at % 64);
    if (seen_bits[at / 64] & bit) repeated_bits[at / 64] |= bit;
    seen_bits[at / 64] |= bit;
  }
  once.clear();
  once_at.clear();
  again.clear();
  again_rows.clear();
  find_each(ids, mixes.data(), [&](std::size_t k, std::byte* r) {
    const std::uint64_t at = mixes[k] & bit_mask;
    const bool maybe_again = (repeated_bits[at / 64] >> (at % 64) & 1) != 0;
    if (!r) {
      ++counts_.gradients_dropped;
      return;
    }
    hash_bucket::set_last_named(r, clock_);
    note_changed(r);
    if (maybe_again) {
      again.push_back(static_cast<std::uint32_t>(k));
      again_rows.push_back(r + record_layout::header_bytes);
    } else {
      once.push_back(r + record_layout::header_bytes);
      once_at.push_back(static_cast<std::uint32_t>(k));
    }
  });
  if (once.empty() && again.empty()) return;
  if (kernels::counts_steps(opt)) ++steps_;
  kernels::apply_records(opt, type_, once, steps_, gradients, options_.dim, once_at);
  if (again.empty()) return;
  // The ids that may come again: numbered in first-seen order by their row, their gradients summed.
  const std::size_t row_bytes = layout_.row_bytes;
  seen.reset(again.size());
  index.resize(again.size());
  stepped.clear();
  for (std::size_t j = 0; j < again.size(); ++j) {
    index[j] = seen.index_of(ids[again[j]]);
    if (index[j] == stepped.size()) stepped.push_back(again_rows[j]);
  }
  summed.resize(stepped.size() * row_bytes);
  visit_dtype(type_, [&](auto zero) {
    using T = decltype(zero);
    const std::size_t dim = options_.dim;
    std::size_t next = 0;
    for (std::size_t j = 0; j < again.size(); ++j) {
      const T* from = reinterpret_cast<const T*>(gradients + std::size_t{again[j]} * row_bytes);
      T* into = reinterpret_cast<T*>(summed.data() + std::size_t{index[j]} * row_bytes);
      if (index[j] == next) {
        ++next;
        std::copy(from, from + dim, into);
      } else {
        for (std::size_t i = 0; i < dim; ++i) into[i] += from[i];
      }
    }
  });
  kernels::apply_records(opt, type_, stepped, steps_, summed.data(), options_.dim);
}

part_rows hash_table_part::rows_of(std::uint32_t b) const { return rows_of(b, nullptr); }

part_rows hash_table_part::rows_of(std::uint32_t b, const part_changes* only) const {
  part_rows out;
  const std::size_t value_bytes = (1 + layout_.slots) * layout_.row_bytes;
  const hash_bucket& bucket = buckets_[slot_of_[b]];
  if (!only) {
    out.ids.reserve(bucket.size());
    out.last_named.reserve(bucket.size());
    out.values.reserve(bucket.size() * value_bytes);
  }
  bucket.for_each([&](const std::byte* r) {
    if (expired(r)) return;  // gone, not yet swept
    if (only && !only->marked(slab_->index_of(r))) return;
    out.ids.push_back(hash_bucket::id_of(r));
    out.last_named.push_back(hash_bucket::last_named(r));
    const std::byte* values = r + record_layout::header_bytes;
    out.values.insert(out.values.end(), values, values + value_bytes);
  });
  return out;
}

detail::table_state hash_table_part::state() const {
  return {.clock = clock_, .steps = steps_, .owner = slot_owner_, .filter = filter_, .save = cut_save_};
}

exported_rows hash_table_part::export_rows(std::uint32_t first, std::uint64_t max_bytes, bool changed_only) const {
  exported_rows out;
  const std::uint64_t value_bytes = (1 + layout_.slots) * layout_.row_bytes;
  // An increment's dropped ids by bucket, those of [first, ...) only (a piece's are few next to
  // the part's rows).
  std::vector<std::pair<std::uint32_t, std::int64_t>> dropped;
  if (changed_only) {
    for (const std::int64_t id : cut_.dropped()) {
      const std::uint32_t b = common::bucket_of(id, options_.buckets);
      if (b >= first) dropped.emplace_back(b, id);
    }
    std::sort(dropped.begin(), dropped.end());
  }
  auto next_dropped = dropped.begin();
  std::uint64_t bytes = 0;
  std::uint32_t b = first;
  for (; b < options_.buckets; ++b) {
    if (!holds(b)) continue;
    auto bucket = rows_of(b, changed_only ? &cut_ : nullptr);
    const auto dropped_end =
        std::find_if(next_dropped, dropped.end(), [b](const auto& d) { return d.first > b; });
    const std::uint64_t more = bucket.ids.size() * value_bytes + 8 * static_cast<std::uint64_t>(dropped_end - next_dropped);
    if (bytes > 0 && bytes + more > max_bytes) break;
    bytes += more;
    out.rows.ids.insert(out.rows.ids.end(), bucket.ids.begin(), bucket.ids.end());
    out.rows.last_named.insert(out.rows.last_named.end(), bucket.last_named.begin(), bucket.last_named.end());
    out.rows.values.insert(out.rows.values.end(), bucket.values.begin(), bucket.values.end());
    for (; next_dropped != dropped_end; ++next_dropped) out.dropped.push_back(next_dropped->second);
    if (bytes >= max_bytes) {
      ++b;
      break;
    }
  }
  out.next_bucket = b;
  return out;
}

void hash_table_part::reset(const detail::table_state& state) {
  const auto refuse = [&](std::string what) {
    invalid(fmt::format("restore of hash table '{}' on {}: {}", name_, task_, what));
  };
  if (state.owner) kernels::check_optimizer(*state.owner);
  if (!state.filter.empty() && state.filter.size() != filter_.size()) {
    refuse(fmt::format("an admission filter of {} counters, the part's has {}", state.filter.size(), filter_.size()));
  }
  if (state.clock > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
    refuse(fmt::format("the clock {} is not below 2^63", state.clock));
  }
  if (state.steps < 0) refuse(fmt::format("a step count of {}", state.steps));
  // Checked: the part starts again, as made with this state (the counts for metrics go on).
  slot_initial_values_.clear();
  if (state.owner) {
    for (const auto& slot : slots_of(*state.owner)) slot_initial_values_.push_back(slot.initial_value);
  }
  layout_.slots = slot_initial_values_.size();
  slot_owner_ = state.owner;
  slab_ = std::make_unique<record_slab>(layout_.bytes(), slab_->most());
  for (auto& bucket : buckets_) bucket = hash_bucket(slab_.get());
  count_bucket_bytes();
  rows_ = 0;
  clock_ = state.clock;
  steps_ = state.steps;
  if (state.filter.empty()) {
    std::fill(filter_.begin(), filter_.end(), std::uint8_t{0});
  } else {
    std::copy(state.filter.begin(), state.filter.end(), filter_.begin());
  }
  // The restored rows are those of save state.save: the next save may write what changes from now.
  tracking_ = state.save != 0;
  committed_save_ = state.save;
  cut_save_ = 0;
  cut_ = part_changes();
  changes_ = part_changes();
}

void hash_table_part::insert_rows(const part_rows& rows, std::uint64_t room, bool replace) {
  const auto refuse = [&](std::string what) {
    invalid(fmt::format("restore of hash table '{}' on {}: {}", name_, task_, what));
  };
  const std::size_t value_bytes = (1 + layout_.slots) * layout_.row_bytes;
  const std::size_t n = rows.ids.size();
  if (rows.last_named.size() != n || rows.values.size() / value_bytes != n || rows.values.size() % value_bytes != 0) {
    refuse(fmt::format("{} ids, {} last-named times and {} bytes of values ({} per row with {} slots) do not match", n,
                       rows.last_named.size(), rows.values.size(), value_bytes, layout_.slots));
  }
  common::id_map seen(n);
  std::uint64_t added = 0;  // rows not held yet
  for (std::size_t k = 0; k < n; ++k) {
    const std::uint32_t b = common::bucket_of(rows.ids[k], options_.buckets);
    if (!holds(b)) refuse(fmt::format("id {} is in bucket {}, which this ps does not hold", rows.ids[k], b));
    const std::size_t before = seen.size();
    seen.index_of(rows.ids[k]);
    if (seen.size() == before) refuse(fmt::format("id {} is there twice", rows.ids[k]));
    const std::uint64_t mixed = common::mix_id(rows.ids[k]);
    if (bucket_of(mixed).find(rows.ids[k], mixed)) {
      if (!replace) refuse(fmt::format("id {} is held already", rows.ids[k]));
    } else {
      ++added;
    }
    if (rows.last_named[k] > clock_) {
      refuse(fmt::format("id {} was last named at {}, after the clock {}", rows.ids[k], rows.last_named[k], clock_));
    }
  }
  const auto* capacity = std::get_if<eviction::capacity>(&options_.eviction);
  const std::uint64_t most = capacity ? capacity->rows_per_ps : options_.max_rows_per_ps;
  if (added > most - std::min(rows_, most)) {
    throw error(errc::resource_exhausted,
                fmt::format("restore of hash table '{}' on {}: {} rows beside the {} held pass its {} of {} rows per "
                            "ps (restore onto more ps, or raise it)",
                            name_, task_, added, rows_, capacity ? "eviction::capacity" : "max_rows_per_ps", most));
  }
  if (bytes_for_rows(added) > room) {
    throw error(errc::resource_exhausted,
                fmt::format("restore of hash table '{}' on {}: {} rows need up to {} bytes and the ps may hold {} more "
                            "(server_options::max_ps_bytes)",
                            name_, task_, added, bytes_for_rows(added), room));
  }
  // Checked: now the part takes it all.
  for (std::size_t k = 0; k < n; ++k) {
    const std::uint64_t mixed = common::mix_id(rows.ids[k]);
    std::byte* r = replace ? bucket_of(mixed).find(rows.ids[k], mixed) : nullptr;
    if (!r) r = insert_record(common::bucket_of_mix(mixed, options_.buckets), rows.ids[k], mixed);
    hash_bucket::set_last_named(r, rows.last_named[k]);
    std::memcpy(r + record_layout::header_bytes, rows.values.data() + k * value_bytes, value_bytes);
  }
  rows_ += added;
}

void hash_table_part::drop_rows(std::span<const std::int64_t> ids) {
  check_held(ids);
  for (const std::int64_t id : ids) {
    const std::uint64_t mixed = common::mix_id(id);
    hash_bucket& bucket = bucket_of(mixed);
    if (!bucket.find(id, mixed)) continue;
    erase_record(bucket, id, mixed);
    --rows_;
  }
}

std::uint64_t hash_table_part::advance_clock(std::uint64_t now) {
  if (now > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
    invalid(fmt::format("hash table '{}': the clock must stay below 2^63 (got {})", name_, now));
  }
  if (now < clock_) {
    invalid(fmt::format("hash table '{}': the clock cannot go back from {} to {}", name_, clock_, now));
  }
  const std::uint64_t moved = now - clock_;
  clock_ = now;
  const auto* ttl = std::get_if<eviction::ttl>(&options_.eviction);
  if (!ttl || rows_ == 0 || moved == 0) return 0;
  // Idle rows are gone from now on (expired() hides them); their memory comes back as sweeps
  // reach them. A sweep reads records in the slab's order from where the last one stopped (a
  // walk through the buckets' maps took a cache miss per row), as many as the clock's move calls
  // for: the whole part for every max_idle / 4 ticks, so an idle row's memory is back within
  // about a quarter of max_idle after it went, and never more than sweep_rows records a call, so
  // that a clock moved every step costs the ps a bounded pause however large the part. (Swept
  // whole at every advance, the parts of the CTR example's 26 tables cost the ps more than the
  // lookups did.)
  const std::uint32_t records = slab_->allocated();
  const std::uint64_t quarter = std::max<std::uint64_t>(ttl->max_idle / 4, 1);
  const double share = std::min(1.0, static_cast<double>(moved) / static_cast<double>(quarter));
  const auto visits =
      std::min<std::uint64_t>(sweep_rows, static_cast<std::uint64_t>(std::ceil(share * static_cast<double>(records))));
  std::uint64_t dropped = 0;
  for (std::uint64_t v = 0; v < visits; ++v) {
    if (sweep_cursor_ >= records) sweep_cursor_ = 0;
    const std::byte* r = slab_->at(sweep_cursor_++);
    if (hash_bucket::released(r) || !expired(r)) continue;
    const std::int64_t id = hash_bucket::id_of(r);
    const std::uint64_t mixed = common::mix_id(id);
    erase_record(bucket_of(mixed), id, mixed);  // gives r back to the slab
    note_dropped(id);
    ++dropped;
  }
  rows_ -= dropped;
  counts_.evicted += dropped;
  return dropped;
}

bool hash_table_part::expired(const std::byte* record) const noexcept {
  const auto* ttl = std::get_if<eviction::ttl>(&options_.eviction);
  return ttl && clock_ - hash_bucket::last_named(record) > ttl->max_idle;
}

std::byte* hash_table_part::find_live(std::int64_t id, std::uint64_t mixed) {
  hash_bucket& bucket = bucket_of(mixed);
  std::byte* r = bucket.find(id, mixed);
  if (r && expired(r)) {
    // Idle past its time: gone, whether or not a sweep has reached it yet.
    erase_record(bucket, id, mixed);
    --rows_;
    ++counts_.evicted;
    note_dropped(id);
    return nullptr;
  }
  return r;
}

}  // namespace pscoro::ps

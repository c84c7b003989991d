// A dynamic embedding table's part on one ps, without a ps: the bucket map against a reference,
// initial rows as a function of the id alone, admission, eviction, refusals that change nothing,
// optimizer steps bitwise equal to a variable's, and the bytes a row costs beyond its values.
#include "test_support.hpp"

#include "common/id_hash.hpp"
#include "ps/hash_table.hpp"
#include "ps/kernels.hpp"

#include <pscoro/error.hpp>

#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <unordered_map>
#include <vector>

using namespace pscoro;
using ps::hash_bucket;
using ps::hash_table_part;

namespace {

constexpr std::size_t table_dim = 4;

std::vector<std::uint32_t> all_buckets(std::uint32_t n) {
  std::vector<std::uint32_t> out(n);
  std::iota(out.begin(), out.end(), 0u);
  return out;
}

hash_table_options table_options(hash_table_options options = {}) {
  if (options.dim == 0) options.dim = table_dim;
  options.initializer = initializers::random_normal{.stddev = 0.5, .seed = 11};
  return options;
}

hash_table_part table_part(hash_table_options options = {}, std::uint32_t buckets = 16) {
  options = table_options(options);
  options.buckets = buckets;
  return hash_table_part("emb", "ps:0", dtype::float32, options, all_buckets(buckets));
}

std::vector<float> looked_up(hash_table_part& part, const std::vector<std::int64_t>& ids, bool insert = true) {
  std::vector<float> out(ids.size() * part.options().dim, -1.0f);
  part.lookup(ids, insert, reinterpret_cast<std::byte*>(out.data()));
  return out;
}

// Row `id` of a float32 variable of rows of `dim` values with `init`: what a table's new row is.
std::vector<float> variable_row(const initializer& init, std::int64_t id, std::size_t dim) {
  std::vector<float> row(dim);
  ps::kernels::initialize({init, {1, dim}, static_cast<std::uint64_t>(id)}, dtype::float32, {1, dim},
                          reinterpret_cast<std::byte*>(row.data()));
  return row;
}

std::vector<float> row_at(const std::vector<float>& rows, std::size_t k, std::size_t dim = table_dim) {
  return {rows.begin() + static_cast<std::ptrdiff_t>(k * dim), rows.begin() + static_cast<std::ptrdiff_t>((k + 1) * dim)};
}

}  // namespace

TEST_CASE("a bucket finds every id it holds and none it does not, through inserts and erasures") {
  // A record of the id and 8 bytes; the reference is std::unordered_map.
  ps::record_slab slab(ps::record_layout{.row_bytes = 8}.bytes(), 1 << 16);
  hash_bucket bucket(&slab);
  std::unordered_map<std::int64_t, std::uint64_t> reference;
  std::mt19937_64 random(5);
  std::vector<std::int64_t> pool{0, -1, 1, std::numeric_limits<std::int64_t>::min(),
                                 std::numeric_limits<std::int64_t>::max()};
  for (int i = 0; i < 3000; ++i) pool.push_back(static_cast<std::int64_t>(random()));
  for (int i = 0; i < 1000; ++i) pool.push_back(i * 4096);  // strided ids
  for (int round = 0; round < 40'000; ++round) {
    const std::int64_t id = pool[random() % pool.size()];
    const std::uint64_t mixed = common::mix_id(id);
    const bool held = reference.count(id) > 0;
    REQUIRE((bucket.find(id, mixed) != nullptr) == held);
    if (held && random() % 3 == 0) {
      bucket.erase(id, mixed);
      reference.erase(id);
    } else if (!held) {
      std::byte* r = bucket.insert(id, mixed);
      const std::uint64_t value = random();
      std::memcpy(r + ps::record_layout::header_bytes, &value, sizeof value);
      reference[id] = value;
    } else {
      std::uint64_t value;
      std::memcpy(&value, bucket.find(id, mixed) + ps::record_layout::header_bytes, sizeof value);
      REQUIRE(value == reference[id]);
    }
  }
  CHECK(bucket.size() == reference.size());
  std::size_t visited = 0;
  bucket.for_each([&](const std::byte* r) {
    ++visited;
    CHECK(reference.count(hash_bucket::id_of(r)) == 1);
  });
  CHECK(visited == reference.size());
}

TEST_CASE("a new row is a function of the table's seed and the id only: any id, any split of the buckets") {
  const std::vector<std::int64_t> ids{0, -1, 7, std::numeric_limits<std::int64_t>::min(),
                                      std::numeric_limits<std::int64_t>::max(), 123456789};
  auto whole = table_part();
  const auto rows = looked_up(whole, ids);
  for (std::size_t k = 0; k < ids.size(); ++k) {
    CHECK(row_at(rows, k) == variable_row(whole.options().initializer, ids[k], table_dim));
  }
  CHECK(whole.rows() == ids.size());
  CHECK(looked_up(whole, ids) == rows);  // held now: the same rows again

  // The same ids over two parts that split the buckets, asked in the opposite order.
  std::vector<std::uint32_t> even, odd;
  for (std::uint32_t b = 0; b < 16; ++b) (b % 2 ? odd : even).push_back(b);
  auto options = table_options();
  options.buckets = 16;
  hash_table_part first("emb", "ps:0", dtype::float32, options, even);
  hash_table_part second("emb", "ps:1", dtype::float32, options, odd);
  for (std::size_t k = ids.size(); k-- > 0;) {
    auto& part = common::bucket_of(ids[k], 16) % 2 ? second : first;
    CHECK(looked_up(part, {ids[k]}) == row_at(rows, k));
  }
}

TEST_CASE("an id of a bucket the part does not hold is refused, naming it, and nothing changes") {
  auto options = table_options();
  options.buckets = 16;
  const std::uint32_t mine = common::bucket_of(1, 16);
  const std::vector<std::uint32_t> held{mine};
  hash_table_part part("emb", "ps:3", dtype::float32, options, held);
  std::int64_t foreign = 2;
  while (common::bucket_of(foreign, 16) == mine) ++foreign;
  std::vector<float> out(2 * table_dim);
  CHECK_THROWS_WITH_AS(part.lookup(std::vector<std::int64_t>{1, foreign}, true, reinterpret_cast<std::byte*>(out.data())),
                       doctest::Contains("which this ps does not hold"), error);
  CHECK(part.rows() == 0);
}

TEST_CASE("ids not admitted read the default row and are not stored; a request counts an id once") {
  hash_table_options options;
  options.admission = admission::min_count{.count = 2, .counters = 1 << 16};
  options.default_value = 0.25;
  auto part = table_part(options);
  const std::vector<float> defaults(2 * table_dim, 0.25f);
  CHECK(looked_up(part, {5, 5}) == defaults);  // twice in one request: one sighting
  CHECK(part.rows() == 0);
  CHECK(looked_up(part, {5}, false) == std::vector<float>(table_dim, 0.25f));  // a read that may not insert counts none
  CHECK(part.rows() == 0);
  const auto admitted = looked_up(part, {5});
  CHECK(admitted == variable_row(part.options().initializer, 5, table_dim));
  CHECK(part.rows() == 1);
  CHECK(part.counts().admitted == 1);

  // Gradients of ids not held are dropped, and counted.
  const std::vector<float> gradient(table_dim, 1.0f);
  part.apply_gradients(optimizers::sgd{.learning_rate = 0.5}, std::vector<std::int64_t>{9},
                       reinterpret_cast<const std::byte*>(gradient.data()));
  CHECK(part.counts().gradients_dropped == 1);
  CHECK(part.rows() == 1);

  hash_table_options never;
  never.admission = admission::probability{.p = 0.0};
  auto closed = table_part(never);
  CHECK(looked_up(closed, {1, 2, 3}) == std::vector<float>(3 * table_dim, 0.0f));
  CHECK(closed.rows() == 0);
}

TEST_CASE("a full table without eviction refuses a lookup that would insert, names it, and inserts nothing") {
  hash_table_options options;
  options.max_rows_per_ps = 3;
  auto part = table_part(options);
  looked_up(part, {1, 2});
  std::vector<float> out(2 * table_dim);
  CHECK_THROWS_WITH_AS(part.lookup(std::vector<std::int64_t>{3, 4}, true, reinterpret_cast<std::byte*>(out.data())),
                       "hash table 'emb' on ps:0 is full: it holds 2 rows of its max_rows_per_ps 3, and this lookup "
                       "would add 2 (an eviction policy makes room: eviction::ttl or capacity)",
                       error);
  CHECK(part.rows() == 2);
  CHECK(looked_up(part, {3, 1}).size() == 2 * table_dim);  // one more fits
  CHECK(part.rows() == 3);
}

TEST_CASE("idle rows go when the clock passes them; a row admitted again is fresh, slots and all") {
  hash_table_options options;
  options.eviction = eviction::ttl{.max_idle = 10};
  auto part = table_part(options);
  const auto initial = looked_up(part, {1, 2});
  const std::vector<float> gradient(2 * table_dim, 1.0f);
  part.apply_gradients(optimizers::adagrad{.learning_rate = 0.1}, std::vector<std::int64_t>{1, 2},
                       reinterpret_cast<const std::byte*>(gradient.data()));
  CHECK(part.advance_clock(5) == 0);
  looked_up(part, {2});  // named at 5
  CHECK(part.advance_clock(11) == 1);  // 1, named at 0, is 11 ticks idle
  CHECK(part.rows() == 1);
  CHECK(part.counts().evicted == 1);
  CHECK(row_at(looked_up(part, {1}), 0) == row_at(initial, 0));  // fresh: its initial row again
  bool checked_slot = false;
  for (std::uint32_t b = 0; b < 16; ++b) {
    if (!part.holds(b)) continue;
    part.for_each_row(b, [&](std::int64_t id, std::uint64_t, const std::byte*, const std::byte* slots) {
      if (id != 1) return;
      float accumulator;
      std::memcpy(&accumulator, slots, sizeof accumulator);
      CHECK(accumulator == doctest::Approx(0.1));  // Adagrad's initial accumulator, not 0.1 + 1
      checked_slot = true;
    });
  }
  CHECK(checked_slot);
  CHECK_THROWS_WITH_AS(part.advance_clock(4), "hash table 'emb': the clock cannot go back from 11 to 4", error);
  CHECK_THROWS_WITH_AS(part.advance_clock(std::uint64_t{1} << 63), doctest::Contains("the clock must stay below 2^63"),
                       error);
  CHECK(part.clock() == 11);
}

TEST_CASE("a clock advance on a large part sweeps a bounded slice; idle rows are gone at once all the same") {
  hash_table_options options;
  options.eviction = eviction::ttl{.max_idle = 10};
  auto part = table_part(options, 64);
  // 200k rows named at 0, then 1,000 of them named again at 5.
  std::vector<std::int64_t> ids(200'000);
  std::iota(ids.begin(), ids.end(), std::int64_t{-100'000});
  std::vector<float> rows(ids.size() * table_dim);
  part.lookup(ids, true, reinterpret_cast<std::byte*>(rows.data()));
  part.advance_clock(5);
  const std::vector<std::int64_t> recent(ids.begin(), ids.begin() + 1000);
  looked_up(part, recent, false);
  // At 11 the other 199,000 are idle past max_idle: the advance sweeps only about sweep_rows of them...
  const std::uint64_t first_sweep = part.advance_clock(11);
  CHECK(first_sweep > 0);
  CHECK(first_sweep < 199'000);
  CHECK(first_sweep <= ps::hash_table_part::sweep_rows + 200'000 / 64);  // its rows, one bucket more
  // ...but every idle row is gone for a lookup, which drops those it meets, and a step skips them.
  const std::vector<std::int64_t> idle(ids.end() - 1000, ids.end());
  const auto idle_rows = looked_up(part, idle, false);
  CHECK(std::all_of(idle_rows.begin(), idle_rows.end(), [](float x) { return x == 0.0f; }));
  CHECK(part.export_rows(0, std::numeric_limits<std::uint64_t>::max()).rows.ids.size() == 1000);
  // An advance that does not move the clock sweeps nothing; later ones sweep the rest, a share
  // for each tick (the whole part for every max_idle / 4 ticks): before the 1,000 rows named at 5
  // go at 16, the part holds only them.
  CHECK(part.advance_clock(11) == 0);
  for (std::uint64_t now = 12; now < 16 && part.rows() > 1000; ++now) part.advance_clock(now);
  CHECK(part.rows() == 1000);
  CHECK(part.counts().evicted == 199'000);
  CHECK(row_at(looked_up(part, {recent[7]}, false), 0) == row_at(rows, 7));
}

TEST_CASE("evicted rows give their map memory back: a table that turns its rows over stays the same size") {
  hash_table_options options;
  options.eviction = eviction::ttl{.max_idle = 10};
  auto part = table_part(options, 4);
  const auto empty = part.bytes_held();
  std::uint64_t clock = 0;
  // insert_all(first): 20,000 ids from `first` named now; forget_all(): the clock passes them all
  // and sweeps until none is held.
  const auto insert_all = [&](std::int64_t first) {
    std::vector<std::int64_t> ids(20'000);
    std::iota(ids.begin(), ids.end(), first);
    std::vector<float> rows(ids.size() * table_dim);
    part.lookup(ids, true, reinterpret_cast<std::byte*>(rows.data()));
  };
  const auto forget_all = [&] {
    for (int tick = 0; tick < 100 && part.rows() > 0; ++tick) part.advance_clock(clock += 11);
  };
  insert_all(0);
  const auto full = part.bytes_held();
  forget_all();
  REQUIRE(part.rows() == 0);
  const auto forgotten = part.bytes_held();
  // The maps went (8-byte entries, at most 9/10 full): only the records' slab stays, for reuse.
  CHECK(full - forgotten >= 20'000 * 8);
  for (std::int64_t round = 1; round <= 5; ++round) {
    insert_all(round * 1'000'000);
    CAPTURE(round);
    CHECK(part.bytes_held() <= full);
    forget_all();
    CHECK(part.bytes_held() == forgotten);
  }
  CHECK(forgotten > empty);  // the slab
  CHECK(part.counts().evicted == 6 * 20'000);
}

TEST_CASE("at capacity each new row replaces a held one, and the table never holds more") {
  hash_table_options options;
  options.eviction = eviction::capacity{.rows_per_ps = 100};
  auto part = table_part(options, 4);
  for (std::int64_t id = 0; id < 1000; ++id) {
    looked_up(part, {id});
    part.advance_clock(static_cast<std::uint64_t>(id + 1));
    REQUIRE(part.rows() <= 100);
  }
  CHECK(part.rows() == 100);
  CHECK(part.counts().evicted == 900);
  CHECK(part.counts().admitted == 1000);
}

TEST_CASE("optimizer steps on a table end bitwise equal to the same steps on a variable holding the same rows") {
  constexpr std::size_t rows = 64;
  const optimizer opt = optimizers::adagrad{.learning_rate = 0.1, .initial_accumulator_value = 0.2};
  auto part = table_part({}, 8);
  const initializer init = part.options().initializer;
  // The variable: rows [0, 64) of the same initializer, and its Adagrad accumulator.
  std::vector<float> variable(rows * table_dim);
  ps::kernels::initialize({init, {rows, table_dim}, 0}, dtype::float32, {rows, table_dim},
                          reinterpret_cast<std::byte*>(variable.data()));
  std::vector<float> accumulator(rows * table_dim, 0.2f);
  std::vector<std::int64_t> all(rows);
  std::iota(all.begin(), all.end(), 0);
  looked_up(part, all);

  std::mt19937 random(3);
  std::normal_distribution<float> normal;
  for (int step = 0; step < 20; ++step) {
    std::vector<std::int64_t> ids(40);
    for (auto& id : ids) id = static_cast<std::int64_t>(random() % rows);  // repeats included
    std::vector<float> gradient(ids.size() * table_dim);
    for (auto& g : gradient) g = normal(random);
    std::byte* slot = reinterpret_cast<std::byte*>(accumulator.data());
    ps::kernels::apply_sparse(opt, dtype::float32, reinterpret_cast<std::byte*>(variable.data()), rows,
                              std::span<std::byte* const>(&slot, 1), 0, ids,
                              reinterpret_cast<const std::byte*>(gradient.data()), table_dim);
    part.apply_gradients(opt, ids, reinterpret_cast<const std::byte*>(gradient.data()));
  }
  const auto table_rows = looked_up(part, all, false);
  CHECK(std::memcmp(table_rows.data(), variable.data(), variable.size() * sizeof(float)) == 0);
  std::size_t compared = 0;
  for (std::uint32_t b = 0; b < 8; ++b) {
    part.for_each_row(b, [&](std::int64_t id, std::uint64_t, const std::byte*, const std::byte* slots) {
      CHECK(std::memcmp(slots, accumulator.data() + static_cast<std::size_t>(id) * table_dim,
                        table_dim * sizeof(float)) == 0);
      ++compared;
    });
  }
  CHECK(compared == rows);

  const std::vector<float> gradient(table_dim, 1.0f);
  CHECK_THROWS_WITH_AS(part.apply_gradients(optimizers::sgd{}, std::vector<std::int64_t>{1},
                                            reinterpret_cast<const std::byte*>(gradient.data())),
                       doctest::Contains("its rows hold the slots of adagrad, so sgd cannot step it"), error);
}

TEST_CASE("a row costs at most 32 bytes beyond its values and its slots") {
  // 64 buckets of ~3,100 rows each: the sizes whose map and last chunk settle as at 10M rows over
  // 4,096 buckets (benchmarks/variable_bench measures that).
  constexpr std::int64_t held = 200'000;
  hash_table_options options;
  options.dim = 16;
  auto part = table_part(options, 64);
  std::vector<std::int64_t> ids(1000);
  std::mt19937_64 random(9);
  for (std::int64_t done = 0; done < held; done += 1000) {
    for (auto& id : ids) id = static_cast<std::int64_t>(random());
    std::vector<float> out(ids.size() * 16);
    part.lookup(ids, true, reinterpret_cast<std::byte*>(out.data()));
  }
  const std::vector<float> gradient(16, 0.0f);
  part.apply_gradients(optimizers::adagrad{}, std::vector<std::int64_t>{ids[0]},
                       reinterpret_cast<const std::byte*>(gradient.data()));  // one slot in every record
  REQUIRE(part.rows() == static_cast<std::uint64_t>(held));
  const std::uint64_t values = part.rows() * 2 * 16 * sizeof(float);
  const double beyond = double(part.bytes_held() - values) / double(part.rows());
  MESSAGE("bytes per row beyond the row and its slot: " << beyond);
  CHECK(beyond <= 32.0);
}

TEST_CASE("options no table can have are refused, naming the table") {
  const auto refused = [](hash_table_options options, dtype type = dtype::float32) {
    return hash_table_part("bad", "ps:0", type, options, all_buckets(options.buckets == 0 ? 0 : 1));
  };
  hash_table_options options = table_options();
  CHECK_THROWS_WITH_AS(refused(options, dtype::int32), "hash table 'bad': rows must be float32 or float64, not int32",
                       error);
  options.initializer = initializers::glorot_uniform{};
  CHECK_THROWS_WITH_AS(refused(options), doctest::Contains("glorot_uniform"), error);
  options = table_options();
  options.dim = 0;
  CHECK_THROWS_WITH_AS(refused(options), doctest::Contains("dim must be in"), error);
  options = table_options();
  options.admission = admission::min_count{.count = 0};
  CHECK_THROWS_WITH_AS(refused(options), doctest::Contains("count must be in [1, 255]"), error);
  options = table_options();
  options.admission = admission::probability{.p = 1.5};
  CHECK_THROWS_WITH_AS(refused(options), doctest::Contains("p must be in [0, 1]"), error);
  options = table_options();
  options.eviction = eviction::capacity{.rows_per_ps = 0};
  CHECK_THROWS_WITH_AS(refused(options), doctest::Contains("rows_per_ps must be at least 1"), error);
}

TEST_CASE("a part's rows restore into fresh parts over any split of its buckets, slots, clock and filter included") {
  hash_table_options options;
  options.admission = admission::min_count{.count = 1, .counters = 256};
  auto saved = table_part(options, 8);
  std::vector<std::int64_t> ids;
  for (std::int64_t id = -50; id < 50; ++id) ids.push_back(id * 7919);
  looked_up(saved, ids);
  const std::vector<float> gradient(ids.size() * table_dim, 0.5f);
  const optimizer opt = optimizers::adam{.learning_rate = 0.1};
  saved.apply_gradients(opt, ids, reinterpret_cast<const std::byte*>(gradient.data()));
  saved.advance_clock(9);
  const auto expected = looked_up(saved, ids, false);

  // One part holding every bucket, and two holding the even and the odd ones.
  auto whole_options = table_options(options);
  whole_options.buckets = 8;
  hash_table_part whole("emb", "ps:0", dtype::float32, whole_options, all_buckets(8));
  const std::vector<std::uint32_t> even{0, 2, 4, 6}, odd{1, 3, 5, 7};
  hash_table_part first("emb", "ps:0", dtype::float32, whole_options, even);
  hash_table_part second("emb", "ps:1", dtype::float32, whole_options, odd);
  const auto state = saved.state();
  CHECK(state.clock == 9);
  CHECK(state.steps == 1);
  for (auto* part : {&whole, &first, &second}) part->reset(state);
  // Exported in pieces of about 3 rows' values: whole buckets each, every row once.
  const std::size_t value_bytes = 3 * table_dim * sizeof(float);  // the row, adam's m and v
  std::size_t exported = 0;
  for (std::uint32_t b = 0; b < 8;) {
    const auto piece = saved.export_rows(b, 3 * value_bytes);
    REQUIRE(piece.next_bucket > b);
    CHECK(piece.rows.values.size() == piece.rows.ids.size() * value_bytes);
    for (std::uint32_t c = b; c < piece.next_bucket; ++c) {
      const auto bucket = saved.rows_of(c);
      (c % 2 ? second : first).insert_rows(bucket);
    }
    whole.insert_rows(piece.rows);
    exported += piece.rows.ids.size();
    b = piece.next_bucket;
  }
  CHECK(exported == ids.size());
  CHECK(whole.rows() == ids.size());
  CHECK(whole.clock() == 9);
  CHECK(looked_up(whole, ids, false) == expected);
  for (std::size_t k = 0; k < ids.size(); ++k) {
    auto& part = common::bucket_of(ids[k], 8) % 2 ? second : first;
    CHECK(looked_up(part, {ids[k]}, false) == row_at(expected, k));
  }
  // The slots and the step count came along: one more step on each gives the same rows.
  saved.apply_gradients(opt, ids, reinterpret_cast<const std::byte*>(gradient.data()));
  whole.apply_gradients(opt, ids, reinterpret_cast<const std::byte*>(gradient.data()));
  CHECK(looked_up(whole, ids, false) == looked_up(saved, ids, false));
  CHECK_THROWS_WITH_AS(whole.apply_gradients(optimizers::sgd{}, ids, reinterpret_cast<const std::byte*>(gradient.data())),
                       doctest::Contains("hold the slots of adam"), error);
  // A reset drops every row and takes the state given, slots and all.
  whole.reset({});
  CHECK(whole.rows() == 0);
  CHECK(whole.slots() == 0);
  CHECK(whole.clock() == 0);
}

detail::table_state state_at(std::uint64_t clock) {
  detail::table_state state;
  state.clock = clock;
  return state;
}

TEST_CASE("a restore that does not fit the part is refused, naming what is wrong, and the part stays as it was") {
  auto part = table_part({}, 4);
  const std::vector<std::uint32_t> two{0, 1};
  hash_table_part half("emb", "ps:1", dtype::float32, [] {
    auto o = table_options();
    o.buckets = 4;
    o.max_rows_per_ps = 3;
    return o;
  }(), two);
  ps::part_rows rows;
  rows.ids = {1, 1};
  rows.last_named = {0, 0};
  rows.values.resize(2 * table_dim * sizeof(float));
  CHECK_THROWS_WITH_AS(part.insert_rows(rows), doctest::Contains("id 1 is there twice"), error);
  part.reset(state_at(3));
  rows.ids = {1, 2};
  rows.last_named = {0, 5};
  CHECK_THROWS_WITH_AS(part.insert_rows(rows), doctest::Contains("id 2 was last named at 5, after the clock 3"), error);
  part.reset(state_at(9));
  rows.values.resize(3);
  CHECK_THROWS_WITH_AS(part.insert_rows(rows), doctest::Contains("do not match"), error);
  rows.values.resize(2 * table_dim * sizeof(float));
  CHECK_THROWS_WITH_AS(part.insert_rows(rows, 10), doctest::Contains("the ps may hold 10 more"), error);
  std::int64_t foreign = 0;
  while (common::bucket_of(foreign, 4) < 2) ++foreign;
  rows.ids = {foreign, 1000};
  CHECK_THROWS_WITH_AS(half.insert_rows(rows), doctest::Contains("which this ps does not hold"), error);
  // Rows past the part's max_rows_per_ps.
  std::vector<std::int64_t> own;
  for (std::int64_t id = 0; own.size() < 4; ++id) {
    if (common::bucket_of(id, 4) < 2) own.push_back(id);
  }
  rows.ids = own;
  rows.last_named.assign(4, 0);
  rows.values.resize(4 * table_dim * sizeof(float));
  const auto full = error_thrown_by([&] { half.insert_rows(rows); });
  CHECK(full.code() == errc::resource_exhausted);
  CHECK(contains(full.what(), "4 rows beside the 0 held pass its max_rows_per_ps of 3 rows per ps"));
  // A state the part cannot take: the filter's size, a clock at 2^63, an optimizer's bad setting.
  auto seven_counters = state_at(9);
  seven_counters.filter.resize(7);
  CHECK_THROWS_WITH_AS(part.reset(seven_counters), doctest::Contains("an admission filter of 7 counters, the part's has 0"),
                       error);
  CHECK_THROWS_WITH_AS(part.reset(state_at(std::uint64_t{1} << 63)), doctest::Contains("is not below 2^63"), error);
  auto bad_optimizer = state_at(9);
  bad_optimizer.owner = optimizers::adagrad{.learning_rate = -1};
  CHECK_THROWS_WITH_AS(part.reset(bad_optimizer), doctest::Contains("learning_rate must be positive"), error);
  rows.ids = {1, 2};
  rows.last_named = {0, 9};
  rows.values.resize(2 * table_dim * sizeof(float));
  part.insert_rows(rows);
  CHECK(part.rows() == 2);
  CHECK(half.rows() == 0);
  CHECK(part.clock() == 9);
}


namespace {

// Every piece of an export of `part` from bucket 0 (changed rows only when `changed_only`), as one.
ps::exported_rows export_all(const hash_table_part& part, bool changed_only) {
  ps::exported_rows all;
  for (std::uint32_t b = 0; b < part.options().buckets;) {
    auto piece = part.export_rows(b, 64, changed_only);  // a few rows a piece
    REQUIRE(piece.next_bucket > b);
    all.rows.ids.insert(all.rows.ids.end(), piece.rows.ids.begin(), piece.rows.ids.end());
    all.rows.last_named.insert(all.rows.last_named.end(), piece.rows.last_named.begin(), piece.rows.last_named.end());
    all.rows.values.insert(all.rows.values.end(), piece.rows.values.begin(), piece.rows.values.end());
    all.dropped.insert(all.dropped.end(), piece.dropped.begin(), piece.dropped.end());
    b = piece.next_bucket;
  }
  return all;
}

std::vector<std::int64_t> sorted(std::vector<std::int64_t> ids) {
  std::sort(ids.begin(), ids.end());
  return ids;
}

}  // namespace

TEST_CASE("a part counts what changed since a save: rows written and ids dropped, and builds only on saves it knows") {
  hash_table_options options;
  options.eviction = eviction::ttl{.max_idle = 2};
  auto part = table_part(options, 8);
  const std::vector<std::int64_t> first{1, 2, 3, 4, 5, 6};
  looked_up(part, first);
  // Nothing is counted before the first save: an increment has nothing to build on.
  CHECK_FALSE(part.tracks_changes());
  const auto untracked = error_thrown_by([&] { part.start_save(7, 6); });
  CHECK(untracked.code() == errc::failed_precondition);
  CHECK(contains(untracked.what(), "hash table 'emb' on ps:0 cannot tell what changed since save 0000000000000006"));
  CHECK_FALSE(part.tracks_changes());

  part.start_save(10, 0);  // a whole save: every row
  CHECK(export_all(part, false).rows.ids.size() == first.size());
  // After it: a step on 1; 2, 5 and 6 named at a later clock, and a new row 7; then 1, 3 and 4,
  // idle past max_idle, go.
  const std::vector<float> gradient(table_dim, 0.25f);
  const std::vector<std::int64_t> one{1};
  part.apply_gradients(optimizers::sgd{.learning_rate = 0.5}, one, reinterpret_cast<const std::byte*>(gradient.data()));
  part.advance_clock(2);
  looked_up(part, {2, 5, 6, 7});
  part.advance_clock(3);  // 1 (stepped at 0), 3 and 4 are idle for 3 > 2: gone
  CHECK(part.rows() == 4);

  part.start_save(11, 10);  // save 10 was written: what changed since its start
  const auto since_10 = export_all(part, true);
  CHECK(sorted(since_10.rows.ids) == std::vector<std::int64_t>{2, 5, 6, 7});
  CHECK(sorted(since_10.dropped) == std::vector<std::int64_t>{1, 3, 4});
  CHECK(since_10.rows.values.size() == 4 * table_dim * sizeof(float));

  // Save 11 was never written (its file failed): save 12 builds on 10 again, and holds what 11
  // held and what changed since.
  looked_up(part, {8});
  part.start_save(12, 10);
  const auto again_since_10 = export_all(part, true);
  CHECK(sorted(again_since_10.rows.ids) == std::vector<std::int64_t>{2, 5, 6, 7, 8});
  CHECK(sorted(again_since_10.dropped) == std::vector<std::int64_t>{1, 3, 4});

  // Save 12 was written: save 13 holds only what changed since; a read at the same clock changes
  // nothing.
  looked_up(part, {8}, false);
  looked_up(part, {9});
  part.start_save(13, 12);
  const auto since_12 = export_all(part, true);
  CHECK(since_12.rows.ids == std::vector<std::int64_t>{9});
  CHECK(since_12.dropped.empty());
  CHECK(part.last_save() == 12);
  CHECK(part.save_in_progress() == 13);

  // A base the part does not know (not its last started, not its last written) is refused, and
  // changes nothing: 13 is still in progress, and builds on 12.
  const auto unknown = error_thrown_by([&] { part.start_save(14, 11); });
  CHECK(unknown.code() == errc::failed_precondition);
  CHECK(contains(unknown.what(), "its saves are 000000000000000d (last started) and 000000000000000c (last known "
                                 "written); save it whole"));
  CHECK(part.save_in_progress() == 13);
  CHECK(export_all(part, true).rows.ids == std::vector<std::int64_t>{9});

  // A restore starts again from the save it came from: nothing changed since, and the next save
  // may build on it.
  auto state = part.state();
  state.save = 13;
  const auto rows = export_all(part, false).rows;
  part.reset(state);
  part.insert_rows(rows);
  CHECK(part.last_save() == 13);
  part.start_save(15, 13);
  CHECK(export_all(part, true).rows.ids.empty());
  // An increment's rows replace held ones; its dropped ids go (an id not held is no error).
  auto replaced = rows;
  std::fill(replaced.values.begin(), replaced.values.end(), std::byte{0});
  CHECK_THROWS_WITH_AS(part.insert_rows(replaced), doctest::Contains("is held already"), error);
  part.insert_rows(replaced, std::numeric_limits<std::uint64_t>::max(), true);
  CHECK(part.rows() == rows.ids.size());
  CHECK(looked_up(part, {rows.ids[0]}, false) == std::vector<float>(table_dim, 0.0f));
  const std::vector<std::int64_t> drop{rows.ids[0], 12345};
  part.drop_rows(drop);
  CHECK(part.rows() == rows.ids.size() - 1);
}

TEST_CASE("a part that drops far more ids than it holds between saves stops counting: the next save is whole") {
  hash_table_options options;
  options.eviction = eviction::capacity{.rows_per_ps = 8};
  auto part = table_part(options, 4);
  part.start_save(1, 0);
  std::vector<std::int64_t> ids(hash_table_part::dropped_ids_beyond_rows + 100);
  std::iota(ids.begin(), ids.end(), std::int64_t{0});
  looked_up(part, ids);  // each new id past 8 evicts one
  CHECK(part.rows() == 8);
  CHECK_FALSE(part.tracks_changes());
  CHECK(part.save_in_progress() == 1);  // the save in progress goes on
  const auto refused = error_thrown_by([&] { part.start_save(2, 1); });
  CHECK(refused.code() == errc::failed_precondition);
  part.start_save(3, 0);
  CHECK(part.tracks_changes());
}

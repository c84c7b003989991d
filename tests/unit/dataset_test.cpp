// Dataset pipelines: transformations on in-memory data, then every file format on small files the
// test writes (corrupt ones included), and the real Fashion-MNIST files.
#include "file_faults.hpp"
#include "test_support.hpp"

#include <pscoro/data_formats.hpp>
#include <pscoro/dataset.hpp>

#include "common/crc32c.hpp"
#include "data/file_reader.hpp"

#include <fmt/format.h>

#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <set>

using namespace pscoro;

namespace {

template <class T>
std::vector<T> collect(const dataset<T>& d) {
  std::vector<T> out;
  auto it = d.make_iterator();
  while (auto item = it.next()) out.push_back(std::move(*item));
  return out;
}

dataset<std::int64_t> counting(std::int64_t n) {
  return from_generator([n]() { return [i = std::int64_t{0}, n]() mutable -> std::optional<std::int64_t> {
    if (i >= n) return std::nullopt;
    return i++;
  }; });
}

std::vector<std::int64_t> range(std::int64_t n) {
  std::vector<std::int64_t> out(static_cast<std::size_t>(n));
  std::iota(out.begin(), out.end(), 0);
  return out;
}

// A scratch directory removed at the end of the test.
struct scratch {
  std::filesystem::path dir = std::filesystem::temp_directory_path() /
                              ("pscoro-dataset-" + std::to_string(::getpid()) + "-" + std::to_string(counter()++));
  scratch() { std::filesystem::create_directories(dir); }
  ~scratch() { std::filesystem::remove_all(dir); }
  static int& counter() {
    static int n = 0;
    return n;
  }
  std::string write(const std::string& name, const std::string& bytes) const {
    const auto path = (dir / name).string();
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }
  std::string write_gz(const std::string& name, const std::string& bytes) const {
    const auto path = (dir / name).string();
    gzFile f = gzopen(path.c_str(), "wb");
    gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
    gzclose(f);
    return path;
  }
};


std::string be32(std::uint32_t v) {
  return {char(v >> 24), char(v >> 16), char(v >> 8), char(v)};
}

}  // namespace

TEST_CASE("from_tensor_slices and batch stack along a new axis, with or without the remainder") {
  xt::xarray<float> values = xt::zeros<float>({7, 2});
  for (std::size_t i = 0; i < 7; ++i) values(i, 0) = values(i, 1) = float(i);
  const auto batches = collect(from_tensor_slices(values).batch(3));
  REQUIRE(batches.size() == 3);
  CHECK(batches[0].shape() == std::vector<std::size_t>{3, 2});
  CHECK(batches[2].shape() == std::vector<std::size_t>{1, 2});
  CHECK(batches[1](2, 1) == 5.0f);
  CHECK(collect(from_tensor_slices(values).batch(3, true)).size() == 2);
  // Pairs batch element-wise; non-array elements batch into vectors.
  xt::xarray<std::int64_t> labels = xt::arange<std::int64_t>(7);
  const auto pairs = collect(from_tensor_slices(values, labels).batch(4));
  REQUIRE(pairs.size() == 2);
  CHECK(std::get<1>(pairs[0]).shape() == std::vector<std::size_t>{4});
  CHECK(std::get<1>(pairs[1])(2) == 6);
  // Bad inputs are refused where the pipeline is built or the batch made.
  CHECK_THROWS_WITH_AS(from_tensor_slices(xt::xarray<float>(1.0f)), "from_tensor_slices: a scalar has no slices", error);
  CHECK_THROWS_AS(from_tensor_slices(values, xt::xarray<std::int64_t>(xt::arange<std::int64_t>(6))), error);
  const std::vector<xt::xarray<float>> ragged{xt::zeros<float>({2}), xt::zeros<float>({3})};
  CHECK_THROWS_WITH_AS((void)collect(from_values(ragged).batch(2)),
                       "batch: element 1 has another shape than element 0 (use map to make them equal)", error);
  CHECK_THROWS_AS(counting(5).shuffle(0, 1), error);
  CHECK_THROWS_AS(counting(5).prefetch(0), error);
  const auto grouped = collect(counting(5).batch(2));
  CHECK(grouped == std::vector<std::vector<std::int64_t>>{{0, 1}, {2, 3}, {4}});
  CHECK_THROWS_AS(counting(5).batch(0), error);
}

TEST_CASE("map, filter, take, zip and flat_map compose lazily") {
  const auto evens_squared = counting(10).filter([](std::int64_t x) { return x % 2 == 0; }).map([](std::int64_t x) {
    return x * x;
  });
  CHECK(collect(evens_squared) == std::vector<std::int64_t>{0, 4, 16, 36, 64});
  CHECK(collect(evens_squared.take(2)) == std::vector<std::int64_t>{0, 4});
  const auto zipped = collect(zip_shortest(counting(3), counting(10).map([](std::int64_t x) { return std::to_string(x); })));
  REQUIRE(zipped.size() == 3);
  CHECK(std::get<1>(zipped[2]) == "2");
  const auto nested = counting(4).flat_map([](std::int64_t n) { return counting(n); });
  CHECK(collect(nested) == std::vector<std::int64_t>{0, 0, 1, 0, 1, 2});
  // Each pass starts afresh.
  CHECK(collect(evens_squared) == collect(evens_squared));
}

TEST_CASE("zip of datasets of different lengths says which ended first and after how many") {
  CHECK(collect(zip(counting(3), counting(3))).size() == 3);
  CHECK(collect(zip(counting(0), counting(0))).empty());
  auto e = error_thrown_by([] { (void)collect(zip(counting(3), counting(5))); });
  CHECK(e.code() == errc::invalid_argument);
  std::string m = e.what();
  CHECK(contains(m, "zip: the first dataset ended after 3 elements but the second dataset has more"));
  e = error_thrown_by([] { (void)collect(zip(counting(5), counting(2))); });
  CHECK(e.code() == errc::invalid_argument);
  m = e.what();
  CHECK(contains(m, "zip: the second dataset ended after 2 elements but the first dataset has more"));
  // The elements before the mismatch are still delivered.
  auto it = zip(counting(2), counting(1)).make_iterator();
  CHECK(it.next().has_value());
  CHECK_THROWS_AS(it.next(), error);
  // zip_shortest stops at the shorter, as TF's zip does.
  CHECK(collect(zip_shortest(counting(5), counting(2))).size() == 2);
  CHECK(collect(zip_shortest(counting(2), counting(5).repeat())).size() == 2);
}

TEST_CASE("shuffle without a seed draws an order of its own each time it is made (TF's unseeded shuffle)") {
  const auto a = collect(counting(100).shuffle(100));
  const auto b = collect(counting(100).shuffle(100));
  CHECK(a != b);  // two random orders of 100 agree once in 100! tries
  auto sorted = a;
  std::sort(sorted.begin(), sorted.end());
  CHECK(sorted == range(100));
}

TEST_CASE("shuffle with a seed is a reproducible permutation, reshuffled each pass") {
  const auto shuffled = counting(100).shuffle(100, 42);
  const auto first = collect(shuffled);
  CHECK(first != range(100));
  auto sorted = first;
  std::sort(sorted.begin(), sorted.end());
  CHECK(sorted == range(100));
  CHECK(collect(counting(100).shuffle(100, 42)) == first);   // same seed, new dataset: same order
  CHECK(collect(counting(100).shuffle(100, 43)) != first);   // another seed: another order
  CHECK(collect(shuffled) != first);                         // another pass of the same dataset: reshuffled
  CHECK(collect(counting(20).shuffle(1, 7)) == range(20));   // a buffer of one keeps the order
  // A small buffer only moves elements a little: element i comes out among the first i + buffer.
  const auto local = collect(counting(50).shuffle(5, 1));
  for (std::size_t k = 0; k < local.size(); ++k) CHECK(local[k] <= static_cast<std::int64_t>(k) + 4);
  // Repeat after shuffle draws a new order for every epoch.
  const auto epochs = collect(counting(30).shuffle(30, 9).repeat(2));
  REQUIRE(epochs.size() == 60);
  CHECK(!std::equal(epochs.begin(), epochs.begin() + 30, epochs.begin() + 30));
}

TEST_CASE("repeat runs the data n times or forever; an empty dataset does not spin") {
  CHECK(collect(counting(3).repeat(2)) == std::vector<std::int64_t>{0, 1, 2, 0, 1, 2});
  CHECK(collect(counting(3).repeat(0)).empty());
  CHECK(collect(counting(3).repeat().take(7)) == std::vector<std::int64_t>{0, 1, 2, 0, 1, 2, 0});
  CHECK(collect(counting(0).repeat()).empty());
  CHECK_THROWS_AS(counting(3).repeat(-2), error);
}

TEST_CASE("shard gives every record to exactly one worker") {
  std::multiset<std::int64_t> seen;
  for (std::int64_t worker = 0; worker < 3; ++worker) {
    const auto part = collect(counting(100).shard(3, worker));
    CHECK(part.front() == worker);
    seen.insert(part.begin(), part.end());
  }
  CHECK(std::vector<std::int64_t>(seen.begin(), seen.end()) == range(100));
  CHECK(error_thrown_by([] { (void)counting(3).shard(0, 0); }).code() == errc::invalid_argument);
  CHECK(std::string(error_thrown_by([] { (void)counting(3).shard(2, 2); }).what()) == "shard: index must be in [0, 2), got 2");
}

TEST_CASE("prefetch yields the same elements, then the upstream's failure after the ones before it") {
  CHECK(collect(counting(1000).prefetch(8)) == range(1000));
  const auto failing = counting(10).map([](std::int64_t x) {
    if (x == 6) throw error(errc::data_loss, "bad record 6");
    return x;
  });
  auto it = failing.prefetch(3).make_iterator();
  for (std::int64_t x = 0; x < 6; ++x) CHECK(it.next() == x);
  CHECK_THROWS_WITH_AS(it.next(), "bad record 6", error);
  // Dropping an iterator whose producer waits for room neither hangs nor leaks.
  auto endless = counting(1).repeat().prefetch(2).make_iterator();
  CHECK(endless.next() == 0);
}

TEST_CASE("cache reads upstream once: later passes, epochs and iterators read the copy") {
  auto reads = std::make_shared<std::int64_t>(0);
  const auto cached = counting(5).map([reads](std::int64_t x) { return ++*reads, x; }).cache();
  const auto three_epochs = collect(cached.repeat(3));
  CHECK(three_epochs.size() == 15);
  for (std::size_t i = 0; i < three_epochs.size(); ++i) CHECK(three_epochs[i] == static_cast<std::int64_t>(i % 5));
  CHECK(collect(cached) == range(5));
  CHECK(*reads == 5);
  // Shuffling after the cache draws a new order each epoch from the one copy.
  const auto epochs = collect(cached.shuffle(5, 3).repeat(4));
  std::multiset<std::int64_t> seen(epochs.begin(), epochs.end());
  for (std::int64_t x = 0; x < 5; ++x) CHECK(seen.count(x) == 4);
  CHECK(*reads == 5);
}

TEST_CASE("cache keeps nothing from a pass that stops early or fails (TF discards a partial cache)") {
  auto reads = std::make_shared<std::int64_t>(0);
  auto fail_at = std::make_shared<std::int64_t>(-1);
  const auto cached = counting(5)
                          .map([reads, fail_at](std::int64_t x) {
                            if (x == *fail_at) throw error(errc::data_loss, "bad record " + std::to_string(x));
                            return ++*reads, x;
                          })
                          .cache();
  CHECK(collect(cached.take(2)) == range(2));  // stops early: nothing kept
  *fail_at = 3;
  CHECK_THROWS_WITH_AS(collect(cached), "bad record 3", error);  // fails: nothing kept
  CHECK(*reads == 5);
  *fail_at = -1;
  CHECK(collect(cached) == range(5));  // reads upstream again, and keeps it
  CHECK(*reads == 10);
  *fail_at = 0;  // upstream would fail now: the cache is what is read
  CHECK(collect(cached.repeat(2)).size() == 10);
  CHECK(*reads == 10);
}

TEST_CASE("cache(filename) writes the file at the end of a pass and reads it from then on, across datasets") {
  const scratch s;
  const auto path = (s.dir / "examples.cache").string();
  using example = std::tuple<xt::xarray<std::uint8_t>, xt::xarray<float>, std::string, std::int64_t>;
  auto reads = std::make_shared<std::int64_t>(0);
  auto make = [reads](std::int64_t n) {
    return counting(n).map([reads](std::int64_t i) {
      ++*reads;
      xt::xarray<std::uint8_t> pixels = xt::xarray<std::uint8_t>::from_shape({2, 3});
      for (std::size_t k = 0; k < pixels.size(); ++k) pixels.data()[k] = static_cast<std::uint8_t>(i * 10 + k);
      return example{pixels, xt::xarray<float>(static_cast<float>(i) / 4), std::string(i, 'x'), -i};
    });
  };
  auto files_in_dir = [&] {
    std::vector<std::string> out;
    for (const auto& entry : std::filesystem::directory_iterator(s.dir)) out.push_back(entry.path().filename());
    return out;
  };
  // A pass that stops early, or fails, leaves no file (and no temporary) behind.
  {
    auto it = make(4).cache(path).make_iterator();
    CHECK(it.next().has_value());
  }
  CHECK(files_in_dir().empty());
  const auto failing = make(4).map([](example e) {
    if (std::get<3>(e) == -2) throw error(errc::data_loss, "upstream broke");
    return e;
  });
  CHECK_THROWS_WITH_AS(collect(failing.cache(path)), "upstream broke", error);
  CHECK(files_in_dir().empty());

  *reads = 0;
  const auto written = collect(make(4).cache(path));
  CHECK(written.size() == 4);
  CHECK(files_in_dir() == std::vector<std::string>{"examples.cache"});
  // Another dataset with the same file (another process, a restarted worker) reads the file and
  // never its upstream.
  const auto again = collect(make(100).cache(path).repeat(2));
  CHECK(*reads == 4);
  REQUIRE(again.size() == 8);
  for (std::size_t i = 0; i < again.size(); ++i) {
    const auto& [pixels, scalar, text, id] = again[i];
    const auto& [pixels0, scalar0, text0, id0] = written[i % 4];
    CHECK(pixels == pixels0);
    CHECK(pixels.shape() == std::vector<std::size_t>{2, 3});
    CHECK(scalar == scalar0);
    CHECK(scalar.dimension() == 0);
    CHECK(text == text0);
    CHECK(id == id0);
  }
  // The same file read as another element type is refused, naming both.
  const auto e = error_thrown_by([&] { (void)collect(counting(3).cache(path)); });
  CHECK(e.code() == errc::invalid_argument);
  CHECK_MESSAGE(contains(e.what(), "holds elements of type (array<u8>,array<f32>,string,i64,), this dataset's are i64"),
                std::string(e.what()));
  // A file that cannot be written fails the pass that would write it, naming it.
  const auto unwritable = error_thrown_by([&] { (void)counting(3).cache((s.dir / "no" / "such.cache").string()).make_iterator(); });
  CHECK(unwritable.code() == errc::unavailable);
  CHECK_MESSAGE(contains(unwritable.what(), "cache: cannot write " + (s.dir / "no" / "such.cache").string() + ".tmp-"),
                std::string(unwritable.what()));
}

namespace {

std::string u64_bytes(std::uint64_t v) { return std::string(reinterpret_cast<const char*>(&v), 8); }

std::string whole_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

// A cache file holding `data`, framed by hand as docs/design.md describes it (header, then blocks
// of `block_size` each followed by the CRC-32C of its index and its bytes), so a test can frame
// any data validly and reach the decoder behind the checksums.
std::string framed_cache(const std::string& data, std::uint32_t block_size = 1 << 20) {
  std::string out = "PSCACHE2";
  out.append(reinterpret_cast<const char*>(&block_size), 4);
  const std::uint32_t header_crc = common::crc32c(out.data(), out.size());
  out.append(reinterpret_cast<const char*>(&header_crc), 4);
  std::uint64_t index = 0;
  for (std::size_t at = 0; at < data.size(); at += block_size, ++index) {
    const std::size_t n = std::min<std::size_t>(block_size, data.size() - at);
    out.append(data, at, n);
    const std::uint32_t crc = common::crc32c_extend(common::crc32c(&index, 8), data.data() + at, n);
    out.append(reinterpret_cast<const char*>(&crc), 4);
  }
  return out;
}

// What a pass over `path` as a cache of strings delivers before it fails, and the failure.
struct cache_pass {
  std::vector<std::string> delivered;
  std::exception_ptr failure;
};
cache_pass read_string_cache(const std::string& path) {
  cache_pass out;
  try {
    auto it = from_values<std::string>({}).cache(path).make_iterator();
    while (auto item = it.next()) out.delivered.push_back(std::move(*item));
  } catch (...) {
    out.failure = std::current_exception();
  }
  return out;
}

}  // namespace

TEST_CASE("a cache file is written as its format says: a header, then blocks each with its CRC-32C") {
  const scratch s;
  const auto path = (s.dir / "format.cache").string();
  (void)collect(from_values<std::string>({"abc", "de"}).cache(path));
  // The data: the element type (length, "string"), each element behind a 1, then a 0 and the count.
  const std::string data =
      u64_bytes(6) + "string" + "\x01" + u64_bytes(3) + "abc" + "\x01" + u64_bytes(2) + "de" + std::string(1, '\0') +
      u64_bytes(2);
  CHECK(whole_file(path) == framed_cache(data));
  // Small blocks: the data spans several, the last one shorter.
  const auto small = (s.dir / "small.cache").string();
  {
    detail::cache_file_writer out(small, "string", 16);
    for (const std::string text : {"abc", "de"}) {
      out.begin_element();
      detail::cache_codec<std::string>::write(out, text);
    }
    out.commit();
  }
  CHECK(whole_file(small) == framed_cache(data, 16));
  CHECK(collect(from_values<std::string>({}).cache(small)) == std::vector<std::string>{"abc", "de"});
}

TEST_CASE("a flipped byte in a cache file is data loss naming the file and the block, when a pass reaches it") {
  const scratch s;
  const auto path = (s.dir / "long.cache").string();
  // 40 texts of 80,000 bytes: 3.2 MB, in blocks 0 to 3 of 1 MiB (the last one shorter).
  std::vector<std::string> texts;
  for (int i = 0; i < 40; ++i) {
    std::string text(80000, '\0');
    for (std::size_t k = 0; k < text.size(); ++k) text[k] = static_cast<char>('a' + (i * 7 + k) % 26);
    texts.push_back(std::move(text));
  }
  CHECK(collect(from_values(texts).cache(path)) == texts);
  const std::string good = whole_file(path);
  const std::size_t block = (1 << 20) + 4;  // on disk: the bytes and the checksum
  REQUIRE(good.size() > 16 + 3 * block);
  // In the first element, deep in blocks 1 and 2, and in the last block's checksum.
  for (const std::size_t at : {std::size_t{40}, 16 + block + 100, 16 + 2 * block + 5000, good.size() - 2}) {
    CAPTURE(at);
    std::string bad = good;
    bad[at] = static_cast<char>(bad[at] ^ 0x04);
    const auto bad_path = s.write(fmt::format("flipped-{}.cache", at), bad);
    const auto pass = read_string_cache(bad_path);
    REQUIRE(pass.failure);
    CHECK(testing::code_of(pass.failure) == errc::data_loss);
    const std::size_t index = (at - 16) / block;
    const auto message = testing::message_of(pass.failure);
    CHECK_MESSAGE(contains(message, fmt::format("cache: {}: block {} (bytes {} to {}) is corrupt", bad_path, index,
                                                16 + index * block, std::min(good.size(), 16 + (index + 1) * block))),
                  message);
    // Checked as it streams: the elements of the blocks before the damage were delivered, and
    // none from the damaged block.
    // (Element i is data bytes 14 + 80,009 i to 14 + 80,009 (i + 1): a mark, a length, its text.)
    CHECK(pass.delivered.size() == (index == 0 ? 0 : std::min<std::size_t>(40, (index * (1 << 20) - 14) / 80009)));
    for (std::size_t i = 0; i < pass.delivered.size(); ++i) CHECK(pass.delivered[i] == texts[i]);
  }
}

TEST_CASE("every flipped byte of a cache file is refused as data loss, naming where it is") {
  const scratch s;
  const auto path = (s.dir / "small.cache").string();
  {
    detail::cache_file_writer out(path, "string", 16);
    for (const std::string text : {"abc", "de", "fghij"}) {
      out.begin_element();
      detail::cache_codec<std::string>::write(out, text);
    }
    out.commit();
  }
  const std::string good = whole_file(path);
  REQUIRE(read_string_cache(path).delivered == std::vector<std::string>{"abc", "de", "fghij"});
  for (std::size_t at = 0; at < good.size(); ++at) {
    CAPTURE(at);
    std::string bad = good;
    bad[at] = static_cast<char>(bad[at] ^ 0x01);
    const auto bad_path = s.write("flipped.cache", bad);
    const auto pass = read_string_cache(bad_path);
    REQUIRE(pass.failure);
    CHECK(testing::code_of(pass.failure) == errc::data_loss);
    const auto message = testing::message_of(pass.failure);
    if (at < 8) {
      CHECK_MESSAGE(contains(message, bad_path + ": not a pscoro dataset cache (bad magic at byte 0)"), message);
    } else if (at < 16) {
      CHECK_MESSAGE(contains(message, bad_path + ": its header is corrupt"), message);
    } else {
      const std::size_t index = (at - 16) / 20;
      CHECK_MESSAGE(contains(message, fmt::format("{}: block {} (bytes {} to {}) is corrupt", bad_path, index,
                                                  16 + index * 20, std::min(good.size(), 16 + (index + 1) * 20))),
                    message);
    }
  }
}

TEST_CASE("a cache file that is cut short, or holds what no writer writes, is data loss naming the byte") {
  const scratch s;
  // The data of {"abc", "de"}: length 8 at 0 | "string" at 8 | mark at 14 | length at 15 | "abc" at
  // 23 | mark at 26 | length at 27 | "de" at 35 | end mark at 37 | count at 38 | 46 bytes. In one
  // block, byte d of the data is byte 16 + d of the file.
  const std::string data =
      u64_bytes(6) + "string" + "\x01" + u64_bytes(3) + "abc" + "\x01" + u64_bytes(2) + "de" + std::string(1, '\0') +
      u64_bytes(2);
  REQUIRE(data.size() == 46);
  auto expect = [&](const std::string& name, const std::string& bytes, const std::string& part) {
    const auto path = s.write(name, bytes);
    const auto e = error_thrown_by([&] { (void)collect(from_values<std::string>({}).cache(path)); });
    CHECK(e.code() == errc::data_loss);
    CHECK_MESSAGE(contains(e.what(), path + ": " + part), std::string(e.what()));
  };
  const std::string file = framed_cache(data);
  // The file cut: in its header, after it, in the checksum of its last block, in a block.
  expect("magic.cache", "X" + file.substr(1), "not a pscoro dataset cache (bad magic at byte 0)");
  expect("tiny.cache", file.substr(0, 5), "not a pscoro dataset cache (5 bytes)");
  expect("header.cache", file.substr(0, 12), "truncated in its header (12 bytes of 16)");
  expect("nothing.cache", file.substr(0, 16), "truncated: no data after the header at byte 16");
  expect("crc-cut.cache", file.substr(0, 19), "truncated: its last block, at byte 16, has 3 bytes, too few for");
  expect("block-cut.cache", file.substr(0, 40), "block 0 (bytes 16 to 40) is corrupt");
  for (const std::uint32_t block_size : {0u, 1u << 30}) {
    std::string header = "PSCACHE2" + std::string(reinterpret_cast<const char*>(&block_size), 4);
    const std::uint32_t crc = common::crc32c(header.data(), header.size());
    header.append(reinterpret_cast<const char*>(&crc), 4);
    expect(fmt::format("block-size-{}.cache", block_size), header + file.substr(16),
           fmt::format("a block size of {} bytes", block_size));
  }
  // Valid blocks around data no writer writes: every size is checked against the bytes left.
  expect("cut.cache", framed_cache(data.substr(0, 19)),
         "truncated at byte 31: a string's length (8 bytes) is incomplete");
  expect("short.cache", framed_cache(data.substr(0, 25)),
         "a string's length 3 at byte 31 runs past the end of the data (2 bytes left)");
  expect("nomark.cache", framed_cache(data.substr(0, 26)),
         "truncated at byte 42: an element mark (1 bytes) is incomplete");
  expect("long.cache", framed_cache(data + "x"), "1 bytes of data after the end, at byte 62");
  expect("count.cache", framed_cache(data.substr(0, 38) + u64_bytes(3)), "its end says 3 elements, 2 were read");
  expect("mark.cache", framed_cache(data.substr(0, 14) + "\x07" + data.substr(15)), "bad element mark 7 at byte 30");
  expect("huge.cache", framed_cache(data.substr(0, 15) + u64_bytes(~std::uint64_t{0}) + data.substr(23)),
         "a string's length 18446744073709551615 at byte 31 runs past the end of the data (23 bytes left)");
  expect("signature.cache", framed_cache(u64_bytes(std::uint64_t{1} << 40) + data.substr(8)),
         "an element type 1099511627776 bytes long at byte 16");
  // Offsets are the file's, blocks and checksums counted: in blocks of 8 bytes, data byte 15 is
  // byte 7 of block 1 (at 16 + 12), data byte 26 byte 2 of block 3 (at 16 + 3 x 12).
  expect("small-blocks-cut.cache", framed_cache(data.substr(0, 19), 8),
         "truncated at byte 35: a string's length (8 bytes) is incomplete");
  expect("small-blocks-mark.cache", framed_cache(data.substr(0, 26) + "\x07" + data.substr(27), 8),
         "bad element mark 7 at byte 54");
  // An array whose dimensions overflow, or need more bytes than are left, allocates nothing.
  // length at 0 | "array<f32>" at 8 | mark at 18 | rank at 19 | dimensions at 27 | ...
  const std::string array = u64_bytes(10) + "array<f32>" + "\x01" + u64_bytes(1) + u64_bytes(2) +
                            std::string(8, '\0') + std::string(1, '\0') + u64_bytes(1);
  REQUIRE(array.size() == 52);
  auto expect_array = [&](const std::string& name, const std::string& bytes, const std::string& part) {
    const auto path = s.write(name, framed_cache(bytes));
    const auto e = error_thrown_by([&] { (void)collect(from_values<xt::xarray<float>>({}).cache(path)); });
    CHECK(e.code() == errc::data_loss);
    CHECK_MESSAGE(contains(e.what(), path + ": " + part), std::string(e.what()));
  };
  CHECK(collect(from_values<xt::xarray<float>>({}).cache(s.write("array.cache", framed_cache(array)))) ==
        std::vector<xt::xarray<float>>{xt::xarray<float>{0.0f, 0.0f}});
  expect_array("rank.cache", array.substr(0, 19) + u64_bytes(1000) + array.substr(27),
               "an array of 1000 dimensions at byte 35");
  expect_array("overflow.cache", array.substr(0, 19) + u64_bytes(2) + u64_bytes(0) + u64_bytes(std::uint64_t{1} << 62),
               "the dimensions of the array at byte 35 overflow a 64-bit byte count");
  expect_array("big.cache", array.substr(0, 19) + u64_bytes(1) + u64_bytes(std::uint64_t{1} << 30) + array.substr(35),
               "the array at byte 35 needs 4294967296 bytes, 17 are left");
}

TEST_CASE("a cache file an older pscoro wrote, without checksums, is rebuilt from upstream, never read") {
  const scratch s;
  // The format before checksums: magic, then the data as it is now, with no blocks.
  const std::string old_data = u64_bytes(6) + "string" + "\x01" + u64_bytes(3) + "old" + std::string(1, '\0') +
                               u64_bytes(1);
  const auto path = s.write("old.cache", "PSCACHE1" + old_data);
  auto reads = std::make_shared<int>(0);
  const auto upstream = from_values<std::string>({"new", "ones"}).map([reads](std::string x) {
    ++*reads;
    return x;
  });
  testing::captured_log log;
  CHECK(collect(upstream.cache(path)) == std::vector<std::string>{"new", "ones"});
  CHECK(*reads == 2);
  CHECK_MESSAGE(contains(log.text(), "cache: " + path + " was written by an older pscoro, without checksums: it is "
                                     "not read, this pass reads upstream and writes it again"),
                log.text());
  // Rewritten in the current format, and read from then on.
  CHECK(whole_file(path).substr(0, 8) == "PSCACHE2");
  CHECK(collect(upstream.cache(path)) == std::vector<std::string>{"new", "ones"});
  CHECK(*reads == 2);
}

TEST_CASE("a FIFO or a directory given as a cache file is refused at once, naming it and the setting") {
  const scratch s;
  const testing::scoped_fifo fifo((s.dir / "fifo.cache").string());
  const auto thrown = testing::thrown_without_blocking_on(fifo.path(), [&] {
    (void)collect(from_values<std::string>({"a"}).cache(fifo.path()));
  });
  REQUIRE(thrown);
  CHECK(testing::code_of(thrown) == errc::invalid_argument);
  CHECK_MESSAGE(testing::message_of(thrown) == "cache: " + fifo.path() + " is a FIFO, not a regular file (the file of "
                                     "dataset::cache(filename) must name a regular file)",
                testing::message_of(thrown));
  const auto directory = (s.dir / "directory.cache").string();
  std::filesystem::create_directories(directory);
  const auto e = error_thrown_by([&] { (void)collect(from_values<std::string>({"a"}).cache(directory)); });
  CHECK(e.code() == errc::invalid_argument);
  CHECK_MESSAGE(contains(e.what(), "cache: " + directory + " is a directory, not a regular file"), std::string(e.what()));
}

TEST_CASE("text_lines reads files in order and drops line ends") {
  scratch s;
  const auto a = s.write("a.txt", "one\r\ntwo\n");
  const auto b = s.write("b.txt", "three");
  CHECK(collect(text_lines({a, b})) == std::vector<std::string>{"one", "two", "three"});
  const auto e = error_thrown_by([&] { (void)collect(text_lines({a, (s.dir / "missing.txt").string()})); });
  CHECK(e.code() == errc::not_found);
  CHECK(contains(e.what(), "missing.txt: cannot open"));
  // Sharding a dataset of file names shards by file.
  const auto by_file = from_values(std::vector<std::string>{a, b}).shard(2, 1).flat_map([](std::string f) {
    return text_lines({f});
  });
  CHECK(collect(by_file) == std::vector<std::string>{"three"});
}

TEST_CASE("csv parses numbers, quotes and headers, and names file, line and column when it cannot") {
  scratch s;
  const auto good = s.write("good.csv", "x,y,z\n1,2.5,-3\n\"4\",\" 5 \",6e2\n\n7,,9\n");
  const auto rows = collect(csv<float>({good}, {.header = true, .empty_value = 0.0}));
  REQUIRE(rows.size() == 3);
  CHECK(rows[0](1) == 2.5f);
  CHECK(rows[1](2) == 600.0f);
  CHECK(rows[2](1) == 0.0f);
  const auto e = error_thrown_by([&] { (void)collect(csv<float>({good}, {.header = true})); });
  CHECK(std::string(e.what()) == good + ":5: column 2 is empty");
  const auto bad = s.write("bad.csv", "1,2\n3,abc\n");
  CHECK(std::string(error_thrown_by([&] { (void)collect(csv<double>({bad})); }).what()) == bad + ":2: column 2: 'abc' is not a number");
  const auto ragged = s.write("ragged.csv", "1,2\n3,4,5\n");
  CHECK(std::string(error_thrown_by([&] { (void)collect(csv<double>({ragged})); }).what()) ==
        ragged + ":2: 3 fields, but the first row has 2");
  const auto open_quote = s.write("quote.csv", "1,\"2\n");
  CHECK(contains(error_thrown_by([&] { (void)collect(csv<double>({open_quote})); }).what(), "a quoted field is not closed"));
  // A quoted field may hold the delimiter and a line end.
  const auto text_fields = collect(detail::csv_rows({s.write("q.csv", "\"a,b\",\"c\nd\",\"say \"\"hi\"\"\"\n")}, {}));
  REQUIRE(text_fields.size() == 1);
  CHECK(text_fields[0].fields == std::vector<std::string>{"a,b", "c\nd", "say \"hi\""});
}

TEST_CASE("libsvm reads labels and sparse features and refuses malformed lines") {
  scratch s;
  const auto good = s.write("a.svm", "1 3:0.5 7:1 # comment\n-1 qid:2 1:2\n\n# only a comment\n0\n");
  const auto rows = collect(libsvm({good}));
  REQUIRE(rows.size() == 3);
  CHECK(rows[0].label == 1.0);
  CHECK(rows[0].indices == std::vector<std::int64_t>{3, 7});
  CHECK(rows[0].values == std::vector<float>{0.5f, 1.0f});
  CHECK(rows[1].indices == std::vector<std::int64_t>{1});
  CHECK(rows[2].indices.empty());
  const auto unordered = s.write("b.svm", "1 5:1 2:1\n");
  CHECK(std::string(error_thrown_by([&] { (void)collect(libsvm({unordered})); }).what()) ==
        unordered + ":1: indices must increase along a line: 2 after 5");
  const auto garbage = s.write("c.svm", "1 5:1\nx 1:1\n");
  CHECK(std::string(error_thrown_by([&] { (void)collect(libsvm({garbage})); }).what()) == garbage + ":2: label 'x' is not a number");
  const auto no_colon = s.write("d.svm", "1 5\n");
  CHECK(std::string(error_thrown_by([&] { (void)collect(libsvm({no_colon})); }).what()) == no_colon + ":1: '5' is not index:value");
}

TEST_CASE("criteo_tsv reads Criteo lines with missing values and names the bad field") {
  scratch s;
  std::string line = "1";
  for (int i = 0; i < 13; ++i) line += i == 2 ? "\t" : "\t" + std::to_string(i);
  for (int i = 0; i < 26; ++i) line += i == 4 ? "\t" : "\t68fd1e64";
  const auto good = s.write("day.tsv", line + "\n" + line + "\n");
  const auto rows = collect(criteo_tsv({good}));
  REQUIRE(rows.size() == 2);
  CHECK(rows[0].label == 1.0f);
  CHECK(rows[0].integers[1] == 1);
  CHECK(!rows[0].integers[2]);
  CHECK(rows[0].categories[0] == 0x68fd1e64u);
  CHECK(!rows[0].categories[4]);
  auto broken = line;
  broken.replace(broken.rfind("68fd1e64"), 8, "68fd1e6z");
  const auto bad = s.write("bad.tsv", line + "\n" + broken + "\n");
  CHECK(std::string(error_thrown_by([&] { (void)collect(criteo_tsv({bad})); }).what()) ==
        bad + ":2: field 40: '68fd1e6z' is not 8 hex digits");
  const auto short_line = s.write("short.tsv", "0\t1\t2\n");
  CHECK(contains(error_thrown_by([&] { (void)collect(criteo_tsv({short_line})); }).what(), ":1: field 4: missing"));
}

// The reader under IDX and TFRecord (src/data/file_reader.hpp): ISA-L's inflater, gzip members one
// after another, plain files read as they are, and every way gzip data can be wrong.
TEST_CASE("gzip inputs are read across members in any chunks; cut, corrupt or trailing gzip data names its byte") {
  scratch s;
  std::string first(300000, '\0'), second(300000, '\0');  // each more than one 256 KiB input step
  std::mt19937 random(3);
  for (auto* part : {&first, &second}) {
    for (std::size_t i = 0; i < part->size(); ++i) (*part)[i] = static_cast<char>(i % 7 == 0 ? random() : i / 1000);
  }
  const std::string whole = first + second;
  const auto file_bytes = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const std::string one_member = file_bytes(s.write_gz("one.gz", whole));
  const std::string two_members = file_bytes(s.write_gz("a.gz", first)) + file_bytes(s.write_gz("b.gz", second));
  // Reads of 1 byte, a row, more than a step, and the rest, then the end.
  const auto read_all = [&](data::file_reader& reader) {
    std::string out;
    for (const std::size_t chunk : {std::size_t{1}, std::size_t{784}, std::size_t{400000}, whole.size()}) {
      std::string part(chunk, '\0');
      part.resize(reader.read(part.data(), chunk));
      out += part;
    }
    char extra;
    CHECK(reader.read(&extra, 1) == 0);
    return out;
  };
  for (const auto& file : {std::pair{"one.gz", one_member}, std::pair{"two.gz", two_members}}) {
    const std::string name = file.first;  // not a structured binding: clang 14 cannot capture one
    CAPTURE(name);
    data::file_reader reader(s.write(name, file.second));
    CHECK(reader.compressed());
    CHECK(read_all(reader) == whole);
  }
  data::file_reader plain(s.write("plain", whole));
  CHECK(!plain.compressed());
  CHECK(read_all(plain) == whole);

  // A header naming the file, as gzip writes it (Fashion-MNIST's files have one).
  std::string named = one_member.substr(0, 10) + std::string("one\0", 4) + one_member.substr(10);
  named[3] = static_cast<char>(named[3] | 0x08);  // FNAME
  data::file_reader named_reader(s.write("named.gz", named));
  CHECK(read_all(named_reader) == whole);
  // A member that ends exactly where a 256 KiB step of reading ends, then another: padded to that
  // length with an extra field (FEXTRA) in its header.
  std::string noise(230000, '\0');
  for (auto& c : noise) c = static_cast<char>(random());
  const std::string noise_member = file_bytes(s.write_gz("noise.gz", noise));
  REQUIRE(noise_member.size() + 2 < (std::size_t{256} << 10));
  const std::size_t extra = (std::size_t{256} << 10) - noise_member.size() - 2;
  REQUIRE(extra <= 0xffff);
  std::string padded = noise_member.substr(0, 10) + std::string{static_cast<char>(extra & 0xff), static_cast<char>(extra >> 8)} +
                       std::string(extra, 'x') + noise_member.substr(10);
  padded[3] = static_cast<char>(padded[3] | 0x04);  // FEXTRA
  REQUIRE(padded.size() == (std::size_t{256} << 10));
  data::file_reader edge(s.write("edge.gz", padded + file_bytes(s.write_gz("second.gz", second))));
  CHECK(read_all(edge) == noise + second);

  // A file cut inside a member ends there: what was written up to the cut is read (a TFRecord
  // writer's flush relies on it), and the formats' framing reports a cut record or row.
  data::file_reader cut(s.write("cut.gz", one_member.substr(0, one_member.size() / 2)));
  const std::string before_cut = read_all(cut);
  CHECK(before_cut.size() > whole.size() / 4);
  CHECK(before_cut == whole.substr(0, before_cut.size()));

  // Damage is data_loss from the first read that needs bytes from there on: every byte before it is
  // read, in steps of a row.
  const auto failure = [&](const std::string& name, const std::string& bytes, std::size_t expect_read) {
    const auto path = s.write(name, bytes);
    std::string out;
    auto e = error_thrown_by([&] {
      data::file_reader reader(path);
      std::string row(784, '\0');
      while (const std::size_t got = reader.read(row.data(), row.size())) out.append(row.data(), got);
    });
    CHECK_MESSAGE(out.size() >= expect_read, name, ": ", out.size(), " bytes read before the error, expected ", expect_read);
    CHECK(out == whole.substr(0, out.size()));
    return e;
  };
  std::string wrong_crc = one_member;
  wrong_crc[wrong_crc.size() - 8] = static_cast<char>(wrong_crc[wrong_crc.size() - 8] ^ 1);  // the trailer's CRC-32
  auto e = failure("crc.gz", wrong_crc, whole.size() - whole.size() % 784);
  CHECK(e.code() == errc::data_loss);
  CHECK(contains(e.what(), "crc.gz: corrupt gzip data at byte"));
  CHECK(contains(e.what(), "the member's CRC-32 or length does not match its data"));
  std::string wrong_length = one_member;
  wrong_length[wrong_length.size() - 4] = static_cast<char>(wrong_length[wrong_length.size() - 4] ^ 1);
  e = failure("length.gz", wrong_length, whole.size() - whole.size() % 784);
  CHECK(contains(e.what(), "length.gz: corrupt gzip data at byte"));
  std::string flipped = one_member;
  for (std::size_t i = 100; i < 200; ++i) flipped[i] = static_cast<char>(~flipped[i]);  // inside the deflate data
  e = failure("flipped.gz", flipped, 0);
  CHECK(e.code() == errc::data_loss);
  CHECK(contains(e.what(), "flipped.gz: corrupt gzip data at byte"));
  e = failure("trailing.gz", one_member + "xx", whole.size() - whole.size() % 784);
  CHECK(contains(e.what(), fmt::format("trailing.gz: corrupt gzip data at byte {}: the bytes after the end of a gzip "
                                       "member start no other member", one_member.size())));
  e = failure("header.gz", std::string("\x1f\x8b\x09\x00", 4) + std::string(20, 'z'), 0);
  CHECK(contains(e.what(), "header.gz: corrupt gzip data at byte"));
  CHECK(contains(e.what(), "a compression method other than deflate"));
  // A plain TFRecord file whose first record's length (35,615 = 0x8b1f) starts as gzip does.
  const auto gzip_like = (s.dir / "gzip_like.tfrecord").string();
  const std::string long_record(0x8b1f, 'r');
  {
    tfrecord_writer writer(gzip_like);
    writer.write(long_record);
    writer.write("next");
  }
  CHECK(collect(tfrecord({gzip_like})) == std::vector<std::string>{long_record, "next"});
  // A gzipped TFRecord file still being written: what was flushed is read.
  {
    const auto open_gz = (s.dir / "open.tfrecord.gz").string();
    tfrecord_writer writer(open_gz, tfrecord_compression::gzip);
    writer.write("first");
    writer.write("second");
    writer.flush();
    CHECK(collect(tfrecord({open_gz})) == std::vector<std::string>{"first", "second"});
  }
  e = error_thrown_by([&] { data::file_reader missing((s.dir / "missing.gz").string()); });
  CHECK(e.code() == errc::not_found);
  CHECK(contains(e.what(), "missing.gz: cannot open: No such file or directory"));
}

TEST_CASE("idx reads rows of every element type, gzipped or not, and reports corruption by byte offset") {
  scratch s;
  // 3 rows of 2x2 unsigned bytes.
  std::string bytes = std::string("\0\0\x08\x03", 4) + be32(3) + be32(2) + be32(2);
  for (int i = 0; i < 12; ++i) bytes += char(i * 20);
  for (const auto& path : {s.write("u8.idx", bytes), s.write_gz("u8.idx.gz", bytes)}) {
    const auto rows = collect(idx<float>(path));
    REQUIRE(rows.size() == 3);
    CHECK(rows[1].shape() == std::vector<std::size_t>{2, 2});
    CHECK(rows[2](1, 1) == 220.0f);
  }
  // Big-endian floats and signed shorts.
  std::string floats = std::string("\0\0\x0D\x01", 4) + be32(2);
  const float values[] = {1.5f, -2.25f};
  for (const float v : values) floats += be32(std::bit_cast<std::uint32_t>(v));
  const auto f = collect(idx<double>(s.write("f.idx", floats)));
  REQUIRE(f.size() == 2);
  CHECK(f[1]() == -2.25);
  std::string shorts = std::string("\0\0\x0B\x01", 4) + be32(1) + std::string("\xff\xfe", 2);
  CHECK(collect(idx<std::int32_t>(s.write("s.idx", shorts)))[0]() == -2);

  const auto truncated = s.write_gz("cut.idx.gz", bytes.substr(0, bytes.size() - 3));
  auto e = error_thrown_by([&] { (void)collect(idx<float>(truncated)); });
  CHECK(e.code() == errc::data_loss);
  CHECK(contains(e.what(), "cut.idx.gz: truncated at byte 25: row 2 of 3 is incomplete"));
  const auto not_idx = s.write("text.idx", "hello world, not idx");
  e = error_thrown_by([&] { (void)collect(idx<float>(not_idx)); });
  CHECK(e.code() == errc::data_loss);
  CHECK(contains(e.what(), "bad IDX magic 68 65 6c 6c at byte 0"));
  const auto trailing = s.write_gz("long.idx.gz", bytes + "xx");
  CHECK(contains(error_thrown_by([&] { (void)collect(idx<float>(trailing)); }).what(), "bytes after the last of its 3 rows, at byte 28"));
  CHECK(error_thrown_by([&] { (void)collect(idx<float>((s.dir / "none.idx").string())); }).code() == errc::not_found);
}

TEST_CASE("zip of an images file and a shorter labels file names the file that ended") {
  scratch s;
  // 5 images of 2x2 bytes, and labels for 3 of them: the files of two different splits, say.
  std::string images = std::string("\0\0\x08\x03", 4) + be32(5) + be32(2) + be32(2) + std::string(20, '\x07');
  std::string labels = std::string("\0\0\x08\x01", 4) + be32(3) + std::string(3, '\x01');
  const auto images_file = s.write("images.idx", images), labels_file = s.write_gz("labels.idx.gz", labels);
  CHECK(idx<float>(labels_file).description() == "IDX file '" + labels_file + "'");
  // Transformations that take the elements of one dataset keep what it reads.
  const auto labelled = zip(idx<float>(images_file).map([](xt::xarray<float> x) { return x / 255.0f; }),
                            idx<std::int64_t>(labels_file).shard(1, 0).cache());
  const auto e = error_thrown_by([&] { (void)collect(labelled); });
  CHECK(e.code() == errc::invalid_argument);
  CHECK_MESSAGE(contains(e.what(), "zip: the second dataset (IDX file '" + labels_file + "') ended after 3 elements "
                                   "but the first dataset (IDX file '" + images_file + "') has more"),
                std::string(e.what()));
  // The text formats and TFRecord say what they read too, naming the first few of many files.
  CHECK(csv<float>({"a.csv"}).description() == "CSV file 'a.csv'");
  CHECK(tfrecord({"a", "b", "c", "d", "e"}).description() == "TFRecord files 'a', 'b', 'c' and 2 more");
  CHECK(text_lines({"a", "b"}).batch(2).description() == "text files 'a', 'b'");
  CHECK(counting(3).described_as("the counter").take(1).description() == "the counter");
}

TEST_CASE("read_idx reads a whole IDX file as one array, the rows idx() reads, with the same errors") {
  scratch s;
  std::string bytes = std::string("\0\0\x08\x03", 4) + be32(3) + be32(2) + be32(2);
  for (int i = 0; i < 12; ++i) bytes += char(i * 20);
  for (const auto& path : {s.write("u8.idx", bytes), s.write_gz("u8.idx.gz", bytes)}) {
    const auto all = read_idx<std::uint8_t>(path);
    REQUIRE(all.shape() == std::vector<std::size_t>{3, 2, 2});
    const auto rows = collect(idx<std::uint8_t>(path));
    for (std::size_t r = 0; r < 3; ++r) CHECK(xt::xarray<std::uint8_t>(xt::view(all, r)) == rows[r]);
    CHECK(all(2, 1, 1) == 220);
  }
  // Every element type, big-endian, converted.
  std::string ints = std::string("\0\0\x0C\x01", 4) + be32(2) + be32(0xfffffffeu) + be32(70000);
  CHECK(read_idx<std::int64_t>(s.write("i.idx", ints)) == xt::xarray<std::int64_t>{-2, 70000});
  std::string doubles = std::string("\0\0\x0E\x01", 4) + be32(1);
  const auto d = std::bit_cast<std::uint64_t>(-0.125);
  doubles += be32(static_cast<std::uint32_t>(d >> 32)) + be32(static_cast<std::uint32_t>(d));
  CHECK(read_idx<float>(s.write("d.idx", doubles)) == xt::xarray<float>{-0.125f});
  CHECK(read_idx<int>(s.write("b.idx", std::string("\0\0\x09\x01", 4) + be32(1) + "\xff")) == xt::xarray<int>{-1});

  const auto e = error_thrown_by([&] { (void)read_idx<float>(s.write_gz("cut.idx.gz", bytes.substr(0, bytes.size() - 3))); });
  CHECK(e.code() == errc::data_loss);
  CHECK_MESSAGE(contains(e.what(), "cut.idx.gz: truncated at byte 25: row 2 of 3 is incomplete"), std::string(e.what()));
  CHECK(error_thrown_by([&] { (void)read_idx<float>((s.dir / "none.idx").string()); }).code() == errc::not_found);
}

TEST_CASE("idx checks the header, and an uncompressed file's length, when the iterator is made") {
  scratch s;
  const std::string header = std::string("\0\0\x08\x03", 4) + be32(3) + be32(2) + be32(2);
  const std::string good = header + std::string(12, '\x07');
  // make_iterator() alone, no next(): the error comes before the first element.
  auto opening = [](const std::string& path) { return error_thrown_by([&] { (void)idx<float>(path).make_iterator(); }); };
  auto expect = [&](const std::string& name, const std::string& bytes, const std::string& part) {
    CAPTURE(name);
    const auto e = opening(s.write(name, bytes));
    CHECK(e.code() == errc::data_loss);
    const std::string m = e.what();
    CHECK(contains(m, name + ": " + part));
  };
  expect("magic.idx", "\x01" + good.substr(1), "bad IDX magic 01 00 08 03 at byte 0");
  expect("type.idx", good.substr(0, 2) + "\x0a" + good.substr(3), "unknown IDX element type 0x0a at byte 2");
  expect("nodims.idx", std::string("\0\0\x08\0", 4), "an IDX file has at least one dimension, byte 3 says 0");
  expect("dims.idx", std::string("\0\0\x08\x05", 4) + be32(3) + be32(2),
         "truncated at byte 12 (in the 5 dimensions of the header)");
  std::string huge = std::string("\0\0\x0e\x04", 4);
  for (int i = 0; i < 4; ++i) huge += be32(0xffffffffu);
  expect("huge.idx", huge, "IDX dimensions 4294967295 x 4294967295 x 4294967295 x 4294967295 overflow");
  std::string hidden = std::string("\0\0\x0e\x04", 4) + be32(1) + be32(0xffffffffu) + be32(0xffffffffu) + be32(0);
  expect("hidden.idx", hidden, "IDX dimensions 1 x 4294967295 x 4294967295 x 0 overflow");
  expect("short.idx", good.substr(0, good.size() - 1),
         "the file is 27 bytes long but its IDX header (3 x 2 x 2 of 1-byte elements) says 28");
  expect("long.idx", good + "xx", "the file is 30 bytes long but its IDX header (3 x 2 x 2 of 1-byte elements) says 28");
  // Gzipped, the header is still checked at once; a length that does not match shows as it is read.
  const auto bad_gz = s.write_gz("type.idx.gz", good.substr(0, 2) + "\x0a" + good.substr(3));
  std::string m = opening(bad_gz).what();
  CHECK(contains(m, "unknown IDX element type 0x0a"));
  // A gzipped file claiming a row of 2^32 - 1 doubles fails as truncated, without allocating 32 GiB.
  const auto liar = s.write_gz("liar.idx.gz", std::string("\0\0\x0e\x02", 4) + be32(1) + be32(0xffffffffu) + "abc");
  m = error_thrown_by([&] { (void)collect(idx<float>(liar)); }).what();
  CHECK(contains(m, "liar.idx.gz: truncated at byte 15: row 0 of 1 is incomplete"));
  CHECK(collect(idx<float>(s.write("good.idx", good))).size() == 3);
}

TEST_CASE("the real Fashion-MNIST files read as 60,000 images and labels") {
  const std::string dir = "/usr/share/datasets/fashion-mnist";
  REQUIRE_MESSAGE(std::filesystem::exists(dir + "/train-labels-idx1-ubyte.gz"),
                  "Debian's dataset-fashion-mnist is installed by scripts/run.sh");
  const auto examples = zip(idx<float>(dir + "/train-images-idx3-ubyte.gz"), idx<std::int64_t>(dir + "/train-labels-idx1-ubyte.gz"))
                            .map([](std::tuple<xt::xarray<float>, xt::xarray<std::int64_t>> pair) {
                              std::get<0>(pair) /= 255.0f;
                              return pair;
                            })
                            .batch(1000)
                            .prefetch(2);
  std::size_t images = 0;
  std::set<std::int64_t> classes;
  auto it = examples.make_iterator();
  while (auto batch = it.next()) {
    const auto& [x, y] = *batch;
    CHECK(x.shape() == std::vector<std::size_t>{1000, 28, 28});
    CHECK(xt::amax(x)() <= 1.0f);
    images += y.size();
    classes.insert(y.begin(), y.end());
  }
  CHECK(images == 60000);
  CHECK(classes == std::set<std::int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
}

// CRC-32C bit by bit, straight from its definition (reflected Castagnoli polynomial): what the
// library's (ISA-L's) is checked against at every length and alignment below.
namespace {
std::uint32_t crc32c_by_bits(const unsigned char* p, std::size_t n) {
  std::uint32_t crc = ~0u;
  while (n--) {
    crc ^= *p++;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1) ? 0x82f63b78u : 0);
  }
  return ~crc;
}
}  // namespace

TEST_CASE("crc32c matches the published check values and its definition") {
  CHECK(common::crc32c("123456789", 9) == 0xe3069283u);  // RFC 3720's check value for CRC-32C
  CHECK(common::crc32c("", 0) == 0u);
  // 32 zero bytes: RFC 3720 B.4's first vector.
  const std::string zeros(32, '\0');
  CHECK(common::crc32c(zeros.data(), zeros.size()) == 0x8a9136aau);
  std::string text(1000, 'x');
  for (std::size_t i = 0; i < text.size(); ++i) text[i] = static_cast<char>(i * 7);
  const auto* bytes = reinterpret_cast<const unsigned char*>(text.data());
  for (std::size_t start : {0, 1, 3}) {
    for (std::size_t n : {0, 1, 7, 8, 9, 63, 64, 65, 255, 256, 257, 997}) {
      CAPTURE(start);
      CAPTURE(n);
      CHECK(common::crc32c(bytes + start, n) == crc32c_by_bits(bytes + start, n));
    }
  }
  // Extending in pieces gives the CRC of the whole.
  for (std::size_t cut : {0, 1, 5, 500, 1000}) {
    CHECK(common::crc32c_extend(common::crc32c(text.data(), cut), text.data() + cut, text.size() - cut) ==
          common::crc32c(text.data(), text.size()));
  }
  CHECK(common::crc32c_extend(0, "123456789", 9) == 0xe3069283u);
}

TEST_CASE("TFRecord files of tf.train.Example round-trip, compressed or not") {
  scratch s;
  for (const auto compression : {tfrecord_compression::none, tfrecord_compression::gzip}) {
    const auto path = (s.dir / (compression == tfrecord_compression::gzip ? "a.tfrecord.gz" : "a.tfrecord")).string();
    tfrecord_writer writer(path, compression);
    for (std::int64_t i = 0; i < 100; ++i) {
      tf_example e;
      e.features["label"] = std::vector<std::int64_t>{i % 2};
      e.features["x"] = std::vector<float>{float(i), 0.5f};
      e.features["id"] = std::vector<std::string>{"row-" + std::to_string(i)};
      writer.write(serialize_tf_example(e));
    }
    writer.close();
    const auto records = collect(tfrecord({path}).map([](const std::string& r) { return parse_tf_example(r); }));
    REQUIRE(records.size() == 100);
    CHECK(records[7].int64s("label") == std::vector<std::int64_t>{1});
    CHECK(records[7].floats("x") == std::vector<float>{7.0f, 0.5f});
    CHECK(records[99].bytes("id") == std::vector<std::string>{"row-99"});
    CHECK(std::string(error_thrown_by([&] { (void)records[0].floats("label"); }).what()) == "feature 'label' is not a float list");
    CHECK(std::string(error_thrown_by([&] { (void)records[0].floats("y"); }).what()) == "the example has no feature 'y'");
  }
  CHECK(error_thrown_by([] { (void)parse_tf_example("\xff\xff\xff"); }).code() == errc::invalid_argument);
  const auto unwritable = error_thrown_by([&] { tfrecord_writer((s.dir / "no-such-dir" / "x.tfrecord").string()); });
  CHECK(unwritable.code() == errc::unavailable);
  CHECK(contains(unwritable.what(), "x.tfrecord: cannot write"));
}

TEST_CASE("corrupt TFRecord files are data loss naming the file and the record's offset") {
  scratch s;
  const auto path = (s.dir / "good.tfrecord").string();
  {
    tfrecord_writer writer(path);
    writer.write("first record");
    writer.write("second record");
  }
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  REQUIRE(bytes.size() == 2 * 16 + 12 + 13);
  CHECK(collect(tfrecord({path})) == std::vector<std::string>{"first record", "second record"});

  std::string flipped = bytes;
  flipped[28 + 12 + 3] ^= 1;  // a data byte of the second record (which starts at byte 28)
  auto e = error_thrown_by([&] { (void)collect(tfrecord({s.write("flipped.tfrecord", flipped)})); });
  CHECK(e.code() == errc::data_loss);
  CHECK(contains(e.what(), "flipped.tfrecord: corrupt TFRecord at byte 28: the data's checksum does not match"));
  std::string bad_length = bytes;
  bad_length[0] ^= 4;
  e = error_thrown_by([&] { (void)collect(tfrecord({s.write("length.tfrecord", bad_length)})); });
  CHECK(contains(e.what(), "at byte 0: the length's checksum does not match"));
  e = error_thrown_by([&] { (void)collect(tfrecord({s.write_gz("cut.tfrecord.gz", bytes.substr(0, bytes.size() - 6))})); });
  CHECK(e.code() == errc::data_loss);
  CHECK(contains(e.what(), "cut.tfrecord.gz: corrupt TFRecord at byte 28: truncated record (11 of 13 bytes)"));
  // A length of 4 GiB with a checksum to match, and 5 bytes: truncated, without holding 4 GiB first.
  std::string huge(8, '\0');
  huge[4] = 1;  // 2^32, little-endian
  const auto crc = common::masked_crc32c(huge.data(), 8);
  for (int i = 0; i < 4; ++i) huge += char(crc >> (8 * i));
  e = error_thrown_by([&] { (void)collect(tfrecord({s.write("huge.tfrecord", huge + "short")})); });
  CHECK(e.code() == errc::data_loss);
  std::string m = e.what();
  CHECK(contains(m, "huge.tfrecord: corrupt TFRecord at byte 0: truncated record (5 of 4294967296 bytes)"));
  // The records before the damage were delivered.
  auto it = tfrecord({s.write("again.tfrecord", flipped)}).make_iterator();
  CHECK(it.next() == std::string("first record"));
  CHECK_THROWS_AS(it.next(), error);
}

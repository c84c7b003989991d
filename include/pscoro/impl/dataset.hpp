// The template bodies of <pscoro/dataset.hpp>: the sources behind each transformation, batching,
// the prefetch thread and its queue. Include <pscoro/dataset.hpp>, which includes this at its end.
#pragma once

#include <pscoro/config.hpp>

#include <pscoro/dataset.hpp>  // the declarations, when this header is included first

#include <xtensor/xview.hpp>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

namespace pscoro {

namespace detail {

template <class T, class F>
class function_source final : public dataset_source<T> {
 public:
  explicit function_source(F f) : f_(std::move(f)) {}
  std::optional<T> next() override { return f_(); }

 private:
  F f_;
};

/// A source from a callable returning std::optional<T>.
template <class T, class F>
std::unique_ptr<dataset_source<T>> make_source(F f) {
  return std::make_unique<function_source<T, F>>(std::move(f));
}

template <class T>
struct is_xarray : std::false_type {};
template <class V>
struct is_xarray<xt::xarray<V>> : std::true_type {};

template <class T>
struct is_tuple_of_xarrays : std::false_type {};
template <class... V>
struct is_tuple_of_xarrays<std::tuple<xt::xarray<V>...>> : std::true_type {};

/// Stacks arrays of one shape along a new first axis; throws errc::invalid_argument naming the
/// first element whose shape differs.
template <class V>
xt::xarray<V> stack(const std::vector<xt::xarray<V>>& items) {
  std::vector<std::size_t> shape{items.size()};
  if (!items.empty()) shape.insert(shape.end(), items.front().shape().begin(), items.front().shape().end());
  xt::xarray<V> out = xt::xarray<V>::from_shape(shape);
  const std::size_t each = items.empty() ? 0 : items.front().size();
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (!std::equal(items[i].shape().begin(), items[i].shape().end(), items.front().shape().begin(),
                    items.front().shape().end())) {
      throw error(errc::invalid_argument, "batch: element " + std::to_string(i) +
                                              " has another shape than element 0 (use map to make them equal)");
    }
    std::copy(items[i].begin(), items[i].end(), out.begin() + static_cast<std::ptrdiff_t>(i * each));
  }
  return out;
}

template <class T>
struct batch_traits {
  using type = std::vector<T>;
  static type make(std::vector<T> items) { return items; }
};
template <class V>
struct batch_traits<xt::xarray<V>> {
  using type = xt::xarray<V>;
  static type make(std::vector<xt::xarray<V>> items) { return stack(items); }
};
template <class... V>
struct batch_traits<std::tuple<xt::xarray<V>...>> {
  using type = std::tuple<xt::xarray<V>...>;
  static type make(std::vector<std::tuple<xt::xarray<V>...>> items) {
    return make(items, std::index_sequence_for<V...>{});
  }
  template <std::size_t... I>
  static type make(const std::vector<std::tuple<xt::xarray<V>...>>& items, std::index_sequence<I...>) {
    auto column = [&](auto index) {
      using element = std::tuple_element_t<decltype(index)::value, type>;
      std::vector<element> values;
      values.reserve(items.size());
      for (const auto& item : items) values.push_back(std::get<decltype(index)::value>(item));
      return stack(values);
    };
    return type{column(std::integral_constant<std::size_t, I>{})...};
  }
};

/// The bounded queue between a prefetching thread and its consumer.
template <class T>
struct prefetch_state {
  std::mutex mutex;
  std::condition_variable changed;
  std::deque<T> ready;
  std::exception_ptr failure;
  bool finished = false;
  bool stopping = false;
};

template <class T>
class prefetch_source final : public dataset_source<T> {
 public:
  prefetch_source(std::unique_ptr<dataset_source<T>> upstream, std::size_t capacity)
      : state_(std::make_shared<prefetch_state<T>>()) {
    thread_ = std::thread([state = state_, upstream = std::move(upstream), capacity]() mutable {
      try {
        while (true) {
          std::optional<T> item = upstream->next();
          std::unique_lock lock(state->mutex);
          if (!item) break;
          state->changed.wait(lock, [&] { return state->stopping || state->ready.size() < capacity; });
          if (state->stopping) return;
          state->ready.push_back(std::move(*item));
          state->changed.notify_all();
        }
      } catch (...) {
        std::lock_guard lock(state->mutex);
        state->failure = std::current_exception();
      }
      std::lock_guard lock(state->mutex);
      state->finished = true;
      state->changed.notify_all();
    });
  }

  ~prefetch_source() override {
    {
      std::lock_guard lock(state_->mutex);
      state_->stopping = true;
    }
    state_->changed.notify_all();
    thread_.join();  // after the element it is producing, if any
  }

  std::optional<T> next() override {
    std::unique_lock lock(state_->mutex);
    state_->changed.wait(lock, [&] { return !state_->ready.empty() || state_->finished; });
    if (!state_->ready.empty()) {
      T item = std::move(state_->ready.front());
      state_->ready.pop_front();
      state_->changed.notify_all();
      return item;
    }
    if (state_->failure) std::rethrow_exception(std::exchange(state_->failure, nullptr));
    return std::nullopt;
  }

 private:
  std::shared_ptr<prefetch_state<T>> state_;
  std::thread thread_;
};

/// What cache() shares between the passes of a dataset: the elements, once a pass has read them all.
template <class T>
struct memory_cache {
  std::mutex mutex;
  std::shared_ptr<const std::vector<T>> elements;
};

/// The payload bytes per block of a cache file: each block is checked on its own as a pass reads
/// it, so a long file is verified as it streams, with one block in memory.
inline constexpr std::size_t cache_block_size = std::size_t{1} << 20;

/// Writes a cache file: `path`.tmp-<pid>-<n> until commit() renames it to `path`; destroyed
/// before that, it removes what it wrote. The bytes written go in blocks of `block_size` (the
/// last one shorter), each followed by its CRC-32C (docs/design.md, "Datasets"). Throws
/// errc::unavailable when it cannot write.
class PSCORO_API cache_file_writer {
 public:
  cache_file_writer(std::string path, const std::string& signature, std::size_t block_size = cache_block_size);
  ~cache_file_writer();
  cache_file_writer(const cache_file_writer&) = delete;
  cache_file_writer& operator=(const cache_file_writer&) = delete;

  void write(const void* data, std::size_t size);
  void write_u64(std::uint64_t v) { write(&v, sizeof v); }
  /// Before each element.
  void begin_element();
  /// After the last element: writes the end mark and renames the file into place.
  void commit();

 private:
  void write_block(const char* payload, std::size_t size);  // a block and its checksum
  void write_fully(const void* data, std::size_t size);
  [[noreturn]] void fail(const char* doing);
  std::string path_;
  std::string temporary_;
  int fd_ = -1;
  std::vector<char> block_;  // the block being filled: block_[0, filled_)
  std::size_t filled_ = 0;
  std::uint64_t blocks_ = 0;  // written so far
  std::uint64_t elements_ = 0;
  bool broken_ = false;
};

/// Whether a finished cache of the current format is at `path`, to be read. False when there is
/// no file, and when there is one of an older format (without checksums): it is logged and
/// rebuilt by the pass that writes the new one. Throws errc::invalid_argument when `path` is not a
/// regular file (a FIFO, a directory).
PSCORO_API bool cache_file_ready(const std::string& path);

/// Reads a cache file written by cache_file_writer, block by block, each checked against its
/// CRC-32C before any of its bytes is used. Every size is checked against the bytes left before
/// anything is allocated: a corrupt or cut file is errc::data_loss naming the file and the byte
/// offset, a file for other element types errc::invalid_argument.
class PSCORO_API cache_file_reader {
 public:
  cache_file_reader(std::string path, const std::string& signature);
  ~cache_file_reader();
  cache_file_reader(const cache_file_reader&) = delete;
  cache_file_reader& operator=(const cache_file_reader&) = delete;

  /// Whether another element follows (false at the end mark, after checking it).
  bool next_element();
  /// Reads `size` bytes of `what`.
  void read(void* data, std::size_t size, const char* what);
  std::uint64_t read_u64(const char* what);
  /// Reads a length of `what` whose bytes (`length` x `unit`) must fit in what is left of the file.
  std::uint64_t read_length(std::uint64_t unit, const char* what);
  /// Reads an array's dimensions and returns its shape; its `element_size`-byte elements must fit
  /// in what is left (and its strides in 63 bits).
  std::vector<std::size_t> read_shape(std::size_t element_size);

 private:
  [[noreturn]] void corrupt(const std::string& what) const;
  std::uint64_t left() const noexcept { return data_size_ - offset_; }
  std::uint64_t file_offset(std::uint64_t data_offset) const noexcept;  // where a byte of the data is
  void load_block(char* into, std::size_t payload);                    // the next block, checked
  void read_at(void* into, std::size_t size, std::uint64_t offset) const;
  std::string path_;
  int fd_ = -1;
  std::uint64_t size_ = 0;        // of the file
  std::uint64_t block_size_ = 0;  // payload bytes per block
  std::uint64_t data_size_ = 0;   // payload bytes of all blocks: the data
  std::uint64_t offset_ = 0;      // bytes of the data read
  std::uint64_t next_block_ = 0;  // the block load_block reads next
  std::vector<char> block_;       // the last block read into it: block_[position_, end_) not read yet
  std::size_t position_ = 0;
  std::size_t end_ = 0;
  std::uint64_t elements_ = 0;
};

/// How cache(filename) writes and reads an element of type T (host byte order: a cache is read
/// back on the machine that wrote it). A type without one does not compile.
template <class T, class = void>
struct cache_codec;

template <class V>
std::string arithmetic_signature() {
  if constexpr (std::is_same_v<V, bool>) {
    return "bool";
  } else {
    return (std::is_floating_point_v<V> ? "f" : std::is_signed_v<V> ? "i" : "u") + std::to_string(8 * sizeof(V));
  }
}

template <class V>
struct cache_codec<V, std::enable_if_t<std::is_arithmetic_v<V>>> {
  static std::string signature() { return arithmetic_signature<V>(); }
  static void write(cache_file_writer& out, const V& v) { out.write(&v, sizeof v); }
  static V read(cache_file_reader& in) {
    if constexpr (std::is_same_v<V, bool>) {
      unsigned char byte = 0;
      in.read(&byte, 1, "a bool");
      return byte != 0;
    } else {
      V v{};
      in.read(&v, sizeof v, "a scalar");
      return v;
    }
  }
};

template <>
struct cache_codec<std::string> {
  static std::string signature() { return "string"; }
  static void write(cache_file_writer& out, const std::string& v) {
    out.write_u64(v.size());
    out.write(v.data(), v.size());
  }
  static std::string read(cache_file_reader& in) {
    std::string v(in.read_length(1, "a string's length"), '\0');
    in.read(v.data(), v.size(), "a string");
    return v;
  }
};

template <class V>
struct cache_codec<xt::xarray<V>, std::enable_if_t<std::is_arithmetic_v<V> && !std::is_same_v<V, bool>>> {
  static std::string signature() { return "array<" + arithmetic_signature<V>() + ">"; }
  static void write(cache_file_writer& out, const xt::xarray<V>& v) {
    out.write_u64(v.dimension());
    for (const auto d : v.shape()) out.write_u64(d);
    out.write(v.data(), v.size() * sizeof(V));
  }
  static xt::xarray<V> read(cache_file_reader& in) {
    xt::xarray<V> v = xt::xarray<V>::from_shape(in.read_shape(sizeof(V)));
    in.read(v.data(), v.size() * sizeof(V), "an array's elements");
    return v;
  }
};

template <class... Ts>
struct cache_codec<std::tuple<Ts...>> {
  static std::string signature() {
    std::string out = "(";
    ((out += cache_codec<Ts>::signature() + ","), ...);
    return out + ")";
  }
  static void write(cache_file_writer& out, const std::tuple<Ts...>& v) {
    std::apply([&](const Ts&... x) { (cache_codec<Ts>::write(out, x), ...); }, v);
  }
  static std::tuple<Ts...> read(cache_file_reader& in) {
    return std::tuple<Ts...>{cache_codec<Ts>::read(in)...};  // a braced list reads left to right
  }
};

}  // namespace detail

template <class T>
template <class F>
auto dataset<T>::map(F f) const {
  using U = std::decay_t<std::invoke_result_t<F&, T>>;
  return dataset<U>([make = make_, f]() {
    return detail::make_source<U>([upstream = make(), f]() mutable -> std::optional<U> {
      auto item = upstream->next();
      if (!item) return std::nullopt;
      return f(std::move(*item));
    });
  }, description_);
}

template <class T>
template <class Predicate>
dataset<T> dataset<T>::filter(Predicate keep) const {
  return dataset([make = make_, keep]() {
    return detail::make_source<T>([upstream = make(), keep]() mutable -> std::optional<T> {
      while (auto item = upstream->next()) {
        if (keep(std::as_const(*item))) return item;
      }
      return std::nullopt;
    });
  }, description_);
}

template <class T>
template <class F>
auto dataset<T>::flat_map(F f) const {
  using inner = std::decay_t<std::invoke_result_t<F&, T>>;
  using U = typename inner::element_type;
  return dataset<U>([make = make_, f]() {
    return detail::make_source<U>(
        [upstream = make(), f, current = std::optional<dataset_iterator<U>>()]() mutable -> std::optional<U> {
          while (true) {
            if (current) {
              if (auto item = current->next()) return item;
              current.reset();
            }
            auto outer = upstream->next();
            if (!outer) return std::nullopt;
            current.emplace(f(std::move(*outer)).make_iterator());
          }
        });
  });
}

template <class T>
dataset<T> dataset<T>::shard(std::int64_t num_shards, std::int64_t index) const {
  if (num_shards < 1) {
    throw error(errc::invalid_argument, "shard: num_shards must be >= 1, got " + std::to_string(num_shards));
  }
  if (index < 0 || index >= num_shards) {
    throw error(errc::invalid_argument, "shard: index must be in [0, " + std::to_string(num_shards) + "), got " +
                                            std::to_string(index));
  }
  return dataset([make = make_, n = num_shards, index]() {
    return detail::make_source<T>([upstream = make(), n, index, position = std::int64_t{0}]() mutable {
      while (auto item = upstream->next()) {
        if (position++ % n == index) return item;
      }
      return std::optional<T>();
    });
  }, description_);
}

template <class T>
dataset<T> dataset<T>::shuffle(std::size_t buffer_size) const {
  std::random_device entropy;
  const std::uint64_t seed = (std::uint64_t{entropy()} << 32) ^ std::uint64_t{entropy()};
  return shuffle(buffer_size, seed);
}

template <class T>
dataset<T> dataset<T>::shuffle(std::size_t buffer_size, std::uint64_t seed) const {
  if (buffer_size == 0) throw error(errc::invalid_argument, "shuffle: buffer_size must be >= 1");
  auto passes = std::make_shared<std::atomic<std::uint64_t>>(0);
  return dataset([make = make_, buffer_size, seed, passes]() {
    const std::uint64_t pass = passes->fetch_add(1);
    std::seed_seq sequence{static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32),
                           static_cast<std::uint32_t>(pass), static_cast<std::uint32_t>(pass >> 32)};
    return detail::make_source<T>([upstream = make(), buffer_size, random = std::mt19937_64(sequence),
                                   buffer = std::vector<T>(), filled = false]() mutable -> std::optional<T> {
      if (!filled) {
        while (buffer.size() < buffer_size) {
          auto item = upstream->next();
          if (!item) break;
          buffer.push_back(std::move(*item));
        }
        filled = true;
      }
      if (buffer.empty()) return std::nullopt;
      std::uniform_int_distribution<std::size_t> pick(0, buffer.size() - 1);
      const std::size_t i = pick(random);
      std::optional<T> out(std::move(buffer[i]));
      if (auto item = upstream->next()) {
        buffer[i] = std::move(*item);
      } else {
        buffer[i] = std::move(buffer.back());
        buffer.pop_back();
      }
      return out;
    });
  }, description_);
}

template <class T>
dataset<T> dataset<T>::repeat(std::int64_t count) const {
  if (count < -1) throw error(errc::invalid_argument, "repeat: count must be >= -1, got " + std::to_string(count));
  return dataset([make = make_, count]() {
    return detail::make_source<T>([make, count, done = std::int64_t{0},
                                   upstream = std::unique_ptr<detail::dataset_source<T>>(),
                                   yielded = false]() mutable -> std::optional<T> {
      while (count == -1 || done < count) {
        if (!upstream) {
          upstream = make();
          yielded = false;
        }
        if (auto item = upstream->next()) {
          yielded = true;
          return item;
        }
        upstream.reset();
        ++done;
        if (!yielded) break;  // an empty pass: forever would never yield
      }
      return std::nullopt;
    });
  }, description_);
}

template <class T>
auto dataset<T>::batch(std::size_t size, bool drop_remainder) const {
  if (size == 0) throw error(errc::invalid_argument, "batch: size must be >= 1");
  using traits = detail::batch_traits<T>;
  using U = typename traits::type;
  return dataset<U>([make = make_, size, drop_remainder]() {
    return detail::make_source<U>([upstream = make(), size, drop_remainder]() mutable -> std::optional<U> {
      std::vector<T> items;
      items.reserve(size);
      while (items.size() < size) {
        auto item = upstream->next();
        if (!item) break;
        items.push_back(std::move(*item));
      }
      if (items.empty() || (drop_remainder && items.size() < size)) return std::nullopt;
      return traits::make(std::move(items));
    });
  }, description_);
}

template <class T>
dataset<T> dataset<T>::take(std::int64_t count) const {
  return dataset([make = make_, count]() {
    return detail::make_source<T>([upstream = make(), left = count]() mutable -> std::optional<T> {
      if (left <= 0) return std::nullopt;
      --left;
      return upstream->next();
    });
  }, description_);
}

template <class T>
dataset<T> dataset<T>::cache() const {
  auto shared = std::make_shared<detail::memory_cache<T>>();
  return dataset([make = make_, shared]() -> std::unique_ptr<detail::dataset_source<T>> {
    std::shared_ptr<const std::vector<T>> cached;
    {
      std::lock_guard lock(shared->mutex);
      cached = shared->elements;
    }
    if (cached) {
      return detail::make_source<T>([cached, i = std::size_t{0}]() mutable -> std::optional<T> {
        if (i == cached->size()) return std::nullopt;
        return (*cached)[i++];
      });
    }
    // This pass fills a cache of its own and hands it over at the end; one that stops early
    // drops it with the source. Passes running at once each read upstream; the first to finish
    // provides the cache.
    return detail::make_source<T>([upstream = make(), shared, kept = std::vector<T>(),
                                   ended = false]() mutable -> std::optional<T> {
      if (ended) return std::nullopt;
      auto item = upstream->next();
      if (!item) {
        ended = true;
        std::lock_guard lock(shared->mutex);
        if (!shared->elements) shared->elements = std::make_shared<const std::vector<T>>(std::move(kept));
        return std::nullopt;
      }
      kept.push_back(*item);
      return item;
    });
  }, description_);
}

template <class T>
dataset<T> dataset<T>::cache(std::string filename) const {
  using codec = detail::cache_codec<T>;
  return dataset([make = make_, filename = std::move(filename)]() -> std::unique_ptr<detail::dataset_source<T>> {
    if (detail::cache_file_ready(filename)) {
      return detail::make_source<T>(
          [in = std::make_shared<detail::cache_file_reader>(filename, codec::signature())]() -> std::optional<T> {
            if (!in->next_element()) return std::nullopt;
            return codec::read(*in);
          });
    }
    return detail::make_source<T>(
        [upstream = make(), out = std::make_shared<detail::cache_file_writer>(filename, codec::signature()),
         ended = false]() mutable -> std::optional<T> {
          if (ended) return std::nullopt;
          auto item = upstream->next();
          if (!item) {
            ended = true;
            out->commit();
            return std::nullopt;
          }
          out->begin_element();
          codec::write(*out, *item);
          return item;
        });
  }, description_);
}

template <class T>
dataset<T> dataset<T>::prefetch(std::size_t buffer_size) const {
  if (buffer_size == 0) throw error(errc::invalid_argument, "prefetch: buffer_size must be >= 1");
  return dataset([make = make_, buffer_size]() -> std::unique_ptr<detail::dataset_source<T>> {
    return std::make_unique<detail::prefetch_source<T>>(make(), buffer_size);
  }, description_);
}

template <class A, class B>
dataset<std::tuple<A, B>> zip(const dataset<A>& a, const dataset<B>& b) {
  return dataset<std::tuple<A, B>>([a, b]() {
    // "the first dataset (IDX file 'images.idx')": which one, and what it reads when that is known.
    const auto name = [](const char* which, const std::string& description) {
      return "the " + std::string(which) + " dataset" + (description.empty() ? "" : " (" + description + ")");
    };
    return detail::make_source<std::tuple<A, B>>(
        [left = a.make_iterator(), right = b.make_iterator(), first = name("first", a.description()),
         second = name("second", b.description()), count = std::uint64_t{0}]() mutable
        -> std::optional<std::tuple<A, B>> {
          auto x = left.next();
          auto y = right.next();  // also when x is missing: both must end together
          if (!x && !y) return std::nullopt;
          if (!x || !y) {
            throw error(errc::invalid_argument, "zip: " + (x ? second : first) + " ended after " +
                                                    std::to_string(count) + " elements but " + (x ? first : second) +
                                                    " has more (zip_shortest stops at the shorter)");
          }
          ++count;
          return std::tuple<A, B>(std::move(*x), std::move(*y));
        });
  });
}

template <class A, class B>
dataset<std::tuple<A, B>> zip_shortest(const dataset<A>& a, const dataset<B>& b) {
  return dataset<std::tuple<A, B>>([a, b]() {
    return detail::make_source<std::tuple<A, B>>(
        [left = a.make_iterator(), right = b.make_iterator()]() mutable -> std::optional<std::tuple<A, B>> {
          auto x = left.next();
          if (!x) return std::nullopt;
          auto y = right.next();
          if (!y) return std::nullopt;
          return std::tuple<A, B>(std::move(*x), std::move(*y));
        });
  });
}

template <class T>
dataset<T> from_values(std::vector<T> values) {
  auto shared = std::make_shared<const std::vector<T>>(std::move(values));
  return dataset<T>([shared]() {
    return detail::make_source<T>([shared, i = std::size_t{0}]() mutable -> std::optional<T> {
      if (i == shared->size()) return std::nullopt;
      return (*shared)[i++];
    });
  });
}

template <class V>
dataset<xt::xarray<V>> from_tensor_slices(xt::xarray<V> values) {
  if (values.dimension() == 0) throw error(errc::invalid_argument, "from_tensor_slices: a scalar has no slices");
  auto shared = std::make_shared<const xt::xarray<V>>(std::move(values));
  return dataset<xt::xarray<V>>([shared]() {
    return detail::make_source<xt::xarray<V>>([shared, row = std::size_t{0}]() mutable -> std::optional<xt::xarray<V>> {
      if (row >= shared->shape()[0]) return std::nullopt;
      return xt::xarray<V>(xt::view(*shared, row++));
    });
  });
}

template <class A, class B>
dataset<std::tuple<xt::xarray<A>, xt::xarray<B>>> from_tensor_slices(xt::xarray<A> a, xt::xarray<B> b) {
  if (a.dimension() == 0 || b.dimension() == 0 || a.shape()[0] != b.shape()[0]) {
    throw error(errc::invalid_argument, "from_tensor_slices: both arrays need the same number of rows");
  }
  return zip(from_tensor_slices(std::move(a)), from_tensor_slices(std::move(b)));
}

template <class MakeGenerator>
auto from_generator(MakeGenerator make_generator) {
  using generator = std::decay_t<std::invoke_result_t<MakeGenerator&>>;
  using T = typename std::decay_t<std::invoke_result_t<generator&>>::value_type;
  return dataset<T>([make_generator]() { return detail::make_source<T>(make_generator()); });
}

}  // namespace pscoro

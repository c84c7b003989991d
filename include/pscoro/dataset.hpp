// Input pipelines (TF's tf.data): a dataset describes how to produce elements; every
// make_iterator() starts a fresh pass with its own state. Workers build them from files
// (<pscoro/data_formats.hpp>) and scheduled functions pull batches.
//
//   auto batches = pscoro::criteo_tsv(files)
//                      .shard(context.num_workers, context.worker_index)
//                      .shuffle(10'000, /*seed=*/7)
//                      .map(to_features)
//                      .batch(512)
//                      .prefetch(4);
//   auto it = batches.make_iterator();
//   while (auto batch = it.next()) train_on(*batch);
//
// Elements are values of any movable type. batch() stacks xtensor arrays along a new first axis
// (tuples of arrays element-wise) and collects anything else into a std::vector. A dataset is a
// cheap, copyable description; iterators are move-only and not thread-safe (prefetch runs its
// upstream on a thread of its own). Failures are pscoro::errors naming the file and the line or
// byte offset; the end of the data is an empty optional, never an exception.
//
// This header declares; the template bodies are in <pscoro/impl/dataset.hpp>, included at the end.
#pragma once

#include <pscoro/config.hpp>

#include <pscoro/detail/xtensor.hpp>
#include <pscoro/error.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace pscoro {

namespace detail {

/// One pass over a dataset: next() until it returns nothing.
template <class T>
class PSCORO_API dataset_source {
 public:
  virtual ~dataset_source() = default;
  virtual std::optional<T> next() = 0;
};

}  // namespace detail

/// A pass over a dataset. Move-only; not thread-safe.
template <class T>
class dataset_iterator {
 public:
  explicit dataset_iterator(std::unique_ptr<detail::dataset_source<T>> source) : source_(std::move(source)) {}

  /// The next element, or nothing at the end (then always nothing).
  std::optional<T> next() {
    if (!source_) return std::nullopt;
    auto item = source_->next();
    if (!item) source_.reset();
    return item;
  }

 private:
  std::unique_ptr<detail::dataset_source<T>> source_;
};

template <class T>
class dataset {
 public:
  using element_type = T;
  using factory = std::function<std::unique_ptr<detail::dataset_source<T>>()>;

  /// A dataset whose passes `make` starts; `description` says where its elements come from.
  explicit dataset(factory make, std::string description = {})
      : make_(std::move(make)), description_(std::move(description)) {}

  /// A fresh pass over the data.
  dataset_iterator<T> make_iterator() const { return dataset_iterator<T>(make_()); }

  /// Where the elements come from, for messages about this dataset ("IDX file 'labels.idx'"; empty
  /// when unknown): the file readers set it, and transformations that take their elements from this
  /// dataset alone keep it (all but flat_map).
  const std::string& description() const noexcept { return description_; }
  /// The same data, described as `description` (for a dataset from_generator or from_values makes).
  dataset described_as(std::string description) const { return dataset(make_, std::move(description)); }

  /// Elements `f(x)`: a dataset of what `f` returns.
  template <class F>
  auto map(F f) const;

  /// The elements for which `keep(x)` is true.
  template <class Predicate>
  dataset filter(Predicate keep) const;

  /// The elements of every dataset `f(x)` returns, one after another.
  template <class F>
  auto flat_map(F f) const;

  /// Every `num_shards`-th element from the `index`-th (TF's shard): over all indices, every element
  /// exactly once. Apply it to a dataset of file names to shard by file, to records to shard by
  /// record. Throws errc::invalid_argument (TF's conditions) for bad arguments.
  dataset shard(std::int64_t num_shards, std::int64_t index) const;

  /// The elements in an order drawn from a buffer of `buffer_size` (TF's shuffle: 1 keeps the order,
  /// the data size shuffles uniformly). The same seed gives the same orders; each new pass
  /// (make_iterator, or repeat after shuffle) draws a new order from it.
  dataset shuffle(std::size_t buffer_size, std::uint64_t seed) const;
  /// The same with a seed drawn at random when shuffle() is called (TF's unseeded shuffle): each
  /// worker's pipeline, and each run, has an order of its own (TF's testDatasetsShuffledDifferently).
  dataset shuffle(std::size_t buffer_size) const;

  /// The data `count` times (-1: forever; a pass that yields nothing ends it).
  dataset repeat(std::int64_t count = -1) const;

  /// Groups of `size` elements (the last one smaller unless `drop_remainder`): xt::xarray<V>
  /// elements (and tuples of them) stacked along a new first axis, anything else as a
  /// std::vector<T>.
  auto batch(std::size_t size, bool drop_remainder = false) const;

  /// At most the first `count` elements.
  dataset take(std::int64_t count) const;

  /// The same elements, read from upstream only once (TF's cache()): the first pass to reach the end
  /// keeps a copy of every element in memory, and every later pass (a new iterator, the next epoch
  /// of repeat, the passes of every copy of this dataset) reads that copy. A pass that stops early
  /// or fails keeps nothing: the next pass reads upstream again (TF discards a partial cache too,
  /// so `cache().take(k).repeat()` caches nothing; write `take(k).cache().repeat()`). Put it after
  /// what should run once (decompressing, decoding, shard) and before what should run every epoch
  /// (shuffle, random augmentation). T must be copyable.
  dataset cache() const;

  /// The same, kept in the file `filename` (TF's cache(filename)), which outlives the process: when
  /// the file exists, every pass reads it and upstream is never read; when it does not, a pass
  /// reads upstream and writes `filename`.tmp-<pid>-<n> beside it, renamed to `filename` only when
  /// the pass reaches the end (a pass that stops early or fails leaves no file behind). Elements
  /// are xt::xarray<V> of arithmetic V, arithmetic scalars, std::string, and tuples of these. The
  /// file is written in blocks of 1 MiB, each with its CRC-32C (as TF's cache files carry
  /// CRC-32C), and a pass checks each block before it uses any of its bytes: a flipped byte, a
  /// file that is not such a cache, or is cut short, is errc::data_loss naming it and the byte
  /// offset (the elements of the blocks before the damage have been delivered). One written for
  /// other element types is errc::invalid_argument, and so is a `filename` that is not a regular
  /// file (a FIFO, a directory), refused without an open that could block. A cache an older
  /// pscoro wrote (no checksums) is never read: the log says so, and the pass reads upstream and
  /// writes it again. A file that cannot be written is errc::unavailable from the make_iterator()
  /// (or next()) that would write it. A process killed while writing leaves its `.tmp-` file,
  /// never a cache that looks finished.
  dataset cache(std::string filename) const;

  /// Produces up to `buffer_size` elements ahead on a thread of its own, so the consumer finds them
  /// ready; memory stays bounded by the buffer. A failure upstream surfaces from next() after the
  /// elements produced before it.
  dataset prefetch(std::size_t buffer_size) const;

 private:
  factory make_;
  std::string description_;
};

/// Pairs of elements of two datasets of the same length. Unlike TF's zip, which silently stops at
/// the shorter, a dataset ending before the other is an error: errc::invalid_argument from next()
/// naming which ended (with its description(), the file it reads) and after how many elements
/// (Python's zip(strict=True)). Use zip_shortest to pair with a longer or endless stream on purpose.
template <class A, class B>
dataset<std::tuple<A, B>> zip(const dataset<A>& a, const dataset<B>& b);

/// Pairs of elements, ending with the shorter dataset, as TF's zip (the longer one's rest is not
/// read).
template <class A, class B>
dataset<std::tuple<A, B>> zip_shortest(const dataset<A>& a, const dataset<B>& b);

/// The elements of `values`, in order: for instance file names, to shard by file and then flat_map
/// each file to its records.
template <class T>
dataset<T> from_values(std::vector<T> values);

/// The slices of `values` along axis 0 (TF's from_tensor_slices).
template <class V>
dataset<xt::xarray<V>> from_tensor_slices(xt::xarray<V> values);

/// Pairs of slices of `a` and `b`, which must have as many rows.
template <class A, class B>
dataset<std::tuple<xt::xarray<A>, xt::xarray<B>>> from_tensor_slices(xt::xarray<A> a, xt::xarray<B> b);

/// A dataset from `make_generator()`, called once per pass; the generator returns
/// std::optional<T>, nothing at the end.
template <class MakeGenerator>
auto from_generator(MakeGenerator make_generator);

}  // namespace pscoro

#include <pscoro/impl/dataset.hpp>

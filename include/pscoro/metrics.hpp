// Metrics: counters, gauges and histograms a task keeps about itself, a registry that lists them,
// and the Prometheus text exposition (format 0.0.4) served over HTTP at /metrics.
//
// pscoro's own metrics (closures queued and in flight, closure and fetch times, failures, bytes and
// frames per peer, ps operations, dataset input, the process's memory and CPU) are registered in
// process_registry(). A task serves it when asked: PSCORO_METRICS_PORT=9100 in its environment (or
// server_options::metrics_port, strategy_options::metrics_port; 0 picks a free port), and it logs
// "<task> metrics at http://HOST:PORT/metrics". A program adds its own in the same registry:
//
//   pscoro::metrics::counter steps;
//   auto registered = pscoro::metrics::process_registry().add("train_steps_total", "Steps trained.", {}, steps);
//   steps.inc();
//
// Updating a metric is one relaxed atomic operation (a histogram: a short search of its fixed
// buckets and two), with no lock and no allocation, from any thread. Reading them (a scrape,
// registry::value) takes the registry's lock, never the updaters'.
#pragma once

#include <pscoro/config.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace pscoro::metrics {

/// Label names and values of one series: {{"peer", "ps:0"}}.
using labels = std::vector<std::pair<std::string, std::string>>;

namespace detail {
PSCORO_API extern std::atomic<bool> updating;
}  // namespace detail

/// Turns every update of every metric on or off (on by default), for the whole process: off, each
/// keeps its value, and pscoro skips the clock reads its timings need. What metrics cost is the
/// difference (benchmarks/metrics_bench.cpp measures it).
inline void set_enabled(bool on) noexcept { detail::updating.store(on, std::memory_order_relaxed); }
inline bool enabled() noexcept { return detail::updating.load(std::memory_order_relaxed); }

/// A count that only goes up (Prometheus counter).
class counter {
 public:
  void inc(std::uint64_t n = 1) noexcept {
    if (enabled()) value_.fetch_add(n, std::memory_order_relaxed);
  }
  std::uint64_t value() const noexcept { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<std::uint64_t> value_{0};
};

/// A value that goes up and down (Prometheus gauge).
class gauge {
 public:
  void set(std::int64_t v) noexcept {
    if (enabled()) value_.store(v, std::memory_order_relaxed);
  }
  void add(std::int64_t n) noexcept {
    if (enabled()) value_.fetch_add(n, std::memory_order_relaxed);
  }
  std::int64_t value() const noexcept { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<std::int64_t> value_{0};
};

/// Observations counted in fixed buckets (Prometheus histogram): bucket i counts the observations
/// <= bounds[i] and above bounds[i-1]; one more bucket counts those above the last bound.
class PSCORO_API histogram {
 public:
  /// Bucket upper bounds, strictly increasing and finite (errc::invalid_argument otherwise).
  explicit histogram(std::vector<double> bounds);
  /// Seconds from 100 µs to 60 s: for latencies.
  histogram();

  void observe(double v) noexcept {
    if (!enabled()) return;
    std::size_t i = 0;
    const std::size_t n = bounds_.size();
    while (i < n && v > bounds_[i]) ++i;
    counts_[i].fetch_add(1, std::memory_order_relaxed);
    sum_.fetch_add(v, std::memory_order_relaxed);
  }

  struct snapshot {
    std::vector<double> bounds;
    std::vector<std::uint64_t> counts;  ///< per bucket (not cumulative), bounds.size() + 1 of them
    std::uint64_t count = 0;            ///< the sum of `counts`
    double sum = 0;
  };
  snapshot read() const;
  const std::vector<double>& bounds() const noexcept { return bounds_; }

  /// 5 us to 60 s, in steps of 1-2.5-5: the bounds of every time histogram pscoro registers.
  static std::vector<double> default_seconds();

 private:
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<std::uint64_t>[]> counts_;
  std::atomic<double> sum_{0};
};

/// The smallest bucket bound at or below which at least `q` (in [0, 1]) of the observations lie:
/// an upper bound of the q-quantile (0 with no observations; the last bound when they lie above
/// it).
PSCORO_API double quantile_bound(const histogram::snapshot& h, double q) noexcept;

enum class metric_type { counter, gauge, histogram };

/// One series as a scrape sees it, for callbacks (collectors) that compute values when read.
struct sample {
  std::string name;
  std::string help;
  metric_type type = metric_type::gauge;
  labels label_set;
  double value = 0;  ///< a counter's or a gauge's
};

/// The metrics a task exposes. A series is added with the object that holds its value, for as long
/// as the returned registration lives: declare the metric before its registration, so it outlives
/// it. Series of the same name must agree on help, type and (histograms) bounds; several with the
/// same name and labels (two parameter servers in one process) are exposed as their sum. Thread-safe.
class PSCORO_API registry {
 public:
  /// Removes its series from the registry when destroyed. Move-only.
  class PSCORO_API registration {
   public:
    registration() = default;
    registration(registration&& other) noexcept;
    registration& operator=(registration&& other) noexcept;
    ~registration();

   private:
    friend class registry;
    registration(registry* owner, std::uint64_t id) : owner_(owner), id_(id) {}
    void reset() noexcept;
    registry* owner_ = nullptr;
    std::uint64_t id_ = 0;
  };

  registry();
  ~registry();
  registry(const registry&) = delete;
  registry& operator=(const registry&) = delete;

  /// Adds a series. `name` is a metric name ([a-zA-Z_:][a-zA-Z0-9_:]*), label names are
  /// [a-zA-Z_][a-zA-Z0-9_]* not starting with "__" ("le" is reserved for histograms); a bad name,
  /// or help, type or bounds that disagree with the name's other series, throw errc::invalid_argument.
  [[nodiscard]] registration add(std::string name, std::string help, labels label_set, const counter& c);
  [[nodiscard]] registration add(std::string name, std::string help, labels label_set, const gauge& g);
  [[nodiscard]] registration add(std::string name, std::string help, labels label_set, const histogram& h);
  /// Adds a callback that returns counters and gauges computed at each read (the process's memory
  /// and CPU time). It runs on the reading thread, under the registry's lock: it must be quick,
  /// must not throw, and must not use the registry.
  [[nodiscard]] registration add_collector(std::function<std::vector<sample>()> collect);

  /// The Prometheus text exposition (format 0.0.4) of every series, sorted by name and labels.
  std::string expose() const;
  /// The value of counter or gauge `name` with exactly `label_set` (summed as in expose()), or
  /// nothing when there is no such series.
  std::optional<double> value(std::string_view name, const labels& label_set = {}) const;
  /// The count and sum of histogram `name` with exactly `label_set`, or nothing.
  std::optional<histogram::snapshot> histogram_value(std::string_view name, const labels& label_set = {}) const;
  /// Every series read at one moment, sorted by name and labels (summed as in expose()): counters
  /// and gauges as they are, a histogram as two counters, NAME_count and NAME_sum.
  std::vector<sample> samples() const;

 private:
  struct entry;
  struct state;
  registration insert(entry e);
  void remove(std::uint64_t id) noexcept;

  mutable std::mutex mutex_;
  std::unique_ptr<state> state_;
};

/// The registry of this process, which the library registers its metrics in and a task serves.
PSCORO_API registry& process_registry();

/// Serves a registry's exposition at http://HOST:PORT/metrics on a thread and io_context of its own,
/// so a scrape never waits for a task's protocol executor, nor that executor for a scrape. Beside it,
/// the task's page at `/` and the page's JSON document at `/api/cluster` (docs/api.md, The cluster
/// page). It answers GET only (HTTP/1.0 or 1.1, one request per connection): 404 for another path, 405 for
/// another method, 400 for a request it cannot parse or whose head exceeds 8 KiB; a client that
/// takes more than `timeout` for its exchange is dropped, and at most 64 connections are served at
/// once (more are closed at accept).
class PSCORO_API exposer {
 public:
  /// Listens on `address` ("host:port"; port 0 picks a free one). Throws std::system_error naming
  /// the address when it cannot listen.
  explicit exposer(const std::string& address, registry& served = process_registry(),
                   std::chrono::milliseconds timeout = std::chrono::seconds(10));
  ~exposer();  // stops the thread; connections in progress are closed
  exposer(const exposer&) = delete;
  exposer& operator=(const exposer&) = delete;

  /// The port listened on.
  std::uint16_t port() const noexcept;
  /// "host:port" listened on.
  std::string address() const;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

/// TF's coordinator metrics (metric_utils in TF's coordinator), for one cluster_coordinator's
/// strategy: what cluster_coordinator::metrics() returns. Also in process_registry() as
/// pscoro_coordinator_*.
struct coordinator_metrics {
  struct timing {
    std::uint64_t count = 0;
    double sum_seconds = 0;
  };
  std::int64_t queued_closures = 0;    ///< waiting in the queue
  std::int64_t inflight_closures = 0;  ///< sent to a worker, no outcome yet
  timing closure_execution;            ///< each outcome a worker returned: schedule on it to outcome
  timing remote_value_fetch;           ///< each result taken from its response into its remote_value
  std::uint64_t worker_failures = 0;   ///< workers lost (connection closed or heartbeat timed out)
  std::uint64_t ps_failures = 0;       ///< parameter servers lost, and closures that could not reach one
  std::uint64_t iterator_rebuilds = 0; ///< per-worker iterators rebuilt on workers that came back
  /// Closures that finished between each finished closure's start on its worker and its end (what
  /// its reads may have missed; coordinator_options::max_staleness bounds it). p50 and p99 are
  /// upper bounds: exact to 16, then the next power of two.
  struct staleness {
    std::uint64_t count = 0;  ///< closures measured
    std::uint64_t p50 = 0;
    std::uint64_t p99 = 0;
    std::uint64_t max = 0;
  };
  staleness closure_staleness;
  std::uint64_t speculated_closures = 0;  ///< backup attempts started for slow closures
  std::uint64_t backup_wins = 0;          ///< closures whose backup attempt finished first
};

namespace detail {
/// Elements taken from per-worker iterators by worker functions (pscoro_dataset_elements_total).
PSCORO_API counter& dataset_elements();
}  // namespace detail

}  // namespace pscoro::metrics

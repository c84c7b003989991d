// The CTR and DLRM examples' embeddings keyed by raw ids (--embedding hash): one pscoro::hash_table
// per categorical field, what each is made with, when the chief moves their clock (--ttl), and each
// ps's report of what its part of them holds.
#pragma once

#include <pscoro/hash_table.hpp>
#include <pscoro/hash_table_options.hpp>
#include <pscoro/initializers.hpp>
#include <pscoro/log.hpp>
#include <pscoro/metrics.hpp>

#include <asio/awaitable.hpp>

#include <CLI/CLI.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <stop_token>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace examples::field_tables {

/// The table of field `field` (from 0) of model `model`: "ctr/C1" .. "ctr/C26".
inline std::string name(const std::string& model, std::size_t field) { return fmt::format("{}/C{}", model, field + 1); }

/// What the fields' tables are made with, as both chiefs take it from their command line
/// (add_options): with `admission_min_count` > 0 an id gets a row once seen that often, with `ttl`
/// > 0 a row idle for that many steps is forgotten, with `capacity` > 0 (instead of a ttl) a table
/// holds at most that many rows per ps, a new one replacing the least recently named of a sample;
/// `buckets` > 0 sets the tables' virtual buckets (0: the default, 4096; each bucket that holds a
/// row has a map of its own, so 26 tables of 4096 cost ~20 MiB over 2 ps however few rows they hold).
struct policies {
  std::uint32_t admission_min_count = 0;
  std::uint64_t ttl = 0;
  std::uint64_t capacity = 0;
  std::uint32_t buckets = 0;

  void add_options(CLI::App& app) {
    app.add_option("--admission-min-count", admission_min_count,
                   "--embedding hash: an id gets a row once seen in this many steps (0: at once)");
    app.add_option("--ttl", ttl, "--embedding hash: forget an id not seen for this many steps (0: never)");
    app.add_option("--capacity", capacity,
                   "--embedding hash: at this many rows of a table on a ps, a new row replaces the least recently "
                   "named of 8 of its bucket (0: no limit; not with --ttl)");
    app.add_option("--buckets", buckets, "--embedding hash: virtual buckets per table (0: the default, 4096)")
        ->check(CLI::Range(0, 1 << 20));
  }

  /// Why these cannot be, for an example whose embeddings are hash tables (`hashed`) or not; empty
  /// when they can.
  std::string refusal(bool hashed) const {
    if (!hashed && (admission_min_count > 0 || ttl > 0 || capacity > 0 || buckets > 0)) {
      return "--admission-min-count, --ttl, --capacity and --buckets need --embedding hash";
    }
    if (ttl > 0 && capacity > 0) return "one eviction policy: --ttl or --capacity";
    return {};
  }

  /// A field's table: rows of `dim` values from `initializer`, with these policies.
  pscoro::hash_table_options table_options(std::size_t dim, pscoro::initializer initializer) const {
    pscoro::hash_table_options out{.dim = dim, .initializer = std::move(initializer)};
    // A counting filter of 1 MiB per table and ps, not the 4 MiB default: 26 tables, most of them small.
    if (admission_min_count > 0) {
      out.admission = pscoro::admission::min_count{.count = admission_min_count, .counters = std::size_t{1} << 20};
    }
    if (ttl > 0) out.eviction = pscoro::eviction::ttl{.max_idle = ttl};
    if (capacity > 0) out.eviction = pscoro::eviction::capacity{.rows_per_ps = capacity};
    if (buckets > 0) out.buckets = buckets;
    return out;
  }

  /// "admission: min_count 2; eviction: idle for 200 steps", as the chiefs print it.
  std::string describe() const {
    return fmt::format("admission: {}; eviction: {}",
                       admission_min_count > 0 ? fmt::format("min_count {}", admission_min_count) : "always",
                       ttl > 0        ? fmt::format("idle for {} steps", ttl)
                       : capacity > 0 ? fmt::format("at {} rows per ps, sampled LRU", capacity)
                                      : "none");
  }

  /// Whether the chief moves the tables' clock: a ttl counts idle steps on it, and a capacity picks
  /// the least recently named row by it (with a clock that never moves every row was named at 0,
  /// and the row replaced was a random one).
  bool clocked() const { return ttl > 0 || capacity > 0; }
  /// Steps the chief keeps scheduled ahead of the oldest unfinished one, with at most
  /// `in_flight_at_most` closures running: with a ttl twice those (see below), with a capacity a
  /// few times more (a clock that runs ahead only blurs which row is the least recently named),
  /// else `unclocked`, the example's own.
  std::size_t window(std::size_t in_flight_at_most, std::size_t unclocked) const {
    if (ttl > 0) return 2 * in_flight_at_most;
    if (capacity > 0) return std::max<std::size_t>(64, 4 * in_flight_at_most);
    return unclocked;
  }
  /// Steps between two moves of the clock (see below): a sixteenth of the ttl, or 4 for a capacity.
  std::int64_t clock_every() const {
    return std::max<std::int64_t>(1, static_cast<std::int64_t>((ttl > 0 ? ttl : 64) / 16));
  }
};

// With --ttl the tables' clock counts the steps scheduled: a step runs while the clock is between
// its number and the end of the chief's window of scheduled steps, so no row looks idle for longer
// than it is, and the window is small (policies::window: twice the closures in flight), so the steps
// that run while a busy machine holds up the chief (and its clock) are few beside the ttl. The
// clock moves every ttl/16 steps (policies::clock_every), not every step: a move is a request per
// table (26) to each ps, more than a step's own, and moving it every step cost ctr ~40% of its
// steps per second.
// A ttl of the order of the window (16 steps for 2 workers of 4 closures) is only roughly what it
// says: a row whose next step waits in the window can look idle. In ctr at --ttl 25 and 12, 2 of
// 30 runs saw the rows held swing (ids evicted while named, back as new rows) and ended
// 0.010-0.017 AUC low (their reruns did not; benchmarks/RESULTS.md, 2026-11-29 13:38). Keep the
// ttl well above the window.

/// Moves every table's clock to `clock` (one request per table to each ps).
template <class T>
asio::awaitable<void> advance_clocks(std::vector<pscoro::hash_table<T>> tables, std::uint64_t clock) {
  for (const auto& t : tables) co_await t.advance_clock(clock);
}

/// On each ps: what its part of the fields' tables holds (its metrics pscoro_ps_hash_table_rows and
/// _bytes, summed over the tables), printed every `every` while it changes. The chief cannot read
/// a ps's metrics; the ps can, and says it in its log:
///   "ps:0: its part of the hash tables holds 181234 rows in 25.6 MiB (148 bytes per row)"
class table_report {
 public:
  table_report(std::string task, std::vector<std::string> tables, std::chrono::duration<double> every)
      : thread_([task = std::move(task), tables = std::move(tables), every](std::stop_token stop) {
          run(task, tables, every, stop);
        }) {}

 private:
  static void run(const std::string& task, const std::vector<std::string>& tables,
                  std::chrono::duration<double> every, std::stop_token stop) {
    std::mutex mutex;
    std::condition_variable_any wake;
    double last_rows = 0, last_bytes = 0;
    std::unique_lock lock(mutex);
    while (!wake.wait_for(lock, stop, every, [&stop] { return stop.stop_requested(); })) {
      double rows = 0, bytes = 0;
      std::size_t held = 0;  // tables this ps holds a part of: none before the chief makes them and after the job
      for (const auto& name : tables) {
        const pscoro::metrics::labels table{{"table", name}};
        const auto table_rows = pscoro::metrics::process_registry().value("pscoro_ps_hash_table_rows", table);
        const auto table_bytes = pscoro::metrics::process_registry().value("pscoro_ps_hash_table_bytes", table);
        if (!table_rows || !table_bytes) continue;
        rows += *table_rows;
        bytes += *table_bytes;
        ++held;
      }
      if (held < tables.size() || (rows == last_rows && bytes == last_bytes)) continue;
      last_rows = rows;
      last_bytes = bytes;
      pscoro::print_line(
          fmt::format("{}: its part of the hash tables holds {:.0f} rows in {:.1f} MiB ({:.0f} bytes per row)",
                      task.c_str(), rows, bytes / (1 << 20), rows > 0 ? bytes / rows : 0.0));
    }
  }

  std::jthread thread_;
};

}  // namespace examples::field_tables

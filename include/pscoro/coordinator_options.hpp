// What a cluster_coordinator is told: closures in flight per worker, the queue's bound, how long
// lost workers are waited for and probed, the watchdog, TF's rule for transient ps failures, a
// bound on staleness, TF's staggered start and how many workers may join beyond the spec.
#pragma once

#include <pscoro/config.hpp>

#include <chrono>
#include <cstddef>
#include <optional>

namespace pscoro {

struct coordinator_options {
  /// Closures sent to one worker before it answers (TF: 1). More hides the round trip.
  std::size_t closures_per_worker = 4;
  /// Closures queued (not yet sent) at most; 0 = no limit. TF's limit is 256 * 1024.
  std::size_t max_queued_closures = 256 * 1024;
  /// With no live worker, queued closures wait this long for one to come back, then fail with
  /// errc::unavailable (TF waits an hour too, then carries on as if nothing happened).
  std::chrono::milliseconds worker_recovery_timeout{std::chrono::hours(1)};
  /// How often lost workers are probed (one connection attempt each) to see whether they are back;
  /// also how often the watchdog looks.
  std::chrono::milliseconds worker_probe_interval{std::chrono::seconds(1)};
  /// When closures are queued or running and none has finished for this long, log a warning with a
  /// line per worker naming what it runs and for how long; 0 = off (TF's default). Environment
  /// variable TF_CLUSTER_COORDINATOR_WATCH_DOG_TIMEOUT (seconds), as in TF, overrides it.
  std::chrono::milliseconds watchdog_timeout{0};
  /// A closure whose worker could not reach a ps the chief still reaches (errc::unavailable from
  /// that ps) runs again, unless that ps has been blamed this many times (the count never resets):
  /// then it fails the run. 0 = every such failure is fatal. TF's rule and default; environment
  /// variable TF_COORDINATOR_IGNORE_TRANSIENT_PS_FAILURES, as in TF, overrides it.
  int transient_ps_failures = 3;
  /// Bounded staleness (beyond TF, whose coordinator is fully asynchronous: none). With a bound s,
  /// closures are numbered in the order they are scheduled, and closure k starts only once every
  /// closure numbered k - s - 1 or lower has finished: its reads miss at most the updates of the s
  /// closures before it that may still run. A closure that runs again (its worker was lost, or a ps
  /// failed it transiently) keeps its number and goes back to the head of the queue, not the tail
  /// (the window would wait for it forever). s = 0 runs one closure at a time, in order.
  std::optional<std::size_t> max_staleness = std::nullopt;
  /// Staggered start (TF's): worker i takes its first closure min(i x schedule_start_delay,
  /// schedule_start_delay_max) after the coordinator is made (no cap when the max is 0), so that
  /// workers do not all reach the ps at once. 0 = all at once (TF's default). TF's environment
  /// variables TF_COORDINATOR_SCHEDULE_START_DELAY and TF_COORDINATOR_SCHEDULE_START_DELAY_MAX
  /// (whole seconds), as in TF, override them.
  std::chrono::milliseconds schedule_start_delay{0};
  std::chrono::milliseconds schedule_start_delay_max{0};
  /// Elastic admission (beyond TF): a worker the cluster spec does not list (no task index, or
  /// one past the spec's) that announces itself to the chief, holding the job's secret, is
  /// admitted as the next worker index, while fewer than this many admitted workers are not
  /// drained; its per-worker values are made before it takes closures. 0 = off: such a worker is
  /// refused (errc::permission_denied), as one past the cap is. Needs the chief's address in the
  /// cluster spec (workers announce themselves there).
  std::size_t max_elastic_workers = 0;

  friend bool operator==(const coordinator_options&, const coordinator_options&) = default;
};

/// Speculative re-runs of the slow closures of one worker function (beyond TF; off unless
/// cluster_coordinator::speculate turns them on for it). For functions that may run twice
/// (evaluation, reads, anything idempotent): both attempts run to the point the loser is cancelled,
/// so a function that updates variables could apply its updates twice.
struct speculation_options {
  /// A closure running longer than `multiplier` times the median of the function's recent runs
  /// (once at least `min_samples` of them finished) and at least `min_run_time` gets a backup
  /// attempt on another live worker with room, when nothing queued could take that room; the first
  /// outcome of the two is the closure's, and the other attempt is cancelled (its outcome ignored).
  /// Checked every coordinator_options::worker_probe_interval.
  double multiplier = 4;
  std::size_t min_samples = 8;
  std::chrono::milliseconds min_run_time{100};

  friend bool operator==(const speculation_options&, const speculation_options&) = default;
};

}  // namespace pscoro

// What a task's page shows and its JSON endpoint (/api/cluster) returns: one JSON document built
// when asked, on the metrics responder's thread, from what the registry holds and from the few
// facts it has no series for (who the task is, the scalars written through summary_writer, the
// newest checkpoint, recent warnings and errors). The chief's document is the cluster's (the job,
// every worker, every ps, the queue); any other task's is its own.
#pragma once

#include <pscoro/metrics.hpp>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace pscoro::metrics {

/// Who this process is, as the page names it.
struct task_view {
  std::string task;        ///< "chief:0", "ps:1"
  std::string role;        ///< "chief", "ps" or "worker"
  std::string chief_page;  ///< a server's link to the chief's page, when it knows where that is
  /// The chief: every ps and worker of the cluster, task name and address, in index order.
  std::vector<std::pair<std::string, std::string>> ps;
  std::vector<std::pair<std::string, std::string>> workers;
};

/// The facts of one process that the page shows and no registry series holds. Thread-safe.
class view_state {
 public:
  /// Points kept per scalar curve: past this, every other point goes and only every second new
  /// one is kept, so a curve keeps its whole shape in bounded memory.
  static constexpr std::size_t max_points = 512;
  /// Curves kept; scalars of further tags are left out.
  static constexpr std::size_t max_curves = 64;

  /// The task the page is about. A chief's view replaces a server's (a test that runs a whole
  /// cluster in one process shows the chief's) and starts its rates afresh; a server's replaces
  /// nothing.
  void set_task(task_view task);
  /// This server is `now` from here on, if it was `was` (a worker the chief admitted and gave an
  /// index).
  void rename_task(std::string_view was, std::string now);
  /// The chief admitted a worker beyond its cluster spec (elastic): the page lists it after the others.
  void add_worker(std::string task, std::string address);
  /// A server's link to the chief's page, as the chief's Hello gives it; nothing on the chief's own
  /// view (a test that runs a whole cluster in one process shows the chief's).
  void set_chief_page(std::string url);
  /// "running", "finished" or "failed".
  void set_job_state(std::string state);
  /// A scalar written through summary_writer.
  void record_scalar(std::string_view tag, std::int64_t step, double value);
  /// A checkpoint saved: its path, step, when it was saved and how long the save took.
  void note_checkpoint(std::string path, std::int64_t step, std::chrono::system_clock::time_point when,
                       double seconds);

  /// The document for the page and /api/cluster (docs/api.md gives its schema), from `served`'s
  /// series read now, the warnings and errors the log keeps, and this state. Rates come from the
  /// totals earlier calls saw.
  nlohmann::json document(const registry& served, std::chrono::system_clock::time_point now,
                          std::chrono::steady_clock::time_point steady_now);

 private:
  struct curve {
    std::vector<std::pair<std::int64_t, double>> points;
    std::size_t stride = 1;  // keep every stride-th scalar written
    std::size_t seen = 0;    // scalars written
    std::pair<std::int64_t, double> last{};
  };
  struct checkpoint_note {
    std::string path;
    std::int64_t step = 0;
    std::chrono::system_clock::time_point when;
    double seconds = 0;
  };
  // A per-second rate of a total, over the totals seen at the last requests (up to ten seconds
  // back): the endpoint is polled, so the rate needs no thread of its own. None until two requests
  // a second or more apart have seen the total.
  std::optional<double> rate(const std::string& key, double total, std::chrono::steady_clock::time_point now);

  std::mutex mutex_;
  task_view task_;
  std::string job_state_ = "running";
  std::chrono::system_clock::time_point started_ = std::chrono::system_clock::now();
  std::map<std::string, curve, std::less<>> curves_;
  std::optional<checkpoint_note> checkpoint_;
  std::map<std::string, std::deque<std::pair<std::chrono::steady_clock::time_point, double>>> totals_;
};

/// This process's view_state, which the chief, the servers, summary_writer and checkpoint_manager
/// fill and the metrics responder reads.
view_state& process_view();

/// The page: one self-contained HTML document (style and script inline, nothing fetched from
/// elsewhere) that draws /api/cluster and fetches it again every 1.5 s.
std::string_view page_html();

}  // namespace pscoro::metrics

#include "metrics/cluster_view.hpp"

#include "common/log.hpp"

#include <algorithm>
#include <cmath>

namespace pscoro::metrics {

namespace {

using json = nlohmann::json;

double unix_seconds(std::chrono::system_clock::time_point t) {
  return std::chrono::duration<double>(t.time_since_epoch()).count();
}

// A number JSON can carry: NaN and infinities (a diverged loss) become null.
json number(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

json optional_number(const std::optional<double>& v) { return v ? number(*v) : json(nullptr); }

// The series read at one moment, looked up by name and labels (a chief of many workers looks up
// several series per worker: by name first, then among that name's few label sets).
class series_index {
 public:
  explicit series_index(std::vector<sample> all) : all_(std::move(all)) {
    for (const auto& s : all_) by_name_[s.name].push_back(&s);
  }

  std::optional<double> get(std::string_view name, const labels& want = {}) const {
    const auto found = by_name_.find(name);
    if (found == by_name_.end()) return std::nullopt;
    for (const auto* s : found->second) {
      if (s->label_set == want) return s->value;
    }
    return std::nullopt;
  }
  double get_or(std::string_view name, const labels& want, double fallback) const {
    return get(name, want).value_or(fallback);
  }
  // The sum over every series of `name` (a family with labels, as a total).
  std::optional<double> total(std::string_view name) const {
    const auto found = by_name_.find(name);
    if (found == by_name_.end()) return std::nullopt;
    double sum = 0;
    for (const auto* s : found->second) sum += s->value;
    return sum;
  }
  const std::vector<sample>& all() const noexcept { return all_; }

 private:
  std::vector<sample> all_;
  std::map<std::string, std::vector<const sample*>, std::less<>> by_name_;
};

}  // namespace

void view_state::set_task(task_view task) {
  const std::lock_guard lock(mutex_);
  if (task.role != "chief" && !task_.task.empty()) return;
  task_ = std::move(task);
  if (task_.role == "chief") {
    job_state_ = "running";
    started_ = std::chrono::system_clock::now();
    totals_.clear();  // a new job's totals start again
  }
}

void view_state::rename_task(std::string_view was, std::string now) {
  const std::lock_guard lock(mutex_);
  if (task_.task == was) task_.task = std::move(now);
}

void view_state::add_worker(std::string task, std::string address) {
  const std::lock_guard lock(mutex_);
  if (task_.role == "chief") task_.workers.emplace_back(std::move(task), std::move(address));
}

void view_state::set_chief_page(std::string url) {
  const std::lock_guard lock(mutex_);
  if (task_.role != "chief") task_.chief_page = std::move(url);
}

void view_state::set_job_state(std::string state) {
  const std::lock_guard lock(mutex_);
  job_state_ = std::move(state);
}

void view_state::record_scalar(std::string_view tag, std::int64_t step, double value) {
  const std::lock_guard lock(mutex_);
  auto it = curves_.find(tag);
  if (it == curves_.end()) {
    if (curves_.size() >= max_curves) return;
    it = curves_.emplace(std::string(tag), curve{}).first;
  }
  auto& c = it->second;
  c.last = {step, value};
  if (c.seen++ % c.stride != 0) return;
  c.points.emplace_back(step, value);
  if (c.points.size() >= max_points) {
    std::size_t kept = 0;
    for (std::size_t i = 0; i < c.points.size(); i += 2) c.points[kept++] = c.points[i];
    c.points.resize(kept);
    c.stride *= 2;  // the points kept are those at multiples of the new stride, as later ones will be
  }
}

void view_state::note_checkpoint(std::string path, std::int64_t step, std::chrono::system_clock::time_point when,
                                 double seconds) {
  const std::lock_guard lock(mutex_);
  checkpoint_ = checkpoint_note{std::move(path), step, when, seconds};
}

std::optional<double> view_state::rate(const std::string& key, double total, std::chrono::steady_clock::time_point now) {
  auto& seen = totals_[key];
  if (seen.empty() || now - seen.back().first >= std::chrono::seconds(1)) seen.emplace_back(now, total);
  while (seen.size() > 2 && now - seen.front().first > std::chrono::seconds(10)) seen.pop_front();
  const auto& [first_time, first_total] = seen.front();
  const double seconds = std::chrono::duration<double>(now - first_time).count();
  if (seconds < 1) return std::nullopt;
  return std::max(0.0, total - first_total) / seconds;
}

json view_state::document(const registry& served, std::chrono::system_clock::time_point now,
                          std::chrono::steady_clock::time_point steady_now) {
  const series_index series(served.samples());
  std::uint64_t logged = 0;
  const auto problems = log::recent_problems(&logged);
  const std::lock_guard lock(mutex_);
  const bool chief = task_.role == "chief";
  json out;
  out["view"] = chief ? "chief" : "task";
  out["task"] = task_.task;
  out["role"] = task_.role;
  out["time"] = unix_seconds(now);
  out["chief_page"] = task_.chief_page.empty() ? json(nullptr) : json(task_.chief_page);
  out["process"] = {{"resident_memory_bytes", optional_number(series.get("process_resident_memory_bytes"))},
                    {"cpu_seconds", optional_number(series.get("process_cpu_seconds_total"))}};

  if (chief) {
    const double elapsed = std::max(0.0, std::chrono::duration<double>(now - started_).count());
    const auto step = series.get("pscoro_progress_step");
    const auto total = series.get("pscoro_progress_total_steps");
    std::optional<double> steps_per_second;
    if (step) steps_per_second = rate("step", *step, steady_now);
    std::optional<double> eta;
    if (step && total && *total > 0 && steps_per_second && *steps_per_second > 0) {
      eta = std::max(0.0, *total - *step) / *steps_per_second;
    }
    out["job"] = {{"state", job_state_},
                  {"started", unix_seconds(started_)},
                  {"elapsed_seconds", elapsed},
                  {"step", optional_number(step)},
                  {"total_steps", total && *total > 0 ? number(*total) : json(nullptr)},
                  {"steps_per_second", optional_number(steps_per_second)},
                  {"eta_seconds", optional_number(eta)}};

    json workers = json::array();
    for (const auto& [task, address] : task_.workers) {
      const labels worker{{"worker", task}};
      const auto up = series.get("pscoro_coordinator_worker_up", worker);
      const bool drained = series.get_or("pscoro_coordinator_worker_drained", worker, 0) > 0;
      workers.push_back(
          {{"task", task},
           {"address", address},
           {"state", drained ? "drained" : !up ? "unknown" : *up > 0 ? "up" : "down"},
           {"closures_succeeded",
            series.get_or("pscoro_coordinator_worker_closures_total", {{"outcome", "succeeded"}, {"worker", task}}, 0)},
           {"closures_failed",
            series.get_or("pscoro_coordinator_worker_closures_total", {{"outcome", "failed"}, {"worker", task}}, 0)},
           {"in_flight", series.get_or("pscoro_coordinator_worker_inflight_closures", worker, 0)},
           {"restarts", series.get_or("pscoro_coordinator_worker_restarts_total", worker, 0)},
           {"heartbeat_age_seconds", optional_number(series.get("pscoro_peer_heartbeat_age_seconds", {{"peer", task}}))}});
    }
    out["workers"] = std::move(workers);

    json ps = json::array();
    for (const auto& [task, address] : task_.ps) {
      const labels peer{{"peer", task}};
      const labels of_ps{{"ps", task}};
      std::optional<double> chief_requests;
      if (const auto sent = series.get("pscoro_peer_sent_frames_total", peer)) {
        chief_requests = rate("chief requests " + task, *sent, steady_now);
      }
      // What the ps reports of itself in its answers to the chief's heartbeats: every task's
      // requests, which the chief's own frames do not show.
      const auto served = series.get("pscoro_coordinator_ps_requests_total", of_ps);
      std::optional<double> requests;
      if (served) requests = rate("requests " + task, *served, steady_now);
      const auto memory = series.get("pscoro_coordinator_ps_resident_memory_bytes", of_ps);
      ps.push_back(
          {{"task", task},
           {"address", address},
           {"variables", series.get_or("pscoro_coordinator_ps_variables", of_ps, 0)},
           {"bytes", series.get_or("pscoro_coordinator_ps_variable_bytes", of_ps, 0)},
           {"held_variables", optional_number(series.get("pscoro_coordinator_ps_held_variables", of_ps))},
           {"held_bytes", optional_number(series.get("pscoro_coordinator_ps_held_bytes", of_ps))},
           {"resident_memory_bytes", memory && *memory > 0 ? number(*memory) : json(nullptr)},
           {"requests_total", optional_number(served)},
           {"requests_per_second", optional_number(requests)},
           {"chief_requests_per_second", optional_number(chief_requests)},
           {"heartbeat_age_seconds", optional_number(series.get("pscoro_peer_heartbeat_age_seconds", peer))}});
    }
    out["ps"] = std::move(ps);

    const auto scheduled = series.get("pscoro_coordinator_scheduled_closures_total");
    const auto done = series.get("pscoro_coordinator_closure_execution_seconds_count");
    out["queue"] = {
        {"queued", optional_number(series.get("pscoro_coordinator_queued_closures"))},
        {"in_flight", optional_number(series.get("pscoro_coordinator_inflight_closures"))},
        {"scheduled_total", optional_number(scheduled)},
        {"done_total", optional_number(done)},
        {"scheduled_per_second", scheduled ? optional_number(rate("scheduled", *scheduled, steady_now)) : json(nullptr)},
        {"done_per_second", done ? optional_number(rate("done", *done, steady_now)) : json(nullptr)}};
  } else {
    // Every counter and gauge of the task, for its own page; and a ps's requests per second.
    json all = json::array();
    for (const auto& s : series.all()) {
      json labels_object = json::object();
      for (const auto& [name, value] : s.label_set) labels_object[name] = value;
      all.push_back({{"name", s.name}, {"labels", std::move(labels_object)}, {"value", number(s.value)}});
    }
    out["series"] = std::move(all);
    if (task_.role == "ps") {
      const auto operations = series.total("pscoro_ps_operation_seconds_count");
      out["ps"] = {{"variables", optional_number(series.get("pscoro_ps_variables"))},
                   {"bytes", optional_number(series.get("pscoro_ps_held_bytes"))},
                   {"requests_per_second",
                    operations ? optional_number(rate("operations", *operations, steady_now)) : json(nullptr)}};
    }
  }

  json scalars = json::object();
  for (const auto& [tag, c] : curves_) {
    json points = json::array();
    for (const auto& [step, value] : c.points) points.push_back({step, number(value)});
    scalars[tag] = {{"points", std::move(points)}, {"last_step", c.last.first}, {"last_value", number(c.last.second)}};
  }
  out["scalars"] = std::move(scalars);

  out["checkpoint"] = checkpoint_ ? json{{"path", checkpoint_->path},
                                         {"step", checkpoint_->step},
                                         {"time", unix_seconds(checkpoint_->when)},
                                         {"seconds", number(checkpoint_->seconds)}}
                                  : json(nullptr);

  json listed = json::array();
  for (const auto& p : problems) {
    listed.push_back({{"time", unix_seconds(p.time)},
                      {"level", to_string(p.level)},
                      {"task", p.task},
                      {"message", p.message}});
  }
  out["problems"] = {{"logged", logged}, {"recent", std::move(listed)}};
  return out;
}

view_state& process_view() {
  static auto* the = new view_state;  // never destroyed: summaries may be written at exit
  return *the;
}

}  // namespace pscoro::metrics

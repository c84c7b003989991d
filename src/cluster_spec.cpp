#include <pscoro/cluster_spec.hpp>
#include <pscoro/error.hpp>

#include <fmt/format.h>
#include "runtime/text.hpp"
#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <cstdlib>

namespace pscoro {
namespace {

using json = nlohmann::json;

[[noreturn]] void invalid(std::string message) {
  throw error(errc::invalid_argument, std::move(message));
}

// nlohmann's messages start with "[json.exception.parse_error.101] "; the rest says where.
std::string without_json_prefix(const char* what) {
  std::string_view text(what);
  if (text.starts_with("[json.exception.")) {
    if (auto end = text.find("] "); end != std::string_view::npos) text.remove_prefix(end + 2);
  }
  return std::string(text);
}

json parse_json(std::string_view text, std::string_view source) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    // parse_error, and out_of_range for a number too large for a double ("1e999"): found by fuzzing.
    invalid(fmt::format("{} is not valid JSON: {}", source, without_json_prefix(e.what())));
  }
}

std::optional<int> parse_int(std::string_view text) {
  int value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty()) return std::nullopt;
  return value;
}

cluster_spec cluster_from_json(const json& cluster, std::string_view source) {
  if (!cluster.is_object()) {
    invalid(fmt::format("{}: `cluster` must be a dictionary mapping one or more job names to lists "
                        "of network addresses, got {}",
                        source, cluster.dump()));
  }
  cluster_spec spec;
  for (const auto& item : cluster.items()) {
    const std::string& job = item.key();
    const json& tasks = item.value();
    auto address_of = [&](const json& address, const std::string& where) {
      if (!address.is_string()) {
        invalid(fmt::format("{}: task address {} of job '{}' ({}) must be a string", source,
                            address.dump(), job, where));
      }
      return address.get<std::string>();
    };
    spec.add_job(job);
    if (tasks.is_array()) {
      for (std::size_t i = 0; i < tasks.size(); ++i) {
        spec.add_task(job, static_cast<int>(i), address_of(tasks[i], fmt::format("index {}", i)));
      }
    } else if (tasks.is_object()) {
      for (const auto& [key, address] : tasks.items()) {
        auto index = parse_int(key);
        if (!index || *index < 0) {
          invalid(fmt::format("{}: task index '{}' of job '{}' is not a non-negative integer",
                              source, key, job));
        }
        spec.add_task(job, *index, address_of(address, "index " + key));
      }
    } else {
      invalid(fmt::format("{}: the tasks for job '{}' must be a list or a dictionary from integers "
                          "to strings, got {}",
                          source, job, tasks.dump()));
    }
  }
  return spec;
}

}  // namespace

std::string task_name(std::string_view job, int index) { return fmt::format("{}:{}", job, index); }

cluster_spec::cluster_spec(
    std::initializer_list<std::pair<const std::string, std::vector<std::string>>> jobs)
    : cluster_spec(std::map<std::string, std::vector<std::string>>(jobs)) {}

cluster_spec::cluster_spec(const std::map<std::string, std::vector<std::string>>& jobs) {
  for (const auto& [job, addresses] : jobs) {
    add_job(job);
    for (std::size_t i = 0; i < addresses.size(); ++i) add_task(job, static_cast<int>(i), addresses[i]);
  }
}

void cluster_spec::add_job(const std::string& job) { jobs_[job]; }

void cluster_spec::add_task(const std::string& job, int index, std::string address) {
  if (index < 0) invalid(fmt::format("task index {} of job '{}' is negative", index, job));
  jobs_[job][index] = std::move(address);
}

std::vector<std::string> cluster_spec::jobs() const {
  std::vector<std::string> names;
  for (const auto& entry : jobs_) names.push_back(entry.first);
  return names;
}

bool cluster_spec::has_job(std::string_view job) const { return jobs_.find(job) != jobs_.end(); }

const std::map<int, std::string>& cluster_spec::tasks_of(std::string_view job) const {
  auto it = jobs_.find(job);
  if (it == jobs_.end()) invalid(fmt::format("No such job in cluster: '{}'", job));
  return it->second;
}

std::size_t cluster_spec::num_tasks(std::string_view job) const { return tasks_of(job).size(); }

std::vector<int> cluster_spec::task_indices(std::string_view job) const {
  std::vector<int> indices;
  for (const auto& entry : tasks_of(job)) indices.push_back(entry.first);
  return indices;
}

const std::string& cluster_spec::task_address(std::string_view job, int index) const {
  const auto& tasks = tasks_of(job);
  auto it = tasks.find(index);
  if (it == tasks.end()) invalid(fmt::format("No task with index {} in job '{}'", index, job));
  return it->second;
}

std::vector<std::optional<std::string>> cluster_spec::job_tasks(std::string_view job) const {
  const auto& tasks = tasks_of(job);
  std::vector<std::optional<std::string>> out(tasks.empty() ? 0 : tasks.rbegin()->first + 1);
  for (const auto& [index, address] : tasks) out[index] = address;
  return out;
}

namespace {

bool is_dense(const std::map<int, std::string>& tasks) {
  return tasks.empty() ? false : tasks.rbegin()->first + 1 == static_cast<int>(tasks.size());
}

}  // namespace

std::string cluster_spec::to_string() const {
  std::vector<std::string> parts;
  for (const auto& [job, tasks] : jobs_) {
    std::vector<std::string> entries;
    const bool dense = is_dense(tasks);
    for (const auto& [index, address] : tasks) {
      entries.push_back(dense ? fmt::format("'{}'", address) : fmt::format("{}: '{}'", index, address));
    }
    const auto joined = runtime::join(entries, ", ");
    parts.push_back(dense ? fmt::format("'{}': [{}]", job, joined) : fmt::format("'{}': {{{}}}", job, joined));
  }
  std::string out = "ClusterSpec({";  // appended: see to_string(shape) on g++ 12's -Wrestrict
  out += runtime::join(parts, ", ");
  out += "})";
  return out;
}

std::string cluster_spec::to_json() const {
  json out = json::object();
  for (const auto& [job, tasks] : jobs_) {
    json& entry = out[job];
    if (is_dense(tasks)) {
      entry = json::array();
      for (const auto& task : tasks) entry.push_back(task.second);
    } else {
      entry = json::object();
      for (const auto& [index, address] : tasks) entry[std::to_string(index)] = address;
    }
  }
  return out.dump();
}

cluster_spec cluster_spec::from_json(std::string_view text, std::string_view source) {
  return cluster_from_json(parse_json(text, source), source);
}

tf_config_cluster_resolver tf_config_cluster_resolver::from_environment() {
  const char* value = std::getenv("TF_CONFIG");
  return from_json(value ? value : "", "TF_CONFIG");
}

tf_config_cluster_resolver tf_config_cluster_resolver::from_json(std::string_view text,
                                                                 std::string_view source) {
  // TF: json.loads(os.environ.get('TF_CONFIG', '{}')); an empty variable is treated as unset.
  const json config = text.find_first_not_of(" \t\r\n") == std::string_view::npos
                          ? json::object()
                          : parse_json(text, source);
  if (!config.is_object()) {
    invalid(fmt::format("{} must be a JSON object, got {}", source, config.dump()));
  }
  pscoro::cluster_spec spec;
  if (auto it = config.find("cluster"); it != config.end()) spec = cluster_from_json(*it, source);

  std::string task_type;
  std::optional<int> task_id;
  if (auto task = config.find("task"); task != config.end()) {
    if (!task->is_object()) invalid(fmt::format("{}: `task` must be an object, got {}", source, task->dump()));
    if (auto type = task->find("type"); type != task->end()) {
      // TF casts with str(): a number becomes its decimal text.
      task_type = type->is_string() ? type->get<std::string>() : type->dump();
    }
    if (auto index = task->find("index"); index != task->end()) {
      if (index->is_number_integer()) {
        task_id = index->get<int>();
      } else if (auto parsed = index->is_string() ? parse_int(index->get<std::string>()) : std::nullopt) {
        task_id = *parsed;
      } else {
        invalid(fmt::format("{}: task index {} is not an integer", source, index->dump()));
      }
    }
  }
  std::string rpc_layer;
  if (auto it = config.find("rpc_layer"); it != config.end() && it->is_string()) rpc_layer = *it;

  tf_config_cluster_resolver resolver(std::move(spec), std::move(task_type), task_id, std::move(rpc_layer));
  if (auto it = config.find("environment"); it != config.end() && it->is_string()) resolver.environment_ = *it;
  if (auto it = config.find("session_master"); it != config.end() && it->is_string()) {
    resolver.session_master_ = *it;
  }
  return resolver;
}

std::string tf_config_cluster_resolver::master() const {
  if (!session_master_.empty()) return session_master_;
  const auto& spec = cluster_spec();
  const auto jobs = spec.jobs();
  if (jobs.empty() || (jobs.size() == 1 && spec.num_tasks(jobs.front()) == 1)) return "";
  const auto& address = spec.task_address(task_type(), task_id().value_or(0));
  return rpc_layer().empty() ? address : rpc_layer() + "://" + address;
}

void validate_parameter_server_cluster(const cluster_spec& spec, std::string_view task_type,
                                       std::optional<int> task_id) {
  static constexpr std::string_view allowed[] = {"chief", "worker", "evaluator", "ps"};
  auto is_allowed = [](std::string_view job) {
    return std::find(std::begin(allowed), std::end(allowed), job) != std::end(allowed);
  };
  if (spec.empty()) invalid("Cluster spec must be non-empty.");
  for (const auto& job : spec.jobs()) {
    if (!is_allowed(job)) {
      invalid(fmt::format("Disallowed task type found in cluster spec: '{}'. Allowed types are "
                          "('chief', 'worker', 'evaluator', 'ps') and the cluster spec is {}.",
                          job, spec.to_string()));
    }
  }
  if (!task_type.empty() && !is_allowed(task_type)) {
    invalid(fmt::format("Unrecognized task_type: {}, valid task types are: ('chief', 'worker', "
                        "'evaluator', 'ps')",
                        task_type));
  }
  if (!task_type.empty() && !spec.has_job(task_type) && task_type != "evaluator") {
    invalid(fmt::format("`task_type` '{}' not found in cluster_spec.", task_type));
  }
  if (spec.has_job("chief") && spec.num_tasks("chief") > 1) invalid("There must be at most one 'chief' job.");
  if (spec.has_job("evaluator") && spec.num_tasks("evaluator") > 1) {
    invalid("There must be at most one 'evaluator' job.");
  }
  if (!task_type.empty() && spec.has_job(task_type)) {
    if (!task_id) invalid(fmt::format("`task_id` is missing for task type '{}'.", task_type));
    const auto indices = spec.task_indices(task_type);
    if (*task_id < 0 || std::find(indices.begin(), indices.end(), *task_id) == indices.end()) {
      invalid(fmt::format("The `task_id` {} exceeds the maximum id of {} (job '{}' has tasks {}).",
                          *task_id, indices.empty() ? -1 : indices.back(), task_type,
                          runtime::join(indices, ", ")));
    }
  }
  if (!spec.has_job("ps") || spec.num_tasks("ps") < 1) invalid("There must be at least one ps.");
  if (!spec.has_job("worker") || spec.num_tasks("worker") < 1) invalid("There must be at least one worker.");
}

}  // namespace pscoro

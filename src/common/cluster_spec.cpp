#include <pscoro/cluster_spec.hpp>
#include <pscoro/error.hpp>

#include "common/log.hpp"
#include "common/text.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <limits>

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

// TF_CONFIG's task.index, a number or its decimal text (TF casts with int()), between 0 and
// max_task_index: anything else is refused as written, never wrapped into an int.
int task_index_of(const json& index, std::string_view source) {
  std::optional<std::int64_t> value;  // none: too large even for 64 bits
  if (index.is_number_unsigned()) {
    const auto u = index.get<std::uint64_t>();
    if (u <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) value = static_cast<std::int64_t>(u);
  } else if (index.is_number_integer()) {
    value = index.get<std::int64_t>();
  } else if (index.is_string()) {
    const auto& text = index.get_ref<const std::string&>();
    std::int64_t parsed = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), parsed);
    if (text.empty() || end != text.data() + text.size() || (ec != std::errc() && ec != std::errc::result_out_of_range)) {
      invalid(fmt::format("{}: task index {} is not an integer", source, index.dump()));
    }
    if (ec == std::errc()) value = parsed;
  } else {
    invalid(fmt::format("{}: task index {} is not an integer", source, index.dump()));
  }
  if (!value || *value < 0 || *value > cluster_spec::max_task_index) {
    invalid(fmt::format("{}: task index {} is out of range: a task index is 0 to {}", source, index.dump(),
                        cluster_spec::max_task_index));
  }
  return static_cast<int>(*value);
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
        if (*index > cluster_spec::max_task_index) {
          invalid(fmt::format("{}: task index {} of job '{}' is above {}, the largest pscoro accepts", source, key,
                              job, cluster_spec::max_task_index));
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

// TF's format_master_url: "<rpc_layer>://<address>", or the address alone without an rpc layer.
std::string format_master_url(std::string_view address, std::string_view rpc_layer) {
  return rpc_layer.empty() ? std::string(address) : fmt::format("{}://{}", rpc_layer, address);
}

// TF_CONFIG's "unset": no variable, an empty one, or one of white space only.
bool is_blank(std::string_view text) { return text.find_first_not_of(" \t\r\n") == std::string_view::npos; }

}  // namespace

std::string task_name(std::string_view job, int index) {
  return index < 0 ? fmt::format("{}:unlisted", job) : fmt::format("{}:{}", job, index);
}

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
  if (index > max_task_index) {
    invalid(fmt::format("task index {} of job '{}' is above {}, the largest pscoro accepts", index, job,
                        max_task_index));
  }
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
    const auto joined = common::join(entries, ", ");
    parts.push_back(dense ? fmt::format("'{}': [{}]", job, joined) : fmt::format("'{}': {{{}}}", job, joined));
  }
  std::string out = "ClusterSpec({";  // appended: see to_string(shape) on g++ 12's -Wrestrict
  out += common::join(parts, ", ");
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

tf_config_cluster_resolver tf_config_cluster_resolver::from_environment(const tf_config_overrides& overrides) {
  const char* value = std::getenv("TF_CONFIG");
  return from_json(value ? value : "", "TF_CONFIG", overrides);
}

tf_config_cluster_resolver tf_config_cluster_resolver::from_json(std::string_view text, std::string_view source,
                                                                 const tf_config_overrides& overrides) {
  // TF: json.loads(os.environ.get('TF_CONFIG', '{}')); an empty variable is treated as unset.
  const json config = is_blank(text) ? json::object() : parse_json(text, source);
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
    if (auto index = task->find("index"); index != task->end()) task_id = task_index_of(*index, source);
  }
  std::string rpc_layer;
  if (auto it = config.find("rpc_layer"); it != config.end() && it->is_string()) rpc_layer = *it;

  if (overrides.task_type) task_type = *overrides.task_type;
  if (overrides.task_id) task_id = *overrides.task_id;
  if (overrides.rpc_layer) rpc_layer = *overrides.rpc_layer;
  tf_config_cluster_resolver resolver(std::move(spec), std::move(task_type), task_id, std::move(rpc_layer));
  if (auto it = config.find("environment"); it != config.end() && it->is_string()) resolver.environment_ = *it;
  if (overrides.environment) resolver.environment_ = *overrides.environment;
  if (auto it = config.find("session_master"); it != config.end() && it->is_string()) {
    resolver.session_master_ = *it;
  }
  return resolver;
}

std::string tf_config_cluster_resolver::master(std::optional<std::string_view> task_type, std::optional<int> task_id,
                                               std::optional<std::string_view> rpc_layer) const {
  if (!session_master_.empty()) return session_master_;
  const auto& spec = cluster_spec();
  const auto jobs = spec.jobs();
  if (jobs.empty() || (jobs.size() == 1 && spec.num_tasks(jobs.front()) == 1)) return "";
  const auto address =
      spec.task_address(task_type.value_or(this->task_type()), task_id.value_or(this->task_id().value_or(0)));
  return format_master_url(address, rpc_layer.value_or(this->rpc_layer()));
}

// Slurm: TF's SlurmClusterResolver over a map of variables. TF's parsers (expand_hostlist,
// expand_tasks_per_node) are followed, but stricter: what TF's zip() or int() would let through
// (a hostlist and task counts of different lengths, "+1", a descending range) is an error here.
namespace {

using slurm_variables = slurm_cluster_resolver::variables;

constexpr std::string_view slurm_procid = "SLURM_PROCID";
constexpr std::string_view slurm_step_num_tasks = "SLURM_STEP_NUM_TASKS";
constexpr std::string_view slurm_step_nodelist = "SLURM_STEP_NODELIST";
constexpr std::string_view slurm_step_tasks_per_node = "SLURM_STEP_TASKS_PER_NODE";
constexpr std::string_view pscoro_slurm_jobs = "PSCORO_SLURM_JOBS";
constexpr std::string_view pscoro_slurm_port_base = "PSCORO_SLURM_PORT_BASE";
constexpr int tf_slurm_port_base = 8888;

// Not a limit of Slurm's: a bound that keeps a malformed hostlist ("n[0-99999999999]") or task
// count from expanding without end. No step has a million tasks.
constexpr std::size_t max_slurm_tasks = std::size_t{1} << 20;
constexpr int max_port = 65535;

// `NAME="value"`: how an error names the variable it could not use (the value escaped).
std::string variable_text(std::string_view name, std::string_view value) {
  return fmt::format("{}={:?}", name, value);
}

// `NAME="value" is not <what>: <why>`.
[[noreturn]] void not_a(std::string_view name, std::string_view value, std::string_view what, std::string_view why) {
  invalid(fmt::format("{} is not {}: {}", variable_text(name, value), what, why));
}

// TF's _get_slurm_var, with its message.
std::string_view slurm_variable(const slurm_variables& environment, std::string_view name) {
  auto it = environment.find(name);
  if (it == environment.end()) {
    invalid(fmt::format("{} not found in environment. Not running inside a SLURM step?", name));
  }
  return it->second;
}

// Decimal digits only (from_chars alone would take a '-'); nullopt when empty or too large.
template <class Int>
std::optional<Int> parse_digits(std::string_view text) {
  if (text.empty() || text.find_first_not_of("0123456789") != std::string_view::npos) return std::nullopt;
  Int value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

std::optional<int> parse_positive(std::string_view text) {
  auto value = parse_digits<int>(text);
  return value && *value > 0 ? value : std::nullopt;
}

// `text` split at `separator`; "" is one empty part.
std::vector<std::string_view> split(std::string_view text, char separator) {
  std::vector<std::string_view> parts;
  for (std::size_t start = 0;;) {
    const auto end = text.find(separator, start);
    parts.push_back(text.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start));
    if (end == std::string_view::npos) return parts;
    start = end + 1;
  }
}

constexpr std::string_view hostlist_kind = "a Slurm hostlist (like \"node[1-3,07],login\")";

// Appends the hosts of one hostlist entry ("node[1-3,07]", "login", "node[1-2]-ib") to `hosts`.
// A range keeps the width of its first number ("o[009-011]": o009, o010, o011), as TF does. TF
// allows no suffix after the range; Slurm writes one for "node1-ib,node2-ib", so pscoro does.
void expand_hostlist_entry(std::string_view entry, std::string_view name, std::string_view list,
                           std::vector<std::string>& hosts) {
  auto fail = [&](const std::string& why) { not_a(name, list, hostlist_kind, why); };
  if (entry.empty()) return fail("it has an empty host name (a comma at an end, or two in a row)");
  if (entry.find_first_of(" \t\r\n") != std::string_view::npos) {
    return fail(fmt::format("host name '{}' contains white space", entry));
  }
  const auto open = entry.find('[');
  if (open == std::string_view::npos) {
    hosts.emplace_back(entry);
    return;
  }
  const auto close = entry.find(']', open);  // expand_hostlist checked that there is one
  const auto prefix = entry.substr(0, open);
  const auto ranges = entry.substr(open + 1, close - open - 1);
  const auto suffix = entry.substr(close + 1);
  if (suffix.find('[') != std::string_view::npos) {
    return fail(fmt::format("'{}' has more than one range (TF and pscoro expand one)", entry));
  }
  for (const auto range : split(ranges, ',')) {
    const auto dash = range.find('-');
    const auto first_text = range.substr(0, dash);
    const auto last_text = dash == std::string_view::npos ? first_text : range.substr(dash + 1);
    const auto first = parse_digits<std::uint64_t>(first_text);
    const auto last = parse_digits<std::uint64_t>(last_text);
    if (!first || !last) {
      return fail(fmt::format("'{}' in '{}' is not a number or a range of numbers (N-M)", range, entry));
    }
    if (*last < *first) return fail(fmt::format("range '{}' in '{}' descends", range, entry));
    if (*last - *first >= max_slurm_tasks - hosts.size()) {
      return fail(fmt::format("it names more than {} hosts", max_slurm_tasks));
    }
    // Counted from 0: `number <= *last` would never fail for a last of 2^64 - 1.
    for (std::uint64_t offset = 0; offset <= *last - *first; ++offset) {
      hosts.push_back(fmt::format("{}{:0{}}{}", prefix, *first + offset, first_text.size(), suffix));
    }
  }
}

// TF's expand_hostlist: "n[1-2],m5,o[009-010]" is n1, n2, m5, o009, o010, in that order.
std::vector<std::string> expand_hostlist(std::string_view name, std::string_view list) {
  if (list.empty()) not_a(name, list, hostlist_kind, "it is empty");
  std::vector<std::string> hosts;
  bool in_range = false;
  std::size_t start = 0;
  for (std::size_t i = 0; i <= list.size(); ++i) {
    const char c = i < list.size() ? list[i] : ',';
    if (c == '[') {
      if (in_range) not_a(name, list, hostlist_kind, "a '[' inside a range");
      in_range = true;
    } else if (c == ']') {
      if (!in_range) not_a(name, list, hostlist_kind, "a ']' closes no range");
      in_range = false;
    } else if (c == ',' && !in_range) {
      expand_hostlist_entry(list.substr(start, i - start), name, list, hosts);
      start = i + 1;
    }
  }
  if (in_range) not_a(name, list, hostlist_kind, "a '[' is not closed");
  auto sorted = hosts;
  std::sort(sorted.begin(), sorted.end());
  if (auto twice = std::adjacent_find(sorted.begin(), sorted.end()); twice != sorted.end()) {
    not_a(name, list, hostlist_kind, fmt::format("it names host '{}' twice", *twice));
  }
  return hosts;
}

// TF's expand_tasks_per_node: "3(x2),2,1" is 3, 3, 2, 1, one count per node of `hosts`.
std::vector<int> expand_tasks_per_node(std::string_view name, std::string_view text,
                                       const std::vector<std::string>& hosts, std::string_view hosts_text) {
  static constexpr std::string_view kind = "a Slurm tasks-per-node list (like \"2(x3),1\")";
  std::vector<std::pair<int, int>> runs;  // (tasks, nodes)
  std::uint64_t nodes = 0;                // at most text.size() runs of at most INT_MAX: no overflow
  for (const auto part : split(text, ',')) {
    const auto open = part.find('(');
    const auto tasks = parse_positive(part.substr(0, open));
    std::optional<int> repeat = 1;
    if (open != std::string_view::npos) {
      const auto times = part.substr(open);
      repeat = times.starts_with("(x") && times.ends_with(")") ? parse_positive(times.substr(2, times.size() - 3))
                                                                 : std::nullopt;
    }
    if (!tasks || !repeat) {
      not_a(name, text, kind, fmt::format("'{}' is not N or N(xM), with N and M positive integers", part));
    }
    runs.emplace_back(*tasks, *repeat);
    nodes += static_cast<std::uint64_t>(*repeat);
  }
  if (nodes != hosts.size()) {
    invalid(fmt::format("{} gives task counts for {} nodes but {} names {}", variable_text(name, text), nodes,
                        hosts_text, hosts.size()));
  }
  std::vector<int> counts;
  for (const auto& [tasks, repeat] : runs) counts.insert(counts.end(), static_cast<std::size_t>(repeat), tasks);
  return counts;
}

// Why `job` with `count` tasks cannot be a job, or nullopt when it can. Job names are TF's
// ([a-zA-Z][_a-zA-Z0-9]*, what a device name "/job:<name>" allows).
std::optional<std::string> job_problem(std::string_view job, std::optional<int> count, std::string_view count_text) {
  auto is_alpha = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); };
  auto is_name_char = [&](char c) { return is_alpha(c) || (c >= '0' && c <= '9') || c == '_'; };
  if (job.empty() || !is_alpha(job.front()) || !std::all_of(job.begin(), job.end(), is_name_char)) {
    return fmt::format("'{}' is not a job name (a letter, then letters, digits or '_')", job);
  }
  if (!count || *count <= 0) {
    return fmt::format("task count '{}' of job '{}' is not a positive integer", count_text, job);
  }
  return std::nullopt;
}

// PSCORO_SLURM_JOBS: "chief:1,ps:2,worker:4", strictly (no spaces, no empty entries, no job twice).
std::map<std::string, int> parse_slurm_jobs(std::string_view name, std::string_view text) {
  static constexpr std::string_view kind = "a list of job:count (like \"chief:1,ps:2,worker:4\")";
  std::map<std::string, int> jobs;
  for (const auto item : split(text, ',')) {
    const auto colon = item.find(':');
    if (colon == std::string_view::npos) not_a(name, text, kind, fmt::format("'{}' is not job:count", item));
    const auto job = item.substr(0, colon);
    const auto count_text = item.substr(colon + 1);
    const auto count = parse_positive(count_text);
    if (auto problem = job_problem(job, count, count_text)) not_a(name, text, kind, *problem);
    if (!jobs.emplace(job, *count).second) not_a(name, text, kind, fmt::format("job '{}' appears twice", job));
  }
  return jobs;
}

std::string jobs_text(const std::map<std::string, int>& jobs) {
  std::vector<std::string> items;
  for (const auto& [job, count] : jobs) items.push_back(fmt::format("{}:{}", job, count));
  return common::join(items, ",");
}

}  // namespace

slurm_cluster_resolver slurm_cluster_resolver::from_environment(const slurm_options& options) {
  variables environment;
  for (const auto name : {slurm_procid, slurm_step_num_tasks, slurm_step_nodelist, slurm_step_tasks_per_node,
                          pscoro_slurm_jobs, pscoro_slurm_port_base}) {
    if (const char* value = std::getenv(std::string(name).c_str())) environment.emplace(name, value);
  }
  return from_variables(environment, options);
}

slurm_cluster_resolver slurm_cluster_resolver::from_variables(const variables& environment,
                                                              const slurm_options& options) {
  // TF's order: the rank, the jobs, then the nodes and their tasks.
  const auto rank_text = slurm_variable(environment, slurm_procid);
  const auto rank = parse_digits<int>(rank_text);
  if (!rank) not_a(slurm_procid, rank_text, "a task rank", "it must be a non-negative integer");
  int port_base = tf_slurm_port_base;
  if (options.port_base) {
    port_base = *options.port_base;
    if (port_base < 1 || port_base > max_port) {
      invalid(fmt::format("slurm_options::port_base {} is not a port (1 to {})", port_base, max_port));
    }
  } else if (auto it = environment.find(pscoro_slurm_port_base); it != environment.end() && !it->second.empty()) {
    const auto port = parse_positive(it->second);
    if (!port || *port > max_port) {
      not_a(pscoro_slurm_port_base, it->second, "a port", fmt::format("it must be an integer from 1 to {}", max_port));
    }
    port_base = *port;
  }

  // Explicit jobs, else PSCORO_SLURM_JOBS, else pscoro's default (TF's, every task a worker,
  // has no ps to train with).
  std::map<std::string, int> jobs;
  std::string jobs_source;
  if (!options.jobs.empty()) {
    for (const auto& [job, count] : options.jobs) {
      if (auto problem = job_problem(job, count, std::to_string(count))) {
        invalid(fmt::format("slurm_options::jobs: {}", *problem));
      }
    }
    jobs = options.jobs;
    jobs_source = fmt::format("slurm_options::jobs {}", jobs_text(jobs));
  } else if (auto it = environment.find(pscoro_slurm_jobs); it != environment.end() && !it->second.empty()) {
    jobs = parse_slurm_jobs(pscoro_slurm_jobs, it->second);
    jobs_source = variable_text(pscoro_slurm_jobs, it->second);
  } else {
    const auto num_tasks_text = slurm_variable(environment, slurm_step_num_tasks);
    const auto num_tasks = parse_positive(num_tasks_text);
    if (!num_tasks) not_a(slurm_step_num_tasks, num_tasks_text, "a number of tasks", "it must be a positive integer");
    if (*num_tasks < 3) {
      invalid(fmt::format("{} is too few tasks for pscoro's default jobs (chief:1,ps:1 and at least one worker): "
                          "set {}",
                          variable_text(slurm_step_num_tasks, num_tasks_text), pscoro_slurm_jobs));
    }
    jobs = {{"chief", 1}, {"ps", 1}, {"worker", *num_tasks - 2}};
    jobs_source = variable_text(slurm_step_num_tasks, num_tasks_text);
  }

  const auto nodelist = slurm_variable(environment, slurm_step_nodelist);
  const auto hosts = expand_hostlist(slurm_step_nodelist, nodelist);
  const auto hosts_text = variable_text(slurm_step_nodelist, nodelist);
  std::vector<int> tasks_per_node;
  std::string layout_source;
  if (options.tasks_per_node) {
    if (*options.tasks_per_node < 1) {
      invalid(fmt::format("slurm_options::tasks_per_node {} is not a positive task count", *options.tasks_per_node));
    }
    tasks_per_node.assign(hosts.size(), *options.tasks_per_node);
    layout_source = fmt::format("{} with tasks_per_node {}", hosts_text, *options.tasks_per_node);
  } else {
    const auto text = slurm_variable(environment, slurm_step_tasks_per_node);
    tasks_per_node = expand_tasks_per_node(slurm_step_tasks_per_node, text, hosts, hosts_text);
    layout_source = fmt::format("{} with {}", hosts_text, variable_text(slurm_step_tasks_per_node, text));
  }

  std::int64_t num_tasks = 0;
  for (std::size_t node = 0; node < hosts.size(); ++node) {
    const int count = tasks_per_node[node];
    if (count - 1 > max_port - port_base) {
      invalid(fmt::format("{} puts {} tasks on node '{}': their ports, {} to {}, pass {}", layout_source, count,
                          hosts[node], port_base, std::int64_t{port_base} + count - 1, max_port));
    }
    num_tasks += count;
  }
  if (num_tasks > static_cast<std::int64_t>(max_slurm_tasks)) {
    invalid(fmt::format("{} places {} tasks, more than pscoro's limit of {}", layout_source, num_tasks,
                        max_slurm_tasks));
  }
  std::int64_t requested = 0;
  for (const auto& job : jobs) requested += job.second;
  if (requested != num_tasks) {
    invalid(fmt::format("Requested {} tasks but only {} were assigned: {} asks for {}, {} places {}", requested,
                        num_tasks, jobs_source, requested, layout_source, num_tasks));
  }
  if (*rank >= num_tasks) {
    not_a(slurm_procid, rank_text, "a rank of this step",
          fmt::format("it has {} tasks, ranks 0 to {} ({})", num_tasks, num_tasks - 1, layout_source));
  }

  // A node's tasks take consecutive ranks and ports (srun's block distribution); the ranks are
  // dealt to the jobs in name order.
  std::vector<std::string> addresses;
  for (std::size_t node = 0; node < hosts.size(); ++node) {
    for (int i = 0; i < tasks_per_node[node]; ++i) {
      addresses.push_back(fmt::format("{}:{}", hosts[node], port_base + i));
    }
  }
  pscoro::cluster_spec spec;
  std::string task_type;
  int task_id = 0;
  int first = 0;
  for (const auto& [job, count] : jobs) {
    spec.add_job(job);
    for (int i = 0; i < count; ++i) spec.add_task(job, i, addresses[static_cast<std::size_t>(first + i)]);
    if (*rank >= first && *rank < first + count) {
      task_type = job;
      task_id = *rank - first;
    }
    first += count;
  }
  return {std::move(spec), std::move(task_type), task_id, options.rpc_layer, *rank};
}

std::string slurm_cluster_resolver::master() const { return master(task_type(), task_id().value_or(0)); }

std::string slurm_cluster_resolver::master(std::string_view task_type, int task_id, std::string_view rpc_layer) const {
  return format_master_url(cluster_spec().task_address(task_type, task_id),
                           rpc_layer.empty() ? std::string_view(this->rpc_layer()) : rpc_layer);
}

namespace {
simple_cluster_resolver resolve_from_environment() {
  if (const char* tf_config = std::getenv("TF_CONFIG"); tf_config != nullptr && !is_blank(tf_config)) {
    return tf_config_cluster_resolver::from_json(tf_config, "TF_CONFIG");
  }
  if (std::getenv(std::string(slurm_procid).c_str()) != nullptr) return slurm_cluster_resolver::from_environment();
  invalid(fmt::format("No cluster configuration: neither TF_CONFIG nor {} is set (pscoro-launch and Kubeflow set "
                      "TF_CONFIG, srun sets {})",
                      slurm_procid, slurm_procid));
}
}  // namespace

simple_cluster_resolver auto_cluster_resolver() {
  auto resolver = resolve_from_environment();
  // The environment says which task this process is: its lines say so from here on, before a
  // server or a chief starts (a chief writing its training data first, say).
  if (!resolver.task_type().empty() && resolver.task_id()) {
    log::set_task_if_unset(task_name(resolver.task_type(), *resolver.task_id()));
  }
  return resolver;
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
                          common::join(indices, ", ")));
    }
  }
  if (!spec.has_job("ps") || spec.num_tasks("ps") < 1) invalid("There must be at least one ps.");
  if (!spec.has_job("worker") || spec.num_tasks("worker") < 1) invalid("There must be at least one worker.");
}

}  // namespace pscoro

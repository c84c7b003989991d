// Which tasks make up a cluster and where they listen: TF's ClusterSpec and cluster resolvers.
//
// A cluster_spec maps job names ("chief", "ps", "worker", "evaluator") to tasks, each an index and a
// "host:port" address; tasks may be dense (0..n-1) or sparse (any indices), as in TF_CONFIG.
// tf_config_cluster_resolver reads TF_CONFIG exactly as TensorFlow does, so Kubernetes TFJob
// deployments keep their configuration; slurm_cluster_resolver lays a Slurm job step out as TF's
// SlurmClusterResolver does; auto_cluster_resolver() picks whichever of the two the environment
// configures, so one binary runs under pscoro-launch, Kubernetes and srun.
#pragma once

#include <pscoro/config.hpp>

#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace pscoro {

class PSCORO_API cluster_spec {
 public:
  cluster_spec() = default;
  /// The dense form: task i of each job listens at `jobs[job][i]`.
  cluster_spec(std::initializer_list<std::pair<const std::string, std::vector<std::string>>> jobs);
  explicit cluster_spec(const std::map<std::string, std::vector<std::string>>& jobs);

  /// The largest task index a spec holds (a million tasks per job): far beyond any cluster, and a
  /// bound on what `job_tasks()` allocates for a sparse spec (`{"ps": {"33333300": ...}}`).
  static constexpr int max_task_index = (1 << 20) - 1;

  /// Adds (or replaces) task `index` of `job`; an empty task list is `add_job`. An index below 0 or
  /// above max_task_index is errc::invalid_argument.
  void add_task(const std::string& job, int index, std::string address);
  /// Adds a job with no tasks (TF allows `"worker": []`).
  void add_job(const std::string& job);

  /// Job names, sorted.
  std::vector<std::string> jobs() const;
  bool has_job(std::string_view job) const;
  /// Number of tasks of `job` (sparse count); throws errc::invalid_argument for an unknown job.
  std::size_t num_tasks(std::string_view job) const;
  /// Task indices of `job`, ascending.
  std::vector<int> task_indices(std::string_view job) const;
  /// Address of task `index` of `job`; throws errc::invalid_argument when there is none.
  const std::string& task_address(std::string_view job, int index) const;
  /// Addresses of `job` up to its largest index, with empty entries for missing tasks.
  std::vector<std::optional<std::string>> job_tasks(std::string_view job) const;

  bool empty() const noexcept { return jobs_.empty(); }
  explicit operator bool() const noexcept { return !empty(); }
  friend bool operator==(const cluster_spec&, const cluster_spec&) = default;

  /// TF's repr: "ClusterSpec({'ps': ['ps0:2222'], 'worker': {1: 'w1:2222'}})".
  std::string to_string() const;
  /// The TF_CONFIG "cluster" object: a list per dense job, an object keyed by index otherwise.
  std::string to_json() const;
  /// Parses a TF_CONFIG "cluster" object; `source` names the input in error messages.
  static cluster_spec from_json(std::string_view json, std::string_view source = "cluster spec");

 private:
  const std::map<int, std::string>& tasks_of(std::string_view job) const;
  std::map<std::string, std::map<int, std::string>, std::less<>> jobs_;
};

/// "worker:1": how pscoro names a task in messages and logs; "worker:unlisted" for a negative index
/// (an elastic worker the chief has not admitted yet).
PSCORO_API std::string task_name(std::string_view job, int index);

/// A resolver over values given in code (TF's SimpleClusterResolver).
class PSCORO_API simple_cluster_resolver {
 public:
  simple_cluster_resolver(pscoro::cluster_spec spec, std::string task_type = {},
                          std::optional<int> task_id = std::nullopt, std::string rpc_layer = {})
      : spec_(std::move(spec)),
        task_type_(std::move(task_type)),
        task_id_(task_id),
        rpc_layer_(std::move(rpc_layer)) {}

  const pscoro::cluster_spec& cluster_spec() const noexcept { return spec_; }
  const std::string& task_type() const noexcept { return task_type_; }
  std::optional<int> task_id() const noexcept { return task_id_; }
  const std::string& rpc_layer() const noexcept { return rpc_layer_; }

  /// TF's settable task_type, task_id and rpc_layer: the value set in code wins.
  void set_task_type(std::string task_type) { task_type_ = std::move(task_type); }
  void set_task_id(std::optional<int> task_id) noexcept { task_id_ = task_id; }
  void set_rpc_layer(std::string rpc_layer) { rpc_layer_ = std::move(rpc_layer); }

 private:
  pscoro::cluster_spec spec_;
  std::string task_type_;
  std::optional<int> task_id_;
  std::string rpc_layer_;
};

/// What code says instead of TF_CONFIG (TF's TFConfigClusterResolver(task_type, task_id,
/// rpc_layer, environment)): each one set wins over TF_CONFIG's.
struct tf_config_overrides {
  std::optional<std::string> task_type{};
  std::optional<int> task_id{};
  std::optional<std::string> rpc_layer{};
  std::optional<std::string> environment{};
};

/// A resolver over TF_CONFIG (TF's TFConfigClusterResolver). The JSON is read once, when the
/// resolver is made; unknown keys (Kubeflow's "environment") are ignored.
class PSCORO_API tf_config_cluster_resolver : public simple_cluster_resolver {
 public:
  /// Reads the TF_CONFIG environment variable; unset or empty means an empty configuration.
  static tf_config_cluster_resolver from_environment(const tf_config_overrides& overrides = {});
  /// Parses `json`; errors name `source` and where the JSON broke.
  static tf_config_cluster_resolver from_json(std::string_view json, std::string_view source = "TF_CONFIG",
                                              const tf_config_overrides& overrides = {});

  /// TF_CONFIG's "environment" ("cloud" under Kubeflow), or the override, or empty.
  const std::string& environment() const noexcept { return environment_; }
  /// TF's master(task_type, task_id, rpc_layer): TF_CONFIG's "session_master" when set; "" for a
  /// cluster of one task or none; else "<rpc layer>://<address>" of the given task (this one by
  /// default), with the given rpc layer (the resolver's by default; none: the bare address).
  std::string master(std::optional<std::string_view> task_type = std::nullopt,
                     std::optional<int> task_id = std::nullopt,
                     std::optional<std::string_view> rpc_layer = std::nullopt) const;

 private:
  using simple_cluster_resolver::simple_cluster_resolver;
  std::string environment_;
  std::string session_master_;
};

/// How slurm_cluster_resolver lays out a Slurm job step: TF's SlurmClusterResolver arguments
/// (without its GPU ones: pscoro places no work on GPUs). Every member has an initializer, so a
/// designated initializer may leave any out (g++ 12 warns about a member without one).
struct slurm_options {
  /// Job names and their task counts. SLURM_PROCIDs are dealt to the jobs in name order, as TF
  /// sorts them: {{"chief", 1}, {"ps", 2}, {"worker", 4}} makes rank 0 the chief, 1 and 2 the ps
  /// tasks, 3 to 6 the workers. Empty: PSCORO_SLURM_JOBS ("chief:1,ps:2,worker:4") when set, else
  /// chief 1, ps 1 and the other SLURM_STEP_NUM_TASKS - 2 tasks workers.
  std::map<std::string, int> jobs{};
  /// The port of the first task on each node; a node's next tasks listen on the next ports.
  /// Unset: PSCORO_SLURM_PORT_BASE when set, else 8888 (TF's).
  std::optional<int> port_base{};
  /// Tasks on every node of SLURM_STEP_NODELIST; unset: as SLURM_STEP_TASKS_PER_NODE says.
  std::optional<int> tasks_per_node{};
  /// Only reported (rpc_layer(), master()): pscoro speaks its own protocol. TF's default.
  std::string rpc_layer = "grpc";
};

/// A resolver over a Slurm job step (TF's SlurmClusterResolver): every task of `srun` runs the same
/// program, and each finds the whole cluster and its own task from Slurm's variables. Nodes are
/// taken in SLURM_STEP_NODELIST order with SLURM_STEP_TASKS_PER_NODE tasks each, ranks filling a
/// node before the next (srun's default block distribution); the task at index i on its node
/// listens on port_base + i. Variables are read once, when the resolver is made; a malformed or
/// inconsistent one is errc::invalid_argument naming the variable and its value.
///
///   srun -N 3 --ntasks-per-node 2 env PSCORO_SLURM_JOBS=chief:1,ps:1,worker:4 ./train
///   auto resolver = pscoro::slurm_cluster_resolver::from_environment();  // rank 3: worker:1
class PSCORO_API slurm_cluster_resolver : public simple_cluster_resolver {
 public:
  /// Environment variables by name, standing in for the environment.
  using variables = std::map<std::string, std::string, std::less<>>;

  /// Reads SLURM_PROCID, SLURM_STEP_NODELIST, SLURM_STEP_TASKS_PER_NODE (unless
  /// `options.tasks_per_node`), SLURM_STEP_NUM_TASKS (only for the default jobs),
  /// PSCORO_SLURM_JOBS (unless `options.jobs`) and PSCORO_SLURM_PORT_BASE (unless
  /// `options.port_base`).
  [[nodiscard]] static slurm_cluster_resolver from_environment(const slurm_options& options = {});
  /// The same, from `environment` instead of the process's environment.
  [[nodiscard]] static slurm_cluster_resolver from_variables(const variables& environment,
                                                             const slurm_options& options = {});

  /// This task's rank in the step (SLURM_PROCID).
  int rank() const noexcept { return rank_; }
  /// TF's master(): "<rpc_layer>://<address of this task>".
  std::string master() const;
  /// TF's master(task_type, task_id, rpc_layer): the address of that task, with `rpc_layer` (or
  /// the resolver's when empty) in front; errc::invalid_argument for a task not in the cluster.
  std::string master(std::string_view task_type, int task_id, std::string_view rpc_layer = {}) const;

 private:
  slurm_cluster_resolver(pscoro::cluster_spec spec, std::string task_type, int task_id,
                         std::string rpc_layer, int rank)
      : simple_cluster_resolver(std::move(spec), std::move(task_type), task_id, std::move(rpc_layer)),
        rank_(rank) {}
  int rank_;
};

/// The resolver the environment configures: TF_CONFIG's when TF_CONFIG is set (and not blank),
/// else Slurm's (with default slurm_options) when SLURM_PROCID is set; errc::invalid_argument
/// naming both variables when neither is. It is sliced to what every resolver has (cluster,
/// task, rpc layer): make the specific resolver for master() or environment(). The process's log
/// lines (and print_line's) name the task it resolves from then on ("chief:0"), unless they name one
/// already.
///
///   const auto resolver = pscoro::auto_cluster_resolver();
///   if (resolver.task_type() == "ps") return pscoro::run_server(resolver);
[[nodiscard]] PSCORO_API simple_cluster_resolver auto_cluster_resolver();

/// TF's checks for a parameter-server cluster (multi_worker_util._validate_cluster_spec plus
/// ParameterServerStrategy's): allowed job names, the task type and index, at most one chief and
/// evaluator, at least one ps and one worker. Throws errc::invalid_argument with TF's message.
PSCORO_API void validate_parameter_server_cluster(const cluster_spec& spec, std::string_view task_type,
                                       std::optional<int> task_id);

}  // namespace pscoro

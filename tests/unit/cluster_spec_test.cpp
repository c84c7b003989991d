#include <pscoro/cluster_spec.hpp>
#include <pscoro/error.hpp>

#include "test_support.hpp"

#include <fmt/format.h>

#include <cstdlib>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

using pscoro::cluster_spec;
using pscoro::tf_config_cluster_resolver;

namespace {

// The message of the invalid_argument error `f` throws; fails the test if it throws nothing else.
template <class F>
std::string invalid_argument_message(F&& f) {
  try {
    f();
  } catch (const pscoro::error& e) {
    CHECK(e.code() == pscoro::errc::invalid_argument);
    return e.what();
  }
  FAIL("expected an invalid_argument error");
  return {};
}


const char* const pss_docstring_config = R"({"cluster": {"chief": ["chief.example.com:2222"],
             "ps": ["ps0.example.com:2222", "ps1.example.com:2222"],
             "worker": ["worker0.example.com:2222", "worker1.example.com:2222", "worker2.example.com:2222"]},
 "task": {"type": "ps", "index": 1}})";

}  // namespace

TEST_CASE("a dense cluster spec answers TF's questions") {
  const cluster_spec spec{{"ps", {"ps0:1111"}}, {"worker", {"worker0:3333", "worker1:4444"}}};
  CHECK(spec.jobs() == std::vector<std::string>{"ps", "worker"});
  CHECK(spec.num_tasks("worker") == 2);
  CHECK(spec.task_indices("worker") == std::vector<int>{0, 1});
  CHECK(spec.task_address("worker", 1) == "worker1:4444");
  CHECK(spec.to_string() == "ClusterSpec({'ps': ['ps0:1111'], 'worker': ['worker0:3333', 'worker1:4444']})");
  CHECK(static_cast<bool>(spec));
  CHECK_FALSE(static_cast<bool>(cluster_spec{}));
}

TEST_CASE("a task is named job:index, and a worker without an index job:unlisted") {
  CHECK(pscoro::task_name("ps", 0) == "ps:0");
  CHECK(pscoro::task_name("worker", 12) == "worker:12");
  CHECK(pscoro::task_name("worker", -1) == "worker:unlisted");
}

TEST_CASE("unknown jobs and tasks are named in the error") {
  const cluster_spec spec{{"ps", {"ps0:1111"}}};
  CHECK(invalid_argument_message([&] { (void)spec.num_tasks("worker"); }) == "No such job in cluster: 'worker'");
  CHECK(invalid_argument_message([&] { (void)spec.task_address("ps", 3); }) == "No task with index 3 in job 'ps'");
}

TEST_CASE("a sparse spec equals the dense one with the same tasks and keeps its holes") {
  const auto sparse = cluster_spec::from_json(R"({"worker": {"1": "w1:2222", "0": "w0:2222"}})");
  const cluster_spec dense{{"worker", {"w0:2222", "w1:2222"}}};
  CHECK(sparse == dense);
  const auto holes = cluster_spec::from_json(R"({"worker": {"1": "w1:2222"}, "ps": []})");
  CHECK(holes.num_tasks("worker") == 1);
  CHECK(holes.job_tasks("worker") == std::vector<std::optional<std::string>>{std::nullopt, "w1:2222"});
  CHECK(holes.num_tasks("ps") == 0);
  // TF's as_dict() writes an empty job as {}.
  CHECK(holes.to_string() == "ClusterSpec({'ps': {}, 'worker': {1: 'w1:2222'}})");
  CHECK(cluster_spec::from_json(holes.to_json()) == holes);
}

TEST_CASE("TF_CONFIG from the ParameterServerStrategy docstring resolves as in TF") {
  const auto resolver = tf_config_cluster_resolver::from_json(pss_docstring_config);
  CHECK(resolver.task_type() == "ps");
  CHECK(resolver.task_id() == 1);
  CHECK(resolver.rpc_layer().empty());
  CHECK(resolver.cluster_spec().num_tasks("worker") == 3);
  CHECK(resolver.master() == "ps1.example.com:2222");
  pscoro::validate_parameter_server_cluster(resolver.cluster_spec(), resolver.task_type(), resolver.task_id());
}

TEST_CASE("TF_CONFIG written by Kubeflow (environment key, sorted jobs) is accepted") {
  const auto resolver = tf_config_cluster_resolver::from_json(
      R"({"cluster":{"ps":["test-tfjob-ps-0.ns2.svc.tf.training.org:2222"],"worker":["test-tfjob-worker-0.ns2.svc.tf.training.org:2222"]},"task":{"type":"worker","index":0},"environment":"cloud"})");
  CHECK(resolver.environment() == "cloud");
  CHECK(resolver.task_type() == "worker");
  CHECK(resolver.cluster_spec().task_address("ps", 0) == "test-tfjob-ps-0.ns2.svc.tf.training.org:2222");
}

TEST_CASE("TF_CONFIG with rpc_layer, numeric-string index and numeric type behaves like TF") {
  const auto grpc = tf_config_cluster_resolver::from_json(
      R"({"cluster":{"ps":["ps0:2222","ps1:2222"],"worker":["worker0:2222","worker1:2222","worker2:2222"]},"rpc_layer":"grpc","task":{"type":"ps","index":0}})");
  CHECK(grpc.master() == "grpc://ps0:2222");
  const auto numeric = tf_config_cluster_resolver::from_json(R"({"task":{"type":123456,"index":"1"}})");
  CHECK(numeric.task_type() == "123456");
  CHECK(numeric.task_id() == 1);
  CHECK(numeric.cluster_spec().empty());
}

constexpr std::string_view tf_test_config =
    R"({"cluster":{"ps":["ps0:2222","ps1:2222"],"worker":["worker0:2222","worker1:2222","worker2:2222"]},"rpc_layer":"grpc","task":{"type":"ps","index":1}})";

TEST_CASE("task type, index, rpc layer and environment set in code win over TF_CONFIG (TF's testParameterOverrides)") {
  auto resolver = tf_config_cluster_resolver::from_json(tf_test_config, "TF_CONFIG", {.task_type = "ps", .task_id = 0});
  CHECK(resolver.master() == "grpc://ps0:2222");
  CHECK(resolver.task_type() == "ps");
  CHECK(resolver.task_id() == 0);
  resolver.set_task_type("worker");
  resolver.set_task_id(1);
  resolver.set_rpc_layer("test");
  CHECK(resolver.master() == "test://worker1:2222");
  CHECK(resolver.task_type() == "worker");
  CHECK(resolver.task_id() == 1);
  CHECK(resolver.rpc_layer() == "test");
  // TF's testTaskIndexOverride; and the environment.
  const auto index = tf_config_cluster_resolver::from_json(
      R"({"cluster":{"worker":["worker0:2222","worker1:2222"]},"task":{"type":"worker","index":"0"}})", "TF_CONFIG",
      {.task_id = 1, .environment = "google"});
  CHECK(index.task_id() == 1);
  CHECK(index.environment() == "google");
}

TEST_CASE("master(task_type, task_id, rpc_layer) names any task (TF's testSpecifiedTaskTypeAndIndexMasterRead)") {
  const auto resolver = tf_config_cluster_resolver::from_json(tf_test_config);
  CHECK(resolver.master("worker", 1) == "grpc://worker1:2222");
  CHECK(resolver.master("worker", 2, "") == "worker2:2222");
  CHECK(resolver.master(std::nullopt, std::nullopt, "test") == "test://ps1:2222");
  CHECK(resolver.master() == "grpc://ps1:2222");
  CHECK_THROWS_AS((void)resolver.master("chief", 0), pscoro::error);
  const auto session = tf_config_cluster_resolver::from_json(
      R"({"cluster":{"ps":["ps0:2222"],"worker":["w0:2222"]},"session_master":"sessionmaster:2222","task":{"type":"ps","index":0}})");
  CHECK(session.master("worker", 0) == "sessionmaster:2222");  // TF: session_master first, always
}

TEST_CASE("Kubeflow's sparse dynamic-worker form parses") {
  const auto resolver = tf_config_cluster_resolver::from_json(
      R"({"cluster":{"worker":{"1":"worker1:2222"},"ps":["ps0:2222"]},"task":{"type":"worker","index":1}})");
  CHECK(resolver.cluster_spec().task_address("worker", 1) == "worker1:2222");
  pscoro::validate_parameter_server_cluster(resolver.cluster_spec(), "worker", 1);
}

TEST_CASE("an unset or empty TF_CONFIG is an empty configuration") {
  ::unsetenv("TF_CONFIG");
  auto resolver = tf_config_cluster_resolver::from_environment();
  CHECK(resolver.cluster_spec().empty());
  CHECK(resolver.task_type().empty());
  CHECK_FALSE(resolver.task_id().has_value());
  ::setenv("TF_CONFIG", R"({"cluster":{"ps":["a:1"],"worker":["b:2"]},"task":{"type":"worker","index":0}})", 1);
  resolver = tf_config_cluster_resolver::from_environment();
  CHECK(resolver.cluster_spec().task_address("worker", 0) == "b:2");
  ::unsetenv("TF_CONFIG");
}

TEST_CASE("malformed TF_CONFIG names TF_CONFIG and where the JSON broke") {
  const auto message = invalid_argument_message(
      [] { (void)tf_config_cluster_resolver::from_json(R"({"cluster": {"ps": ["a:1",]}})"); });
  CHECK(contains(message, "TF_CONFIG is not valid JSON"));
  CHECK(contains(message, "line 1, column 27: syntax error while parsing value - unexpected ']'"));
  // A number too large for a double is nlohmann's out_of_range, not a parse_error (found by fuzzing).
  const auto overflow = invalid_argument_message([] { (void)tf_config_cluster_resolver::from_json("7e77777777"); });
  CHECK(contains(overflow, "TF_CONFIG is not valid JSON: number overflow parsing '7e77777777'"));
}

TEST_CASE("TF_CONFIG of the wrong shape is refused with the offending part") {
  CHECK(contains(invalid_argument_message([] { (void)tf_config_cluster_resolver::from_json("[1,2]"); }),
                 "TF_CONFIG must be a JSON object"));
  CHECK(contains(invalid_argument_message(
                     [] { (void)tf_config_cluster_resolver::from_json(R"({"cluster": {"ps": "a:1"}})"); }),
                 "the tasks for job 'ps' must be a list or a dictionary"));
  CHECK(contains(invalid_argument_message(
                     [] { (void)tf_config_cluster_resolver::from_json(R"({"cluster": {"ps": [7]}})"); }),
                 "task address 7 of job 'ps'"));
  CHECK(contains(invalid_argument_message(
                     [] { (void)tf_config_cluster_resolver::from_json(R"({"cluster": {"ps": {"x": "a:1"}}})"); }),
                 "task index 'x' of job 'ps'"));
  CHECK(contains(invalid_argument_message(
                     [] { (void)tf_config_cluster_resolver::from_json(R"({"task": {"type": "ps", "index": "one"}})"); }),
                 "task index \"one\" is not an integer"));
}

TEST_CASE("a task index past a million is refused, so a sparse spec cannot make job_tasks() huge") {
  // Found by the tf_config fuzzer: {"ps": {"33333300": ...}} made job_tasks() allocate 1.3 GB.
  CHECK(invalid_argument_message([] {
          (void)tf_config_cluster_resolver::from_json(R"({"cluster": {"ps": {"33333300": "a:1"}}})");
        }) == "TF_CONFIG: task index 33333300 of job 'ps' is above 1048575, the largest pscoro accepts");
  cluster_spec spec;
  CHECK(invalid_argument_message([&] { spec.add_task("worker", cluster_spec::max_task_index + 1, "w:1"); }) ==
        "task index 1048576 of job 'worker' is above 1048575, the largest pscoro accepts");
  CHECK_FALSE(spec.has_job("worker"));
  spec.add_task("worker", cluster_spec::max_task_index, "w:1");
  CHECK(spec.task_indices("worker") == std::vector<int>{cluster_spec::max_task_index});
}

TEST_CASE("a TF_CONFIG task index out of range is refused as written, never wrapped") {
  // 2^31 once became "No task with index -2147483648". What from_json makes of `index`: its
  // invalid_argument error's message, or the task it took the index for.
  const auto refused = [](const std::string& index) -> std::string {
    try {
      const auto taken = tf_config_cluster_resolver::from_json(
          R"({"cluster": {"worker": ["w:1"]}, "task": {"type": "worker", "index": )" + index + "}}");
      return "taken as task index " + (taken.task_id() ? std::to_string(*taken.task_id()) : std::string("(none)"));
    } catch (const pscoro::error& e) {
      CHECK(e.code() == pscoro::errc::invalid_argument);
      return e.what();
    }
  };
  for (const std::string index : {"2147483648", "4294967296", "18446744073709551615", "-1", "-2147483649",
                                  "1048576", "\"2147483648\"", "\"99999999999999999999\"", "\"-1\""}) {
    CHECK(refused(index) == "TF_CONFIG: task index " + index + " is out of range: a task index is 0 to 1048575");
  }
  CHECK(refused("1.5") == "TF_CONFIG: task index 1.5 is not an integer");
  CHECK(refused("\"1x\"") == "TF_CONFIG: task index \"1x\" is not an integer");
  const auto largest = tf_config_cluster_resolver::from_json(R"({"task": {"type": "worker", "index": 1048575}})");
  CHECK(largest.task_id() == cluster_spec::max_task_index);
}

TEST_CASE("parameter-server validation applies TF's rules with TF's messages") {
  const cluster_spec good{{"chief", {"c:1"}}, {"ps", {"p:1"}}, {"worker", {"w:1", "w:2"}}};
  pscoro::validate_parameter_server_cluster(good, "chief", 0);
  pscoro::validate_parameter_server_cluster(good, "worker", 1);
  // A missing chief is not an error (TF adds one), an evaluator task type need not be in the spec.
  pscoro::validate_parameter_server_cluster(cluster_spec{{"ps", {"p:1"}}, {"worker", {"w:1"}}}, "evaluator", 0);

  auto check = [](const cluster_spec& spec, std::string type, std::optional<int> id, std::string_view expected) {
    const auto message = invalid_argument_message([&] { pscoro::validate_parameter_server_cluster(spec, type, id); });
    CHECK(contains(message, expected));
  };
  check(cluster_spec{}, "", {}, "Cluster spec must be non-empty.");
  check(cluster_spec{{"master", {"m:1"}}, {"ps", {"p:1"}}, {"worker", {"w:1"}}}, "", {},
        "Disallowed task type found in cluster spec: 'master'");
  check(good, "foobar", 0, "Unrecognized task_type: foobar");
  check(cluster_spec{{"ps", {"p:1"}}, {"worker", {"w:1"}}}, "chief", 0, "`task_type` 'chief' not found in cluster_spec.");
  check(cluster_spec{{"chief", {"c:1", "c:2"}}, {"ps", {"p:1"}}, {"worker", {"w:1"}}}, "", {},
        "There must be at most one 'chief' job.");
  check(cluster_spec{{"evaluator", {"e:1", "e:2"}}, {"ps", {"p:1"}}, {"worker", {"w:1"}}}, "", {},
        "There must be at most one 'evaluator' job.");
  check(good, "worker", 2, "The `task_id` 2 exceeds the maximum id of 1");
  check(good, "worker", -1, "The `task_id` -1 exceeds the maximum id of 1");
  check(good, "worker", std::nullopt, "`task_id` is missing for task type 'worker'.");
  check(cluster_spec{{"worker", {"w:1"}}}, "", {}, "There must be at least one ps.");
  check(cluster_spec{{"ps", {"p:1"}}, {"worker", {}}}, "", {}, "There must be at least one worker.");
}

// Slurm: TF's slurm_cluster_resolver_test.py, then pscoro's default jobs, PSCORO_SLURM_JOBS,
// auto_cluster_resolver and every error.

namespace {

using pscoro::slurm_cluster_resolver;
using pscoro::slurm_options;
using slurm_variables = slurm_cluster_resolver::variables;

// The step of TF's tests: three nodes of one task each.
const slurm_variables tf_step{{"SLURM_PROCID", "0"},
                              {"SLURM_STEP_NUM_TASKS", "3"},
                              {"SLURM_STEP_TASKS_PER_NODE", "1(x3)"},
                              {"SLURM_STEP_NODELIST", "t02n13,t02n41,t02n43"}};

slurm_variables with(slurm_variables environment, const std::string& name, std::string value) {
  environment[name] = std::move(value);
  return environment;
}

slurm_variables without(slurm_variables environment, const std::string& name) {
  environment.erase(name);
  return environment;
}

// The hosts SLURM_STEP_NODELIST expands to, in rank order (one worker on each).
std::vector<std::string> expand_nodelist(const std::string& nodelist, int hosts) {
  const auto resolver = slurm_cluster_resolver::from_variables(
      {{"SLURM_PROCID", "0"}, {"SLURM_STEP_NODELIST", nodelist}}, {.jobs = {{"worker", hosts}}, .tasks_per_node = 1});
  std::vector<std::string> names;
  for (int i = 0; i < hosts; ++i) {
    const auto& address = resolver.cluster_spec().task_address("worker", i);
    CHECK(address.ends_with(":8888"));
    names.push_back(address.substr(0, address.rfind(':')));
  }
  return names;
}

// The task counts SLURM_STEP_TASKS_PER_NODE gives `nodes` nodes, read back from the addresses
// (a node's tasks listen on 8888, 8889, ...).
std::vector<int> expand_tasks_per_node(const std::string& tasks_per_node, int nodes, int tasks) {
  const auto resolver = slurm_cluster_resolver::from_variables({{"SLURM_PROCID", "0"},
                                                                {"SLURM_STEP_NODELIST", fmt::format("n[1-{}]", nodes)},
                                                                {"SLURM_STEP_TASKS_PER_NODE", tasks_per_node}},
                                                               {.jobs = {{"worker", tasks}}});
  std::vector<int> counts;
  std::string last_host;
  for (int i = 0; i < tasks; ++i) {
    const auto& address = resolver.cluster_spec().task_address("worker", i);
    const auto host = address.substr(0, address.rfind(':'));
    if (host != last_host) counts.push_back(0);
    CHECK(address == fmt::format("{}:{}", host, 8888 + counts.back()));
    ++counts.back();
    last_host = host;
  }
  return counts;
}

// The message of the invalid_argument error resolving `environment` with `options` throws.
std::string slurm_error(const slurm_variables& environment, const slurm_options& options = {}) {
  return invalid_argument_message([&] { (void)slurm_cluster_resolver::from_variables(environment, options); });
}

// Sets (a value) or unsets (nullopt) environment variables for a scope and restores them after.
class scoped_environment {
 public:
  scoped_environment(std::initializer_list<std::pair<const char*, std::optional<std::string>>> values) {
    for (const auto& [name, value] : values) {
      const char* old = std::getenv(name);
      saved_.emplace_back(name, old != nullptr ? std::optional<std::string>(old) : std::nullopt);
      set(name, value);
    }
  }
  scoped_environment(const scoped_environment&) = delete;
  scoped_environment& operator=(const scoped_environment&) = delete;
  ~scoped_environment() {
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) set(it->first, it->second);
  }

 private:
  static void set(const char* name, const std::optional<std::string>& value) {
    if (value) {
      ::setenv(name, value->c_str(), 1);
    } else {
      ::unsetenv(name);
    }
  }
  std::vector<std::pair<const char*, std::optional<std::string>>> saved_;
};

}  // namespace

TEST_CASE("Slurm hostlists expand as TF expands them, zero padding kept") {
  CHECK(expand_nodelist("n1", 1) == std::vector<std::string>{"n1"});
  CHECK(expand_nodelist("n[1,3]", 2) == std::vector<std::string>{"n1", "n3"});
  CHECK(expand_nodelist("n[1-3]", 3) == std::vector<std::string>{"n1", "n2", "n3"});
  CHECK(expand_nodelist("n[1-2],m5,o[3-4,6,7-9]", 9) ==
        std::vector<std::string>{"n1", "n2", "m5", "o3", "o4", "o6", "o7", "o8", "o9"});
  CHECK(expand_nodelist("n[0001-0003],m5,o[009-011]", 7) ==
        std::vector<std::string>{"n0001", "n0002", "n0003", "m5", "o009", "o010", "o011"});
  CHECK(expand_nodelist("node[1-3,07],other", 5) ==
        std::vector<std::string>{"node1", "node2", "node3", "node07", "other"});
  // The first number's width is the width: [8-10] is 8, 9, 10, as in TF.
  CHECK(expand_nodelist("n[8-10]", 3) == std::vector<std::string>{"n8", "n9", "n10"});
  // Beyond TF: a suffix after the range, as Slurm writes "n1-ib,n2-ib".
  CHECK(expand_nodelist("n[1-2]-ib", 2) == std::vector<std::string>{"n1-ib", "n2-ib"});
  // The largest number there is ends the expansion (a loop to it that wraps would never end).
  CHECK(expand_nodelist("n[18446744073709551614-18446744073709551615]", 2) ==
        std::vector<std::string>{"n18446744073709551614", "n18446744073709551615"});
}

TEST_CASE("Slurm tasks-per-node lists expand as TF expands them") {
  CHECK(expand_tasks_per_node("2", 1, 2) == std::vector<int>{2});
  CHECK(expand_tasks_per_node("2,1,3", 3, 6) == std::vector<int>{2, 1, 3});
  CHECK(expand_tasks_per_node("3(x2),2,1", 4, 9) == std::vector<int>{3, 3, 2, 1});
  CHECK(expand_tasks_per_node("3(x2),2,11(x4)", 7, 52) == std::vector<int>{3, 3, 2, 11, 11, 11, 11});
  CHECK(expand_tasks_per_node("13(x10)", 10, 130) == std::vector<int>(10, 13));
}

TEST_CASE("a Slurm step whose jobs are all workers resolves as TF's testSimpleRetrievalFromEnv") {
  const auto resolver = slurm_cluster_resolver::from_variables(tf_step, {.jobs = {{"worker", 3}}});
  CHECK(resolver.cluster_spec().to_string() ==
        "ClusterSpec({'worker': ['t02n13:8888', 't02n41:8888', 't02n43:8888']})");
  CHECK(resolver.master("worker", 0, "grpc") == "grpc://t02n13:8888");
  CHECK(resolver.task_type() == "worker");
  CHECK(resolver.task_id() == 0);
  CHECK(resolver.rank() == 0);
  CHECK(resolver.rpc_layer() == "grpc");
}

TEST_CASE("explicit jobs and tasks per node need neither SLURM_STEP_NUM_TASKS nor SLURM_STEP_TASKS_PER_NODE") {
  // TF's testSimpleSuccessfulRetrieval: neither variable is read, so neither may be wrong.
  const auto environment = with(without(tf_step, "SLURM_STEP_TASKS_PER_NODE"), "SLURM_STEP_NUM_TASKS", "unused");
  const auto resolver =
      slurm_cluster_resolver::from_variables(environment, {.jobs = {{"ps", 1}, {"worker", 2}}, .tasks_per_node = 1});
  CHECK(resolver.cluster_spec().to_string() ==
        "ClusterSpec({'ps': ['t02n13:8888'], 'worker': ['t02n41:8888', 't02n43:8888']})");
  CHECK(resolver.task_type() == "ps");
}

TEST_CASE("master() is this task's address, with the resolver's or the given rpc layer") {
  // TF's testSimpleMasterRetrieval, with the task chosen by SLURM_PROCID instead of assigned.
  const slurm_options ps_and_workers{.jobs = {{"ps", 1}, {"worker", 2}}, .tasks_per_node = 1};
  const auto worker1 = slurm_cluster_resolver::from_variables(with(tf_step, "SLURM_PROCID", "2"), ps_and_workers);
  CHECK(worker1.task_type() == "worker");
  CHECK(worker1.task_id() == 1);
  CHECK(worker1.master() == "grpc://t02n43:8888");

  auto ab = ps_and_workers;
  ab.rpc_layer = "ab";
  const auto resolver = slurm_cluster_resolver::from_variables(tf_step, ab);
  CHECK(resolver.master("ps", 0) == "ab://t02n13:8888");
  CHECK(resolver.master("ps", 0, "test") == "test://t02n13:8888");
  CHECK(contains(invalid_argument_message([&] { (void)resolver.master("chief", 0); }),
                 "No such job in cluster: 'chief'"));
}

TEST_CASE("tasks per node come from SLURM_STEP_TASKS_PER_NODE when not given") {
  // TF's testTaskPerNodeNotSetRetrieval.
  const auto resolver = slurm_cluster_resolver::from_variables(tf_step, {.jobs = {{"ps", 1}, {"worker", 2}}});
  CHECK(resolver.cluster_spec().to_string() ==
        "ClusterSpec({'ps': ['t02n13:8888'], 'worker': ['t02n41:8888', 't02n43:8888']})");
}

TEST_CASE("tasks sharing a node listen on consecutive ports from port_base") {
  // TF's testMultiTaskPerNodeRetrieval (its GPU half is not pscoro's).
  const slurm_variables step{{"SLURM_PROCID", "1"},
                             {"SLURM_STEP_NUM_TASKS", "5"},
                             {"SLURM_STEP_TASKS_PER_NODE", "2(x2),1"},
                             {"SLURM_STEP_NODELIST", "t02n13,t02n41,t02n43"}};
  const auto resolver = slurm_cluster_resolver::from_variables(step, {.jobs = {{"ps", 1}, {"worker", 4}}});
  CHECK(resolver.cluster_spec().to_string() ==
        "ClusterSpec({'ps': ['t02n13:8888'], 'worker': ['t02n13:8889', 't02n41:8888', 't02n41:8889', "
        "'t02n43:8888']})");
  CHECK(resolver.task_type() == "worker");
  CHECK(resolver.task_id() == 0);

  const auto other_base =
      slurm_cluster_resolver::from_variables(step, {.jobs = {{"ps", 1}, {"worker", 4}}, .port_base = 2222});
  CHECK(other_base.cluster_spec().task_address("worker", 0) == "t02n13:2223");
  CHECK(other_base.master() == "grpc://t02n13:2223");

  // PSCORO_SLURM_PORT_BASE, for a job script; the option wins over it.
  auto with_base = step;
  with_base.emplace("PSCORO_SLURM_PORT_BASE", "31000");
  const auto from_variable = slurm_cluster_resolver::from_variables(with_base, {.jobs = {{"ps", 1}, {"worker", 4}}});
  CHECK(from_variable.cluster_spec().task_address("worker", 0) == "t02n13:31001");
  const auto option_wins =
      slurm_cluster_resolver::from_variables(with_base, {.jobs = {{"ps", 1}, {"worker", 4}}, .port_base = 2222});
  CHECK(option_wins.cluster_spec().task_address("worker", 0) == "t02n13:2223");
}

TEST_CASE("without jobs pscoro makes a chief, a ps and the other tasks workers") {
  const slurm_variables step{{"SLURM_STEP_NUM_TASKS", "4"},
                             {"SLURM_STEP_TASKS_PER_NODE", "2(x2)"},
                             {"SLURM_STEP_NODELIST", "a,b"}};
  const std::pair<std::string, int> tasks[] = {{"chief", 0}, {"ps", 0}, {"worker", 0}, {"worker", 1}};
  for (int rank = 0; rank < 4; ++rank) {
    const auto resolver = slurm_cluster_resolver::from_variables(with(step, "SLURM_PROCID", std::to_string(rank)));
    CHECK(resolver.cluster_spec().to_string() ==
          "ClusterSpec({'chief': ['a:8888'], 'ps': ['a:8889'], 'worker': ['b:8888', 'b:8889']})");
    CHECK(resolver.task_type() == tasks[rank].first);
    CHECK(resolver.task_id() == tasks[rank].second);
    pscoro::validate_parameter_server_cluster(resolver.cluster_spec(), resolver.task_type(), resolver.task_id());
  }
}

TEST_CASE("PSCORO_SLURM_JOBS sets the jobs, dealt in name order as TF sorts them") {
  const slurm_variables step{{"SLURM_PROCID", "6"},
                             {"SLURM_STEP_TASKS_PER_NODE", "4,3"},
                             {"SLURM_STEP_NODELIST", "n[01-02]"},
                             {"PSCORO_SLURM_JOBS", "chief:1,ps:2,worker:4"}};
  const auto resolver = slurm_cluster_resolver::from_variables(step);
  const auto expected = "ClusterSpec({'chief': ['n01:8888'], 'ps': ['n01:8889', 'n01:8890'], "
                        "'worker': ['n01:8891', 'n02:8888', 'n02:8889', 'n02:8890']})";
  CHECK(resolver.cluster_spec().to_string() == expected);
  CHECK(resolver.task_type() == "worker");
  CHECK(resolver.task_id() == 3);
  // The order written does not matter; SLURM_STEP_NUM_TASKS is not read.
  const auto reordered = slurm_cluster_resolver::from_variables(
      with(with(step, "PSCORO_SLURM_JOBS", "worker:4,ps:2,chief:1"), "SLURM_STEP_NUM_TASKS", "unused"));
  CHECK(reordered.cluster_spec().to_string() == expected);

  const auto evaluator = slurm_cluster_resolver::from_variables(
      with(with(step, "PSCORO_SLURM_JOBS", "chief:1,evaluator:1,ps:1,worker:4"), "SLURM_PROCID", "1"));
  CHECK(evaluator.task_type() == "evaluator");
  CHECK(evaluator.cluster_spec().task_address("evaluator", 0) == "n01:8889");

  // Jobs given in code win over PSCORO_SLURM_JOBS; an empty PSCORO_SLURM_JOBS is unset.
  CHECK(slurm_cluster_resolver::from_variables(step, {.jobs = {{"ps", 1}, {"worker", 6}}}).task_type() == "worker");
  const auto defaults = slurm_cluster_resolver::from_variables(
      with(with(step, "PSCORO_SLURM_JOBS", ""), "SLURM_STEP_NUM_TASKS", "7"));
  CHECK(defaults.cluster_spec().num_tasks("worker") == 5);
}

TEST_CASE("a missing Slurm variable is named with TF's message") {
  CHECK(slurm_error(without(tf_step, "SLURM_PROCID")) ==
        "SLURM_PROCID not found in environment. Not running inside a SLURM step?");
  CHECK(slurm_error(without(tf_step, "SLURM_STEP_NUM_TASKS")) ==
        "SLURM_STEP_NUM_TASKS not found in environment. Not running inside a SLURM step?");
  CHECK(slurm_error(without(tf_step, "SLURM_STEP_NODELIST")) ==
        "SLURM_STEP_NODELIST not found in environment. Not running inside a SLURM step?");
  CHECK(slurm_error(without(tf_step, "SLURM_STEP_TASKS_PER_NODE")) ==
        "SLURM_STEP_TASKS_PER_NODE not found in environment. Not running inside a SLURM step?");
}

TEST_CASE("a malformed SLURM_PROCID or SLURM_STEP_NUM_TASKS is named with its value") {
  for (const auto* rank : {"x", "-1", "", "+1", "1 ", "99999999999"}) {
    CHECK(contains(slurm_error(with(tf_step, "SLURM_PROCID", rank)),
                   fmt::format("SLURM_PROCID=\"{}\" is not a task rank", rank)));
  }
  CHECK(contains(slurm_error(with(tf_step, "SLURM_PROCID", "3")),
                 "SLURM_PROCID=\"3\" is not a rank of this step: it has 3 tasks, ranks 0 to 2"));
  for (const auto* count : {"three", "0", "-3", "99999999999"}) {
    CHECK(contains(slurm_error(with(tf_step, "SLURM_STEP_NUM_TASKS", count)),
                   fmt::format("SLURM_STEP_NUM_TASKS=\"{}\" is not a number of tasks", count)));
  }
  CHECK(contains(slurm_error(with(with(tf_step, "SLURM_STEP_NUM_TASKS", "2"), "SLURM_STEP_TASKS_PER_NODE", "1(x2)")),
                 "SLURM_STEP_NUM_TASKS=\"2\" is too few tasks for pscoro's default jobs"));
  // A value that is not text for a terminal is escaped.
  CHECK(contains(slurm_error(with(tf_step, "SLURM_PROCID", "1\n")), "SLURM_PROCID=\"1\\n\" is not a task rank"));
}

TEST_CASE("a malformed SLURM_STEP_NODELIST is named with its value and what is wrong") {
  const std::pair<const char*, const char*> cases[] = {
      {"", "it is empty"},
      {"n[1-3", "a '[' is not closed"},
      {"n1]", "a ']' closes no range"},
      {"n[1[2]]", "a '[' inside a range"},
      {"n1,,n2", "an empty host name"},
      {"n1,", "an empty host name"},
      {"n1, n2", "host name ' n2' contains white space"},
      {"n[3-1]", "range '3-1' in 'n[3-1]' descends"},
      {"n[a-b]", "'a-b' in 'n[a-b]' is not a number or a range of numbers"},
      {"n[1-2-3]", "'1-2-3' in 'n[1-2-3]' is not a number"},
      {"n[]", "'' in 'n[]' is not a number"},
      {"n[1,]", "'' in 'n[1,]' is not a number"},
      {"n[99999999999999999999]", "'99999999999999999999' in 'n[99999999999999999999]' is not a number"},
      {"r[1-2]n[1-2]", "'r[1-2]n[1-2]' has more than one range"},
      {"n[0-1048576]", "it names more than 1048576 hosts"},
      {"n1,n[1-2]", "it names host 'n1' twice"},
  };
  for (const auto& [nodelist, why] : cases) {
    const auto message = slurm_error(with(tf_step, "SLURM_STEP_NODELIST", nodelist));
    CHECK(contains(message, fmt::format("SLURM_STEP_NODELIST=\"{}\" is not a Slurm hostlist", nodelist)));
    CHECK(contains(message, why));
  }
}

TEST_CASE("a malformed SLURM_STEP_TASKS_PER_NODE is named with its value and the part that is wrong") {
  const std::pair<const char*, const char*> cases[] = {
      {"2(x", "'2(x'"},    {"0,1(x2)", "'0'"},  {"1,2(x0)", "'2(x0)'"}, {"x", "'x'"},
      {"1,,1", "''"},      {"", "''"},          {"1(y3)", "'1(y3)'"},   {"-1,1,1", "'-1'"},
      {"1(x3) ", "'1(x3) '"}, {"99999999999,1,1", "'99999999999'"}, {"1(x3)1", "'1(x3)1'"},
  };
  for (const auto& [tasks_per_node, part] : cases) {
    const auto message = slurm_error(with(tf_step, "SLURM_STEP_TASKS_PER_NODE", tasks_per_node));
    CHECK(contains(message,
                   fmt::format("SLURM_STEP_TASKS_PER_NODE=\"{}\" is not a Slurm tasks-per-node list", tasks_per_node)));
    CHECK(contains(message, fmt::format("{} is not N or N(xM)", part)));
  }
  // TF's zip() would drop the third node; pscoro says which variables disagree.
  CHECK(slurm_error(with(tf_step, "SLURM_STEP_TASKS_PER_NODE", "1(x2)")) ==
        "SLURM_STEP_TASKS_PER_NODE=\"1(x2)\" gives task counts for 2 nodes but "
        "SLURM_STEP_NODELIST=\"t02n13,t02n41,t02n43\" names 3");
}

TEST_CASE("tasks whose ports would pass 65535 are refused") {
  CHECK(contains(slurm_error(with(tf_step, "SLURM_STEP_TASKS_PER_NODE", "1,70000,1")),
                 "SLURM_STEP_TASKS_PER_NODE=\"1,70000,1\" puts 70000 tasks on node 't02n41': their ports, 8888 to "
                 "78887, pass 65535"));
  CHECK(contains(slurm_error(tf_step, {.jobs = {{"worker", 6}}, .port_base = 65535, .tasks_per_node = 2}),
                 "SLURM_STEP_NODELIST=\"t02n13,t02n41,t02n43\" with tasks_per_node 2 puts 2 tasks on node 't02n13'"));
  for (const int port_base : {0, -1, 65536}) {
    CHECK(contains(slurm_error(tf_step, {.port_base = port_base}),
                   fmt::format("slurm_options::port_base {} is not a port (1 to 65535)", port_base)));
  }
  for (const std::string port_base : {"0", "-1", "65536", "8888x", " 8888", "99999999999999999999"}) {
    CHECK(contains(slurm_error(with(tf_step, "PSCORO_SLURM_PORT_BASE", port_base)),
                   fmt::format("PSCORO_SLURM_PORT_BASE=\"{}\" is not a port: it must be an integer from 1 to 65535",
                               port_base)));
  }
  // A million tasks is pscoro's bound, before any address is made.
  CHECK(contains(slurm_error({{"SLURM_PROCID", "0"},
                              {"SLURM_STEP_NODELIST", "n[1-17]"},
                              {"SLURM_STEP_TASKS_PER_NODE", "65535(x17)"},
                              {"PSCORO_SLURM_JOBS", "worker:1114095"}},
                             {.port_base = 1}),
                 "with SLURM_STEP_TASKS_PER_NODE=\"65535(x17)\" places 1114095 tasks, more than pscoro's limit of "
                 "1048576"));
}

TEST_CASE("jobs that do not add up to the step's tasks are refused with TF's message and both sources") {
  const slurm_variables step{
      {"SLURM_PROCID", "0"}, {"SLURM_STEP_NODELIST", "a,b"}, {"SLURM_STEP_TASKS_PER_NODE", "2(x2)"}};
  CHECK(slurm_error(with(step, "PSCORO_SLURM_JOBS", "chief:1,ps:2,worker:2")) ==
        "Requested 5 tasks but only 4 were assigned: PSCORO_SLURM_JOBS=\"chief:1,ps:2,worker:2\" asks for 5, "
        "SLURM_STEP_NODELIST=\"a,b\" with SLURM_STEP_TASKS_PER_NODE=\"2(x2)\" places 4");
  CHECK(contains(slurm_error(with(step, "SLURM_STEP_NUM_TASKS", "3")),
                 "Requested 3 tasks but only 4 were assigned: SLURM_STEP_NUM_TASKS=\"3\" asks for 3"));
  CHECK(contains(slurm_error(step, {.jobs = {{"ps", 1}, {"worker", 2}}, .tasks_per_node = 1}),
                 "Requested 3 tasks but only 2 were assigned: slurm_options::jobs ps:1,worker:2 asks for 3, "
                 "SLURM_STEP_NODELIST=\"a,b\" with tasks_per_node 1 places 2"));
}

TEST_CASE("a malformed PSCORO_SLURM_JOBS is named with its value and what is wrong") {
  const std::pair<const char*, const char*> cases[] = {
      {"chief:1,ps", "'ps' is not job:count"},
      {"chief:1,,ps:1", "'' is not job:count"},
      {"chief:1,", "'' is not job:count"},
      {"chief:1,ps:0", "task count '0' of job 'ps' is not a positive integer"},
      {"chief:1,ps:x", "task count 'x' of job 'ps' is not a positive integer"},
      {"chief:1,ps:-1", "task count '-1' of job 'ps' is not a positive integer"},
      {"chief:1,ps:", "task count '' of job 'ps' is not a positive integer"},
      {"chief:1,ps:1:2", "task count '1:2' of job 'ps' is not a positive integer"},
      {"ps:99999999999", "task count '99999999999' of job 'ps' is not a positive integer"},
      {"chief:1,chief:1", "job 'chief' appears twice"},
      {"1chief:1", "'1chief' is not a job name"},
      {"chief :1", "'chief ' is not a job name"},
      {"chief:1, ps:1", "' ps' is not a job name"},
      {":1", "'' is not a job name"},
  };
  for (const auto& [jobs, why] : cases) {
    const auto message = slurm_error(with(tf_step, "PSCORO_SLURM_JOBS", jobs));
    CHECK(contains(message, fmt::format("PSCORO_SLURM_JOBS=\"{}\" is not a list of job:count", jobs)));
    CHECK(contains(message, why));
  }
}

TEST_CASE("jobs and tasks per node given in code are checked like the variables") {
  CHECK(slurm_error(tf_step, {.jobs = {{"ps", 0}, {"worker", 3}}}) ==
        "slurm_options::jobs: task count '0' of job 'ps' is not a positive integer");
  CHECK(slurm_error(tf_step, {.jobs = {{"/job:ps", 1}}}) ==
        "slurm_options::jobs: '/job:ps' is not a job name (a letter, then letters, digits or '_')");
  CHECK(slurm_error(tf_step, {.jobs = {{"worker", 3}}, .tasks_per_node = 0}) ==
        "slurm_options::tasks_per_node 0 is not a positive task count");
}

TEST_CASE("slurm_cluster_resolver::from_environment reads the Slurm variables of the process") {
  const scoped_environment environment{{"SLURM_PROCID", "2"},
                                       {"SLURM_STEP_NUM_TASKS", "3"},
                                       {"SLURM_STEP_TASKS_PER_NODE", "1(x3)"},
                                       {"SLURM_STEP_NODELIST", "t02n[13,41,43]"},
                                       {"PSCORO_SLURM_JOBS", std::nullopt}};
  const auto resolver = slurm_cluster_resolver::from_environment();
  CHECK(resolver.task_type() == "worker");
  CHECK(resolver.master() == "grpc://t02n43:8888");
  const scoped_environment jobs{{"PSCORO_SLURM_JOBS", "ps:1,worker:2"}};
  CHECK(slurm_cluster_resolver::from_environment().cluster_spec().num_tasks("worker") == 2);
}

TEST_CASE("auto_cluster_resolver prefers TF_CONFIG, then Slurm, and names both when neither is set") {
  const scoped_environment slurm{{"SLURM_PROCID", "0"},
                                 {"SLURM_STEP_NUM_TASKS", "3"},
                                 {"SLURM_STEP_TASKS_PER_NODE", "1(x3)"},
                                 {"SLURM_STEP_NODELIST", "a,b,c"},
                                 {"PSCORO_SLURM_JOBS", std::nullopt}};
  {
    const scoped_environment tf_config{{"TF_CONFIG", pss_docstring_config}};
    const auto resolver = pscoro::auto_cluster_resolver();
    CHECK(resolver.task_type() == "ps");
    CHECK(resolver.task_id() == 1);
    CHECK(resolver.cluster_spec().task_address("chief", 0) == "chief.example.com:2222");
  }
  {
    const scoped_environment blank_tf_config{{"TF_CONFIG", " "}};
    const auto resolver = pscoro::auto_cluster_resolver();
    CHECK(resolver.task_type() == "chief");
    CHECK(resolver.cluster_spec().to_string() ==
          "ClusterSpec({'chief': ['a:8888'], 'ps': ['b:8888'], 'worker': ['c:8888']})");
    CHECK(resolver.rpc_layer() == "grpc");
  }
  {
    const scoped_environment broken{{"TF_CONFIG", std::nullopt}, {"SLURM_STEP_NODELIST", "a,b,c]"}};
    CHECK(contains(invalid_argument_message([] { (void)pscoro::auto_cluster_resolver(); }),
                   "SLURM_STEP_NODELIST=\"a,b,c]\" is not a Slurm hostlist"));
  }
  const scoped_environment neither{{"TF_CONFIG", std::nullopt}, {"SLURM_PROCID", std::nullopt}};
  const auto message = invalid_argument_message([] { (void)pscoro::auto_cluster_resolver(); });
  CHECK(contains(message, "neither TF_CONFIG nor SLURM_PROCID is set"));
}

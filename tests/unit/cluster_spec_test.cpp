#include <pscoro/cluster_spec.hpp>
#include <pscoro/error.hpp>

#include "test_support.hpp"

#include <cstdlib>
#include <string>

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

// The TF_CONFIG parser: tf_config_cluster_resolver::from_json on arbitrary text, then everything a
// program does with what it parsed (the cluster's JSON and repr, master(), the ps-cluster checks).
// Bad text must be errc::invalid_argument; what parses must survive a round trip through to_json.
#include <pscoro/cluster_spec.hpp>
#include <pscoro/error.hpp>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

namespace {

[[noreturn]] void broken(const std::string& what) {
  std::fprintf(stderr, "fuzz invariant broken: %s\n", what.c_str());
  std::abort();
}

void check_spec(const pscoro::cluster_spec& spec) {
  const auto json = spec.to_json();
  (void)spec.to_string();
  try {
    if (!(pscoro::cluster_spec::from_json(json, "round trip") == spec)) broken("to_json does not round-trip: " + json);
  } catch (const pscoro::error& e) {
    broken(std::string("to_json gave JSON that from_json refuses: ") + e.what() + ": " + json);
  }
  for (const auto& job : spec.jobs()) {
    (void)spec.job_tasks(job);
    for (const int index : spec.task_indices(job)) (void)spec.task_address(job, index);
    if (spec.task_indices(job).size() != spec.num_tasks(job)) broken("num_tasks disagrees with task_indices");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const auto resolver = pscoro::tf_config_cluster_resolver::from_json(text);
    check_spec(resolver.cluster_spec());
    (void)resolver.master();
    try {
      pscoro::validate_parameter_server_cluster(resolver.cluster_spec(), resolver.task_type(), resolver.task_id());
    } catch (const pscoro::error& e) {
      if (e.code() != pscoro::errc::invalid_argument) broken(std::string("validate: not invalid_argument: ") + e.what());
    }
  } catch (const pscoro::error& e) {
    if (e.code() != pscoro::errc::invalid_argument) broken(std::string("from_json: not invalid_argument: ") + e.what());
  }
  // The bare "cluster" object as well.
  try {
    check_spec(pscoro::cluster_spec::from_json(text));
  } catch (const pscoro::error& e) {
    if (e.code() != pscoro::errc::invalid_argument) broken(std::string("cluster_spec: not invalid_argument: ") + e.what());
  }
  return 0;
}

#include "wire/requests.hpp"

#include <fmt/format.h>

namespace pscoro::wire {

std::string_view request_name(Request::BodyCase kind) noexcept {
  switch (kind) {
    case Request::kCreateVariable: return "CreateVariable";
    case Request::kReadVariable: return "ReadVariable";
    case Request::kUpdateVariable: return "UpdateVariable";
    case Request::kRunFunction: return "RunFunction";
    case Request::kApplyGradient: return "ApplyGradient";
    case Request::kCreateIterator: return "CreateIterator";
    case Request::kListSlots: return "ListSlots";
    case Request::kHeartbeat: return "Heartbeat";
    case Request::kCancelClosures: return "CancelClosures";
    case Request::kShutdown: return "Shutdown";
    case Request::kDeleteVariable: return "DeleteVariable";
    case Request::kReleaseIterator: return "ReleaseIterator";
    case Request::kCreatePerWorkerVariable: return "CreatePerWorkerVariable";
    case Request::kReadPerWorkerVariable: return "ReadPerWorkerVariable";
    case Request::kCreateResource: return "CreateResource";
    case Request::kCreateHashTable: return "CreateHashTable";
    case Request::kHashLookup: return "HashLookup";
    case Request::kHashApplyGradients: return "HashApplyGradients";
    case Request::kAdvanceClock: return "AdvanceClock";
    case Request::kHashExport: return "HashExport";
    case Request::kHashImport: return "HashImport";
    case Request::BODY_NOT_SET: break;
  }
  return "an empty request";
}

std::string_view chief_only_action(const Request& request) noexcept {
  switch (request.body_case()) {
    case Request::kShutdown: return "end the job";
    case Request::kDeleteVariable: return "delete variables";
    case Request::kHashImport: return "restore hash tables";
    case Request::kHashExport: return request.hash_export().save() != 0 ? "save hash tables" : std::string_view{};
    default: return {};
  }
}

error not_served(const Request& request, std::string_view role, std::string_view task) {
  // What the request asks a task to have done or to hold, as the task says it does not.
  std::string what;
  switch (request.body_case()) {
    case Request::kCreateVariable:
    case Request::kReadVariable:
    case Request::kUpdateVariable:
    case Request::kApplyGradient:
    case Request::kListSlots:
    case Request::kDeleteVariable: what = "holds no variables"; break;
    case Request::kCreateHashTable:
    case Request::kHashLookup:
    case Request::kHashApplyGradients:
    case Request::kAdvanceClock:
    case Request::kHashExport:
    case Request::kHashImport: what = "holds no hash tables"; break;
    case Request::kRunFunction:
      what = fmt::format("runs no worker functions ('{}' was sent here)", request.run_function().name());
      break;
    case Request::kCreateIterator:
      what = fmt::format("builds no datasets ('{}' was sent here)", request.create_iterator().function());
      break;
    case Request::kReleaseIterator: what = "holds no iterators"; break;
    case Request::kCreatePerWorkerVariable:
    case Request::kReadPerWorkerVariable: what = "holds no per-worker variables"; break;
    case Request::kCreateResource:
      what = fmt::format("builds no per-worker resources ('{}' was sent here)", request.create_resource().function());
      break;
    case Request::kCancelClosures: what = "runs no closures"; break;
    case Request::kHeartbeat:
    case Request::kShutdown: what = fmt::format("does not serve {} itself", request_name(request.body_case())); break;
    case Request::BODY_NOT_SET: return error(errc::invalid_argument, fmt::format("{} got an empty request", task));
  }
  return error(errc::failed_precondition, fmt::format("{} is a {} and {}", task, role, what));
}

}  // namespace pscoro::wire

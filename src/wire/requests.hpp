// The kinds of request (pscoro.proto's Request.body) as the servers see them: which tasks may make
// a kind, and the one way a task that serves no such request refuses it. Which kinds a task serves
// is its service's (ps::ps_service::kinds_served, worker::worker_service::kinds_served); the server
// answers Heartbeat and Shutdown itself and refuses the rest in one place (server.cpp, serve()).
#pragma once

#include <pscoro/error.hpp>

#include "pscoro.pb.h"

#include <algorithm>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace pscoro::wire {

/// The message name of a kind, as in pscoro.proto ("RunFunction"); "an empty request" for none.
std::string_view request_name(Request::BodyCase kind) noexcept;

/// What `request` does, when only the chief may make it ("end the job"): Shutdown, DeleteVariable,
/// HashImport, and a HashExport that is part of a save. Empty for every other request.
std::string_view chief_only_action(const Request& request) noexcept;

/// The refusal of `request` by `task`, whose role (`role`: "parameter server", "worker") serves no
/// request of its kind: failed_precondition, "ps:0 is a parameter server and runs no worker
/// functions ('model.step' was sent here)"; an empty request is invalid_argument.
error not_served(const Request& request, std::string_view role, std::string_view task);

/// True when `kinds` (a service's kinds_served) holds `kind`.
inline bool serves(std::span<const Request::BodyCase> kinds, Request::BodyCase kind) noexcept {
  return std::ranges::find(kinds, kind) != kinds.end();
}

}  // namespace pscoro::wire

#include "runtime/ps_service.hpp"

#include "runtime/values.hpp"
#include "wire/connection.hpp"

#include <fmt/format.h>

#include <cstring>

namespace pscoro::runtime {

namespace {

[[noreturn]] void invalid(std::string message) { throw error(errc::invalid_argument, std::move(message)); }

std::string_view op_name(wire::UpdateVariable::Op op) {
  switch (op) {
    case wire::UpdateVariable::ASSIGN: return "assign";
    case wire::UpdateVariable::ASSIGN_ADD: return "assign_add";
    case wire::UpdateVariable::ASSIGN_SUB: return "assign_sub";
    default: return "unknown update";
  }
}

template <class T>
void apply(T* destination, const T* source, std::size_t n, bool subtract) {
  if (subtract) {
    for (std::size_t i = 0; i < n; ++i) destination[i] -= source[i];
  } else {
    for (std::size_t i = 0; i < n; ++i) destination[i] += source[i];
  }
}

}  // namespace

wire::frame ps_service::handle(const wire::frame& request) {
  wire::frame response;
  response.message.mutable_response();
  try {
    const auto& body = request.message.request();
    switch (body.body_case()) {
      case wire::Request::kCreateVariable: create(request, body.create_variable()); break;
      case wire::Request::kReadVariable: read(request, body.read_variable(), response); break;
      case wire::Request::kUpdateVariable: update(request, body.update_variable()); break;
      case wire::Request::kRunFunction:
        throw error(errc::failed_precondition,
                    fmt::format("{} is a parameter server and runs no worker functions ('{}' was sent here)", task_,
                                body.run_function().name()));
      case wire::Request::BODY_NOT_SET: throw error(errc::invalid_argument, "empty request");
    }
  } catch (const error& e) {
    response = wire::frame{};
    wire::set_status(*response.message.mutable_response()->mutable_status(), e.code(), e.what(), task_);
  }
  return response;
}

void ps_service::create(const wire::frame& request, const wire::CreateVariable& create) {
  const variable_ref ref = decode_ref(create.variable());
  const tensor initial = wire::get_tensor(request, create.initial_value());
  if (ref.name.empty()) invalid("a variable needs a name");
  if (initial.type() != ref.type || initial.shape() != ref.shape) {
    invalid(fmt::format("initial value of '{}' is {} {} but the variable is {} {}", ref.name, name_of(initial.type()),
                        to_string(initial.shape()), name_of(ref.type), to_string(ref.shape)));
  }
  if (variables_.contains(ref.name)) {
    throw error(errc::already_exists, fmt::format("variable '{}' already exists on {}", ref.name, task_));
  }
  // The frame's segment becomes the variable's storage: no copy.
  variables_.emplace(ref.name, stored_variable{ref.type, ref.shape, initial.bytes()});
}

ps_service::stored_variable& ps_service::find(const wire::VariableRef& ref, std::string_view operation) {
  const variable_ref wanted = decode_ref(ref);
  auto it = variables_.find(wanted.name);
  if (it == variables_.end()) {
    throw error(errc::not_found, fmt::format("{}: variable '{}' does not exist on {}", operation, wanted.name, task_));
  }
  auto& stored = it->second;
  if (stored.type != wanted.type || stored.shape != wanted.shape) {
    invalid(fmt::format("{}: the handle says '{}' is {} {} but {} holds it as {} {}", operation, wanted.name,
                        name_of(wanted.type), to_string(wanted.shape), task_, name_of(stored.type),
                        to_string(stored.shape)));
  }
  return stored;
}

void ps_service::read(const wire::frame&, const wire::ReadVariable& read, wire::frame& response) {
  auto& stored = find(read.variable(), "read");
  // The reply shares the storage; a later update copies first (see update), so the bytes being
  // written out never change underneath the write.
  wire::put_tensor(response, *response.message.mutable_response()->mutable_result()->mutable_tensor(),
                   tensor(stored.type, stored.shape, stored.bytes));
}

void ps_service::update(const wire::frame& request, const wire::UpdateVariable& update) {
  const auto op = update.op();
  const auto name = op_name(op);
  auto& stored = find(update.variable(), name);
  const tensor value = wire::get_tensor(request, update.value());
  if (value.type() != stored.type) {
    invalid(fmt::format("{} to '{}': dtype {} does not match the variable's {}", name, update.variable().name(),
                        name_of(value.type()), name_of(stored.type)));
  }
  if (value.shape() != stored.shape) {
    invalid(fmt::format("{} to '{}': shape {} does not match the variable's {}", name, update.variable().name(),
                        to_string(value.shape()), to_string(stored.shape)));
  }
  if (op == wire::UpdateVariable::ASSIGN) {
    stored.bytes = value.bytes();  // adopt the received segment
    return;
  }
  if (op != wire::UpdateVariable::ASSIGN_ADD && op != wire::UpdateVariable::ASSIGN_SUB) {
    invalid(fmt::format("unknown update operation {}", static_cast<int>(op)));
  }
  if (!stored.bytes.unique()) {
    // A reply still holds these bytes: copy on write.
    byte_buffer fresh(stored.bytes.size());
    if (fresh.size()) std::memcpy(fresh.data(), stored.bytes.data(), fresh.size());
    stored.bytes = std::move(fresh);
  }
  visit_dtype(stored.type, [&](auto zero) {
    using T = decltype(zero);
    apply(reinterpret_cast<T*>(stored.bytes.data()), value.data<T>(), value.size(),
          op == wire::UpdateVariable::ASSIGN_SUB);
  });
}

}  // namespace pscoro::runtime

#include "runtime/ps_client.hpp"

#include "runtime/values.hpp"

#include <fmt/format.h>

namespace pscoro::runtime {

peer& ps_client::ps_of(const variable_ref& variable) const {
  if (variable.ps_task < 0 || static_cast<std::size_t>(variable.ps_task) >= ps_.size()) {
    throw error(errc::invalid_argument, fmt::format("variable '{}' is placed on ps task {} but the cluster has {} ps",
                                                    variable.name, variable.ps_task, ps_.size()));
  }
  return *ps_[variable.ps_task];
}

asio::awaitable<void> ps_client::create(variable_ref variable, tensor initial_value) {
  peer& ps = ps_of(variable);
  wire::frame request;
  auto* create = request.message.mutable_request()->mutable_create_variable();
  encode_ref(*create->mutable_variable(), variable);
  wire::put_tensor(request, *create->mutable_initial_value(), initial_value);
  co_await ps.call(std::move(request));
}

asio::awaitable<tensor> ps_client::read(variable_ref variable) {
  peer& ps = ps_of(variable);
  wire::frame request;
  encode_ref(*request.message.mutable_request()->mutable_read_variable()->mutable_variable(), variable);
  const auto response = co_await ps.call(std::move(request));
  const auto& result = response.message.response().result();
  if (!result.has_tensor()) {
    throw error(errc::protocol_error, fmt::format("{} answered a read of '{}' without a tensor", ps.task(), variable.name));
  }
  co_return wire::get_tensor(response, result.tensor());
}

asio::awaitable<void> ps_client::update(variable_ref variable, update_op op, tensor value) {
  peer& ps = ps_of(variable);
  wire::frame request;
  auto* update = request.message.mutable_request()->mutable_update_variable();
  encode_ref(*update->mutable_variable(), variable);
  update->set_op(op == update_op::assign       ? wire::UpdateVariable::ASSIGN
                 : op == update_op::assign_add ? wire::UpdateVariable::ASSIGN_ADD
                                               : wire::UpdateVariable::ASSIGN_SUB);
  wire::put_tensor(request, *update->mutable_value(), value);
  co_await ps.call(std::move(request));
}

}  // namespace pscoro::runtime

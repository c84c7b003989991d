// The parameter-server role: holds variables and serves create, read and update requests.
// Every update is checked (dtype, shape, the caller's idea of the variable) before anything
// changes, so a bad request leaves the variable as it was.
#pragma once

#include "wire/frame.hpp"

#include <asio/awaitable.hpp>

#include <string>
#include <unordered_map>

namespace pscoro::runtime {

class ps_service {
 public:
  explicit ps_service(std::string task) : task_(std::move(task)) {}

  /// Serves one request frame; failures come back as an error status, never as an exception.
  wire::frame handle(const wire::frame& request);

  std::size_t num_variables() const noexcept { return variables_.size(); }

 private:
  struct stored_variable {
    dtype type;
    shape_type shape;
    byte_buffer bytes;
  };

  void create(const wire::frame& request, const wire::CreateVariable& create);
  void read(const wire::frame& request, const wire::ReadVariable& read, wire::frame& response);
  void update(const wire::frame& request, const wire::UpdateVariable& update);
  stored_variable& find(const wire::VariableRef& ref, std::string_view operation);

  std::string task_;
  std::unordered_map<std::string, stored_variable> variables_;
};

}  // namespace pscoro::runtime

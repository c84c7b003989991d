// The parameter-server role: holds variables (and optimizer slots beside them) and serves create,
// read, gather, update, scatter and optimizer requests. Every request is checked in full (dtype,
// shape, ids, the caller's idea of the variable, parameters) before anything changes, so a bad
// request leaves every variable as it was.
#pragma once

#include "wire/frame.hpp"

#include <span>
#include <string>
#include <unordered_map>

namespace pscoro::runtime {

class ps_service {
 public:
  explicit ps_service(std::string task) : task_(std::move(task)) {}

  /// Serves one request frame; failures come back as an error status, never as an exception.
  wire::frame handle(const wire::frame& request);

  std::size_t num_variables() const noexcept { return variables_.size(); }
  /// Drops every variable and slot (the coordinator session that made them ended).
  void clear() noexcept { variables_.clear(); }

 private:
  struct stored_variable {
    dtype type;
    shape_type shape;
    byte_buffer bytes;
    std::string slot_of;  // an optimizer slot: the variable it belongs to (else empty)
    double slot_initial_value = 0;
  };

  void create(const wire::frame& request, const wire::CreateVariable& create);
  void read(const wire::frame& request, const wire::ReadVariable& read, wire::frame& response);
  void update(const wire::frame& request, const wire::UpdateVariable& update);
  void apply_gradient(const wire::frame& request, const wire::ApplyGradient& apply);
  void list_slots(const wire::ListSlots& list, wire::frame& response);
  stored_variable& find(const wire::VariableRef& ref, std::string_view operation);
  /// The slot `name` of `variable` (created with `initial_value` on first use).
  stored_variable& slot(const std::string& variable, const stored_variable& of, const std::string& name, dtype type,
                        const shape_type& shape, double initial_value);
  /// Validates `range` as rows of `variable`: begin <= end <= rows, and the variable has rows.
  void check_rows(const wire::RowRange& range, const stored_variable& variable, std::string_view operation,
                  const std::string& name) const;
  /// Validates `indices` as row ids of `variable`: int64, 1-D, each in [0, rows).
  std::span<const std::int64_t> row_ids(const tensor& indices, const stored_variable& variable,
                                        std::string_view operation, const std::string& name) const;

  std::string task_;
  std::unordered_map<std::string, stored_variable> variables_;
};

}  // namespace pscoro::runtime

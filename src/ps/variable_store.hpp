// What a ps holds: its variables and optimizer slots by name, the bytes they count against the
// limits, and the checks every request makes against them before anything changes (room, the
// caller's idea of a variable, rows and ids). Pure: no executor, no wire, no kernels; ps_service
// decodes requests, runs kernels and answers.
#pragma once

#include <pscoro/detail/variable_io.hpp>
#include <pscoro/tensor.hpp>

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace pscoro::ps {

/// One variable or optimizer slot as a ps holds it.
struct stored_variable {
  dtype type;
  shape_type shape;
  byte_buffer bytes;
  std::string slot_of;  // an optimizer slot: the variable it belongs to (else empty)
  double slot_initial_value = 0;
};

/// A slot an optimizer keeps beside a variable.
struct slot_plan {
  std::string name;  // "w/adam/m"
  dtype type;
  shape_type shape;
  double initial_value;
};

/// "300 bytes", "16.0 KiB (16384 bytes)": sizes in the ps's messages.
std::string bytes_text(std::uint64_t n);

class variable_store {
 public:
  /// The store of `task` ("ps:0", named in refusals), holding at most `max_ps_bytes` in all and
  /// `max_variable_bytes` per variable.
  variable_store(std::string task, std::uint64_t max_ps_bytes, std::uint64_t max_variable_bytes);

  /// Refuses (errc::invalid_argument) a shape whose size in bytes does not fit in 64 bits, and
  /// returns that size.
  std::uint64_t checked_bytes(std::string_view context, dtype type, const shape_type& shape) const;
  /// Refuses (errc::resource_exhausted) to hold a variable or slot `name` of `type` and `shape`
  /// when its values are over max_variable_bytes, or when it would take the store past
  /// max_ps_bytes with `pending` bytes already promised in this request; returns what it would add.
  /// `what` comes before the dtype in the message: "" for the variable of `context`, "slot
  /// 'w/adam/m' of 'w', ".
  std::uint64_t check_room(std::string_view context, std::string_view what, const std::string& name, dtype type,
                           const shape_type& shape, std::uint64_t pending) const;
  /// Checks that the slots in `plans` of `variable` (held as `of`) either exist as planned or fit
  /// in the limits together; changes nothing.
  void check_slots(std::string_view context, const std::string& variable, const stored_variable& of,
                   std::span<const slot_plan> plans) const;

  /// Holds `stored` under `name` (which is not held), counting its bytes.
  stored_variable& hold(const std::string& name, stored_variable stored);
  /// The variable `wanted` names, as the caller thinks it is: errc::not_found when it is not held,
  /// errc::invalid_argument when its dtype or shape differ. `operation` starts the message.
  stored_variable& find(const variable_ref& wanted, std::string_view operation);
  /// The variable or slot `name`, or null.
  const stored_variable* find(const std::string& name) const;
  stored_variable* find(const std::string& name);
  bool contains(const std::string& name) const { return variables_.contains(name); }
  /// Drops `name` (which is held) and its slots, giving back their bytes.
  void remove(const std::string& name);
  /// Drops everything.
  void clear() noexcept;
  /// The slots of `variable`, by name.
  std::vector<std::pair<std::string, const stored_variable*>> slots_of(const std::string& variable) const;

  std::size_t size() const noexcept { return variables_.size(); }
  /// Bytes held for variables and slots, as max_ps_bytes counts them (values and bookkeeping).
  std::uint64_t held_bytes() const noexcept { return held_bytes_; }
  std::uint64_t max_ps_bytes() const noexcept { return max_ps_bytes_; }
  /// What the ps's hash tables hold besides (ps_service counts them): room checks count them too.
  void set_table_bytes(std::uint64_t bytes) noexcept { table_bytes_ = bytes; }
  std::uint64_t max_variable_bytes() const noexcept { return max_variable_bytes_; }
  const std::string& task() const noexcept { return task_; }

 private:
  void release(std::unordered_map<std::string, stored_variable>::iterator it);

  std::string task_;
  std::uint64_t max_ps_bytes_;
  std::uint64_t max_variable_bytes_;
  std::uint64_t held_bytes_ = 0;
  std::uint64_t table_bytes_ = 0;
  std::unordered_map<std::string, stored_variable> variables_;
};

/// Validates rows [`begin`, `end`) of `variable`: begin <= end <= rows, and the variable has rows.
void check_rows(std::uint64_t begin, std::uint64_t end, const stored_variable& variable, std::string_view operation,
                const std::string& name);
/// Validates `indices` as row ids of `variable`: int64, 1-D, each in [0, rows).
std::span<const std::int64_t> row_ids(const tensor& indices, const stored_variable& variable,
                                      std::string_view operation, const std::string& name);

}  // namespace pscoro::ps

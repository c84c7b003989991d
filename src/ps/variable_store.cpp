#include "ps/variable_store.hpp"

#include <pscoro/error.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <limits>

namespace pscoro::ps {

namespace {

// (Names of their own: this file may share a unity unit's anonymous namespace with ps_service.cpp.)
[[noreturn]] void refuse_argument(std::string message) { throw error(errc::invalid_argument, std::move(message)); }

std::uint64_t add_saturating(std::uint64_t a, std::uint64_t b) noexcept {
  constexpr std::uint64_t most = std::numeric_limits<std::uint64_t>::max();
  return a > most - b ? most : a + b;
}

// What holding a variable costs beside its values: its name, its shape, the hash-map node and the
// buffer's control block (256 bytes is on the high side for the node and block on 64-bit systems).
// Counting them keeps millions of tiny variables, or a few with huge names, within max_ps_bytes.
constexpr std::uint64_t bookkeeping_bytes = 256;

std::uint64_t footprint(const std::string& name, const shape_type& shape, std::uint64_t value_bytes) noexcept {
  return add_saturating(value_bytes, name.size() + shape.size() * sizeof(std::size_t) + bookkeeping_bytes);
}

}  // namespace

std::string bytes_text(std::uint64_t n) {
  if (n < 1024) return fmt::format("{} bytes", n);
  constexpr std::string_view units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double scaled = static_cast<double>(n) / 1024;
  std::size_t unit = 0;
  for (; scaled >= 1024 && unit + 1 < std::size(units); ++unit) scaled /= 1024;
  return fmt::format("{:.1f} {} ({} bytes)", scaled, units[unit], n);
}

variable_store::variable_store(std::string task, std::uint64_t max_ps_bytes, std::uint64_t max_variable_bytes)
    : task_(std::move(task)), max_ps_bytes_(max_ps_bytes), max_variable_bytes_(max_variable_bytes) {}

std::uint64_t variable_store::checked_bytes(std::string_view context, dtype type, const shape_type& shape) const {
  const auto bytes = checked_size_bytes(type, shape);
  if (!bytes) {
    refuse_argument(fmt::format("{}: {} {} is too large (its size in bytes does not fit in 64 bits)", context,
                                name_of(type), to_string(shape)));
  }
  return *bytes;
}

std::uint64_t variable_store::check_room(std::string_view context, std::string_view what, const std::string& name,
                                         dtype type, const shape_type& shape, std::uint64_t pending) const {
  const std::uint64_t bytes = checked_bytes(context, type, shape);
  const auto held = add_saturating(add_saturating(held_bytes_, table_bytes_), pending);
  if (bytes > max_variable_bytes_) {
    throw error(errc::resource_exhausted, fmt::format("{}: {}{} {} takes {}, more than the {} {} allows per variable "
                                                      "(server_options::max_variable_bytes raises it; {} holds {})",
                                                      context, what, name_of(type), to_string(shape), bytes_text(bytes),
                                                      bytes_text(max_variable_bytes_), task_, task_, bytes_text(held)));
  }
  const std::uint64_t adds = footprint(name, shape, bytes);
  if (adds > max_ps_bytes_ || held > max_ps_bytes_ - adds) {
    throw error(
        errc::resource_exhausted,
        fmt::format("{}: {}{} {} takes {} and {} already holds {} of variables, slots and tables{}: that is past "
                    "its limit of {} (server_options::max_ps_bytes raises it)",
                    context, what, name_of(type), to_string(shape), bytes_text(bytes), task_, bytes_text(held),
                    pending ? " (counting the slots this step creates before it)" : "", bytes_text(max_ps_bytes_)));
  }
  return adds;
}

void variable_store::check_slots(std::string_view context, const std::string& variable, const stored_variable& of,
                                 std::span<const slot_plan> plans) const {
  std::uint64_t pending = 0;  // slots this request creates before the one checked
  for (const auto& plan : plans) {
    const auto it = variables_.find(plan.name);
    if (it == variables_.end()) {
      pending = add_saturating(pending, check_room(context, fmt::format("slot '{}' of '{}', ", plan.name, variable),
                                                   plan.name, plan.type, plan.shape, pending));
    } else if (it->second.type != plan.type || it->second.shape != plan.shape) {
      refuse_argument(fmt::format("{}: slot '{}' of {} {} exists as {} {}", context, plan.name, name_of(of.type),
                                  to_string(of.shape), name_of(it->second.type), to_string(it->second.shape)));
    }
  }
}

stored_variable& variable_store::hold(const std::string& name, stored_variable stored) {
  const auto adds = footprint(name, stored.shape, stored.bytes.size());
  auto& held = variables_.emplace(name, std::move(stored)).first->second;
  held_bytes_ = add_saturating(held_bytes_, adds);
  return held;
}

stored_variable& variable_store::find(const variable_ref& wanted, std::string_view operation) {
  auto it = variables_.find(wanted.name);
  if (it == variables_.end()) {
    throw error(errc::not_found, fmt::format("{}: variable '{}' does not exist on {}", operation, wanted.name, task_));
  }
  auto& stored = it->second;
  if (stored.type != wanted.type || stored.shape != wanted.shape) {
    refuse_argument(fmt::format("{}: the handle says '{}' is {} {} but {} holds it as {} {}", operation, wanted.name,
                                name_of(wanted.type), to_string(wanted.shape), task_, name_of(stored.type),
                                to_string(stored.shape)));
  }
  return stored;
}

const stored_variable* variable_store::find(const std::string& name) const {
  const auto it = variables_.find(name);
  return it == variables_.end() ? nullptr : &it->second;
}

stored_variable* variable_store::find(const std::string& name) {
  const auto it = variables_.find(name);
  return it == variables_.end() ? nullptr : &it->second;
}

void variable_store::release(std::unordered_map<std::string, stored_variable>::iterator it) {
  const auto gives_back = footprint(it->first, it->second.shape, it->second.bytes.size());
  held_bytes_ -= std::min(held_bytes_, gives_back);
  variables_.erase(it);
}

void variable_store::remove(const std::string& name) {
  for (auto it = variables_.begin(); it != variables_.end();) {
    const auto next = std::next(it);
    if (it->second.slot_of == name) release(it);
    it = next;
  }
  if (const auto it = variables_.find(name); it != variables_.end()) release(it);
}

void variable_store::clear() noexcept {
  variables_.clear();
  held_bytes_ = 0;
}

std::vector<std::pair<std::string, const stored_variable*>> variable_store::slots_of(
    const std::string& variable) const {
  std::vector<std::pair<std::string, const stored_variable*>> slots;
  for (const auto& [name, stored] : variables_) {
    if (stored.slot_of == variable) slots.emplace_back(name, &stored);
  }
  // By name: the order must not depend on the hash map's.
  std::sort(slots.begin(), slots.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return slots;
}

void check_rows(std::uint64_t begin, std::uint64_t end, const stored_variable& variable, std::string_view operation,
                const std::string& name) {
  if (variable.shape.empty())
    refuse_argument(fmt::format("{} of '{}': a scalar variable has no rows", operation, name));
  if (begin > end || end > variable.shape[0]) {
    refuse_argument(fmt::format("{} of '{}': rows [{}, {}) are not within [0, {})", operation, name, begin, end,
                                variable.shape[0]));
  }
}

std::span<const std::int64_t> row_ids(const tensor& indices, const stored_variable& variable,
                                      std::string_view operation, const std::string& name) {
  if (variable.shape.empty())
    refuse_argument(fmt::format("{} of '{}': a scalar variable has no rows", operation, name));
  if (indices.type() != dtype::int64 || indices.shape().size() != 1) {
    refuse_argument(fmt::format("{} of '{}': ids must be a 1-D int64 tensor, got {} {}", operation, name,
                                name_of(indices.type()), to_string(indices.shape())));
  }
  const std::span<const std::int64_t> ids(indices.data<std::int64_t>(), indices.size());
  const std::uint64_t rows = variable.shape[0];
  for (std::size_t k = 0; k < ids.size(); ++k) {
    if (ids[k] < 0 || static_cast<std::uint64_t>(ids[k]) >= rows) {
      refuse_argument(
          fmt::format("{} of '{}': id {} (position {}) is out of range [0, {})", operation, name, ids[k], k, rows));
    }
  }
  return ids;
}

}  // namespace pscoro::ps

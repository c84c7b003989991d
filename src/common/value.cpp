#include <pscoro/tensor.hpp>
#include <pscoro/value.hpp>

#include <fmt/format.h>
#include "common/text.hpp"

namespace pscoro {

std::string to_string(std::span<const std::size_t> shape) {
  // Appended, not "[" + ... + "]": g++ 12 at -O3 reports a false -Wrestrict on that (GCC 105329).
  std::string out = "[";
  out += common::join(shape, ", ");
  out += ']';
  return out;
}

std::string describe(const value& v) {
  struct visitor {
    std::string operator()(std::monostate) const { return "nothing"; }
    std::string operator()(bool) const { return "bool"; }
    std::string operator()(std::int64_t) const { return "int64"; }
    std::string operator()(double) const { return "float64"; }
    std::string operator()(const std::string&) const { return "string"; }
    std::string operator()(const tensor& t) const {
      return fmt::format("tensor<{}>{}", name_of(t.type()), to_string(t.shape()));
    }
    std::string operator()(const variable_ref& r) const {
      return fmt::format("variable '{}' <{}>{}", r.name, name_of(r.type), to_string(r.shape));
    }
    std::string operator()(const per_worker_ref& r) const {
      return fmt::format("per-worker iterator {} of '{}'", r.id, r.function);
    }
    std::string operator()(const sharded_variable_ref& r) const {
      return fmt::format("sharded variable '{}' <{}>{} in {} shards", r.name, name_of(r.type), to_string(r.shape),
                         r.shards.size());
    }
    std::string operator()(const value_list& l) const { return fmt::format("a list of {}", l.items.size()); }
    std::string operator()(const hash_table_ref& r) const {
      return fmt::format("hash table '{}' <{}>[{}] in {} buckets on {} ps", r.name, name_of(r.type), r.dim, r.buckets,
                         r.ps_tasks.size());
    }
  };
  return std::visit(visitor{}, v);
}

namespace detail {

void throw_decode_mismatch(std::string_view expected, const value& got) {
  throw error(errc::invalid_argument, fmt::format("expected {}, got {}", expected, describe(got)));
}

std::vector<value>& items_of(value& v, std::string_view name, std::optional<std::size_t> count) {
  auto* list = std::get_if<value_list>(&v);
  if (!list) throw_decode_mismatch(name, v);
  if (count && list->items.size() != *count) {
    throw error(errc::invalid_argument,
                fmt::format("expected {} ({} values), got a list of {}", name, *count, list->items.size()));
  }
  return list->items;
}

}  // namespace detail
}  // namespace pscoro

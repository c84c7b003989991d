// pscoro::value <-> wire::Value, with tensors carried as frame segments.
#pragma once

#include <pscoro/detail/variable_io.hpp>
#include <pscoro/optimizers.hpp>
#include <pscoro/value.hpp>

#include "wire/frame.hpp"

namespace pscoro::wire {

/// Throws errc::invalid_argument naming `variable` for a code that is not a dtype.
dtype decode_dtype(std::uint32_t code, std::string_view variable);

void encode_ref(wire::VariableRef& out, const variable_ref& ref);
/// Throws errc::invalid_argument for an unknown dtype.
variable_ref decode_ref(const wire::VariableRef& in);

wire::Optimizer encode_optimizer(const optimizer& opt);
/// Throws errc::invalid_argument for an optimizer kind the protocol does not define; the fields a
/// kind does not use are ignored.
optimizer decode_optimizer(const wire::Optimizer& opt);

void encode_table_ref(wire::HashTableRef& out, const hash_table_ref& ref);
/// Throws errc::invalid_argument for an unknown dtype, or a dim or bucket count of 0.
hash_table_ref decode_table_ref(const wire::HashTableRef& in);

/// A table part's state; its filter's counters only `with_filter` (they travel as the bytes of an
/// int64 tensor: the wire has no byte dtype).
void encode_table_state(wire::frame& f, wire::HashTableState& out, const detail::table_state& state, bool with_filter);
/// Throws errc::invalid_argument naming `table` when the counters' tensor does not hold the count
/// stated, or the optimizer is not one the protocol defines.
detail::table_state decode_table_state(const wire::frame& f, const wire::HashTableState& in, std::string_view table);

void encode_value(wire::frame& f, wire::Value& out, const value& v);
/// Throws errc::invalid_argument when `in` does not describe a valid value of `f`.
/// Decodes `in`. Every value made (the value itself, each list, each item) takes one from
/// `budget`, which all the arguments of a request or the result of an answer share
/// (max_value_items): a peer's frame cannot make more values than that, however it splits or nests
/// them. Lists nest at most max_value_depth deep.
value decode_value(const wire::frame& f, const wire::Value& in, std::size_t& budget);

}  // namespace pscoro::wire

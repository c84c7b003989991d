// From the wire to the ps kernels' domain types, once, before any check: what an update and an
// initializer ask for (an optimizer decodes in wire/values.hpp: the chief reads it back too). A value the protocol does not define (an op, an
// optimizer or an initializer kind a newer or hostile peer sent) is errc::invalid_argument
// naming it. The fields an optimizer or initializer kind does not use are ignored
// (docs/protocol.md).
#pragma once

#include "ps/kernels.hpp"

#include <pscoro/optimizers.hpp>
#include <pscoro/tensor.hpp>

#include "pscoro.pb.h"

#include <string_view>

namespace pscoro::ps {

update_op decode_op(wire::UpdateVariable::Op op);
/// The initializer of a shard of `variable`: the seed on the wire is the one to draw from (the
/// chief mixed the variable's name into it).
kernels::shard_initializer decode_initializer(const wire::Initializer& init, std::string_view variable);
/// The name of an update as the user called it ("assign_add", "scatter_add"), for messages.
std::string_view op_name(update_op op, bool scatter);

}  // namespace pscoro::ps

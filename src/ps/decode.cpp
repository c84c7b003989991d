#include "ps/decode.hpp"

#include <pscoro/error.hpp>

#include <fmt/format.h>

#include <string>

namespace pscoro::ps {

namespace {
[[noreturn]] void unknown(std::string message) { throw error(errc::invalid_argument, std::move(message)); }
}  // namespace

update_op decode_op(wire::UpdateVariable::Op op) {
  switch (op) {
    case wire::UpdateVariable::ASSIGN: return update_op::assign;
    case wire::UpdateVariable::ADD: return update_op::add;
    case wire::UpdateVariable::SUB: return update_op::sub;
    case wire::UpdateVariable::MUL: return update_op::mul;
    case wire::UpdateVariable::DIV: return update_op::div;
    case wire::UpdateVariable::MIN: return update_op::min;
    case wire::UpdateVariable::MAX: return update_op::max;
    default: unknown(fmt::format("unknown update operation {}", static_cast<int>(op)));
  }
}

kernels::shard_initializer decode_initializer(const wire::Initializer& init, std::string_view variable) {
  kernels::shard_initializer out{.init = {},
                                 .full_shape = shape_type(init.full_shape().begin(), init.full_shape().end()),
                                 .row_offset = init.row_offset()};
  switch (init.kind()) {
    case wire::Initializer::ZEROS: out.init = initializers::zeros{}; break;
    case wire::Initializer::ONES: out.init = initializers::ones{}; break;
    case wire::Initializer::CONSTANT: out.init = initializers::constant{.value = init.a()}; break;
    case wire::Initializer::RANDOM_UNIFORM:
      out.init = initializers::random_uniform{.minval = init.a(), .maxval = init.b(), .seed = init.seed()};
      break;
    case wire::Initializer::RANDOM_NORMAL:
      out.init = initializers::random_normal{.mean = init.a(), .stddev = init.b(), .seed = init.seed()};
      break;
    case wire::Initializer::TRUNCATED_NORMAL:
      out.init = initializers::truncated_normal{.mean = init.a(), .stddev = init.b(), .seed = init.seed()};
      break;
    case wire::Initializer::GLOROT_UNIFORM: out.init = initializers::glorot_uniform{.seed = init.seed()}; break;
    default:
      unknown(fmt::format("create of '{}': unknown initializer {}", variable, static_cast<int>(init.kind())));
  }
  return out;
}

std::string_view op_name(update_op op, bool scatter) {
  switch (op) {
    case update_op::assign: return scatter ? "scatter_update" : "assign";
    case update_op::add: return scatter ? "scatter_add" : "assign_add";
    case update_op::sub: return scatter ? "scatter_sub" : "assign_sub";
    case update_op::mul: return scatter ? "scatter_mul" : "assign_mul";
    case update_op::div: return scatter ? "scatter_div" : "assign_div";
    case update_op::min: return scatter ? "scatter_min" : "assign_min";
    case update_op::max: return scatter ? "scatter_max" : "assign_max";
  }
  return "update";
}

}  // namespace pscoro::ps

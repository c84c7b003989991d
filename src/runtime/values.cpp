#include "runtime/values.hpp"

#include <fmt/format.h>

namespace pscoro::runtime {

void encode_ref(wire::VariableRef& out, const variable_ref& ref) {
  out.set_name(ref.name);
  out.set_dtype(static_cast<std::uint32_t>(ref.type));
  out.clear_shape();
  for (const auto dim : ref.shape) out.add_shape(dim);
  out.set_ps_task(ref.ps_task);
}

variable_ref decode_ref(const wire::VariableRef& in) {
  const auto type = static_cast<dtype>(in.dtype());
  if (in.dtype() > 255 || !is_valid(type)) {
    throw error(errc::invalid_argument, fmt::format("variable '{}' has unknown dtype {}", in.name(), in.dtype()));
  }
  return {in.name(), type, shape_type(in.shape().begin(), in.shape().end()), in.ps_task()};
}

void encode_value(wire::frame& f, wire::Value& out, const value& v) {
  struct visitor {
    wire::frame& f;
    wire::Value& out;
    void operator()(std::monostate) const { out.set_none(true); }
    void operator()(bool b) const { out.set_boolean(b); }
    void operator()(std::int64_t i) const { out.set_integer(i); }
    void operator()(double d) const { out.set_real(d); }
    void operator()(const std::string& s) const { out.set_text(s); }
    void operator()(const tensor& t) const { wire::put_tensor(f, *out.mutable_tensor(), t); }
    void operator()(const variable_ref& r) const { encode_ref(*out.mutable_variable(), r); }
  };
  std::visit(visitor{f, out}, v);
}

value decode_value(const wire::frame& f, const wire::Value& in) {
  switch (in.kind_case()) {
    case wire::Value::kNone: return std::monostate{};
    case wire::Value::kBoolean: return in.boolean();
    case wire::Value::kInteger: return in.integer();
    case wire::Value::kReal: return in.real();
    case wire::Value::kText: return in.text();
    case wire::Value::kTensor: return wire::get_tensor(f, in.tensor());
    case wire::Value::kVariable: return decode_ref(in.variable());
    case wire::Value::KIND_NOT_SET: break;
  }
  throw error(errc::invalid_argument, "a value with no kind");
}

}  // namespace pscoro::runtime

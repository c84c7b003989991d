#include "wire/values.hpp"

#include <fmt/format.h>

#include <cstring>

namespace pscoro::wire {

void encode_ref(wire::VariableRef& out, const variable_ref& ref) {
  out.set_name(ref.name);
  out.set_dtype(static_cast<std::uint32_t>(ref.type));
  out.clear_shape();
  for (const auto dim : ref.shape) out.add_shape(dim);
  out.set_ps_task(ref.ps_task);
}

dtype decode_dtype(std::uint32_t code, std::string_view variable) {
  const auto type = static_cast<dtype>(code);
  if (code > 255 || !is_valid(type)) {
    throw error(errc::invalid_argument, fmt::format("variable '{}' has unknown dtype {}", variable, code));
  }
  return type;
}

variable_ref decode_ref(const wire::VariableRef& in) {
  return {in.name(), decode_dtype(in.dtype(), in.name()), shape_type(in.shape().begin(), in.shape().end()),
          in.ps_task()};
}

wire::Optimizer encode_optimizer(const optimizer& opt) {
  wire::Optimizer out;
  struct visitor {
    wire::Optimizer& out;
    void operator()(const optimizers::sgd& o) const {
      out.set_kind(wire::Optimizer::SGD);
      out.set_learning_rate(o.learning_rate);
    }
    void operator()(const optimizers::momentum& o) const {
      out.set_kind(wire::Optimizer::MOMENTUM);
      out.set_learning_rate(o.learning_rate);
      out.set_momentum(o.momentum);
      out.set_nesterov(o.nesterov);
    }
    void operator()(const optimizers::adagrad& o) const {
      out.set_kind(wire::Optimizer::ADAGRAD);
      out.set_learning_rate(o.learning_rate);
      out.set_initial_accumulator_value(o.initial_accumulator_value);
      out.set_epsilon(o.epsilon);
    }
    void operator()(const optimizers::adam& o) const {
      out.set_kind(wire::Optimizer::ADAM);
      out.set_learning_rate(o.learning_rate);
      out.set_beta_1(o.beta_1);
      out.set_beta_2(o.beta_2);
      out.set_epsilon(o.epsilon);
    }
    void operator()(const optimizers::ftrl& o) const {
      out.set_kind(wire::Optimizer::FTRL);
      out.set_learning_rate(o.learning_rate);
      out.set_learning_rate_power(o.learning_rate_power);
      out.set_initial_accumulator_value(o.initial_accumulator_value);
      out.set_l1(o.l1);
      out.set_l2(o.l2);
      out.set_beta(o.beta);
    }
  };
  std::visit(visitor{out}, opt);
  return out;
}

optimizer decode_optimizer(const wire::Optimizer& opt) {
  switch (opt.kind()) {
    case wire::Optimizer::SGD: return optimizers::sgd{.learning_rate = opt.learning_rate()};
    case wire::Optimizer::MOMENTUM:
      return optimizers::momentum{.learning_rate = opt.learning_rate(),
                                  .momentum = opt.momentum(),
                                  .nesterov = opt.nesterov()};
    case wire::Optimizer::ADAGRAD:
      return optimizers::adagrad{.learning_rate = opt.learning_rate(),
                                 .initial_accumulator_value = opt.initial_accumulator_value(),
                                 .epsilon = opt.epsilon()};
    case wire::Optimizer::ADAM:
      return optimizers::adam{.learning_rate = opt.learning_rate(),
                              .beta_1 = opt.beta_1(),
                              .beta_2 = opt.beta_2(),
                              .epsilon = opt.epsilon()};
    case wire::Optimizer::FTRL:
      return optimizers::ftrl{.learning_rate = opt.learning_rate(),
                              .learning_rate_power = opt.learning_rate_power(),
                              .initial_accumulator_value = opt.initial_accumulator_value(),
                              .l1 = opt.l1(),
                              .l2 = opt.l2(),
                              .beta = opt.beta()};
    default: throw error(errc::invalid_argument, fmt::format("unknown optimizer {}", static_cast<int>(opt.kind())));
  }
}

void encode_table_state(wire::frame& f, wire::HashTableState& out, const detail::table_state& state,
                        bool with_filter) {
  out.set_clock(state.clock);
  out.set_steps(state.steps);
  out.set_save(state.save);
  if (state.owner) *out.mutable_optimizer() = encode_optimizer(*state.owner);
  if (!with_filter || state.filter.empty()) return;
  out.set_admission_counters(state.filter.size());
  tensor packed(dtype::int64, {(state.filter.size() + 7) / 8}, byte_buffer((state.filter.size() + 7) / 8 * 8));
  std::memcpy(packed.bytes().data(), state.filter.data(), state.filter.size());
  std::memset(packed.bytes().data() + state.filter.size(), 0, packed.size_bytes() - state.filter.size());
  put_tensor(f, *out.mutable_counters(), packed);
}

detail::table_state decode_table_state(const wire::frame& f, const wire::HashTableState& in, std::string_view table) {
  detail::table_state out{
      .clock = in.clock(), .steps = in.steps(), .owner = std::nullopt, .filter = {}, .save = in.save()};
  if (in.has_optimizer()) out.owner = decode_optimizer(in.optimizer());
  const std::uint64_t counters = in.admission_counters();
  if (counters == 0) return out;
  if (counters > (std::uint64_t{1} << 32)) {
    throw error(errc::invalid_argument, fmt::format("hash table '{}': {} admission counters (at most 2^32)", table,
                                                    counters));
  }
  const tensor packed = get_tensor(f, in.counters());
  if (packed.type() != dtype::int64 || packed.shape() != shape_type{(counters + 7) / 8}) {
    throw error(errc::invalid_argument,
                fmt::format("hash table '{}': {} admission counters travel as int64 [{}], not {} {}", table, counters,
                            (counters + 7) / 8, name_of(packed.type()), to_string(packed.shape())));
  }
  const auto* bytes = reinterpret_cast<const std::uint8_t*>(packed.bytes().data());
  out.filter.assign(bytes, bytes + counters);
  return out;
}

void encode_table_ref(wire::HashTableRef& out, const hash_table_ref& ref) {
  out.set_name(ref.name);
  out.set_dtype(static_cast<std::uint32_t>(ref.type));
  out.set_dim(ref.dim);
  out.set_buckets(ref.buckets);
  out.clear_ps_tasks();
  for (const int task : ref.ps_tasks) out.add_ps_tasks(task);
}

hash_table_ref decode_table_ref(const wire::HashTableRef& in) {
  if (in.dim() == 0 || in.buckets() == 0) {
    throw error(errc::invalid_argument, fmt::format("hash table '{}' has dim {} and {} buckets: neither may be 0",
                                                    in.name(), in.dim(), in.buckets()));
  }
  return {in.name(), decode_dtype(in.dtype(), in.name()), static_cast<std::size_t>(in.dim()), in.buckets(),
          std::vector<int>(in.ps_tasks().begin(), in.ps_tasks().end())};
}

void encode_value(wire::frame& f, wire::Value& out, const value& v) {
  struct visitor {
    wire::frame& f;
    wire::Value& out;
    void operator()(const value_list& l) const {
      auto& list = *out.mutable_list();
      for (const auto& item : l.items) encode_value(f, *list.add_items(), item);
    }
    void operator()(std::monostate) const { out.set_none(true); }
    void operator()(bool b) const { out.set_boolean(b); }
    void operator()(std::int64_t i) const { out.set_integer(i); }
    void operator()(double d) const { out.set_real(d); }
    void operator()(const std::string& s) const { out.set_text(s); }
    void operator()(const tensor& t) const { wire::put_tensor(f, *out.mutable_tensor(), t); }
    void operator()(const variable_ref& r) const { encode_ref(*out.mutable_variable(), r); }
    void operator()(const per_worker_ref& r) const {
      out.mutable_per_worker()->set_id(r.id);
      out.mutable_per_worker()->set_function(r.function);
    }
    void operator()(const sharded_variable_ref& r) const {
      auto& sharded = *out.mutable_sharded_variable();
      sharded.set_name(r.name);
      sharded.set_dtype(static_cast<std::uint32_t>(r.type));
      for (const auto dim : r.shape) sharded.add_shape(dim);
      for (const auto& shard : r.shards) encode_ref(*sharded.add_shards(), shard);
    }
    void operator()(const hash_table_ref& r) const { encode_table_ref(*out.mutable_hash_table(), r); }
  };
  std::visit(visitor{f, out}, v);
}

namespace {

// Takes `count` values from `budget`; errc::invalid_argument when it has fewer.
void take_values(std::size_t count, std::size_t& budget) {
  if (count > budget) {
    throw error(errc::invalid_argument,
                fmt::format("a request or answer holds more than {} values (pscoro::max_value_items); send numbers in "
                            "bulk as a tensor",
                            max_value_items));
  }
  budget -= count;
}

// Decodes `in`, `depth` lists deep; `in` itself was taken from `budget`, its items are taken here.
value decode_at(const wire::frame& f, const wire::Value& in, std::size_t depth, std::size_t& budget) {
  switch (in.kind_case()) {
    case wire::Value::kList: {
      // Bounded before anything is made: a peer's nesting must not run this stack out (protobuf's
      // own parse limit is 100), nor its item count the memory (no reserve from a count it chose).
      if (depth >= max_value_depth) {
        throw error(errc::invalid_argument,
                    fmt::format("a value nests lists more than {} deep (pscoro::max_value_depth)", max_value_depth));
      }
      take_values(static_cast<std::size_t>(in.list().items_size()), budget);
      value_list list;
      for (const auto& item : in.list().items()) list.items.push_back(decode_at(f, item, depth + 1, budget));
      return list;
    }
    case wire::Value::kNone: return std::monostate{};
    case wire::Value::kBoolean: return in.boolean();
    case wire::Value::kInteger: return in.integer();
    case wire::Value::kReal: return in.real();
    case wire::Value::kText: return in.text();
    case wire::Value::kTensor: return wire::get_tensor(f, in.tensor());
    case wire::Value::kVariable: return decode_ref(in.variable());
    case wire::Value::kPerWorker: return per_worker_ref{in.per_worker().id(), in.per_worker().function()};
    case wire::Value::kShardedVariable: {
      const auto& sharded = in.sharded_variable();
      sharded_variable_ref ref{sharded.name(), decode_dtype(sharded.dtype(), sharded.name()),
                               shape_type(sharded.shape().begin(), sharded.shape().end()), {}};
      ref.shards.reserve(sharded.shards_size());
      for (const auto& shard : sharded.shards()) ref.shards.push_back(decode_ref(shard));
      return ref;
    }
    case wire::Value::kHashTable: return decode_table_ref(in.hash_table());
    case wire::Value::KIND_NOT_SET: break;
  }
  throw error(errc::invalid_argument, "a value with no kind");
}

}  // namespace

value decode_value(const wire::frame& f, const wire::Value& in, std::size_t& budget) {
  take_values(1, budget);
  return decode_at(f, in, 0, budget);
}

}  // namespace pscoro::wire

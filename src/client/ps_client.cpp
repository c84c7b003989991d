#include "client/ps_client.hpp"

#include "wire/values.hpp"

#include <fmt/format.h>

#include <cstring>

namespace pscoro::client {

namespace {

wire::UpdateVariable::Op encode_op(update_op op) {
  switch (op) {
    case update_op::assign: return wire::UpdateVariable::ASSIGN;
    case update_op::add: return wire::UpdateVariable::ADD;
    case update_op::sub: return wire::UpdateVariable::SUB;
    case update_op::mul: return wire::UpdateVariable::MUL;
    case update_op::div: return wire::UpdateVariable::DIV;
    case update_op::min: return wire::UpdateVariable::MIN;
    case update_op::max: return wire::UpdateVariable::MAX;
  }
  throw error(errc::invalid_argument, fmt::format("unknown update operation {}", static_cast<int>(op)));
}

}  // namespace

net::peer& ps_client::ps_of(const variable_ref& variable) const {
  if (variable.ps_task < 0 || static_cast<std::size_t>(variable.ps_task) >= ps_.size()) {
    throw error(errc::invalid_argument, fmt::format("variable '{}' is placed on ps task {} but the cluster has {} ps",
                                                    variable.name, variable.ps_task, ps_.size()));
  }
  return *ps_[variable.ps_task];
}

asio::awaitable<void> ps_client::create(variable_ref variable, tensor initial_value) {
  net::peer& ps = ps_of(variable);
  wire::frame request;
  auto* create = request.message.mutable_request()->mutable_create_variable();
  encode_ref(*create->mutable_variable(), variable);
  wire::put_tensor(request, *create->mutable_initial_value(), initial_value);
  co_await ps.call(std::move(request));
}

asio::awaitable<void> ps_client::create(variable_ref variable, wire::Initializer initializer) {
  net::peer& ps = ps_of(variable);
  wire::frame request;
  auto* create = request.message.mutable_request()->mutable_create_variable();
  encode_ref(*create->mutable_variable(), variable);
  *create->mutable_initializer() = std::move(initializer);
  co_await ps.call(std::move(request));
}

asio::awaitable<void> ps_client::remove(variable_ref variable) {
  net::peer& ps = ps_of(variable);
  wire::frame request;
  encode_ref(*request.message.mutable_request()->mutable_delete_variable()->mutable_variable(), variable);
  co_await ps.call(std::move(request));
}

asio::awaitable<tensor> ps_client::read_tensor(net::peer& ps, wire::frame request, const variable_ref& variable,
                                               byte_buffer into, arrival_handler on_arrival) {
  std::vector<wire::segment_target> receive_into;
  if (into.size()) receive_into.push_back({std::move(into), std::move(on_arrival)});
  const auto response = co_await ps.call(std::move(request), std::move(receive_into));
  const auto& result = response.message.response().result();
  if (!result.has_tensor()) {
    throw error(errc::protocol_error, fmt::format("{} answered a read of '{}' without a tensor", ps.task(), variable.name));
  }
  co_return wire::get_tensor(response, result.tensor());
}

asio::awaitable<tensor> ps_client::read(variable_ref variable, byte_buffer into) {
  net::peer& ps = ps_of(variable);
  wire::frame request;
  encode_ref(*request.message.mutable_request()->mutable_read_variable()->mutable_variable(), variable);
  co_return co_await read_tensor(ps, std::move(request), variable, std::move(into));
}

asio::awaitable<tensor> ps_client::gather(variable_ref variable, tensor ids, byte_buffer into,
                                          arrival_handler on_arrival) {
  net::peer& ps = ps_of(variable);
  wire::frame request;
  auto* read = request.message.mutable_request()->mutable_read_variable();
  encode_ref(*read->mutable_variable(), variable);
  wire::put_tensor(request, *read->mutable_indices(), ids);
  co_return co_await read_tensor(ps, std::move(request), variable, std::move(into), std::move(on_arrival));
}

asio::awaitable<void> ps_client::update(variable_ref variable, update_op op, tensor value) {
  net::peer& ps = ps_of(variable);
  wire::frame request;
  auto* update = request.message.mutable_request()->mutable_update_variable();
  encode_ref(*update->mutable_variable(), variable);
  update->set_op(encode_op(op));
  wire::put_tensor(request, *update->mutable_value(), value);
  co_await ps.call(std::move(request));
}

asio::awaitable<void> ps_client::scatter(variable_ref variable, update_op op, tensor ids, tensor rows) {
  net::peer& ps = ps_of(variable);
  wire::frame request;
  auto* update = request.message.mutable_request()->mutable_update_variable();
  encode_ref(*update->mutable_variable(), variable);
  update->set_op(encode_op(op));
  wire::put_tensor(request, *update->mutable_value(), rows);
  wire::put_tensor(request, *update->mutable_indices(), ids);
  co_await ps.call(std::move(request));
}

asio::awaitable<void> ps_client::apply_gradient(variable_ref variable, optimizer opt, tensor gradient,
                                                std::optional<tensor> ids) {
  net::peer& ps = ps_of(variable);
  wire::frame request;
  auto* apply = request.message.mutable_request()->mutable_apply_gradient();
  encode_ref(*apply->mutable_variable(), variable);
  *apply->mutable_optimizer() = wire::encode_optimizer(opt);
  wire::put_tensor(request, *apply->mutable_gradient(), gradient);
  if (ids) wire::put_tensor(request, *apply->mutable_indices(), *ids);
  co_await ps.call(std::move(request));
}

asio::awaitable<tensor> ps_client::read_rows(variable_ref variable, std::uint64_t begin, std::uint64_t end,
                                             byte_buffer into) {
  net::peer& ps = ps_of(variable);
  wire::frame request;
  auto* read = request.message.mutable_request()->mutable_read_variable();
  encode_ref(*read->mutable_variable(), variable);
  read->mutable_rows()->set_begin(begin);
  read->mutable_rows()->set_end(end);
  co_return co_await read_tensor(ps, std::move(request), variable, std::move(into));
}

asio::awaitable<void> ps_client::update_rows(variable_ref variable, update_op op, std::uint64_t begin, tensor rows) {
  net::peer& ps = ps_of(variable);
  if (rows.shape().empty()) {
    throw error(errc::invalid_argument, fmt::format("update of rows of '{}': a scalar value has no rows", variable.name));
  }
  wire::frame request;
  auto* update = request.message.mutable_request()->mutable_update_variable();
  encode_ref(*update->mutable_variable(), variable);
  update->set_op(encode_op(op));
  update->mutable_rows()->set_begin(begin);
  update->mutable_rows()->set_end(begin + rows.shape()[0]);
  wire::put_tensor(request, *update->mutable_value(), rows);
  co_await ps.call(std::move(request));
}

asio::awaitable<std::vector<detail::variable_io::slot_info>> ps_client::list_slots(variable_ref variable) {
  net::peer& ps = ps_of(variable);
  wire::frame request;
  encode_ref(*request.message.mutable_request()->mutable_list_slots()->mutable_variable(), variable);
  const auto response = co_await ps.call(std::move(request));
  std::vector<slot_info> out;
  for (const auto& info : response.message.response().slots()) {
    variable_ref slot = wire::decode_ref(info.slot());
    slot.ps_task = variable.ps_task;
    out.push_back({std::move(slot), info.initial_value()});
  }
  co_return out;
}

asio::awaitable<void> ps_client::create_slot(variable_ref variable, variable_ref slot, double initial_value) {
  net::peer& ps = ps_of(variable);
  wire::frame request;
  auto* create = request.message.mutable_request()->mutable_create_variable();
  encode_ref(*create->mutable_variable(), slot);
  auto& fill = *create->mutable_initializer();
  fill.set_kind(wire::Initializer::CONSTANT);
  fill.set_a(initial_value);
  for (const auto d : slot.shape) fill.add_full_shape(d);
  create->mutable_slot_of()->set_variable(variable.name);
  create->mutable_slot_of()->set_initial_value(initial_value);
  co_await ps.call(std::move(request));
}

net::peer& ps_client::ps_of(int ps_task, const std::string& table) const {
  if (ps_task < 0 || static_cast<std::size_t>(ps_task) >= ps_.size()) {
    throw error(errc::invalid_argument, fmt::format("hash table '{}' has buckets on ps task {} but the cluster has {} ps",
                                                    table, ps_task, ps_.size()));
  }
  return *ps_[ps_task];
}

asio::awaitable<void> ps_client::create_table_part(int ps_task, wire::CreateHashTable create) {
  net::peer& ps = ps_of(ps_task, create.table().name());
  wire::frame request;
  *request.message.mutable_request()->mutable_create_hash_table() = std::move(create);
  co_await ps.call(std::move(request));
}

asio::awaitable<void> ps_client::remove_table_part(int ps_task, std::string name) {
  net::peer& ps = ps_of(ps_task, name);
  wire::frame request;
  request.message.mutable_request()->mutable_delete_variable()->mutable_variable()->set_name(std::move(name));
  co_await ps.call(std::move(request));
}

namespace {

void put_table_parts(wire::frame& request, google::protobuf::RepeatedPtrField<wire::HashIds>& out,
                     const std::vector<detail::variable_io::table_ids>& parts, bool gradients) {
  for (const auto& part : parts) {
    auto& ids = *out.Add();
    encode_table_ref(*ids.mutable_table(), part.table);
    wire::put_tensor(request, *ids.mutable_ids(), part.ids);
    if (gradients) wire::put_tensor(request, *ids.mutable_gradients(), part.gradients);
  }
}

}  // namespace

asio::awaitable<std::vector<tensor>> ps_client::hash_lookup(int ps_task, std::vector<table_ids> parts, bool insert,
                                                         std::vector<rows_target> into) {
  if (parts.empty()) co_return std::vector<tensor>{};
  net::peer& ps = ps_of(ps_task, parts.front().table.name);
  wire::frame request;
  auto* lookup = request.message.mutable_request()->mutable_hash_lookup();
  lookup->set_insert(insert);
  put_table_parts(request, *lookup->mutable_parts(), parts, false);
  // The reply's k-th segment is the k-th part's rows (the ps puts them in order, and a reply laid
  // out otherwise is caught below, by its sizes or by where each tensor was read).
  std::vector<wire::segment_target> receive_into;
  receive_into.reserve(into.size());
  for (auto& target : into) receive_into.push_back({std::move(target.into), std::move(target.on_arrival)});
  const auto response = co_await ps.call(std::move(request), std::move(receive_into));
  const auto& result = response.message.response().result();
  if (!result.has_list() || static_cast<std::size_t>(result.list().items_size()) != parts.size()) {
    throw error(errc::protocol_error, fmt::format("{} answered a lookup of {} tables without a tensor for each",
                                                  ps.task(), parts.size()));
  }
  std::vector<tensor> out;
  for (std::size_t k = 0; k < parts.size(); ++k) {
    const auto& item = result.list().items(static_cast<int>(k));
    const std::size_t n = parts[k].ids.size();
    const auto& table = parts[k].table;
    if (!item.has_tensor()) {
      throw error(errc::protocol_error, fmt::format("{} answered a lookup of '{}' without a tensor", ps.task(), table.name));
    }
    tensor rows = wire::get_tensor(response, item.tensor());
    if (rows.type() != table.type || rows.shape() != shape_type{n, table.dim}) {
      throw error(errc::protocol_error,
                  fmt::format("{} answered a lookup of {} ids of '{}' ({}, {} per row) with {} {}", ps.task(), n,
                              table.name, name_of(table.type), table.dim, name_of(rows.type()), to_string(rows.shape())));
    }
    out.push_back(std::move(rows));
  }
  co_return out;
}

asio::awaitable<void> ps_client::hash_apply_gradients(int ps_task, std::vector<table_ids> parts, optimizer opt) {
  if (parts.empty()) co_return;
  net::peer& ps = ps_of(ps_task, parts.front().table.name);
  wire::frame request;
  auto* apply = request.message.mutable_request()->mutable_hash_apply_gradients();
  *apply->mutable_optimizer() = wire::encode_optimizer(opt);
  put_table_parts(request, *apply->mutable_parts(), parts, true);
  co_await ps.call(std::move(request));
}

asio::awaitable<std::uint64_t> ps_client::advance_clock(int ps_task, hash_table_ref table, std::uint64_t clock) {
  net::peer& ps = ps_of(ps_task, table.name);
  wire::frame request;
  auto* advance = request.message.mutable_request()->mutable_advance_clock();
  encode_table_ref(*advance->mutable_table(), table);
  advance->set_clock(clock);
  const auto response = co_await ps.call(std::move(request));
  const auto& result = response.message.response().result();
  if (!result.has_integer() || result.integer() < 0) {
    throw error(errc::protocol_error, fmt::format("{} answered a clock of '{}' without a count of rows dropped",
                                                  ps.task(), table.name));
  }
  co_return static_cast<std::uint64_t>(result.integer());
}

asio::awaitable<detail::variable_io::table_export> ps_client::hash_export(int ps_task, hash_table_ref table,
                                                                         std::uint32_t first_bucket,
                                                                         std::uint64_t max_bytes, table_save save) {
  net::peer& ps = ps_of(ps_task, table.name);
  wire::frame request;
  auto* request_export = request.message.mutable_request()->mutable_hash_export();
  encode_table_ref(*request_export->mutable_table(), table);
  request_export->set_first_bucket(first_bucket);
  request_export->set_max_bytes(max_bytes);
  request_export->set_save(save.save);
  request_export->set_base(save.base);
  const auto response = co_await ps.call(std::move(request));
  const auto& reply = response.message.response().hash_export();
  const auto refuse = [&](std::string what) {
    return error(errc::protocol_error, fmt::format("{} answered an export of '{}' from bucket {} with {}", ps.task(),
                                                   table.name, first_bucket, what));
  };
  if (!response.message.response().has_hash_export()) throw refuse("no rows");
  table_export out;
  out.state = wire::decode_table_state(response, reply.state(), table.name);
  out.next_bucket = reply.next_bucket();
  if (out.next_bucket <= first_bucket || out.next_bucket > table.buckets) {
    throw refuse(fmt::format("the next bucket {} (of {})", out.next_bucket, table.buckets));
  }
  out.rows.ids = wire::get_tensor(response, reply.ids());
  out.rows.last_named = wire::get_tensor(response, reply.last_named());
  out.rows.values = wire::get_tensor(response, reply.values());
  if (save.base != 0) {
    out.dropped = wire::get_tensor(response, reply.dropped());
    if (out.dropped.type() != dtype::int64 || out.dropped.shape().size() != 1) {
      throw refuse(fmt::format("dropped ids {} {}", name_of(out.dropped.type()), to_string(out.dropped.shape())));
    }
  }
  if (save.save != 0 && out.state.save != save.save) {
    throw refuse(fmt::format("the rows of save {:016x} (asked for {:016x})", out.state.save, save.save));
  }
  const std::size_t n = out.rows.ids.size();
  const std::size_t slots = out.state.owner ? slots_of(*out.state.owner).size() : 0;
  if (out.rows.ids.type() != dtype::int64 || out.rows.ids.shape() != shape_type{n} ||
      out.rows.last_named.type() != dtype::int64 || out.rows.last_named.shape() != shape_type{n} ||
      out.rows.values.type() != table.type || out.rows.values.shape() != shape_type{n, (1 + slots) * table.dim}) {
    throw refuse(fmt::format("ids {} {}, last-named times {} {} and values {} {} ({} slots of {} values per row)",
                             name_of(out.rows.ids.type()), to_string(out.rows.ids.shape()),
                             name_of(out.rows.last_named.type()), to_string(out.rows.last_named.shape()),
                             name_of(out.rows.values.type()), to_string(out.rows.values.shape()), slots, table.dim));
  }
  co_return out;
}

asio::awaitable<void> ps_client::hash_import(int ps_task, hash_table_ref table, table_import import) {
  net::peer& ps = ps_of(ps_task, table.name);
  wire::frame request;
  auto* out = request.message.mutable_request()->mutable_hash_import();
  encode_table_ref(*out->mutable_table(), table);
  if (import.reset) {
    out->set_reset(true);
    wire::encode_table_state(request, *out->mutable_state(), *import.reset, true);
  }
  if (!import.dropped.empty()) {
    tensor dropped = tensor::uninitialized(dtype::int64, {import.dropped.size()});
    std::memcpy(dropped.bytes().data(), import.dropped.data(), import.dropped.size() * sizeof(std::int64_t));
    wire::put_tensor(request, *out->mutable_dropped(), dropped);
  }
  wire::put_tensor(request, *out->mutable_ids(), import.rows.ids);
  wire::put_tensor(request, *out->mutable_last_named(), import.rows.last_named);
  wire::put_tensor(request, *out->mutable_values(), import.rows.values);
  out->set_replace(import.replace);
  co_await ps.call(std::move(request));
}

}  // namespace pscoro::client

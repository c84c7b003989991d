// libtorch on pscoro: torch::Tensor and pscoro tensors seen as each other without copies, a
// torch::nn::Module's parameters kept in pscoro variables (pulled before a step, their gradients
// pushed to the ps optimizers after backward()), and torch::Tensor as a worker-function argument or
// result.
//
//   // chief: one variable per parameter, from the module's initial values
//   auto params = co_await pscoro::create_module_variables<float>(strategy.scope(), *model);
//   // worker, in a worker function that received `params` and an embedding `table`
//   pscoro::module_variables<float> bound(*model, params);   // once per model; keep it
//   co_await bound.pull();                                   // the ps values, into the parameters
//   auto rows = co_await bound.embedding_lookup(table, ids); // requires grad
//   auto users = co_await bound.embedding_lookup(user_table, raw_ids, {.insert = true});  // a hash_table
//   auto loss = loss_of(model->forward(x, rows), y);
//   loss.backward();
//   co_await bound.push(pscoro::optimizers::adagrad{.learning_rate = 0.05});
//
// Optional: only programs that link libtorch include it (meson: torch_dep, found when Debian's
// libtorch-dev is installed; -Dtorch=enabled|disabled), and <pscoro/pscoro.hpp> does not. Header
// only. What is copied and what is not: docs/api.md, "Bring your own model".
#pragma once

#include <pscoro/config.hpp>

#include <pscoro/detail/parallel.hpp>
#include <pscoro/detail/xtensor.hpp>
#include <pscoro/dtype.hpp>
#include <pscoro/error.hpp>
#include <pscoro/hash_table.hpp>
#include <pscoro/optimizers.hpp>
#include <pscoro/sharded_variable.hpp>
#include <pscoro/strategy.hpp>
#include <pscoro/tensor.hpp>
#include <pscoro/value.hpp>

#include <torch/nn/module.h>
#include <torch/types.h>

#include <asio/awaitable.hpp>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace pscoro {

/// libtorch's dtype for `t`: `to_torch_dtype(dtype::float32) == torch::kFloat32`.
inline c10::ScalarType to_torch_dtype(dtype t) {
  switch (t) {
    case dtype::float32: return torch::kFloat32;
    case dtype::float64: return torch::kFloat64;
    case dtype::int32: return torch::kInt32;
    case dtype::int64: return torch::kInt64;
  }
  throw error(errc::invalid_argument, "to_torch_dtype: " + std::to_string(static_cast<int>(t)) + " is not a dtype");
}

/// pscoro's dtype for a libtorch one: `from_torch_dtype(torch::kInt64) == dtype::int64`;
/// errc::invalid_argument for the dtypes pscoro has not ("libtorch dtype Half has no pscoro dtype
/// (pscoro has float32, float64, int32 and int64)").
inline dtype from_torch_dtype(c10::ScalarType t) {
  switch (t) {
    case torch::kFloat32: return dtype::float32;
    case torch::kFloat64: return dtype::float64;
    case torch::kInt32: return dtype::int32;
    case torch::kInt64: return dtype::int64;
    default: break;
  }
  throw error(errc::invalid_argument, std::string("libtorch dtype ") + c10::toString(t) +
                                          " has no pscoro dtype (pscoro has float32, float64, int32 and int64)");
}

namespace detail {

/// "[2, 3]".
inline std::string torch_sizes(c10::IntArrayRef sizes) {
  std::string out = "[";
  for (std::size_t i = 0; i < sizes.size(); ++i) out += (i ? ", " : "") + std::to_string(sizes[i]);
  return out + "]";
}

inline std::vector<std::int64_t> torch_shape(std::span<const std::size_t> shape) {
  std::vector<std::int64_t> out;
  out.reserve(shape.size());
  for (const std::size_t d : shape) {
    if (!std::in_range<std::int64_t>(d)) {
      throw error(errc::invalid_argument, "a dimension of " + to_string(shape) + " does not fit in libtorch's int64");
    }
    out.push_back(static_cast<std::int64_t>(d));
  }
  return out;
}

inline shape_type shape_of(const torch::Tensor& t) {
  shape_type out;
  out.reserve(static_cast<std::size_t>(t.dim()));
  for (const std::int64_t d : t.sizes()) out.push_back(static_cast<std::size_t>(d));
  return out;
}

/// Throws errc::invalid_argument unless `t` is a defined, dense CPU tensor: `what` names it.
inline void check_cpu_dense(const torch::Tensor& t, std::string_view what) {
  if (!t.defined()) throw error(errc::invalid_argument, std::string(what) + " is an undefined torch::Tensor");
  if (!t.device().is_cpu()) {
    throw error(errc::invalid_argument, std::string(what) + " is on device " + t.device().str() +
                                            ": pscoro reads and writes CPU memory (call .cpu() first: a copy)");
  }
  if (t.layout() != torch::kStrided) {
    throw error(errc::invalid_argument, std::string(what) + " is not a dense (strided) tensor: call .to_dense() first");
  }
}

}  // namespace detail

/// A view of `t`'s elements as a pscoro tensor: the same bytes (no copy), kept alive with a
/// reference to `t`'s storage while any copy of the result lives, so a variable update or a worker
/// function's result goes out of this memory. `t` must be a contiguous (row-major) CPU tensor of
/// float32, float64, int32 or int64; anything else is errc::invalid_argument saying what was wrong
/// ("... has strides [1, 3] for sizes [3, 2], not row-major: call .contiguous() first (a copy)").
/// Autograd is ignored: the elements of a tensor that requires grad are shared as they are. Do
/// not change them in place until what was handed the view (a send) has completed.
///
///   auto grad = pscoro::from_torch(weight.grad());   // grad.bytes().data() == weight.grad().data_ptr()
inline tensor from_torch(const torch::Tensor& t) {
  detail::check_cpu_dense(t, "from_torch: the tensor");
  const dtype type = from_torch_dtype(t.scalar_type());
  if (!t.is_contiguous()) {
    throw error(errc::invalid_argument, "from_torch: the tensor has strides " + detail::torch_sizes(t.strides()) +
                                            " for sizes " + detail::torch_sizes(t.sizes()) +
                                            ", not row-major: call .contiguous() first (a copy)");
  }
  auto owner = std::make_shared<torch::Tensor>(t.detach());  // shares t's storage, not its autograd
  auto* data = static_cast<std::byte*>(owner->data_ptr());
  const auto size = static_cast<std::size_t>(owner->numel()) * size_of(type);
  return tensor(type, detail::shape_of(t), byte_buffer::share(std::move(owner), data, size));
}

/// A view of `t`'s bytes as a torch::Tensor (no copy) that keeps them alive: a received worker
/// function argument or variable value used by libtorch where it landed. The bytes are shared with
/// every copy of `t`: write through the view only to a tensor no one else reads.
///
///   torch::Tensor x = pscoro::to_torch(received);   // x.data_ptr() == received.bytes().data()
inline torch::Tensor to_torch(const tensor& t) {
  const auto options = torch::TensorOptions().dtype(to_torch_dtype(t.type()));
  const auto sizes = detail::torch_shape(t.shape());
  if (t.size_bytes() != t.size() * size_of(t.type())) {
    throw error(errc::invalid_argument, "to_torch: a " + std::string(name_of(t.type())) + " tensor of shape " +
                                            to_string(t.shape()) + " over " + std::to_string(t.size_bytes()) +
                                            " bytes");
  }
  if (t.size_bytes() == 0) return torch::empty(sizes, options);
  return torch::from_blob(t.bytes().data(), sizes, [keep = t.bytes()](void*) {}, options);
}

/// A view of `a`'s elements as a torch::Tensor (no copy): `a` is moved into the view, which keeps
/// it alive. `auto rows = pscoro::to_torch(co_await table.embedding_lookup(ids));`
template <class T>
  requires is_element_type_v<T>
torch::Tensor to_torch(xt::xarray<T>&& a) {
  static_assert(xt::xarray<T>::static_layout == xt::layout_type::row_major, "libtorch tensors are row-major");
  auto owner = std::make_shared<xt::xarray<T>>(std::move(a));
  const auto options = torch::TensorOptions().dtype(to_torch_dtype(dtype_of<T>));
  const shape_type shape(owner->shape().begin(), owner->shape().end());
  const auto sizes = detail::torch_shape(shape);
  if (owner->size() == 0) return torch::empty(sizes, options);
  return torch::from_blob(owner->data(), sizes, [owner](void*) {}, options);
}

/// A torch::Tensor travels as a pscoro tensor: the same wire form, and the same name in signatures,
/// so a chief without libtorch may declare the function with pscoro::tensor. Received, it is a view
/// of the received bytes (to_torch); sent, a view of its own (from_torch), after one copy when it is
/// not contiguous. Other devices, layouts and dtypes are errc::invalid_argument.
template <>
struct codec<torch::Tensor> {
  static constexpr std::string_view name = "tensor";
  static value encode(const torch::Tensor& t) {
    if (t.defined() && t.device().is_cpu() && t.layout() == torch::kStrided && !t.is_contiguous()) {
      return from_torch(t.contiguous());
    }
    return from_torch(t);
  }
  static torch::Tensor decode(value&& v, const decode_context&) {
    auto* t = std::get_if<tensor>(&v);
    if (!t) detail::throw_decode_mismatch(name, v);
    return to_torch(*t);
  }
};

/// Creates one variable per parameter of `module` (named_parameters(): "fc1.weight"), named
/// `prefix` + that name and split as the strategy's partitioner says, holding the parameter's
/// current values; returns them by parameter name, what module_variables binds on the workers (a
/// std::map of handles is a worker-function argument). Run on the chief's executor; `module` must
/// live until the call completes. errc::invalid_argument for a parameter that is not a T tensor on
/// the CPU.
template <class T = float>
  requires std::is_floating_point_v<T> && is_element_type_v<T>
[[nodiscard]] asio::awaitable<std::map<std::string, sharded_variable<T>>> create_module_variables(
    parameter_server_strategy::scope_type scope, const torch::nn::Module& module, std::string prefix = {}) {
  std::map<std::string, sharded_variable<T>> out;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    const std::string what = "create_module_variables: parameter '" + item.key() + "'";
    detail::check_cpu_dense(item.value(), what);
    if (item.value().scalar_type() != to_torch_dtype(dtype_of<T>)) {
      throw error(errc::invalid_argument, what + " is " + c10::toString(item.value().scalar_type()) + ", not " +
                                              std::string(name_of(dtype_of<T>)));
    }
    const torch::Tensor values = item.value().detach().contiguous();
    const shape_type shape = detail::shape_of(values);
    // One copy, into the value the variable is created from.
    xt::xarray<T> initial =
        xt::adapt(values.data_ptr<T>(), static_cast<std::size_t>(values.numel()), xt::no_ownership(), shape);
    auto created = scope.create_sharded_variable(prefix + item.key(), initial);
    out.emplace(item.key(), co_await std::move(created));
  }
  co_return out;
}

/// The parameters of a torch::nn::Module bound to pscoro variables, one per parameter by its name
/// (create_module_variables makes them): pull() receives the variables' values straight into the
/// parameters, push() sends the gradients backward() left to the ps optimizers, and
/// embedding_lookup() gives rows of a sharded table or a hash table as a tensor that requires grad,
/// whose gradient push() sends too, as sparse gradient rows. Each call covers every variable and table at once,
/// concurrently across variables and shards.
///
/// Binding gives each parameter new storage of the variable's shape (a copy of its current values):
/// the buffer pull() receives into. Keep one module_variables per model (a worker's model state)
/// so that steps allocate nothing for the parameters; the module and this object must outlive each
/// awaited call. One step (pull .. push) at a time per module: a worker runs several closures at
/// once (coordinator_options::closures_per_worker, 4 by default), interleaved where they await, so
/// give each its own model (a pool) or run one per worker. Not copyable (lookups made since the
/// last push are its state).
template <class T = float>
  requires std::is_floating_point_v<T> && is_element_type_v<T>
class module_variables {
 public:
  using variable_map = std::map<std::string, sharded_variable<T>>;

  /// Binds every parameter of `module` to the variable of its name in `variables`.
  /// errc::invalid_argument when a parameter has no variable, a variable names no parameter, or a
  /// parameter is not a T tensor on the CPU of its variable's shape (the message names it).
  module_variables(torch::nn::Module& module, variable_map variables) : variables_(std::move(variables)) {
    torch::NoGradGuard no_grad;
    for (auto& item : module.named_parameters(/*recurse=*/true)) {
      const std::string what = "module_variables: parameter '" + item.key() + "'";
      const auto found = variables_.find(item.key());
      if (found == variables_.end()) {
        throw error(errc::invalid_argument, what + " has no variable (variables: " + names_of(variables_) + ")");
      }
      torch::Tensor& parameter = item.value();
      detail::check_cpu_dense(parameter, what);
      if (parameter.scalar_type() != to_torch_dtype(dtype_of<T>)) {
        throw error(errc::invalid_argument, what + " is " + c10::toString(parameter.scalar_type()) + ", not " +
                                                std::string(name_of(dtype_of<T>)));
      }
      const auto& variable = found->second;
      if (detail::shape_of(parameter) != variable.shape()) {
        throw error(errc::invalid_argument, what + " has shape " + detail::torch_sizes(parameter.sizes()) +
                                                " but its variable '" + variable.name() + "' " +
                                                to_string(variable.shape()));
      }
      auto storage = std::make_shared<xt::xarray<T>>(variable.shape());
      torch::Tensor view = parameter;  // a scalar's or an empty parameter's storage stays its own
      if (storage->size() != 0) {
        view = torch::from_blob(storage->data(), parameter.sizes(), [storage](void*) {}, parameter.options());
        view.copy_(parameter);
        parameter.set_data(view);
      }
      bound_.push_back({item.key(), parameter, variable, std::move(storage)});
    }
    if (bound_.size() != variables_.size()) {
      for (const auto& [name, variable] : variables_) {
        if (!module.named_parameters(true).contains(name)) {
          throw error(errc::invalid_argument, "module_variables: variable '" + variable.name() + "' for '" + name +
                                                  "' names no parameter of the module");
        }
      }
    }
  }
  module_variables(const module_variables&) = delete;
  module_variables& operator=(const module_variables&) = delete;

  const variable_map& variables() const noexcept { return variables_; }

  /// Reads every variable into its parameter, all shards of all variables at once; each shard's
  /// bytes are received straight into the parameter's storage (no copy, no allocation). The
  /// parameters' versions change, as after an in-place update: an autograd graph that saved one
  /// before the pull refuses backward() ("modified by an inplace operation") rather than mixing
  /// the values of two steps.
  asio::awaitable<void> pull() {
    co_await detail::run_all(bound_.size(), [this](std::size_t i) { return bound_[i].variable.read(*bound_[i].storage); });
    for (auto& b : bound_) b.parameter.unsafeGetTensorImpl()->bump_version();
  }

  /// The rows of `table` named by `ids` (an int32 or int64 CPU tensor of any shape), shape
  /// ids.sizes() + the row shape, as a leaf tensor that requires grad: a view of the received rows
  /// (no copy beyond placing them in input order). The next push() sends its gradient to `table`
  /// as sparse gradient rows (apply_sparse_gradient; repeated ids are summed on the ps).
  asio::awaitable<torch::Tensor> embedding_lookup(sharded_variable<T> table, torch::Tensor ids) {
    const torch::Tensor flat = flat_ids(ids, table.name());
    const shape_type ids_shape = detail::shape_of(ids);
    // Named: g++ 12 mishandles temporaries in a co_await's full-expression. The ids are read here.
    auto request = table.embedding_lookup(
        xt::adapt(flat.data_ptr<std::int64_t>(), static_cast<std::size_t>(flat.numel()), xt::no_ownership(), ids_shape));
    xt::xarray<T> rows = co_await std::move(request);
    torch::Tensor out = to_torch(std::move(rows));
    out.requires_grad_(true);
    lookups_.push_back({std::move(table), flat, out});
    co_return out;
  }

  /// The rows of hash table `table` named by `ids` (an int32 or int64 CPU tensor of any shape, any
  /// int64 values), shape ids.sizes() + [dim], as a leaf tensor that requires grad (hash_table::lookup;
  /// `options.insert` makes rows for ids not held, as the table's admission policy allows). The
  /// next push() steps the table's rows with its gradient (hash_table::apply_gradients: repeated
  /// ids summed, ids not held dropped).
  asio::awaitable<torch::Tensor> embedding_lookup(hash_table<T> table, torch::Tensor ids,
                                                  hash_lookup_options options = {}) {
    const torch::Tensor flat = flat_ids(ids, table.name());
    const shape_type ids_shape = detail::shape_of(ids);
    // Named: g++ 12 mishandles temporaries in a co_await's full-expression. The ids are read here.
    auto request = table.lookup(
        xt::adapt(flat.data_ptr<std::int64_t>(), static_cast<std::size_t>(flat.numel()), xt::no_ownership(), ids_shape),
        options);
    xt::xarray<T> rows = co_await std::move(request);
    torch::Tensor out = to_torch(std::move(rows));
    out.requires_grad_(true);
    table_lookups_.push_back({std::move(table), flat, out});
    co_return out;
  }

  /// One optimizer step on the ps for everything backward() reached: each parameter's gradient
  /// (apply_gradient, sent from the gradient's own memory: no copy) and each lookup's gradient rows
  /// since the last push (apply_sparse_gradient: rows copied once, into one message per shard), all
  /// at once. Consumes them: the parameters' gradients are reset (as zero_grad(set_to_none)) and the
  /// lookups forgotten. Parameters and lookups without a gradient send nothing.
  asio::awaitable<void> push(optimizer opt) {
    std::vector<update> updates;
    for (auto& b : bound_) {
      torch::Tensor grad = b.parameter.grad();
      if (!grad.defined()) continue;
      updates.push_back({b.variable, from_torch(grad.contiguous()), {}, {}});
      b.parameter.mutable_grad() = torch::Tensor();
    }
    for (auto& l : std::exchange(lookups_, {})) {
      const torch::Tensor grad = l.rows.grad();
      if (!grad.defined()) continue;
      // [ids] + the row shape: the rows as apply_sparse_gradient takes them (a view).
      std::vector<std::int64_t> sizes{l.ids.numel()};
      for (std::size_t d = 1; d < l.table.shape().size(); ++d) sizes.push_back(static_cast<std::int64_t>(l.table.shape()[d]));
      updates.push_back({l.table, {}, l.ids, grad.contiguous().reshape(sizes)});
    }
    std::vector<table_update> table_updates;
    for (auto& l : std::exchange(table_lookups_, {})) {
      const torch::Tensor grad = l.rows.grad();
      if (!grad.defined()) continue;
      table_updates.push_back({l.table, l.ids, grad.contiguous().reshape({l.ids.numel(), static_cast<std::int64_t>(l.table.dim())})});
    }
    co_await detail::run_all(updates.size() + table_updates.size(), [&](std::size_t i) {
      return i < updates.size() ? updates[i].start(opt) : table_updates[i - updates.size()].start(opt);
    });
  }

 private:
  struct binding {
    std::string name;
    torch::Tensor parameter;
    sharded_variable<T> variable;
    std::shared_ptr<xt::xarray<T>> storage;  // the parameter's storage
  };
  struct lookup {
    sharded_variable<T> table;
    torch::Tensor ids;  // int64, 1-D
    torch::Tensor rows;
  };
  // A dense gradient (`dense`) or sparse gradient rows (`ids`, `rows`).
  struct update {
    sharded_variable<T> variable;
    tensor dense;
    torch::Tensor ids;
    torch::Tensor rows;

    asio::awaitable<void> start(const optimizer& opt) const {
      if (!ids.defined()) return variable.apply_gradient(opt, dense);
      shape_type row_shape = detail::shape_of(rows);
      // The rows are split by shard (copied) here, during the call.
      return variable.apply_sparse_gradient(
          opt, xt::adapt(ids.data_ptr<std::int64_t>(), static_cast<std::size_t>(ids.numel()), xt::no_ownership(),
                         shape_type{static_cast<std::size_t>(ids.numel())}),
          xt::adapt(rows.data_ptr<T>(), static_cast<std::size_t>(rows.numel()), xt::no_ownership(), row_shape));
    }
  };

  struct table_lookup {
    hash_table<T> table;
    torch::Tensor ids;  // int64, 1-D
    torch::Tensor rows;
  };
  // Gradient rows for a hash table's lookup.
  struct table_update {
    hash_table<T> table;
    torch::Tensor ids;
    torch::Tensor rows;  // [ids, dim]

    asio::awaitable<void> start(const optimizer& opt) const {
      const auto n = static_cast<std::size_t>(ids.numel());
      return table.apply_gradients(
          opt, xt::adapt(ids.data_ptr<std::int64_t>(), n, xt::no_ownership(), shape_type{n}),
          xt::adapt(rows.data_ptr<T>(), static_cast<std::size_t>(rows.numel()), xt::no_ownership(),
                    shape_type{n, table.dim()}));
    }
  };

  // `ids` as one row of int64 (a copy only when they are not that already); errc::invalid_argument
  // naming `table` for ids that are not an int32 or int64 CPU tensor.
  static torch::Tensor flat_ids(const torch::Tensor& ids, const std::string& table) {
    detail::check_cpu_dense(ids, "embedding_lookup: the ids");
    if (ids.scalar_type() != torch::kInt64 && ids.scalar_type() != torch::kInt32) {
      throw error(errc::invalid_argument, "embedding_lookup of '" + table + "': ids are " +
                                              c10::toString(ids.scalar_type()) + ", not int32 or int64");
    }
    return ids.to(torch::kInt64).contiguous().reshape({-1});
  }

  static std::string names_of(const variable_map& variables) {
    std::string out;
    for (const auto& [name, v] : variables) out += (out.empty() ? "" : ", ") + name;
    return out.empty() ? "none" : out;
  }

  variable_map variables_;
  std::vector<binding> bound_;
  std::vector<lookup> lookups_;
  std::vector<table_lookup> table_lookups_;
};

}  // namespace pscoro

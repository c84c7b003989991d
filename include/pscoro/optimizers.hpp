// Optimizers that run on the parameter servers, next to the variables they update.
//
//   const pscoro::optimizers::adagrad opt{.learning_rate = 0.05};
//   co_await table.apply_sparse_gradient(opt, ids, rows);   // one message per shard
//
// An optimizer value only describes the algorithm and its hyper-parameters; it is sent with every
// update, so a learning-rate schedule is the caller's to compute. Its state (slot variables) lives on
// the ps beside each variable or shard, created on first use and named "<variable>/<optimizer>/<slot>"
// ("embedding/part_0/adagrad/accumulator"); slots are ordinary variables there (readable, and saved by
// checkpoints). Defaults and formulas are Keras's (docs/design.md lists them). Sparse updates sum
// duplicate ids first and touch only the rows named (as TF's sparse apply ops; for adam this is
// "lazy" Adam: moments of other rows do not decay). Variables must be float32 or float64.
#pragma once

#include <pscoro/config.hpp>

#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace pscoro {
namespace optimizers {

/// var -= learning_rate * g
struct sgd {
  double learning_rate = 0.01;
};
/// v = momentum * v - learning_rate * g; var += v (nesterov: var += momentum * v - learning_rate * g)
struct momentum {
  double learning_rate = 0.01;
  double momentum = 0.9;
  bool nesterov = false;
};
/// acc += g^2; var -= learning_rate * g / (sqrt(acc) + epsilon)
struct adagrad {
  double learning_rate = 0.001;
  double initial_accumulator_value = 0.1;
  double epsilon = 1e-7;
};
/// Adam with the step count t kept per variable (shard): lr_t = lr * sqrt(1 - beta_2^t) / (1 - beta_1^t).
struct adam {
  double learning_rate = 0.001;
  double beta_1 = 0.9;
  double beta_2 = 0.999;
  double epsilon = 1e-7;
};
/// FTRL-Proximal (McMahan et al. 2013) as TF's ApplyFtrl, with Keras's `beta` folded into l2.
struct ftrl {
  double learning_rate = 0.001;
  double learning_rate_power = -0.5;
  double initial_accumulator_value = 0.1;
  double l1 = 0;
  double l2 = 0;
  double beta = 0;
};

}  // namespace optimizers

using optimizer = std::variant<optimizers::sgd, optimizers::momentum, optimizers::adagrad, optimizers::adam,
                               optimizers::ftrl>;

/// "adagrad": the optimizer's name in its slots' names and in messages.
inline std::string_view optimizer_name(const optimizer& opt) {
  struct namer {
    std::string_view operator()(const optimizers::sgd&) const { return "sgd"; }
    std::string_view operator()(const optimizers::momentum&) const { return "momentum"; }
    std::string_view operator()(const optimizers::adagrad&) const { return "adagrad"; }
    std::string_view operator()(const optimizers::adam&) const { return "adam"; }
    std::string_view operator()(const optimizers::ftrl&) const { return "ftrl"; }
  };
  return std::visit(namer{}, opt);
}

/// A slot an optimizer keeps beside each variable (and each hash table row): "accumulator", stored
/// as "<variable>/<optimizer>/<name>", and the value it starts from.
struct optimizer_slot {
  std::string name;
  double initial_value;
};

/// The slots `opt` keeps, of the variable's dtype and shape, in the order its step takes them.
inline std::vector<optimizer_slot> slots_of(const optimizer& opt) {
  struct visitor {
    std::vector<optimizer_slot> operator()(const optimizers::sgd&) const { return {}; }
    std::vector<optimizer_slot> operator()(const optimizers::momentum&) const { return {{"momentum", 0}}; }
    std::vector<optimizer_slot> operator()(const optimizers::adagrad& o) const {
      return {{"accumulator", o.initial_accumulator_value}};
    }
    std::vector<optimizer_slot> operator()(const optimizers::adam&) const { return {{"m", 0}, {"v", 0}}; }
    std::vector<optimizer_slot> operator()(const optimizers::ftrl& o) const {
      return {{"accumulator", o.initial_accumulator_value}, {"linear", 0}};
    }
  };
  return std::visit(visitor{}, opt);
}

}  // namespace pscoro

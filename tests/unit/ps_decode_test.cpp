// What a ps makes of an update, an optimizer step and an initializer as they come off the wire:
// every kind the protocol defines, its fields where the kind uses them, and a refusal naming a
// value it does not define.
#include "test_support.hpp"

#include "ps/decode.hpp"
#include "wire/values.hpp"

#include <pscoro/error.hpp>

#include <variant>

using namespace pscoro;

TEST_CASE("a ps decodes every update operation, and refuses one the protocol does not define") {
  CHECK(ps::decode_op(wire::UpdateVariable::ASSIGN) == update_op::assign);
  CHECK(ps::decode_op(wire::UpdateVariable::DIV) == update_op::div);
  CHECK(ps::decode_op(wire::UpdateVariable::MAX) == update_op::max);
  const auto refused = error_thrown_by([] { (void)ps::decode_op(static_cast<wire::UpdateVariable::Op>(99)); });
  CHECK(refused.code() == errc::invalid_argument);
  CHECK(std::string(refused.what()) == "unknown update operation 99");
  CHECK(ps::op_name(update_op::add, false) == "assign_add");
  CHECK(ps::op_name(update_op::add, true) == "scatter_add");
}

TEST_CASE("a ps decodes an optimizer's fields as its kind uses them") {
  wire::Optimizer ftrl;
  ftrl.set_kind(wire::Optimizer::FTRL);
  ftrl.set_learning_rate(0.5);
  ftrl.set_learning_rate_power(-0.5);
  ftrl.set_l1(0.01);
  ftrl.set_beta(0.25);
  ftrl.set_momentum(0.9);  // not FTRL's: ignored
  const auto decoded = wire::decode_optimizer(ftrl);
  const auto* f = std::get_if<optimizers::ftrl>(&decoded);
  REQUIRE(f);
  CHECK(f->learning_rate == 0.5);
  CHECK(f->learning_rate_power == -0.5);
  CHECK(f->l1 == 0.01);
  CHECK(f->beta == 0.25);

  wire::Optimizer momentum;
  momentum.set_kind(wire::Optimizer::MOMENTUM);
  momentum.set_momentum(0.9);
  momentum.set_nesterov(true);
  const auto m = std::get<optimizers::momentum>(wire::decode_optimizer(momentum));
  CHECK(m.momentum == 0.9);
  CHECK(m.nesterov);

  wire::Optimizer unknown;
  unknown.set_kind(static_cast<wire::Optimizer::Kind>(42));
  const auto refused = error_thrown_by([&] { (void)wire::decode_optimizer(unknown); });
  CHECK(refused.code() == errc::invalid_argument);
  CHECK(std::string(refused.what()) == "unknown optimizer 42");
}

TEST_CASE("a ps decodes an initializer with its shard's place in the whole variable") {
  wire::Initializer init;
  init.set_kind(wire::Initializer::RANDOM_NORMAL);
  init.set_a(1.0);
  init.set_b(0.5);
  init.set_seed(7);
  init.add_full_shape(100);
  init.add_full_shape(4);
  init.set_row_offset(60);
  const auto decoded = ps::decode_initializer(init, "emb");
  CHECK(decoded.full_shape == shape_type{100, 4});
  CHECK(decoded.row_offset == 60);
  const auto normal = std::get<initializers::random_normal>(decoded.init);
  CHECK(normal.mean == 1.0);
  CHECK(normal.stddev == 0.5);
  CHECK(normal.seed == 7);

  init.set_kind(static_cast<wire::Initializer::Kind>(77));
  const auto refused = error_thrown_by([&] { (void)ps::decode_initializer(init, "emb"); });
  CHECK(refused.code() == errc::invalid_argument);
  CHECK(std::string(refused.what()) == "create of 'emb': unknown initializer 77");
}

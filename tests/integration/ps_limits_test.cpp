// A ps never crashes, corrupts memory or balloons on what a peer sends: sizes that overflow, ids and
// row ranges far out of range, shards outside their variable, variables and slots past the memory
// limits, and (when asked) NaN or Inf. Every test talks to a live ps with raw requests, as a
// hostile or broken peer would, and checks that what existed is untouched; the assign-in-place ones
// drive a ps_service directly, to hold a reply's bytes while an assign arrives.
#include "local_cluster.hpp"
#include "net/peer.hpp"
#include "ps/ps_service.hpp"
#include "raw_client.hpp"
#include "test_support.hpp"
#include "wire/values.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <memory>
#include <thread>

using namespace pscoro;
using pscoro::testing::local_cluster;

namespace {

constexpr std::uint64_t u64_max = std::numeric_limits<std::uint64_t>::max();
constexpr std::int64_t i64_max = std::numeric_limits<std::int64_t>::max();
constexpr std::int64_t i64_min = std::numeric_limits<std::int64_t>::min();

struct reply {
  wire::Status status;
  tensor value;  // the result tensor, if any
};

// Sends `request` to ps:0 of `cluster` as the chief of coordinator session `session` and returns
// the status and the result tensor.
reply call(local_cluster& cluster, wire::frame request, std::uint64_t session = 1) {
  const auto answer = testing::call_task("ps:0", cluster.spec.task_address("ps", 0), std::move(request),
                                         net::make_hello({"chief", 0, 0}, session));
  reply out{answer.message.response().status(), {}};
  if (answer.message.response().result().has_tensor()) {
    out.value = wire::get_tensor(answer, answer.message.response().result().tensor());
  }
  return out;
}

template <class T>
tensor values(shape_type shape, std::vector<T> elements) {
  tensor t = tensor::uninitialized(dtype_of<T>, std::move(shape));
  REQUIRE(t.size() == elements.size());
  std::copy(elements.begin(), elements.end(), t.mutable_data<T>());
  return t;
}

tensor ids(std::vector<std::int64_t> rows) {
  const std::size_t n = rows.size();
  return values<std::int64_t>({n}, std::move(rows));
}

wire::frame create_from(const variable_ref& ref, const tensor& initial) {
  wire::frame f;
  auto* body = f.message.mutable_request()->mutable_create_variable();
  wire::encode_ref(*body->mutable_variable(), ref);
  wire::put_tensor(f, *body->mutable_initial_value(), initial);
  return f;
}

wire::frame create_by(const variable_ref& ref, const shape_type& full_shape, std::uint64_t row_offset = 0,
                      wire::Initializer::Kind kind = wire::Initializer::ONES) {
  wire::frame f;
  auto* body = f.message.mutable_request()->mutable_create_variable();
  wire::encode_ref(*body->mutable_variable(), ref);
  body->mutable_initializer()->set_kind(kind);
  for (const auto d : full_shape) body->mutable_initializer()->add_full_shape(d);
  body->mutable_initializer()->set_row_offset(row_offset);
  return f;
}

wire::frame read_of(const variable_ref& ref) {
  wire::frame f;
  wire::encode_ref(*f.message.mutable_request()->mutable_read_variable()->mutable_variable(), ref);
  return f;
}

wire::frame gather(const variable_ref& ref, const tensor& rows) {
  wire::frame f = read_of(ref);
  wire::put_tensor(f, *f.message.mutable_request()->mutable_read_variable()->mutable_indices(), rows);
  return f;
}

wire::frame read_rows(const variable_ref& ref, std::uint64_t begin, std::uint64_t end) {
  wire::frame f = read_of(ref);
  auto* range = f.message.mutable_request()->mutable_read_variable()->mutable_rows();
  range->set_begin(begin);
  range->set_end(end);
  return f;
}

wire::frame update(const variable_ref& ref, wire::UpdateVariable::Op op, const tensor& value) {
  wire::frame f;
  auto* body = f.message.mutable_request()->mutable_update_variable();
  wire::encode_ref(*body->mutable_variable(), ref);
  body->set_op(op);
  wire::put_tensor(f, *body->mutable_value(), value);
  return f;
}

wire::frame scatter(const variable_ref& ref, wire::UpdateVariable::Op op, const tensor& rows, const tensor& value) {
  wire::frame f = update(ref, op, value);
  wire::put_tensor(f, *f.message.mutable_request()->mutable_update_variable()->mutable_indices(), rows);
  return f;
}

wire::frame update_rows(const variable_ref& ref, std::uint64_t begin, std::uint64_t end, const tensor& value) {
  wire::frame f = update(ref, wire::UpdateVariable::ASSIGN, value);
  auto* range = f.message.mutable_request()->mutable_update_variable()->mutable_rows();
  range->set_begin(begin);
  range->set_end(end);
  return f;
}

wire::frame apply(const variable_ref& ref, wire::Optimizer::Kind kind, const tensor& gradient,
                  const tensor* rows = nullptr) {
  wire::frame f;
  auto* body = f.message.mutable_request()->mutable_apply_gradient();
  wire::encode_ref(*body->mutable_variable(), ref);
  body->mutable_optimizer()->set_kind(kind);
  body->mutable_optimizer()->set_learning_rate(0.1);
  body->mutable_optimizer()->set_momentum(0.9);
  body->mutable_optimizer()->set_beta_1(0.9);
  body->mutable_optimizer()->set_beta_2(0.999);
  body->mutable_optimizer()->set_epsilon(1e-7);
  wire::put_tensor(f, *body->mutable_gradient(), gradient);
  if (rows) wire::put_tensor(f, *body->mutable_indices(), *rows);
  return f;
}

wire::frame list_slots(const variable_ref& ref) {
  wire::frame f;
  wire::encode_ref(*f.message.mutable_request()->mutable_list_slots()->mutable_variable(), ref);
  return f;
}

std::size_t num_slots(local_cluster& cluster, const variable_ref& ref) {
  // ListSlots answers in Response.slots, which `call` does not return: count them here.
  const auto answer =
      testing::call_task("ps:0", cluster.spec.task_address("ps", 0), list_slots(ref), net::make_hello({"chief", 0, 0}, 1));
  REQUIRE(answer.message.response().status().code() == 0);
  return static_cast<std::size_t>(answer.message.response().slots_size());
}

template <class T>
std::vector<T> elements_of(const tensor& t) {
  return std::vector<T>(t.data<T>(), t.data<T>() + t.size());
}

// The value of `ref` on ps:0, which must be readable.
template <class T>
std::vector<T> value_of(local_cluster& cluster, const variable_ref& ref) {
  const auto r = call(cluster, read_of(ref));
  REQUIRE_MESSAGE(r.status.code() == 0, r.status.message());
  return elements_of<T>(r.value);
}

// Checks that `r` failed with `code` and a message containing `part`, printing the message if not.
void check_refused(const reply& r, errc code, std::string_view part) {
  const auto& m = r.status.message();
  CHECK_MESSAGE(r.status.code() == static_cast<int>(code), m);
  CHECK(contains(m, part));
  CHECK(r.status.origin_task() == "ps:0");
}

constexpr auto invalid = errc::invalid_argument;
constexpr auto exhausted = errc::resource_exhausted;

}  // namespace

TEST_CASE("a variable whose size does not fit in 64 bits is refused, and huge ids then find nothing to touch") {
  local_cluster cluster(1, 0);
  // 2^62 rows of 4 float32 are 2^66 bytes: unchecked, that wrapped to a 0-byte buffer that reads and
  // scatters at rows near 2^40 then indexed with peer-chosen offsets.
  const variable_ref huge{"huge", dtype::float32, {std::size_t{1} << 62, 4}, 0};
  check_refused(call(cluster, create_by(huge, huge.shape)), invalid,
                "create of 'huge': float32 [4611686018427387904, 4] is too large (its size in bytes does not fit in "
                "64 bits)");
  check_refused(call(cluster, gather(huge, ids({std::int64_t{1} << 40}))), errc::not_found,
                "sparse_read: variable 'huge' does not exist on ps:0");
  check_refused(call(cluster, scatter(huge, wire::UpdateVariable::ASSIGN, ids({std::int64_t{1} << 40}),
                                      values<float>({1, 4}, {1, 2, 3, 4}))),
                errc::not_found, "variable 'huge' does not exist on ps:0");
  check_refused(call(cluster, update_rows(huge, std::uint64_t{1} << 40, (std::uint64_t{1} << 40) + 1,
                                          values<float>({1, 4}, {1, 2, 3, 4}))),
                errc::not_found, "variable 'huge' does not exist on ps:0");

  // A whole shape of 2^64 bytes with a small shard, and an empty shape whose rows overflow.
  const variable_ref shard{"shard", dtype::float32, {2, 4}, 0};
  check_refused(call(cluster, create_by(shard, {std::size_t{1} << 62, 4})), invalid,
                "create of 'shard': ones initializer: the whole variable's shape [4611686018427387904, 4] is too "
                "large");
  const variable_ref hollow{"hollow", dtype::float64, {0, std::size_t{1} << 40, std::size_t{1} << 40}, 0};
  check_refused(call(cluster, create_by(hollow, hollow.shape)), invalid,
                "create of 'hollow': float64 [0, 1099511627776, 1099511627776] is too large");
  // A shape that fits in 64 bits but not in any machine is a resource, not a shape, problem.
  const variable_ref vast{"vast", dtype::float32, {std::size_t{1} << 40, 4}, 0};
  check_refused(call(cluster, create_by(vast, vast.shape)), exhausted,
                "create of 'vast': float32 [1099511627776, 4] takes 16.0 TiB (17592186044416 bytes), more than the");
  CHECK(call(cluster, create_by(shard, {4, 4})).status.code() == 0);  // the ps still serves
}

TEST_CASE("row ids near 2^40 and 2^63 and negative ids are refused by gathers, scatters and sparse gradients") {
  local_cluster cluster(1, 0);
  const variable_ref w{"w", dtype::float32, {8, 4}, 0};
  REQUIRE(call(cluster, create_by(w, w.shape)).status.code() == 0);
  const std::vector<float> ones(32, 1.0f);
  for (const std::int64_t id : {std::int64_t{1} << 40, (std::int64_t{1} << 40) + 3, i64_max, i64_max - 7, i64_min,
                                std::int64_t{-1}, std::int64_t{-(std::int64_t{1} << 40)}, std::int64_t{8}}) {
    CAPTURE(id);
    const auto expected = fmt::format("id {} (position 1) is out of range [0, 8)", id);
    const auto rows = ids({0, id});
    check_refused(call(cluster, gather(w, rows)), invalid, "sparse_read of 'w': " + expected);
    const auto two_rows = values<float>({2, 4}, {5, 5, 5, 5, 6, 6, 6, 6});
    check_refused(call(cluster, scatter(w, wire::UpdateVariable::ASSIGN, rows, two_rows)), invalid,
                  "scatter_update of 'w': " + expected);
    check_refused(call(cluster, scatter(w, wire::UpdateVariable::ADD, rows, two_rows)), invalid,
                  "scatter_add of 'w': " + expected);
    check_refused(call(cluster, apply(w, wire::Optimizer::ADAM, two_rows, &rows)), invalid,
                  "adam sparse update of 'w': " + expected);
  }
  CHECK(value_of<float>(cluster, w) == ones);
  CHECK(num_slots(cluster, w) == 0);  // the refused adam steps left no slots behind
}

TEST_CASE("row ranges that are reversed, wrap around or pass the end are refused") {
  local_cluster cluster(1, 0);
  const variable_ref w{"w", dtype::float32, {8, 4}, 0};
  REQUIRE(call(cluster, create_by(w, w.shape)).status.code() == 0);
  const std::uint64_t big = std::uint64_t{1} << 63;
  struct range {
    std::uint64_t begin, end;
  };
  // begin + length wrapping past 2^64 is the same as a begin above end: [2^64 - 1, 2^64 + 1) is [2^64 - 1, 1).
  // (The loop variable is no structured binding: clang 14 cannot capture one in CAPTURE's lambda.)
  for (const auto r : {range{u64_max, 1}, range{u64_max - 1, u64_max}, range{big, big + 1}, range{1, u64_max},
                       range{8, 9}, range{std::uint64_t{1} << 40, 1}, range{5, 4}}) {
    CAPTURE(r.begin);
    CAPTURE(r.end);
    const auto expected = fmt::format("rows [{}, {}) are not within [0, 8)", r.begin, r.end);
    check_refused(call(cluster, read_rows(w, r.begin, r.end)), invalid, "read of 'w': " + expected);
    check_refused(call(cluster, update_rows(w, r.begin, r.end, values<float>({1, 4}, {7, 7, 7, 7}))), invalid,
                  "assign of 'w': " + expected);
  }
  CHECK(value_of<float>(cluster, w) == std::vector<float>(32, 1.0f));
  // An empty range at the end is a valid, empty read.
  const auto empty = call(cluster, read_rows(w, 8, 8));
  CHECK_MESSAGE(empty.status.code() == 0, empty.status.message());
  CHECK(empty.value.shape() == shape_type{0, 4});
}

TEST_CASE("an initializer's shard must lie within the whole variable") {
  local_cluster cluster(1, 0);
  const variable_ref part{"emb/part_1", dtype::float32, {2, 4}, 0};
  check_refused(call(cluster, create_by(part, {8, 4}, 7)), invalid,
                "create of 'emb/part_1': ones initializer: 2 rows from row 7 are outside the variable's 8 rows");
  // row_offset + rows wraps around to 1.
  check_refused(call(cluster, create_by(part, {8, 4}, u64_max)), invalid,
                "create of 'emb/part_1': ones initializer: 2 rows from row 18446744073709551615 are outside the "
                "variable's 8 rows");
  check_refused(call(cluster, create_by(part, {8, 4}, 9)), invalid, "2 rows from row 9 are outside");
  check_refused(call(cluster, create_by(part, {8, 5})), invalid,
                "create of 'emb/part_1': ones initializer: a shard of shape [2, 4] cannot belong to a variable of "
                "shape [8, 5]");
  check_refused(call(cluster, create_by(part, {8, 4, 1})), invalid, "cannot belong to a variable of shape [8, 4, 1]");
  check_refused(call(cluster, create_by(variable_ref{"s", dtype::float32, {}, 0}, {}, 1)), invalid,
                "create of 's': ones initializer: a scalar has no rows");
  // The last two rows fit, and the refusals left nothing behind.
  const auto made = call(cluster, create_by(part, {8, 4}, 6));
  CHECK_MESSAGE(made.status.code() == 0, made.status.message());
}

TEST_CASE("a variable over max_variable_bytes or past max_ps_bytes is refused; what exists is untouched") {
  server_options options;
  options.max_variable_bytes = 4096;
  options.max_ps_bytes = 12000;
  local_cluster cluster(1, 0, {}, options);
  const variable_ref small{"small", dtype::float32, {16, 4}, 0};
  std::vector<float> initial(64);
  for (std::size_t i = 0; i < initial.size(); ++i) initial[i] = static_cast<float>(i);
  REQUIRE(call(cluster, create_from(small, values<float>({16, 4}, initial))).status.code() == 0);

  const variable_ref big{"big", dtype::float32, {2048}, 0};
  check_refused(call(cluster, create_by(big, big.shape)), exhausted,
                "create of 'big': float32 [2048] takes 8.0 KiB (8192 bytes), more than the 4.0 KiB (4096 bytes) "
                "ps:0 allows per variable (server_options::max_variable_bytes raises it; ps:0 holds ");
  check_refused(call(cluster, create_from(big, tensor::uninitialized(dtype::float32, {2048}))), exhausted,
                "(server_options::max_variable_bytes raises it");

  // Two variables of 4 KiB fit beside `small`; a third would pass 12000 bytes.
  for (const auto* name : {"a", "b"}) {
    const auto made = call(cluster, create_by(variable_ref{name, dtype::float32, {1024}, 0}, {1024}));
    REQUIRE_MESSAGE(made.status.code() == 0, made.status.message());
  }
  const variable_ref c{"c", dtype::float32, {1024}, 0};
  const auto refused = call(cluster, create_by(c, c.shape));
  check_refused(refused, exhausted, "create of 'c': float32 [1024] takes 4.0 KiB (4096 bytes) and ps:0 already holds ");
  check_refused(refused, exhausted,
                "of variables, slots and tables: that is past its limit of 11.7 KiB (12000 bytes) "
                "(server_options::max_ps_bytes raises it)");
  check_refused(call(cluster, read_of(c)), errc::not_found, "variable 'c' does not exist on ps:0");

  // A gather of repeated ids is as large as a variable could be.
  check_refused(call(cluster, gather(small, ids(std::vector<std::int64_t>(300, 3)))), exhausted,
                "sparse_read of 'small': 300 ids make a reply of float32 [300, 4], 4.7 KiB (4800 bytes), more than "
                "the 4.0 KiB (4096 bytes) ps:0 allows per variable (server_options::max_variable_bytes raises it)");
  CHECK(call(cluster, gather(small, ids(std::vector<std::int64_t>(256, 3)))).status.code() == 0);
  CHECK(value_of<float>(cluster, small) == initial);
}

TEST_CASE("optimizer slots count against max_ps_bytes; a refused first step leaves variable and slots as they were") {
  server_options options;
  options.max_ps_bytes = 10000;
  local_cluster cluster(1, 0, {}, options);
  const variable_ref w{"w", dtype::float32, {1024}, 0};
  REQUIRE(call(cluster, create_by(w, w.shape)).status.code() == 0);
  const auto gradient = values<float>({1024}, std::vector<float>(1024, 1.0f));
  // Adam's m fits beside w, its v does not.
  const auto refused = call(cluster, apply(w, wire::Optimizer::ADAM, gradient));
  check_refused(refused, exhausted,
                "adam update of 'w': slot 'w/adam/v' of 'w', float32 [1024] takes 4.0 KiB (4096 bytes) and ps:0 "
                "already holds ");
  check_refused(refused, exhausted,
                "(counting the slots this step creates before it): that is past its limit of 9.8 KiB (10000 bytes) "
                "(server_options::max_ps_bytes raises it)");
  CHECK(value_of<float>(cluster, w) == std::vector<float>(1024, 1.0f));
  CHECK(num_slots(cluster, w) == 0);
  // One slot fits.
  const auto momentum = call(cluster, apply(w, wire::Optimizer::MOMENTUM, gradient));
  REQUIRE_MESSAGE(momentum.status.code() == 0, momentum.status.message());
  CHECK(num_slots(cluster, w) == 1);
  CHECK(value_of<float>(cluster, w)[0] == doctest::Approx(0.9));
}

TEST_CASE("ending a coordinator session gives a ps's bytes back") {
  server_options options;
  options.max_ps_bytes = 6000;
  local_cluster cluster(1, 0, {}, options);
  const variable_ref a{"a", dtype::float64, {512}, 0};
  const variable_ref b{"b", dtype::float64, {512}, 0};
  REQUIRE(call(cluster, create_by(a, a.shape), 1).status.code() == 0);
  check_refused(call(cluster, create_by(b, b.shape), 1), exhausted, "create of 'b': float64 [512] takes 4.0 KiB");
  // A new session releases session 1's variables, and their bytes.
  const auto made = call(cluster, create_by(b, b.shape), 2);
  CHECK_MESSAGE(made.status.code() == 0, made.status.message());
  check_refused(call(cluster, create_by(a, a.shape), 2), exhausted, "create of 'a': float64 [512] takes 4.0 KiB");
}

TEST_CASE("with check_numerics a ps refuses NaN and Inf, naming variable and element; without, it stores them") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> initial{1, 2, 3, 4, 5, 6};
  const variable_ref w{"w", dtype::float32, {2, 3}, 0};
  ::unsetenv("PSCORO_CHECK_NUMERICS");  // the option alone decides below
  SUBCASE("on") {
    server_options options;
    options.check_numerics = true;
    local_cluster cluster(1, 0, {}, options);
    REQUIRE(call(cluster, create_from(w, values<float>({2, 3}, initial))).status.code() == 0);
    const std::string on = "(server_options::check_numerics is on)";
    check_refused(call(cluster, update(w, wire::UpdateVariable::ASSIGN, values<float>({2, 3}, {0, 0, 0, 0, 0, nan}))),
                  invalid, "assign to 'w': element [1, 2] of the value is NaN " + on);
    check_refused(call(cluster, update(w, wire::UpdateVariable::ADD, values<float>({2, 3}, {0, inf, 0, 0, 0, 0}))),
                  invalid, "assign_add to 'w': element [0, 1] of the value is Inf");
    const auto minus_inf = values<float>({1, 3}, {0, -inf, 0});
    check_refused(call(cluster, scatter(w, wire::UpdateVariable::ASSIGN, ids({1}), minus_inf)), invalid,
                  "scatter_update to 'w': element [0, 1] of the rows is -Inf");
    check_refused(call(cluster, update_rows(w, 0, 1, values<float>({1, 3}, {nan, 0, 0}))), invalid,
                  "assign to 'w': element [0, 0] of the value is NaN");
    check_refused(call(cluster, apply(w, wire::Optimizer::SGD, values<float>({2, 3}, {0, 0, 0, inf, 0, 0}))), invalid,
                  "sgd update of 'w': element [1, 0] of the gradient is Inf");
    const auto one_row = ids({0});
    check_refused(call(cluster, apply(w, wire::Optimizer::ADAM, values<float>({1, 3}, {0, 0, nan}), &one_row)),
                  invalid, "adam sparse update of 'w': element [0, 2] of the gradient is NaN");
    CHECK(value_of<float>(cluster, w) == initial);
    CHECK(num_slots(cluster, w) == 0);

    const variable_ref x{"x", dtype::float64, {3}, 0};
    check_refused(call(cluster, create_from(x, values<double>({3}, {0, std::numeric_limits<double>::infinity(), 0}))),
                  invalid, "create of 'x': element [1] of the initial value is Inf " + on);
    check_refused(call(cluster, read_of(x)), errc::not_found, "variable 'x' does not exist");
    const variable_ref scalar{"scalar", dtype::float64, {}, 0};
    check_refused(call(cluster, create_from(scalar, values<double>({}, {std::nan("")}))), invalid,
                  "create of 'scalar': the initial value is NaN");
    // Finite values pass, and integers have nothing to check.
    const auto finite = values<float>({2, 3}, {1, 1, 1, 1, 1, 1});
    CHECK(call(cluster, update(w, wire::UpdateVariable::ADD, finite)).status.code() == 0);
    CHECK(call(cluster, create_from(variable_ref{"n", dtype::int32, {2}, 0}, values<std::int32_t>({2}, {1, 2})))
              .status.code() == 0);
  }
  SUBCASE("off") {
    local_cluster cluster(1, 0);
    REQUIRE(call(cluster, create_from(w, values<float>({2, 3}, initial))).status.code() == 0);
    CHECK(call(cluster, update(w, wire::UpdateVariable::ASSIGN, values<float>({2, 3}, {0, 0, 0, 0, inf, nan})))
              .status.code() == 0);
    const auto stored = value_of<float>(cluster, w);
    CHECK(std::isinf(stored[4]));
    CHECK(std::isnan(stored[5]));
  }
  SUBCASE("on through PSCORO_CHECK_NUMERICS=1") {
    ::setenv("PSCORO_CHECK_NUMERICS", "1", 1);
    local_cluster cluster(1, 0);  // read when the ps starts
    ::unsetenv("PSCORO_CHECK_NUMERICS");
    REQUIRE(call(cluster, create_from(w, values<float>({2, 3}, initial))).status.code() == 0);
    check_refused(call(cluster, update(w, wire::UpdateVariable::SUB, values<float>({2, 3}, {nan, 0, 0, 0, 0, 0}))),
                  invalid, "assign_sub to 'w': element [0, 0] of the value is NaN");
    CHECK(value_of<float>(cluster, w) == initial);
  }
  SUBCASE("PSCORO_CHECK_NUMERICS=0 turns the program's choice off; a bad value stops the ps") {
    server_options options;
    options.check_numerics = true;
    {
      const pscoro::testing::scoped_environment off("PSCORO_CHECK_NUMERICS", "0");
      local_cluster cluster(1, 0, {}, options);
      REQUIRE(call(cluster, create_from(w, values<float>({2, 3}, initial))).status.code() == 0);
      CHECK(call(cluster, update(w, wire::UpdateVariable::ASSIGN, values<float>({2, 3}, {nan, 0, 0, 0, 0, 0})))
                .status.code() == 0);
    }
    const pscoro::testing::scoped_environment typo("PSCORO_CHECK_NUMERICS", "on");
    CHECK_THROWS_WITH_AS(local_cluster(1, 0),
                         "PSCORO_CHECK_NUMERICS is 'on': use 1 (refuse NaN and Inf in float values) or 0", error);
  }
}

// ---- Assigns in place: the ps's buffer pool and copy on write, on a ps_service without sockets ----

namespace {

// A float32 [256, 256] tensor (256 KiB: the smallest buffer the ps's pool keeps) of `x`.
tensor filled_block(float x) {
  tensor t = tensor::uninitialized(dtype::float32, {256, 256});
  std::fill_n(t.mutable_data<float>(), t.size(), x);
  return t;
}

bool all_are(const tensor& t, float x) {
  return t.type() == dtype::float32 && t.size() == 256 * 256 &&
         std::all_of(t.data<float>(), t.data<float>() + t.size(), [x](float e) { return e == x; });
}

// Serves `request` on `ps` as a server does (its segments go back to the pool afterwards); the
// reply's tensor shares the ps's bytes as a reply being written would.
reply serve_directly(ps::ps_service& ps, wire::frame request) {
  const wire::frame response = ps.handle(request);
  ps.recycle(std::move(request));
  reply out{response.message.response().status(), {}};
  if (response.message.response().result().has_tensor()) {
    out.value = wire::get_tensor(response, response.message.response().result().tensor());
  }
  return out;
}

}  // namespace

TEST_CASE("an assign adopts the received bytes and pools the storage it replaces; a reply holding it keeps it") {
  ps::ps_service ps("ps:0");
  const variable_ref v{"v", dtype::float32, {256, 256}, 0};
  constexpr std::size_t bytes = 256 * 256 * sizeof(float);
  REQUIRE(serve_directly(ps, create_from(v, filled_block(1))).status.code() == 0);

  auto held = serve_directly(ps, read_of(v));  // a reply still being written out shares the storage
  REQUIRE(all_are(held.value, 1));
  wire::frame assign_two = update(v, wire::UpdateVariable::ASSIGN, filled_block(2));
  const std::byte* received = assign_two.segments.at(0).data();
  REQUIRE(serve_directly(ps, std::move(assign_two)).status.code() == 0);
  CHECK(all_are(held.value, 1));  // the reply's bytes never change underneath it
  CHECK(ps.buffers()->size() == 0);  // the old storage is the reply's until it is written
  auto now = serve_directly(ps, read_of(v));
  CHECK(all_are(now.value, 2));
  CHECK(now.value.bytes().data() == received);  // adopted, not copied
  held = {};
  now = {};

  // Nothing holds the storage any more: the next assign gives it to the pool, which hands it to the
  // next request segment of its size.
  REQUIRE(serve_directly(ps, update(v, wire::UpdateVariable::ASSIGN, filled_block(3))).status.code() == 0);
  REQUIRE(ps.buffers()->size() == 1);
  CHECK(metrics::process_registry().value("pscoro_ps_pooled_bytes") == static_cast<double>(bytes));
  CHECK(ps.buffers()->take(bytes - 4).data() == nullptr);  // only exactly its size
  byte_buffer reused = ps.buffers()->take(bytes);
  CHECK(reused.data() == received);
  CHECK(ps.buffers()->size() == 0);
  CHECK(all_are(serve_directly(ps, read_of(v)).value, 3));

  // assign_add with a reply holding the storage copies first; without, it adds in place and the
  // request's segment goes to the pool.
  auto before = serve_directly(ps, read_of(v));
  const std::byte* storage = before.value.bytes().data();
  // (Frames made in statements of their own: a temporary tensor in the call would hold the segment.)
  wire::frame add_one = update(v, wire::UpdateVariable::ADD, filled_block(1));
  REQUIRE(serve_directly(ps, std::move(add_one)).status.code() == 0);
  CHECK(all_are(before.value, 3));
  before = {};
  auto after = serve_directly(ps, read_of(v));
  CHECK(all_are(after.value, 4));
  CHECK(after.value.bytes().data() != storage);
  storage = after.value.bytes().data();
  after = {};
  wire::frame add_another = update(v, wire::UpdateVariable::ADD, filled_block(1));
  REQUIRE(serve_directly(ps, std::move(add_another)).status.code() == 0);
  after = serve_directly(ps, read_of(v));
  CHECK(all_are(after.value, 5));
  CHECK(after.value.bytes().data() == storage);
  CHECK(ps.buffers()->size() == 2);  // both additions' segments

  // A session's end empties the pool with the variables.
  ps.clear();
  CHECK(ps.buffers()->size() == 0);
  CHECK(ps.buffers()->bytes() == 0);
}

TEST_CASE("a pooled buffer that nothing took for the idle time is released; one taken and given since is kept") {
  using namespace std::chrono_literals;
  wire::buffer_pool pool(1024, 8, 1 << 20);
  const auto t0 = wire::buffer_pool::clock::time_point{} + 1h;
  pool.give(byte_buffer(4096), t0);
  pool.give(byte_buffer(8192), t0 + 1s);
  pool.give(byte_buffer(16384), t0 + 2s);
  // The 4096 one is reused at t0 + 8 s and given back: its idle time starts again.
  byte_buffer reused = pool.take(4096);
  REQUIRE(reused.size() == 4096);
  pool.give(std::move(reused), t0 + 8s);
  CHECK(pool.release_idle(10s, t0 + 10s) == 0);  // none idle for more than 10 s yet
  CHECK(pool.release_idle(10s, t0 + 11500ms) == 8192);
  CHECK(pool.size() == 2);
  CHECK(pool.bytes() == 16384 + 4096);
  CHECK(pool.release_idle(10s, t0 + 12500ms) == 16384);
  CHECK(pool.take(4096).size() == 4096);  // still there
  CHECK(pool.release_idle(0s, t0 + 1000s) == 0);  // empty now
  CHECK(pool.bytes() == 0);
}

TEST_CASE("a ps server releases the buffers no request reused for ps_idle_buffers_release, and only then") {
  // Two assigns of a variable: the second adopts its received segment and pools the storage it
  // replaced. Two ps side by side (the gauge sums them): one with the release off and a 256 KiB
  // variable, one with a release of 100 ms and a 512 KiB one. The second's buffer goes back once
  // unused that long (waited for, not timed: the test fails only if it never goes, or if the first's
  // goes before it).
  const auto pooled = [] { return metrics::process_registry().value("pscoro_ps_pooled_bytes").value_or(-1); };
  const auto block = [](std::size_t rows, float x) {
    tensor t = tensor::uninitialized(dtype::float32, {rows, 256});
    std::fill_n(t.mutable_data<float>(), t.size(), x);
    return t;
  };
  const auto assign_twice = [&](local_cluster& cluster, std::size_t rows) {
    const variable_ref v{"v", dtype::float32, {rows, 256}, 0};
    REQUIRE(call(cluster, create_from(v, block(rows, 1))).status.code() == 0);
    REQUIRE(call(cluster, update(v, wire::UpdateVariable::ASSIGN, block(rows, 2))).status.code() == 0);
    REQUIRE(call(cluster, update(v, wire::UpdateVariable::ASSIGN, block(rows, 3))).status.code() == 0);
    return v;
  };
  constexpr double kept_bytes = 256 * 256 * sizeof(float), released_bytes = 512 * 256 * sizeof(float);
  server_options never;
  never.ps_idle_buffers_release = std::chrono::milliseconds{0};
  local_cluster keeping(1, 0, {}, never);
  assign_twice(keeping, 256);
  REQUIRE(pooled() == kept_bytes);
  server_options soon;
  soon.ps_idle_buffers_release = std::chrono::milliseconds{100};
  local_cluster releasing(1, 0, {}, soon);
  const auto v = assign_twice(releasing, 512);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (pooled() == kept_bytes + released_bytes && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  CHECK(pooled() == kept_bytes);
  const tensor value = call(releasing, read_of(v)).value;  // the variable itself is untouched
  CHECK(value.shape() == shape_type{512, 256});
  CHECK(std::all_of(value.data<float>(), value.data<float>() + value.size(), [](float e) { return e == 3; }));
}

TEST_CASE("a read's answer is bounded from the request alone: its rows, or none when it will be refused") {
  // What a ps's connections count against max_bytes_in_flight when a request arrives
  // (wire::connection::bound_answers_by).
  server_options options;
  options.max_variable_bytes = 1 << 20;
  ps::ps_service ps("ps:0", options);
  const variable_ref v{"v", dtype::float32, {256, 256}, 0};  // rows of 1 KiB, 256 KiB in all
  constexpr std::uint64_t row = 256 * sizeof(float);
  REQUIRE(serve_directly(ps, create_from(v, filled_block(1))).status.code() == 0);
  CHECK(ps.answer_bytes_bound(read_of(v)) == 256 * row);
  CHECK(ps.answer_bytes_bound(read_rows(v, 10, 13)) == 3 * row);
  CHECK(ps.answer_bytes_bound(gather(v, ids({5, 5, 5, 7}))) == 4 * row);  // ids may repeat
  // 1024 ids make the largest reply max_variable_bytes allows; one more is refused, so it answers little.
  CHECK(ps.answer_bytes_bound(gather(v, ids(std::vector<std::int64_t>(1024, 3)))) == 1024 * row);
  CHECK(ps.answer_bytes_bound(gather(v, ids(std::vector<std::int64_t>(1025, 3)))) == 0);
  CHECK(ps.answer_bytes_bound(read_rows(v, 13, 10)) == 0);
  CHECK(ps.answer_bytes_bound(read_rows(v, 0, 257)) == 0);
  // Not from the variables the ps holds: a read may arrive right behind its variable's create.
  CHECK(ps.answer_bytes_bound(read_of(variable_ref{"w", dtype::float32, {64, 256}, 0})) == 64 * row);
  CHECK(ps.answer_bytes_bound(read_of(variable_ref{"w", dtype::float32, {1025, 256}, 0})) == 0);  // too big to exist
  CHECK(ps.answer_bytes_bound(read_of(variable_ref{"w", dtype::float32, {u64_max / 2, 256}, 0})) == 0);
  wire::frame no_ids = gather(v, ids({1, 2}));
  no_ids.segments.clear();  // its ids' segment never came
  CHECK(ps.answer_bytes_bound(no_ids) == 0);
  CHECK(ps.answer_bytes_bound(update(v, wire::UpdateVariable::ASSIGN, filled_block(2))) == 0);
}

TEST_CASE("a sparse read's reply of 1 MiB or more is a pooled buffer of its own pool, back there once nothing holds it") {
  // Rows of 32 KiB, row r all r; replies of 1100 and 1150 rows (34.4 and 35.9 MiB) both fit 36 MiB.
  constexpr std::size_t width = 8192;
  server_options options;
  options.max_ps_bytes = std::uint64_t{1} << 30;  // a reply pool of up to 64 MiB, whatever the machine's memory
  ps::ps_service ps("ps:0", options);
  const variable_ref v{"v", dtype::float32, {1024, width}, 0};
  tensor rows = tensor::uninitialized(dtype::float32, {1024, width});
  for (std::size_t r = 0; r < 1024; ++r) std::fill_n(rows.mutable_data<float>() + r * width, width, static_cast<float>(r));
  REQUIRE(serve_directly(ps, create_from(v, rows)).status.code() == 0);
  const auto ids_from = [](std::int64_t first, std::size_t count) {
    std::vector<std::int64_t> out(count);
    for (std::size_t k = 0; k < count; ++k) out[k] = (first + static_cast<std::int64_t>(k) * 7) % 1024;
    return out;
  };
  const auto rows_are = [](const tensor& got, const std::vector<std::int64_t>& asked) {
    if (got.size() != asked.size() * width) return false;
    for (std::size_t k = 0; k < asked.size(); ++k) {
      const float* row = got.data<float>() + k * width;
      if (!std::all_of(row, row + width, [&](float e) { return e == static_cast<float>(asked[k]); })) return false;
    }
    return true;
  };
  const auto& replies = ps.reply_buffers();
  REQUIRE(replies->size() == 0);
  REQUIRE(ps.buffers()->size() == 0);  // the create's segment is the variable's storage

  const auto first_ids = ids_from(3, 1100);
  auto first = serve_directly(ps, gather(v, ids(first_ids)));
  REQUIRE(first.status.code() == 0);
  CHECK(rows_are(first.value, first_ids));
  const std::byte* buffer = first.value.bytes().data();
  CHECK(replies->size() == 0);  // the reply holds it
  first = {};
  REQUIRE(replies->size() == 1);
  CHECK(replies->bytes() == std::uint64_t{36} << 20);  // whole 2 MiB pages

  // A reply of another size in the same 36 MiB is gathered into it, and gives it back again.
  const auto second_ids = ids_from(5, 1150);
  auto second = serve_directly(ps, gather(v, ids(second_ids)));
  REQUIRE(second.status.code() == 0);
  CHECK(second.value.bytes().data() == buffer);
  CHECK(rows_are(second.value, second_ids));
  CHECK(replies->size() == 0);
  second = {};
  CHECK(replies->size() == 1);

  // Below 32 MiB the granule is 256 KiB: replies of 39 and 40 rows (1.22 and 1.25 MiB) share a
  // buffer of 1.25 MiB, kept beside the large one.
  const std::byte* mid = nullptr;
  for (const std::size_t count : {std::size_t{40}, std::size_t{39}}) {
    CAPTURE(count);
    const auto some_ids = ids_from(2, count);
    auto some = serve_directly(ps, gather(v, ids(some_ids)));
    CHECK(rows_are(some.value, some_ids));
    CHECK(some.value.bytes().data() != buffer);
    if (mid) CHECK(some.value.bytes().data() == mid);
    mid = some.value.bytes().data();
    some = {};
    CHECK(replies->size() == 2);
    CHECK(replies->bytes() == (std::uint64_t{36} << 20) + (std::uint64_t{1280} << 10));
  }

  // Smaller replies are buffers of their own (glibc serves those well), the pool untouched; the
  // requests' pool never holds a reply.
  const auto few_ids = ids_from(1, 10);
  const auto few = serve_directly(ps, gather(v, ids(few_ids)));
  CHECK(rows_are(few.value, few_ids));
  CHECK(few.value.bytes().data() != buffer);
  CHECK(few.value.bytes().data() != mid);
  CHECK(replies->size() == 2);
  CHECK(ps.buffers()->size() == 0);
  CHECK(metrics::process_registry().value("pscoro_ps_pooled_bytes") == static_cast<double>(replies->bytes()));

  // A session's end empties it with the variables.
  ps.clear();
  CHECK(replies->size() == 0);
  CHECK(replies->bytes() == 0);

  // A pool gone first (the ps with it) leaves the reply valid; its buffer is then just released.
  auto last = std::make_unique<ps::ps_service>("ps:1", options);
  REQUIRE(serve_directly(*last, create_from(v, rows)).status.code() == 0);
  auto kept = serve_directly(*last, gather(v, ids(first_ids)));
  last.reset();
  CHECK(rows_are(kept.value, first_ids));
}

TEST_CASE("served over a connection, a pooled reply buffer is filled anew each time it comes back") {
  // As above, through a server: the reply is gathered as it is sent, into a buffer that still
  // holds the last reply's rows, and goes back to the pool once written.
  constexpr std::size_t width = 8192;
  local_cluster cluster(1, 0);
  const variable_ref v{"v", dtype::float32, {1024, width}, 0};
  tensor rows = tensor::uninitialized(dtype::float32, {1024, width});
  for (std::size_t r = 0; r < 1024; ++r) std::fill_n(rows.mutable_data<float>() + r * width, width, static_cast<float>(r));
  REQUIRE(call(cluster, create_from(v, rows)).status.code() == 0);
  for (const auto& asking : {std::pair<std::int64_t, std::size_t>{3, 1100}, {5, 1150}, {11, 1100}}) {
    const std::int64_t first = asking.first;  // not a structured binding: clang 14 cannot capture one (CAPTURE)
    const std::size_t count = asking.second;
    CAPTURE(first);
    std::vector<std::int64_t> asked(count);
    for (std::size_t k = 0; k < count; ++k) asked[k] = (first + static_cast<std::int64_t>(k) * 13) % 1024;
    const auto got = call(cluster, gather(v, ids(asked)));
    REQUIRE(got.status.code() == 0);
    REQUIRE(got.value.size() == count * width);
    std::size_t wrong = 0;
    for (std::size_t k = 0; k < count; ++k) {
      const float* row = got.value.data<float>() + k * width;
      wrong += static_cast<std::size_t>(
          std::count_if(row, row + width, [&](float e) { return e != static_cast<float>(asked[k]); }));
    }
    CHECK(wrong == 0);
  }
}

TEST_CASE("an assign of the wrong shape, dtype or size changes neither the variable nor its storage") {
  ps::ps_service ps("ps:0");
  const variable_ref v{"v", dtype::float32, {256, 256}, 0};
  REQUIRE(serve_directly(ps, create_from(v, filled_block(5))).status.code() == 0);
  const std::byte* storage = serve_directly(ps, read_of(v)).value.bytes().data();
  const auto unchanged = [&] {
    const auto now = serve_directly(ps, read_of(v));
    CHECK(all_are(now.value, 5));
    CHECK(now.value.bytes().data() == storage);
    CHECK(ps.buffers()->size() == 0);
  };

  tensor short_rows = tensor::uninitialized(dtype::float32, {255, 256});
  std::fill_n(short_rows.mutable_data<float>(), short_rows.size(), 6.0f);
  check_refused(serve_directly(ps, update(v, wire::UpdateVariable::ASSIGN, short_rows)), invalid,
                "assign to 'v': shape [255, 256] does not match the variable's [256, 256]");
  unchanged();

  tensor doubles = tensor::uninitialized(dtype::float64, {256, 256});
  std::fill_n(doubles.mutable_data<double>(), doubles.size(), 6.0);
  check_refused(serve_directly(ps, update(v, wire::UpdateVariable::ASSIGN, doubles)), invalid,
                "assign to 'v': dtype float64 does not match the variable's float32");
  unchanged();

  // The tensor says [256, 256] but its segment is shorter (a peer that lies about sizes).
  wire::frame lying = update(v, wire::UpdateVariable::ASSIGN, filled_block(6));
  lying.segments.at(0) = byte_buffer(1000);
  check_refused(serve_directly(ps, std::move(lying)), invalid,
                "float32 tensor of shape [256, 256] needs 262144 bytes but its segment has 1000");
  unchanged();

  // The handle's idea of the variable is another shape of the same size.
  const variable_ref reshaped{"v", dtype::float32, {128, 512}, 0};
  tensor wide = tensor::uninitialized(dtype::float32, {128, 512});
  std::fill_n(wide.mutable_data<float>(), wide.size(), 6.0f);
  check_refused(serve_directly(ps, update(reshaped, wire::UpdateVariable::ASSIGN, wide)), invalid,
                "assign: the handle says 'v' is float32 [128, 512] but ps:0 holds it as float32 [256, 256]");
  unchanged();
}

namespace {

// A hash table's ref as a request names it: float32 rows of `dim`, `buckets` buckets, all on ps:0.
void set_table_ref(wire::HashTableRef& ref, const std::string& name, std::uint64_t dim, std::uint32_t buckets) {
  ref.set_name(name);
  ref.set_dtype(static_cast<std::uint32_t>(dtype::float32));
  ref.set_dim(dim);
  ref.set_buckets(buckets);
  ref.add_ps_tasks(0);
}

wire::frame create_table(const std::string& name, std::uint64_t dim, std::uint32_t buckets,
                         std::uint32_t held_buckets) {
  wire::frame f;
  auto* body = f.message.mutable_request()->mutable_create_hash_table();
  set_table_ref(*body->mutable_table(), name, dim, buckets);
  body->mutable_initializer()->set_kind(wire::Initializer::ONES);
  body->set_max_rows_per_ps(1000);
  for (std::uint32_t b = 0; b < held_buckets; ++b) body->add_buckets(b);
  return f;
}

wire::frame lookup_in(const std::string& name, std::uint64_t dim, std::uint32_t buckets, const tensor& asked) {
  wire::frame f;
  auto* body = f.message.mutable_request()->mutable_hash_lookup();
  body->set_insert(true);
  auto* part = body->add_parts();
  set_table_ref(*part->mutable_table(), name, dim, buckets);
  wire::put_tensor(f, *part->mutable_ids(), asked);
  return f;
}

}  // namespace

TEST_CASE("hash table requests from the wire are bounded: buckets, replies, ids and shapes, before anything changes") {
  server_options options;
  options.max_variable_bytes = 4096;
  local_cluster cluster(1, 0, {}, options);
  check_refused(call(cluster, create_table("many", 4, std::uint32_t{1} << 30, 1)), invalid,
                "hash table 'many': buckets must be in [1, 1048576] (got 1073741824)");
  check_refused(call(cluster, create_table("zero", 0, 4, 4)), invalid, "hash table 'zero' has dim 0 and 4 buckets");
  REQUIRE(call(cluster, create_table("t", 4, 4, 4)).status.code() == 0);
  check_refused(call(cluster, create_table("t", 4, 4, 4)), errc::already_exists, "hash table 't' already exists");

  // 300 ids of 4 floats make 4800 bytes, past the 4096 a reply may take: refused, nothing inserted.
  check_refused(call(cluster, lookup_in("t", 4, 4, ids(std::vector<std::int64_t>(300, 7)))), exhausted,
                "lookup of 't': 300 ids of 4 values make a reply past the 4.0 KiB (4096 bytes) ps:0 allows");
  // The caller's idea of the table must be the ps's; ids must be a 1-D int64 tensor.
  check_refused(call(cluster, lookup_in("t", 8, 4, ids({1}))), invalid, "the table is float32 with rows of 4");
  check_refused(call(cluster, lookup_in("t", 4, 4, values<float>({1}, {1.0f}))), invalid,
                "ids must be a 1-D int64 tensor, not float32 [1]");
  check_refused(call(cluster, lookup_in("absent", 4, 4, ids({1}))), errc::not_found,
                "ps:0 holds no part of a hash table of that name");
  const auto held = call(cluster, lookup_in("t", 4, 4, ids({i64_min, i64_max, -1, 0})));
  REQUIRE(held.status.code() == 0);
}

TEST_CASE("a hash table that would pass max_ps_bytes is refused, at its creation and at a lookup; what it holds stays") {
  server_options options;
  options.max_ps_bytes = 200000;
  local_cluster cluster(1, 0, {}, options);
  auto filtered = create_table("filtered", 4, 4, 4);
  auto* admission = filtered.message.mutable_request()->mutable_create_hash_table()->mutable_admission();
  admission->set_kind(wire::AdmissionPolicy::MIN_COUNT);
  admission->set_count(2);
  admission->set_counters(1 << 20);  // a filter of 1 MiB
  check_refused(call(cluster, std::move(filtered)), exhausted,
                "hash table 'filtered' needs 1.0 MiB (1049120 bytes) on ps:0 to start");
  auto unknown = create_table("unknown", 4, 4, 4);
  unknown.message.mutable_request()->mutable_create_hash_table()->mutable_admission()->set_kind(
      static_cast<wire::AdmissionPolicy::Kind>(99));
  check_refused(call(cluster, std::move(unknown)), invalid, "hash table 'unknown': unknown admission policy 99");

  auto roomy = create_table("t", 4, 4, 4);
  roomy.message.mutable_request()->mutable_create_hash_table()->set_max_rows_per_ps(1 << 20);  // memory, not rows
  REQUIRE(call(cluster, std::move(roomy)).status.code() == 0);
  REQUIRE(call(cluster, lookup_in("t", 4, 4, ids({1, 2, 3}))).status.code() == 0);
  std::vector<std::int64_t> many(5000);
  for (std::size_t k = 0; k < many.size(); ++k) many[k] = static_cast<std::int64_t>(k) + 100;
  check_refused(call(cluster, lookup_in("t", 4, 4, ids(many))), exhausted,
                "hash table 't' on ps:0: this lookup would add 5000 rows");
  // The three rows held are still there, the 5000 are not: a read without insert counts none.
  wire::frame read = lookup_in("t", 4, 4, ids({1, 100}));
  read.message.mutable_request()->mutable_hash_lookup()->set_insert(false);
  const auto answer = testing::call_task("ps:0", cluster.spec.task_address("ps", 0), std::move(read),
                                         net::make_hello({"chief", 0, 0}, 1));
  REQUIRE(answer.message.response().status().code() == 0);
  const auto& rows = answer.message.response().result().list().items(0).tensor();
  const tensor values_read = wire::get_tensor(answer, rows);
  CHECK(values_read.data<float>()[0] == 1.0f);  // id 1: its initial row of ones
  CHECK(values_read.data<float>()[4] == 0.0f);  // id 100: not held, the default row
}

namespace {

wire::frame export_of(const std::string& name, std::uint32_t first_bucket, std::uint64_t max_bytes) {
  wire::frame f;
  auto* body = f.message.mutable_request()->mutable_hash_export();
  set_table_ref(*body->mutable_table(), name, 4, 4);
  body->set_first_bucket(first_bucket);
  body->set_max_bytes(max_bytes);
  return f;
}

// A restore of rows `id_list` (each a row of 4 floats of `value`, last named at 0) into table "t".
wire::frame import_of(const std::vector<std::int64_t>& id_list, float value, bool reset = false) {
  wire::frame f;
  auto* body = f.message.mutable_request()->mutable_hash_import();
  set_table_ref(*body->mutable_table(), "t", 4, 4);
  body->set_reset(reset);
  wire::put_tensor(f, *body->mutable_ids(), ids(id_list));
  wire::put_tensor(f, *body->mutable_last_named(), ids(std::vector<std::int64_t>(id_list.size(), 0)));
  wire::put_tensor(f, *body->mutable_values(),
                   values<float>({id_list.size(), 4}, std::vector<float>(id_list.size() * 4, value)));
  return f;
}

}  // namespace

TEST_CASE("table exports and restores from the wire are checked whole; a worker may not restore; nothing changes") {
  server_options options;
  options.max_variable_bytes = 4096;
  local_cluster cluster(1, 0, {}, options);
  REQUIRE(call(cluster, create_table("t", 4, 4, 4)).status.code() == 0);
  REQUIRE(call(cluster, lookup_in("t", 4, 4, ids({1, 2, 3}))).status.code() == 0);
  const auto unchanged = [&] {
    wire::frame read = lookup_in("t", 4, 4, ids({1, 2, 3, 50}));
    read.message.mutable_request()->mutable_hash_lookup()->set_insert(false);
    const auto answer = testing::call_task("ps:0", cluster.spec.task_address("ps", 0), std::move(read),
                                           net::make_hello({"chief", 0, 0}, 1));
    REQUIRE(answer.message.response().status().code() == 0);
    const tensor rows = wire::get_tensor(answer, answer.message.response().result().list().items(0).tensor());
    CHECK(rows.data<float>()[0] == 1.0f);   // id 1: its initial row of ones
    CHECK(rows.data<float>()[12] == 0.0f);  // id 50: never held
  };
  check_refused(call(cluster, export_of("t", 4, 1 << 20)), invalid, "export of 't': bucket 4 is not one of its 4");
  check_refused(call(cluster, export_of("absent", 0, 1 << 20)), errc::not_found, "holds no part of a hash table");
  // Only the chief restores.
  const auto from_worker = testing::call_task("ps:0", cluster.spec.task_address("ps", 0), import_of({50}, 9.0f, true),
                                              net::make_hello({"worker", 0, 0}, 1));
  CHECK(from_worker.message.response().status().code() == static_cast<int>(errc::permission_denied));
  unchanged();
  // Rows held already, twice in one piece, or values not of the part's shape.
  check_refused(call(cluster, import_of({1}, 9.0f)), invalid, "id 1 is held already");
  check_refused(call(cluster, import_of({50, 50}, 9.0f)), invalid, "id 50 is there twice");
  auto narrow = import_of({50}, 9.0f);
  wire::put_tensor(narrow, *narrow.message.mutable_request()->mutable_hash_import()->mutable_values(),
                   values<float>({1, 3}, {9.0f, 9.0f, 9.0f}));
  check_refused(call(cluster, std::move(narrow)), invalid, "values float32 [1, 4] (0 slots), got int64 [1] and float32 [1, 3]");
  // A reset whose counters lie about their count, or name 2^40 of them.
  auto lying = import_of({}, 9.0f, true);
  auto* state = lying.message.mutable_request()->mutable_hash_import()->mutable_state();
  state->set_admission_counters(100);
  wire::put_tensor(lying, *state->mutable_counters(), ids({0}));
  check_refused(call(cluster, std::move(lying)), invalid, "100 admission counters travel as int64 [13], not int64 [1]");
  auto huge = import_of({}, 9.0f, true);
  huge.message.mutable_request()->mutable_hash_import()->mutable_state()->set_admission_counters(std::uint64_t{1} << 40);
  check_refused(call(cluster, std::move(huge)), invalid, "1099511627776 admission counters (at most 2^32)");
  unchanged();
  // Only the chief saves (an export that is part of a save moves the part's save); an increment
  // names its save, and builds only on a save the part knows.
  auto saving = export_of("t", 0, 1 << 20);
  saving.message.mutable_request()->mutable_hash_export()->set_save(5);
  const auto save_from_worker = testing::call_task("ps:0", cluster.spec.task_address("ps", 0), std::move(saving),
                                                   net::make_hello({"worker", 0, 0}, 1));
  CHECK(save_from_worker.message.response().status().code() == static_cast<int>(errc::permission_denied));
  auto no_save = export_of("t", 0, 1 << 20);
  no_save.message.mutable_request()->mutable_hash_export()->set_base(5);
  check_refused(call(cluster, std::move(no_save)), invalid, "belong to a save, and none is named");
  auto unknown_base = export_of("t", 0, 1 << 20);
  unknown_base.message.mutable_request()->mutable_hash_export()->set_save(6);
  unknown_base.message.mutable_request()->mutable_hash_export()->set_base(5);
  check_refused(call(cluster, std::move(unknown_base)), errc::failed_precondition,
                "cannot tell what changed since save 0000000000000005");
  auto later_piece = export_of("t", 1, 1 << 20);
  later_piece.message.mutable_request()->mutable_hash_export()->set_save(6);
  check_refused(call(cluster, std::move(later_piece)), errc::failed_precondition,
                "for save 0000000000000006: the part is in save 0000000000000000 now");
  // Dropped ids of a restore are checked like its rows.
  auto foreign_drop = import_of({}, 9.0f);
  wire::put_tensor(foreign_drop, *foreign_drop.message.mutable_request()->mutable_hash_import()->mutable_dropped(),
                   values<float>({1}, {1.0f}));
  check_refused(call(cluster, std::move(foreign_drop)), invalid, "restore (dropped ids) of 't': ids must be a 1-D int64");
  unchanged();
  // An export gives every row, whole buckets at a time, and says where the next piece starts.
  const auto answer = testing::call_task("ps:0", cluster.spec.task_address("ps", 0), export_of("t", 0, 1),
                                         net::make_hello({"chief", 0, 0}, 1));
  REQUIRE(answer.message.response().status().code() == 0);
  const auto& piece = answer.message.response().hash_export();
  CHECK(piece.next_bucket() >= 1);
  CHECK(piece.next_bucket() <= 4);
}

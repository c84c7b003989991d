// A live worker (a real pscoro::server on 127.0.0.1, no secret, with worker functions, a dataset
// function and a resource function bound) fed the input through a real connection; as ps_fuzz.cpp, byte 0 bit 0
// chooses whether a valid chief Hello goes first. The worker must close the connection, never
// crash, and answer a well-formed Hello and Heartbeat afterwards.
#include "fuzz_support.hpp"

#include <pscoro/dataset.hpp>
#include <pscoro/per_worker.hpp>
#include <pscoro/worker_function.hpp>

#include <asio/detached.hpp>
#include <xtensor/xbuilder.hpp>

namespace {

const pscoro::worker_function<std::int64_t(std::int64_t)> add_one{"fuzz.add_one"};
const pscoro::worker_function<std::string(std::string, double, bool)> describe{"fuzz.describe"};
const pscoro::worker_function<double(pscoro::tensor)> sum{"fuzz.sum"};
const pscoro::worker_function<std::int64_t(pscoro::per_worker_iterator<std::int64_t>)> next_number{"fuzz.next"};
const pscoro::dataset_function<std::int64_t> numbers{"fuzz.numbers"};
const pscoro::worker_function<double(pscoro::per_worker_variable<float>, pscoro::per_worker_resource<std::string>)>
    count{"fuzz.count"};
const pscoro::resource_function<std::string> names{"fuzz.names"};

void bind_all(pscoro::server& s) {
  s.bind(add_one, [](std::int64_t x) -> asio::awaitable<std::int64_t> { co_return x + 1; });
  s.bind(describe, [](std::string text, double x, bool flag) -> asio::awaitable<std::string> {
    co_return text + (flag ? ":" : "/") + std::to_string(x);
  });
  s.bind(sum, [](pscoro::tensor t) -> asio::awaitable<double> { co_return static_cast<double>(t.size_bytes()); });
  s.bind(next_number, [](pscoro::per_worker_iterator<std::int64_t> it) -> asio::awaitable<std::int64_t> {
    co_return it.next();
  });
  s.bind(numbers, [](pscoro::input_context context) {
    return pscoro::from_values(std::vector<std::int64_t>{1, 2, 3}).shard(context.num_workers, context.worker_index);
  });
  s.bind(count, [](pscoro::per_worker_variable<float> v,
                   pscoro::per_worker_resource<std::string> name) -> asio::awaitable<double> {
    const xt::xarray<float> one = xt::ones<float>(v.shape());
    v.assign_add(one);
    co_return static_cast<double>(v.read().size() + name->size());
  });
  s.bind(names, [](pscoro::input_context context) { return std::to_string(context.worker_index); });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static pscoro::fuzz::live_server worker("worker", bind_all);
  if (size == 0) return 0;
  worker.feed(std::string_view(reinterpret_cast<const char*>(data) + 1, size - 1), data[0] & 1);
  worker.check_alive();
  return 0;
}

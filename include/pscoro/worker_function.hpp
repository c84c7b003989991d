// A typed, named handle to a function that workers run and the coordinator schedules.
//
// C++ cannot ship closures, so both sides share a declaration:
//
//   inline const pscoro::worker_function<double(pscoro::variable<float>, std::int64_t)>
//       train_step{"model.train_step"};
//
// the worker binds it to a coroutine (server::bind) and the coordinator schedules it with
// arguments (cluster_coordinator::schedule). Arguments and results travel as pscoro::value through
// codec<T>; the signature travels too, so two binaries that disagree about it fail clearly.
// dataset_function<T> and resource_function<T> name, likewise, the functions that build a worker's
// datasets and per-worker resources (<pscoro/per_worker.hpp> makes and uses what they build).
#pragma once

#include <pscoro/config.hpp>

#include <pscoro/value.hpp>

#include <asio/awaitable.hpp>
#include <asio/cancellation_type.hpp>
#include <asio/post.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

namespace pscoro {

/// What a worker's dataset function knows about its place among the workers (TF's InputContext:
/// input_pipeline_id, num_input_pipelines).
struct input_context {
  std::int64_t worker_index = 0;
  std::int64_t num_workers = 1;
};

/// A named handle to a function that builds a worker's dataset of T; bound on workers with
/// server::bind, used on the chief with cluster_coordinator::create_per_worker_dataset.
template <class T>
class dataset_function {
 public:
  using element_type = T;
  explicit dataset_function(std::string name) : name_(std::move(name)) {}
  const std::string& name() const noexcept { return name_; }

 private:
  std::string name_;
};

/// A named handle to a function that builds a worker's per-worker resource of type T (a lookup
/// table, a cache, a client): bound on workers with server::bind, used on the chief with
/// cluster_coordinator::create_per_worker_resource. T needs no codec: it never leaves its worker.
template <class T>
class resource_function {
 public:
  using resource_type = T;
  explicit resource_function(std::string name) : name_(std::move(name)) {}
  const std::string& name() const noexcept { return name_; }

 private:
  std::string name_;
};

template <class Signature>
class worker_function;

template <class R, class... Args>
class worker_function<R(Args...)> {
 public:
  using result_type = R;
  using argument_types = std::tuple<Args...>;

  explicit worker_function(std::string name) : name_(std::move(name)) {}

  const std::string& name() const noexcept { return name_; }

  /// "float64(variable,int64)": the wire names of the result and argument types.
  static std::string signature() {
    std::string out(result_name());
    out += '(';
    std::size_t i = 0;
    ((out += (i++ ? "," : ""), out += detail::codec_name<std::decay_t<Args>>()), ...);
    out += ')';
    return out;
  }

 private:
  static std::string result_name() {
    if constexpr (std::is_void_v<R>) {
      return "void";
    } else {
      return detail::codec_name<R>();
    }
  }

  std::string name_;
};

namespace detail {

/// A bound worker function with its types erased: decodes arguments, runs, encodes the result.
using erased_worker_function =
    std::function<asio::awaitable<value>(std::vector<value> args, const decode_context& context)>;

/// Decodes argument `I` of `name`; a mismatch names the argument and the function.
template <class T>
T decode_argument(std::vector<value>& args, std::size_t index, const std::string& name,
                  const decode_context& context) {
  try {
    return codec<T>::decode(std::move(args[index]), context);
  } catch (const error& e) {
    throw error(e.code(), "argument " + std::to_string(index) + " of worker function '" + name +
                              "': " + e.what());
  }
}

template <class R, class... Args, class F, std::size_t... I>
asio::awaitable<value> invoke_bound(std::shared_ptr<F> fn, std::string name, std::vector<value> args,
                                    decode_context context, std::index_sequence<I...>) {
  if (args.size() != sizeof...(Args)) {
    throw error(errc::invalid_argument, "worker function '" + name + "' takes " +
                                            std::to_string(sizeof...(Args)) + " arguments, got " +
                                            std::to_string(args.size()));
  }
  // Decode every argument before the call: a bad argument fails before any side effect.
  std::tuple<std::decay_t<Args>...> decoded{
      decode_argument<std::decay_t<Args>>(args, I, name, context)...};
  if constexpr (std::is_void_v<R>) {
    co_await std::apply(*fn, std::move(decoded));
    co_return value{};
  } else {
    co_return codec<R>::encode(co_await std::apply(*fn, std::move(decoded)));
  }
}

/// Wraps `fn` (callable as `asio::awaitable<R>(Args...)`) for the worker's registry.
template <class R, class... Args, class F>
erased_worker_function erase_worker_function(const worker_function<R(Args...)>& handle, F&& fn) {
  static_assert(std::is_invocable_r_v<asio::awaitable<R>, std::decay_t<F>&, Args...>,
                "a worker function must be callable as asio::awaitable<R>(Args...)");
  auto stored = std::make_shared<std::decay_t<F>>(std::forward<F>(fn));
  return [stored, name = handle.name()](std::vector<value> args, const decode_context& context) {
    return invoke_bound<R, Args...>(stored, name, std::move(args), context,
                                    std::index_sequence_for<Args...>{});
  };
}

}  // namespace detail
namespace detail {
/// What a cancelled closure's pscoro operations throw.
inline error closure_cancelled() {
  return error(errc::cancelled,
               "the chief cancelled this closure: an earlier closure of its generation failed, or the chief's "
               "session ended");
}
}  // namespace detail

namespace this_closure {

/// Lets the worker's executor serve what waits (the chief's requests, heartbeats), then throws
/// errc::cancelled if the chief has cancelled the closure that runs this coroutine: an earlier
/// closure of the same generation failed (TF cancels running closures then), or the chief's
/// session ended. pscoro's own operations check before they start; a worker function that
/// computes for long between them calls this in its loop, which also keeps its worker responsive:
///
///   for (int i = 0; i < n; ++i) {
///     co_await pscoro::this_closure::check_cancelled();
///     heavy_step(i);
///   }
///
/// Outside a closure (on the chief, in a plain coroutine) it only yields.
inline asio::awaitable<void> check_cancelled() {
  const auto executor = co_await asio::this_coro::executor;  // named: g++ 12 (temporaries)
  co_await asio::post(executor, asio::use_awaitable);
  const auto state = co_await asio::this_coro::cancellation_state;
  if (state.cancelled() != asio::cancellation_type::none) throw detail::closure_cancelled();
}

}  // namespace this_closure
}  // namespace pscoro

// What crosses the wire as a worker-function argument or result, and how C++ types map onto it.
//
// A value is a scalar, a string, a tensor, a variable handle, or a list of values. codec<T>
// converts a C++ type to and from a value and names it in function signatures. pscoro has codecs
// for bool, integers, floating point, std::string, tensors and xt::xarray, variables, per-worker
// iterators, and, built from those, std::tuple, std::pair, std::vector, std::map<std::string, T>
// and std::optional; a type of your own gets one by specialising codec<T>, most simply from its
// members:
//
//   struct step_result { double loss; double accuracy; };
//   template <>
//   struct pscoro::codec<step_result> : pscoro::member_codec<step_result, &step_result::loss,
//                                                            &step_result::accuracy> {
//     static constexpr std::string_view name = "step_result";
//   };
#pragma once

#include <pscoro/config.hpp>

#include <pscoro/dtype.hpp>
#include <pscoro/error.hpp>
#include <pscoro/tensor.hpp>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace pscoro {

/// Where a dense variable lives: its name, element type, shape and ps task.
struct PSCORO_API variable_ref {
  std::string name;
  dtype type = dtype::float32;
  shape_type shape;
  int ps_task = 0;
  friend bool operator==(const variable_ref&, const variable_ref&) = default;
};

/// Where a sharded variable lives: its name, element type, whole shape, and its shards in row order
/// (each a dense variable holding consecutive rows).
struct PSCORO_API sharded_variable_ref {
  std::string name;
  dtype type = dtype::float32;
  shape_type shape;
  std::vector<variable_ref> shards;
  friend bool operator==(const sharded_variable_ref&, const sharded_variable_ref&) = default;
};

/// Where a dynamic embedding table lives: its name, row type and width, its virtual buckets, and
/// the ps tasks that hold them (bucket b on ps_tasks[b % ps_tasks.size()]).
struct PSCORO_API hash_table_ref {
  std::string name;
  dtype type = dtype::float32;
  std::size_t dim = 0;
  std::uint32_t buckets = 0;
  std::vector<int> ps_tasks;
  friend bool operator==(const hash_table_ref&, const hash_table_ref&) = default;
};

/// A value that exists on every worker (a per-worker iterator, variable or resource): its id and the
/// dataset or resource function that made it (a variable's name).
struct per_worker_ref {
  std::uint64_t id = 0;
  std::string function;
  /// On the chief: keeps the workers' values while any copy exists (a per_worker_iterator,
  /// per_worker_variable or per_worker_resource, the argument of a closure not yet run); the last
  /// copy gone releases them. Never sent.
  std::shared_ptr<const void> lease{};
  /// The same resource (leases aside).
  friend bool operator==(const per_worker_ref& a, const per_worker_ref& b) noexcept {
    return a.id == b.id && a.function == b.function;
  }
};

namespace detail {
class variable_io;
class per_worker_table;
}

struct value_list;

/// A worker-function argument or result. monostate: a function that returns nothing.
using value = std::variant<std::monostate, bool, std::int64_t, double, std::string, tensor, variable_ref,
                           sharded_variable_ref, per_worker_ref, value_list, hash_table_ref>;

/// Values in order: what a tuple, pair, vector, map (key, value, key, value, ...), optional (none
/// or one) or a codec built from members becomes.
struct value_list {
  std::vector<value> items;
};

/// How deeply lists may nest on the wire (a tuple of vectors of optionals is 3).
inline constexpr std::size_t max_value_depth = 32;
/// How many values the arguments of one call, or its result, may make on the wire (each argument,
/// list and item counts one): a decoded value costs ~100 bytes, and a peer's frame must not make
/// that gigabytes. Numbers in bulk travel as a tensor (xt::xarray), which has no such cost.
inline constexpr std::size_t max_value_items = std::size_t{1} << 16;

/// What decoding a value may need besides the value: the side's variable I/O.
struct decode_context {
  std::shared_ptr<detail::variable_io> variables;
  /// The worker's per-worker values: iterators, variables, resources (null on the chief, where
  /// per-worker values stay references).
  const detail::per_worker_table* per_worker = nullptr;
};

/// The name of the alternative `v` holds, for messages: "int64", "tensor<float32>".
PSCORO_API std::string describe(const value& v);

/// codec<T>: `static constexpr name` (for signatures), `encode(const T&) -> value`,
/// `decode(value&&, const decode_context&) -> T` (throws errc::invalid_argument on a mismatch).
template <class T, class Enable = void>
struct codec;

namespace detail {
[[noreturn]] PSCORO_API void throw_decode_mismatch(std::string_view expected, const value& got);

/// The name of T in signatures: codec<T>::name, a constant or (for types built from others) a
/// function.
template <class T>
std::string codec_name() {
  if constexpr (requires { codec<T>::name(); }) {
    return std::string(codec<T>::name());
  } else {
    return std::string(codec<T>::name);
  }
}

/// "a,b,c" of the codec names of Ts.
template <class... Ts>
std::string codec_names() {
  std::string out;
  ((out += (out.empty() ? "" : ","), out += codec_name<Ts>()), ...);
  return out;
}

/// The items of `v`, which must be a list of `name` (with `count` items when given).
PSCORO_API std::vector<value>& items_of(value& v, std::string_view name, std::optional<std::size_t> count);

/// Decodes item `index` of a `container`; a failure says which item.
template <class T>
T decode_item(value&& v, const decode_context& context, std::string_view container, std::size_t index) {
  try {
    return codec<T>::decode(std::move(v), context);
  } catch (const error& e) {
    throw error(e.code(), "item " + std::to_string(index) + " of " + std::string(container) + ": " + e.what());
  }
}
}  // namespace detail

template <>
struct codec<bool> {
  static constexpr std::string_view name = "bool";
  static value encode(bool v) { return v; }
  static bool decode(value&& v, const decode_context&) {
    if (auto* b = std::get_if<bool>(&v)) return *b;
    detail::throw_decode_mismatch(name, v);
  }
};

template <class T>
struct codec<T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>>> {
  static constexpr std::string_view name = "int64";
  static value encode(T v) {
    if constexpr (std::is_unsigned_v<T> && sizeof(T) >= sizeof(std::int64_t)) {
      if (v > static_cast<T>(std::numeric_limits<std::int64_t>::max())) {
        throw error(errc::invalid_argument, "integer " + std::to_string(v) + " does not fit in int64");
      }
    }
    return static_cast<std::int64_t>(v);
  }
  static T decode(value&& v, const decode_context&) {
    auto* i = std::get_if<std::int64_t>(&v);
    if (!i) detail::throw_decode_mismatch(name, v);
    if (!std::in_range<T>(*i)) {
      throw error(errc::invalid_argument, "integer " + std::to_string(*i) + " is out of range");
    }
    return static_cast<T>(*i);
  }
};

template <class T>
struct codec<T, std::enable_if_t<std::is_floating_point_v<T>>> {
  static constexpr std::string_view name = "float64";
  static value encode(T v) { return static_cast<double>(v); }
  static T decode(value&& v, const decode_context&) {
    if (auto* d = std::get_if<double>(&v)) return static_cast<T>(*d);
    detail::throw_decode_mismatch(name, v);
  }
};

template <>
struct codec<std::string> {
  static constexpr std::string_view name = "string";
  static value encode(const std::string& v) { return v; }
  static std::string decode(value&& v, const decode_context&) {
    if (auto* s = std::get_if<std::string>(&v)) return std::move(*s);
    detail::throw_decode_mismatch(name, v);
  }
};

template <>
struct codec<tensor> {
  static constexpr std::string_view name = "tensor";
  static value encode(const tensor& v) { return v; }
  static tensor decode(value&& v, const decode_context&) {
    if (auto* t = std::get_if<tensor>(&v)) return std::move(*t);
    detail::throw_decode_mismatch(name, v);
  }
};

template <class... Ts>
struct codec<std::tuple<Ts...>> {
  static std::string name() { return "tuple<" + detail::codec_names<Ts...>() + ">"; }
  static value encode(const std::tuple<Ts...>& t) {
    value_list list;
    list.items.reserve(sizeof...(Ts));
    std::apply([&](const Ts&... x) { (list.items.push_back(codec<Ts>::encode(x)), ...); }, t);
    return list;
  }
  static std::tuple<Ts...> decode(value&& v, const decode_context& context) {
    const auto container = name();
    auto& items = detail::items_of(v, container, sizeof...(Ts));
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      return std::tuple<Ts...>{detail::decode_item<Ts>(std::move(items[I]), context, container, I)...};
    }(std::index_sequence_for<Ts...>{});
  }
};

template <class A, class B>
struct codec<std::pair<A, B>> {
  static std::string name() { return "pair<" + detail::codec_names<A, B>() + ">"; }
  static value encode(const std::pair<A, B>& p) {
    return value_list{{codec<A>::encode(p.first), codec<B>::encode(p.second)}};
  }
  static std::pair<A, B> decode(value&& v, const decode_context& context) {
    const auto container = name();
    auto& items = detail::items_of(v, container, 2);
    return {detail::decode_item<A>(std::move(items[0]), context, container, 0),
            detail::decode_item<B>(std::move(items[1]), context, container, 1)};
  }
};

template <class T>
struct codec<std::vector<T>> {
  static std::string name() { return "vector<" + detail::codec_name<T>() + ">"; }
  static value encode(const std::vector<T>& items) {
    value_list list;
    list.items.reserve(items.size());
    for (const auto& x : items) list.items.push_back(codec<T>::encode(x));
    return list;
  }
  static std::vector<T> decode(value&& v, const decode_context& context) {
    const auto container = name();
    auto& items = detail::items_of(v, container, std::nullopt);
    std::vector<T> out;
    out.reserve(items.size());
    for (std::size_t i = 0; i < items.size(); ++i) {
      out.push_back(detail::decode_item<T>(std::move(items[i]), context, container, i));
    }
    return out;
  }
};

/// Keys and values alternate in the list, keys in order.
template <class T>
struct codec<std::map<std::string, T>> {
  static std::string name() { return "map<string," + detail::codec_name<T>() + ">"; }
  static value encode(const std::map<std::string, T>& entries) {
    value_list list;
    list.items.reserve(2 * entries.size());
    for (const auto& [key, x] : entries) {
      list.items.emplace_back(key);
      list.items.push_back(codec<T>::encode(x));
    }
    return list;
  }
  static std::map<std::string, T> decode(value&& v, const decode_context& context) {
    const auto container = name();
    auto& items = detail::items_of(v, container, std::nullopt);
    if (items.size() % 2 != 0) {
      throw error(errc::invalid_argument,
                  "expected " + container + " (keys and values), got a list of " + std::to_string(items.size()));
    }
    std::map<std::string, T> out;
    for (std::size_t i = 0; i < items.size(); i += 2) {
      auto key = detail::decode_item<std::string>(std::move(items[i]), context, container, i);
      auto x = detail::decode_item<T>(std::move(items[i + 1]), context, container, i + 1);
      if (!out.emplace(key, std::move(x)).second) {
        throw error(errc::invalid_argument, container + ": key '" + key + "' appears twice");
      }
    }
    return out;
  }
};

template <class T>
struct codec<std::optional<T>> {
  static std::string name() { return "optional<" + detail::codec_name<T>() + ">"; }
  static value encode(const std::optional<T>& x) {
    value_list list;
    if (x) list.items.push_back(codec<T>::encode(*x));
    return list;
  }
  static std::optional<T> decode(value&& v, const decode_context& context) {
    const auto container = name();
    auto& items = detail::items_of(v, container, std::nullopt);
    if (items.size() > 1) {
      throw error(errc::invalid_argument,
                  "expected " + container + " (none or one value), got a list of " + std::to_string(items.size()));
    }
    if (items.empty()) return std::nullopt;
    return detail::decode_item<T>(std::move(items[0]), context, container, 0);
  }
};

/// A codec for an aggregate (default-constructible) from its data members, in order: the extension
/// point for a train step's `{loss, accuracy, ...}`. Its name lists the members' types; give the
/// specialisation `static constexpr std::string_view name = "..."` to name it yourself.
template <class T, auto... Members>
struct member_codec {
  static std::string name() { return "{" + detail::codec_names<member_type<Members>...>() + "}"; }
  static value encode(const T& x) {
    value_list list;
    list.items.reserve(sizeof...(Members));
    (list.items.push_back(codec<member_type<Members>>::encode(x.*Members)), ...);
    return list;
  }
  static T decode(value&& v, const decode_context& context) {
    const auto container = detail::codec_name<T>();
    auto& items = detail::items_of(v, container, sizeof...(Members));
    T out{};
    std::size_t i = 0;
    ((out.*Members = detail::decode_item<member_type<Members>>(std::move(items[i]), context, container, i), ++i), ...);
    return out;
  }

 private:
  template <auto Member>
  using member_type = std::remove_cvref_t<decltype(std::declval<T&>().*Member)>;
};

}  // namespace pscoro

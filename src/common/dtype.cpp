#include <pscoro/dtype.hpp>
#include <pscoro/error.hpp>

#include <fmt/format.h>

namespace pscoro::detail {

void throw_dtype_mismatch(dtype expected, std::string_view what, dtype got, std::string_view name) {
  const auto wanted = fmt::format("expected a {} {}", name_of(expected), what);
  throw error(errc::invalid_argument, name.empty() ? fmt::format("{}, got {}", wanted, name_of(got))
                                                   : fmt::format("{}, got '{}' of {}", wanted, name, name_of(got)));
}

}  // namespace pscoro::detail

#include <pscoro/error.hpp>

namespace pscoro {
namespace {

class category final : public std::error_category {
 public:
  const char* name() const noexcept override { return "pscoro"; }

  std::string message(int value) const override {
    switch (static_cast<errc>(value)) {
      case errc::cancelled: return "cancelled";
      case errc::unknown: return "unknown error";
      case errc::invalid_argument: return "invalid argument";
      case errc::deadline_exceeded: return "deadline exceeded";
      case errc::not_found: return "not found";
      case errc::already_exists: return "already exists";
      case errc::permission_denied: return "permission denied";
      case errc::resource_exhausted: return "resource exhausted";
      case errc::failed_precondition: return "failed precondition";
      case errc::aborted: return "aborted";
      case errc::out_of_range: return "out of range";
      case errc::internal: return "internal error";
      case errc::unavailable: return "unavailable";
      case errc::data_loss: return "data loss";
      case errc::unauthenticated: return "unauthenticated";
      case errc::protocol_error: return "protocol error";
    }
    return "pscoro error " + std::to_string(value);
  }
};

}  // namespace

const std::error_category& error_category() noexcept {
  static const category instance;
  return instance;
}

}  // namespace pscoro

#include "server/session_table.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace pscoro::serving {

session_table::session_table(std::string task, std::size_t remembered)
    : task_(std::move(task)), remembered_(remembered) {}

bool session_table::ended(std::uint64_t session) const {
  return std::find(ended_.begin(), ended_.end(), session) != ended_.end();
}

session_join session_table::join(std::uint64_t session, const std::string& peer, bool opens) {
  if (session == 0) return {fmt::format("the Hello of {} names no coordinator session", peer)};
  if (session == current_) return {};
  if (ended(session)) {
    return {
        fmt::format("coordinator session {:016x} of {} has ended on {}: a newer coordinator (session {:016x}) "
                    "took over",
                    session, peer, task_, current_)};
  }
  if (!opens) {
    return {fmt::format("coordinator session {:016x} of {} is not open on {}: only the chief opens a session", session,
                        peer, task_)};
  }
  session_join joined;
  if (current_ != 0) {
    joined.ended = current_;
    ended_.push_back(current_);
    if (ended_.size() > remembered_) ended_.pop_front();
  }
  current_ = session;
  return joined;
}

}  // namespace pscoro::serving

// The coordinator sessions a ps or worker task serves, without sockets: which session is current,
// which ended (remembered, so a connection of an old chief is refused rather than mixed in), and
// who may open one. The server (server.cpp) applies its answers to connections and state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>

namespace pscoro::serving {

/// What session_table::join decided for one connection's Hello.
struct session_join {
  /// Why the connection is refused (errc::aborted), or empty: it joined the current session.
  std::string refusal;
  /// The session this join ended (a chief opened a new one), or 0. The caller closes that session's
  /// connections and releases its state (a ps's variables, a worker's iterators).
  std::uint64_t ended = 0;
};

class session_table {
 public:
  /// `task` names this task in refusals; the last `remembered` ended sessions are refused by name.
  explicit session_table(std::string task, std::size_t remembered = 1024);

  /// Puts a connection whose Hello names `session` (from `peer`, "worker:1 at 127.0.0.1:5000") into
  /// the current session, or, for the chief (`opens`), into a new one, which ends the current; never
  /// into an ended session, and never into a session no chief opened.
  session_join join(std::uint64_t session, const std::string& peer, bool opens);

  /// The current session (0: none yet).
  std::uint64_t current() const noexcept { return current_; }

 private:
  bool ended(std::uint64_t session) const;

  std::string task_;
  std::size_t remembered_;
  std::uint64_t current_ = 0;
  std::deque<std::uint64_t> ended_;  // oldest first, at most remembered_
};

}  // namespace pscoro::serving

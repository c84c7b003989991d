// The seam between the chief and a checkpoint that restores a lost ps in place (TF ends the run
// instead): once the ps answers again and holds empty shards and table parts where the lost one
// held them, the checkpoint restores only those, from its newest file; the other ps keep their
// values.
#pragma once

#include <asio/awaitable.hpp>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace pscoro::chief {

class lost_ps_restorer {
 public:
  /// Where a restored ps's values came from.
  struct restored {
    std::string checkpoint;  // the file
    std::int64_t step = 0;   // its step
  };
  virtual ~lost_ps_restorer() = default;
  /// How long the chief waits for a lost ps to answer at its address again.
  virtual std::chrono::milliseconds wait_for_ps() const = 0;
  /// Restores the values of every tracked variable shard and table part on ps `ps_task` (which
  /// hold nothing yet) from the newest checkpoint. Throws errc::failed_precondition naming the ps
  /// when there is no checkpoint, or when a variable there is not one the checkpoint tracks.
  virtual asio::awaitable<restored> restore_ps(int ps_task, const std::vector<std::string>& variables,
                                               const std::vector<std::string>& tables) = 0;
  /// The ps `task` serves again with `what`, `seconds` after it was lost.
  virtual void restored_ps(const std::string& task, const restored& what, double seconds) = 0;
};

}  // namespace pscoro::chief

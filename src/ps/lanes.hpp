// The per-variable lanes of a ps: requests for one variable (its optimizer slots included) are
// served in arrival order even while a big kernel for it runs off the executor. A lane exists while
// a variable has a kernel running, its values being scanned, or a reply being gathered as it is
// sent: whatever comes for that variable meanwhile waits in the lane, and each waiter is handed the
// lane in turn. Variables without a lane are served at once. No I/O: the waiters are handlers that
// complete on their own executors (docs/design.md, "ps kernels off the event loop").
#pragma once

#include "ps/variable_store.hpp"

#include <pscoro/detail/completion.hpp>

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>
#include <unordered_map>

namespace pscoro::ps {

class lanes {
 public:
  /// Completed with no error when the lane is handed to it, or with the code of fail_all().
  using waiter = detail::erased_handler<void(std::error_code)>;

  lanes() = default;
  lanes(const lanes&) = delete;  // holds point at it
  lanes& operator=(const lanes&) = delete;
  /// Completes every waiter with errc::unavailable.
  ~lanes();

  /// A lane taken by one request, handed back when destroyed: to the next waiter, or dropped. A hold
  /// that outlives its lanes, or that fail_all() made stale (the lane of that name is now another
  /// request's), does nothing.
  class hold {
   public:
    hold(const hold&) = delete;
    hold& operator=(const hold&) = delete;
    ~hold();

   private:
    friend class lanes;
    hold(std::weak_ptr<lanes*> owner, std::uint64_t epoch, std::string key)
        : owner_(std::move(owner)), epoch_(epoch), key_(std::move(key)) {}
    std::weak_ptr<lanes*> owner_;
    std::uint64_t epoch_;
    std::string key_;
  };

  /// No variable has a lane: every request is served at once.
  bool empty() const noexcept { return lanes_.empty(); }
  /// A request for `key` must wait its turn (wait()).
  bool busy(const std::string& key) const { return !key.empty() && lanes_.contains(key); }
  /// Takes the lane of `key` (a request that holds none: not busy, or handed it by wait()). An empty
  /// key (a request that concerns no variable) gives a hold of nothing.
  std::shared_ptr<hold> take(const std::string& key);
  /// Queues `w` behind the requests for `key` (which is busy); it completes once they are done,
  /// holding the lane: it then take()s it.
  void wait(const std::string& key, waiter w);
  /// Completes every waiter with `ec` and drops every lane: the holds taken until now are stale.
  void fail_all(std::error_code ec) noexcept;
  /// Requests waiting, over all lanes.
  std::size_t waiting() const noexcept;

  /// The lane a request for the variable `name` goes through: an optimizer slot's is its variable's
  /// (a slot is written by its variable's steps). A name the store does not hold may be a slot
  /// ("w/adagrad/accumulator") that a step waiting in its variable's lane will create: it goes
  /// through the lane of the longest "/"-prefix of it that is busy, as if served after that step.
  std::string key_of(const std::string& name, const variable_store& store) const;

 private:
  void release(const std::string& key, std::uint64_t epoch);

  std::unordered_map<std::string, std::deque<waiter>> lanes_;  // a lane: who waits for it, in order
  std::uint64_t epoch_ = 0;                                    // counts fail_all()
  // Holds find their lanes through it; gone with them.
  std::shared_ptr<lanes*> self_ = std::make_shared<lanes*>(this);
};

}  // namespace pscoro::ps

// The chief's connections to its cluster: a peer per ps and per worker (each connects on demand,
// keeps a heartbeat and reports its loss), an acceptor for workers announcing a new address, and
// the probes that bring lost workers back. It knows which workers are connected and ready; what
// they run is the closure queue's business (it hears through `events`). Used on one executor.
#pragma once

#include <pscoro/cluster_spec.hpp>
#include <pscoro/transport_options.hpp>

#include "net/handshake_gate.hpp"
#include "net/peer.hpp"

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/steady_timer.hpp>

#include <chrono>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace pscoro::chief {

class cluster_connections : public std::enable_shared_from_this<cluster_connections> {
 public:
  /// What the chief hears from its connections; all on the executor.
  struct events {
    /// A ps connection closed without our asking: its variables are gone.
    std::function<void(std::size_t ps, const std::string& reason)> ps_lost;
    /// A worker was lost (died, hung past the heartbeat timeout, moved, or a call to it failed).
    std::function<void(std::size_t worker)> worker_lost;
    /// A lost worker answers again: what it needs before it takes closures (its iterators).
    /// Throwing leaves it lost, to be probed again.
    std::function<asio::awaitable<void>(std::size_t worker)> prepare_worker;
    /// A lost worker is back and prepared.
    std::function<void(std::size_t worker)> worker_back;
    /// A worker the spec does not list was admitted as `worker` (num_workers() - 1): it is
    /// prepared (prepare_worker) and reported back (worker_back) like a returning worker.
    std::function<void(std::size_t worker)> worker_admitted;
    /// Every probe interval, after the probes start.
    std::function<void()> tick;
    /// A ps answered a Heartbeat with its totals (every heartbeat interval while it is connected).
    std::function<void(std::size_t ps, const wire::PsTotals& totals)> ps_totals;
  };

  /// The chief `self` (job "chief", its index) of `cluster`; `incarnation` is its session on every
  /// server. `spec_address` is the chief's own address in the cluster spec, or "". `chief_page`:
  /// the URL of the chief's page, which its session's Hello tells every server, or "" (none).
  cluster_connections(asio::any_io_executor executor, const cluster_spec& cluster, net::task_identity self,
                      std::string spec_address, transport_options transport, const std::string& chief_page = {});

  /// Listens for announcements (when the spec gives the chief an address), connects to every ps
  /// and worker, then starts probing lost workers. Set `events` first.
  asio::awaitable<void> connect();
  void set_events(events handlers) { events_ = std::move(handlers); }
  void set_probe_interval(std::chrono::milliseconds interval) { probe_interval_ = interval; }
  /// Workers the spec does not list are admitted from now on while fewer than `cap` admitted ones
  /// are not drained (0: none is). Until this is called (no coordinator yet) they are asked to
  /// try again.
  void set_max_elastic_workers(std::size_t cap) { elastic_cap_ = cap; }
  /// Workers of the cluster spec (the rest were admitted).
  std::size_t spec_workers() const noexcept { return spec_workers_; }
  /// Stops listening and probing and closes every connection. With `job_exit_code`, first tells
  /// every ps and worker that the job ended (Shutdown), closing each connection when its task has
  /// answered, or after handshake_timeout; not before connect() confirmed every address of the
  /// spec (the tasks reached may be another job's). Once: a second call does nothing.
  void close(std::optional<int> job_exit_code = std::nullopt);
  bool closed() const noexcept { return closed_; }

  const std::vector<std::shared_ptr<net::peer>>& ps() const noexcept { return ps_; }
  std::size_t num_workers() const noexcept { return workers_.size(); }
  const std::shared_ptr<net::peer>& worker(std::size_t index) const { return workers_.at(index).peer; }
  /// Connected and prepared: may take closures.
  bool ready(std::size_t worker) const { return workers_.at(worker).ready; }
  /// `worker` is drained (the coordinator's drain()): not ready, never probed, and its loss is no
  /// failure; its connection stays open while its task keeps it. resume() ends that.
  void drain(std::size_t worker);
  bool drained(std::size_t worker) const { return workers_.at(worker).drained; }
  /// `worker` is drained no more. When `holds_values` (its drain was called off before it dropped
  /// them) and it is connected, it is ready at once; otherwise it is brought back as a lost
  /// worker is: reached, prepared, then ready.
  void resume(std::size_t worker, bool holds_values);
  /// A call to `worker` failed because its connection is gone (`reason`): it is lost until a probe
  /// brings it back. Logged once per loss.
  void worker_failed(std::size_t worker, const std::string& reason);
  /// Where the chief listens for workers announcing themselves (after connect()), or "".
  std::string address() const;
  const std::string& task() const noexcept { return task_; }

 private:
  struct worker_slot {
    std::shared_ptr<net::peer> peer;
    bool ready = true;
    bool probing = false;  // a recovery attempt is under way
    bool drained = false;
  };

  /// Accepts workers announcing themselves (Hello.address) until close().
  static asio::awaitable<void> hear_announcements(std::weak_ptr<cluster_connections> weak);
  static asio::awaitable<void> hear_announcement(std::weak_ptr<cluster_connections> weak,
                                                 asio::ip::tcp::socket socket);
  /// Worker `index` says it can be reached at `address` now: use that, and bring it back at once.
  void announced(std::size_t index, const std::string& address);
  /// Whether a worker the spec does not list, announcing itself as `claimed` at `address`, may
  /// join now: the code and reason of a refusal, or an ok code.
  std::pair<std::error_code, std::string> admission(const std::string& claimed, const std::string& address) const;
  /// An admitted worker that is lost (not ready, not drained), to be taken back by an unlisted
  /// worker announcing itself; none while admission is off.
  std::optional<std::size_t> lost_admitted_worker() const;
  /// Admits the worker at `address` as the next worker and starts bringing it up.
  void admit(const std::string& address);
  /// While connect() waits, logs every waiting_report_interval which task it still waits for, for
  /// how long and how many are connected, until `timer` is cancelled (a job whose tasks start slowly is not minutes of
  /// silence).
  static asio::awaitable<void> report_waiting(std::weak_ptr<cluster_connections> weak,
                                              std::shared_ptr<asio::steady_timer> timer);
  /// Tells every task in `tasks` that the job ended (Shutdown{exit_code}): over its connection, or
  /// one connection attempt for a task the chief lost (it may still run); each peer closes when its
  /// task has answered, all of them after handshake_timeout.
  void end_job(std::vector<std::shared_ptr<net::peer>> tasks, int exit_code);
  struct ending;
  static asio::awaitable<void> end_task(std::shared_ptr<net::peer> task, int exit_code, std::shared_ptr<ending> state);
  /// Probes lost workers every probe interval until close().
  static asio::awaitable<void> watch_workers(std::weak_ptr<cluster_connections> weak);
  void probe(std::size_t index);
  /// One attempt to bring worker `index` back: connect, prepare it, then mark it ready.
  static asio::awaitable<void> recover(std::shared_ptr<cluster_connections> self, std::size_t index);

  asio::any_io_executor executor_;
  net::task_identity self_;
  std::string task_;
  std::string spec_address_;
  transport_options transport_;
  events events_;
  std::chrono::milliseconds probe_interval_{std::chrono::seconds(1)};
  static constexpr std::chrono::seconds waiting_report_interval{5};
  const net::peer* awaiting_ = nullptr;  // the task connect() waits for
  std::vector<std::shared_ptr<net::peer>> ps_;
  std::deque<worker_slot> workers_;  // grows as workers are admitted (elastic)
  std::optional<asio::steady_timer> watch_timer_;
  std::optional<asio::ip::tcp::acceptor> acceptor_;  // for announcements, when spec_address_ is set
  net::handshake_gate announcement_gate_;  // of the announcements' handshakes
  wire::Hello session_hello_;  // what opens the session on every task (an admitted worker's: with admits)
  std::size_t spec_workers_ = 0;
  std::optional<std::size_t> elastic_cap_;  // none until a coordinator says
  bool spec_checked_ = false;  // every ps and worker answered at its address as the task it is
  bool closed_ = false;
};

}  // namespace pscoro::chief

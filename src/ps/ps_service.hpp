// The parameter-server role: holds variables (and optimizer slots beside them) and serves create,
// read, gather, update, scatter and optimizer requests. Every request is checked in full (dtype,
// shape and its size, ids, the caller's idea of the variable, parameters, the memory limits, and
// NaN/Inf when asked) before anything changes, so a bad request leaves every variable as it was.
//
// serve() runs the math of a big request (an optimizer step, an update or an initializer touching
// at least server_options::ps_kernel_offload_bytes) on a small kernel thread pool and resumes on
// the executor, so that requests for other variables and heartbeats pass meanwhile; so are the
// scans of a big request's values for NaN and Inf (check_numerics) and zero divisors, before
// anything changes. A big sparse read's reply is gathered as the connection sends it, a step per
// turn of the executor (wire::segment_producer). Requests for one variable (its slots included)
// are still served in arrival order: a variable whose kernel is running has a lane, and whatever
// comes for it waits its turn there (docs/design.md, "ps kernels off the event loop").
#pragma once

#include "ps/hash_table.hpp"
#include "ps/lanes.hpp"
#include "ps/variable_store.hpp"
#include "wire/buffer_pool.hpp"
#include "wire/frame.hpp"

#include <pscoro/detail/variable_io.hpp>
#include <pscoro/metrics.hpp>

#include <asio/awaitable.hpp>
#include <asio/thread_pool.hpp>

#include <array>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace pscoro {
struct server_options;
}

namespace pscoro::ps {

struct kernel_storage;

class ps_service {
 public:
  /// A ps `task` ("ps:0") with server_options' default limits.
  explicit ps_service(std::string task);
  /// A ps `task` with the limits and checks of `options` (PSCORO_CHECK_NUMERICS overrides
  /// check_numerics; 0 limits become their defaults).
  ps_service(std::string task, const server_options& options);
  ps_service(const ps_service&) = delete;  // its metrics are registered by address
  ps_service& operator=(const ps_service&) = delete;
  /// Waits for the kernel running on the pool, if any; requests waiting for a variable's turn get
  /// errc::unavailable.
  ~ps_service();

  /// The kinds of request a ps serves; the server refuses the rest (wire::not_served), as handle()
  /// does when called with one.
  static constexpr std::array kinds_served{
      wire::Request::kCreateVariable,  wire::Request::kReadVariable,  wire::Request::kUpdateVariable,
      wire::Request::kApplyGradient,   wire::Request::kListSlots,     wire::Request::kDeleteVariable,
      wire::Request::kCreateHashTable, wire::Request::kHashLookup,    wire::Request::kHashApplyGradients,
      wire::Request::kAdvanceClock,    wire::Request::kHashExport,     wire::Request::kHashImport};

  /// Serves one request frame on the calling thread, the math included; failures come back as an
  /// error status, never as an exception. For a ps nobody else reaches meanwhile (tests, tools).
  wire::frame handle(const wire::frame& request);

  /// Serves one request frame on `this`'s executor (the one every call comes from), as the server
  /// does: a big kernel runs on the kernel pool meanwhile, and the request waits its variable's turn
  /// (errc::aborted when the session ends first, errc::unavailable when the ps is destroyed). Gives
  /// the request's segments to buffers() when done (recycle). A big sparse read's response comes
  /// back with a producer (frame::produce_last) that gathers its rows as a connection sends it,
  /// holding the variable's lane until it is done or dropped; elsewhere, wire::produce_whole.
  asio::awaitable<wire::frame> serve(wire::frame request);

  /// The most bytes the answer to `request` can hold, from the request alone
  /// (wire::connection::bound_answers_by): a read's rows, all of the variable's for a dense read
  /// (whose answer keeps the storage it read alive, even once an update replaced it). 0 for every
  /// other request, and for a read whose refusal the request shows (rows past its variable's, a
  /// reply over max_variable_bytes, ids that are not a tensor). Never throws.
  std::uint64_t answer_bytes_bound(const wire::frame& request) const noexcept;

  /// Waits for the kernels handed to the pool (their results reach the executor as usual) and runs
  /// every later one on the executor. A stopped server calls it: no kernel thread is left to post
  /// to an io_context that may be destroyed next (asio's shutdown does not expect a post from
  /// another thread while it destroys what is queued).
  void stop_kernels() {
    if (!kernel_pool_) return;
    kernel_pool_->join();  // not reset() alone: its destructor would drop the queued kernels
    kernel_pool_.reset();
  }

  /// Test hook: runs on the kernel thread before every job it runs, kernels and scans (the product
  /// path is the same with or without it). Lets a test hold one while it sends other requests.
  void set_kernel_hook(std::function<void()> hook) { kernel_hook_ = std::move(hook); }
  /// Kernels that ran on the pool so far.
  std::uint64_t offloaded_kernels() const noexcept { return offloaded_; }
  /// Requests whose values were scanned (check_numerics, zero divisors) on the pool so far.
  std::uint64_t offloaded_scans() const noexcept { return offloaded_scans_; }

  /// Gives `request`'s segments that nothing holds any more (a variable adopts an assign's) to
  /// buffers(), once handle() has served it.
  void recycle(wire::frame request) {
    for (auto& segment : request.segments) buffers_->give(std::move(segment));
  }
  /// The large buffers this ps reuses: storage an assign replaced, copies a kernel replaced, request
  /// segments it is done with. Its connections receive request segments into them
  /// (connection::receive_requests_into).
  const std::shared_ptr<wire::buffer_pool>& buffers() const noexcept { return buffers_; }
  /// The buffers of sparse reads' replies of 1 MiB or more, kept apart from buffers() so that
  /// request segments of sizes that rarely repeat do not take their places.
  const std::shared_ptr<wire::buffer_pool>& reply_buffers() const noexcept { return reply_buffers_; }
  /// Releases the buffers of both pools that no request has reused for `idle` (the server calls it
  /// every so often: server_options::ps_idle_buffers_release); returns the bytes released.
  std::uint64_t release_idle_buffers(std::chrono::steady_clock::duration idle) noexcept {
    const auto now = std::chrono::steady_clock::now();
    const std::uint64_t released = buffers_->release_idle(idle, now) + reply_buffers_->release_idle(idle, now);
    publish();
    return released;
  }

  std::size_t num_variables() const noexcept { return store_.size(); }
  /// The hash tables this ps holds a part of.
  std::size_t num_hash_tables() const noexcept { return tables_.size(); }
  /// Bytes held for variables, slots and hash tables, as server_options::max_ps_bytes counts them.
  std::uint64_t held_bytes() const noexcept { return store_.held_bytes() + table_bytes_; }
  /// Requests this ps has decided (answered or refused) since it started, whoever sent them.
  std::uint64_t requests_served() const noexcept { return requests_served_; }
  /// What it has served and holds, for the chief's page (the answer to the chief's Heartbeat); the
  /// process's memory is the server's to add.
  wire::PsTotals totals() const {
    wire::PsTotals out;
    out.set_requests_served(requests_served_);
    out.set_variables(store_.size());
    out.set_held_bytes(held_bytes());
    return out;
  }
  /// Drops every variable, slot and hash table (the coordinator session that made them ended). A kernel still
  /// running keeps the storage it writes alive until it ends; its request and those waiting for
  /// their variable's turn get errc::aborted.
  void clear() noexcept;

 private:
  /// What check_finite and check_divisors find in one of a request's values, found before the
  /// request is decided (on the pool: a scan of 256 MiB takes tens of milliseconds).
  struct value_scan {
    tensor values;  // as decide() decodes it: the scan is used for the same bytes only
    update_op op;   // what the request does with them (assign: they are not an update's)
    std::size_t non_finite_at;  // values.size(): none, or check_numerics is off
    std::size_t zero_at;        // values.size(): none, or not an integer division
  };
  /// How a request is served: by serve(), which may run a big kernel on the pool and gather a big
  /// sparse read's reply as the connection sends it, or at once by handle(); with the scans of its
  /// values made on the pool, if any.
  struct serving {
    bool in_serve = false;
    std::span<const value_scan> scans;
  };
  /// The math a request leaves to run once it is checked: what it reads and writes, and the kernel.
  /// The kernel captures what it touches by value (shared buffers): it may run after the request
  /// and the variable are gone.
  struct kernel_job {
    std::uint64_t bytes = 0;
    std::function<void()> run;  // empty: nothing left to run
  };
  /// What serving one request decided: its response, and the kernel serve() still has to run on
  /// the pool (empty when it ran, or there is none), with what the request's latency metric needs
  /// once it is done.
  struct decision {
    wire::frame response;
    kernel_job kernel;
    std::size_t operation = 0;  // the metrics' index
    std::optional<std::chrono::steady_clock::time_point> started;  // when it began, if timed
  };
  /// Checks and serves `request`: every failure becomes the response's error status.
  decision decide(const wire::frame& request, const serving& how);

  /// Refuses (errc::invalid_argument) `values` holding NaN or Inf when check_numerics is on.
  void check_finite(std::string_view context, std::string_view what, const tensor& values,
                    const serving& how) const;
  /// Refuses (errc::invalid_argument) `divisors` holding a zero when `op` is an integer division.
  void check_divisors(std::string_view context, update_op op, const tensor& divisors, const serving& how) const;
  /// The values of `request` that check_finite or check_divisors would scan, when together they
  /// are at least offload_bytes_ (else none: the executor scans them as it goes). A request that
  /// does not decode gives none: decide() reports what is wrong with it.
  std::vector<value_scan> values_to_scan(const wire::frame& request) const;
  /// Runs `job` on the kernel pool (after the test hook) and resumes on the executor with what it
  /// threw. `job` must capture what it touches by value: the request may be gone when it runs.
  asio::awaitable<std::exception_ptr> on_pool(std::function<void()> job);

  kernel_job create(const wire::frame& request, const wire::CreateVariable& create, const serving& how);
  void read(const wire::frame& request, const wire::ReadVariable& read, wire::frame& response, const serving& how);
  kernel_job update(const wire::frame& request, const wire::UpdateVariable& update, const serving& how);
  kernel_job apply_gradient(const wire::frame& request, const wire::ApplyGradient& apply, const serving& how);
  void list_slots(const wire::ListSlots& list, wire::frame& response);
  // Hash tables: served at once on the executor (a lookup or a step touches its ids' rows only).
  void create_table(const wire::CreateHashTable& create);
  void lookup_tables(const wire::frame& request, const wire::HashLookup& lookup, wire::frame& response);
  void apply_to_tables(const wire::frame& request, const wire::HashApplyGradients& apply, const serving& how);
  void advance_clock(const wire::AdvanceClock& advance, wire::frame& response);
  void export_table(const wire::HashExport& request, wire::frame& response);
  void import_table(const wire::frame& request, const wire::HashImport& import);
  /// The part of the table `ref` names, as the caller thinks it is: errc::not_found when this ps
  /// holds none, errc::invalid_argument when its dtype or dim differ.
  hash_table_part& table_of(const wire::HashTableRef& ref, std::string_view operation);
  /// What the ps may still hold, as max_ps_bytes counts it.
  std::uint64_t room() const noexcept;
  /// Recounts the bytes the tables hold.
  void count_table_bytes() noexcept;
  void remove(const wire::DeleteVariable& request);
  /// The variable `ref` names, as the caller thinks it is (variable_store::find).
  stored_variable& find(const wire::VariableRef& ref, std::string_view operation);
  /// The slot of `plan` (created on first use; variable_store::check_slots passed), as its kernel
  /// writes it.
  kernel_storage slot(const std::string& variable, const slot_plan& plan);

  /// The lane `request` goes through (lanes::key_of); empty for requests that concern no variable.
  std::string lane_of(const wire::Request& request) const;

  std::string task_;
  variable_store store_;
  std::map<std::string, hash_table_part, std::less<>> tables_;
  std::uint64_t table_bytes_ = 0;
  /// A table's series, labelled with its name: what its part holds and has done on this ps.
  struct table_metrics {
    metrics::gauge rows;
    metrics::gauge bytes;
    metrics::counter admitted;
    metrics::counter evicted;
    metrics::counter not_admitted;
    metrics::counter gradients_dropped;
    metrics::counter refused;
    hash_table_counts published;  // the part's counts when last published
    std::vector<metrics::registry::registration> registered;
  };
  std::map<std::string, table_metrics, std::less<>> table_metrics_;  // nodes stay put: registered by address
  /// Registers `name`'s series.
  void watch_table(const std::string& name);
  /// Publishes what `part` holds and the counts it gained since last time.
  void publish_table(const hash_table_part& part) noexcept;
  bool check_numerics_;
  std::shared_ptr<wire::buffer_pool> buffers_;
  std::shared_ptr<wire::buffer_pool> reply_buffers_;  // sparse reads' and table lookups' rows (reply_buffer)

  lanes lanes_;  // of the variables whose requests wait their turn (a kernel runs for them)
  std::uint64_t offload_bytes_;
  std::uint64_t generation_ = 0;  // counts clear(): a kernel's request outliving its session
  std::uint64_t offloaded_ = 0;
  std::uint64_t offloaded_scans_ = 0;
  std::uint64_t requests_served_ = 0;  // not a metric: it counts while metrics are off, too
  std::function<void()> kernel_hook_;
  // Whoever resumes after a kernel or a wait checks it first: the ps may be gone.
  std::shared_ptr<const bool> alive_ = std::make_shared<const bool>(true);
  // Last: destroyed (joined) first, before what its kernels' continuations would check.
  std::optional<asio::thread_pool> kernel_pool_;

  // Metrics: per operation (create, read, update, apply_gradient, list_slots, delete, hash_lookup,
  // hash_apply_gradients, advance_clock, other) its latency and its errors; what the ps holds.
  // Registered in the process's registry.
  static constexpr std::size_t num_operations = 12;
  void publish() noexcept {
    variables_gauge_.set(static_cast<std::int64_t>(store_.size()));
    bytes_gauge_.set(static_cast<std::int64_t>(held_bytes()));
    pooled_gauge_.set(static_cast<std::int64_t>(buffers_->bytes() + reply_buffers_->bytes()));
  }
  std::array<metrics::histogram, num_operations> operation_seconds_;
  std::array<metrics::counter, num_operations> operation_errors_;
  metrics::gauge variables_gauge_;
  metrics::gauge bytes_gauge_;
  metrics::gauge pooled_gauge_;
  std::vector<metrics::registry::registration> registered_;
};

}  // namespace pscoro::ps

#include "ps/ps_service.hpp"

#include <pscoro/server.hpp>

#include "common/environment.hpp"
#include "common/log.hpp"
#include "common/rows.hpp"
#include "ps/decode.hpp"
#include "ps/kernels.hpp"
#include "wire/requests.hpp"
#include "wire/status.hpp"
#include "wire/values.hpp"

#include <asio/experimental/as_tuple.hpp>
#include <asio/post.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <fmt/format.h>

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <new>
#include <optional>
#include <utility>

namespace pscoro::ps {

namespace {

[[noreturn]] void invalid(std::string message) { throw error(errc::invalid_argument, std::move(message)); }

// Elements per row (axis 0) of a variable of `shape`; rank 0 has no rows.
std::size_t row_elements(const shape_type& shape) { return num_elements(std::span(shape).subspan(1)); }

// The shape of `n` rows of a variable of `shape`.
shape_type rows_shape(std::size_t n, const shape_type& shape) {
  shape_type out{n};
  out.insert(out.end(), shape.begin() + 1, shape.end());
  return out;
}

// Gives `bytes` storage of their own if a reply still holds them (copy on write), so an update in
// place is never seen by a read being written out; returns the bytes the reply holds, which the
// kernel copies in before it writes (empty when `bytes` were not shared). The copy is the kernel's:
// it is as big as the variable.
byte_buffer detach_shared(byte_buffer& bytes, wire::buffer_pool& pool) {
  if (bytes.unique()) return {};
  byte_buffer fresh = pool.take(bytes.size());
  if (fresh.size() != bytes.size()) fresh = byte_buffer(bytes.size());
  return std::exchange(bytes, std::move(fresh));
}

// Replies this large come from the ps's reply pool. Below it glibc's free lists serve them well;
// above it, left to glibc, they fault fresh pages in: a block of 32 MiB or more (its largest
// dynamic mmap threshold on 64-bit) is mapped anew every time, and smaller ones are too whenever
// other traffic moves glibc's thresholds (lookups of 100k x 16 rows, 3.2 MB replies, faulted
// 212-420 pages each when scatters shared the ps, none alone: RESULTS.md, 2026-11-27).
constexpr std::size_t pooled_reply_min_bytes = std::size_t{1} << 20;

// Pooled replies are rounded up to whole granules, so that replies of nearby sizes (lookups of one
// batch size, their distinct ids varying) share buffers: huge pages from 32 MiB on, an eighth of
// one below.
constexpr std::size_t reply_buffer_granule(std::size_t bytes) noexcept {
  return bytes >= (std::size_t{32} << 20) ? std::size_t{2} << 20 : std::size_t{256} << 10;
}

// `bytes` for a large reply (a sparse read's rows) from `pool`, rounded up to whole granules, that
// go back to the pool when the reply's last holder lets go, instead of being unmapped. That holder
// is on the ps's executor, as the pool requires: the producer that fills the reply, the connection
// writing it, or handle()'s caller (sparse reads never run on the kernel pool). A fresh buffer
// faults its pages in while the executor fills it, and every request behind waits: a 58 MB reply's
// 29 huge pages took up to ~5 ms each on this VM, and such lookups took 45-47 ms against 36-37
// pooled (RESULTS.md, 2026-11-25). Smaller replies are plain buffers. The pool is the replies'
// own: sharing one with the requests' segments (ids of sizes that rarely repeat) let those take
// its places (RESULTS.md, 2026-11-25, 04:20).
byte_buffer reply_buffer(const std::shared_ptr<wire::buffer_pool>& pool, std::size_t bytes) {
  const std::size_t granule = reply_buffer_granule(bytes);
  if (bytes < pooled_reply_min_bytes || bytes > std::numeric_limits<std::size_t>::max() - granule) {
    return byte_buffer(bytes);
  }
  const std::size_t rounded = (bytes + granule - 1) / granule * granule;
  byte_buffer whole = pool->take(rounded);
  if (whole.size() != rounded) whole = byte_buffer(rounded);
  // Owns the whole buffer while the reply's bytes live, then gives it back. Not copyable: only the
  // one made here may give it back.
  class give_back {
   public:
    give_back(byte_buffer whole, std::weak_ptr<wire::buffer_pool> pool)
        : whole_(std::move(whole)), pool_(std::move(pool)) {}
    give_back(const give_back&) = delete;
    give_back& operator=(const give_back&) = delete;
    ~give_back() {
      try {
        if (auto to = pool_.lock()) to->give(std::move(whole_));
      } catch (...) {  // no room to keep it: it is just released
      }
    }

   private:
    byte_buffer whole_;
    std::weak_ptr<wire::buffer_pool> pool_;
  };
  std::byte* data = whole.data();
  return byte_buffer::share(std::make_shared<give_back>(std::move(whole), pool), data, bytes);
}

}  // namespace

// Storage a kernel writes, made ready by the executor and shared with the kernel (which keeps it
// alive if the variable goes meanwhile), with what must go in before the kernel writes: the bytes
// a reply still holds (detach_shared), or a new slot's initial value.
struct kernel_storage {
  byte_buffer bytes;
  byte_buffer copy_from;
  std::optional<double> fill;
  dtype type = dtype::float32;

  // The bytes setting it up reads and writes, counted in the kernel's size.
  std::uint64_t setup_bytes() const noexcept { return fill ? bytes.size() : copy_from.size(); }
  void set_up() const {
    if (fill) {
      const shape_type shape{bytes.size() / size_of(type)};
      kernels::initialize({.init = initializers::constant{.value = *fill}, .full_shape = shape}, type, shape,
                          bytes.data());
    } else if (copy_from.size()) {
      std::memcpy(bytes.data(), copy_from.data(), copy_from.size());
    }
  }
};

namespace {

constexpr std::uint64_t no_limit = std::numeric_limits<std::uint64_t>::max();

// The memory this process may use: physical memory, or its cgroup's limit when lower (a
// container's; cgroup v2, then v1, whose "no limit" is a huge number). Unknown: no limit.
std::uint64_t usable_memory() {
  std::uint64_t bytes = no_limit;
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page_size = ::sysconf(_SC_PAGE_SIZE);
  if (pages > 0 && page_size > 0) bytes = static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page_size);
  for (const char* path : {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    std::ifstream in(path);
    std::uint64_t limit = 0;
    if (in >> limit && limit > 0) bytes = std::min(bytes, limit);  // v2's "max" does not parse: no limit
  }
  return bytes;
}

// server_options::max_ps_bytes's default: 3/4 of usable memory, leaving room for what a ps holds
// beyond its variables (frames in flight, copies made while a reply shares a variable's bytes).
std::uint64_t default_max_ps_bytes() {
  static const std::uint64_t limit = usable_memory() == no_limit ? no_limit : usable_memory() / 4 * 3;
  return limit;
}

// Element `flat` of a tensor of `shape` (which has it) as "[1, 2]".
std::string index_text(std::size_t flat, const shape_type& shape) {
  shape_type index(shape.size());
  for (std::size_t d = shape.size(); d-- > 0;) {
    index[d] = flat % shape[d];
    flat /= shape[d];
  }
  return to_string(index);
}

}  // namespace

namespace {
constexpr std::string_view operation_names[] = {"create",      "read",        "update",
                                                "apply_gradient", "list_slots", "delete",
                                                "hash_lookup", "hash_apply_gradients", "advance_clock",
                                                "hash_export", "hash_import", "other"};

std::size_t operation_index(wire::Request::BodyCase body) {
  switch (body) {
    case wire::Request::kCreateVariable:
    case wire::Request::kCreateHashTable: return 0;
    case wire::Request::kReadVariable: return 1;
    case wire::Request::kUpdateVariable: return 2;
    case wire::Request::kApplyGradient: return 3;
    case wire::Request::kListSlots: return 4;
    case wire::Request::kDeleteVariable: return 5;
    case wire::Request::kHashLookup: return 6;
    case wire::Request::kHashApplyGradients: return 7;
    case wire::Request::kAdvanceClock: return 8;
    case wire::Request::kHashExport: return 9;
    case wire::Request::kHashImport: return 10;
    default: return 11;
  }
}
}  // namespace

ps_service::ps_service(std::string task) : ps_service(std::move(task), server_options{}) {}

ps_service::ps_service(std::string task, const server_options& options)
    : task_(std::move(task)),
      store_(task_, options.max_ps_bytes ? options.max_ps_bytes : default_max_ps_bytes(),
             options.max_variable_bytes  ? options.max_variable_bytes
             : options.max_ps_bytes      ? options.max_ps_bytes
                                         : default_max_ps_bytes()),
      // PSCORO_CHECK_NUMERICS, when set, overrides the program's choice; a bad value stops the ps.
      check_numerics_(common::flag_from_environment("PSCORO_CHECK_NUMERICS", "refuse NaN and Inf in float values")
                          .value_or(options.check_numerics)),
      // Buffers of 256 KiB and more (smaller ones are cheap to allocate), at most 8 and a quarter of
      // max_ps_bytes (the room it leaves beside the variables is for such buffers) or 1 GiB; sparse
      // replies (reply_buffer) apart, at most 8 and a sixteenth of it or 256 MiB more.
      buffers_(std::make_shared<wire::buffer_pool>(256 << 10, 8, std::min(store_.max_ps_bytes() / 4, std::uint64_t{1} << 30))),
      reply_buffers_(std::make_shared<wire::buffer_pool>(pooled_reply_min_bytes, 8,
                                                         std::min(store_.max_ps_bytes() / 16, std::uint64_t{256} << 20))),
      offload_bytes_(options.ps_kernel_offload_bytes ? options.ps_kernel_offload_bytes : std::uint64_t{1} << 20) {
  if (options.ps_kernel_threads) kernel_pool_.emplace(options.ps_kernel_threads);
  auto& r = metrics::process_registry();
  for (std::size_t i = 0; i < num_operations; ++i) {
    const metrics::labels operation{{"operation", std::string(operation_names[i])}};
    registered_.push_back(r.add("pscoro_ps_operation_seconds", "Time a parameter server took to serve a request.",
                                operation, operation_seconds_[i]));
    registered_.push_back(r.add("pscoro_ps_operation_errors_total",
                                "Requests a parameter server answered with an error.", operation,
                                operation_errors_[i]));
  }
  registered_.push_back(r.add("pscoro_ps_variables", "Variables and optimizer slots a parameter server holds.", {},
                              variables_gauge_));
  registered_.push_back(r.add("pscoro_ps_held_bytes",
                              "Bytes a parameter server holds for variables and slots (as max_ps_bytes counts).", {},
                              bytes_gauge_));
  registered_.push_back(r.add("pscoro_ps_pooled_bytes",
                              "Bytes a parameter server keeps in large buffers for reuse (besides held_bytes; at most "
                              "max_ps_bytes / 4 or 1 GiB, and a sixteenth of it or 256 MiB for sparse replies; "
                              "released once unused for server_options::ps_idle_buffers_release).",
                              {}, pooled_gauge_));
}

// The scan of `values` among `scans`, made on the pool for the same bytes, if any.
template <class Scan>
const Scan* scan_of(std::span<const Scan> scans, const tensor& values) noexcept {
  for (const auto& scan : scans) {
    if (scan.values.bytes().data() == values.bytes().data() && scan.values.size_bytes() == values.size_bytes() &&
        scan.values.type() == values.type()) {
      return &scan;
    }
  }
  return nullptr;
}

void ps_service::check_finite(std::string_view context, std::string_view what, const tensor& values,
                              const serving& how) const {
  if (!check_numerics_) return;
  const value_scan* scan = scan_of(how.scans, values);
  const std::size_t at =
      scan ? scan->non_finite_at : kernels::first_non_finite(values.type(), values.bytes().data(), values.size());
  if (at == values.size()) return;
  const double x =
      visit_dtype(values.type(), [&](auto zero) { return static_cast<double>(values.data<decltype(zero)>()[at]); });
  const std::string_view bad = std::isnan(x) ? "NaN" : x > 0 ? "Inf" : "-Inf";
  const std::string where = values.shape().empty()
                                ? fmt::format("the {}", what)
                                : fmt::format("element {} of the {}", index_text(at, values.shape()), what);
  invalid(fmt::format("{}: {} is {} (server_options::check_numerics is on)", context, where, bad));
}

void ps_service::check_divisors(std::string_view context, update_op op, const tensor& divisors,
                                const serving& how) const {
  const value_scan* scan = scan_of(how.scans, divisors);
  const std::size_t at = scan ? scan->zero_at
                              : kernels::first_zero_divisor(op, divisors.type(), divisors.bytes().data(), divisors.size());
  if (at == divisors.size()) return;
  invalid(fmt::format("{}: integer division by zero (element {} of the divisor)", context,
                      index_text(at, divisors.shape())));
}

std::vector<ps_service::value_scan> ps_service::values_to_scan(const wire::frame& request) const {
  std::vector<value_scan> out;
  if (!kernel_pool_) return out;
  std::uint64_t bytes = 0;
  try {
    const auto add = [&](const wire::TensorRef& ref, update_op op) {
      const tensor values = wire::get_tensor(request, ref);
      const bool numerics = check_numerics_ && kernels::is_float(values.type());
      const bool divisors = op == update_op::div && !kernels::is_float(values.type());
      if (!numerics && !divisors) return;
      out.push_back({values, op, values.size(), values.size()});
      bytes += values.size_bytes();
    };
    const auto& body = request.message.request();
    switch (body.body_case()) {
      case wire::Request::kCreateVariable:
        if (!body.create_variable().has_initializer()) add(body.create_variable().initial_value(), update_op::assign);
        break;
      case wire::Request::kUpdateVariable:
        add(body.update_variable().value(), decode_op(body.update_variable().op()));
        break;
      case wire::Request::kApplyGradient: add(body.apply_gradient().gradient(), update_op::assign); break;
      default: break;
    }
  } catch (const std::exception&) {
    return {};
  }
  if (bytes < offload_bytes_) out.clear();
  return out;
}

void ps_service::remove(const wire::DeleteVariable& request) {
  if (const auto table = tables_.find(request.variable().name()); table != tables_.end()) {
    table_metrics_.erase(table->first);
    tables_.erase(table);
    count_table_bytes();
    return;
  }
  find(request.variable(), "delete");  // exists, as the caller thinks it is
  store_.remove(request.variable().name());
}

ps_service::~ps_service() {
  alive_.reset();
  lanes_.fail_all(make_error_code(errc::unavailable));
  // The kernel running, if any, only touches storage it shares; its continuation finds alive_ gone.
  if (kernel_pool_) kernel_pool_->join();  // runs what is queued too: each kernel's owner is waiting
}

void ps_service::clear() noexcept {
  ++generation_;
  lanes_.fail_all(make_error_code(errc::aborted));
  store_.clear();
  tables_.clear();
  table_metrics_.clear();
  table_bytes_ = 0;
  store_.set_table_bytes(0);
  buffers_->clear();
  reply_buffers_->clear();
  publish();
}

std::string ps_service::lane_of(const wire::Request& request) const {
  switch (request.body_case()) {
    case wire::Request::kCreateVariable:
      if (request.create_variable().has_slot_of()) return request.create_variable().slot_of().variable();
      return request.create_variable().variable().name();
    case wire::Request::kReadVariable: return lanes_.key_of(request.read_variable().variable().name(), store_);
    case wire::Request::kUpdateVariable: return lanes_.key_of(request.update_variable().variable().name(), store_);
    case wire::Request::kApplyGradient: return lanes_.key_of(request.apply_gradient().variable().name(), store_);
    case wire::Request::kListSlots: return lanes_.key_of(request.list_slots().variable().name(), store_);
    case wire::Request::kDeleteVariable: return lanes_.key_of(request.delete_variable().variable().name(), store_);
    default: return {};
  }
}

namespace {
using asio::experimental::as_tuple;

// A kernel thread yields the CPU to the executor's (Linux: nice is per thread; +5 weighs it about
// 3x less than a thread at the process's own nice): on a busy machine the executor then still
// answers small requests at once while a big kernel runs. Once per thread; failure changes nothing.
void lower_kernel_thread_priority() noexcept {
  thread_local bool lowered = false;
  if (lowered) return;
  lowered = true;
  errno = 0;
  const int now = ::getpriority(PRIO_PROCESS, 0);
  if (errno == 0) ::setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), std::min(now + 5, 19));
}

wire::frame error_frame(std::error_code ec, std::string message, const std::string& task) {
  wire::frame out;
  wire::set_status(*out.message.mutable_response()->mutable_status(), ec, std::move(message), task);
  return out;
}

// The answer of a request whose job ran on the pool while the ps stopped (`gone`) or the
// coordinator session ended (`ended`), if either; `doing` says what it was doing ("it updated 'w'").
std::optional<wire::frame> interrupted(bool gone, bool ended, const std::string& task, std::string_view doing) {
  if (gone) return error_frame(make_error_code(errc::unavailable), fmt::format("{} stopped while {}", task, doing), task);
  if (ended) {
    return error_frame(make_error_code(errc::aborted),
                       fmt::format("the coordinator session ended on {} while {}", task, doing), task);
  }
  return std::nullopt;
}
}  // namespace

asio::awaitable<wire::frame> ps_service::serve(wire::frame request) {
  const std::weak_ptr<const bool> alive = alive_;
  const auto generation = generation_;
  std::optional<std::string> key;
  // The variable's lane while this request holds it: let go however serve() ends (a hold does
  // nothing once the ps is gone or its session ended), or handed on to a reply filled as it is sent.
  std::shared_ptr<lanes::hold> lane;
  if (!lanes_.empty()) {
    key = lane_of(request.message.request());
    if (lanes_.busy(*key)) {
      // Its variable has a kernel running: wait for the requests before this one.
      const std::string task = task_;
      const auto executor = co_await asio::this_coro::executor;
      // as_tuple: the code comes back as a value (use_awaitable alone would throw it).
      auto token = as_tuple(asio::use_awaitable);
      const auto [ec] = co_await asio::async_initiate<decltype(token), void(std::error_code)>(
          [&](auto handler) { lanes_.wait(*key, lanes::waiter(std::move(handler), executor)); }, token);
      if (alive.expired() || ec == make_error_code(errc::unavailable)) {
        co_return error_frame(make_error_code(errc::unavailable),
                              fmt::format("{} stopped while a request for '{}' waited for its turn", task, *key), task);
      }
      if (ec || generation != generation_) {  // errc::aborted: clear()
        co_return error_frame(make_error_code(errc::aborted),
                              fmt::format("the coordinator session ended on {} while a request for '{}' waited for "
                                          "its turn",
                                          task, *key),
                              task);
      }
      lane = lanes_.take(*key);
    }
  }
  const auto take_lane = [&] {
    if (lane) return;
    if (!key) key = lane_of(request.message.request());
    lane = lanes_.take(*key);
  };
  // A big request's values are scanned (check_numerics, zero divisors) on the pool before it is
  // decided, holding the variable's lane: requests after it still wait their turn.
  std::vector<value_scan> scans;
  if (auto to_scan = values_to_scan(request); !to_scan.empty()) {
    take_lane();
    ++offloaded_scans_;
    auto scanning_into = std::make_shared<std::vector<value_scan>>(std::move(to_scan));
    const std::string task = task_;
    const bool numerics = check_numerics_;
    auto scanning = on_pool([scanning_into, numerics] {
      for (auto& scan : *scanning_into) {
        const auto* bytes = scan.values.bytes().data();
        if (numerics) scan.non_finite_at = kernels::first_non_finite(scan.values.type(), bytes, scan.values.size());
        scan.zero_at = kernels::first_zero_divisor(scan.op, scan.values.type(), bytes, scan.values.size());
      }
    });
    const std::exception_ptr failure = co_await std::move(scanning);
    const bool gone = alive.expired();  // then `this` is too: nothing of it is read
    if (auto answer = interrupted(gone, !gone && generation != generation_, task,
                                  fmt::format("it checked the values for '{}'", *key))) {
      co_return std::move(*answer);
    }
    if (!failure) scans = std::move(*scanning_into);  // the scans cannot throw; if they did, decide() scans again
  }
  decision decided = decide(request, {.in_serve = true, .scans = scans});
  scans.clear();  // before recycle(): they share the request's segments
  wire::frame& response = decided.response;
  if (response.produce_last) {
    // A reply filled as it is sent (read): the variable's lane goes with its producer, released
    // once the last row is gathered (the storage let go first, so the next update finds it
    // unshared), or when the frame is dropped with its connection.
    take_lane();
    const std::size_t size = response.segments.back().size();
    response.produce_last = [fill = std::move(response.produce_last), hold = std::move(lane), size]() mutable {
      const std::size_t filled = fill();
      if (filled >= size) {
        fill = nullptr;
        hold.reset();
      }
      return filled;
    };
  }
  if (decided.kernel.run) {
    take_lane();
    ++offloaded_;
    const std::string task = task_;
    auto running = on_pool(std::move(decided.kernel.run));
    const std::exception_ptr failure = co_await std::move(running);
    const bool gone = alive.expired();  // then `this` is too: nothing of it is read
    if (auto answer = interrupted(gone, !gone && generation != generation_, task, fmt::format("it updated '{}'", *key))) {
      co_return std::move(*answer);
    }
    if (failure) {
      response = wire::frame{};
      *response.message.mutable_response()->mutable_status() = wire::status_of(failure, task_);
      operation_errors_[decided.operation].inc();
    }
    if (decided.started) {
      operation_seconds_[decided.operation].observe(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - *decided.started).count());
    }
  }
  recycle(std::move(request));
  lane.reset();
  co_return std::move(response);
}

asio::awaitable<std::exception_ptr> ps_service::on_pool(std::function<void()> job) {
  const auto executor = co_await asio::this_coro::executor;
  auto token = as_tuple(asio::use_awaitable);
  const auto [failure] = co_await asio::async_initiate<decltype(token), void(std::exception_ptr)>(
      [&](auto handler) {
        // Holds the executor's work while the job runs: its io_context keeps running for it.
        detail::erased_handler<void(std::exception_ptr)> done(std::move(handler), executor);
        asio::post(*kernel_pool_, [job = std::move(job), done = std::move(done), hook = kernel_hook_]() mutable {
          lower_kernel_thread_priority();
          std::exception_ptr failure;
          try {
            if (hook) hook();
            job();
          } catch (...) {
            failure = std::current_exception();
          }
          job = nullptr;  // lets go of the storage before the executor looks at who shares it
          done(failure);
        });
      },
      token);
  co_return failure;
}

wire::frame ps_service::handle(const wire::frame& request) { return decide(request, {}).response; }

ps_service::decision ps_service::decide(const wire::frame& request, const serving& how) {
  ++requests_served_;
  decision out;
  if (metrics::enabled()) out.started = std::chrono::steady_clock::now();  // no clock read while they are off
  out.operation = operation_index(request.message.request().body_case());
  wire::frame& response = out.response;
  response.message.mutable_response();
  std::exception_ptr failure;
  try {
    const auto& body = request.message.request();
    kernel_job job;
    switch (body.body_case()) {
      case wire::Request::kCreateVariable: job = create(request, body.create_variable(), how); break;
      case wire::Request::kReadVariable: read(request, body.read_variable(), response, how); break;
      case wire::Request::kUpdateVariable: job = update(request, body.update_variable(), how); break;
      case wire::Request::kApplyGradient: job = apply_gradient(request, body.apply_gradient(), how); break;
      case wire::Request::kListSlots: list_slots(body.list_slots(), response); break;
      case wire::Request::kDeleteVariable: remove(body.delete_variable()); break;
      case wire::Request::kCreateHashTable: create_table(body.create_hash_table()); break;
      case wire::Request::kHashLookup: lookup_tables(request, body.hash_lookup(), response); break;
      case wire::Request::kHashApplyGradients: apply_to_tables(request, body.hash_apply_gradients(), how); break;
      case wire::Request::kAdvanceClock: advance_clock(body.advance_clock(), response); break;
      case wire::Request::kHashExport: export_table(body.hash_export(), response); break;
      case wire::Request::kHashImport: import_table(request, body.hash_import()); break;
      default: throw wire::not_served(body, "parameter server", task_);  // the server refuses them first
    }
    // A big kernel is left for serve() to run on the pool; the rest runs now.
    if (job.run && !(how.in_serve && kernel_pool_ && job.bytes >= offload_bytes_)) std::exchange(job.run, nullptr)();
    out.kernel = std::move(job);
  } catch (const std::bad_alloc&) {
    // The limits stop a request from asking for more than the ps may hold, but the machine may
    // have less free than the limits assume: the caller learns how much the ps holds.
    failure = std::make_exception_ptr(
        error(errc::resource_exhausted, fmt::format("{} ran out of memory serving the request (it holds {} of "
                                                    "variables, slots and tables)",
                                                    task_, bytes_text(held_bytes()))));
  } catch (...) {
    failure = std::current_exception();
  }
  if (failure) {
    response = wire::frame{};
    *response.message.mutable_response()->mutable_status() = wire::status_of(failure, task_);
    operation_errors_[out.operation].inc();
  }
  if (!out.kernel.run && out.started) {  // else serve() observes it once the kernel is done
    operation_seconds_[out.operation].observe(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - *out.started).count());
  }
  publish();
  return out;
}

ps_service::kernel_job ps_service::create(const wire::frame& request, const wire::CreateVariable& create,
                                          const serving& how) {
  const variable_ref ref = decode_ref(create.variable());
  if (ref.name.empty()) invalid("a variable needs a name");
  const std::string context = fmt::format("create of '{}'", ref.name);
  const std::uint64_t size = store_.checked_bytes(context, ref.type, ref.shape);
  tensor initial;
  std::optional<kernels::shard_initializer> fill;
  if (create.has_initializer()) {
    fill = decode_initializer(create.initializer(), ref.name);
    kernels::check_initializer(*fill, ref.type, ref.shape, ref.name);
  } else {
    initial = wire::get_tensor(request, create.initial_value());
    if (initial.type() != ref.type || initial.shape() != ref.shape) {
      invalid(fmt::format("initial value of '{}' is {} {} but the variable is {} {}", ref.name,
                          name_of(initial.type()), to_string(initial.shape()), name_of(ref.type),
                          to_string(ref.shape)));
    }
    check_finite(context, "initial value", initial, how);
  }
  if (tables_.contains(ref.name)) {
    throw error(errc::already_exists, fmt::format("'{}' is a hash table on {}: a variable cannot have its name",
                                                  ref.name, task_));
  }
  if (store_.contains(ref.name)) {
    throw error(errc::already_exists, fmt::format("variable '{}' already exists on {}", ref.name, task_));
  }
  std::string owner;
  if (create.has_slot_of()) {
    owner = create.slot_of().variable();
    if (!store_.contains(owner) || !ref.name.starts_with(owner + "/")) {
      invalid(fmt::format("'{}' cannot be a slot of '{}': a slot is named '<variable>/...' and lives beside its "
                          "variable on {}",
                          ref.name, owner, task_));
    }
  }
  store_.check_room(context, "", ref.name, ref.type, ref.shape, 0);
  // The frame's segment becomes the variable's storage: no copy.
  stored_variable stored{.type = ref.type,
                         .shape = ref.shape,
                         .bytes = fill ? byte_buffer(size) : initial.bytes(),
                         .slot_of = std::move(owner),
                         .slot_initial_value = create.has_slot_of() ? create.slot_of().initial_value() : 0.0};
  const auto& held = store_.hold(ref.name, std::move(stored));
  if (!fill) return {};
  return {size, [bytes = held.bytes, fill = std::move(*fill), type = ref.type, shape = ref.shape] {
            kernels::initialize(fill, type, shape, bytes.data());
          }};
}

std::uint64_t ps_service::answer_bytes_bound(const wire::frame& request) const noexcept {
  const auto& body = request.message.request();
  if (body.body_case() != wire::Request::kReadVariable) return 0;
  const auto& read = body.read_variable();
  try {
    // From the request alone, not from the variables as they are when it arrives: a read right
    // behind the create of its variable (still in service: its values scanned on the pool) would
    // count for nothing. read() refuses a read whose variable is not exactly the one it names, so
    // the bound is exact for every read that succeeds.
    const variable_ref asked = decode_ref(read.variable());
    if (read.has_indices() && read.has_rows()) return 0;
    std::optional<std::uint64_t> bytes;
    if (!read.has_indices() && !read.has_rows()) {
      bytes = checked_size_bytes(asked.type, asked.shape);
    } else {
      if (asked.shape.empty()) return 0;  // a scalar has no rows
      std::uint64_t rows = 0;
      if (read.has_rows()) {
        const auto& range = read.rows();
        if (range.begin() > range.end() || range.end() > asked.shape[0]) return 0;
        rows = range.end() - range.begin();
      } else {
        rows = wire::get_tensor(request, read.indices()).size();  // ids may repeat: beyond the variable's rows
      }
      bytes = checked_size_bytes(asked.type, rows_shape(rows, asked.shape));
    }
    // No variable, and no reply, is larger than max_variable_bytes (creates and sparse reads refuse one).
    return bytes && *bytes <= store_.max_variable_bytes() ? *bytes : 0;
  } catch (...) {
    return 0;  // refused when served
  }
}

stored_variable& ps_service::find(const wire::VariableRef& ref, std::string_view operation) {
  return store_.find(decode_ref(ref), operation);
}

void ps_service::read(const wire::frame& request, const wire::ReadVariable& read, wire::frame& response,
                      const serving& how) {
  const bool sparse = read.has_indices();
  auto& stored = find(read.variable(), sparse ? "sparse_read" : "read");
  auto& out = *response.message.mutable_response()->mutable_result()->mutable_tensor();
  if (read.has_rows()) {
    if (sparse) invalid(fmt::format("read of '{}': rows and indices exclude each other", read.variable().name()));
    check_rows(read.rows().begin(), read.rows().end(), stored, "read", read.variable().name());
    // A slice of the storage, shared like a whole read.
    const std::size_t row_bytes = row_elements(stored.shape) * size_of(stored.type);
    const auto count = static_cast<std::size_t>(read.rows().end() - read.rows().begin());
    wire::put_tensor(response, out,
                     tensor(stored.type, rows_shape(count, stored.shape),
                            stored.bytes.slice(static_cast<std::size_t>(read.rows().begin()) * row_bytes,
                                               count * row_bytes)));
    return;
  }
  if (!sparse) {
    // The reply shares the storage; a later update copies first (make_writable), so the bytes being
    // written out never change underneath the write.
    wire::put_tensor(response, out, tensor(stored.type, stored.shape, stored.bytes));
    return;
  }
  const tensor indices = wire::get_tensor(request, read.indices());
  const auto ids = row_ids(indices, stored, "sparse_read", read.variable().name());
  // Ids may repeat: a short request could ask for a reply far larger than the variable.
  auto reply_shape = rows_shape(ids.size(), stored.shape);
  const auto reply_bytes = checked_size_bytes(stored.type, reply_shape);
  if (!reply_bytes || *reply_bytes > store_.max_variable_bytes()) {
    throw error(errc::resource_exhausted,
                fmt::format("sparse_read of '{}': {} ids make a reply of {} {}, {}, more than the {} {} allows per "
                            "variable (server_options::max_variable_bytes raises it)",
                            read.variable().name(), ids.size(), name_of(stored.type), to_string(reply_shape),
                            reply_bytes ? bytes_text(*reply_bytes) : "over 2^64 bytes",
                            bytes_text(store_.max_variable_bytes()), task_));
  }
  tensor rows(stored.type, std::move(reply_shape), reply_buffer(reply_buffers_, *reply_bytes));
  wire::put_tensor(response, out, rows);
  const std::size_t row_bytes = row_elements(stored.shape) * size_of(stored.type);
  if (how.in_serve && 2 * *reply_bytes >= offload_bytes_ && row_bytes > 0) {
    // A large reply is gathered as it is sent, a step per turn of the executor, each step sent
    // while it is in cache (wire::segment_producer); serve() holds the variable's lane until the
    // last row is gathered, so no update of it runs meanwhile. The request's ids and the storage
    // stay alive with the producer.
    response.produce_last = [rows, storage = stored.bytes, indices, row_bytes, filled = std::size_t{0}]() mutable {
      const std::size_t step = std::max<std::size_t>(wire::segment_produce_step / row_bytes, 1);
      const std::size_t first = filled / row_bytes;
      const std::size_t count = std::min(step, indices.size() - first);
      common::gather_rows(rows.bytes().data() + filled, storage.data(),
                  std::span<const std::int64_t>(indices.data<std::int64_t>() + first, count), row_bytes);
      filled += count * row_bytes;
      return filled;
    };
    return;
  }
  common::gather_rows(rows.bytes().data(), stored.bytes.data(), ids, row_bytes);
}

ps_service::kernel_job ps_service::update(const wire::frame& request, const wire::UpdateVariable& update,
                                          const serving& how) {
  const auto op = decode_op(update.op());
  const bool scatter = update.has_indices();
  const auto name = op_name(op, scatter);
  auto& stored = find(update.variable(), name);
  const auto& variable = update.variable().name();
  const std::string context = fmt::format("{} to '{}'", name, variable);
  const tensor value = wire::get_tensor(request, update.value());
  if (value.type() != stored.type) {
    invalid(fmt::format("{} to '{}': dtype {} does not match the variable's {}", name, variable,
                        name_of(value.type()), name_of(stored.type)));
  }
  if (update.has_rows()) {
    if (scatter) invalid(fmt::format("{} to '{}': rows and indices exclude each other", name, variable));
    check_rows(update.rows().begin(), update.rows().end(), stored, name, variable);
    const auto count = static_cast<std::size_t>(update.rows().end() - update.rows().begin());
    if (value.shape() != rows_shape(count, stored.shape)) {
      invalid(fmt::format("{} to rows [{}, {}) of '{}': shape {} is not {}", name, update.rows().begin(),
                          update.rows().end(), variable, to_string(value.shape()),
                          to_string(rows_shape(count, stored.shape))));
    }
    check_finite(context, "value", value, how);
    check_divisors(context, op, value, how);
    auto copy_from = detach_shared(stored.bytes, *buffers_);
    const kernel_storage target{stored.bytes, std::move(copy_from), std::nullopt, stored.type};
    const std::size_t offset = update.rows().begin() * row_elements(stored.shape) * size_of(stored.type);
    return {target.setup_bytes() + 2 * value.size_bytes(), [target, value, op, offset] {
              target.set_up();
              std::byte* first = target.bytes.data() + offset;
              if (op == update_op::assign) {
                if (value.bytes().size()) std::memcpy(first, value.bytes().data(), value.bytes().size());
              } else {
                kernels::combine(op, target.type, first, value.bytes().data(), value.size());
              }
            }};
  }
  if (!scatter) {
    if (value.shape() != stored.shape) {
      invalid(fmt::format("{} to '{}': shape {} does not match the variable's {}", name, variable,
                          to_string(value.shape()), to_string(stored.shape)));
    }
    check_finite(context, "value", value, how);
    check_divisors(context, op, value, how);
    if (op == update_op::assign) {
      // Adopt the received segment (no copy); the storage it replaces receives a later request's
      // segment of its size, unless a reply being written still holds it (then it goes when the
      // reply is written: copy on write, as make_writable).
      buffers_->give(std::exchange(stored.bytes, value.bytes()));
      return {};
    }
    auto copy_from = detach_shared(stored.bytes, *buffers_);
    const kernel_storage target{stored.bytes, std::move(copy_from), std::nullopt, stored.type};
    return {target.setup_bytes() + 2 * value.size_bytes(), [target, value, op] {
              target.set_up();
              kernels::combine(op, target.type, target.bytes.data(), value.bytes().data(), value.size());
            }};
  }
  const tensor indices = wire::get_tensor(request, update.indices());
  const auto ids = row_ids(indices, stored, name, variable);
  if (value.shape() != rows_shape(ids.size(), stored.shape)) {
    invalid(fmt::format("{} to '{}': {} ids need rows of shape {}, got {}", name, variable, ids.size(),
                        to_string(rows_shape(ids.size(), stored.shape)), to_string(value.shape())));
  }
  check_finite(context, "rows", value, how);
  check_divisors(context, op, value, how);
  auto copy_from = detach_shared(stored.bytes, *buffers_);
  const kernel_storage target{stored.bytes, std::move(copy_from), std::nullopt, stored.type};
  return {target.setup_bytes() + 2 * value.size_bytes() + indices.size_bytes(),
          [target, value, indices, op, row_size = row_elements(stored.shape)] {
            target.set_up();
            const std::span<const std::int64_t> ids(indices.data<std::int64_t>(), indices.size());
            kernels::scatter(op, target.type, target.bytes.data(), ids, value.bytes().data(), row_size);
          }};
}

kernel_storage ps_service::slot(const std::string& variable, const slot_plan& plan) {
  auto* stored = store_.find(plan.name);
  if (!stored) {
    // Held before its kernel fills it: whoever asks for it waits in its variable's lane meanwhile.
    const byte_buffer bytes(num_elements(plan.shape) * size_of(plan.type));
    store_.hold(plan.name, stored_variable{plan.type, plan.shape, bytes, variable, plan.initial_value});
    return {bytes, {}, plan.initial_value, plan.type};
  }
  auto copy_from = detach_shared(stored->bytes, *buffers_);
  return {stored->bytes, std::move(copy_from), std::nullopt, plan.type};
}

ps_service::kernel_job ps_service::apply_gradient(const wire::frame& request, const wire::ApplyGradient& apply,
                                                  const serving& how) {
  const auto opt = wire::decode_optimizer(apply.optimizer());
  const std::string optimizer(optimizer_name(opt));
  const bool sparse = apply.has_indices();
  const std::string operation = fmt::format("{} {}", optimizer, sparse ? "sparse update" : "update");
  auto& stored = find(apply.variable(), operation);
  const std::string& variable = apply.variable().name();
  const std::string context = fmt::format("{} of '{}'", operation, variable);
  kernels::check_optimizer(opt);
  if (stored.type != dtype::float32 && stored.type != dtype::float64) {
    invalid(fmt::format("{}: optimizers update float32 or float64 variables, not {}", context, name_of(stored.type)));
  }
  const tensor gradient = wire::get_tensor(request, apply.gradient());
  if (gradient.type() != stored.type) {
    invalid(fmt::format("{}: gradient dtype {} does not match the variable's {}", context, name_of(gradient.type()),
                        name_of(stored.type)));
  }
  std::span<const std::int64_t> ids;
  tensor indices;
  if (sparse) {
    indices = wire::get_tensor(request, apply.indices());
    ids = row_ids(indices, stored, operation, variable);
    if (gradient.shape() != rows_shape(ids.size(), stored.shape)) {
      invalid(fmt::format("{}: {} ids need gradient rows of shape {}, got {}", context, ids.size(),
                          to_string(rows_shape(ids.size(), stored.shape)), to_string(gradient.shape())));
    }
  } else if (gradient.shape() != stored.shape) {
    invalid(fmt::format("{}: gradient shape {} does not match the variable's {}", context,
                        to_string(gradient.shape()), to_string(stored.shape)));
  }
  check_finite(context, "gradient", gradient, how);
  // The slots it keeps, created on first use: they must fit before anything changes.
  std::vector<slot_plan> plans;
  const auto specs = slots_of(opt);
  for (const auto& spec : specs) {
    plans.push_back({variable + "/" + optimizer + "/" + spec.name, stored.type, stored.shape, spec.initial_value});
  }
  if (kernels::counts_steps(opt)) plans.push_back({variable + "/" + optimizer + "/iterations", dtype::int64, {}, 0});
  store_.check_slots(context, variable, stored, plans);
  // Everything is checked: from here on nothing throws, so variable and slots change together.
  std::vector<kernel_storage> slots;
  for (std::size_t i = 0; i < specs.size(); ++i) slots.push_back(slot(variable, plans[i]));
  std::int64_t step = 0;
  if (kernels::counts_steps(opt)) {
    const auto count = slot(variable, plans.back());  // a scalar: set up here
    count.set_up();
    step = ++*reinterpret_cast<std::int64_t*>(count.bytes.data());
  }
  auto copy_from = detach_shared(stored.bytes, *buffers_);
  const kernel_storage target{stored.bytes, std::move(copy_from), std::nullopt, stored.type};
  // What it reads and writes: the gradient, and as many bytes of the variable and of each slot.
  std::uint64_t work = target.setup_bytes() + (2 + slots.size()) * gradient.size_bytes();
  for (const auto& s : slots) work += s.setup_bytes();
  return {work, [target, slots = std::move(slots), opt, step, gradient, indices, sparse,
                row_size = row_elements(stored.shape), rows = stored.shape.empty() ? 0 : stored.shape[0]] {
    target.set_up();
    std::vector<std::byte*> slot_bytes;
    for (const auto& s : slots) {
      s.set_up();
      slot_bytes.push_back(s.bytes.data());
    }
    if (sparse) {
      const std::span<const std::int64_t> ids(indices.data<std::int64_t>(), indices.size());
      kernels::apply_sparse(opt, target.type, target.bytes.data(), rows, slot_bytes, step, ids,
                            gradient.bytes().data(), row_size);
    } else {
      kernels::apply_dense(opt, target.type, target.bytes.data(), slot_bytes, step, gradient.bytes().data(),
                           gradient.size());
    }
  }};
}

void ps_service::list_slots(const wire::ListSlots& list, wire::frame& response) {
  find(list.variable(), "list_slots");
  auto& out = *response.message.mutable_response();
  for (const auto& [name, slot] : store_.slots_of(list.variable().name())) {
    auto& info = *out.add_slots();
    encode_ref(*info.mutable_slot(), variable_ref{name, slot->type, slot->shape, 0});
    info.set_initial_value(slot->slot_initial_value);
  }
}

// ---- Hash tables --------------------------------------------------------------------------------

namespace {

admission_policy decode_admission(const wire::AdmissionPolicy& in, std::string_view table) {
  switch (in.kind()) {
    case wire::AdmissionPolicy::ALWAYS: return admission::always{};
    case wire::AdmissionPolicy::MIN_COUNT: return admission::min_count{in.count(), static_cast<std::size_t>(in.counters())};
    case wire::AdmissionPolicy::PROBABILITY: return admission::probability{in.p(), in.seed()};
    default: break;
  }
  invalid(fmt::format("hash table '{}': unknown admission policy {}", table, static_cast<int>(in.kind())));
}

eviction_policy decode_eviction(const wire::EvictionPolicy& in, std::string_view table) {
  switch (in.kind()) {
    case wire::EvictionPolicy::NONE: return eviction::none{};
    case wire::EvictionPolicy::TTL: return eviction::ttl{in.max_idle()};
    case wire::EvictionPolicy::CAPACITY: return eviction::capacity{in.rows_per_ps()};
    default: break;
  }
  invalid(fmt::format("hash table '{}': unknown eviction policy {}", table, static_cast<int>(in.kind())));
}

// The ids of a part: int64, 1-D.
std::span<const std::int64_t> table_ids(const tensor& ids, std::string_view operation, std::string_view table) {
  if (ids.type() != dtype::int64 || ids.shape().size() != 1) {
    invalid(fmt::format("{} of '{}': ids must be a 1-D int64 tensor, not {} {}", operation, table, name_of(ids.type()),
                        to_string(ids.shape())));
  }
  return {ids.data<std::int64_t>(), ids.size()};
}

}  // namespace

std::uint64_t ps_service::room() const noexcept {
  const std::uint64_t held = held_bytes();
  return held >= store_.max_ps_bytes() ? 0 : store_.max_ps_bytes() - held;
}

void ps_service::count_table_bytes() noexcept {
  table_bytes_ = 0;
  for (const auto& [name, part] : tables_) table_bytes_ += part.bytes_held();
  store_.set_table_bytes(table_bytes_);
}

hash_table_part& ps_service::table_of(const wire::HashTableRef& ref, std::string_view operation) {
  const auto it = tables_.find(ref.name());
  if (it == tables_.end()) {
    throw error(errc::not_found, fmt::format("{} of '{}': {} holds no part of a hash table of that name", operation,
                                             ref.name(), task_));
  }
  hash_table_part& part = it->second;
  if (ref.dtype() != static_cast<std::uint32_t>(part.type()) || ref.dim() != part.options().dim) {
    invalid(fmt::format("{} of '{}': the table is {} with rows of {}, not code {} with rows of {}", operation,
                        ref.name(), name_of(part.type()), part.options().dim, ref.dtype(), ref.dim()));
  }
  return part;
}

void ps_service::create_table(const wire::CreateHashTable& create) {
  const hash_table_ref ref = wire::decode_table_ref(create.table());
  if (ref.name.empty()) invalid("a hash table needs a name");
  if (store_.contains(ref.name)) {
    throw error(errc::already_exists, fmt::format("'{}' is a variable on {}: a hash table cannot have its name",
                                                  ref.name, task_));
  }
  if (tables_.contains(ref.name)) {
    throw error(errc::already_exists, fmt::format("hash table '{}' already exists on {}", ref.name, task_));
  }
  hash_table_options options;
  options.dim = ref.dim;
  options.buckets = ref.buckets;
  options.initializer = decode_initializer(create.initializer(), ref.name).init;
  options.admission = decode_admission(create.admission(), ref.name);
  options.eviction = decode_eviction(create.eviction(), ref.name);
  options.default_value = create.default_value();
  options.max_rows_per_ps = create.max_rows_per_ps();
  const std::vector<std::uint32_t> held(create.buckets().begin(), create.buckets().end());
  if (held.size() > ref.buckets) {
    invalid(fmt::format("hash table '{}': {} buckets held of {}", ref.name, held.size(), ref.buckets));
  }
  // The filter and the bucket table are the part's fixed cost: checked before they are allocated.
  const std::uint64_t fixed = ref.buckets * std::uint64_t{8} + held.size() * std::uint64_t{128} +
                              (std::holds_alternative<admission::min_count>(options.admission)
                                   ? std::get<admission::min_count>(options.admission).counters
                                   : 0);
  if (fixed > room()) {
    throw error(errc::resource_exhausted,
                fmt::format("hash table '{}' needs {} on {} to start, and it may hold {} more "
                            "(server_options::max_ps_bytes raises it)",
                            ref.name, bytes_text(fixed), task_, bytes_text(room())));
  }
  const auto& part = tables_.emplace(ref.name, hash_table_part(ref.name, task_, ref.type, std::move(options), held))
                         .first->second;
  count_table_bytes();
  watch_table(ref.name);
  publish_table(part);
}

void ps_service::watch_table(const std::string& name) {
  auto& m = table_metrics_[name];
  auto& r = metrics::process_registry();
  const metrics::labels table{{"table", name}};
  m.registered.push_back(r.add("pscoro_ps_hash_table_rows", "Rows a parameter server holds of a hash table.", table, m.rows));
  m.registered.push_back(r.add("pscoro_ps_hash_table_bytes",
                               "Bytes a parameter server's part of a hash table takes (records, maps, filter).", table,
                               m.bytes));
  m.registered.push_back(r.add("pscoro_ps_hash_table_admitted_total", "Rows a hash table made (ids admitted).", table,
                               m.admitted));
  m.registered.push_back(r.add("pscoro_ps_hash_table_evicted_total",
                               "Rows a hash table dropped (idle past its ttl, or replaced at its capacity).", table,
                               m.evicted));
  m.registered.push_back(r.add("pscoro_ps_hash_table_not_admitted_total",
                               "Ids a hash table lookup read as the default row (not held, not admitted).", table,
                               m.not_admitted));
  m.registered.push_back(r.add("pscoro_ps_hash_table_gradients_dropped_total",
                               "Gradient rows a hash table dropped (their ids are not held).", table,
                               m.gradients_dropped));
  m.registered.push_back(r.add("pscoro_ps_hash_table_refused_total",
                               "Lookups a hash table refused because the rows would not fit (max_rows_per_ps, "
                               "max_ps_bytes).",
                               table, m.refused));
}

void ps_service::publish_table(const hash_table_part& part) noexcept {
  const auto it = table_metrics_.find(part.name());
  if (it == table_metrics_.end()) return;
  auto& m = it->second;
  const auto& now = part.counts();
  m.rows.set(static_cast<std::int64_t>(part.rows()));
  m.bytes.set(static_cast<std::int64_t>(part.bytes_held()));
  m.admitted.inc(now.admitted - m.published.admitted);
  m.evicted.inc(now.evicted - m.published.evicted);
  m.not_admitted.inc(now.not_admitted - m.published.not_admitted);
  m.gradients_dropped.inc(now.gradients_dropped - m.published.gradients_dropped);
  m.published = now;
}

void ps_service::lookup_tables(const wire::frame& request, const wire::HashLookup& lookup, wire::frame& response) {
  // Every part checked before any is served: a bad one changes nothing anywhere.
  std::vector<std::pair<hash_table_part*, tensor>> parts;
  for (const auto& part : lookup.parts()) {
    hash_table_part& table = table_of(part.table(), "lookup");
    tensor ids = wire::get_tensor(request, part.ids());
    table_ids(ids, "lookup", part.table().name());
    parts.emplace_back(&table, std::move(ids));
  }
  // The reply's size is the caller's choice (ids may repeat): bounded as a sparse read's is.
  std::uint64_t reply_bytes = 0;
  for (const auto& [table, ids] : parts) {
    const auto bytes = checked_size_bytes(table->type(), shape_type{ids.size(), table->options().dim});
    if (!bytes || *bytes > store_.max_variable_bytes() - std::min(reply_bytes, store_.max_variable_bytes())) {
      throw error(errc::resource_exhausted,
                  fmt::format("lookup of '{}': {} ids of {} values make a reply past the {} {} allows per request "
                              "(server_options::max_variable_bytes raises it)",
                              table->name(), ids.size(), table->options().dim, bytes_text(store_.max_variable_bytes()),
                              task_));
    }
    reply_bytes += *bytes;
  }
  auto& list = *response.message.mutable_response()->mutable_result()->mutable_list();
  for (auto& [table, ids] : parts) {
    // Checked above: the bytes fit in a size_t. Pooled as a sparse read's rows are (reply_buffer).
    shape_type shape{ids.size(), table->options().dim};
    const std::size_t bytes = ids.size() * table->options().dim * size_of(table->type());
    tensor rows(table->type(), std::move(shape), reply_buffer(reply_buffers_, bytes));
    try {
      table->lookup(table_ids(ids, "lookup", table->name()), lookup.insert(), rows.bytes().data(), room());
    } catch (const error& e) {
      if (e.code() == errc::resource_exhausted) {
        if (const auto m = table_metrics_.find(table->name()); m != table_metrics_.end()) m->second.refused.inc();
      }
      throw;
    }
    count_table_bytes();
    publish_table(*table);
    wire::put_tensor(response, *list.add_items()->mutable_tensor(), rows);
  }
}

void ps_service::apply_to_tables(const wire::frame& request, const wire::HashApplyGradients& apply,
                                 const serving& how) {
  const auto opt = wire::decode_optimizer(apply.optimizer());
  kernels::check_optimizer(opt);
  const std::string operation = fmt::format("{} step", optimizer_name(opt));
  struct checked_part {
    hash_table_part* table;
    tensor ids;
    tensor gradients;
  };
  std::vector<checked_part> parts;
  for (const auto& part : apply.parts()) {
    hash_table_part& table = table_of(part.table(), operation);
    tensor ids = wire::get_tensor(request, part.ids());
    const auto n = table_ids(ids, operation, table.name()).size();
    tensor gradients = wire::get_tensor(request, part.gradients());
    if (gradients.type() != table.type() || gradients.shape() != shape_type{n, table.options().dim}) {
      invalid(fmt::format("{} of '{}': {} ids need gradients {} [{}, {}], got {} {}", operation, table.name(), n,
                          name_of(table.type()), n, table.options().dim, name_of(gradients.type()),
                          to_string(gradients.shape())));
    }
    check_finite(fmt::format("{} of '{}'", operation, table.name()), "gradient", gradients, how);
    parts.push_back({&table, std::move(ids), std::move(gradients)});
  }
  for (auto& part : parts) {
    part.table->apply_gradients(opt, table_ids(part.ids, operation, part.table->name()), part.gradients.bytes().data());
    publish_table(*part.table);
  }
  count_table_bytes();
}

void ps_service::advance_clock(const wire::AdvanceClock& advance, wire::frame& response) {
  hash_table_part& table = table_of(advance.table(), "advance_clock");
  const std::uint64_t dropped = table.advance_clock(advance.clock());
  count_table_bytes();
  publish_table(table);
  response.message.mutable_response()->mutable_result()->set_integer(static_cast<std::int64_t>(dropped));
}

void ps_service::export_table(const wire::HashExport& request, wire::frame& response) {
  hash_table_part& table = table_of(request.table(), "export");
  if (request.first_bucket() >= table.options().buckets) {
    invalid(fmt::format("export of '{}': bucket {} is not one of its {}", table.name(), request.first_bucket(),
                        table.options().buckets));
  }
  if (request.base() != 0 && request.save() == 0) {
    invalid(fmt::format("export of '{}': the changes since save {:016x} belong to a save, and none is named",
                        table.name(), request.base()));
  }
  if (request.save() != 0) {
    if (request.first_bucket() == 0) {
      table.start_save(request.save(), request.base());
    } else if (table.save_in_progress() != request.save()) {
      throw error(errc::failed_precondition,
                  fmt::format("export of '{}' on {} for save {:016x}: the part is in save {:016x} now (another save "
                              "started meanwhile)",
                              table.name(), task_, request.save(), table.save_in_progress()));
    }
  }
  // A piece is as large as asked, within what one reply may carry; a bucket goes whole.
  const std::uint64_t most = std::min<std::uint64_t>(request.max_bytes(), store_.max_variable_bytes());
  auto piece = table.export_rows(request.first_bucket(), most, request.base() != 0);
  const std::size_t n = piece.rows.ids.size();
  const std::size_t row_values = (1 + table.slots()) * table.options().dim;
  if (piece.rows.values.size() > store_.max_variable_bytes()) {
    throw error(errc::resource_exhausted,
                fmt::format("export of '{}': bucket {} alone holds {} rows, {} of values, past the {} {} allows per "
                            "reply (give the table more buckets, or raise server_options::max_variable_bytes)",
                            table.name(), request.first_bucket(), n, bytes_text(piece.rows.values.size()),
                            bytes_text(store_.max_variable_bytes()), task_));
  }
  auto& reply = *response.message.mutable_response()->mutable_hash_export();
  wire::encode_table_state(response, *reply.mutable_state(), table.state(), request.first_bucket() == 0);
  reply.set_next_bucket(piece.next_bucket);
  // A tensor of `type` and `shape` holding `bytes` (none for no rows: no pointer to copy from).
  const auto tensor_of = [](dtype type, shape_type shape, const void* bytes) {
    tensor out = tensor::uninitialized(type, std::move(shape));
    if (out.size_bytes() > 0) std::memcpy(out.bytes().data(), bytes, out.size_bytes());
    return out;
  };
  wire::put_tensor(response, *reply.mutable_ids(), tensor_of(dtype::int64, {n}, piece.rows.ids.data()));
  wire::put_tensor(response, *reply.mutable_last_named(),
                   tensor_of(dtype::int64, {n}, piece.rows.last_named.data()));
  wire::put_tensor(response, *reply.mutable_values(),
                   tensor_of(table.type(), {n, row_values}, piece.rows.values.data()));
  if (request.base() != 0) {
    wire::put_tensor(response, *reply.mutable_dropped(),
                     tensor_of(dtype::int64, {piece.dropped.size()}, piece.dropped.data()));
  }
}

void ps_service::import_table(const wire::frame& request, const wire::HashImport& import) {
  hash_table_part& table = table_of(import.table(), "restore");
  const std::optional<detail::table_state> state =
      import.reset() ? std::optional(wire::decode_table_state(request, import.state(), table.name())) : std::nullopt;
  const tensor ids = wire::get_tensor(request, import.ids());
  const tensor last_named = wire::get_tensor(request, import.last_named());
  const tensor values = wire::get_tensor(request, import.values());
  const std::size_t n = table_ids(ids, "restore", table.name()).size();
  std::vector<std::int64_t> dropped;
  if (import.has_dropped()) {
    const tensor dropped_ids = wire::get_tensor(request, import.dropped());
    const auto ids_dropped = table_ids(dropped_ids, "restore (dropped ids)", table.name());
    dropped.assign(ids_dropped.begin(), ids_dropped.end());
  }
  const std::size_t slots = state ? (state->owner ? slots_of(*state->owner).size() : 0) : table.slots();
  if (last_named.type() != dtype::int64 || last_named.shape() != shape_type{n} || values.type() != table.type() ||
      values.shape() != shape_type{n, (1 + slots) * table.options().dim}) {
    invalid(fmt::format("restore of '{}': {} ids need last-named times int64 [{}] and values {} [{}, {}] ({} slots), "
                        "got {} {} and {} {}",
                        table.name(), n, n, name_of(table.type()), n, (1 + slots) * table.options().dim, slots,
                        name_of(last_named.type()), to_string(last_named.shape()), name_of(values.type()),
                        to_string(values.shape())));
  }
  part_rows rows;
  const auto* id_data = ids.data<std::int64_t>();
  rows.ids.assign(id_data, id_data + n);
  const auto* named = last_named.data<std::int64_t>();
  rows.last_named.assign(named, named + n);  // a negative time is past any clock: refused as such
  const auto* value_bytes = values.bytes().data();
  rows.values.assign(value_bytes, value_bytes + values.size_bytes());
  // A reset comes first and alone (the chief sends the rows after it): its rows, if any, are
  // checked against the state they join. Then an increment's dropped ids go, then its rows come.
  if (state) table.reset(*state);
  if (!dropped.empty()) table.drop_rows(dropped);
  table.insert_rows(rows, room(), import.replace());
  count_table_bytes();
  publish_table(table);
}

}  // namespace pscoro::ps

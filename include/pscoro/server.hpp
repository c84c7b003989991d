// A parameter-server or worker task (TF's tf.distribute.Server).
//
// A ps holds variables; a worker runs the worker functions bound to it. Both accept the chief's
// connection; a ps also accepts the workers'. Use `server` inside your own program and io_context,
// or `run_server` from a main that branches on its task type:
//
//   int main() {
//     auto resolver = pscoro::tf_config_cluster_resolver::from_environment();
//     if (resolver.task_type() != "chief")
//       return pscoro::run_server(resolver, [](pscoro::server& s) { s.bind(train_step, do_step); });
//     ...
//   }
//
// TF's servers serve for ever; a pscoro server stops when the chief ends the job (the strategy's
// close(), unless strategy_options::keep_servers), so a job ends when its chief does.
#pragma once

#include <pscoro/config.hpp>

#include <pscoro/cluster_spec.hpp>
#include <pscoro/transport_options.hpp>
#include <pscoro/worker_function.hpp>

#include <asio/any_io_executor.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

namespace pscoro {

// Defined in <pscoro/per_worker.hpp>, which whoever binds a dataset or resource function has
// included (it makes the dataset); a server that binds none does not parse datasets and xtensor.
namespace detail {
struct erased_dataset_function;
template <class T, class F>
erased_dataset_function erase_dataset_function(F&& make);
struct erased_resource_function;
template <class T, class F>
erased_resource_function erase_resource_function(F&& make);
}  // namespace detail

struct server_options {
  /// Where to listen; empty means this task's address in the cluster spec. Port 0 picks a free
  /// port (see port()).
  std::string listen_address;
  transport_options transport;
  /// A ps refuses (errc::resource_exhausted) a variable or optimizer slot whose values take more
  /// bytes than this, and a sparse read whose reply would. 0 means max_ps_bytes.
  std::uint64_t max_variable_bytes = 0;
  /// A ps refuses (errc::resource_exhausted) a variable or optimizer slot that would take what it
  /// holds past this many bytes: the values of all its variables and slots, plus their names and
  /// 256 bytes of bookkeeping each. Ending the coordinator session gives them back. 0 means 3/4 of
  /// the memory this process may use (physical memory, or its cgroup's limit if lower), read once.
  std::uint64_t max_ps_bytes = 0;
  /// A ps refuses (errc::invalid_argument) a value, update or gradient holding NaN or Inf (TF's
  /// tf.debugging.check_numerics), naming the variable and the element. The environment variable
  /// PSCORO_CHECK_NUMERICS=1 turns it on, =0 off.
  bool check_numerics = false;
  /// Threads a ps runs its big kernels on (optimizer steps, updates, initializers, and the scans
  /// of big values for NaN, Inf and zero divisors), so that they never hold up other variables'
  /// requests or heartbeats; 0 runs every kernel on the executor. A big sparse read's rows are
  /// gathered on the executor as its reply is sent, a step at a time.
  std::size_t ps_kernel_threads = 1;
  /// A kernel that reads and writes at least this many bytes runs on those threads; smaller ones
  /// run on the executor at once (a thread hand-off costs more than they do). 0 means 1 MiB.
  std::uint64_t ps_kernel_offload_bytes = 0;
  /// A ps keeps large buffers it is done with (request segments, storage an assign replaced, sparse
  /// replies' rows) for the next requests of their size, which then fault in no fresh pages. One
  /// that no request has reused for this long goes back to the system, so a burst of large
  /// requests (a restore, a one-off assign) does not leave the ps holding up to 1.25 GiB more than
  /// its variables for the rest of the job. 0 or less (or a year or more) keeps them for the life
  /// of the ps.
  std::chrono::milliseconds ps_idle_buffers_release{std::chrono::seconds(10)};
  /// Called once, on the executor, when the chief has ended the job (its strategy's close(), unless
  /// strategy_options::keep_servers) and the server has stopped: `exit_code` is the chief's (0 on
  /// success). run_server sets it to return that code, after calling the one given here.
  std::function<void(int exit_code)> on_shutdown;
  /// Serve this process's metrics (<pscoro/metrics.hpp>) at http://HOST:PORT/metrics on this port
  /// (0: a free one; start() logs the URL), on the host the server listens on. Off when empty.
  /// PSCORO_METRICS_PORT in the environment overrides it.
  std::optional<std::uint16_t> metrics_port;
};

class PSCORO_API server {
 public:
  /// A server for task `resolver.task_type():task_id()`, which must be "ps" or "worker" and
  /// listed in the cluster spec. Throws errc::invalid_argument otherwise.
  server(asio::any_io_executor executor, const simple_cluster_resolver& resolver, server_options options = {});
  ~server();
  server(const server&) = delete;
  server& operator=(const server&) = delete;

  /// Binds `fn` (callable as `asio::awaitable<R>(Args...)`) to `function` on a worker. Its
  /// captures live as long as the server.
  template <class R, class... Args, class F>
  void bind(const worker_function<R(Args...)>& function, F&& fn) {
    bind_erased(function.name(), function.signature(), detail::erase_worker_function(function, std::forward<F>(fn)));
  }

  /// Binds `make` (callable as `pscoro::dataset<T>(pscoro::input_context)`) to `function` on a
  /// worker: the chief's create_per_worker_dataset(function).iter() calls it for a fresh pipeline,
  /// on the worker's build thread (so a slow one holds up neither heartbeats and closures nor the
  /// input thread, where iterators' next_async() runs their pipelines).
  template <class T, class F>
  void bind(const dataset_function<T>& function, F&& make) {
    bind_dataset_erased(function.name(), detail::erase_dataset_function<T>(std::forward<F>(make)));
  }

  /// Binds `make` (callable as `T(pscoro::input_context)`) to `function` on a worker: the chief's
  /// create_per_worker_resource(function) calls it for this worker's instance (on the worker's build
  /// thread, as a dataset function), and again when the worker comes back after a failure.
  template <class T, class F>
  void bind(const resource_function<T>& function, F&& make) {
    bind_resource_erased(function.name(), detail::erase_resource_function<T>(std::forward<F>(make)));
  }

  /// Listens and starts accepting on the executor. Throws if the address cannot be bound.
  void start();
  /// Stops accepting and closes every connection. On the executor's thread it does so at once; from
  /// another thread (a dataset or resource function, which runs on the worker's build thread) it is
  /// posted to the executor and happens after this returns.
  void stop();

  /// The port listened on (after start()).
  std::uint16_t port() const;
  /// "host:port" listened on (after start()).
  std::string address() const;
  /// "ps:0".
  const std::string& task() const noexcept;

 private:
  void bind_erased(std::string name, std::string signature, detail::erased_worker_function fn);
  void bind_dataset_erased(std::string name, detail::erased_dataset_function fn);
  void bind_resource_erased(std::string name, detail::erased_resource_function fn);

  struct impl;
  std::shared_ptr<impl> impl_;
};

/// Runs this process as the ps or worker task of `resolver` until the chief ends the job, or until
/// SIGINT or SIGTERM: makes an io_context, lets `configure` bind worker functions, starts the
/// server and prints "pscoro: <task> listening on <host:port>" with print_line (the launcher reads the
/// port from it). Returns the process exit code: the chief's when it ended the job (so an srun or
/// sbatch job ends with the chief's code), 128 + the signal after SIGINT or SIGTERM (as a shell
/// reports it), 1 when the server cannot start.
PSCORO_API int run_server(const simple_cluster_resolver& resolver, const std::function<void(server&)>& configure = {},
               server_options options = {});

}  // namespace pscoro

// A worker's input thread: per_worker_iterator::next_async() runs pipelines there, so that a slow
// read or decode never holds the worker's executor (its heartbeats, the chief's requests, other
// closures). One thread per worker: its pipelines share it, as a tf.data runtime shares its
// threads; prefetch gives a pipeline a thread of its own. The worker runs dataset and resource
// functions on another of these, its build thread (worker_service::run_on_build_thread), so that a
// slow build holds up no pipeline.
#include <pscoro/detail/per_worker_values.hpp>

#include <asio/thread_pool.hpp>

namespace pscoro::detail {

struct input_thread::impl {
  asio::thread_pool pool{1};
};

input_thread::input_thread() = default;

input_thread::~input_thread() { stop(); }

std::optional<asio::any_io_executor> input_thread::executor() {
  if (stopped_) return std::nullopt;
  if (!impl_) impl_ = std::make_unique<impl>();
  return impl_->pool.get_executor();
}

void input_thread::stop() noexcept {
  stopped_ = true;
  if (!impl_) return;
  impl_->pool.stop();
  impl_->pool.join();
  impl_.reset();  // what still waited is dropped here, on the caller's (the worker's) thread
}

}  // namespace pscoro::detail

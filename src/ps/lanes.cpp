#include "ps/lanes.hpp"

#include <pscoro/error.hpp>

#include <utility>

namespace pscoro::ps {

lanes::~lanes() {
  self_.reset();  // holds that outlive the lanes do nothing
  fail_all(make_error_code(errc::unavailable));
}

lanes::hold::~hold() {
  if (const auto owner = owner_.lock()) (*owner)->release(key_, epoch_);
}

std::shared_ptr<lanes::hold> lanes::take(const std::string& key) {
  if (!key.empty()) lanes_.try_emplace(key);
  // The empty key's hold finds no lane when released.
  return std::shared_ptr<hold>(new hold(self_, epoch_, key));
}

void lanes::wait(const std::string& key, waiter w) { lanes_[key].push_back(std::move(w)); }

void lanes::release(const std::string& key, std::uint64_t epoch) {
  if (epoch != epoch_) return;  // fail_all() dropped it: one of that name now is another request's
  const auto it = lanes_.find(key);
  if (it == lanes_.end()) return;
  if (it->second.empty()) {
    lanes_.erase(it);
    return;
  }
  // Handed on: the lane stays, so whatever arrives before the next request resumes queues behind it.
  auto next = std::move(it->second.front());
  it->second.pop_front();
  next(std::error_code{});
}

void lanes::fail_all(std::error_code ec) noexcept {
  ++epoch_;
  auto dropped = std::exchange(lanes_, {});
  for (auto& [_, waiting] : dropped) {
    for (auto& w : waiting) w(ec);
  }
}

std::size_t lanes::waiting() const noexcept {
  std::size_t n = 0;
  for (const auto& [_, waiting] : lanes_) n += waiting.size();
  return n;
}

std::string lanes::key_of(const std::string& name, const variable_store& store) const {
  if (const auto* stored = store.find(name)) return stored->slot_of.empty() ? name : stored->slot_of;
  for (auto slash = name.rfind('/'); slash != std::string::npos && slash > 0; slash = name.rfind('/', slash - 1)) {
    std::string prefix = name.substr(0, slash);
    if (lanes_.contains(prefix)) return prefix;
  }
  return name;
}

}  // namespace pscoro::ps

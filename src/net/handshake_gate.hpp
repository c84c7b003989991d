// What strangers may hold of a task that accepts connections (a ps, a worker, the chief's
// announcement listener) before they prove who they are. An accepted connection enters its
// handshake only with a place at the gate, which it keeps until the handshake ends however it
// ends; there is none while the task holds max_connections connections (handshakes included),
// while max_handshakes handshakes are in progress, or while max_handshakes_per_address of them
// come from the same address. A connection without a place is refused with
// errc::resource_exhausted, which a pscoro peer retries. The frames of all handshakes in progress
// grow their buffers from one budget (max_handshake_bytes_total). So silent or large strangers
// hold a small fixed total, and one address cannot take every place. No I/O: tested alone.
#pragma once

#include "wire/frame.hpp"

#include <pscoro/transport_options.hpp>

#include <cstddef>
#include <memory>
#include <string>
#include <unordered_map>
#include <variant>

namespace pscoro::net {

class handshake_gate {
  struct state {
    std::size_t in_progress = 0;
    std::unordered_map<std::string, std::size_t> per_address;  // addresses with a handshake in progress
  };

 public:
  /// A handshake's place; given back when destroyed (it may outlive the gate).
  class place {
   public:
    place(place&& other) noexcept
        : state_(std::move(other.state_)), address_(std::move(other.address_)), budget_(std::move(other.budget_)) {}
    place& operator=(place&& other) noexcept {
      if (this != &other) {
        give_back();
        state_ = std::move(other.state_);
        address_ = std::move(other.address_);
        budget_ = std::move(other.budget_);
      }
      return *this;
    }
    place(const place&) = delete;
    place& operator=(const place&) = delete;
    ~place() { give_back(); }
    /// The budget the handshake's frames grow their buffers from (frame_limits::buffer_budget).
    const std::shared_ptr<wire::byte_budget>& budget() const noexcept { return budget_; }

   private:
    friend class handshake_gate;
    void give_back() noexcept;
    place(std::shared_ptr<state> s, std::string address, std::shared_ptr<wire::byte_budget> budget)
        : state_(std::move(s)), address_(std::move(address)), budget_(std::move(budget)) {}
    std::shared_ptr<state> state_;
    std::string address_;
    std::shared_ptr<wire::byte_budget> budget_;
  };

  /// The gate of `task` ("ps:0"), with the limits of `options`.
  handshake_gate(std::string task, const transport_options& options);

  /// A place for a handshake from `host` (its IP address, no port) while the task holds
  /// `established` connections past their handshakes, or why there is none (for the refusal).
  std::variant<place, std::string> enter(const std::string& host, std::size_t established);

  std::size_t in_progress() const noexcept { return state_->in_progress; }
  std::size_t in_progress_from(const std::string& host) const;
  const wire::byte_budget& budget() const noexcept { return *budget_; }

 private:
  std::string task_;
  std::size_t max_connections_;
  std::size_t max_handshakes_;
  std::size_t max_handshakes_per_address_;
  std::shared_ptr<state> state_ = std::make_shared<state>();
  std::shared_ptr<wire::byte_budget> budget_;
};

}  // namespace pscoro::net

// What each example's chief does once its strategy exists, shared by fashion_mnist, ctr and dlrm.
#pragma once

#include <pscoro/log.hpp>
#include <pscoro/strategy.hpp>

#include <asio/awaitable.hpp>
#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>

#include <fmt/format.h>

#include <exception>
#include <utility>

namespace examples {

// Runs `chief` on `io` to its end and returns its exit code (1, and what it raised printed, when
// it raises). Closing the strategy with that code fails what still waits on the cluster and ends
// the job: the ps and workers exit with the same code.
inline int run_chief_to_end(asio::io_context& io, pscoro::parameter_server_strategy& strategy,
                            asio::awaitable<int> chief) {
  int exit_code = 1;
  asio::co_spawn(io, std::move(chief), [&](std::exception_ptr e, int code) {
    exit_code = code;
    if (e) {
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& failure) {
        pscoro::print_line(fmt::format("chief: {}", failure.what()), pscoro::log_level::error);
      }
      exit_code = 1;
    }
    strategy.close(exit_code);
  });
  io.run();
  return exit_code;
}

}  // namespace examples

// A stranger on the host of a live job: connects to one of its tasks as a chief (or another role)
// of a session of its own, with no secret, a wrong one, or the job's, and, if it gets in, does what
// an attacker would: creates, overwrites and reads the job's weights and runs a worker function.
//
//   stranger ADDRESS TASK [--job chief] [--secret-file FILE] [--tls CERT,KEY,CA]
//
// Prints "refused: <code>: <message>" and exits 0 when the task refuses it; prints what it did and
// exits 3 when it got in.
#include "net/peer.hpp"
#include "net/security.hpp"

#include <pscoro/error.hpp>

#include <asio/co_spawn.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/io_context.hpp>
#include <asio/use_future.hpp>

#include <cstdio>
#include <string>

using namespace pscoro;

namespace {

asio::awaitable<int> intrude(std::string address, std::string task, std::string job, transport_options transport) {
  const auto incarnation = net::new_incarnation();
  const auto hello = net::make_hello({job, 0, incarnation}, incarnation);
  transport.connect_timeout = std::chrono::seconds(5);
  std::shared_ptr<wire::connection> connection;
  try {
    connection = co_await net::connect_to_task(task, address, hello, transport);
  } catch (const error& e) {
    std::printf("refused: %s: %s\n", e.code().message().c_str(), e.what());
    co_return 0;
  }
  connection->start(nullptr, nullptr);
  std::printf("got into %s at %s as %s\n", task.c_str(), address.c_str(), job.c_str());
  auto send = [&](wire::frame request) -> asio::awaitable<std::string> {
    auto [ec, response] =
        co_await connection->async_call(std::move(request), asio::experimental::as_tuple(asio::use_awaitable));
    if (ec) co_return "connection lost";
    co_return response.message.response().status().code() == 0 ? "ok" : response.message.response().status().message();
  };
  wire::frame create;
  auto* c = create.message.mutable_request()->mutable_create_variable();
  c->mutable_variable()->set_name("softmax/weights");
  c->mutable_variable()->set_dtype(1);
  c->mutable_variable()->add_shape(784);
  c->mutable_variable()->add_shape(10);
  c->mutable_initializer()->set_kind(wire::Initializer::ZEROS);
  c->mutable_initializer()->add_full_shape(784);
  c->mutable_initializer()->add_full_shape(10);
  const auto created = co_await send(std::move(create));
  std::printf("create softmax/weights: %s\n", created.c_str());
  wire::frame run;
  run.message.mutable_request()->mutable_run_function()->set_name("fashion_mnist.train_step");
  const auto ran = co_await send(std::move(run));
  std::printf("run fashion_mnist.train_step: %s\n", ran.c_str());
  connection->close("done");
  co_return 3;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: stranger ADDRESS TASK [--job JOB] [--secret-file FILE] [--tls CERT,KEY,CA]\n");
    return 2;
  }
  std::string job = "chief";
  transport_options transport;
  for (int i = 3; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--job") {
      job = argv[i + 1];
    } else if (flag == "--secret-file") {
      transport.auth_secret = net::read_secret_file(argv[i + 1]);
    } else if (flag == "--tls") {
      const std::string files = argv[i + 1];
      const auto first = files.find(','), second = files.rfind(',');
      transport.tls_cert_file = files.substr(0, first);
      transport.tls_key_file = files.substr(first + 1, second - first - 1);
      transport.tls_ca_file = files.substr(second + 1);
    } else {
      std::fprintf(stderr, "stranger: unknown option %s\n", flag.c_str());
      return 2;
    }
  }
  asio::io_context io;
  auto result = asio::co_spawn(io, intrude(argv[1], argv[2], job, transport), asio::use_future);
  io.run();
  return result.get();
}

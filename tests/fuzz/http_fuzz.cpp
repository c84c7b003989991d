// The metrics responder's request side: answer_http on any request head. It must answer every
// input with one of its four statuses, serve something only for GET /metrics, / or /api/cluster,
// and never crash; the
// socket side bounds the head at 8 KiB, so inputs here are any bytes up to that.
#include "metrics/http.hpp"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

namespace {

[[noreturn]] void broken(const char* what, std::string_view input) {
  std::fprintf(stderr, "fuzz invariant broken: %s for %.*s\n", what, static_cast<int>(input.size()), input.data());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view head(reinterpret_cast<const char*>(data), size);
  const auto reply = pscoro::metrics::answer_http(head);
  const auto& s = reply.status;
  if (s != "200 OK" && s != "400 Bad Request" && s != "404 Not Found" && s != "405 Method Not Allowed") {
    broken("an unknown status", head);
  }
  using pscoro::metrics::resource;
  if ((reply.served != resource::none) != (s == "200 OK")) broken("a body without 200, or 200 without one", head);
  if (reply.served == resource::metrics && !head.starts_with("GET /metrics")) broken("the exposition for another request", head);
  if (reply.served == resource::page && !head.starts_with("GET / ") && !head.starts_with("GET /?")) {
    broken("the page for another request", head);
  }
  if (reply.served == resource::cluster && !head.starts_with("GET /api/cluster")) broken("the document for another request", head);
  if (reply.allow_get != (s == "405 Method Not Allowed")) broken("Allow without 405", head);
  return 0;
}

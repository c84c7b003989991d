// The request side of the metrics responder (src/metrics/exposer.cpp), apart so that its answers
// to any request head are tested without sockets.
#pragma once

#include <string>
#include <string_view>

namespace pscoro::metrics {

/// What a 200 answer carries.
enum class resource {
  none,     ///< not a 200: the body says what went wrong
  metrics,  ///< the registry's exposition (GET /metrics)
  page,     ///< the page (GET /)
  cluster,  ///< the page's JSON document (GET /api/cluster)
};

/// What the responder answers to one request head.
struct http_reply {
  std::string_view status;          ///< "200 OK", "404 Not Found", ...
  std::string body;                 ///< for errors: one line saying what is served
  resource served = resource::none; ///< 200: what the body is
  bool allow_get = false;           ///< 405: an Allow header goes with it
};

/// The answer to request head `head` (its request line, then headers, which are not needed):
/// 200 for GET /metrics, GET / and GET /api/cluster (a query string is ignored), 405 for another
/// method, 404 for another path, 400 for anything that is not an HTTP/1.0 or 1.1 request line.
http_reply answer_http(std::string_view head);

}  // namespace pscoro::metrics

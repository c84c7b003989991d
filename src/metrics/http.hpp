// The request side of the metrics responder (src/metrics/exposer.cpp), apart so that its answers
// to any request head are tested without sockets.
#pragma once

#include <string>
#include <string_view>

namespace pscoro::metrics {

/// What the responder answers to one request head.
struct http_reply {
  std::string_view status;  ///< "200 OK", "404 Not Found", ...
  std::string body;         ///< for errors: one line saying what is served
  bool metrics = false;     ///< 200: the body is the registry's exposition
  bool allow_get = false;   ///< 405: an Allow header goes with it
};

/// The answer to request head `head` (its request line, then headers, which are not needed):
/// 200 for GET /metrics (a query string is ignored), 405 for another method, 404 for another path,
/// 400 for anything that is not an HTTP/1.0 or 1.1 request line.
http_reply answer_http(std::string_view head);

}  // namespace pscoro::metrics

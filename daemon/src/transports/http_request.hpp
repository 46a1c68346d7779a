// cuwarden daemon transport: the HTTP/1.x request head, parsed from untrusted bytes.
//
// The daemon serves GET and HEAD only, with no request body, so the parser reads the
// request line and the headers it uses (Connection, Content-Length, Transfer-Encoding,
// Last-Event-ID) and decodes the path and query. Split from the server so that a fuzzer
// reaches it straight.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace cuw::daemon {

struct HttpRequest {
  std::string method;                        ///< as sent ("GET", "HEAD", ...)
  std::string path;                          ///< percent-decoded, without the query
  std::map<std::string, std::string> query;  ///< decoded; a repeated key keeps its last value
  std::string last_event_id;                 ///< Last-Event-ID header ("" if absent)
  std::string host;                          ///< Host header as sent ("" if absent)
  bool keep_alive = true;                    ///< HTTP/1.1 unless "Connection: close"; 1.0 only with keep-alive
};

/// Outcome of parse_http_request().
enum class HttpParse {
  incomplete,  ///< no blank line yet: read more (the caller bounds the head's size)
  ok,          ///< *out is the request; *consumed bytes of `in` were its head
  bad,         ///< *status (400, 413, 414, 501, 505) and *why say what is wrong
};

/// Longest request target accepted (a longer one is answered 414).
inline constexpr std::size_t kMaxRequestTarget = 4096;

/// Parse the request head at the start of `in`. Requests with a body (Content-Length above
/// 0, or Transfer-Encoding) are refused with 413: nothing the daemon serves takes one, and
/// reading none keeps a connection's input bounded by its head. Never throws for any input;
/// pure.
HttpParse parse_http_request(std::string_view in, HttpRequest* out, std::size_t* consumed, int* status,
                             std::string* why);

/// Whether a request's Host header may be served: absent (not a browser), an IP address
/// literal (`127.0.0.1`, `[::1]`, any other: a page can reach those only by that address, so
/// rebinding a name gains nothing), `localhost`, or one of `names` (`--http-host`); each with or
/// without a port, compared without case. Any other name is refused: a web page whose name was
/// rebound to this machine's address would otherwise read the daemon's answers. Pure.
bool host_allowed(std::string_view host, const std::vector<std::string>& names);

/// Decode %XX escapes (and '+' as a space when `plus_is_space`); false on a bad escape or a
/// decoded NUL. Pure.
bool percent_decode(std::string_view in, bool plus_is_space, std::string* out);

}  // namespace cuw::daemon

// cuwarden daemon transport: HTTP request head parser (see http_request.hpp).
#include "transports/http_request.hpp"

#include <arpa/inet.h>

#include <algorithm>
#include <cctype>

#include "base/util.hpp"

namespace cuw::daemon {

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

bool is_token(std::string_view s) {
  if (s.empty()) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
  });
}

HttpParse fail(int code, const char* what, int* status, std::string* why) {
  *status = code;
  *why = what;
  return HttpParse::bad;
}

/// Check the request line (METHOD SP TARGET SP HTTP/x.y) and fill method, keep_alive and
/// *target; HttpParse::ok or bad.
HttpParse request_line(std::string_view line, HttpRequest* out, std::string_view* target_out, int* status,
                       std::string* why) {
  const std::size_t sp1 = line.find(' ');
  const std::size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp1 == std::string_view::npos || sp2 == std::string_view::npos || line.find(' ', sp2 + 1) != std::string_view::npos)
    return fail(400, "malformed request line", status, why);
  const std::string_view method = line.substr(0, sp1), target = line.substr(sp1 + 1, sp2 - sp1 - 1),
                         version = line.substr(sp2 + 1);
  if (!is_token(method)) return fail(400, "malformed method", status, why);
  if (version != "HTTP/1.1" && version != "HTTP/1.0") {
    if (version.substr(0, 5) == "HTTP/") return fail(505, "only HTTP/1.0 and HTTP/1.1 are served", status, why);
    return fail(400, "malformed HTTP version", status, why);
  }
  if (target.size() > kMaxRequestTarget) return fail(414, "request target too long", status, why);
  if (target.empty() || target.front() != '/') return fail(400, "the request target must be a path", status, why);
  for (char c : target)
    if (static_cast<unsigned char>(c) <= 0x20 || c == 0x7f) return fail(400, "control character in the target", status, why);
  out->method = std::string(method);
  out->keep_alive = version == "HTTP/1.1";
  *target_out = target;
  return HttpParse::ok;
}

}  // namespace

bool percent_decode(std::string_view in, bool plus_is_space, std::string* out) {
  out->clear();
  out->reserve(in.size());
  for (std::size_t i = 0; i < in.size(); ++i) {
    char c = in[i];
    if (c == '%') {
      if (i + 2 >= in.size()) return false;
      const int hi = hex_digit(in[i + 1]), lo = hex_digit(in[i + 2]);
      if (hi < 0 || lo < 0) return false;
      c = static_cast<char>(hi * 16 + lo);
      if (c == '\0') return false;
      i += 2;
    } else if (c == '+' && plus_is_space) {
      c = ' ';
    }
    out->push_back(c);
  }
  return true;
}

HttpParse parse_http_request(std::string_view in, HttpRequest* out, std::size_t* consumed, int* status,
                             std::string* why) {
  // The head ends at the first empty line; bare LF line ends are accepted (RFC 9112 2.2).
  std::size_t end = std::string_view::npos, after = 0;
  for (std::size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '\n') continue;
    if (i + 1 < in.size() && in[i + 1] == '\n') {
      end = i + 1, after = i + 2;
      break;
    }
    if (i + 2 < in.size() && in[i + 1] == '\r' && in[i + 2] == '\n') {
      end = i + 1, after = i + 3;
      break;
    }
  }
  if (end == std::string_view::npos) {
    // No blank line yet: wait (the caller bounds the size and the time), unless the request
    // line is complete and already wrong, which is answered at once.
    std::string_view rest = in;
    while (!rest.empty() && (rest.front() == '\r' || rest.front() == '\n')) rest.remove_prefix(1);
    const std::size_t nl = rest.find('\n');
    if (nl == std::string_view::npos) return HttpParse::incomplete;
    std::string_view first = rest.substr(0, nl);
    if (!first.empty() && first.back() == '\r') first.remove_suffix(1);
    HttpRequest probe;
    std::string_view target;
    if (request_line(first, &probe, &target, status, why) == HttpParse::bad) return HttpParse::bad;
    return HttpParse::incomplete;
  }
  *out = HttpRequest{};
  *consumed = after;
  std::string_view head = in.substr(0, end);
  auto next_line = [&head]() {
    const std::size_t nl = head.find('\n');
    std::string_view line = head.substr(0, nl);
    head.remove_prefix(nl == std::string_view::npos ? head.size() : nl + 1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    return line;
  };
  std::string_view line = next_line();
  while (line.empty() && !head.empty()) line = next_line();  // leading empty lines

  std::string_view target;
  if (request_line(line, out, &target, status, why) == HttpParse::bad) return HttpParse::bad;

  const std::size_t q = target.find('?');
  std::string_view path = target.substr(0, q), query = q == std::string_view::npos ? std::string_view{} : target.substr(q + 1);
  if (const std::size_t hash = query.find('#'); hash != std::string_view::npos) query = query.substr(0, hash);
  if (!percent_decode(path, false, &out->path)) return fail(400, "bad percent-escape in the path", status, why);
  while (!query.empty()) {
    const std::size_t amp = query.find('&');
    const std::string_view pair = query.substr(0, amp);
    query.remove_prefix(amp == std::string_view::npos ? query.size() : amp + 1);
    if (pair.empty()) continue;
    const std::size_t eq = pair.find('=');
    std::string k, v;
    if (!percent_decode(pair.substr(0, eq), true, &k) ||
        !percent_decode(eq == std::string_view::npos ? std::string_view{} : pair.substr(eq + 1), true, &v))
      return fail(400, "bad percent-escape in the query", status, why);
    out->query[std::move(k)] = std::move(v);
  }

  bool saw_connection_close = false, saw_keep_alive = false;
  while (!head.empty()) {
    line = next_line();
    if (line.empty()) continue;
    if (line.front() == ' ' || line.front() == '\t') return fail(400, "obsolete header line folding", status, why);
    const std::size_t colon = line.find(':');
    if (colon == std::string_view::npos || !is_token(line.substr(0, colon)))
      return fail(400, "malformed header line", status, why);
    const std::string name = ascii_lower(line.substr(0, colon));
    const std::string_view value = trim(line.substr(colon + 1));
    if (name == "content-length") {
      if (value.empty() || !std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; }))
        return fail(400, "malformed Content-Length", status, why);
      if (value.find_first_not_of('0') != std::string_view::npos)
        return fail(413, "request bodies are not accepted", status, why);
    } else if (name == "transfer-encoding") {
      return fail(413, "request bodies are not accepted", status, why);
    } else if (name == "connection") {
      const std::string v = ascii_lower(value);
      if (v.find("close") != std::string::npos) saw_connection_close = true;
      if (v.find("keep-alive") != std::string::npos) saw_keep_alive = true;
    } else if (name == "last-event-id") {
      out->last_event_id = std::string(value);
    } else if (name == "host") {
      out->host = std::string(value);
    }
  }
  if (saw_connection_close) out->keep_alive = false;
  else if (saw_keep_alive) out->keep_alive = true;
  return HttpParse::ok;
}

bool host_allowed(std::string_view host, const std::vector<std::string>& names) {
  if (host.empty()) return true;
  std::string_view name = host;
  if (name.front() == '[') {  // [v6]:port
    const std::size_t close = name.find(']');
    if (close == std::string_view::npos) return false;
    const std::string v6(name.substr(1, close - 1));
    in6_addr a6{};
    return (close + 1 == name.size() || name[close + 1] == ':') && inet_pton(AF_INET6, v6.c_str(), &a6) == 1;
  }
  if (const std::size_t colon = name.rfind(':'); colon != std::string_view::npos) name = name.substr(0, colon);
  const std::string n = ascii_lower(name);
  in_addr a4{};
  if (inet_pton(AF_INET, n.c_str(), &a4) == 1 || n == "localhost") return true;
  return std::any_of(names.begin(), names.end(), [&](const std::string& allowed) { return ascii_lower(allowed) == n; });
}

}  // namespace cuw::daemon

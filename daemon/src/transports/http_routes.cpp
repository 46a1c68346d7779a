// cuwarden daemon transport: HTTP requests dispatched by path (see http_routes.hpp and
// docs/http.md).
#include "transports/http_routes.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <nlohmann/json.hpp>

#include "base/util.hpp"
#include "commands/table.hpp"

namespace cuw::daemon {

namespace {


constexpr std::size_t kMaxStaticFile = 16u << 20;

template <class J>
std::string http_text(const J& j, int indent = -1) {
  return j.dump(indent, ' ', false, J::error_handler_t::replace);  // ring text may be any bytes
}

HttpResponse error(int status, const std::string& what) {
  HttpResponse r;
  r.status = status;
  r.body = http_text(nlohmann::json{{"error", what}}) + "\n";  // `what` may quote the request's bytes
  return r;
}

const char* content_type_of(const std::string& name) {
  auto ends = [&](std::string_view suf) {
    return name.size() >= suf.size() && name.compare(name.size() - suf.size(), suf.size(), suf) == 0;
  };
  if (ends(".html")) return "text/html; charset=utf-8";
  if (ends(".js") || ends(".mjs")) return "text/javascript; charset=utf-8";
  if (ends(".css")) return "text/css; charset=utf-8";
  if (ends(".json")) return "application/json";
  if (ends(".svg")) return "image/svg+xml";
  if (ends(".png")) return "image/png";
  if (ends(".ico")) return "image/x-icon";
  return "text/plain; charset=utf-8";  // LICENSE and the like
}

bool safe_file_name(const std::string& name) {
  if (name.empty() || name.size() > 128 || !std::isalnum(static_cast<unsigned char>(name[0]))) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_';
  });
}

}  // namespace

bool HttpApi::slow(const HttpRequest& req) {
  const RouteMatch m = match_route(req.path);
  return m.route && m.route->slow;
}

HttpResponse HttpApi::static_file(const std::string& name) const {
  if (opt_.web_root.empty()) return error(404, "the web dashboard is not served (cuwardend --web-root DIR)");
  const std::string path = opt_.web_root + "/" + name;
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);  // a FIFO never blocks
  if (fd < 0) {
    if (name == "index.html")
      return error(404, "the web dashboard is not installed in " + opt_.web_root + " (cuwardend --web-root DIR)");
    return error(404, "no such file: /" + name);
  }
  struct stat st{};
  HttpResponse r;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > static_cast<off_t>(kMaxStaticFile)) {
    ::close(fd);
    return error(404, "no such file: /" + name);
  }
  r.body.resize(static_cast<std::size_t>(st.st_size));
  std::size_t got = 0;
  while (got < r.body.size()) {
    const ssize_t n = ::read(fd, r.body.data() + got, r.body.size() - got);
    if (n <= 0) break;
    got += static_cast<std::size_t>(n);
  }
  ::close(fd);
  r.body.resize(got);
  r.content_type = content_type_of(name);
  return r;
}

HttpResponse HttpApi::events(const HttpRequest& req) const {
  HttpResponse r;
  r.stream = true;
  r.content_type = "text/event-stream; charset=utf-8";
  if (auto it = req.query.find("pid"); it != req.query.end()) {
    r.cursor.pid = parse_pid(it->second);
    if (!r.cursor.pid) return error(400, "pid must be a process id");
  }
  if (auto it = req.query.find("state"); it != req.query.end()) {
    if (it->second != "0" && it->second != "1") return error(400, "state must be 0 or 1");
    r.cursor.state = it->second == "1";
  }
  const uint64_t latest = backend_.store->load()->events_seq;
  r.cursor.last_seq = latest;  // from now on, unless the client says where it stopped
  if (!req.last_event_id.empty()) {
    const auto id = parse_u64(req.last_event_id);
    if (!id) return error(400, "Last-Event-ID must be an event number");
    r.cursor.last_seq = std::min(*id, latest);
  }
  return r;
}

HttpResponse HttpApi::handle(const HttpRequest& req) const {
  const std::string& path = req.path;
  if (const RouteMatch m = match_route(path); m.route && (m.pid || m.route->path.find("{pid}") == std::string::npos)) {
    if (m.route->shows_code && !opt_.snapshots)
      return error(403, "snapshots are not served over HTTP, which cannot tell who asks (they name a program's files and "
                        "functions): start cuwardend with --http-snapshots, or use `cuwarden snapshot PID`");
    const Answer a = m.route->http(backend_, RouteRequest{m.pid, &req.query});
    if (a.status != 200) return error(a.status, a.error);
    HttpResponse r;
    r.content_type = a.content_type;
    r.body = a.body;
    r.headers = a.headers;
    return r;
  }
  if (path == "/api/v1/events") return events(req);
  if (path.rfind("/api/v1/processes/", 0) == 0)
    return error(404, "no such path: " + path + " (expected /api/v1/processes/PID/history or /snapshot)");
  if (path.rfind("/api/", 0) == 0) return error(404, "no such path: " + path + " (see docs/http.md)");
  if (path == "/" || path == "/index.html") return static_file("index.html");
  const std::string name = path.substr(1);
  if (safe_file_name(name)) return static_file(name);
  return error(404, "no such path: " + path);
}

}  // namespace cuw::daemon

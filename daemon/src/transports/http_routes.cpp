// cuwarden daemon transport: the HTTP paths (see http_routes.hpp and docs/http.md).
#include "transports/http_routes.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <nlohmann/json.hpp>

#include "model/snapshots.hpp"
#include "views/events_json.hpp"
#include "views/history_json.hpp"
#include "views/metrics_text.hpp"
#include "views/snapshot_views.hpp"
#include "views/state_json.hpp"

namespace cuw::daemon {

namespace {

using json = nlohmann::json;

constexpr std::size_t kMaxStaticFile = 16u << 20;

template <class J>
std::string dump(const J& j, int indent = -1) {
  return j.dump(indent, ' ', false, J::error_handler_t::replace);  // ring text may be any bytes
}

HttpResponse error(int status, const std::string& what) {
  HttpResponse r;
  r.status = status;
  r.body = dump(json{{"error", what}}) + "\n";  // `what` may quote the request's bytes
  return r;
}

HttpResponse json_response(std::string body) {
  HttpResponse r;
  r.body = std::move(body);
  r.body += '\n';
  return r;
}

std::optional<uint64_t> parse_u64(std::string_view s) {
  if (s.empty() || s.size() > 20 || !std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return std::nullopt;
  uint64_t v = 0;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc{} || p != s.data() + s.size()) return std::nullopt;
  return v;
}

std::optional<uint32_t> parse_pid(std::string_view s) {
  const auto v = parse_u64(s);
  if (!v || *v == 0 || *v > 0x7fffffffULL) return std::nullopt;
  return static_cast<uint32_t>(*v);
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
  const std::string& p = req.path;
  return p.rfind("/api/v1/processes/", 0) == 0 && p.size() > 9 && p.compare(p.size() - 9, 9, "/snapshot") == 0;
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

HttpResponse HttpApi::history(const HttpRequest& req, std::optional<uint32_t> pid) const {
  bool day = false;
  if (auto it = req.query.find("range"); it != req.query.end()) {
    if (it->second == "day") day = true;
    else if (it->second != "hour") return error(400, "range must be hour or day");
  }
  const auto h = series_->copy(day, pid);
  if (!h) return error(404, "no such process: " + std::to_string(*pid));
  return json_response(dump(pid ? process_history_json(*h) : history_json(*h)));
}

HttpResponse HttpApi::snapshot(const HttpRequest& req, uint32_t pid) const {
  if (!opt_.snapshots)
    return error(403, "snapshots are not served over HTTP, which cannot tell who asks (they name a program's files and "
                      "functions): start cuwardend with --http-snapshots, or use `cuwarden snapshot PID`");
  std::string format = "json";
  if (auto it = req.query.find("format"); it != req.query.end()) format = it->second;
  if (format != "json" && format != "text" && format != "pytorch" && format != "perfetto" && format != "summary")
    return error(400, "format must be json, text, pytorch, perfetto or summary");
  std::optional<std::size_t> top;
  if (auto it = req.query.find("top"); it != req.query.end()) {
    const auto v = parse_u64(it->second);
    if (!v || *v == 0 || *v > 100000) return error(400, "top must be a number from 1 to 100000");
    top = static_cast<std::size_t>(*v);
  }
  const auto st = store_->load();
  const ProcessState* p = nullptr;
  for (const ProcessState& ps : st->processes)
    if (ps.pid == pid && (!p || (p->exited && !ps.exited))) p = &ps;
  if (!p) return error(404, "no such process: " + std::to_string(pid));
  TakenSnapshot taken = take_snapshot(ProcessIdentity{ring_dir(st->run_dir, *p), p->pid, p->uid, p->start_time, p->user,
                                                      p->exited, p->ns_pid},
                                      p->header, p->history.get());
  if (symbolize_) symbolize(taken, *symbolize_);
  HttpResponse r;
  r.headers.emplace_back("X-Cuwarden-Exact", taken.snap.exact ? "1" : "0");
  if (format == "json") {
    auto j = snapshot_json(taken.snap);
    if (!taken.live_error.empty()) j["why_not_exact"] = taken.live_error;
    if (!taken.symbols_note.empty()) j["symbols_note"] = taken.symbols_note;
    if (top) {
      // The page's view: the largest call sites and allocations, no trace.
      auto largest = [&](const char* key, const char* by) {
        auto& arr = j[key];
        std::stable_sort(arr.begin(), arr.end(), [by](const auto& a, const auto& b) { return a[by] > b[by]; });
        if (arr.size() > *top) arr.erase(arr.begin() + static_cast<std::ptrdiff_t>(*top), arr.end());
      };
      largest("sites", "live_bytes");
      largest("allocations", "bytes");
      j.erase("trace");
    }
    r.body = dump(j) + "\n";
  } else if (format == "pytorch") {
    r.body = snapshot_pytorch(taken.snap);
    r.content_type = "application/octet-stream";
    r.headers.emplace_back("Content-Disposition", "attachment; filename=\"snapshot-" + std::to_string(pid) + ".pickle\"");
  } else if (format == "perfetto") {
    r.body = snapshot_perfetto(taken.snap);
  } else {
    TextOptions opts;
    if (top) opts.top = *top;
    r.body = format == "text" ? snapshot_text(taken.snap, opts) : summary_text(taken.snap);
    r.content_type = "text/plain; charset=utf-8";
  }
  return r;
}

HttpResponse HttpApi::handle(const HttpRequest& req) const {
  const std::string& path = req.path;
  if (path == "/metrics") {
    HttpResponse r;
    r.content_type = "text/plain; version=0.0.4; charset=utf-8";
    r.body = metrics_text(*store_->load());
    return r;
  }
  if (path == "/api/v1/state") return json_response(dump(state_json(*store_->load())));
  if (path == "/api/v1/history") return history(req, std::nullopt);
  if (path == "/api/v1/events") {
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
    const uint64_t latest = store_->load()->events_seq;
    r.cursor.last_seq = latest;  // from now on, unless the client says where it stopped
    if (!req.last_event_id.empty()) {
      const auto id = parse_u64(req.last_event_id);
      if (!id) return error(400, "Last-Event-ID must be an event number");
      r.cursor.last_seq = std::min(*id, latest);
    }
    return r;
  }
  constexpr std::string_view kProcesses = "/api/v1/processes/";
  if (path.rfind(kProcesses, 0) == 0) {
    const std::string rest = path.substr(kProcesses.size());
    const std::size_t slash = rest.find('/');
    const auto pid = parse_pid(rest.substr(0, slash));
    const std::string what = slash == std::string::npos ? "" : rest.substr(slash + 1);
    if (!pid) return error(404, "no such path: " + path + " (expected /api/v1/processes/PID/history or /snapshot)");
    if (what == "history") return history(req, *pid);
    if (what == "snapshot") return snapshot(req, *pid);
    return error(404, "no such path: " + path + " (expected /api/v1/processes/PID/history or /snapshot)");
  }
  if (path.rfind("/api/", 0) == 0) return error(404, "no such path: " + path + " (see docs/http.md)");
  if (path == "/" || path == "/index.html") return static_file("index.html");
  const std::string name = path.substr(1);
  if (safe_file_name(name)) return static_file(name);
  return error(404, "no such path: " + path);
}

std::string HttpApi::feed(StreamCursor& c, uint64_t mono_now) {
  const uint64_t gen = store_->generation();
  const auto st = store_->load();
  std::string out;
  if (st->events_seq > c.last_seq) {
    json req = {{"after", c.last_seq}, {"max", 10000}};
    if (c.pid) req["pid"] = *c.pid;
    const auto ev = events_json(*st, req);
    for (const auto& e : ev["events"]) {
      out += "id: " + std::to_string(e["seq"].get<uint64_t>()) + "\nevent: memory\ndata: ";
      out += dump(e);
      out += "\n\n";
    }
    c.last_seq = ev["next"].get<uint64_t>();
    if (c.pid && c.last_seq < st->events_seq && ev["events"].empty()) c.last_seq = st->events_seq;
  }
  if (c.state && gen != c.state_generation && (c.state_sent_ns == 0 || mono_now - c.state_sent_ns >= 1'000'000'000ULL)) {
    if (cached_generation_ != gen || cached_state_ != st) {
      cached_state_doc_ = dump(state_json(*st));
      cached_generation_ = gen;
      cached_state_ = st;
    }
    out += "event: state\ndata: " + cached_state_doc_ + "\n\n";
    c.state_generation = gen;
    c.state_sent_ns = mono_now;
  }
  return out;
}

}  // namespace cuw::daemon

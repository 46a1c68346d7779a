// cuwarden daemon commands: the table of commands and routes (see table.hpp).
#include "commands/table.hpp"

#include <algorithm>

#include "base/util.hpp"
#include "commands/handlers.hpp"

namespace cuw::daemon {

namespace {

using nlohmann::json;

/// A key of a checked body: absent and null are alike (protocol.hpp).
bool request_gives(const json& body, const char* key) { return body.contains(key) && !body[key].is_null(); }

std::optional<std::string> param(const RouteRequest& r, const char* key) {
  if (auto it = r.query->find(key); it != r.query->end()) return it->second;
  return std::nullopt;
}

// ---- the socket's entries: arguments from a body that fits the command's kCommands row ----

Answer socket_state(const Backend& b, const Peer&, const json&) { return get_state(b, Via::socket); }

Answer socket_events(const Backend& b, const Peer&, const json& req) { return get_events(b, req); }

Answer socket_limit(const Backend& b, const Peer& peer, const json& req) { return set_limit(b, peer, req); }

Answer socket_suspend(const Backend& b, const Peer& peer, const json& req) {
  return suspend(b, peer, req, SuspendRequest::Action::suspend);
}

Answer socket_resume(const Backend& b, const Peer& peer, const json& req) {
  return suspend(b, peer, req, SuspendRequest::Action::resume);
}

Answer socket_room(const Backend& b, const Peer& peer, const json& req) { return room(b, peer, req); }

Answer socket_snapshot(const Backend& b, const Peer& peer, const json& req) {
  SnapshotArgs a;
  a.pid = req["pid"].get<uint64_t>();
  if (req.contains("format") && req["format"].is_string()) a.format = req["format"].get<std::string>();
  if (req.contains("top") && req["top"].is_number()) a.top = req["top"].get<uint64_t>();
  if (request_gives(req, "oom")) a.oom = req["oom"].get<uint64_t>();
  a.leaks = req.contains("leaks") && req["leaks"].is_number() && req["leaks"].get<uint64_t>() != 0;
  if (request_gives(req, "leak_warmup")) a.leak_warmup_s = req["leak_warmup"].get<uint64_t>();
  a.full = req.contains("full") && req["full"].is_number() && req["full"].get<uint64_t>() != 0;
  if (request_gives(req, "since")) a.since_s = req["since"].get<uint64_t>();
  if (req.contains("by") && req["by"].is_string()) a.by = req["by"].get<std::string>();
  return get_snapshot(b, &peer, a, Via::socket);
}

Answer socket_ooms(const Backend& b, const Peer& peer, const json& req) {
  std::optional<uint32_t> pid;
  if (request_gives(req, "pid")) pid = static_cast<uint32_t>(req["pid"].get<uint64_t>());
  return get_ooms(b, peer, pid);
}

Answer socket_history(const Backend& b, const Peer&, const json& req) {
  HistoryArgs a;
  if (request_gives(req, "pid")) a.pid = req["pid"].get<uint64_t>();
  if (req.contains("range") && req["range"].is_string()) a.range = req["range"].get<std::string>();
  return get_history(b, a, Via::socket);
}

// ---- HTTP's entries: arguments from the path and the query --------------------------------

Answer http_metrics(const Backend& b, const RouteRequest&) { return metrics(b); }

Answer http_state(const Backend& b, const RouteRequest&) { return get_state(b, Via::http); }

Answer http_history(const Backend& b, const RouteRequest& r) {
  HistoryArgs a;
  a.pid = r.pid;
  a.range = param(r, "range");
  return get_history(b, a, Via::http);
}

Answer http_snapshot(const Backend& b, const RouteRequest& r) {
  SnapshotArgs a;
  a.pid = *r.pid;
  a.format = param(r, "format");
  // Not a number: 0, which the handler refuses in the same words as one out of range.
  if (const auto top = param(r, "top")) a.top = parse_u64(*top).value_or(0);
  a.full = param(r, "full").value_or("0") == "1";
  a.by = param(r, "by");
  return get_snapshot(b, nullptr, a, Via::http);
}

constexpr CommandRow kRows[] = {
    {proto::Command::get_state, false, socket_state},
    {proto::Command::get_events, false, socket_events},
    {proto::Command::set_limit, false, socket_limit},
    {proto::Command::get_snapshot, true, socket_snapshot},
    {proto::Command::get_ooms, true, socket_ooms},
    {proto::Command::get_history, false, socket_history},
    {proto::Command::suspend, true, socket_suspend},
    {proto::Command::resume, true, socket_resume},
    {proto::Command::room, true, socket_room},
};

constexpr Route kRoutes[] = {
    {"/metrics", false, false, http_metrics},
    {"/api/v1/state", false, false, http_state},
    {"/api/v1/history", false, false, http_history},
    {"/api/v1/processes/{pid}/history", false, false, http_history},
    {"/api/v1/processes/{pid}/snapshot", true, true, http_snapshot},
};

}  // namespace

const CommandRow* find_command_row(uint16_t number) noexcept {
  for (const CommandRow& r : kRows)
    if (static_cast<uint16_t>(r.command) == number) return &r;
  return nullptr;
}

std::span<const Route> routes() noexcept { return kRoutes; }

RouteMatch match_route(std::span<const Route> table, std::string_view path) noexcept {
  constexpr std::string_view kPid = "{pid}";
  // Segment by segment: a literal segment matches itself only, "{pid}" any one segment. Of
  // the routes that match, the one with the most literal segments wins, so the table's order
  // decides nothing (it request_gives no two routes of one shape).
  RouteMatch best;
  int best_literals = -1;
  for (const Route& r : table) {
    std::string_view a = r.path, b = path, pid_text;
    int literals = 0;
    bool has_pid = false, match = true;
    while (match && (!a.empty() || !b.empty())) {
      if (a.empty() || b.empty() || a[0] != '/' || b[0] != '/') {
        match = false;
        break;
      }
      a.remove_prefix(1);
      b.remove_prefix(1);
      const std::size_t ea = std::min(a.find('/'), a.size()), eb = std::min(b.find('/'), b.size());
      const std::string_view sa = a.substr(0, ea), sb = b.substr(0, eb);
      if (sa == kPid) {
        pid_text = sb;
        has_pid = true;
      } else if (sa == sb) {
        ++literals;
      } else {
        match = false;
      }
      a.remove_prefix(ea);
      b.remove_prefix(eb);
    }
    if (!match || literals <= best_literals) continue;
    best = {&r, has_pid ? parse_pid(pid_text) : std::nullopt};
    best_literals = literals;
  }
  return best;
}

RouteMatch match_route(std::string_view path) noexcept { return match_route(kRoutes, path); }

}  // namespace cuw::daemon

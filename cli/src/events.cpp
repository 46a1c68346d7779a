// cuwarden CLI: `cuwarden events` — recent allocation events, once or following.
#include <csignal>
#include <cstdio>
#include <fmt/format.h>
#include <thread>

#include "client.hpp"
#include "commands.hpp"
#include "cuw/size.hpp"
#include "events.hpp"
#include "json_access.hpp"
#include "table.hpp"

namespace cuw::cli {

using json = nlohmann::ordered_json;

Table events_table() {
  Table t;
  t.columns = {{"TIME", false, false, 0, 12},         {"PID", false, true, 0, 8},
               {"API", false, false, 0, 24},          {"KIND", false, false, 0, 12},
               {"GPU", false, true, 0, 3},            {"BYTES", false, true, 0, 12, true},
               {"ADDRESS", false, true, 0, 18},       {"USED AFTER", false, true, 0, 12},
               {"", false, false, 0, 0}};
  return t;
}

std::vector<Cell> event_row(const json& e) {
  const uint64_t ns = jnum(e, "time_ns");
  const std::string kind = jstr(e, "kind");
  const uint64_t bytes = jnum(e, "bytes");
  const int dev = e.contains("device") && e["device"].is_number_integer() ? e["device"].get<int>() : -1;
  // A change made through the daemon (cuwarden limit, the policy) says by whom, set off by
  // two spaces.
  const std::string by = jstr(e, "api") == "control" && e.contains("by") && e["by"].is_string()
                             ? " by " + e["by"].get<std::string>() +
                                   (jnum(e, "by_pid") ? fmt::format(" (pid {})", jnum(e, "by_pid")) : std::string())
                             : std::string();
  return {Cell::str(local_time(ns, "%H:%M:%S", true)),
          Cell::num(jnum(e, "pid")),
          Cell::str(jstr(e, "api")),
          Cell::str(kind),
          dev < 0 ? Cell::none() : Cell::num(static_cast<uint64_t>(dev)),
          // A limit change carries the new cap; ~0 means "no cap".
          kind == "limit_change" && bytes == ~0ULL ? Cell::str("none") : Cell::bytes(bytes),
          Cell::str(fmt::format("{:#x}", jnum(e, "address"))),
          Cell::bytes(jnum(e, "used_after")),
          Cell::str(by)};
}

namespace {

volatile std::sig_atomic_t g_events_stop = 0;

/// Whether the daemon knows process `pid` (running, or exited and still shown).
bool known_process(const std::string& socket, long long pid, bool* asked) {
  auto st = ask(socket, proto::Command::get_state, json::object());
  *asked = st.has_value();
  if (!st) return false;
  auto it = st->find("processes");
  if (it != st->end() && it->is_array())
    for (const auto& p : *it)
      if (jnum(p, "pid") == static_cast<uint64_t>(pid)) return true;
  return false;
}

}  // namespace

int cmd_events(const EventsOptions& o) {
  json req = {{"max", o.max}};
  if (o.pid >= 0) {
    bool asked = false;
    if (!known_process(o.socket, o.pid, &asked)) {
      if (asked)
        std::fprintf(stderr,
                     "cuwarden events: no process %lld is known to the daemon (running or recently exited; "
                     "`cuwarden` lists them)\n",
                     o.pid);
      return kExitFailure;
    }
    req["pid"] = o.pid;
  }
  if (o.follow) {
    std::signal(SIGINT, [](int) { g_events_stop = 1; });
    std::signal(SIGTERM, [](int) { g_events_stop = 1; });
  }
  const Table table = events_table();
  if (!o.json) std::puts(render_line(table, nullptr).c_str());
  bool waiting = false;  // following, and the daemon went away: wait for the next one
  for (;;) {
    AskError why;
    why.quiet_no_daemon = o.follow;
    auto reply = ask(o.socket, proto::Command::get_events, req, &why);
    if (!reply && o.follow && why.no_daemon) {
      if (!waiting) std::fprintf(stderr, "cuwarden events: the daemon is gone; waiting for it to come back\n");
      waiting = true;
      req.erase("after");  // a new daemon numbers its events afresh: all it has is new
      for (int i = 0; i < 10 && !g_events_stop; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      if (g_events_stop) return kExitOk;
      continue;
    }
    if (!reply) return kExitFailure;
    if (waiting) std::fprintf(stderr, "cuwarden events: the daemon is back\n");
    waiting = false;
    auto it = reply->find("events");
    if (it != reply->end() && it->is_array())
      for (const auto& e : *it) {
        if (o.json) std::puts(e.dump(-1, ' ', false, json::error_handler_t::replace).c_str());
        else {
          const std::vector<Cell> row = event_row(e);
          std::puts(render_line(table, &row).c_str());
        }
      }
    std::fflush(stdout);
    if (!o.follow || g_events_stop) return kExitOk;
    req["after"] = jnum(*reply, "next");
    req["max"] = 10000;
    for (int i = 0; i < 4 && !g_events_stop; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (g_events_stop) return kExitOk;
  }
}

}  // namespace cuw::cli

// cuwarden CLI: `cuwarden events` — recent allocation events, once or following.
#include <csignal>
#include <cstdio>
#include <ctime>
#include <fmt/format.h>
#include <thread>

#include "client.hpp"
#include "commands.hpp"
#include "cuw/size.hpp"

namespace cuw::cli {

using json = nlohmann::ordered_json;

namespace {

volatile std::sig_atomic_t g_stop = 0;

uint64_t num(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number_unsigned() ? it->get<uint64_t>() : 0;
}
std::string str(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

std::string event_line(const json& e) {
  const uint64_t ns = num(e, "time_ns");
  const time_t secs = static_cast<time_t>(ns / 1000000000ULL);
  tm tmv{};
  localtime_r(&secs, &tmv);
  char t[32];
  strftime(t, sizeof t, "%H:%M:%S", &tmv);
  const std::string kind = str(e, "kind");
  const uint64_t bytes = num(e, "bytes");
  // A limit change carries the new cap; ~0 means "no cap".
  const std::string b = (kind == "limit_change" && bytes == ~0ULL) ? "none" : format_bytes(bytes);
  const int dev = e.contains("device") && e["device"].is_number_integer() ? e["device"].get<int>() : -1;
  // A change made through the daemon (cuwarden limit, the policy) says by whom.
  const std::string by = str(e, "api") == "control" && e.contains("by") && e["by"].is_string()
                             ? "  by " + e["by"].get<std::string>() +
                                   (num(e, "by_pid") ? fmt::format(" (pid {})", num(e, "by_pid")) : std::string())
                             : std::string();
  return fmt::format("{}.{:03d} {:>8} {:<24} {:<12} {:>3} {:>12} {:>18} {:>12}", t, (ns / 1000000ULL) % 1000,
                     num(e, "pid"), str(e, "api"), kind, dev < 0 ? std::string("-") : std::to_string(dev), b,
                     fmt::format("{:#x}", num(e, "address")), format_mib(num(e, "used_after"))) +
         by;
}

/// Whether the daemon knows process `pid` (running, or exited and still shown).
bool known_process(const std::string& socket, long long pid, bool* asked) {
  auto st = ask(socket, proto::Command::get_state, json::object());
  *asked = st.has_value();
  if (!st) return false;
  auto it = st->find("processes");
  if (it != st->end() && it->is_array())
    for (const auto& p : *it)
      if (num(p, "pid") == static_cast<uint64_t>(pid)) return true;
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
    std::signal(SIGINT, [](int) { g_stop = 1; });
    std::signal(SIGTERM, [](int) { g_stop = 1; });
  }
  if (!o.json)
    std::printf("%-12s %8s %-24s %-12s %3s %12s %18s %12s\n", "TIME", "PID", "API", "KIND", "GPU", "BYTES", "ADDRESS",
                "USED AFTER");
  bool waiting = false;  // following, and the daemon went away: wait for the next one
  for (;;) {
    AskError why;
    why.quiet_no_daemon = o.follow;
    auto reply = ask(o.socket, proto::Command::get_events, req, &why);
    if (!reply && o.follow && why.no_daemon) {
      if (!waiting) std::fprintf(stderr, "cuwarden events: the daemon is gone; waiting for it to come back\n");
      waiting = true;
      req.erase("after");  // a new daemon numbers its events afresh: all it has is new
      for (int i = 0; i < 10 && !g_stop; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      if (g_stop) return kExitOk;
      continue;
    }
    if (!reply) return kExitFailure;
    if (waiting) std::fprintf(stderr, "cuwarden events: the daemon is back\n");
    waiting = false;
    auto it = reply->find("events");
    if (it != reply->end() && it->is_array())
      for (const auto& e : *it) {
        if (o.json) std::puts(e.dump(-1, ' ', false, json::error_handler_t::replace).c_str());
        else std::puts(event_line(e).c_str());
      }
    std::fflush(stdout);
    if (!o.follow || g_stop) return kExitOk;
    req["after"] = num(*reply, "next");
    req["max"] = 10000;
    for (int i = 0; i < 4 && !g_stop; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (g_stop) return kExitOk;
  }
}

}  // namespace cuw::cli

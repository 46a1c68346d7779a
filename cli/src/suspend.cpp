// cuwarden CLI: `cuwarden suspend PID|job:NAME [--timeout 10s]` and `cuwarden resume
// PID|job:NAME [--gpu N]` — the daemon moves a process's (or each member of a job's) device
// memory to the host through the driver's checkpoint API, and back (with --gpu, onto GPU N). The daemon decides whether the
// caller may (the owner or root) and whether it can be done; this prints the outcome, or the
// refusal with exit status 3.
#include <cstdio>
#include <fmt/format.h>

#include "client.hpp"
#include "commands.hpp"
#include "cuw/size.hpp"

namespace cuw::cli {

using json = nlohmann::ordered_json;

namespace {

int suspend_usage(const SuspendOptions& o, const std::string& msg) {
  std::fprintf(stderr, "cuwarden %s: %s\n", o.resume ? "resume" : "suspend", msg.c_str());
  return kExitUsage;
}

/// "10s", "500ms", "2m", a bare number of seconds: milliseconds, or 0 when not a duration.
uint64_t parse_duration_ms(const std::string& s) {
  std::size_t n = 0;
  double v = 0;
  try {
    v = std::stod(s, &n);
  } catch (const std::exception&) {
    return 0;
  }
  const std::string unit = s.substr(n);
  double ms = unit == "ms" ? v : unit == "s" || unit.empty() ? v * 1000 : unit == "m" || unit == "min" ? v * 60000 : -1;
  return ms >= 1 && ms <= 600000 ? static_cast<uint64_t>(ms) : 0;
}

}  // namespace

int cmd_suspend(const SuspendOptions& o) {
  json req = json::object();
  if (o.target.rfind("job:", 0) == 0) {
    std::string name = o.target.substr(4);
    if (const auto slash = name.find('/'); slash != std::string::npos) {
      const std::string user = name.substr(0, slash);
      name = name.substr(slash + 1);
      if (user.find_first_not_of("0123456789") == std::string::npos && !user.empty() && user.size() <= 10)
        req["user"] = std::stoull(user);
      else
        req["user"] = user;
    }
    if (name.empty()) return suspend_usage(o, "job:NAME needs a job name");
    req["job"] = name;
  } else {
    if (o.target.empty() || o.target.find_first_not_of("0123456789") != std::string::npos || o.target.size() > 10)
      return suspend_usage(o, "'" + o.target + "' is neither a PID nor job:NAME");
    const unsigned long long pid = std::stoull(o.target);
    if (pid == 0 || pid > 0x7fffffff) return suspend_usage(o, "'" + o.target + "' is not a process id");
    req["pid"] = pid;
  }
  if (!o.gpu.empty()) {
    if (!o.resume) return suspend_usage(o, "--gpu goes with resume");
    if (o.gpu.find_first_not_of("0123456789") == std::string::npos) {
      if (o.gpu.size() > 2) return suspend_usage(o, "--gpu '" + o.gpu + "' is neither a GPU index nor a UUID");
      req["gpu"] = std::stoull(o.gpu);
    } else {
      if (o.gpu.size() > 64) return suspend_usage(o, "--gpu '" + o.gpu + "' is neither a GPU index nor a UUID");
      req["gpu"] = o.gpu;
    }
  }
  uint64_t timeout_ms = 10000;
  if (!o.timeout.empty()) {
    if (o.resume) return suspend_usage(o, "--timeout goes with suspend (a lock's timeout)");
    timeout_ms = parse_duration_ms(o.timeout);
    if (timeout_ms == 0) return suspend_usage(o, "--timeout '" + o.timeout + "' is not a duration from 1ms to 10m (e.g. 10s, 500ms)");
    req["timeout_ms"] = timeout_ms;
  }
  AskError why;
  // The daemon answers once the driver is done: each member's lock at most timeout_ms, then
  // the copies (seconds per ten GiB).
  auto reply = ask(o.socket, o.resume ? proto::Command::resume : proto::Command::suspend, req, &why,
                   static_cast<int>(timeout_ms * 4 + 600'000));
  if (!reply) return why.refused ? kExitRefused : kExitFailure;
  if (o.json) {
    std::puts(reply->dump(2).c_str());
    return kExitOk;
  }
  const json& r = *reply;
  if (r.value("target", "") == "job")
    std::printf("job %s: %s\n", r.value("job", "").c_str(), o.resume ? "resumed" : "suspended");
  for (const auto& p : r.value("processes", json::array())) {
    const uint64_t bytes = p.value("device_bytes", uint64_t{0});
    if (o.resume && p.contains("to_gpu"))
      std::printf("pid %llu (%s): resumed onto GPU %llu (%s) from GPU %llu (%s), %s on the device in %.2f s\n",
                  static_cast<unsigned long long>(p.value("pid", uint64_t{0})), p.value("process_name", "").c_str(),
                  static_cast<unsigned long long>(p["to_gpu"].value("index", uint64_t{0})),
                  p["to_gpu"].value("uuid", "").c_str(),
                  static_cast<unsigned long long>(p["from_gpu"].value("index", uint64_t{0})),
                  p["from_gpu"].value("uuid", "").c_str(), format_bytes(bytes).c_str(), p.value("seconds", 0.0));
    else if (o.resume)
      std::printf("pid %llu (%s): resumed, %s back on the device in %.2f s\n",
                  static_cast<unsigned long long>(p.value("pid", uint64_t{0})), p.value("process_name", "").c_str(),
                  format_bytes(bytes).c_str(), p.value("seconds", 0.0));
    else
      std::printf("pid %llu (%s): suspended, %s of device memory on the host in %.2f s\n",
                  static_cast<unsigned long long>(p.value("pid", uint64_t{0})), p.value("process_name", "").c_str(),
                  format_bytes(bytes).c_str(), p.value("seconds", 0.0));
  }
  return kExitOk;
}

}  // namespace cuw::cli

// cuwarden CLI: `cuwarden limit PID|job:NAME|job:USER/NAME SIZE [--device N]` — change the
// cap of a running process or job. The daemon decides whether the caller may (peer
// credentials: root anything; others only lower their own) and applies it; this prints the
// outcome, or the refusal with exit status 3.
#include <cstdio>
#include <map>
#include <fmt/format.h>

#include "client.hpp"
#include "commands.hpp"
#include "cuw/size.hpp"

namespace cuw::cli {

using json = nlohmann::ordered_json;

namespace {

int limit_usage(const std::string& msg) {
  std::fprintf(stderr, "cuwarden limit: %s\n", msg.c_str());
  return kExitUsage;
}

std::string cap_text(const json& j) {
  return j.is_number_unsigned() ? format_bytes(j.get<uint64_t>()) : std::string("none");
}

/// The GPU number `cuwarden` shows for each of process `pid`'s CUDA ordinals (empty if the
/// daemon does not answer: the caller then names the ordinal).
std::map<int, int> gpu_numbers(const std::string& socket, uint64_t pid) {
  std::map<int, int> out;
  AskError quiet;
  quiet.quiet_no_daemon = true;
  auto st = ask(socket, proto::Command::get_state, json::object(), &quiet);
  if (!st) return out;
  for (const auto& p : st->value("processes", json::array()))
    if (p.value("pid", uint64_t{0}) == pid)
      for (const auto& d : p.value("devices", json::array())) out[d.value("ordinal", -1)] = d.value("gpu_index", -1);
  return out;
}

}  // namespace

int cmd_limit(const LimitOptions& o) {
  json req = json::object();
  bool job = false;
  if (o.target.rfind("job:", 0) == 0) {
    job = true;
    std::string name = o.target.substr(4);
    std::string user = o.user;
    if (const auto slash = name.find('/'); slash != std::string::npos) {
      if (!user.empty()) return limit_usage("give the job's user once: job:USER/NAME or --user USER");
      user = name.substr(0, slash);
      name = name.substr(slash + 1);
    }
    if (name.empty()) return limit_usage("job:NAME needs a job name");
    req["job"] = name;
    if (!user.empty()) {
      if (user.find_first_not_of("0123456789") == std::string::npos && user.size() <= 10)
        req["user"] = std::stoull(user);
      else
        req["user"] = user;
    }
    if (o.device >= 0) return limit_usage("--device goes with a PID: a job's cap is one size for every GPU it uses");
  } else {
    if (o.target.empty() || o.target.find_first_not_of("0123456789") != std::string::npos || o.target.size() > 10)
      return limit_usage("'" + o.target + "' is neither a PID nor job:NAME");
    const unsigned long long pid = std::stoull(o.target);
    if (pid == 0 || pid > 0x7fffffff) return limit_usage("'" + o.target + "' is not a process id");
    req["pid"] = pid;
    if (!o.user.empty()) return limit_usage("--user goes with job:NAME");
    if (o.device >= 0) {
      // --device is the GPU number `cuwarden` shows; the daemon takes the process's own
      // CUDA ordinal of that GPU (they differ under CUDA_VISIBLE_DEVICES).
      auto st = ask(o.socket, proto::Command::get_state, json::object());
      if (!st) return kExitFailure;
      std::string used;
      int ordinal = -1;
      for (const auto& p : st->value("processes", json::array())) {
        if (p.value("pid", uint64_t{0}) != pid) continue;
        for (const auto& d : p.value("devices", json::array())) {
          used += (used.empty() ? "" : ", ") + std::to_string(d.value("gpu_index", -1));
          if (d.value("gpu_index", -1) == o.device) ordinal = d.value("ordinal", -1);
        }
      }
      if (ordinal < 0) {
        std::fprintf(stderr, "cuwarden limit: pid %llu does not use GPU %d%s\n", pid, o.device,
                     used.empty() ? " (no GPU in use, or no such process)" : (" (it uses GPU " + used + ")").c_str());
        return kExitFailure;
      }
      req["device"] = ordinal;
    }
  }
  if (!job && o.size.find_first_of("=,") != std::string::npos)
    return limit_usage("'" + o.size + "' is a cap per device, as `cuwarden run --limit` takes it; `cuwarden limit` sets one "
                 "GPU at a time: cuwarden limit " + o.target + " SIZE --device N (N as `cuwarden` numbers the GPU)");
  if (o.size == "none" || o.size == "unlimited") {
    req["bytes"] = nullptr;
  } else {
    std::string err;
    auto spec = parse_cap(o.size, !job, &err);
    if (!spec) return limit_usage("bad size '" + o.size + "': " + err + (job && o.size.find('%') != std::string::npos
                                                                         ? " (a job's cap is one size for all its GPUs)"
                                                                         : ""));
    if (spec->percent) req["share"] = spec->share;
    else req["bytes"] = spec->bytes;
  }

  AskError why;
  auto reply = ask(o.socket, proto::Command::set_limit, req, &why);
  if (!reply) return why.refused ? kExitRefused : kExitFailure;
  if (o.json) {
    std::puts(reply->dump(2).c_str());
    return kExitOk;
  }
  if (reply->value("target", "") == "job") {
    const json& r = *reply;
    std::printf("job %s (user %s, %zu member%s): cap %s -> %s\n", r.value("job", "").c_str(), r.value("user", "").c_str(),
                r.value("members", json::array()).size(), r.value("members", json::array()).size() == 1 ? "" : "s",
                cap_text(r.value("old_limit", json())).c_str(), cap_text(r.value("new_limit", json())).c_str());
    for (const auto& g : r.value("gpus", json::array())) {
      const json cap = g.value("new_limit_bytes", json());  // null: the cap was removed
      if (cap.is_number_unsigned() && g.value("used_bytes", uint64_t{0}) > cap.get<uint64_t>())
        std::printf("  %s: %s in use, above the new cap: new allocations are refused until use drops\n",
                    g.value("uuid", "").c_str(), format_bytes(g.value("used_bytes", uint64_t{0})).c_str());
    }
    return kExitOk;
  }
  const json& r = *reply;
  const auto gpu_of = gpu_numbers(o.socket, r.value("pid", uint64_t{0}));
  for (const auto& c : r.value("changes", json::array())) {
    const int ordinal = c.value("device", -1);
    const auto g = gpu_of.find(ordinal);
    std::printf("pid %llu (%s) GPU %s: cap %s -> %s\n", static_cast<unsigned long long>(r.value("pid", uint64_t{0})),
                r.value("process_name", "").c_str(),
                g != gpu_of.end() ? std::to_string(g->second).c_str() : ("ordinal " + std::to_string(ordinal)).c_str(),
                cap_text(c.value("old_limit", json())).c_str(), cap_text(c.value("new_limit", json())).c_str());
    const json nl = c.value("new_limit", json());
    const uint64_t used = c.value("used_bytes", uint64_t{0});
    if (nl.is_number_unsigned() && used > nl.get<uint64_t>())
      std::printf("  %s in use, above the new cap: new allocations are refused until use drops\n",
                  format_bytes(used).c_str());
  }
  return kExitOk;
}

}  // namespace cuw::cli

// cuwarden daemon view: out-of-memory reports (oom_json.hpp).
#include "views/oom_json.hpp"

#include <algorithm>
#include <map>

#include "cuw/ring.hpp"

namespace cuw::daemon {

namespace {
bool cuda_library(const std::string& module) {
  const std::size_t slash = module.rfind('/');
  const std::string base = slash == std::string::npos ? module : module.substr(slash + 1);
  return base.rfind("libcuda.", 0) == 0 || base.rfind("libcudart", 0) == 0 || base.rfind("libcuwarden", 0) == 0;
}
}  // namespace

std::string site_line(const Snapshot& s, uint32_t id) {
  const SnapSite* site = s.site(id);
  if (!site || site->frames.empty()) return "(no call site)";
  for (const SnapFrame& f : site->frames)
    if (f.python) return f.file + ":" + std::to_string(f.line) + " in " + f.function;
  const SnapFrame* first = nullptr;
  for (const SnapFrame& f : site->frames) {
    if (!first) first = &f;
    if (cuda_library(f.module)) continue;
    first = &f;
    break;
  }
  std::string line = first->function.empty() ? "??" : first->function;
  if (!first->file.empty()) line += " (" + first->file + ":" + std::to_string(first->line) + ")";
  else if (!first->module.empty()) line += " (" + first->module + ")";
  return line;
}

nlohmann::ordered_json oom_json(const OomReport& r, const Snapshot& named, std::size_t index, std::size_t top) {
  nlohmann::ordered_json j;
  const ring::Event& e = r.event.e;
  j["pid"] = r.pid;
  j["process_name"] = r.process_name;
  j["user"] = r.user;
  j["time_ns"] = e.time_ns;
  j["kind"] = ring::kind_name(e.kind);
  j["api"] = ring::api_name(e.api);
  j["device"] = e.device;
  j["bytes"] = e.bytes;
  uint64_t cap = ring::kNoLimit;
  if (e.kind == static_cast<uint8_t>(ring::EventKind::job_refuse)) {
    cap = e.aux;
  } else {
    for (const SnapDevice& d : named.devices)
      if (d.ordinal == e.device) cap = d.get(counters::Id::limit);
  }
  j["cap_bytes"] = cap == ring::kNoLimit ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(cap);
  j["used_after"] = e.used_after;
  j["result"] = e.result;
  j["asked_at"] = e.site ? nlohmann::ordered_json(site_line(named, e.site)) : nlohmann::ordered_json(nullptr);
  j["exact"] = named.exact;
  j["index"] = index;
  std::map<uint32_t, std::pair<uint64_t, uint64_t>> by_site;
  for (const SnapAlloc& a : named.allocations) {
    if (a.kind == SnapKind::host || a.device != e.device) continue;
    auto& t = by_site[a.site];
    t.first += a.bytes;
    ++t.second;
  }
  std::vector<std::pair<uint32_t, std::pair<uint64_t, uint64_t>>> v(by_site.begin(), by_site.end());
  std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  nlohmann::ordered_json sites = nlohmann::ordered_json::array();
  for (std::size_t i = 0; i < v.size() && i < top; ++i)
    sites.push_back({{"live_bytes", v[i].second.first},
                     {"live_allocations", v[i].second.second},
                     {"frame", v[i].first ? site_line(named, v[i].first) : "(call sites off)"}});
  j["sites"] = std::move(sites);
  return j;
}

}  // namespace cuw::daemon

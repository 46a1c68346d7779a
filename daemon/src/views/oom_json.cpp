// cuwarden daemon view: out-of-memory reports (oom_json.hpp).
#include "views/oom_json.hpp"

#include <algorithm>
#include <map>
#include <vector>

#include "cuw/ring.hpp"
#include "cuw/text.hpp"
#include "views/detail/snapshot.hpp"

namespace cuw::daemon {

nlohmann::ordered_json oom_json(const OomReport& r, const Snapshot& named, std::size_t index, std::size_t top,
                                const frames::Rules* rules) {
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
  // The sites this report names, told apart among them (cuw/frames.hpp).
  std::vector<const SnapSite*> named_sites;
  auto add = [&](uint32_t id) {
    if (const SnapSite* st = named.site(id))
      if (std::find(named_sites.begin(), named_sites.end(), st) == named_sites.end()) named_sites.push_back(st);
  };
  if (e.site) add(e.site);
  for (std::size_t i = 0; i < v.size() && i < top; ++i) add(v[i].first);
  const auto labels = snapshot_detail::site_labels(named_sites, snapshot_detail::rules_or_builtin(rules));
  auto line = [&](uint32_t id) -> std::string {
    auto l = labels.find(id);
    return l == labels.end() ? std::string("(no call site)") : cuw::printable(l->second.one_line());
  };
  j["asked_at"] = e.site ? nlohmann::ordered_json(line(e.site)) : nlohmann::ordered_json(nullptr);
  nlohmann::ordered_json sites = nlohmann::ordered_json::array();
  for (std::size_t i = 0; i < v.size() && i < top; ++i)
    sites.push_back({{"live_bytes", v[i].second.first},
                     {"live_allocations", v[i].second.second},
                     {"frame", v[i].first ? line(v[i].first) : "(call sites off)"}});
  j["sites"] = std::move(sites);
  return j;
}

}  // namespace cuw::daemon

// cuwarden daemon view: call sites grouped by what the user sees (see snapshot_views.hpp).
#include <map>
#include <string>
#include <vector>

#include "views/detail/snapshot.hpp"
#include "views/snapshot_views.hpp"

namespace cuw::daemon {

using namespace snapshot_detail;

namespace {
/// What a site shows its user: its user frames' printed texts in calling order; without any,
/// the head the presenter names it by (an operator, "(backward) MmBackward0"). Empty: a site
/// without frames, which is merged with none.
std::string user_key(const SnapSite& site, const frames::Rules& rules) {
  if (site.frames.empty()) return {};
  std::vector<frames::Frame> fs;
  fs.reserve(site.frames.size());
  for (const SnapFrame& f : site.frames) fs.push_back(present(f, rules));
  std::string key;
  for (std::size_t i : frames::calling_order(fs)) {
    if (fs[i].cls != frames::Class::user) continue;
    key += fs[i].text;
    key += '\n';
  }
  if (!key.empty()) return "u\n" + key;
  return "h\n" + frames::label_sites({fs}).front().head;
}
}  // namespace

std::map<uint32_t, uint32_t> merge_sites_by_user_frames(Snapshot& s, const frames::Rules* rules_in) {
  const frames::Rules& rules = rules_or_builtin(rules_in);
  std::map<std::string, uint32_t> first;  // key -> the smallest id with it
  std::map<uint32_t, uint32_t> to;
  for (const SnapSite& site : s.sites) {
    if (site.id == 0) continue;
    const std::string key = user_key(site, rules);
    if (key.empty()) continue;
    auto [it, fresh] = first.emplace(key, site.id);
    if (!fresh && site.id < it->second) {  // sites are by id, but do not rely on it
      to[it->second] = site.id;
      it->second = site.id;
    } else if (!fresh) {
      to[site.id] = it->second;
    }
  }
  for (auto& [from, into] : to)  // a chain left by an unsorted list: follow it to its end
    while (to.count(into)) into = to.at(into);
  remap_sites(s, to);
  return to;
}

void remap_sites(Snapshot& s, const std::map<uint32_t, uint32_t>& to) {
  if (to.empty()) return;
  auto map = [&](uint32_t id) {
    auto it = to.find(id);
    return it == to.end() ? id : it->second;
  };
  for (SnapAlloc& a : s.allocations) a.site = map(a.site);
  for (SnapEvent& e : s.trace) e.site = map(e.site);
  std::erase_if(s.sites, [&](const SnapSite& site) { return to.count(site.id) != 0; });
}

}  // namespace cuw::daemon

// cuwarden daemon view: the call sites whose live bytes changed between two samples of one
// process, as memory_viz's compare shows them (see snapshot_views.hpp).
#include <algorithm>
#include <map>
#include <stdexcept>
#include <set>
#include <string>
#include <vector>

#include "base/util.hpp"
#include "cuw/size.hpp"
#include "views/detail/snapshot.hpp"
#include "views/pickle.hpp"
#include "views/snapshot_views.hpp"

namespace cuw::daemon {

using json = nlohmann::ordered_json;
using namespace snapshot_detail;

namespace {

std::string signed_bytes(const SiteChange& c) {
  return (c.after >= c.before ? "+" : "-") + format_bytes(c.after >= c.before ? c.after - c.before : c.before - c.after);
}

std::map<uint32_t, frames::Label> change_labels(const std::vector<SiteChange>& list, const frames::Rules& rules) {
  std::vector<const SnapSite*> v;
  for (const SiteChange& c : list)
    if (c.site != 0) v.push_back(&c.frames);
  return site_labels(v, rules);
}

}  // namespace

std::vector<SiteChange> changed_sites(const Snapshot& then, const Snapshot& now) {
  if (then.pid != now.pid) throw std::invalid_argument("samples of different processes");
  const auto a = site_totals(then), b = site_totals(now);
  std::set<uint32_t> ids;
  for (const auto& [id, t] : a) ids.insert(id);
  for (const auto& [id, t] : b) ids.insert(id);
  std::vector<SiteChange> out;
  for (uint32_t id : ids) {
    SiteChange c;
    c.site = id;
    if (auto it = a.find(id); it != a.end()) c.before = it->second.bytes, c.count_before = it->second.count;
    if (auto it = b.find(id); it != b.end()) c.after = it->second.bytes, c.count_after = it->second.count;
    if (c.before == c.after) continue;
    // The newest names the site, else the older sample (a site whose memory is all freed).
    if (const SnapSite* st = now.site(id)) c.frames = *st;
    else if (const SnapSite* old = then.site(id)) c.frames = *old;
    c.frames.id = id;
    out.push_back(std::move(c));
  }
  std::stable_sort(out.begin(), out.end(), [](const SiteChange& x, const SiteChange& y) {
    const uint64_t dx = x.after > x.before ? x.after - x.before : x.before - x.after;
    const uint64_t dy = y.after > y.before ? y.after - y.before : y.before - y.after;
    return dx > dy;
  });
  return out;
}

json since_json(const Snapshot& then, const Snapshot& now, const frames::Rules* rules_in) {
  const frames::Rules& rules = rules_or_builtin(rules_in);
  const auto list = changed_sites(then, now);
  const auto labels = change_labels(list, rules);
  json sites = json::array();
  for (const SiteChange& c : list) {
    json fr = json::array();
    for (const SnapFrame& f : c.frames.frames) fr.push_back(frame_json(f, rules));
    auto l = labels.find(c.site);
    sites.push_back({{"site", c.site},
                     {"label", l != labels.end() ? pickle::valid_utf8(l->second.one_line()) : std::string("(no call site)")},
                     {"before_bytes", c.before},
                     {"after_bytes", c.after},
                     {"before_count", c.count_before},
                     {"after_count", c.count_after},
                     {"frames", std::move(fr)}});
  }
  return {{"pid", now.pid}, {"from_ns", then.time_ns}, {"to_ns", now.time_ns}, {"sites", std::move(sites)}};
}

std::string since_text(const Snapshot& then, const Snapshot& now, const TextOptions& opts) {
  std::string out = "Call sites of pid " + std::to_string(now.pid) + " (" + printable(process_name(now.comm, now.cmdline)) +
                    ") whose live device memory changed over " + duration(sat_sub(now.time_ns, then.time_ns)) + " (" +
                    utc(then.time_ns) + " to " + utc(now.time_ns) + "):\n";
  if (!then.exact || !now.exact) return out + "  Unknown: the live records of a sample could not be read.\n";
  const auto list = changed_sites(then, now);
  if (list.empty()) return out + "  None.\n";
  const frames::Rules& rules = rules_or_builtin(opts.rules);
  const auto labels = change_labels(list, rules);
  for (std::size_t i = 0; i < list.size() && i < opts.top; ++i) {
    const SiteChange& c = list[i];
    out += "  " + signed_bytes(c) + "  (" + format_bytes(c.before) + " -> " + format_bytes(c.after) + ", " +
           std::to_string(c.count_before) + " -> " + std::to_string(c.count_after) + " allocations)  ";
    auto l = labels.find(c.site);
    if (c.site == 0 || l == labels.end()) {
      out += c.site == 0 ? "(no call site captured)\n" : "site " + std::to_string(c.site) + "\n      (frames unknown)\n";
      continue;
    }
    out += "site " + std::to_string(c.site) + "\n";
    for (const std::string& line : site_lines(c.frames, l->second, rules, opts.full)) out += "      " + line + "\n";
  }
  if (list.size() > opts.top) out += "  ... and " + std::to_string(list.size() - opts.top) + " more\n";
  return out;
}

}  // namespace cuw::daemon

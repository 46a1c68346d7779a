// cuwarden daemon view: the call sites whose live bytes only grew across snapshots (see
// snapshot_views.hpp).
#include "views/snapshot_views.hpp"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <ctime>
#include <map>
#include <set>
#include <stdexcept>
#include <string_view>
#include <utility>

#include "base/util.hpp"
#include "cuw/ring.hpp"
#include "cuw/size.hpp"
#include "cuw/text.hpp"
#include "views/counters_json.hpp"
#include "views/pickle.hpp"
#include "views/detail/snapshot.hpp"

namespace cuw::daemon {

using json = nlohmann::ordered_json;
using namespace snapshot_detail;

namespace {

struct LeakWindow {
  std::vector<const Snapshot*> used;  ///< the last opts.window exact snapshots after the warm-up, oldest first
  std::size_t skipped = 0;            ///< not exact
  std::size_t warming = 0;            ///< taken during the warm-up
  std::size_t usable = 0;             ///< exact and after the warm-up (used: the last of them)
  LeakOptions opts;
};

LeakWindow leak_window(const std::vector<Snapshot>& snaps, const LeakOptions& opts) {
  LeakWindow w;
  w.opts = opts;
  std::vector<const Snapshot*> exact;
  uint64_t first = UINT64_MAX;  // the process's first allocation the snapshots know of
  for (const Snapshot& s : snaps) {
    if (s.pid != snaps.front().pid) throw std::invalid_argument("snapshots of different processes");
    if (!s.exact) {
      ++w.skipped;
      continue;
    }
    exact.push_back(&s);
    for (const SnapAlloc& a : s.allocations)
      if (a.time_ns) first = std::min(first, a.time_ns);
    for (const SnapEvent& e : s.trace)
      if (e.kind == static_cast<uint8_t>(ring::EventKind::alloc) && e.time_ns) first = std::min(first, e.time_ns);
  }
  std::stable_sort(exact.begin(), exact.end(), [](const Snapshot* a, const Snapshot* b) { return a->time_ns < b->time_ns; });
  const uint64_t start = first == UINT64_MAX ? 0 : first + std::min(opts.warmup_ns, UINT64_MAX - first);
  std::vector<const Snapshot*> after;
  for (const Snapshot* s : exact) {
    if (s->time_ns >= start) after.push_back(s);
    else ++w.warming;
  }
  w.usable = after.size();
  const std::size_t keep = std::min(after.size(), std::max<std::size_t>(opts.window, 2));
  w.used.assign(after.end() - static_cast<std::ptrdiff_t>(keep), after.end());
  return w;
}

std::vector<LeakSuspect> suspects(const LeakWindow& w) {
  std::vector<LeakSuspect> out;
  if (w.used.size() < std::max<std::size_t>(w.opts.window, 2)) return out;
  std::vector<std::map<uint32_t, SiteTotal>> per;
  std::set<uint32_t> ids;
  for (const Snapshot* s : w.used) {
    per.push_back(site_totals(*s));
    for (const auto& [id, t] : per.back()) ids.insert(id);
  }
  for (uint32_t id : ids) {
    LeakSuspect l;
    l.site = id;
    bool grows = true;
    for (std::size_t i = 0; i < per.size(); ++i) {
      auto it = per[i].find(id);
      const uint64_t b = it != per[i].end() ? it->second.bytes : 0;
      if (!l.bytes.empty() && b < l.bytes.back()) grows = false;
      l.bytes.push_back(b);
    }
    const uint64_t need = std::max<uint64_t>(w.opts.min_growth,
                                             static_cast<uint64_t>(static_cast<double>(l.bytes.back()) * w.opts.min_share));
    if (!grows || l.bytes.back() <= l.bytes.front() || l.bytes.back() - l.bytes.front() < need) continue;
    auto f = per.front().find(id), b = per.back().find(id);
    l.first_count = f != per.front().end() ? f->second.count : 0;
    l.last_count = b != per.back().end() ? b->second.count : 0;
    if (const SnapSite* st = w.used.back()->site(id)) l.frames = *st;
    l.frames.id = id;
    out.push_back(std::move(l));
  }
  std::stable_sort(out.begin(), out.end(), [](const LeakSuspect& a, const LeakSuspect& b) { return a.growth() > b.growth(); });
  return out;
}

}  // namespace

std::vector<LeakSuspect> growing_sites(const std::vector<Snapshot>& snaps, const LeakOptions& opts) {
  if (snaps.empty()) return {};
  return suspects(leak_window(snaps, opts));
}

namespace {
/// The suspects' printed forms, told apart among them.
std::map<uint32_t, frames::Label> suspect_labels(const std::vector<LeakSuspect>& list, const frames::Rules& rules) {
  std::vector<const SnapSite*> v;
  for (const LeakSuspect& l : list)
    if (l.site != 0) v.push_back(&l.frames);
  return site_labels(v, rules);
}
}  // namespace

json leaks_json(const std::vector<Snapshot>& snaps, const frames::Rules* rules_in, const LeakOptions& opts) {
  const frames::Rules& rules = rules_or_builtin(rules_in);
  LeakWindow w = snaps.empty() ? LeakWindow{} : leak_window(snaps, opts);
  w.opts = opts;
  json sites = json::array();
  const auto list = suspects(w);
  const auto labels = suspect_labels(list, rules);
  for (const LeakSuspect& l : list) {
    json frames = json::array();
    for (const SnapFrame& f : l.frames.frames) frames.push_back(frame_json(f, rules));
    auto lab = labels.find(l.site);
    sites.push_back({{"site", l.site},
                     {"label", lab != labels.end() ? pickle::valid_utf8(lab->second.one_line()) : std::string("(no call site)")},
                     {"growth_bytes", l.growth()},
                     {"bytes", l.bytes},
                     {"first_count", l.first_count},
                     {"last_count", l.last_count},
                     {"frames", std::move(frames)}});
  }
  return {{"pid", snaps.empty() ? json(nullptr) : json(snaps.front().pid)},
          {"snapshots", w.used.size()},
          {"skipped", w.skipped},
          {"warming", w.warming},
          {"warmup_ns", opts.warmup_ns},
          {"window", opts.window},
          {"first_ns", w.used.empty() ? json(nullptr) : json(w.used.front()->time_ns)},
          {"last_ns", w.used.empty() ? json(nullptr) : json(w.used.back()->time_ns)},
          {"sites", std::move(sites)}};
}

std::string leaks_text(const std::vector<Snapshot>& snaps, const TextOptions& opts, const LeakOptions& leak) {
  if (snaps.empty()) return "No snapshot to compare.\n";
  const LeakWindow w = leak_window(snaps, leak);
  std::string out;
  const Snapshot& last = w.used.empty() ? snaps.front() : *w.used.back();
  out += "Call sites of pid " + std::to_string(last.pid) + " (" + printable(process_name(last.comm, last.cmdline)) +
         ") whose live device memory grew by max(" + format_bytes(leak.min_growth) + ", " +
         std::to_string(static_cast<int>(leak.min_share * 100 + 0.5)) + "%) or more, never falling,";
  if (w.used.size() >= 2)
    out += " over " + duration(w.used.back()->time_ns - w.used.front()->time_ns) + " (" + std::to_string(w.used.size()) +
           " snapshots, " + utc(w.used.front()->time_ns) + " to " + utc(w.used.back()->time_ns) + ")";
  out += ":\n";
  if (w.skipped)
    out += "  (" + std::to_string(w.skipped) + " snapshot" + (w.skipped == 1 ? "" : "s") +
           " left out: live records not readable)\n";
  if (w.warming)
    out += "  (" + std::to_string(w.warming) + " sample" + (w.warming == 1 ? "" : "s") + " of the warm-up left out: the " +
           duration(leak.warmup_ns) + " after the first allocation, --leak-warmup)\n";
  if (w.used.size() < std::max<std::size_t>(leak.window, 2))
    return out + "  Needs " + std::to_string(std::max<std::size_t>(leak.window, 2)) +
           " samples with live records after the warm-up (" + std::to_string(w.usable) + " so far).\n";
  const auto list = suspects(w);
  if (list.empty()) return out + "  None.\n";
  const frames::Rules& rules = rules_or_builtin(opts.rules);
  const auto labels = suspect_labels(list, rules);
  for (std::size_t i = 0; i < list.size() && i < opts.top; ++i) {
    const LeakSuspect& l = list[i];
    out += "  +" + format_bytes(l.growth()) + "  (" + format_bytes(l.bytes.front()) + " -> " + format_bytes(l.bytes.back()) +
           ", " + std::to_string(l.first_count) + " -> " + std::to_string(l.last_count) + " allocations)  ";
    if (l.site == 0) {
      out += "(no call site captured)\n";
      continue;
    }
    out += "site " + std::to_string(l.site) + "\n";
    auto lab = labels.find(l.site);
    if (lab == labels.end()) {
      out += "      (frames unknown)\n";
      continue;
    }
    for (const std::string& line : site_lines(l.frames, lab->second, rules, opts.full)) out += "      " + line + "\n";
  }
  if (list.size() > opts.top) out += "  ... and " + std::to_string(list.size() - opts.top) + " more\n";
  return out;
}

}  // namespace cuw::daemon

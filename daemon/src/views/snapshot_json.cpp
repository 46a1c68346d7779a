// cuwarden daemon view: a Snapshot as JSON (see snapshot_views.hpp).
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

json snapshot_json(const Snapshot& s, const frames::Rules* rules_in) {
  const frames::Rules& rules = rules_or_builtin(rules_in);
  const auto labels = site_labels(s, rules);
  std::map<int, SiteTotal> per_device;
  uint64_t host_bytes = 0, host_count = 0;
  json allocations = json::array();
  for (const SnapAlloc& a : s.allocations) {
    if (a.kind == SnapKind::host) {
      host_bytes += a.bytes;
      ++host_count;
    } else {
      SiteTotal& t = per_device[a.device];
      t.bytes += a.bytes;
      ++t.count;
    }
    allocations.push_back({{"address", a.address},
                           {"bytes", a.bytes},
                           {"device", a.device},
                           {"stream", a.stream},
                           {"time_ns", a.time_ns},
                           {"age_ns", sat_sub(s.time_ns, a.time_ns)},
                           {"site", a.site},
                           {"api", ring::api_name(a.api)},
                           {"kind", kind_name(a.kind)}});
  }
  json devices = json::array();
  for (const SnapDevice& d : s.devices) {
    json dev = {{"ordinal", d.ordinal},
                {"uuid", pickle::valid_utf8(d.uuid)},
                {"name", pickle::valid_utf8(d.name)},
                {"memory_total_bytes", d.total}};
    // As the state JSON writes them, but as the process left them: a snapshot of an exited
    // process is about what it held.
    put_counters(dev, counters::kDevice, d.counters, false);
    auto t = per_device.find(d.ordinal);
    dev["live_bytes"] = t != per_device.end() ? t->second.bytes : 0;
    dev["live_allocations"] = t != per_device.end() ? t->second.count : 0;
    devices.push_back(std::move(dev));
  }
  json segments = json::array();
  for (const SnapSegment& g : s.segments)
    segments.push_back({{"address", g.address}, {"bytes", g.bytes}, {"device", g.device}});
  const auto totals = site_totals(s);
  json sites = json::array();
  std::vector<const SnapSite*> by_id;
  for (const SnapSite& st : s.sites) by_id.push_back(&st);
  std::sort(by_id.begin(), by_id.end(), [](const SnapSite* a, const SnapSite* b) { return a->id < b->id; });
  for (const SnapSite* st : by_id) {
    json frames = json::array();
    for (const SnapFrame& f : st->frames) frames.push_back(frame_json(f, rules));
    auto t = totals.find(st->id);
    auto l = labels.find(st->id);
    const bool labelled = l != labels.end();
    // The label's parts, so that a page prints (and a flame graph folds) as the text does
    // without redoing the presenter: the head, the frames that tell the site apart, the
    // frames in calling order.
    json via = json::array(), order = json::array();
    if (labelled)
      for (const frames::Via& v : l->second.via)
        via.push_back({{"frame", v.frame}, {"skipped", v.skipped}, {"text", pickle::valid_utf8(v.text)}});
    std::vector<frames::Frame> presented;
    presented.reserve(st->frames.size());
    for (const SnapFrame& f : st->frames) presented.push_back(present(f, rules));
    for (std::size_t i : frames::calling_order(presented)) order.push_back(i);
    sites.push_back({{"id", st->id},
                     {"live_bytes", t != totals.end() ? t->second.bytes : 0},
                     {"live_allocations", t != totals.end() ? t->second.count : 0},
                     {"label", labelled ? pickle::valid_utf8(l->second.one_line()) : std::string("(no call site)")},
                     {"label_head", labelled ? pickle::valid_utf8(l->second.head) : std::string("(no call site)")},
                     {"label_folded", labelled ? pickle::valid_utf8(l->second.folded_text) : std::string()},
                     {"label_via", std::move(via)},
                     {"head_frame", labelled ? l->second.head_frame : -1},
                     {"calling_order", std::move(order)},
                     {"frames", std::move(frames)}});
  }
  json trace = json::array();
  for (const SnapEvent& e : s.trace)
    trace.push_back({{"time_ns", e.time_ns},
                     {"kind", ring::kind_name(e.kind)},
                     {"api", ring::api_name(e.api)},
                     {"device", e.device},
                     {"address", e.address},
                     {"bytes", e.bytes},
                     {"used_after", e.used_after},
                     {"stream", e.stream},
                     {"aux", e.aux},
                     {"site", e.site},
                     {"result", e.result}});
  return {{"pid", s.pid},
          {"process_name", pickle::valid_utf8(process_name(s.comm, s.cmdline))},
          {"comm", pickle::valid_utf8(s.comm)},
          {"cmdline", pickle::valid_utf8(s.cmdline)},
          {"user", pickle::valid_utf8(s.user)},
          {"job", pickle::valid_utf8(s.job)},
          {"pool", pickle::valid_utf8(s.pool)},
          {"time_ns", s.time_ns},
          {"exited", s.exited},
          {"exact", s.exact},
          {"events_dropped", s.events_dropped},
          {"callsite_frames", s.callsite_frames},
          {"devices", std::move(devices)},
          {"host", {{"bytes", host_bytes}, {"allocations", host_count}}},
          {"allocations", std::move(allocations)},
          {"segments", std::move(segments)},
          {"sites", std::move(sites)},
          {"segments_note", pickle::valid_utf8(segments_note(s))},
          {"trace", std::move(trace)}};
}

}  // namespace cuw::daemon

// cuwarden daemon view: a Snapshot as a Chrome trace for Perfetto (see snapshot_views.hpp).
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

std::string snapshot_perfetto(const Snapshot& s) {
  // One process track (the snapshot's pid), one thread for its instants.
  const uint32_t pid = s.pid;
  json events = json::array();
  auto us = [](uint64_t ns) { return ns / 1000; };
  auto counter = [&](int device, const char* what, uint64_t ns, uint64_t value) {
    events.push_back({{"name", "GPU " + std::to_string(device) + " " + what},
                      {"ph", "C"},
                      {"ts", us(ns)},
                      {"pid", pid},
                      {"tid", pid},
                      {"args", {{"bytes", value}}}});
  };
  std::map<int, const SnapDevice*> devs;
  for (const SnapDevice& d : s.devices) devs[d.ordinal] = &d;
  std::set<int> seen;
  for (const SnapEvent& e : s.trace)
    if (e.device >= 0 && e.device < static_cast<int>(ring::kMaxDevices) &&
        e.kind != static_cast<uint8_t>(ring::EventKind::host_alloc) &&
        e.kind != static_cast<uint8_t>(ring::EventKind::host_free))
      seen.insert(e.device);
  for (const auto& [o, d] : devs) seen.insert(o);
  const bool pools = pooling(s);

  for (int d : seen) {
    const auto found = devs.find(d);
    const SnapDevice* dev = found != devs.end() ? found->second : nullptr;
    const uint64_t total = dev ? dev->total : 0;
    // A cap of "none" is drawn at the device's memory: what the process may use then.
    auto cap_value = [&](uint64_t c) { return c == ring::kNoLimit ? total : c; };
    std::vector<const SnapEvent*> evs;
    for (const SnapEvent& e : s.trace)
      if (e.device == d && e.kind != static_cast<uint8_t>(ring::EventKind::host_alloc) &&
          e.kind != static_cast<uint8_t>(ring::EventKind::host_free))
        evs.push_back(&e);

    // used: each event's used_after (a job refusal's is the other members', not ours).
    uint64_t last_used = ~0ULL;
    for (const SnapEvent* e : evs) {
      if (e->kind == static_cast<uint8_t>(ring::EventKind::job_refuse)) continue;
      if (e->used_after == last_used) continue;
      counter(d, "used", e->time_ns, e->used_after);
      last_used = e->used_after;
    }
    // reserved: known at snapshot time only. A pool's moves at its segment events, so it is
    // walked back through them; without a pool every allocation is its own driver memory and
    // reserved moves with used (the same offset as now at each event).
    if (dev) {
      std::vector<std::pair<uint64_t, uint64_t>> points;  // ns, bytes, newest first
      const uint64_t reserved_now = dev->get(counters::Id::reserved), used_now = dev->get(counters::Id::used);
      uint64_t r = reserved_now;
      for (std::size_t i = evs.size(); i-- > 0;) {
        const SnapEvent& e = *evs[i];
        if (e.kind == static_cast<uint8_t>(ring::EventKind::job_refuse)) continue;
        if (pools) {
          points.emplace_back(e.time_ns, r);
          if (e.kind == static_cast<uint8_t>(ring::EventKind::segment_alloc)) r = sat_sub(r, e.bytes);
          else if (e.kind == static_cast<uint8_t>(ring::EventKind::segment_free)) r += e.bytes;
        } else {
          points.emplace_back(e.time_ns, sat_sub(reserved_now + e.used_after, used_now));
        }
      }
      uint64_t last = ~0ULL;
      for (auto it = points.rbegin(); it != points.rend(); ++it) {
        if (it->second == last) continue;
        counter(d, "reserved", it->first, it->second);
        last = it->second;
      }
    }
    // cap: from the first change's previous cap (when carried) or today's cap with no change
    // in the history, then at each change.
    {
      const SnapEvent* first_change = nullptr;
      for (const SnapEvent* e : evs)
        if (e->kind == static_cast<uint8_t>(ring::EventKind::limit_change)) {
          first_change = e;
          break;
        }
      const uint64_t start_ns = evs.empty() ? s.time_ns : evs.front()->time_ns;
      if (!first_change && dev) counter(d, "cap", start_ns, cap_value(dev->get(counters::Id::limit)));
      else if (first_change && first_change->aux != 0) counter(d, "cap", start_ns, cap_value(first_change->aux));
      for (const SnapEvent* e : evs)
        if (e->kind == static_cast<uint8_t>(ring::EventKind::limit_change))
          counter(d, "cap", e->time_ns, cap_value(e->bytes));
    }
    // Snapshot time: every series from the counters.
    if (dev) {
      counter(d, "used", s.time_ns, dev->get(counters::Id::used));
      counter(d, "reserved", s.time_ns, dev->get(counters::Id::reserved));
      counter(d, "cap", s.time_ns, cap_value(dev->get(counters::Id::limit)));
    }
  }

  // Instants: refusals and cap changes.
  auto cap_json = [](uint64_t v) { return v == ring::kNoLimit ? json(nullptr) : json(v); };
  for (const SnapEvent& e : s.trace) {
    const auto kind = static_cast<ring::EventKind>(e.kind);
    const std::string gpu = "GPU " + std::to_string(e.device);
    json args;
    std::string name;
    if (kind == ring::EventKind::refuse || kind == ring::EventKind::job_refuse ||
        (kind == ring::EventKind::driver_error && !is_free_api(e.api))) {
      name = (kind == ring::EventKind::refuse       ? "refused by the cap: "
              : kind == ring::EventKind::job_refuse ? "refused by the job's cap: "
                                                    : "the driver refused: ") +
             format_bytes(e.bytes) + " on " + gpu;
      args = {{"device", e.device}, {"bytes", e.bytes}, {"api", ring::api_name(e.api)}, {"result", e.result}};
      if (kind == ring::EventKind::job_refuse) {
        args["job_others_bytes"] = e.used_after;
        if (e.aux) args["job_limit_bytes"] = cap_json(e.aux);
      } else {
        args["used_bytes"] = e.used_after;
      }
      if (e.site) {
        const auto shown = frames_to_show(s.site(e.site), 1);
        if (!shown.empty()) args["site"] = pickle::valid_utf8(frame_text(*shown.front()));
      }
    } else if (kind == ring::EventKind::limit_change) {
      name = "cap on " + gpu + ": " + cap_text(e.bytes);
      args = {{"device", e.device}, {"new_limit_bytes", cap_json(e.bytes)}};
      if (e.aux) args["old_limit_bytes"] = cap_json(e.aux);
    } else {
      continue;
    }
    events.push_back({{"name", pickle::valid_utf8(name)},
                      {"cat", "cuwarden"},
                      {"ph", "i"},
                      {"s", "p"},
                      {"ts", us(e.time_ns)},
                      {"pid", pid},
                      {"tid", pid},
                      {"args", std::move(args)}});
  }

  std::stable_sort(events.begin(), events.end(),
                   [](const json& a, const json& b) { return a["ts"].get<uint64_t>() < b["ts"].get<uint64_t>(); });
  // Metadata first, at the first timestamp (a 0 would stretch the timeline back to 1970).
  const uint64_t t0 = events.empty() ? us(s.time_ns) : events.front()["ts"].get<uint64_t>();
  const std::string pname = pickle::valid_utf8(process_name(s.comm, s.cmdline));
  json meta = json::array();
  meta.push_back({{"name", "process_name"}, {"ph", "M"}, {"ts", t0}, {"pid", pid}, {"tid", pid},
                  {"args", {{"name", pname + " (cuwarden pid " + std::to_string(pid) + ")"}}}});
  meta.push_back({{"name", "thread_name"}, {"ph", "M"}, {"ts", t0}, {"pid", pid}, {"tid", pid},
                  {"args", {{"name", "GPU memory"}}}});
  for (auto& e : events) meta.push_back(std::move(e));

  json doc = {{"traceEvents", std::move(meta)},
              {"displayTimeUnit", "ms"},
              {"otherData",
               {{"producer", "cuwarden"},
                {"pid", pid},
                {"process_name", pname},
                {"pool", pickle::valid_utf8(s.pool)},
                {"snapshot_time_ns", s.time_ns},
                {"events_dropped", s.events_dropped}}}};
  return doc.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace cuw::daemon

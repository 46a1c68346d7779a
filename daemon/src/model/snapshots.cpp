// cuwarden daemon model: taking and naming a process's Snapshot (snapshots.hpp).
#include "model/snapshots.hpp"

#include <algorithm>
#include <map>
#include <unordered_map>

#include "base/util.hpp"
#include "cuw/live.hpp"
#include "cuw/ring.hpp"

namespace cuw::daemon {

namespace {

SnapKind kind_of(live::Table t, uint16_t api) {
  switch (t) {
    case live::Table::pooled: return SnapKind::pooled;
    case live::Table::host: return SnapKind::host;
    case live::Table::handles:
      return api == static_cast<uint16_t>(ring::Api::cuMemCreate) ? SnapKind::handle : SnapKind::array;
    default: return SnapKind::device;
  }
}

}  // namespace

TakenSnapshot take_snapshot(const ProcessIdentity& who, const RingSnapshot& header, const EventHistory::View* history,
                            std::size_t max_trace) {
  TakenSnapshot t;
  t.uid = who.uid;
  t.start_time = who.start_time;
  Snapshot& s = t.snap;
  s.pid = who.pid;
  s.user = who.user;
  s.exited = who.exited;
  s.comm = field_text(header.comm, sizeof header.comm);
  s.cmdline = field_text(header.cmdline, sizeof header.cmdline);
  s.job = field_text(header.job, sizeof header.job);
  s.pool = field_text(header.pool, sizeof header.pool);
  s.time_ns = now_ns();
  s.events_dropped = header.events_dropped;
  const uint32_t n = std::min<uint32_t>(header.device_count, ring::kMaxDevices);
  for (uint32_t d = 0; d < ring::kMaxDevices; ++d) {
    const DeviceSnapshot& ds = header.devices[d];
    if (!ds.present && d >= n) continue;
    if (!ds.present) continue;
    SnapDevice sd;
    sd.ordinal = static_cast<int>(d);
    sd.uuid = format_uuid(ds.uuid);
    sd.name = field_text(ds.name, sizeof ds.name);
    sd.total = ds.physical_total;
    const auto v = ds.values();
    std::copy(v.begin(), v.end(), sd.counters.begin());
    s.devices.push_back(std::move(sd));
  }

  // The live records.
  live::Contents c;
  const uint32_t file_pid = who.file_pid ? who.file_pid : who.pid;
  const std::string path = who.run_dir + "/" + live::file_name(file_pid, who.start_time);
  if (!live::read_file(path, static_cast<long>(who.uid), &c, &t.live_error)) {
    s.exact = false;
  } else if (c.pid != file_pid || c.start_time != who.start_time) {
    s.exact = false;
    t.live_error = path + ": written by another process than the ring's";
  } else {
    s.exact = !c.incomplete;
    if (c.incomplete) t.live_error = "the process could not store every record (memory or file limit)";
    s.callsite_frames = c.callsite_frames;
    for (const live::Record& r : c.records) {
      if (r.table == live::Table::segments) {
        s.segments.push_back(SnapSegment{r.key, r.bytes, r.device});
        continue;
      }
      s.allocations.push_back(
          SnapAlloc{r.key, r.bytes, r.device, r.stream, r.time_ns, r.site, r.api, kind_of(r.table, r.api)});
    }
    std::sort(s.allocations.begin(), s.allocations.end(),
              [](const SnapAlloc& a, const SnapAlloc& b) { return a.address < b.address; });
    std::sort(s.segments.begin(), s.segments.end(),
              [](const SnapSegment& a, const SnapSegment& b) { return a.address < b.address; });
    for (const live::Module& m : c.modules) t.modules.push_back(ModuleInfo{m.start, m.end, m.bias, m.path, m.build_id});
    std::unordered_map<uint32_t, const live::Code*> codes;
    for (const live::Code& code : c.codes) codes[code.id] = &code;
    for (const live::Site& site : c.sites) {
      SnapSite ss;
      ss.id = site.id;
      // Python frames are the user's code: the innermost Python frame is where their line
      // is. Native frames first (innermost), then the Python stack (innermost first), as
      // the process recorded them; views choose what to show first.
      for (uint64_t pc : site.native) {
        SnapFrame f;
        f.pc = pc;
        ss.frames.push_back(std::move(f));
      }
      for (uint64_t py : site.python) {
        SnapFrame f;
        f.python = true;
        f.line = static_cast<uint32_t>(py & 0xffffffffU);
        if (auto it = codes.find(static_cast<uint32_t>(py >> 32)); it != codes.end()) {
          f.file = it->second->file;
          f.function = it->second->function;
        }
        ss.frames.push_back(std::move(f));
      }
      s.sites.push_back(std::move(ss));
    }
    // By id (Snapshot::site() searches them so): the log's order already, unless hostile.
    std::sort(s.sites.begin(), s.sites.end(), [](const SnapSite& a, const SnapSite& b) { return a.id < b.id; });
  }

  // The trace: the newest events the daemon kept.
  if (history) {
    std::vector<SnapEvent> all;
    history->for_each_after(0, [&](const StoredEvent& ev) {
      if (ev.by_uid != StoredEvent::kFromProcess && ev.e.api != static_cast<uint16_t>(ring::Api::control)) return;
      SnapEvent e;
      e.time_ns = ev.e.time_ns;
      e.kind = ev.e.kind;
      e.api = ev.e.api;
      e.device = ev.e.device;
      e.address = ev.e.address;
      e.bytes = ev.e.bytes;
      e.used_after = ev.e.used_after;
      e.aux = ev.e.aux;
      const bool stream_ordered = ev.e.api == static_cast<uint16_t>(ring::Api::cuMemAllocAsync) ||
                                  ev.e.api == static_cast<uint16_t>(ring::Api::cuMemAllocFromPoolAsync) ||
                                  ev.e.api == static_cast<uint16_t>(ring::Api::cuMemFreeAsync);
      e.stream = stream_ordered ? ev.e.aux : 0;
      e.site = ev.e.site;
      e.result = ev.e.result;
      all.push_back(e);
    });
    if (all.size() > max_trace) all.erase(all.begin(), all.end() - static_cast<std::ptrdiff_t>(max_trace));
    s.trace = std::move(all);
  }
  // Sites named by trace events only (freed since) are in the log as well: nothing to add.
  return t;
}

Snapshot site_sample(const Snapshot& s) {
  Snapshot out;
  out.pid = s.pid;
  out.comm = s.comm;
  out.time_ns = s.time_ns;
  out.exact = s.exact;
  out.exited = s.exited;
  out.callsite_frames = s.callsite_frames;
  out.devices = s.devices;
  std::map<std::pair<uint32_t, uint8_t>, SnapAlloc> by;
  for (const SnapAlloc& a : s.allocations) {
    auto [it, fresh] = by.try_emplace({a.site, static_cast<uint8_t>(a.kind)}, a);
    if (fresh) continue;  // the first record of its site stands for itself
    it->second.bytes += a.bytes;
    it->second.count += a.count;
  }
  for (auto& [k, a] : by) out.allocations.push_back(a);
  out.sites = s.sites;  // kept for the frames of the newest; small next to the records
  return out;
}

}  // namespace cuw::daemon

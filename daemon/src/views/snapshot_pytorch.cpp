// cuwarden daemon view: a Snapshot as PyTorch's snapshot pickle (see snapshot_views.hpp).
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

/// A site's frames as PyTorch writes them: {name, filename, line}, innermost first (its
/// CapturedTraceback order: the C++ frames from the allocator up, the Python frames where the
/// interpreter runs them; here the native frames the interposer captured, then the Python ones).
void torch_frames(pickle::Writer& w, const Snapshot& s, uint32_t site_id) {
  w.begin_list();
  if (const SnapSite* site = site_id ? s.site(site_id) : nullptr) {
    for (const SnapFrame& f : site->frames) {
      w.begin_dict();
      w.str("name");
      w.str(f.function.empty() ? "??" : f.function);
      w.str("filename");
      w.str(!f.file.empty() ? f.file : !f.module.empty() ? f.module : "??");
      w.str("line");
      w.uinteger(f.line);
      w.end_dict();
    }
  }
  w.end_list();
}

void kv(pickle::Writer& w, const char* k, uint64_t v) {
  w.str(k);
  w.uinteger(v);
}

void kv(pickle::Writer& w, const char* k, const std::string& v) {
  w.str(k);
  w.str(v);
}

}  // namespace

std::string snapshot_pytorch(const Snapshot& s) {
  const TorchModel m = torch_model(s);
  pickle::Writer w;
  w.begin_dict();

  // Keys as torch/csrc/cuda/memory_snapshot.cpp (_memory_snapshot_pickled) writes them.
  w.str("segments");
  w.begin_list();
  for (const TSegment& g : m.segments) {
    w.begin_dict();
    w.str("device");
    w.integer(g.device);
    kv(w, "address", g.address);
    kv(w, "total_size", g.size);
    kv(w, "allocated_size", g.allocated());
    kv(w, "active_size", g.allocated());  // no block waits for its stream here: all active are allocated
    kv(w, "requested_size", g.requested());
    kv(w, "stream", g.stream);
    kv(w, "segment_type", std::string(g.large ? "large" : "small"));
    w.str("segment_pool_id");
    w.pair(0, 0);  // PyTorch's default pool
    w.str("is_expandable");
    w.boolean(false);
    w.str("frames");
    torch_frames(w, s, g.pool ? 0 : g.site);
    w.str("blocks");
    w.begin_list();
    for (const TBlock& b : g.blocks) {
      w.begin_dict();
      kv(w, "address", b.address);
      kv(w, "size", b.size);
      kv(w, "requested_size", b.requested);
      kv(w, "state", std::string(b.active ? "active_allocated" : "inactive"));
      w.str("frames");
      torch_frames(w, s, b.active ? b.site : 0);
      w.end_dict();
    }
    w.end_list();
    w.end_dict();
  }
  w.end_list();

  w.str("device_traces");
  w.begin_list();
  for (const auto& trace : m.traces) {
    w.begin_list();
    for (const TEntry& e : trace) {
      w.begin_dict();
      kv(w, "action", std::string(action_name(e.action)));
      // An oom entry carries device_free instead of addr, as PyTorch writes it.
      if (e.action == Action::oom) kv(w, "device_free", e.device_free);
      else kv(w, "addr", e.addr);
      kv(w, "size", e.size);
      kv(w, "stream", e.stream);
      kv(w, "time_us", e.time_ns / 1000);
      kv(w, "compile_context", std::string("N/A"));
      kv(w, "user_metadata", std::string());
      w.str("frames");
      torch_frames(w, s, e.site);
      w.end_dict();
    }
    w.end_list();
  }
  w.end_list();

  uint64_t host_bytes = 0, host_count = 0;
  for (const SnapAlloc& a : s.allocations)
    if (a.kind == SnapKind::host) host_bytes += a.bytes, ++host_count;
  // memory_viz shows these in its "Allocator Settings" tab.
  w.str("allocator_settings");
  w.begin_dict();
  kv(w, "allocator", std::string("cuwarden"));
  kv(w, "pool", s.pool.empty() ? std::string("off") : s.pool);
  kv(w, "pid", s.pid);
  kv(w, "process_name", process_name(s.comm, s.cmdline));
  kv(w, "snapshot_time_us", s.time_ns / 1000);
  w.str("live_records_exact");
  w.boolean(s.exact);
  kv(w, "events_dropped", s.events_dropped);
  w.str("trace_alloc_overflowed");
  w.boolean(s.events_dropped > 0);
  kv(w, "trace_entries_left_out", m.left_out);
  kv(w, "allocations_left_out", m.unplaced);
  kv(w, "host_bytes", host_bytes);
  kv(w, "host_allocations", host_count);
  kv(w, "callsite_frames", s.callsite_frames);
  w.end_dict();

  w.str("external_annotations");
  w.begin_list();
  w.end_list();

  w.end_dict();
  return w.finish();
}

}  // namespace cuw::daemon

// cuwarden daemon view: a Snapshot in each format (see snapshot_views.hpp). Sections: shared
// helpers; the PyTorch model (segments tiled by blocks, device traces), shared by the pickle
// and the summary; text; JSON; pickle; Perfetto; summary; leaks.
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

namespace cuw::daemon {

using json = nlohmann::ordered_json;

namespace {

constexpr uint64_t kMiB = 1ULL << 20;
/// PyTorch's split between its small and large pools (memory_stats: "size >= 1MB"; its
/// _snapshot docstring: segment_type 'large' (>1MB)); cuwarden's cache splits the same way.
constexpr uint64_t kSmallMax = kMiB;
constexpr uint32_t kCudaErrorOutOfMemory = 2;  // CUDA_ERROR_OUT_OF_MEMORY

// ---- shared helpers -------------------------------------------------------------------------

/// Untrusted text for a terminal (cuw/text.hpp): valid UTF-8, C0 and C1 controls as '?'.
std::string printable(std::string_view s) { return cuw::printable(s); }

std::string hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%" PRIx64, v);
  return buf;
}

/// "850 ms", "12.3 s", "4 min 05 s", "2 h 03 min".
std::string duration(uint64_t ns) {
  char buf[48];
  const uint64_t ms = ns / 1000000;
  if (ms < 1000) std::snprintf(buf, sizeof buf, "%" PRIu64 " ms", ms);
  else if (ms < 60000) std::snprintf(buf, sizeof buf, "%.1f s", static_cast<double>(ms) / 1000.0);
  else if (ms < 3600000) std::snprintf(buf, sizeof buf, "%" PRIu64 " min %02" PRIu64 " s", ms / 60000, ms / 1000 % 60);
  else std::snprintf(buf, sizeof buf, "%" PRIu64 " h %02" PRIu64 " min", ms / 3600000, ms / 60000 % 60);
  return buf;
}

/// CLOCK_REALTIME ns as "2026-12-01 23:58:09 UTC".
std::string utc(uint64_t ns) {
  const time_t t = static_cast<time_t>(ns / 1000000000ULL);
  struct tm tm {};
  gmtime_r(&t, &tm);
  char buf[40];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

const char* kind_name(SnapKind k) {
  switch (k) {
    case SnapKind::device: return "device";
    case SnapKind::pooled: return "pooled";
    case SnapKind::handle: return "handle";
    case SnapKind::array: return "array";
    case SnapKind::host: return "host";
  }
  return "unknown";
}

bool is_free_api(uint16_t api) {
  switch (static_cast<ring::Api>(api)) {
    case ring::Api::cuMemFree:
    case ring::Api::cuMemFreeAsync:
    case ring::Api::cuMemRelease:
    case ring::Api::cuArrayDestroy:
    case ring::Api::cuMipmappedArrayDestroy:
    case ring::Api::cuMemFreeHost: return true;
    default: return false;
  }
}

bool pooling(const Snapshot& s) { return s.pool == "cache" || s.pool == "vmm"; }

std::string_view base_name(std::string_view path) {
  const auto slash = path.rfind('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

/// One frame as `function (file:line)`; a native frame without a line shows its module and
/// offset instead, which is what a person can feed to addr2line.
std::string frame_text(const SnapFrame& f) {
  std::string fn = f.function.empty() ? "??" : printable(f.function);
  if (!f.file.empty()) return fn + " (" + printable(f.file) + ":" + std::to_string(f.line) + ")";
  if (!f.module.empty()) return fn + " (" + printable(base_name(f.module)) + "+" + hex(f.offset) + ")";
  return fn + " (" + hex(f.pc) + ")";
}

/// cuwarden's own frames and the CUDA libraries' sit innermost in every native stack and
/// say nothing about which code asked: the text views skip them.
bool runtime_frame(const SnapFrame& f) {
  if (f.python) return false;
  const std::string_view m = base_name(f.module);
  return m.rfind("libcuwarden", 0) == 0 || m.rfind("libcuda.", 0) == 0 || m.rfind("libcudart", 0) == 0;
}

/// The frames a person reads first: Python frames (innermost first), then the native ones
/// past the runtime's, at most `max`.
std::vector<const SnapFrame*> frames_to_show(const SnapSite* site, std::size_t max) {
  std::vector<const SnapFrame*> out;
  if (!site) return out;
  for (const SnapFrame& f : site->frames)
    if (f.python && out.size() < max) out.push_back(&f);
  bool skipping = true;
  for (const SnapFrame& f : site->frames) {
    if (f.python) continue;
    if (skipping && runtime_frame(f)) continue;
    skipping = false;
    if (out.size() < max) out.push_back(&f);
  }
  return out;
}

/// Live device memory per call site (host memory is not device memory).
struct SiteTotal {
  uint64_t bytes = 0, count = 0;
};
std::map<uint32_t, SiteTotal> site_totals(const Snapshot& s) {
  std::map<uint32_t, SiteTotal> out;
  for (const SnapAlloc& a : s.allocations) {
    if (a.kind == SnapKind::host) continue;
    SiteTotal& t = out[a.site];
    t.bytes += a.bytes;
    t.count += a.count;
  }
  return out;
}

uint64_t sat_sub(uint64_t a, uint64_t b) { return a > b ? a - b : 0; }

// ---- the PyTorch model ----------------------------------------------------------------------

/// The size the cache and vmm pools keep for a request (interposer/src/backends/cache/
/// cache_resource.hpp): requests up to 2 KiB in 512-byte steps, up to 1 MiB in four classes
/// per power of two, larger ones to 2 MiB (vmm: its granularity, 2 MiB on the H200). An
/// inference: the tiling never lets a block pass the next one or its segment's end.
uint64_t pool_block_size(uint64_t n) {
  if (n <= 2048) return n == 0 ? 512 : (n + 511) & ~uint64_t{511};
  if (n <= kSmallMax) {
    const int k = 63 - __builtin_clzll(n - 1);
    const uint64_t step = 1ULL << (k - 2);
    return (n + step - 1) & ~(step - 1);
  }
  const uint64_t r = (n + 2 * kMiB - 1) & ~(2 * kMiB - 1);
  return r < n ? n : r;
}

struct TBlock {
  uint64_t address = 0, size = 0, requested = 0;
  bool active = false;
  uint32_t site = 0;
};

struct TSegment {
  int device = 0;
  uint64_t address = 0, size = 0, stream = 0;
  bool pool = false;    ///< a pool's driver memory (else one allocation's own)
  bool large = true;
  uint32_t site = 0;    ///< own segments: the allocation's call site
  std::vector<TBlock> blocks;
  uint64_t allocated() const {
    uint64_t n = 0;
    for (const TBlock& b : blocks) n += b.active ? b.size : 0;
    return n;
  }
  uint64_t requested() const {
    uint64_t n = 0;
    for (const TBlock& b : blocks) n += b.active ? b.requested : 0;
    return n;
  }
};

/// Live device allocations laid out as PyTorch's segments and blocks (snapshot_pytorch's
/// contract). `unplaced`: live device allocations left out (no device ordinal, or overlapping
/// another block: records that cannot be true together).
std::vector<TSegment> tile(const Snapshot& s, uint64_t* unplaced) {
  *unplaced = 0;
  // The pool's segments, by device and address; one overlapping its predecessor is dropped.
  std::vector<TSegment> pool;
  {
    std::vector<SnapSegment> raw;
    for (const SnapSegment& g : s.segments)
      if (g.device >= 0 && g.bytes > 0 && g.address + g.bytes > g.address) raw.push_back(g);
    std::sort(raw.begin(), raw.end(), [](const SnapSegment& a, const SnapSegment& b) {
      return a.device != b.device ? a.device < b.device : a.address < b.address;
    });
    for (const SnapSegment& g : raw) {
      if (!pool.empty() && pool.back().device == g.device && g.address < pool.back().address + pool.back().size)
        continue;
      TSegment t;
      t.device = g.device;
      t.address = g.address;
      t.size = g.bytes;
      t.pool = true;
      pool.push_back(t);
    }
  }
  auto find = [](const std::vector<TSegment>& segs, int device, uint64_t addr) -> std::ptrdiff_t {
    auto it = std::upper_bound(segs.begin(), segs.end(), std::make_pair(device, addr),
                               [](const std::pair<int, uint64_t>& k, const TSegment& g) {
                                 return k.first != g.device ? k.first < g.device : k.second < g.address;
                               });
    if (it == segs.begin()) return -1;
    --it;
    if (it->device != device || addr >= it->address + it->size) return -1;
    return it - segs.begin();
  };
  const bool pooled_process = pooling(s);
  // A block that runs past its segment into the next, adjacent one (vmm maps a grown range
  // in runs): the two are one range to the program, so they become one segment.
  {
    std::vector<bool> join(pool.size(), false);
    for (const SnapAlloc& a : s.allocations) {
      if (a.kind != SnapKind::pooled || a.device < 0) continue;
      const std::ptrdiff_t i = find(pool, a.device, a.address);
      if (i < 0) continue;
      // The request itself, not the rounding inferred for it, decides.
      const uint64_t end = a.address + a.bytes;
      for (std::size_t j = static_cast<std::size_t>(i);
           j + 1 < pool.size() && end > pool[j].address + pool[j].size && pool[j + 1].device == pool[j].device &&
           pool[j + 1].address == pool[j].address + pool[j].size;
           ++j)
        join[j] = true;
    }
    std::vector<TSegment> merged;
    for (std::size_t i = 0; i < pool.size(); ++i) {
      if (i > 0 && join[i - 1]) merged.back().size += pool[i].size;
      else merged.push_back(pool[i]);
    }
    pool.swap(merged);
  }

  std::vector<TSegment> own;
  for (const SnapAlloc& a : s.allocations) {
    if (a.kind == SnapKind::host) continue;
    if (a.device < 0) {
      ++*unplaced;
      continue;
    }
    if (a.kind == SnapKind::pooled) {
      const std::ptrdiff_t i = find(pool, a.device, a.address);
      if (i >= 0) {
        TBlock b;
        b.address = a.address;
        b.requested = a.bytes;
        b.active = true;
        b.site = a.site;
        pool[static_cast<std::size_t>(i)].blocks.push_back(b);
        continue;
      }
      // A pooled block outside every segment the record names: shown as its own.
    }
    if (a.bytes == 0) continue;
    TSegment t;
    t.device = a.device;
    t.address = a.address;
    t.size = a.bytes;
    t.stream = a.stream;
    t.site = a.site;
    t.large = a.bytes > kSmallMax;
    t.blocks.push_back({a.address, a.bytes, a.bytes, true, a.site});
    own.push_back(std::move(t));
  }

  // Tile each pool segment: its blocks in address order, gaps as inactive blocks.
  for (TSegment& g : pool) {
    std::vector<TBlock> live;
    live.swap(g.blocks);
    std::sort(live.begin(), live.end(), [](const TBlock& a, const TBlock& b) { return a.address < b.address; });
    const uint64_t end = g.address + g.size;
    uint64_t cursor = g.address;
    bool all_small = !live.empty();
    for (std::size_t i = 0; i < live.size(); ++i) {
      TBlock b = live[i];
      if (b.address < cursor) {  // overlaps the block before it
        ++*unplaced;
        continue;
      }
      if (b.address > cursor) g.blocks.push_back({cursor, b.address - cursor, 0, false, 0});
      uint64_t limit = end;
      for (std::size_t j = i + 1; j < live.size(); ++j)
        if (live[j].address > b.address) {
          limit = std::min(limit, live[j].address);
          break;
        }
      const uint64_t room = limit - b.address;
      const uint64_t want = pooled_process ? std::max(b.requested, pool_block_size(b.requested)) : b.requested;
      b.size = std::min(want, room);
      b.requested = std::min(b.requested, b.size);
      if (b.size == 0) {
        ++*unplaced;
        continue;
      }
      all_small = all_small && b.requested <= kSmallMax;
      g.blocks.push_back(b);
      cursor = b.address + b.size;
    }
    if (cursor < end) g.blocks.push_back({cursor, end - cursor, 0, false, 0});
    // PyTorch's small pool is 2 MiB segments of requests up to 1 MiB; cuwarden's slabs match.
    g.large = !(all_small && g.size <= 2 * kMiB);
  }

  std::vector<TSegment> all = std::move(pool);
  all.insert(all.end(), std::make_move_iterator(own.begin()), std::make_move_iterator(own.end()));
  std::sort(all.begin(), all.end(), [](const TSegment& a, const TSegment& b) {
    return a.device != b.device ? a.device < b.device : a.address < b.address;
  });
  return all;
}

enum class Action : uint8_t { alloc, free_requested, free_completed, segment_alloc, segment_free, oom };

const char* action_name(Action a) {
  switch (a) {
    case Action::alloc: return "alloc";
    case Action::free_requested: return "free_requested";
    case Action::free_completed: return "free_completed";
    case Action::segment_alloc: return "segment_alloc";
    case Action::segment_free: return "segment_free";
    case Action::oom: return "oom";
  }
  return "";
}

struct TEntry {
  Action action = Action::alloc;
  uint64_t addr = 0, size = 0, stream = 0, time_ns = 0, device_free = 0;
  uint32_t site = 0;
};

/// Per device: the address ranges a pool held at some point of the record (its segments
/// now, and every segment event of the trace), which tell a pooled alloc event from one
/// that is its own driver allocation.
class PoolRanges {
 public:
  void add(int device, uint64_t addr, uint64_t size) {
    if (size > 0 && addr + size > addr) ranges_[device].emplace_back(addr, addr + size);
  }
  /// Sorts and merges each device's ranges into disjoint ones (a segment given back and
  /// taken again overlaps itself).
  void seal() {
    for (auto& [d, v] : ranges_) {
      std::sort(v.begin(), v.end());
      std::vector<std::pair<uint64_t, uint64_t>> merged;
      for (const auto& r : v) {
        if (!merged.empty() && r.first <= merged.back().second)
          merged.back().second = std::max(merged.back().second, r.second);
        else merged.push_back(r);
      }
      v.swap(merged);
    }
  }
  bool contains(int device, uint64_t addr) const {
    auto it = ranges_.find(device);
    if (it == ranges_.end()) return false;
    const auto& v = it->second;
    auto r = std::upper_bound(v.begin(), v.end(), std::make_pair(addr, ~uint64_t{0}));
    if (r == v.begin()) return false;
    --r;
    return addr < r->second;
  }

 private:
  std::map<int, std::vector<std::pair<uint64_t, uint64_t>>> ranges_;
};

/// The device traces (snapshot_pytorch's contract), before the consistency pass.
std::vector<std::vector<TEntry>> raw_traces(const Snapshot& s, const std::vector<TSegment>& segs, std::size_t devices) {
  std::vector<std::vector<TEntry>> out(devices);
  const bool pooled_process = pooling(s);
  PoolRanges ranges;
  for (const TSegment& g : segs)
    if (g.pool) ranges.add(g.device, g.address, g.size);
  for (const SnapEvent& e : s.trace)
    if (e.kind == static_cast<uint8_t>(ring::EventKind::segment_alloc) ||
        e.kind == static_cast<uint8_t>(ring::EventKind::segment_free))
      ranges.add(e.device, e.address, e.bytes);
  ranges.seal();

  // The cap in force on each device as the trace goes: the first cap change's previous cap
  // when the model carries it, else today's cap when no change came since; then each change.
  std::map<int, uint64_t> cap;
  {
    std::set<int> changed;
    for (const SnapEvent& e : s.trace) {
      if (e.kind != static_cast<uint8_t>(ring::EventKind::limit_change) || changed.count(e.device)) continue;
      changed.insert(e.device);
      if (e.aux != 0) cap[e.device] = e.aux;
    }
    for (const SnapDevice& d : s.devices)
      if (!changed.count(d.ordinal)) cap[d.ordinal] = d.get(counters::Id::limit);
  }
  std::map<int, uint64_t> used;  // the device's used bytes after its last event
  struct Freed {
    uint64_t bytes;
    bool own;
    uint32_t site;
  };
  std::map<std::pair<int, uint64_t>, Freed> last_freed;  // to undo a free the driver failed

  for (const SnapEvent& e : s.trace) {
    if (e.device < 0 || static_cast<std::size_t>(e.device) >= devices) continue;
    std::vector<TEntry>& t = out[static_cast<std::size_t>(e.device)];
    TEntry x;
    x.addr = e.address;
    x.size = e.bytes;
    x.stream = e.stream;
    x.time_ns = e.time_ns;
    x.site = e.site;
    const bool own = !(pooled_process && ranges.contains(e.device, e.address));
    switch (static_cast<ring::EventKind>(e.kind)) {
      case ring::EventKind::alloc:
        if (own) {
          x.action = Action::segment_alloc;
          t.push_back(x);
        }
        x.action = Action::alloc;
        t.push_back(x);
        last_freed.erase({e.device, e.address});
        break;
      case ring::EventKind::free:
        x.action = Action::free_requested;
        t.push_back(x);
        x.action = Action::free_completed;
        t.push_back(x);
        if (own) {
          x.action = Action::segment_free;
          t.push_back(x);
        }
        last_freed[{e.device, e.address}] = {e.bytes, own, e.site};
        break;
      case ring::EventKind::segment_alloc:
        x.action = Action::segment_alloc;
        t.push_back(x);
        break;
      case ring::EventKind::segment_free:
        x.action = Action::segment_free;
        t.push_back(x);
        break;
      case ring::EventKind::refuse: {
        x.action = Action::oom;
        auto c = cap.find(e.device);
        x.device_free = c != cap.end() && c->second != ring::kNoLimit ? sat_sub(c->second, e.used_after) : 0;
        t.push_back(x);
        break;
      }
      case ring::EventKind::job_refuse: {
        // used_after: what the job's other members held; aux: the job's cap.
        x.action = Action::oom;
        auto u = used.find(e.device);
        const uint64_t mine = u != used.end() ? u->second : 0;
        x.device_free = e.aux != 0 && e.aux != ring::kNoLimit ? sat_sub(sat_sub(e.aux, e.used_after), mine) : 0;
        t.push_back(x);
        break;
      }
      case ring::EventKind::driver_error:
        if (is_free_api(e.api)) {
          // The driver failed a free that was counted first: the allocation is live again.
          auto f = last_freed.find({e.device, e.address});
          if (f != last_freed.end()) {
            x.size = f->second.bytes;
            x.site = f->second.site;
            if (f->second.own) {
              x.action = Action::segment_alloc;
              t.push_back(x);
            }
            x.action = Action::alloc;
            t.push_back(x);
            last_freed.erase(f);
          }
        } else if (e.result == kCudaErrorOutOfMemory) {
          x.action = Action::oom;
          x.device_free = 0;  // the driver does not say how much it had
          t.push_back(x);
        }
        break;
      case ring::EventKind::limit_change: cap[e.device] = e.bytes; break;
      case ring::EventKind::host_alloc:
      case ring::EventKind::host_free: break;
    }
    if (e.kind != static_cast<uint8_t>(ring::EventKind::job_refuse)) used[e.device] = e.used_after;
  }
  return out;
}

/// memory_viz's "Allocator State History" replays a device's trace backwards from the
/// segments and blocks of the snapshot, and fails on a block that lies in no segment (or
/// silently drops the wrong segment for a segment_alloc that names none). With events lost
/// a trace can ask for either; this pass replays it the same way and leaves out the entries
/// that would. Returns how many it left out.
uint64_t keep_consistent(std::vector<TEntry>& t, const std::vector<TSegment>& segs, int device) {
  std::map<uint64_t, uint64_t> seg, blocks;  // start -> size
  for (const TSegment& g : segs) {
    if (g.device != device) continue;
    seg[g.address] = g.size;
    for (const TBlock& b : g.blocks)
      if (b.active) blocks[b.address] = b.size;
  }
  auto containing = [&](uint64_t addr) {
    auto it = seg.upper_bound(addr);
    if (it == seg.begin()) return false;
    --it;
    return addr < it->first + it->second;
  };
  auto overlaps = [&](uint64_t addr, uint64_t size) {
    auto it = seg.lower_bound(addr);
    if (it != seg.end() && it->first < addr + size) return true;
    if (it == seg.begin()) return false;
    --it;
    return addr < it->first + it->second;
  };
  std::vector<bool> keep(t.size(), true);
  for (std::size_t k = t.size(); k-- > 0;) {
    TEntry& e = t[k];
    switch (e.action) {
      case Action::free_completed:
        if (k > 0 && t[k - 1].action == Action::free_requested && t[k - 1].addr == e.addr) {
          if (containing(e.addr)) blocks[e.addr] = e.size;
          else keep[k] = keep[k - 1] = false;
          --k;
        } else {
          keep[k] = false;  // never written unpaired; kept out if it were
        }
        break;
      case Action::free_requested: keep[k] = false; break;  // unpaired: the viewer would fail
      case Action::alloc: blocks.erase(e.addr); break;
      case Action::segment_free:
        if (e.size == 0 || overlaps(e.addr, e.size)) keep[k] = false;
        else seg[e.addr] = e.size;
        break;
      case Action::segment_alloc: {
        auto it = seg.find(e.addr);
        if (it == seg.end()) {
          keep[k] = false;
          break;
        }
        auto b = blocks.lower_bound(it->first);
        if (b != blocks.end() && b->first < it->first + it->second) {
          keep[k] = false;  // a live block lies in it: the segment was there before
          break;
        }
        seg.erase(it);
        break;
      }
      case Action::oom: break;
    }
  }
  uint64_t dropped = 0;
  std::vector<TEntry> kept;
  kept.reserve(t.size());
  for (std::size_t k = 0; k < t.size(); ++k) {
    if (keep[k]) kept.push_back(t[k]);
    else ++dropped;
  }
  t.swap(kept);
  return dropped;
}

struct TorchModel {
  std::vector<TSegment> segments;
  std::vector<std::vector<TEntry>> traces;  ///< by device ordinal
  uint64_t unplaced = 0, left_out = 0;
};

TorchModel torch_model(const Snapshot& s) {
  TorchModel m;
  m.segments = tile(s, &m.unplaced);
  int max_device = -1;
  for (const SnapDevice& d : s.devices) max_device = std::max(max_device, d.ordinal);
  for (const TSegment& g : m.segments) max_device = std::max(max_device, g.device);
  for (const SnapEvent& e : s.trace)
    if (e.kind != static_cast<uint8_t>(ring::EventKind::host_alloc) &&
        e.kind != static_cast<uint8_t>(ring::EventKind::host_free))
      max_device = std::max(max_device, static_cast<int>(e.device));
  // Ordinals come from another process's memory: no list longer than the ring's devices.
  max_device = std::min(max_device, static_cast<int>(ring::kMaxDevices) - 1);
  const std::size_t devices = static_cast<std::size_t>(max_device + 1);
  m.segments.erase(std::remove_if(m.segments.begin(), m.segments.end(),
                                  [&](const TSegment& g) {
                                    if (static_cast<std::size_t>(g.device) < devices) return false;
                                    ++m.unplaced;
                                    return true;
                                  }),
                   m.segments.end());
  m.traces = raw_traces(s, m.segments, devices);
  for (std::size_t d = 0; d < devices; ++d) m.left_out += keep_consistent(m.traces[d], m.segments, static_cast<int>(d));
  return m;
}

// ---- text -----------------------------------------------------------------------------------

/// `s` padded with spaces to `w` columns (counting UTF-8 code points, not bytes).
std::string pad(const std::string& s, std::size_t w, bool right = false) {
  std::size_t cols = 0;
  for (char c : s)
    if ((static_cast<unsigned char>(c) & 0xc0) != 0x80) ++cols;
  if (cols >= w) return s;
  const std::string fill(w - cols, ' ');
  return right ? fill + s : s + fill;
}

/// `s` cut to `w` columns (UTF-8 code points).
std::string fit(const std::string& s, std::size_t w) {
  std::size_t cols = 0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xc0) == 0x80) continue;
    if (cols++ == w) return s.substr(0, i);
  }
  return s;
}


}  // namespace

std::string snapshot_text(const Snapshot& s, const TextOptions& opts) {
  std::string out;
  const std::string name = printable(process_name(s.comm, s.cmdline));
  out += "cuwarden snapshot of pid " + std::to_string(s.pid) + " (" + name + ")";
  if (!s.user.empty()) out += ", user " + printable(s.user);
  if (!s.job.empty()) out += ", job " + printable(s.job);
  out += "\n";
  if (!s.cmdline.empty()) out += "  command: " + printable(s.cmdline) + "\n";
  out += "  taken " + utc(s.time_ns) + (s.exited ? ", from what the exited process left" : "") + "\n";
  out += "  pool " + (s.pool.empty() ? std::string("off") : printable(s.pool)) + "; live records " +
         (s.exact ? "exact" : "not available (counters only)") + "; " + std::to_string(s.events_dropped) +
         " events dropped" + (s.events_dropped ? " (the history below may miss some; the live records do not)" : "") +
         "; call sites " +
         (s.callsite_frames ? "on (" + std::to_string(s.callsite_frames) + " native frames)" : std::string("off")) +
         "\n\n";

  out += "GPU  " + pad("Name", 24) + pad("Used", 12, true) + pad("Reserved", 12, true) + pad("Peak", 12, true) +
         pad("Cap", 12, true) + pad("Cached", 12, true) + "\n";
  for (const SnapDevice& d : s.devices) {
    out += pad(std::to_string(d.ordinal), 5) + pad(printable(d.name).substr(0, 23), 24) +
           pad(format_bytes(d.get(counters::Id::used)), 12, true) +
           pad(format_bytes(d.get(counters::Id::reserved)), 12, true) +
           pad(format_bytes(d.get(counters::Id::peak)), 12, true) + pad(cap_text(d.get(counters::Id::limit)), 12, true) +
           pad(format_bytes(d.get(counters::Id::cached)), 12, true) + "\n";
  }
  if (s.devices.empty()) out += "(no device)\n";

  if (!s.exact) {
    out += "\nThe live allocations could not be read; the figures above are the process's counters.\n";
    return out;
  }

  // Call sites by live bytes.
  const auto totals = site_totals(s);
  std::vector<std::pair<uint32_t, SiteTotal>> sites(totals.begin(), totals.end());
  std::stable_sort(sites.begin(), sites.end(),
                   [](const auto& a, const auto& b) { return a.second.bytes > b.second.bytes; });
  std::size_t live = 0;
  for (const SnapAlloc& a : s.allocations) live += a.kind != SnapKind::host;
  out += "\nLive device memory by call site";
  if (sites.size() > opts.top) out += " (top " + std::to_string(opts.top) + " of " + std::to_string(sites.size()) + ")";
  out += ":\n";
  if (sites.empty()) out += "  (no live device allocation)\n";
  for (std::size_t i = 0; i < sites.size() && i < opts.top; ++i) {
    const auto& [id, t] = sites[i];
    out += "  " + pad(format_bytes(t.bytes), 11, true) + "  " + pad(std::to_string(t.count), 6, true) +
           (t.count == 1 ? " allocation " : " allocations") + "  ";
    if (id == 0) {
      out += s.callsite_frames ? "(no call site captured)\n" : "(call sites off: CUWARDEN_CALLSITES=16 records them)\n";
      continue;
    }
    out += "site " + std::to_string(id) + "\n";
    const SnapSite* site = s.site(id);
    const auto shown = frames_to_show(site, opts.frames);
    if (shown.empty()) out += "      (frames unknown)\n";
    for (const SnapFrame* f : shown) out += "      " + frame_text(*f) + (f->python ? "" : "  [native]") + "\n";
  }

  // The largest live allocations.
  std::vector<const SnapAlloc*> big;
  for (const SnapAlloc& a : s.allocations)
    if (a.kind != SnapKind::host) big.push_back(&a);
  std::stable_sort(big.begin(), big.end(), [](const SnapAlloc* a, const SnapAlloc* b) { return a->bytes > b->bytes; });
  out += "\nLargest live allocations";
  if (big.size() > opts.top) out += " (top " + std::to_string(opts.top) + " of " + std::to_string(live) + ")";
  out += ":\n";
  if (!big.empty())
    out += "  " + pad("Address", 16) + pad("Size", 11, true) + "  " + pad("GPU", 4) + pad("Stream", 16) + pad("Age", 14) +
           "Site\n";
  for (std::size_t i = 0; i < big.size() && i < opts.top; ++i) {
    const SnapAlloc& a = *big[i];
    std::string where = "-";
    if (a.site) {
      where = std::to_string(a.site);
      const auto shown = frames_to_show(s.site(a.site), 1);
      if (!shown.empty()) where += ": " + frame_text(*shown.front());
    }
    const std::string kind =
        a.kind == SnapKind::device || a.kind == SnapKind::pooled ? "" : std::string(" (") + kind_name(a.kind) + ")";
    const std::string stream = a.stream ? hex(a.stream) : std::string("default");  // 0: the legacy default stream
    out += "  " + pad(hex(a.address), 16) + pad(format_bytes(a.bytes), 11, true) + "  " + pad(std::to_string(a.device), 4) +
           pad(stream, 16) + pad(duration(sat_sub(s.time_ns, a.time_ns)), 14) + where + kind + "\n";
  }

  uint64_t host_bytes = 0, host_count = 0;
  for (const SnapAlloc& a : s.allocations)
    if (a.kind == SnapKind::host) host_bytes += a.bytes, ++host_count;
  if (host_count)
    out += "\nPinned host memory (not device memory, never capped): " + std::to_string(host_count) +
           (host_count == 1 ? " allocation, " : " allocations, ") + format_bytes(host_bytes) + "\n";
  return out;
}

// ---- JSON -----------------------------------------------------------------------------------

namespace {

json frame_json(const SnapFrame& f) {
  return {{"python", f.python},      {"function", pickle::valid_utf8(f.function)},
          {"file", pickle::valid_utf8(f.file)}, {"line", f.line},
          {"module", pickle::valid_utf8(f.module)}, {"offset", f.offset},
          {"pc", f.pc}};
}

}  // namespace

json snapshot_json(const Snapshot& s) {
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
    for (const SnapFrame& f : st->frames) frames.push_back(frame_json(f));
    auto t = totals.find(st->id);
    sites.push_back({{"id", st->id},
                     {"live_bytes", t != totals.end() ? t->second.bytes : 0},
                     {"live_allocations", t != totals.end() ? t->second.count : 0},
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
          {"trace", std::move(trace)}};
}

// ---- PyTorch pickle -------------------------------------------------------------------------

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

// ---- Perfetto -------------------------------------------------------------------------------

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

// ---- summary --------------------------------------------------------------------------------

namespace {

/// A cell: a number, or unknown ("-").
struct Cell {
  bool known = false;
  uint64_t v = 0;
};
Cell known(uint64_t v) { return {true, v}; }
const Cell kUnknown{};

/// A counter by its field name, if this build's counter list has it (alloc_bytes and
/// free_bytes may come: the summary shows them as soon as they do).
Cell counter_named(const SnapDevice& d, std::string_view field) {
  for (std::size_t i = 0; i < counters::kDeviceCount; ++i)
    if (counters::kDevice[i].field == field) return known(d.counters[i]);
  return kUnknown;
}

/// torch.cuda.memory_summary's _format_size: the unit chosen by the row's "all" value.
std::string size_cell(const Cell& c, uint64_t pref) {
  if (!c.known) return "     -    ";  // in the last digit's column
  static const char* prefixes[] = {"B  ", "KiB", "MiB", "GiB", "TiB", "PiB"};
  uint64_t sz = c.v;
  double p = static_cast<double>(pref);
  int k = 0;
  while (k < 5 && p >= 768.0 * 1024) {
    ++k;
    sz /= 1024;
    p /= 1024;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%6" PRIu64 " %s", sz, prefixes[k]);
  return buf;
}

/// torch.cuda.memory_summary's _format_count.
std::string count_cell(const Cell& c, uint64_t pref) {
  if (!c.known) return "      -   ";  // where the last digit goes, as in size_cell
  static const char* prefixes[] = {" ", "K", "M"};
  uint64_t n = c.v;
  double p = static_cast<double>(pref);
  int k = 0;
  while (k < 2 && p >= 750.0 * 1000) {
    ++k;
    n /= 1000;
    p /= 1000;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%7" PRIu64 " %s ", n, prefixes[k]);
  return buf;
}

struct Row {
  const char* name;
  bool bytes;
  Cell all[4], large[4], small[4];  ///< Cur, Peak, Tot Alloc, Tot Freed
};

}  // namespace

std::string summary_text(const Snapshot& s) {
  const TorchModel m = torch_model(s);
  const bool pools = pooling(s);
  std::string out;
  const std::string rule_eq(75, '='), rule(75, '-');
  auto line = [&](const std::string& body) { out += "|" + pad(fit(body, 75), 75) + "|\n"; };

  for (const SnapDevice& d : s.devices) {
    // What the live records say, split at 1 MiB as PyTorch's pools are.
    uint64_t alloc_l = 0, alloc_s = 0, req_l = 0, req_s = 0, n_l = 0, n_s = 0;
    uint64_t seg_l = 0, seg_s = 0, segn_l = 0, segn_s = 0, nonrel_l = 0, nonrel_s = 0, nonreln_l = 0, nonreln_s = 0;
    for (const TSegment& g : m.segments) {
      if (g.device != d.ordinal) continue;
      (g.large ? seg_l : seg_s) += g.size;
      ++(g.large ? segn_l : segn_s);
      bool any_active = false;
      for (const TBlock& b : g.blocks) any_active = any_active || b.active;
      for (const TBlock& b : g.blocks) {
        if (b.active) {
          const bool large = b.requested > kSmallMax;
          (large ? alloc_l : alloc_s) += b.size;
          (large ? req_l : req_s) += b.requested;
          ++(large ? n_l : n_s);
        } else if (any_active) {
          // Free space in a segment a live block keeps: the pool cannot give it back.
          (g.large ? nonrel_l : nonrel_s) += b.size;
          ++(g.large ? nonreln_l : nonreln_s);
        }
      }
    }
    const bool rec = s.exact;
    auto R = [&](uint64_t v) { return rec ? known(v) : kUnknown; };
    const uint64_t used = d.get(counters::Id::used), peak = d.get(counters::Id::peak);
    const bool context_counted = d.get(counters::Id::context_bytes) != 0;
    // The peak counter is of used bytes: the program's allocations without a pool, what the
    // pool holds from the driver with one (its cached bytes are part of used).
    const Cell peak_alloc = !pools && !context_counted ? known(peak) : kUnknown;
    const Cell peak_reserved = !context_counted ? known(peak) : kUnknown;
    const Cell tot_alloc_bytes = counter_named(d, "alloc_bytes"), tot_freed_bytes = counter_named(d, "free_bytes");
    // Active = allocated + freed blocks a pool still holds for their streams' work: the same
    // without a pool; a pool's pending frees are not counted anywhere.
    const Cell active_all = !pools ? known(d.get(counters::Id::in_use)) : kUnknown;

    std::vector<Row> rows;
    rows.push_back({"Allocated memory", true,
                    {known(d.get(counters::Id::in_use)), peak_alloc, tot_alloc_bytes, tot_freed_bytes},
                    {R(alloc_l), kUnknown, kUnknown, kUnknown},
                    {R(alloc_s), kUnknown, kUnknown, kUnknown}});
    rows.push_back({"Active memory", true,
                    {active_all, !pools ? peak_alloc : kUnknown, !pools ? tot_alloc_bytes : kUnknown,
                     !pools ? tot_freed_bytes : kUnknown},
                    {!pools ? R(alloc_l) : kUnknown, kUnknown, kUnknown, kUnknown},
                    {!pools ? R(alloc_s) : kUnknown, kUnknown, kUnknown, kUnknown}});
    rows.push_back({"Requested memory", true,
                    {R(req_l + req_s), kUnknown, kUnknown, kUnknown},
                    {R(req_l), kUnknown, kUnknown, kUnknown},
                    {R(req_s), kUnknown, kUnknown, kUnknown}});
    rows.push_back({"GPU reserved memory", true,
                    {known(d.get(counters::Id::reserved)), peak_reserved, kUnknown, kUnknown},
                    {R(seg_l), kUnknown, kUnknown, kUnknown},
                    {R(seg_s), kUnknown, kUnknown, kUnknown}});
    rows.push_back({"Non-releasable memory", true,
                    {R(nonrel_l + nonrel_s), kUnknown, kUnknown, kUnknown},
                    {R(nonrel_l), kUnknown, kUnknown, kUnknown},
                    {R(nonrel_s), kUnknown, kUnknown, kUnknown}});
    rows.push_back({"Allocations", false,
                    {known(d.get(counters::Id::live_allocations)), kUnknown, known(d.get(counters::Id::alloc_count)),
                     known(d.get(counters::Id::free_count))},
                    {R(n_l), kUnknown, kUnknown, kUnknown},
                    {R(n_s), kUnknown, kUnknown, kUnknown}});
    rows.push_back({"Active allocs", false,
                    {!pools ? known(d.get(counters::Id::live_allocations)) : kUnknown, kUnknown,
                     !pools ? known(d.get(counters::Id::alloc_count)) : kUnknown,
                     !pools ? known(d.get(counters::Id::free_count)) : kUnknown},
                    {!pools ? R(n_l) : kUnknown, kUnknown, kUnknown, kUnknown},
                    {!pools ? R(n_s) : kUnknown, kUnknown, kUnknown, kUnknown}});
    rows.push_back({"GPU reserved segments", false,
                    {R(segn_l + segn_s), kUnknown, kUnknown, kUnknown},
                    {R(segn_l), kUnknown, kUnknown, kUnknown},
                    {R(segn_s), kUnknown, kUnknown, kUnknown}});
    rows.push_back({"Non-releasable allocs", false,
                    {R(nonreln_l + nonreln_s), kUnknown, kUnknown, kUnknown},
                    {R(nonreln_l), kUnknown, kUnknown, kUnknown},
                    {R(nonreln_s), kUnknown, kUnknown, kUnknown}});

    out += "|" + rule_eq + "|\n";
    line(" cuwarden memory summary (torch.cuda.memory_summary's table), device ID " + std::to_string(d.ordinal));
    // Names last, each on its line: a long one is what the frame cuts, never the figures.
    line(" pid " + std::to_string(s.pid) + ", pool " + (s.pool.empty() ? std::string("off") : printable(s.pool)) +
         ", " + printable(process_name(s.comm, s.cmdline)));
    line(" used " + format_bytes(used) + " on " + printable(d.name));
    out += "|" + rule + "|\n";
    char buf[120];
    std::snprintf(buf, sizeof buf, "           CUDA OOMs: %-12" PRIu64 " |        driver errors: %-8" PRIu64,
                  d.get(counters::Id::refusals), d.get(counters::Id::driver_errors));
    line(buf);
    out += "|" + rule_eq + "|\n";
    line("        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  ");
    for (const Row& r : rows) {
      out += "|" + rule + "|\n";
      uint64_t pref[4];
      for (int c = 0; c < 4; ++c) {
        // The unit follows the "all" value, as PyTorch's; an unknown "all" takes the largest split.
        pref[c] = r.all[c].known ? r.all[c].v : std::max(r.large[c].v, r.small[c].v);
      }
      auto emit = [&](const char* label, const Cell (&cells)[4]) {
        std::string l = " " + pad(label, 21) + " ";
        for (int c = 0; c < 4; ++c)
          l += "| " + (r.bytes ? size_cell(cells[c], pref[c]) : count_cell(cells[c], pref[c])) + " ";
        line(l);
      };
      emit(r.name, r.all);
      emit("      from large pool", r.large);
      emit("      from small pool", r.small);
    }
    out += "|" + rule + "|\n";
    const Cell none4[4] = {kUnknown, kUnknown, kUnknown, kUnknown};
    for (const char* name : {"Oversize allocations", "Oversize GPU segments"}) {
      std::string l = " " + pad(name, 21) + " ";
      for (int c = 0; c < 4; ++c) l += "| " + count_cell(none4[c], 0) + " ";
      line(l);
    }
    out += "|" + rule_eq + "|\n";
  }
  if (s.devices.empty()) out += "(no device)\n";
  out += "-: not known to cuwarden. Peaks and totals are counters kept since the process started;\n"
         "the rest comes from the live allocations at the snapshot" +
         std::string(s.exact ? "" : " (not readable for this one)") +
         ". Large: requests over 1 MiB.\n"
         "Reserved memory: " +
         std::string(pools ? "the pool's driver allocations" : "every live allocation is its own (no pool)") +
         ". Non-releasable: free space in segments that a live block keeps.\n" +
         (pools ? "Active memory and allocs: a pool's frees still waiting for their streams are not counted.\n" : "") +
         "Oversize: PyTorch's max_split_size, which cuwarden has not.\n";
  return out;
}

// ---- leaks ----------------------------------------------------------------------------------

namespace {

struct LeakWindow {
  std::vector<const Snapshot*> used;  ///< exact snapshots, oldest first
  std::size_t skipped = 0;
};

LeakWindow leak_window(const std::vector<Snapshot>& snaps) {
  LeakWindow w;
  for (const Snapshot& s : snaps) {
    if (s.pid != snaps.front().pid) throw std::invalid_argument("snapshots of different processes");
    if (s.exact) w.used.push_back(&s);
    else ++w.skipped;
  }
  std::stable_sort(w.used.begin(), w.used.end(),
                   [](const Snapshot* a, const Snapshot* b) { return a->time_ns < b->time_ns; });
  return w;
}

std::vector<LeakSuspect> suspects(const LeakWindow& w) {
  std::vector<LeakSuspect> out;
  if (w.used.size() < 2) return out;
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
    if (!grows || l.bytes.back() <= l.bytes.front()) continue;
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

std::vector<LeakSuspect> growing_sites(const std::vector<Snapshot>& snaps) {
  if (snaps.empty()) return {};
  return suspects(leak_window(snaps));
}

json leaks_json(const std::vector<Snapshot>& snaps) {
  const LeakWindow w = snaps.empty() ? LeakWindow{} : leak_window(snaps);
  json sites = json::array();
  for (const LeakSuspect& l : suspects(w)) {
    json frames = json::array();
    for (const SnapFrame& f : l.frames.frames) frames.push_back(frame_json(f));
    sites.push_back({{"site", l.site},
                     {"growth_bytes", l.growth()},
                     {"bytes", l.bytes},
                     {"first_count", l.first_count},
                     {"last_count", l.last_count},
                     {"frames", std::move(frames)}});
  }
  return {{"pid", snaps.empty() ? json(nullptr) : json(snaps.front().pid)},
          {"snapshots", w.used.size()},
          {"skipped", w.skipped},
          {"first_ns", w.used.empty() ? json(nullptr) : json(w.used.front()->time_ns)},
          {"last_ns", w.used.empty() ? json(nullptr) : json(w.used.back()->time_ns)},
          {"sites", std::move(sites)}};
}

std::string leaks_text(const std::vector<Snapshot>& snaps, const TextOptions& opts) {
  if (snaps.empty()) return "No snapshot to compare.\n";
  const LeakWindow w = leak_window(snaps);
  std::string out;
  const Snapshot& last = w.used.empty() ? snaps.front() : *w.used.back();
  out += "Call sites of pid " + std::to_string(last.pid) + " (" + printable(process_name(last.comm, last.cmdline)) +
         ") whose live device memory only grew";
  if (w.used.size() >= 2)
    out += " over " + duration(w.used.back()->time_ns - w.used.front()->time_ns) + " (" + std::to_string(w.used.size()) +
           " snapshots, " + utc(w.used.front()->time_ns) + " to " + utc(w.used.back()->time_ns) + ")";
  out += ":\n";
  if (w.skipped)
    out += "  (" + std::to_string(w.skipped) + " snapshot" + (w.skipped == 1 ? "" : "s") +
           " left out: live records not readable)\n";
  if (w.used.size() < 2) return out + "  Needs two snapshots or more with live records.\n";
  const auto list = suspects(w);
  if (list.empty()) return out + "  None.\n";
  for (std::size_t i = 0; i < list.size() && i < opts.top; ++i) {
    const LeakSuspect& l = list[i];
    out += "  +" + format_bytes(l.growth()) + "  (" + format_bytes(l.bytes.front()) + " -> " + format_bytes(l.bytes.back()) +
           ", " + std::to_string(l.first_count) + " -> " + std::to_string(l.last_count) + " allocations)  ";
    if (l.site == 0) {
      out += "(no call site captured)\n";
      continue;
    }
    out += "site " + std::to_string(l.site) + "\n";
    const auto shown = frames_to_show(&l.frames, opts.frames);
    if (shown.empty()) out += "      (frames unknown)\n";
    for (const SnapFrame* f : shown) out += "      " + frame_text(*f) + (f->python ? "" : "  [native]") + "\n";
  }
  if (list.size() > opts.top) out += "  ... and " + std::to_string(list.size() - opts.top) + " more\n";
  return out;
}

}  // namespace cuw::daemon

// cuwarden daemon view: PyTorch's model of a process's memory (see detail/snapshot.hpp):
// live allocations tiled into segments and blocks, and the device traces made consistent
// with them; the pickle and the summary table read it.
#include "views/detail/snapshot.hpp"

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

namespace cuw::daemon::snapshot_detail {

namespace {


/// The size the cache and vmm pools keep for a request (interposer/src/backends/pool/
/// pool.hpp): requests up to 2 KiB in 512-byte steps, up to 1 MiB in four classes
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
      case ring::EventKind::host_free:
      case ring::EventKind::suspend:  // the memory moved to the host and back: its blocks stay
      case ring::EventKind::resume:
      case ring::EventKind::suspend_overdue: break;
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

}  // namespace

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

}  // namespace cuw::daemon::snapshot_detail

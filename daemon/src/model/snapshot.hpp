// cuwarden daemon model: a process's memory at one instant, as plain data: every live
// allocation with its call site, the driver allocations a pool holds (segments), each
// device's counters, and the recent events. Built by the model from the process's live
// segment (exact whatever events were dropped) and its event history; turned into text,
// JSON, PyTorch's snapshot pickle or a Perfetto trace by views/snapshot_views.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cuw/counters.hpp"

namespace cuw::daemon {

/// One frame of a call site, innermost first in SnapSite::frames. Native frames carry `pc`
/// and what the symbolizer found (function, file and line when the module has DWARF lines,
/// else the ELF symbol, else nothing but the module); Python frames carry the script's file,
/// function and line, and pc 0.
struct SnapFrame {
  uint64_t pc = 0;        ///< absolute address in the process (0 for a Python frame)
  bool python = false;
  std::string function;   ///< demangled; empty when unknown
  std::string file;       ///< source file; empty when unknown
  uint32_t line = 0;      ///< 0 when unknown
  std::string module;     ///< the ELF file (path) of a native frame
  uint64_t offset = 0;    ///< pc - the module's load base (native frames)
};

/// A distinct stack, by its id in the process (0: none captured).
struct SnapSite {
  uint32_t id = 0;
  std::vector<SnapFrame> frames;  ///< innermost first
};

/// What kind of memory a live record is.
enum class SnapKind : uint8_t {
  device,   ///< device memory the program allocated (cuMemAlloc* and the async ones, graph memory)
  pooled,   ///< device memory a pooling backend (cache, vmm) handed the program
  handle,   ///< a cuMemCreate handle the program made (address: the handle's value)
  array,    ///< a CUDA array (address: the array's handle)
  host,     ///< pinned host memory (not counted against device caps)
};

/// One live allocation, as the process holds it.
struct SnapAlloc {
  uint64_t address = 0;
  uint64_t bytes = 0;       ///< what counts against the cap (the request; rounded for a pool
                            ///< block only in SnapSegment's tiling)
  int device = -1;          ///< CUDA ordinal as the process sees it
  uint64_t stream = 0;      ///< 0: the legacy default stream, or not stream-ordered
  uint64_t time_ns = 0;     ///< CLOCK_REALTIME when it was allocated
  uint32_t site = 0;        ///< SnapSite id, 0: none
  uint16_t api = 0;         ///< ring::Api of the allocating call
  SnapKind kind = SnapKind::device;
  /// Allocations this record stands for: 1, but in the daemon's periodic samples for
  /// `snapshot --leaks`, which keep one record per call site (bytes: their sum).
  uint32_t count = 1;
};

/// A driver allocation a pooling backend holds (cache: one cuMemAlloc; vmm: a mapped run of
/// granules). The program's pooled blocks lie inside segments; the rest of a segment is the
/// pool's free memory. Passthrough processes have none (each allocation is its own).
struct SnapSegment {
  uint64_t address = 0;
  uint64_t bytes = 0;
  int device = -1;
};

/// One device of the process: identity and the counters of its ring row (counters.hpp order).
struct SnapDevice {
  int ordinal = 0;
  std::string uuid;    ///< "GPU-xxxxxxxx-..." as nvidia-smi writes it
  std::string name;
  uint64_t total = 0;  ///< physical memory, bytes
  std::array<uint64_t, counters::kDeviceCount> counters{};  ///< index counters::Id
  uint64_t get(counters::Id id) const noexcept { return counters[static_cast<std::size_t>(id)]; }
};

/// One event of the process's recent history (the ring's stream, as the daemon kept it).
struct SnapEvent {
  uint64_t time_ns = 0;
  uint8_t kind = 0;          ///< ring::EventKind
  uint16_t api = 0;          ///< ring::Api
  int device = -1;
  uint64_t address = 0;
  uint64_t bytes = 0;
  uint64_t used_after = 0;   ///< the device's used bytes after it
  uint64_t stream = 0;       ///< the event's aux for stream-ordered calls, else 0
  /// The event's aux word as the ring holds it, whatever the kind (ring.hpp): besides the
  /// stream, a job refusal's job cap and a cap change's previous cap (kNoLimit: none). The
  /// snapshot views read the caps from it; 0 where the model does not carry it.
  uint64_t aux = 0;
  uint32_t site = 0;         ///< SnapSite id, 0: none
  uint32_t result = 0;       ///< CUresult
};

/// A process's memory at one instant.
struct Snapshot {
  uint32_t pid = 0;
  std::string comm, cmdline, user, job;
  std::string pool;             ///< "off", "cache", "vmm"
  uint64_t time_ns = 0;         ///< CLOCK_REALTIME when it was taken
  bool exited = false;          ///< taken from what an exited process left
  /// The live records are complete (the segment was read consistently); false when the
  /// process's live segment could not be read (then `allocations` is empty and only the
  /// counters are known).
  bool exact = false;
  uint64_t events_dropped = 0;  ///< the ring's count (the history below may miss events)
  uint32_t callsite_frames = 0; ///< CUWARDEN_CALLSITES of the process (0: off)
  std::vector<SnapDevice> devices;
  std::vector<SnapAlloc> allocations;  ///< by address
  std::vector<SnapSegment> segments;   ///< by address
  std::vector<SnapSite> sites;         ///< every site an allocation or event names, by id
  std::vector<SnapEvent> trace;        ///< oldest first
  /// The site with id `id`; nullptr for 0 (none) or an unknown id. A binary search when
  /// `sites` is sorted by id (as the daemon takes them), else a scan.
  const SnapSite* site(uint32_t id) const noexcept {
    if (id == 0) return nullptr;
    auto it = std::lower_bound(sites.begin(), sites.end(), id,
                               [](const SnapSite& s, uint32_t v) { return s.id < v; });
    if (it != sites.end() && it->id == id) return &*it;
    for (const SnapSite& s : sites)
      if (s.id == id) return &s;
    return nullptr;
  }
};

}  // namespace cuw::daemon

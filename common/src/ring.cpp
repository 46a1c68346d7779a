// cuwarden: ring producer/consumer (see ring.hpp for the protocol). Hot path: push().
#include "cuw/ring.hpp"

#include <cstring>

namespace cuw::ring {

namespace {
constexpr const char* kApiNames[] = {
    "unknown",        "cuMemAlloc",        "cuMemAllocPitch",  "cuMemAllocManaged",
    "cuMemAllocAsync", "cuMemAllocFromPoolAsync", "cuMemFree", "cuMemFreeAsync",
    "cuMemCreate",    "cuMemRelease",      "cuArrayCreate",    "cuArray3DCreate",
    "cuMipmappedArrayCreate", "cuArrayDestroy", "cuMipmappedArrayDestroy", "cuMemHostAlloc",
    "cuMemAllocHost", "cuMemFreeHost",     "cuGraphMemAlloc",  "control",
    "cuCtxDestroy",   "reused",
};
static_assert(sizeof(kApiNames) / sizeof(kApiNames[0]) == static_cast<size_t>(Api::count_));

constexpr const char* kKindNames[] = {"unknown", "alloc", "free", "refuse", "driver_error",
                                      "limit_change", "host_alloc", "host_free", "job_refuse",
                                      "segment_alloc", "segment_free", "suspend", "resume",
                                      "suspend_overdue"};

constexpr bool is_pow2(uint64_t v) { return v && !(v & (v - 1)); }

}  // namespace

const char* api_name(uint16_t api) noexcept {
  return api < static_cast<uint16_t>(Api::count_) ? kApiNames[api] : "unknown";
}

const char* kind_name(uint8_t kind) noexcept {
  return kind < sizeof(kKindNames) / sizeof(kKindNames[0]) ? kKindNames[kind] : "unknown";
}

void init(RingHeader& h, EventSlot* slots, uint32_t slot_count) noexcept {
  h.abi_version = kAbiVersion;
  h.header_size = sizeof(RingHeader);
  h.slot_size = sizeof(EventSlot);
  h.slot_count = slot_count;
  h.write_pos.store(0, std::memory_order_relaxed);
  h.read_pos.store(0, std::memory_order_relaxed);
  for (uint32_t d = 0; d < kMaxDevices; ++d) {
    h.devices[d].ordinal = static_cast<int32_t>(d);
    h.devices[d].limit.store(kNoLimit, std::memory_order_relaxed);
  }
  for (uint32_t i = 0; i < slot_count; ++i) slots[i].seq.store(i, std::memory_order_relaxed);
  // The magic goes last: a reader that sees it (acquire) sees an initialised ring. The
  // release store orders every write above; no separate fence (TSan does not model fences).
  std::atomic_ref<uint64_t>(h.magic).store(kMagic, std::memory_order_release);
}

// Hot path: about 30 instructions uncontended; one acquire load, one CAS, one release store.
// Every claimed position is published, so write_pos is the count of events written.
const char* invalid_reason(Invalid r) noexcept {
  switch (r) {
    case Invalid::none: return "ok";
    case Invalid::too_small: return "file smaller than a ring header";
    case Invalid::bad_magic: return "bad magic (not a cuwarden ring, or not initialised yet)";
    case Invalid::bad_abi: return "unsupported ring ABI version";
    case Invalid::bad_header_size: return "header size out of range";
    case Invalid::bad_slot_size: return "event slot size mismatch";
    case Invalid::bad_slot_count: return "slot count not a power of two in range";
    case Invalid::size_mismatch: return "file size does not match slot count";
  }
  return "unknown";
}

Invalid validate(const void* base, uint64_t mapped_bytes) noexcept {
  if (base == nullptr || mapped_bytes < kHeaderBytes) return Invalid::too_small;
  const auto* h = static_cast<const RingHeader*>(base);
  uint64_t magic = std::atomic_ref<const uint64_t>(h->magic).load(std::memory_order_acquire);
  if (magic != kMagic) return Invalid::bad_magic;
  // Copy the geometry once: a hostile writer may change it after we look.
  uint32_t abi, hs, ss, sc;
  std::memcpy(&abi, &h->abi_version, 4);
  std::memcpy(&hs, &h->header_size, 4);
  std::memcpy(&ss, &h->slot_size, 4);
  std::memcpy(&sc, &h->slot_count, 4);
  if (abi < kOldestAbiVersion || abi > kAbiVersion) return Invalid::bad_abi;
  if (hs < sizeof(RingHeader) || hs > kHeaderBytes) return Invalid::bad_header_size;
  if (ss != sizeof(EventSlot)) return Invalid::bad_slot_size;
  if (!is_pow2(sc) || sc < kMinSlotCount || sc > kMaxSlotCount) return Invalid::bad_slot_count;
  if (file_size(sc) != mapped_bytes) return Invalid::size_mismatch;
  return Invalid::none;
}

std::size_t drain(RingHeader& h, EventSlot* slots, uint32_t slot_count, Event* out, std::size_t max,
                  bool stuck_skip, uint64_t* lost) noexcept {
  const uint32_t sc = slot_count;
  if (!is_pow2(sc) || sc < kMinSlotCount || sc > kMaxSlotCount) return 0;
  const uint64_t mask = sc - 1;
  const uint64_t start = h.read_pos.load(std::memory_order_relaxed);
  // Nothing claimed past the read position: empty, seen without touching a slot (a daemon
  // visits every ring of every process this way, most of them idle).
  if (h.write_pos.load(std::memory_order_acquire) == start) return 0;
  uint64_t pos = start;
  std::size_t n = 0;
  while (n < max) {
    EventSlot& s = slots[pos & mask];
    const uint64_t seq = s.seq.load(std::memory_order_acquire);
    if (seq == pos + 1) {
      Event& e = out[n++];
      e.time_ns = s.time_ns;
      e.address = s.address;
      e.bytes = s.bytes;
      e.used_after = s.used_after;
      e.aux = s.aux;
      e.tid = s.tid;
      e.api = s.api;
      e.kind = s.kind;
      e.device = s.device;
      e.result = s.result;
      e.site = s.site;  // version 1 writers left the word zero: no site
      s.seq.store(pos + sc, std::memory_order_release);
      ++pos;
      continue;
    }
    // Not published. Either empty, or a producer claimed it and has not published yet
    // (or died doing so). Skip it only when asked and positions past it were claimed.
    const uint64_t wpos = h.write_pos.load(std::memory_order_acquire);
    if (stuck_skip && wpos > pos && wpos - pos <= sc && seq == pos) {
      // Free the slot for the next lap and move on.
      s.seq.store(pos + sc, std::memory_order_release);
      ++pos;
      if (lost) ++*lost;
      continue;
    }
    break;
  }
  if (pos != start) h.read_pos.store(pos, std::memory_order_release);
  return n;
}

}  // namespace cuw::ring

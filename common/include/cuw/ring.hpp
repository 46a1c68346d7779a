// cuwarden: the shared-memory ring layout, the contract between the interposer (producer)
// and the daemon (consumer). One file per interposed process, under the run directory.
//
// File layout (all little-endian, fixed-width):
//   [0, kHeaderBytes)                         RingHeader (padded to 16 KiB)
//   [kHeaderBytes, + slot_count * 64)         EventSlot[slot_count]
//
// The header holds the authoritative counters; events are a best-effort stream on top.
// A daemon restarted mid-run reads exact totals from the header at once.
//
// Ring protocol (bounded multi-producer / single-consumer, after D. Vyukov's MPMC queue):
//   slot[i].seq starts at i. A producer at position p may write slot p & mask when its
//   seq == p; it claims p by CAS on write_pos, writes the payload, then publishes with
//   seq = p + 1 (release). The consumer at read position r reads the slot when
//   seq == r + 1 (acquire), copies it, then frees it with seq = r + slot_count (release)
//   and advances read_pos. A producer that finds seq < p (the consumer is a lap behind)
//   drops the event and counts it: the application never waits for the daemon.
//
// Counters and events (what a reader may rely on; tests: interposer.ledger_*). Each of the
// interposer's threads writes a device's counters with atomic read-modify-writes (a cap's
// check is one compare-and-swap of `used`), under no common lock, and then publishes the
// event that explains them (a release store). So:
//   - every counter word is exact at every instant: a load sees a value it really had
//     (each a 64-bit atomic, written whole by one read-modify-write); a charge never takes
//     `used` past the process's `limit`, not even for an instant (the test and the add are
//     one compare-and-swap): `used` is above `limit` only after the cap was lowered below
//     it, or for bytes the driver had already given (a pitch wider than asked, the
//     context's own memory). In a job, bytes charged here are given back when the job's
//     cap refuses them, so another thread's charge in between sees them;
//   - an allocation's or a free's event (alloc, free, host_alloc, host_free, driver_error)
//     never arrives before the counter change it explains: once a reader has read it
//     (drain's acquire of its slot), every counter it changed already shows it. A pool's
//     segment_alloc and segment_free events are the exception: they record the pool's
//     driver memory as the upstream call returns, and reserved and cached follow in the
//     pool's next critical section;
//   - a counter may move before the event that explains it is readable (the reader reads a
//     counter newer than the last event it drained), and two counters loaded one after the
//     other may straddle an update: totals come from the counters, history from the events;
//   - events of different threads arrive in the order their pushes claimed positions, which
//     need not be the order of their counter updates; an event's used_after is `used` as its
//     thread loaded it after its own update (another thread's may already be in it);
//   - events are best effort (a full ring drops them, as does a push that lost
//     kMaxPushAttempts races in a row, counted in events_dropped); counters never miss
//     anything.
//
// Trust: the daemon treats every byte here as hostile (another user's process may have
// written it); the producer bounds its own retries so that garbage written by a consumer
// can never make it spin.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "cuw/attrs.hpp"
#include "cuw/counters.hpp"

namespace cuw::ring {

inline constexpr uint64_t kMagic = 0x31474e4952575543ULL;  // "CUWRING1"
/// The ring's ABI. What may change without a new version: a field added in a reserved word
/// of the header or of a DeviceSlot (a counter row appended in counters.hpp), with 0
/// meaning what a writer that predates it means; a header grown at its end (header_size
/// says how much a writer filled). What needs a new version: a field removed, moved,
/// resized or given another meaning or unit, a new event layout, another slot size. The
/// daemon reads every version it knows (today: 1 and 2), so an upgraded daemon keeps reading
/// the rings of programs started under the previous library (tests: ring_abi).
/// Version 2: an event's last word is its call site (EventSlot::site; version 1 wrote 0
/// there), and a process may have a live segment (live.hpp) beside its ring.
inline constexpr uint32_t kAbiVersion = 2;
inline constexpr uint32_t kOldestAbiVersion = 1;  ///< the oldest version the daemon reads
inline constexpr uint32_t kMaxDevices = 16;
inline constexpr uint32_t kHeaderBytes = 16384;
inline constexpr uint32_t kDefaultSlotCount = 16384;  // 1 MiB of events
inline constexpr uint32_t kMinSlotCount = 64;
inline constexpr uint32_t kMaxSlotCount = 1u << 22;
inline constexpr uint64_t kNoLimit = ~0ULL;  // limit value meaning "uncapped"

static_assert(std::atomic<uint64_t>::is_always_lock_free, "shared counters need lock-free 64-bit atomics");
static_assert(std::atomic<uint32_t>::is_always_lock_free, "shared counters need lock-free 32-bit atomics");

/// What happened. Stored as uint8_t in EventSlot::kind.
enum class EventKind : uint8_t {
  alloc = 1,        ///< an allocation succeeded; bytes counted against the cap
  free = 2,         ///< an allocation was released; bytes returned
  refuse = 3,       ///< refused by cuwarden's cap: CUDA_ERROR_OUT_OF_MEMORY, driver not called
  driver_error = 4, ///< the driver itself failed the allocation (result holds its CUresult), or
                    ///< failed the free of a live allocation (api: the free's; address and
                    ///< bytes: the allocation's), which stays live; when that free was counted
                    ///< before its driver call (no cap or job on the device, or a
                    ///< stream-ordered free of a stream-ordered allocation), its own free
                    ///< event came first
  limit_change = 5, ///< the cap of a device changed (bytes = new limit, kNoLimit = none)
  host_alloc = 6,   ///< host (pinned) memory: tracked, not capped
  host_free = 7,
  job_refuse = 8,   ///< refused because the job's cap (CUWARDEN_JOB_LIMIT) is reached; aux = the
                    ///< job's cap, used_after = what the job's other members held (bytes)
  segment_alloc = 9,  ///< a pooling backend took memory from the driver for its pool (address,
                      ///< bytes of the driver allocation or mapped run); not counted by itself:
                      ///< used bytes already include what a pool holds
  segment_free = 10,  ///< a pooling backend gave a segment (or part of one) back to the driver
  suspend = 11,       ///< written by the daemon: the process was suspended (bytes: its device footprint
                      ///< now on the host)
  resume = 12,        ///< written by the daemon: the process was resumed (bytes: its device footprint;
                      ///< aux: how long it was suspended, ns)
  suspend_overdue = 13,  ///< written by the daemon: suspended by policy past its job's max_suspended
                         ///< with no room to resume it yet (bytes: its footprint; aux: how long, ns)
};

/// Which driver entry point produced an event. Stored as uint16_t in EventSlot::api.
enum class Api : uint16_t {
  unknown = 0,
  cuMemAlloc = 1,
  cuMemAllocPitch = 2,
  cuMemAllocManaged = 3,
  cuMemAllocAsync = 4,
  cuMemAllocFromPoolAsync = 5,
  cuMemFree = 6,
  cuMemFreeAsync = 7,
  cuMemCreate = 8,
  cuMemRelease = 9,
  cuArrayCreate = 10,
  cuArray3DCreate = 11,
  cuMipmappedArrayCreate = 12,
  cuArrayDestroy = 13,
  cuMipmappedArrayDestroy = 14,
  cuMemHostAlloc = 15,
  cuMemAllocHost = 16,
  cuMemFreeHost = 17,
  cuGraphMemAlloc = 18,
  control = 19,      ///< a limit change made from outside (daemon / CLI)
  cuCtxDestroy = 20, ///< freed by the driver with its context (cuCtxDestroy, a primary
                     ///< context's reset or last release): free / host_free events
  reused = 21,       ///< free / host_free of an allocation whose address (or handle) the
                     ///< driver handed out again: it was freed where the hooks did not see
                     ///< it (a context destroyed on another thread, a path not hooked);
                     ///< pushed just before the new allocation's event
  count_ = 22,
};

/// Stable, human-readable API name for display ("cuMemAlloc" ...); "unknown" when out of range.
const char* api_name(uint16_t api) noexcept;
/// Stable kind name ("alloc", "free", "refuse" ...); "unknown" when out of range.
const char* kind_name(uint8_t kind) noexcept;

/// One event, 64 bytes, one cache line. Written by exactly one producer per lap.
struct alignas(64) EventSlot {
  std::atomic<uint64_t> seq;  ///< ring protocol sequence (see top of file)
  uint64_t time_ns;           ///< CLOCK_REALTIME, ns since the Unix epoch, as the producer's
                              ///< clock reads it (the interposer's default,
                              ///< CLOCK_REALTIME_COARSE, is a tick or two behind): for the
                              ///< interposer's alloc events when the driver call returned,
                              ///< for the others when the call was made
  uint64_t address;           ///< device pointer or allocation handle (0 for refusals)
  uint64_t bytes;             ///< size of the request, in bytes
  uint64_t used_after;        ///< device's used bytes right after this event
  uint64_t aux;               ///< stream (async APIs) or 0
  uint32_t tid;               ///< Linux thread id of the caller
  uint16_t api;               ///< cuw::ring::Api
  uint8_t kind;               ///< cuw::ring::EventKind
  int8_t device;              ///< CUDA ordinal as the process sees it; -1 when unknown
  uint32_t result;            ///< CUresult returned to the application
  uint32_t site;              ///< call site id (live.hpp), 0 when none was captured (and in
                              ///< version 1 rings)
};
static_assert(sizeof(EventSlot) == 64);
static_assert(offsetof(EventSlot, time_ns) == 8);
static_assert(offsetof(EventSlot, tid) == 48);
static_assert(offsetof(EventSlot, result) == 56);

/// Words of a DeviceSlot that hold counters, stored rows of CUW_DEVICE_COUNTERS first, the
/// rest reserved (zero): (320 - 128 bytes of identity) / 8.
inline constexpr std::size_t kDeviceCounterWords = 24;

/// The reserved words after a slot's stored counters: N words of zero, or nothing at all when
/// the counters fill the slot (a zero-size array is not C++, so the empty case is its own
/// type, which [[no_unique_address]] lets take no room). N < 0 is a list too long for the slot.
template <std::ptrdiff_t N>
struct ReservedWords {
  static_assert(N >= 0, "the counters fill the DeviceSlot: another one needs a larger slot, a new kAbiVersion");
  static constexpr std::size_t count = static_cast<std::size_t>(N);
  uint64_t words[N];
};
template <>
struct ReservedWords<0> {
  static constexpr std::size_t count = 0;
};

#define CUW_RING_COUNTER_FIELD_(f, j, q, c, m, t, u, s, help) std::atomic<uint64_t> f;
/// The body of a DeviceSlot for a counter list (counters.hpp); a test builds one from a
/// longer list to show where a new counter lands.
#define CUW_DEVICE_SLOT_BODY(LIST)                                                                          \
  std::atomic<uint32_t> present; /* 1 once the interposer filled uuid/name/total */                        \
  int32_t ordinal;               /* CUDA ordinal in the process (== index of the slot) */                  \
  uint8_t uuid[16];              /* CUuuid of the device, the physical GPU's identity */                   \
  char name[96];                 /* NUL-terminated device name */                                          \
  uint64_t physical_total;       /* device memory reported by the driver, bytes */                         \
  LIST(CUW_RING_COUNTER_FIELD_, CUW_COUNTER_NONE_)                                                         \
  [[no_unique_address]] ::cuw::ring::ReservedWords<static_cast<std::ptrdiff_t>(::cuw::ring::kDeviceCounterWords) -   \
                                                  (0 LIST(CUW_COUNTER_ONE_, CUW_COUNTER_NONE_))>                      \
      reserved_words;

/// Per-device counters, indexed by the CUDA ordinal the process sees: the stored rows of
/// CUW_DEVICE_COUNTERS (counters.hpp says what each counts), in its order, one 64-bit word
/// each (bytes or counts). Written by the interposer under its own lock, one writer at a
/// time, each with a relaxed load and store (no locked instruction); `limit` may also be
/// written by the daemon (live cap changes), with one compare-and-swap. Readers take each
/// field with one atomic load.
///
/// ABI: the counters.hpp rule. A new counter takes the first reserved word, which a writer
/// built before it leaves zero; no field moves, so the daemon reads older rings as they are.
/// The counters may fill every word; once they do, the next one needs a larger slot, which
/// the rule beside kAbiVersion makes a new ring version, read by the daemon beside the others.
struct alignas(64) DeviceSlot {
  CUW_DEVICE_SLOT_BODY(CUW_DEVICE_COUNTERS)
};
static_assert(sizeof(DeviceSlot) % 64 == 0);
static_assert(sizeof(DeviceSlot) == 320, "DeviceSlot is shared memory: its size is part of the ABI");
static_assert(offsetof(DeviceSlot, physical_total) == 120 && offsetof(DeviceSlot, used) == 128,
              "the counters start at word 16 of the slot");
// Every field of versions 1 and 2 where they wrote it (word w of the counters at 128 + 8 w).
static_assert(offsetof(DeviceSlot, present) == 0 && offsetof(DeviceSlot, ordinal) == 4 &&
              offsetof(DeviceSlot, uuid) == 8 && offsetof(DeviceSlot, name) == 24);
#define CUW_RING_AT_(f, w) offsetof(DeviceSlot, f) == 128 + (w) * 8
static_assert(CUW_RING_AT_(used, 0) && CUW_RING_AT_(peak, 1) && CUW_RING_AT_(limit, 2) && CUW_RING_AT_(reserved, 3) &&
                  CUW_RING_AT_(live_allocations, 4) && CUW_RING_AT_(alloc_count, 5) && CUW_RING_AT_(free_count, 6) &&
                  CUW_RING_AT_(refusals, 7) && CUW_RING_AT_(driver_errors, 8) && CUW_RING_AT_(host_bytes, 9) &&
                  CUW_RING_AT_(cached, 10) && CUW_RING_AT_(pool_hits, 11) && CUW_RING_AT_(pool_waits, 12) &&
                  CUW_RING_AT_(context_bytes, 13) && CUW_RING_AT_(pool_free, 14) &&
                  CUW_RING_AT_(pool_largest_free, 15) && CUW_RING_AT_(managed_allocs, 16) &&
                  CUW_RING_AT_(ipc_handles, 17) && CUW_RING_AT_(shared_handles, 18) &&
                  CUW_RING_AT_(mps_client, 19) && CUW_RING_AT_(pool_driver_allocs, 20) &&
                  CUW_RING_AT_(pool_driver_frees, 21),
              "a stored counter moved: see the ABI rule");
#undef CUW_RING_AT_
static_assert(decltype(DeviceSlot::reserved_words)::count == kDeviceCounterWords - counters::kDeviceStored);

/// What a process's caps count, stored in RingHeader::cap_scope (CUWARDEN_CAP_SCOPE).
enum class CapScope : uint32_t {
  allocations = 0,  ///< the program's allocations (the driver's own memory for it is not counted)
  process = 1,      ///< also the context and modules: DeviceSlot::context_bytes
};

/// Process state values stored in RingHeader::state.
enum class ProcessState : uint32_t { starting = 0, running = 1, exited = 2 };

/// The ring file header. Fixed-width fields only; `header_size` lets a reader skip fields
/// added by newer writers of the same ABI version.
struct RingHeader {
  uint64_t magic;                 ///< kMagic
  uint32_t abi_version;           ///< kAbiVersion
  uint32_t header_size;           ///< sizeof(RingHeader) as the writer compiled it
  uint32_t slot_size;             ///< sizeof(EventSlot)
  uint32_t slot_count;            ///< power of two, kMinSlotCount..kMaxSlotCount
  uint32_t pid;                   ///< process id in the writer's pid namespace (pidns)
  uint32_t uid;                   ///< real uid of the process
  uint64_t start_time;            ///< /proc/<pid>/stat starttime (clock ticks since boot): pid-reuse guard
  uint64_t created_ns;            ///< CLOCK_REALTIME at ring creation
  std::atomic<uint32_t> state;    ///< ProcessState
  std::atomic<uint32_t> device_count;  ///< devices visible to the process (<= kMaxDevices)
  std::atomic<uint64_t> exited_ns;     ///< CLOCK_REALTIME at clean exit, 0 while running
  std::atomic<uint64_t> consumer_heartbeat_ns;  ///< written by the daemon on each drain (CLOCK_REALTIME)
  std::atomic<uint64_t> events_written;  ///< not written (0): events published = write_pos, since
                                         ///< every position a producer claims is published
  std::atomic<uint64_t> events_dropped;  ///< events lost because the ring was full
  char comm[32];                  ///< short process name, NUL-terminated
  char cmdline[256];              ///< command line, arguments separated by spaces, truncated
  char job[64];                   ///< CUWARDEN_JOB or empty
  char pool[16];                  ///< backend: a CUWARDEN_POOL value (options.hpp); "off": none
  uint32_t cap_scope;             ///< CapScope: what `used` (and so a cap) counts
  uint32_t reserved_word;
  /// Inode of the writer's pid namespace (/proc/self/ns/pid), in which `pid` is its pid;
  /// 0 from a writer that predates it (then the reader's namespace is assumed, as before).
  /// A reader in another namespace maps (pidns, pid) to its own pid before it judges the
  /// process (paths.hpp), and never judges one it cannot map.
  uint64_t pidns;
  /// Written by the daemon when it resumed the process from a suspension (the checkpoint
  /// API): how long it was suspended (ns) and by whom (NUL-terminated), then `resumes`
  /// incremented (release). The interposer prints one line on stderr at its next CUDA call
  /// for each increment it sees; 0 from a daemon that predates it.
  uint64_t suspended_ns;
  char suspended_by[32];
  std::atomic<uint64_t> resumes;
  /// CUWARDEN_PRIORITY as the process asked for it (`priority_asked` 1; 0: it asked for none,
  /// or a writer that predates it). Read by the daemon once, when it first sees the ring, and
  /// clamped by its policy: what the process writes later changes nothing.
  int32_t priority;
  uint32_t priority_asked;
  /// Written by the daemon when it first sees the process: how long, in ms, an allocation the
  /// GPU cannot serve may wait for the daemon to make room (the policy's room_wait); 0: no
  /// daemon has said (the interposer then waits at most 30 s).
  std::atomic<uint32_t> room_wait_ms;
  /// Written by the daemon: bit N set while allocations on the process's device N (its CUDA
  /// ordinal) are held back, because a process of higher priority suspended from that GPU by
  /// policy waits to be resumed there. While it is set, an allocation that would take device
  /// memory from the driver is refused (CUDA_ERROR_OUT_OF_MEMORY, counted and recorded as
  /// cuwarden's refusal), unless the daemon has not written `consumer_heartbeat_ns` for 5 s
  /// (a daemon gone leaves no process held back). 0: none held back, or a daemon that
  /// predates it.
  ///
  /// Bit 31 (kDevicesMoved), also the daemon's: it restored the process onto other GPUs
  /// (`cuwarden resume --gpu`; the driver keeps each CUDA ordinal and its addresses but gives
  /// it another physical GPU), so the UUIDs in `devices` are stale. The interposer learns the
  /// new ones before its next allocation at no cost on its hot path: every allocation already
  /// loads this word (a relaxed load, tested against 0) to see whether it is held back, and
  /// the bit makes that test take its cold branch, which clears the bit, asks the driver for
  /// each visible device's UUID again (cuDeviceGetUuid), rewrites the slots' `uuid` and moves
  /// the process's job share (cuw/job.hpp) from the old GPU's entry to the new one's. A word
  /// of its own would cost a second load on every allocation; a flag set by a signal would
  /// run in the application's signal context. Until then the daemon shows the new UUIDs from
  /// its own record of the move. The daemon sets the bit with an atomic OR and writes the
  /// hold bits with a compare-and-swap that keeps it; the interposer clears it with an AND.
  std::atomic<uint32_t> held_back;
  /// How many devices the process sees (cuDeviceGetCount, at most kMaxDevices), written with
  /// the first device the interposer fills; the `uuid` of each of them is written then too,
  /// `present` or not (a restore onto another GPU must name every GPU the process has: the
  /// daemon builds the driver's pairs from them). 0: not known yet, or a writer that predates it.
  std::atomic<uint32_t> visible_devices;
  uint64_t reserved_words[21];
  alignas(64) std::atomic<uint64_t> write_pos;  ///< next position producers claim
  alignas(64) std::atomic<uint64_t> read_pos;   ///< next position the consumer reads
  alignas(64) DeviceSlot devices[kMaxDevices];
};
static_assert(sizeof(RingHeader) <= kHeaderBytes);
static_assert(offsetof(RingHeader, abi_version) == 8);
static_assert(offsetof(RingHeader, slot_count) == 20);
static_assert(offsetof(RingHeader, pidns) == 464, "pidns took the first reserved word of the previous layout");
static_assert(offsetof(RingHeader, resumes) == 512, "the resume notice took reserved words of the previous layout");
static_assert(offsetof(RingHeader, priority) == 520, "the priority took the first reserved word of the previous layout");
static_assert(offsetof(RingHeader, held_back) == 532, "held_back took the reserved word after room_wait_ms");
static_assert(offsetof(RingHeader, visible_devices) == 536, "visible_devices took the reserved word after held_back");
static_assert(kMaxDevices <= 31, "held_back has one bit per device, and bit 31 for kDevicesMoved");
/// RingHeader::held_back's bit that says the process was restored onto other GPUs.
inline constexpr uint32_t kDevicesMoved = 1u << 31;

/// Total file size in bytes for `slot_count` slots.
constexpr uint64_t file_size(uint32_t slot_count) noexcept {
  return uint64_t{kHeaderBytes} + uint64_t{slot_count} * sizeof(EventSlot);
}

/// Event payload as producers fill it and consumers return it (no sequence field).
struct Event {
  uint64_t time_ns = 0;
  uint64_t address = 0;
  uint64_t bytes = 0;
  uint64_t used_after = 0;
  uint64_t aux = 0;
  uint32_t tid = 0;
  uint16_t api = 0;
  uint8_t kind = 0;
  int8_t device = -1;
  uint32_t result = 0;
  uint32_t site = 0;
};

/// Fill a slot claimed at position `pos` and publish it (the release store of seq).
CUW_INLINE void publish(EventSlot& s, uint64_t pos, const Event& e) noexcept {
  s.time_ns = e.time_ns;
  s.address = e.address;
  s.bytes = e.bytes;
  s.used_after = e.used_after;
  s.aux = e.aux;
  s.tid = e.tid;
  s.api = e.api;
  s.kind = e.kind;
  s.device = e.device;
  s.result = e.result;
  s.site = e.site;
  s.seq.store(pos + 1, std::memory_order_release);
}

/// A dropped event (the ring was full, or a consumer scribbled on the positions). Out of
/// line, so that the path that pushes stays one stretch of code.
__attribute__((cold, noinline)) inline void count_dropped(RingHeader& h) noexcept {
  h.events_dropped.fetch_add(1, std::memory_order_relaxed);
}

/// A push that loses this many races in a row (each one another producer's success, or a
/// position a consumer scribbled on) drops its event: a bound on what a consumer's garbage
/// can make the producer spin, far past what producers contending for the ring lose.
inline constexpr int kMaxPushAttempts = 1024;

/// Producer side. Lock-free, bounded: at most kMaxPushAttempts tries.
/// `slot_count` is the producer's private copy (never re-read from shared memory, which a
/// consumer could scribble on). Returns false (and counts a drop in the header) when the
/// ring is full, or after kMaxPushAttempts lost races. Thread-safe for any number of
/// producers, with no lock: the interposer's threads push straight from their hooks (a
/// pool's hit among them). Cost, uncontended: a relaxed load of write_pos, an acquire load
/// of the slot's seq, one CAS, the slot's stores and a release store. Inline (the
/// interposer's hot path): with `e` built in place, the compiler stores its fields straight
/// into the slot.
CUW_INLINE bool push(RingHeader& h, EventSlot* slots, uint32_t slot_count, const Event& e) noexcept {
  const uint64_t mask = slot_count - 1;
  uint64_t pos = h.write_pos.load(std::memory_order_relaxed);
  for (int attempt = 0; attempt < kMaxPushAttempts; ++attempt) {
    EventSlot& s = slots[pos & mask];
    const int64_t diff = static_cast<int64_t>(s.seq.load(std::memory_order_acquire) - pos);
    if (__builtin_expect(diff == 0, 1)) {
      if (__builtin_expect(h.write_pos.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed), 1)) {
        publish(s, pos, e);
        // The next event's slot: a line the consumer last read (or not touched for a lap).
        // Ask for it, for writing, now, so that the next push does not wait for it.
        __builtin_prefetch(&slots[(pos + 1) & mask], 1, 3);
        return true;
      }
      // The CAS failed and reloaded pos: another producer claimed it; try the next.
    } else if (diff < 0) {
      break;  // full: the consumer is a lap behind (or absent)
    } else {
      pos = h.write_pos.load(std::memory_order_relaxed);  // another producer moved on
    }
  }
  count_dropped(h);
  return false;
}

/// Initialise a freshly created, zero-filled mapping of file_size(slot_count) bytes.
/// `slot_count` must be a power of two in [kMinSlotCount, kMaxSlotCount].
void init(RingHeader& h, EventSlot* slots, uint32_t slot_count) noexcept;

/// Why a mapping is not a usable ring (validate()).
enum class Invalid : uint8_t { none, too_small, bad_magic, bad_abi, bad_header_size, bad_slot_size, bad_slot_count, size_mismatch };
const char* invalid_reason(Invalid r) noexcept;

/// Consumer side: check a mapping of `mapped_bytes` before trusting any field.
Invalid validate(const void* base, uint64_t mapped_bytes) noexcept;

/// Consumer side: copy up to `max` published events into `out`, advancing read_pos.
/// `h` must have passed validate(); `slot_count` is the consumer's own copy of the count it
/// validated against its mapping's size (never re-read from shared memory). A slot that was claimed but never published (its
/// producer died) is skipped once `stuck_skip` is true; skipped slots are added to *lost.
/// Never reads outside slots[0, slot_count). Single consumer only.
/// Only pass stuck_skip for a process that has exited: a producer that is merely paused
/// between claim and publish would otherwise publish into a slot already skipped.
std::size_t drain(RingHeader& h, EventSlot* slots, uint32_t slot_count, Event* out, std::size_t max,
                  bool stuck_skip, uint64_t* lost) noexcept;

}  // namespace cuw::ring

// cuwarden interposer core: caps, exact counters, the live-allocation table and the event
// producer, behind a small API the hooks call. Hooks never touch the ring directly.
//
// Counters live in the process's ring header (shared memory) so that the daemon reads the
// authoritative numbers; when no ring can be created they live in an anonymous mapping of
// the same layout and enforcement is unchanged.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <cuda.h>

#include "base/call_ref.hpp"
#include "core/array_owners.hpp"
#include "core/backend_base.hpp"
#include "core/callsites/callsites.hpp"
#include "core/config.hpp"
#include "cuw/attrs.hpp"
#include "base/fast_clock.hpp"
#include "core/live_segment.hpp"
#include "core/live_table.hpp"
#include "base/real.hpp"
#include "base/spin_lock.hpp"
#include "cuw/job.hpp"
#include "cuw/ring.hpp"

namespace cuw::core {

/// Add to / take from a counter: one atomic read-modify-write (relaxed), so a counter is
/// right whichever threads write it, under whichever lock or none (a pool's hit holds only
/// its pool's lock). Readers (the daemon, cuMemGetInfo) load each counter whole.
CUW_INLINE void counter_add(std::atomic<uint64_t>& c, uint64_t v) noexcept { c.fetch_add(v, std::memory_order_relaxed); }
CUW_INLINE void counter_sub(std::atomic<uint64_t>& c, uint64_t v) noexcept { c.fetch_sub(v, std::memory_order_relaxed); }
/// Raise `peak` to `v` if it is lower (a compare-and-swap only when it is).
CUW_INLINE void raise_peak(std::atomic<uint64_t>& peak, uint64_t v) noexcept {
  uint64_t p = peak.load(std::memory_order_relaxed);
  while (__builtin_expect(v > p, 0) && !peak.compare_exchange_weak(p, v, std::memory_order_relaxed)) {
  }
}

/// A device's pool book: the lock its pools hold (their free lists, block maps and batches)
/// and the records of the blocks they hand out, in the live segment as that device's pooled
/// table (live::pooled_slot), which that lock guards. A pool's hit takes this lock and no
/// other: pools of other devices never wait for it, nor does the hooks' own path
/// (Tracker::lock()), which a pool takes under it only for memory it is giving back or whose
/// context is going. Lock order: a book's lock, then Tracker::lock(); never a book's while
/// holding Tracker::lock() or another book's.
struct PoolBook {
  alignas(64) spin_lock mu;
  LiveTable blocks;
};

/// Stream-ordered allocations live in the driver's pools: what the process holds from the
/// driver for them is the pools' reserve (Tracker::refresh_pools), not their sum.
inline bool pooled(ring::Api api) noexcept {
  return api == ring::Api::cuMemAllocAsync || api == ring::Api::cuMemAllocFromPoolAsync;
}

class Tracker;
/// The calling thread's fast_clock::detail::ThreadState (the reentry depth, the thread id,
/// the clock's per-thread state), found from the thread pointer and hook::g_hot's
/// tls_offset, a line every hooked call reads anyway, rather than through the GOT. Lock-free.
CUW_INLINE fast_clock::detail::ThreadState& thread_state() noexcept {
  const intptr_t off = hook::g_hot.tls_offset.load(std::memory_order_relaxed);
  if (__builtin_expect(off == 0, 0)) return fast_clock::detail::t_state;  // before the constructor
  return *reinterpret_cast<fast_clock::detail::ThreadState*>(static_cast<char*>(__builtin_thread_pointer()) + off);
}

/// fast_clock::realtime_ns() through thread_state(): the event clock of the hot path.
CUW_INLINE uint64_t now_ns() noexcept { return fast_clock::realtime_ns(thread_state()); }

namespace detail {
/// The calling thread's Linux thread id (cached per thread, in its ThreadState).
uint32_t thread_id_slow() noexcept;
CUW_INLINE uint32_t thread_id() noexcept {
  const uint32_t tid = thread_state().tid;
  return __builtin_expect(tid != 0, 1) ? tid : thread_id_slow();
}
}  // namespace detail

/// The per-process core. One instance, created at the first CUDA call (Tracker::get()).
///
/// The hot path (an allocation or free through the hooks) is inline, in this header: a
/// hooked call runs right after the driver's own work has evicted the interposer from the
/// CPU's caches, so what matters is how many distinct cache lines of code and data it
/// touches. Each hook's path is one stretch of code; the fields it reads sit in the
/// object's first cache line, next to the lock; rare paths are out of line (CUW_COLD).
class Tracker {
 public:
  /// The instance; creates it on first use: reads the configuration (exits with 78 on bad
  /// configuration unless CUWARDEN_ON_ERROR=open), creates the ring. Thread-safe; after
  /// the first call, one acquire load.
  CUW_INLINE static Tracker& get() {
    auto* t = static_cast<Tracker*>(hook::g_hot.instance.load(std::memory_order_acquire));
    return __builtin_expect(t != nullptr, 1) ? *t : create();
  }

  /// The instance if one was created, else nullptr (used at exit). Lock-free.
  static Tracker* instance_if_created() noexcept {
    return static_cast<Tracker*>(hook::g_hot.instance.load(std::memory_order_acquire));
  }

  /// Device slot for a CUDA ordinal, filled on first use (UUID, name, physical memory, cap).
  /// nullptr when the ordinal is outside 0..ring::kMaxDevices-1 (then nothing is counted).
  CUW_INLINE ring::DeviceSlot* device(int ordinal) {
    if (static_cast<unsigned>(ordinal) >= ring::kMaxDevices) return nullptr;
    // The mask, in the hot line, rather than the slot's `present` (a line of its own).
    if (__builtin_expect(filled_.load(std::memory_order_acquire) >> ordinal & 1, 1)) return &header_->devices[ordinal];
    return fill_device_once(ordinal);
  }

  /// The slot of `ordinal` if it was filled (the process has a context or an allocation
  /// there: it has a row), else nullptr; never fills it. Lock-free.
  ring::DeviceSlot* device_if_filled(int ordinal) noexcept {
    if (static_cast<unsigned>(ordinal) >= ring::kMaxDevices) return nullptr;
    return filled_.load(std::memory_order_acquire) >> ordinal & 1 ? &header_->devices[ordinal] : nullptr;
  }

  /// The cap CUWARDEN_LIMIT gives device `ordinal` whose physical memory is `physical`
  /// bytes (kNoLimit: none), as its slot will hold once filled. Lock-free.
  uint64_t configured_limit(int ordinal, uint64_t physical) const noexcept;

  /// The job's cap per GPU (kNoLimit: no job, or a job without a cap). Lock-free.
  uint64_t job_cap() const noexcept;

  /// Ordinal of the calling thread's current context, or -1 (no context / driver error).
  /// One driver call (cuCtxGetDevice).
  CUW_INLINE int current_device() {
    auto get = ctx_get_device_.load(std::memory_order_relaxed);
    if (__builtin_expect(get == nullptr, 0)) get = resolve_ctx_get_device();
    CUdevice dev = -1;
    if (!get || get(&dev) != CUDA_SUCCESS) return -1;
    return dev;
  }

  /// The ordinal an allocation on the calling thread's current context is counted on,
  /// for the allocation hooks: when the process sees exactly one device (known once its
  /// slot was filled), 0 without asking the driver, and `*assumed` is set; a caller that
  /// got `*assumed` and whose driver call failed (or was refused) checks current_device()
  /// before counting anything (there may have been no context at all). Otherwise
  /// current_device().
  CUW_INLINE int allocation_device(bool* assumed) {
    if (single_device_.load(std::memory_order_relaxed)) {
      *assumed = true;
      return 0;
    }
    *assumed = false;
    return current_device();
  }

  /// The hot path's one lock. Held by a hooked call for one short critical section (for a
  /// free, before its driver call: the record taken out), never across a driver or system
  /// call. It guards the live tables
  /// (pointers, handles, host, and a pooling backend's segments). Not a pool's free lists and
  /// block records (each device's PoolBook guards its pools'), and not the counters: each is an atomic written with one relaxed
  /// read-modify-write (counter_add, counter_sub; `used` by charge()'s compare-and-swap),
  /// so the cap's check and the ring's push (ring::push, a CAS) take no lock, and an
  /// allocation under a cap takes this lock once, for its record. Readers outside the
  /// process (the daemon) and inside it (cuMemGetInfo) load each counter whole. The daemon
  /// writes only `limit`, atomically. The job segment (shared between processes) is
  /// lock-free and updated outside this lock.
  spin_lock& lock() noexcept { return mu_; }

  /// Try to count `bytes` against `dev`'s cap and, in a job, the job's cap on that GPU.
  /// Lock-free (the caller may hold lock() or not): one compare-and-swap of `used`, which
  /// never passes `limit`, and `peak` follows; then the job segment's reserve-then-validate
  /// (cuw/job.hpp). Returns ok, or refused when over either cap (the refusal is counted and
  /// a refuse / job_refuse event emitted). `assumed`: `ordinal` came from
  /// allocation_device() without asking the driver; then a refusal first checks that the
  /// thread has a context at all, and returns no_context (nothing charged, counted or
  /// emitted: the caller passes the call to the driver, which answers for itself). Cost:
  /// one compare-and-swap; in a job also one locked add and a read of each member's slot. `quiet`: a
  /// refusal is neither counted nor emitted (the caller can make room, a pool's memory, and
  /// charge again; its last try is not quiet).
  enum class Charge { ok, refused, no_context };

  /// The cap test, the one place it is written: whether `used` + `bytes` stays within
  /// `limit` (kNoLimit: always), without overflow.
  static constexpr bool within(uint64_t limit, uint64_t used, uint64_t bytes) noexcept {
    return limit == ring::kNoLimit || (bytes <= limit && used <= limit - bytes);
  }
  /// Whether `bytes` more would fit under `dev`'s cap now (within(), on relaxed loads; no
  /// charge, so only a hint under concurrency: charge() decides). Lock-free.
  static bool fits(const ring::DeviceSlot& dev, uint64_t bytes) noexcept {
    return within(dev.limit.load(std::memory_order_relaxed), dev.used.load(std::memory_order_relaxed), bytes);
  }
  Charge charge(ring::DeviceSlot& dev, int ordinal, uint64_t bytes, ring::Api api, bool assumed = false,
                bool quiet = false);

  /// True when nothing can refuse an allocation on `dev` right now: no cap on it and the
  /// process in no job. Then a hook need not charge before its driver call: it counts the
  /// bytes with count_uncapped_locked() after the call, in the same critical section as
  /// the table and the event (one lock instead of two). A cap set live in between (the
  /// daemon) is as if it came right after the allocation: a cap lowered below use is
  /// already allowed for. Lock-free (one relaxed load).
  CUW_INLINE bool uncapped(const ring::DeviceSlot& dev, int ordinal) const noexcept {
    return dev.limit.load(std::memory_order_relaxed) == ring::kNoLimit && job_gpu(ordinal) < 0;
  }
  /// Whether the daemon holds back allocations on `ordinal` (ring.hpp: held_back, which it
  /// sets while a higher-priority process suspended from that GPU waits to be resumed), from
  /// a daemon that still writes its heartbeat (5 s). charge() refuses while it holds; a hook
  /// that does not charge asks held_back_refused() before its driver call. Lock-free.
  /// The same load also carries the daemon's word that the process was restored onto other
  /// GPUs (ring::kDevicesMoved): its cold branch learns the new UUIDs (devices_moved())
  /// before the allocation goes on, so it is counted on the new GPU.
  CUW_INLINE bool held_back(int ordinal) noexcept {
    const uint32_t mask = header_->held_back.load(std::memory_order_relaxed);
    return __builtin_expect(mask != 0, 0) && held_back_slow(mask, ordinal);
  }
  /// Whether the daemon holds back any device: one relaxed load of a header word it writes
  /// only while a restore is pending. Lock-free.
  CUW_INLINE bool any_held_back() const noexcept {
    return header_->held_back.load(std::memory_order_relaxed) != 0;
  }
  /// For an allocation that was not charged, after any_held_back(): whether held_back()
  /// refuses it, as charge() would (counted, a refuse event, the report); false also when
  /// `assumed` and the thread has no context (the driver answers). Cold.
  bool held_back_refused(ring::DeviceSlot& d, int ordinal, uint64_t bytes, ring::Api api, bool assumed);
  /// Give back bytes counted by charge() (a failed driver call, or a free): `used` (one
  /// atomic subtract), then the job's share. Lock-free.
  void uncharge(ring::DeviceSlot& dev, uint64_t bytes) noexcept;
  /// `used` only (one atomic subtract; lock() held or not); call job_uncharge() after
  /// unlocking.
  void uncharge_locked(ring::DeviceSlot& dev, uint64_t bytes) noexcept { counter_sub(dev.used, bytes); }
  /// Count bytes that are already allocated, cap or not (a pitch larger than estimated):
  /// `used` and `peak`, atomically (lock() held or not); call job_force_charge() after
  /// unlocking.
  void force_charge_locked(ring::DeviceSlot& dev, uint64_t bytes) noexcept;
  /// The job's share of uncharge / force_charge (lock-free; no-op outside a job).
  /// `ordinal`: the device's CUDA ordinal (the slot's index).
  CUW_INLINE void job_uncharge(int ordinal, uint64_t bytes) noexcept {
    if (const int g = job_gpu(ordinal); __builtin_expect(g >= 0, 0)) job_uncharge_slow(g, bytes);
  }
  void job_force_charge(int ordinal, uint64_t bytes) noexcept;

  /// The job's cap on `ordinal`'s GPU and what all members hold there (bytes). False when
  /// the process is in no job, or the job has no cap. Lock-free.
  bool job_view(int ordinal, uint64_t* cap, uint64_t* used) const noexcept;

  /// Stream-ordered pools: remember `pool` (nullptr = the device's default pool) as one
  /// that holds memory for `ordinal`, and refresh the device's `reserved` figure from the
  /// pools' CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT (what they keep from the driver, in use or
  /// cached). `force` = false refreshes at most once a millisecond per device. `discover` = false only refreshes pools already seen, and never
  /// asks the driver for a device's default pool (a program that never used stream-ordered
  /// allocation is left exactly as it was). Thread-safe.
  void refresh_pools(int ordinal, CUmemoryPool pool, bool force, bool discover = true) noexcept;

  /// After a stream-ordered allocation on `ordinal`'s pools (its bytes already counted in
  /// the pools' live bytes by the ledger): the pools are refreshed at once when their live
  /// bytes passed what they were known to reserve (the pool grew), else at most once a
  /// millisecond. `stream` is the allocation's stream: while it is being captured into a
  /// graph the refresh is skipped (no driver query inside a capture), and done at a later one.
  /// `now` is the allocation event's time (fast_clock::realtime_ns()).
  CUW_INLINE void pooled_alloc(int ordinal, CUmemoryPool pool, CUstream stream, uint64_t now) noexcept {
    if (static_cast<unsigned>(ordinal) >= ring::kMaxDevices) return;
    PoolSet& ps = pools_[ordinal];
    const bool grew = ps.live.load(std::memory_order_relaxed) > ps.reserved.load(std::memory_order_relaxed);
    if (__builtin_expect(!grew && now - ps.refreshed_ns.load(std::memory_order_relaxed) < 1'000'000ULL &&
                             ps.pools[0].load(std::memory_order_relaxed) != nullptr,
                         1))
      return;
    pooled_refresh(ordinal, pool, stream);
  }

  /// Emit an event into the ring, stamped now. Lock-free (ring::push); never blocks on the
  /// consumer (drops and counts when full).
  void emit(ring::EventKind kind, ring::Api api, int ordinal, uint64_t address, uint64_t bytes, uint64_t aux,
            uint32_t result) noexcept;
  /// The same with the time already read (fast_clock::realtime_ns(), read before a critical
  /// section to keep it short), lock() held or not. used_after is `ordinal`'s used as this
  /// thread loads it (another thread's charge may land between its counters and this load).
  CUW_INLINE void emit_at(ring::EventKind kind, ring::Api api, int ordinal, uint64_t address, uint64_t bytes,
                          uint64_t aux, uint32_t result, uint64_t time_ns) noexcept {
    const bool known = static_cast<unsigned>(ordinal) < ring::kMaxDevices;
    emit_at(kind, api, ordinal, address, bytes, aux, result, time_ns,
            known ? header_->devices[ordinal].used.load(std::memory_order_relaxed) : 0);
  }
  /// The same with used_after given (a job refusal reports what the job's members hold).
  CUW_INLINE void emit_at(ring::EventKind kind, ring::Api api, int ordinal, uint64_t address, uint64_t bytes,
                          uint64_t aux, uint32_t result, uint64_t time_ns, uint64_t used_after) noexcept {
    ring::Event e;
    e.time_ns = time_ns;
    e.address = address;
    e.bytes = bytes;
    e.aux = aux;
    e.api = static_cast<uint16_t>(api);
    e.kind = static_cast<uint8_t>(kind);
    e.device = static_cast<int8_t>(static_cast<unsigned>(ordinal) < ring::kMaxDevices ? ordinal : -1);
    e.used_after = used_after;
    e.result = result;
    // An allocation's events carry the call site its hook captured (SiteScope); 0 when off.
    if (kind == ring::EventKind::alloc || kind == ring::EventKind::refuse || kind == ring::EventKind::job_refuse ||
        kind == ring::EventKind::driver_error || kind == ring::EventKind::host_alloc)
      e.site = thread_state().site;
    push_event(e);
  }

  /// Right after a driver call, before the critical section that records it: ask the CPU
  /// for the lines that section writes (the lock's, `d`'s counters, the next ring slot and
  /// the ring's shared write position), so that their misses overlap rather than follow
  /// one another (the driver's own work evicted them). Reads a few words without the lock:
  /// a stale value only prefetches a wrong line. (Prefetching the thread's own line and the
  /// pools' line as well measured no different on an H200 host: 2026-11-30-h200-off-clock.md.)
  CUW_INLINE void prefetch_commit(const ring::DeviceSlot& d) noexcept {
    __builtin_prefetch(&mu_, 1, 3);
    __builtin_prefetch(&d.used, 1, 3);
    const uint64_t pos = header_->write_pos.load(std::memory_order_relaxed);
    __builtin_prefetch(&slots()[pos & (slot_count_ - 1)], 1, 3);
    __builtin_prefetch(&header_->write_pos, 1, 3);
  }

  /// CUWARDEN_CAP_SCOPE=process: bring device `ordinal`'s context_bytes, and with them its
  /// `used` (and the job's share), to what the driver holds for this process there beyond
  /// its allocations (the context, its modules, the driver's rounding): NVML's per-process
  /// figure minus the bytes the process's allocations reserve. `force` = false: not again
  /// within 10 ms of the last measurement of the device. Returns true when the figure went down (room was made). Nothing
  /// (false) under CUWARDEN_CAP_SCOPE=allocations, for a device without a row, at exit, or
  /// when NVML cannot tell (a PID namespace hides the process from it: then, logged once, the
  /// process falls back to counting allocations). Called after a context is retained or
  /// destroyed, from charge() (context_before_charge, and before a refusal), and by
  /// cuMemGetInfo. Thread-safe; without lock() held; cold (one NVML query, about 0.1-1 ms).
  bool measure_context(int ordinal, bool force) noexcept;
  /// Whether `used` is close enough to `limit` (kNoLimit: never) that the context's figure
  /// must be current: within an eighth of the cap, or 512 MiB, whichever is more (more than
  /// a library's modules load at once).
  static bool near_cap(uint64_t limit, uint64_t used) noexcept {
    if (limit == ring::kNoLimit) return false;
    const uint64_t margin = std::max<uint64_t>(limit / 8, 512ULL << 20);
    return used + margin > limit;
  }

  /// The allocation backend chosen at start (backends/backend.hpp), in the hot line: the
  /// hooks dispatch on it. nullptr until the first hook that needs it started it
  /// (backends::start). Lock-free (one load).
  CUW_INLINE backend_base* backend() const noexcept { return backend_.load(std::memory_order_acquire); }
  /// True once a pooling backend is in place (backend()->pools()), read without touching the
  /// backend's own lines. Lock-free.
  CUW_INLINE bool pooling() const noexcept { return pooling_.load(std::memory_order_acquire); }
  /// Install the backend `make()` returns (backends::start), once: the first caller makes
  /// it, callers racing it wait and get the same one. Returns the backend in place; `make`
  /// must not return nullptr. Thread-safe; cold.
  backend_base* start_backend(call_ref<backend_base*()> make);
  /// Ask the backend for the memory it keeps (backend_base::release), if it pools; the bytes
  /// given back. Without the lock held. Cold.
  uint64_t reclaim();

  /// With lock() held: the allocation `rec` (taken out of its live table, at `key`) was
  /// freed by the driver where no free hook saw it. `api` says how it was found:
  /// ring::Api::cuCtxDestroy (freed with its context), ring::Api::reused (the driver handed
  /// `key` out again while the table still held `rec`: LiveTable::insert's `replaced`, or a
  /// take; the event comes before the new allocation's own). Counted freed now: uncharged,
  /// a free event with `api` at `now`; nothing for a record of no tracked device. The caller
  /// calls job_uncharge(rec.device, rec.bytes) after unlocking. Cold.
  void count_freed_unseen_locked(uint64_t key, const LiveRecord& rec, ring::Api api, uint64_t now) noexcept;

  /// The live tables; lock() held to use them. Their slots live in the live segment, where
  /// the daemon reads them (live_segment.hpp).
  LiveTable& pointers() noexcept { return pointers_; }
  LiveTable& handles() noexcept { return handles_; }  ///< VMM handles, arrays
  LiveTable& host() noexcept { return host_; }        ///< pinned / registered host memory
  /// The driver memory a pooling backend holds (records for the snapshot only: the backend
  /// counts it itself); lock() held to use it.
  LiveTable& pool_segments() noexcept { return live_->pool_segments; }
  /// Device `ordinal`'s pool book (its pools' lock and the records of the blocks they hand
  /// out). Lock-free; the book outlives every pool.
  PoolBook& pool_book(int ordinal) noexcept { return live_->pool_books[ordinal & (ring::kMaxDevices - 1)]; }
  LiveSegment& live_segment() noexcept { return live_->segment; }
  CallSites& call_sites() noexcept { return live_->sites; }

  /// Whether allocations capture their call site (CUWARDEN_CALLSITES > 0 and it could be
  /// set up). Lock-free, in the hot line.
  CUW_INLINE bool callsites_on() const noexcept { return callsites_on_.load(std::memory_order_relaxed); }

  /// An allocation of `bytes` on `ordinal` through `api` was refused (`kind`: refuse or
  /// job_refuse; or driver_error with the driver's `result`): the program's standard error
  /// gets one paragraph (what was asked, the cap, what is in use and what the pool holds,
  /// where the request came from, the top call sites, the command for the full snapshot),
  /// the first in full and again after a minute; the refusals between are counted in one
  /// line at most once a second, and at exit (report_unsaid_ooms). Noted here and written by flush_oom_report() when the
  /// hook ends (SiteScope), outside every backend lock: writing it reads the live segment
  /// and names frames (dladdr takes the loader's lock). Without lock() held. Cold.
  void report_oom(int ordinal, uint64_t bytes, ring::Api api, ring::EventKind kind, uint32_t result) noexcept;
  /// Write the paragraph report_oom() noted on this thread; `asked`: the program's request
  /// (the refused bytes may be a pool's rounded segment), 0: unknown. Cold.
  void flush_oom_report(uint64_t asked) noexcept;
  /// CUWARDEN_LEAKS=report: what was never freed, by call site, to standard error (on_exit).
  void report_leaks() noexcept;
  /// Refusals not yet told (flush_oom_report): one line saying how many, if any. on_exit.
  void report_unsaid_ooms() noexcept;
  /// The printed form (cuw/frames.hpp, built-in rules) of each call site in `ids`, told
  /// apart among them, with its folded frames in brackets. Allocates (may throw); cold.
  std::vector<std::string> labels(const std::vector<uint32_t>& ids) const;

  /// The context of each array in handles() (array_owners.hpp); lock() held to use it. A
  /// forked child's tracker starts with none (its parent's are not its own).
  ArrayOwners& array_owners() noexcept { return live_->array_owners; }
  const Config& config() const noexcept { return config_; }
  ring::RingHeader& header() noexcept { return *header_; }

  /// Mark the process exited in the ring (atexit). Never unmaps: CUDA calls made by other
  /// destructors after this still work.
  void on_exit() noexcept;
  /// on_exit() ran (the process is exiting). Lock-free.
  bool exiting() const noexcept { return header_->exited_ns.load(std::memory_order_relaxed) != 0; }

 private:
  friend class Ledger;  // the one writer of counters, live records and their events (ledger.hpp)

  /// `used` and `peak` for an allocation that was not charged (uncapped()); lock() held.
  CUW_INLINE void count_uncapped_locked(ring::DeviceSlot& d, uint64_t bytes) noexcept {
    raise_peak(d.peak, d.used.fetch_add(bytes, std::memory_order_relaxed) + bytes);
  }

  /// A pooling backend took (`added`) or gave back driver memory [base, base + bytes) on
  /// `ordinal`: its record in pool_segments() (for snapshots) and a segment_alloc /
  /// segment_free event. Nothing is counted (the pool counts what it holds: Ledger::moved). `bytes` 0
  /// on give-back: the record's size. `unit` > 0: one record per `unit` bytes (the vmm
  /// layout's granules, each mapped and unmapped alone), still one event. Takes lock(); cold.
  void record_segment(int ordinal, uint64_t base, uint64_t bytes, bool added, uint64_t unit = 0) noexcept;
  /// The stream-ordered pools of `ordinal`'s device (the ledger counts their live bytes).
  struct PoolSet;
  PoolSet& pool_set(int ordinal) noexcept { return pools_[ordinal & (ring::kMaxDevices - 1)]; }

  /// `notes`: the caller's scratch for load_config()'s notes, said once the log is set up
  /// (kept out of the tracker, which fits one page).
  explicit Tracker(std::vector<std::string>* notes);
  ~Tracker() = delete;  // never destroyed: CUDA calls made by other destructors still work
  static Tracker& create();
  ring::DeviceSlot* fill_device_once(int ordinal);
  /// held_back() with a mask that is not 0: whether it has `ordinal`'s bit, from a daemon
  /// that still writes its heartbeat (5 s). Cold.
  bool held_back_slow(uint32_t mask, int ordinal) noexcept;
  /// The daemon restored the process onto other GPUs (ring::kDevicesMoved): clear the bit,
  /// ask the driver for each visible device's UUID again, rewrite the ring's slots and move
  /// the job's share of each moved device to its new GPU's entry. Takes device_mu_; call
  /// without it (devices_moved.cpp). Cold.
  void devices_moved() noexcept;
  /// The visible devices' count and UUIDs into the ring (RingHeader::visible_devices), with
  /// the first device filled; device_mu_ held.
  void note_visible_devices() noexcept;
  /// charge()'s refusal by the process cap or a hold (lock() not held): the context check,
  /// the count and the event.
  Charge refuse(ring::DeviceSlot& d, int ordinal, uint64_t bytes, ring::Api api, bool assumed);
  /// charge()'s first step under CUWARDEN_CAP_SCOPE=process: measure_context when `d` was
  /// never measured, or when `bytes` more would bring it near its cap or its job's cap
  /// (near_cap). Without lock() held (cap_scope.cpp).
  void context_before_charge(ring::DeviceSlot& d, int ordinal, uint64_t bytes) noexcept;
  /// CUWARDEN_CAP_SCOPE=process given up (NVML cannot see this process): logged once with
  /// `why`, and the ring says allocations from then on. The context memory already counted
  /// stays counted (a figure measured before).
  void fall_back_to_allocations(const char* why) noexcept;
  using ctx_get_device_fn = CUresult (*)(CUdevice*);
  ctx_get_device_fn resolve_ctx_get_device() noexcept;
  void job_uncharge_slow(int job_gpu, uint64_t bytes) noexcept;
  void pooled_refresh(int ordinal, CUmemoryPool pool, CUstream stream) noexcept;
  void create_ring();
  ring::EventSlot* slots() const noexcept {
    return reinterpret_cast<ring::EventSlot*>(reinterpret_cast<char*>(header_) + ring::kHeaderBytes);
  }
  /// True when a daemon accepts connections on the run directory's socket (never blocks).
  bool daemon_listening() const noexcept;
  /// The ring file's path, from the run directory and the header's pid and start time (not
  /// kept: the tracker shares one page with g_hot). Allocates; cold paths only.
  std::string ring_path() const;
  void fill_device(int ordinal, ring::DeviceSlot& d);
  /// Stamp the thread on `e` (time already set) and push it into the ring. Lock-free.
  CUW_INLINE void push_event(ring::Event& e) noexcept {
    e.tid = detail::thread_id();
    ring::push(*header_, slots(), slot_count_, e);
  }
  /// Join CUWARDEN_JOB's segment (constructor). Failure is a configuration error.
  void join_job();
  int job_gpu(int ordinal) const noexcept {
    // In no job is the common case: its test laid out as the straight line.
    return __builtin_expect(job_slot_ >= 0, 0) && ordinal >= 0 && ordinal < static_cast<int>(ring::kMaxDevices)
               ? job_gpu_[ordinal].load(std::memory_order_relaxed)
               : -1;
  }

  // The hot path's fields: the object's first cache line, with the lock (a hooked call
  // runs with the caches cold, so each line is a miss). The ring's slots follow its header
  // at a fixed offset (slots()).
  alignas(64) spin_lock mu_;
  std::atomic<bool> single_device_{false};  ///< the process sees one device (allocation_device)
  std::atomic<bool> pooling_{false};        ///< backend_ pools (set after it, with release)
  /// CUWARDEN_CAP_SCOPE=process and NVML can tell (set at construction; cleared, once, if it
  /// turns out NVML cannot see this process).
  std::atomic<bool> process_scope_{false};
  /// Bit i: devices[i] is filled (device()). Bit kUnmeasured + i, under
  /// CUWARDEN_CAP_SCOPE=process: device i has a row but NVML has not reported its context yet
  /// (charge() asks it first, at most every 10 ms); in the same word, so that the hot line
  /// keeps its size.
  std::atomic<uint32_t> filled_{0};
  static constexpr unsigned kUnmeasured = 16;
  static_assert(ring::kMaxDevices <= kUnmeasured, "filled_ holds two bits per device");
  uint32_t slot_count_ = 0;
  int16_t job_slot_ = -1;                  ///< (a job has at most job::kMaxMembers)
  std::atomic<bool> callsites_on_{false};  ///< live_->sites captures (callsites_on())
  ring::RingHeader* header_ = nullptr;
  std::atomic<backend_base*> backend_{nullptr};  ///< never destroyed (see start_backend)
  LiveTable pointers_;
  // (end of the first line)
  std::atomic<ctx_get_device_fn> ctx_get_device_{nullptr};
  job::Segment* job_ = nullptr;
  /// See below; atomic because devices_moved() rewrites an entry while allocations read it.
  std::atomic<int8_t> job_gpu_[ring::kMaxDevices];
  static_assert(job::kMaxGpus <= 127, "job_gpu_ holds a job's GPU index in a byte");

  Config config_;
  bool ring_is_file_ = false;
  std::mutex device_mu_;  ///< serializes fill_device_once and start_backend (both cold)
  /// measure_context's state (cap_scope.cpp), off the tracker's page (in Live).
  struct ContextMeasures {
    std::mutex mu;                                  ///< serializes measure_context
    uint64_t measured_ns[ring::kMaxDevices] = {};   ///< CLOCK_MONOTONIC of the last measurement
    uint64_t first_try_ns[ring::kMaxDevices] = {};  ///< CLOCK_MONOTONIC of the first try
  };
  // The job (CUWARDEN_JOB): segment (job_, above), our slot (job_slot_, above; -1: no
  // job), the job's GPU index of each ordinal (job_gpu_, above; -1: not counted, e.g. the
  // job's GPU table is full). Set before the device is marked filled, read after it.
  // handles_, host_ and live_ fill what pools_' alignment leaves before it: the tracker and
  // g_hot share one page (tracker.cpp), and what follows pools_ would take a line more.
  LiveTable handles_;
  LiveTable host_;
  /// The live segment, the pool's tables, the call sites, the array owners and the context
  /// measures: off the tracker's page (which holds the hot line and has a fixed size).
  struct Live {
    PoolBook pool_books[ring::kMaxDevices];
    LiveTable pool_segments;
    LiveSegment segment;
    CallSites sites;
    std::atomic<uint64_t> last_oom_report_ns{0};  ///< the last paragraph (CLOCK_REALTIME ns)
    std::atomic<uint64_t> last_oom_line_ns{0};    ///< the last paragraph or count line
    std::atomic<uint64_t> oom_unsaid{0};          ///< refusals since, not yet told
    ArrayOwners array_owners;
    ContextMeasures context;
  };
  std::unique_ptr<Live> live_ = std::make_unique<Live>();  ///< never null
  /// Per device: the stream-ordered pools seen and what they reserved at the last refresh.
  struct PoolSet {
    static constexpr int kMax = 8;
    // What pooled_alloc reads and the ledger writes, in one line.
    alignas(64) std::atomic<uint64_t> live{0};  ///< bytes of live stream-ordered allocations (atomic adds)
    std::atomic<uint64_t> reserved{0};          ///< sum over pools, bytes
    std::atomic<uint64_t> refreshed_ns{0};      ///< fast_clock::realtime_ns() of the last refresh
    std::atomic<CUmemoryPool> pools[kMax] = {};
    std::mutex mu;                              ///< serialises refreshes (never on the alloc path)
  };
  PoolSet pools_[ring::kMaxDevices];
};

/// The call site of the allocation a hook is making: captured at its start (outside every
/// lock) when call sites are on, stored in the thread's state for the records and events
/// made deeper in, cleared at its end. One relaxed load and a branch when off.
class SiteScope {
 public:
  /// `asked`: the program's request in bytes (what an out-of-memory paragraph says it asked).
  CUW_INLINE explicit SiteScope(Tracker& t, uint64_t asked = 0) noexcept : t_(t), asked_(asked) {
    if (__builtin_expect(t.callsites_on(), 0)) {
      thread_state().site = t.call_sites().capture();
      on_ = true;
    }
  }
  CUW_INLINE ~SiteScope() {
    fast_clock::detail::ThreadState& ts = thread_state();
    if (__builtin_expect(ts.oom_pending, 0)) t_.flush_oom_report(asked_);
    if (__builtin_expect(on_, 0)) ts.site = 0;
  }
  SiteScope(const SiteScope&) = delete;
  SiteScope& operator=(const SiteScope&) = delete;

 private:
  Tracker& t_;
  uint64_t asked_;
  bool on_ = false;
};

/// Thread-local re-entrancy guard: a hook entered from inside another hook on the same
/// thread (a driver calling its own exported entry point) passes straight through.
class Reentry {
 public:
  Reentry() noexcept : depth_(thread_state().reentry_depth), nested_(depth_ > 0) { ++depth_; }
  ~Reentry() { --depth_; }
  bool nested() const noexcept { return nested_; }

 private:
  // In the thread's hot line (fast_clock::detail::ThreadState, initial-exec TLS: the
  // library is preloaded, so no __tls_get_addr call), found through thread_state().
  int& depth_;
  bool nested_;
};

}  // namespace cuw::core

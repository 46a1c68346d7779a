// cuwarden interposer: the hooks themselves. Each one: re-entry guard, then the tracker's
// cap check, the real driver call through REAL(fn), the live table, one event.
// The rows of hook_table.hpp and these definitions must match one to one.
#include <cuda.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <optional>
#include <type_traits>
#include <vector>

#include "backends/cache/cache_resource.hpp"
#include "cuw/attrs.hpp"
#include "base/fast_clock.hpp"
#include "base/real.hpp"
#include "core/tracker.hpp"

using cuw::core::ArrayOwner;
using cuw::core::ArrayOwners;
using cuw::core::LiveRecord;
using cuw::core::Reentry;
using cuw::core::Tracker;
using cuw::core::pooled;
namespace ring = cuw::ring;

#define CUW_EXPORT extern "C" __attribute__((visibility("default")))
// Entry points on the allocation hot path: grouped with the tracker's hot code (cuw/attrs.hpp).
#define CUW_EXPORT_HOT extern "C" __attribute__((visibility("default"), hot))

namespace {

/// Cap-adjusted (total, free) of a device, as cuMemGetInfo and NVML report them: total is
/// the cap (or the physical size, if smaller), free is what the cap leaves and never more
/// than the driver's own free figure, and never underflows when use is over a cap lowered
/// live. In a job with a cap, the job's cap and what its members hold bound both as well.
/// Returns false when neither the process nor its job has a cap (report the driver's
/// figures as they are).
bool capped_view(const Tracker& t, ring::DeviceSlot& d, uint64_t real_total, uint64_t real_free, uint64_t* total,
                 uint64_t* free_b) {
  const uint64_t limit = d.limit.load(std::memory_order_relaxed);
  uint64_t job_cap = ring::kNoLimit, job_used = 0;
  const bool in_job = t.job_view(d.ordinal, &job_cap, &job_used);
  if (limit == ring::kNoLimit && !in_job) return false;
  uint64_t cap_total = limit < real_total ? limit : real_total;
  // Bytes the cache keeps for reuse are free for the program: it gives them back (or
  // reuses them) before refusing anything.
  const uint64_t counted = d.used.load(std::memory_order_relaxed);
  const uint64_t cached = d.cached.load(std::memory_order_relaxed);
  const uint64_t used = cached < counted ? counted - cached : 0;
  uint64_t cap_free = used >= cap_total ? 0 : cap_total - used;
  if (in_job) {
    // The job counts what each member holds from the driver, our cache included.
    if (job_cap < cap_total) cap_total = job_cap;
    const uint64_t job_in_use = cached < job_used ? job_used - cached : 0;
    const uint64_t job_free = job_in_use >= job_cap ? 0 : job_cap - job_in_use;
    if (job_free < cap_free) cap_free = job_free;
  }
  *total = cap_total;
  *free_b = real_free < cap_free ? real_free : cap_free;
  return true;
}

// A driver entry point we hook but cannot find: behave like a driver that lacks it.
constexpr CUresult kNoDriver = CUDA_ERROR_NOT_INITIALIZED;

/// For an ordinal assumed by Tracker::allocation_device (one device, no driver call):
/// whether the thread has a context at all. Asked after a failed allocation (no context:
/// the driver's answer passes through, uncounted, as for any call without a context; under
/// a cap the bytes charged before the call are given back, though `peak` may keep them).
CUW_COLD bool has_context(Tracker& t) { return t.current_device() >= 0; }

/// A failed driver allocation: give back what was charged, count, record; cold.
CUW_COLD void count_driver_error(Tracker& t, ring::DeviceSlot& d, int ordinal, ring::Api api, uint64_t bytes,
                                 uint64_t aux, CUresult r, bool charged, uint64_t now) {
  {
    std::lock_guard<cuw::spin_lock> lk(t.lock());
    if (charged) t.uncharge_locked(d, bytes);
    cuw::core::locked_add(d.driver_errors, 1);
    t.emit_locked(ring::EventKind::driver_error, api, ordinal, 0, bytes, aux, r, now);
  }
  if (charged) t.job_uncharge(ordinal, bytes);
}

/// No-op for tracked_alloc_in's `on_insert`.
struct NoInsertHook {
  void operator()(uint64_t) const noexcept {}
};

/// tracked_alloc_in's `on_insert` for a VMM handle (the tracker's lock held): an array
/// entry left at the same value (an array freed where the hooks did not see it) is
/// dropped (its node freed under the lock: rare), so that its context's destruction cannot
/// sweep the handle as that array. One lookup in an empty map when no arrays are in use.
struct ForgetArray {
  Tracker* t;
  void operator()(uint64_t key) const noexcept { t->array_owners().forget(key, 0); }
};

/// Count, call, record in `table`. `call` performs the real allocation and writes *out
/// on success. `assumed`: `ordinal` came from Tracker::allocation_device without asking
/// the driver. `on_insert(key)` runs in the insert's critical section (the tracker's lock
/// held). Hot path: the device slot (one branch); with a cap or in a job, charge (one
/// lock) before the call; the driver call; then one lock for the table insert, the
/// counters (and, uncapped, the charge) and the event.
template <class Call, class Key, class OnInsert = NoInsertHook>
CUW_INLINE CUresult tracked_alloc_in(Tracker& t, cuw::core::LiveTable& table, ring::Api api, int ordinal, bool assumed,
                                     uint64_t bytes, uint64_t aux, Call&& call, Key&& key_of_result,
                                     uint64_t* when = nullptr, OnInsert on_insert = {}) {
  ring::DeviceSlot* d = t.device(ordinal);
  if (!d) return call();  // no context, or an ordinal past what we track
  const bool charged = !t.uncapped(*d, ordinal);
  if (__builtin_expect(charged, 0)) {  // no cap (monitoring only): the straight line
    // With the cache on, a refusal waits until the cache gave back what it keeps free
    // (every context's: the cap is the device's), then charges again: a refusal is for
    // real need only.
    cuw::backends::cache_registry* reg = t.cache();
    Tracker::Charge c = t.charge(*d, ordinal, bytes, api, assumed, reg != nullptr);
    if (__builtin_expect(c == Tracker::Charge::refused && reg != nullptr, 0)) {
      reg->release_all();
      c = t.charge(*d, ordinal, bytes, api, assumed);  // a refusal now is counted and recorded
    }
    if (__builtin_expect(c != Tracker::Charge::ok, 0)) return c == Tracker::Charge::refused ? CUDA_ERROR_OUT_OF_MEMORY : call();
  }
  CUresult r = call();
  t.prefetch_commit(*d);
  // The event's time: when the call returned. Read after the driver call, so that a free
  // right after it (the common alloc, use, free pattern; a free reads its time before its
  // driver call) finds the clock's code and data in the cache.
  const uint64_t now = cuw::core::now_ns();
  if (when) *when = now;
  if (__builtin_expect(r == CUDA_SUCCESS, 1)) table.prefetch(key_of_result());
  // The driver is out of memory and the cache keeps some (CUWARDEN_POOL=cache): give it
  // back and try once more (an allocation the cache does not serve, e.g. cudaMallocAsync).
  if (__builtin_expect(r == CUDA_ERROR_OUT_OF_MEMORY, 0) && t.cache() && t.cache()->release_all() > 0) r = call();
  if (__builtin_expect(r != CUDA_SUCCESS, 0)) {
    if (assumed && !has_context(t)) {  // no context: the driver's answer, nothing counted
      if (charged) t.uncharge(*d, bytes);
      return r;
    }
    count_driver_error(t, *d, ordinal, api, bytes, aux, r, charged, now);
    return r;
  }
  const uint64_t key = key_of_result();
  std::optional<LiveRecord> stale;
  {
    std::lock_guard<cuw::spin_lock> lk(t.lock());
    table.insert(key, LiveRecord{bytes, static_cast<int8_t>(ordinal), static_cast<uint16_t>(api)}, &stale);
    if (__builtin_expect(stale.has_value(), 0)) t.count_freed_unseen_locked(key, *stale, ring::Api::reused, now);
    on_insert(key);
    if (!charged) t.count_uncapped_locked(*d, bytes);
    t.count_alloc_locked(*d, ordinal, bytes, pooled(api));
    t.emit_locked(ring::EventKind::alloc, api, ordinal, key, bytes, aux, CUDA_SUCCESS, now);
  }
  if (__builtin_expect(stale.has_value(), 0)) t.job_uncharge(stale->device, stale->bytes);
  return r;
}

/// Count, call, record. `call` performs the real allocation and writes *out on success.
/// `when`, if given, receives the event's time.
template <class Call>
CUW_INLINE CUresult tracked_alloc(Tracker& t, ring::Api api, int ordinal, bool assumed, uint64_t bytes, uint64_t aux,
                       CUdeviceptr* out, Call&& call, uint64_t* when = nullptr) {
  return tracked_alloc_in(t, t.pointers(), api, ordinal, assumed, bytes, aux, call,
                          [out] { return uint64_t{*out}; }, when);
}

/// The driver failed a free of a live record: it still holds the memory, so the record
/// goes back and a driver_error event (the free's API, address and bytes, the driver's
/// result) says the allocation is still live (cold). `committed`: the free was already
/// counted, uncharged and its free event pushed (tracked_free's early commit); that is
/// undone (the bytes are counted again even over a cap: the driver holds them). Unless
/// the driver has meanwhile handed `key` out again (recorded by then): `rec`'s allocation
/// is then gone, and is counted freed (Tracker::count_freed_unseen_locked) if not already.
CUW_COLD void keep_live(Tracker& t, cuw::core::LiveTable& table, uint64_t key, const LiveRecord& rec, bool committed,
                        ring::Api api, uint64_t aux, CUresult r, uint64_t now) {
  std::optional<LiveRecord> other;
  {
    std::lock_guard<cuw::spin_lock> lk(t.lock());
    table.insert(key, rec, &other);
    if (__builtin_expect(other.has_value(), 0)) {
      // The driver handed `key` out again while this free was in flight (an array freed
      // with its context, say): the allocation `rec` counts is gone. The new one keeps the
      // key; ours is counted freed (api reused), unless the free was counted already.
      table.insert(key, *other);
      if (!committed) t.count_freed_unseen_locked(key, rec, ring::Api::reused, now);
    } else {
      ring::DeviceSlot& d = t.header().devices[rec.device];
      if (committed) {
        t.count_uncapped_locked(d, rec.bytes);
        t.uncount_free_locked(d, rec.device, rec.bytes, pooled(static_cast<ring::Api>(rec.api)));
      }
      t.emit_locked(ring::EventKind::driver_error, api, rec.device, key, rec.bytes, aux, r, now);
    }
  }
  if (other.has_value()) {
    if (!committed) t.job_uncharge(rec.device, rec.bytes);
  } else if (committed) {
    t.job_force_charge(rec.device, rec.bytes);
  }
}

/// Whether a free through `api` of a record `rec` may be counted before its driver call (one
/// lock per free): a stream-ordered free (cuMemFreeAsync) of a stream-ordered allocation
/// gives its bytes back to the driver's pool only when the stream reaches it, so when the
/// call itself returns makes no difference to what the GPU holds, cap or not; and any free
/// when nothing can refuse an allocation on the device (Tracker::uncapped). A cap set live
/// (by the daemon) between this count and the driver's free sees the free as done just
/// before it; should the driver then fail the free, keep_live counts the bytes back even
/// over such a cap (the driver holds them), as for a cap lowered below use.
CUW_INLINE bool commit_before_free(Tracker& t, ring::Api api, const LiveRecord& rec, const ring::DeviceSlot& d) {
  return (api == ring::Api::cuMemFreeAsync && pooled(static_cast<ring::Api>(rec.api))) || t.uncapped(d, rec.device);
}

/// Free through `call`, taking the record out of the live table first (one lock) so that a
/// concurrent allocation handed the same address is never erased by us.
///
/// When commit_before_free(), that critical section also uncharges and counts the free and
/// pushes its event, before the driver call: nothing after the call but its result; a
/// failed free undoes it (keep_live). Otherwise (under a cap or in a job: a cuMemFree,
/// cuMemRelease or array destroy, or a cuMemFreeAsync of cuMemAlloc memory) the counters and
/// the event wait for the driver (a second lock after the call): the cap counts the bytes
/// until the driver has them back.
template <class Call>
CUW_INLINE CUresult tracked_free(Tracker& t, cuw::core::LiveTable& table, uint64_t key, ring::Api api, uint64_t aux,
                                 Call&& call) {
  LiveRecord rec;
  bool live = false, committed = false;
  // The event's time: when the call was made (read before the driver call: the free is
  // usually committed before it).
  const uint64_t now = cuw::core::now_ns();
  if (__builtin_expect(key != 0, 1)) {
    std::lock_guard<cuw::spin_lock> lk(t.lock());
    live = table.take(key, &rec);
    // A record always names a tracked device (tracked_alloc_in inserts only then).
    if (__builtin_expect(live && static_cast<unsigned>(rec.device) < ring::kMaxDevices, 1)) {
      ring::DeviceSlot& d = t.header().devices[rec.device];
      if (__builtin_expect(commit_before_free(t, api, rec, d), 1)) {
        t.uncharge_locked(d, rec.bytes);
        t.count_free_locked(d, rec.device, rec.bytes, pooled(static_cast<ring::Api>(rec.api)));
        t.emit_locked(ring::EventKind::free, api, rec.device, key, rec.bytes, aux, CUDA_SUCCESS, now);
        committed = true;
      }
    }
  }
  if (committed) t.job_uncharge(rec.device, rec.bytes);
  const CUresult r = call();
  // Not counted by us (allocated before we were loaded, or invalid), or already recorded.
  if (__builtin_expect(!live || static_cast<unsigned>(rec.device) >= ring::kMaxDevices, 0)) return r;
  if (__builtin_expect(r != CUDA_SUCCESS, 0)) {
    keep_live(t, table, key, rec, committed, api, aux, r, now);
    return r;
  }
  if (committed) return r;
  ring::DeviceSlot& d = t.header().devices[rec.device];  // filled when it was allocated
  t.prefetch_commit(d);
  {
    std::lock_guard<cuw::spin_lock> lk(t.lock());
    t.uncharge_locked(d, rec.bytes);
    t.count_free_locked(d, rec.device, rec.bytes, pooled(static_cast<ring::Api>(rec.api)));
    t.emit_locked(ring::EventKind::free, api, rec.device, key, rec.bytes, aux, CUDA_SUCCESS, now);
  }
  t.job_uncharge(rec.device, rec.bytes);
  return r;
}

/// The ordinal a stream-ordered allocation on `stream` is counted on: the current
/// context's (Tracker::allocation_device).
CUW_INLINE int stream_device(Tracker& t, CUstream, bool* assumed) { return t.allocation_device(assumed); }

// ---- CUWARDEN_POOL=cache ----------------------------------------------------------------
// Pooled blocks are not in the live table: the cache's own block map is authoritative.
// The counters and events are the passthrough path's (alloc, free, live allocations);
// used / reserved / cached follow the driver allocations the cache makes and gives back.

using cuw::backends::cache_registry;
using cuw::backends::cache_resource;

/// The caches, if the tracker exists and the pool is on (never creates the tracker).
cache_registry* caches_if_any() noexcept {
  Tracker* t = Tracker::instance_if_created();
  return t ? t->cache() : nullptr;
}

/// Hot path: the cache's allocate (a hit: one lock for the free list, the counters and the
/// event; no driver call).
CUresult cache_alloc(cache_resource& c, CUdeviceptr* dptr, size_t bytes) {
  return c.allocate_traced(dptr, bytes, ring::Api::cuMemAlloc, cuw::core::now_ns());
}

/// A free of a pooled block: CUDA_SUCCESS when `dptr` was one (freed, counted, event
/// pushed), CUDA_ERROR_INVALID_VALUE when it lies in the cache's memory but is no live
/// block's start (a second free: never passed to the driver, which would free the slab or
/// block under the cache), CUDA_ERROR_NOT_FOUND when it is not the cache's memory.
CUresult cache_free(cache_registry& reg, CUdeviceptr dptr, ring::Api api, uint64_t aux) {
  return reg.free_traced(dptr, api, aux, cuw::core::now_ns());
}

/// Bytes cuPointerGetAttributes writes for an attribute (CUDA driver API: cuPointerGetAttribute).
size_t attribute_bytes(CUpointer_attribute attr) {
  switch (attr) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
    case CU_POINTER_ATTRIBUTE_MAPPING_SIZE:
    case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR:
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
    case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID:
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
      return 8;
    case CU_POINTER_ATTRIBUTE_P2P_TOKENS:
      return sizeof(CUDA_POINTER_ATTRIBUTE_P2P_TOKENS);
    default:
      return 4;
  }
}

}  // namespace

// ---- allocations -----------------------------------------------------------------------

// The hot paths of cuMemAlloc_v2 and cuMemFree_v2 (defined right after it, so emitted right
// after it) fit in one 4 KiB page, which is where this alignment starts them (the free's
// rare paths, at its end, may run into the next; tests/interposer/check_hot_page.sh): a program that
// allocates and frees synchronously runs the pair with the driver's work in between, which
// leaves the caches, and after an unmapping the TLB, cold; each page of code is one more
// translation to walk (bench/results/2026-11-30-h200-sync-pair.md).
CUW_EXPORT_HOT __attribute__((aligned(4096))) CUresult hook_cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  auto real = REAL(cuMemAlloc_v2);
  if (!real) return kNoDriver;
  Reentry g;
  if (g.nested()) return real(dptr, bytesize);
  Tracker& t = Tracker::get();
  // CUWARDEN_POOL=cache: out of the off path's straight line (a taken branch for the cache).
  if (cache_registry* reg = t.cache(); __builtin_expect(reg != nullptr, 0) && dptr && bytesize != 0) {
    if (cache_resource* c = reg->for_current()) return cache_alloc(*c, dptr, bytesize);
  }
  bool assumed = false;
  const int ordinal = t.allocation_device(&assumed);
  return tracked_alloc(t, ring::Api::cuMemAlloc, ordinal, assumed, bytesize, 0, dptr,
                       [&] { return real(dptr, bytesize); });
}

// (Right after cuMemAlloc_v2: see there.)
CUW_EXPORT_HOT CUresult hook_cuMemFree_v2(CUdeviceptr dptr) {
  auto real = REAL(cuMemFree_v2);
  if (!real) return kNoDriver;
  Reentry g;
  if (g.nested()) return real(dptr);
  Tracker& t = Tracker::get();
  if (cache_registry* reg = t.cache(); __builtin_expect(reg != nullptr, 0) && dptr)
    if (const CUresult r = cache_free(*reg, dptr, ring::Api::cuMemFree, 0); r != CUDA_ERROR_NOT_FOUND) return r;
  return tracked_free(t, t.pointers(), dptr, ring::Api::cuMemFree, 0, [&] { return real(dptr); });
}

CUW_EXPORT CUresult hook_cuMemAllocManaged(CUdeviceptr* dptr, size_t bytesize, unsigned int flags) {
  auto real = REAL(cuMemAllocManaged);
  if (!real) return kNoDriver;
  Reentry g;
  if (g.nested()) return real(dptr, bytesize, flags);
  Tracker& t = Tracker::get();
  return tracked_alloc(t, ring::Api::cuMemAllocManaged, t.current_device(), false, bytesize, 0, dptr,
                       [&] { return real(dptr, bytesize, flags); });
}

CUW_EXPORT CUresult hook_cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pitch, size_t width, size_t height,
                                            unsigned int elem) {
  auto real = REAL(cuMemAllocPitch_v2);
  if (!real) return kNoDriver;
  Reentry g;
  if (g.nested()) return real(dptr, pitch, width, height, elem);
  Tracker& t = Tracker::get();
  const int ordinal = t.current_device();
  // The pitch is only known afterwards: charge an estimate (rows of 512 bytes, the
  // driver's smallest pitch alignment) and settle on the real pitch * height after.
  const uint64_t est = ((static_cast<uint64_t>(width) + 511) & ~uint64_t{511}) * height;
  CUresult r = tracked_alloc(t, ring::Api::cuMemAllocPitch, ordinal, false, est, 0, dptr,
                             [&] { return real(dptr, pitch, width, height, elem); });
  if (r == CUDA_SUCCESS && pitch) {
    const uint64_t actual = static_cast<uint64_t>(*pitch) * height;
    ring::DeviceSlot* d = t.device(ordinal);
    if (d && actual != est) {
      bool adjusted = false;
      {
        std::lock_guard<cuw::spin_lock> lk(t.lock());
        LiveRecord rec;
        if (t.pointers().take(*dptr, &rec)) {
          if (actual > est) t.force_charge_locked(*d, actual - est);
          else t.uncharge_locked(*d, est - actual);
          cuw::core::locked_add(d->reserved, actual - est);  // wraps for a decrease
          rec.bytes = actual;
          t.pointers().insert(*dptr, rec);
          adjusted = true;
        }
      }
      if (adjusted && actual > est) t.job_force_charge(ordinal, actual - est);
      else if (adjusted) t.job_uncharge(ordinal, est - actual);
    }
  }
  return r;
}

#define CUW_ASYNC_ALLOC(name, api)                                                                              \
  CUW_EXPORT_HOT CUresult hook_##name(CUdeviceptr* dptr, size_t bytesize, CUstream stream) {                        \
    auto real = REAL(name);                                                                                      \
    if (!real) return kNoDriver;                                                                                 \
    Reentry g;                                                                                                   \
    if (g.nested()) return real(dptr, bytesize, stream);                                                        \
    Tracker& t = Tracker::get();                                                                                 \
    bool assumed = false;                                                                                        \
    const int ordinal = stream_device(t, stream, &assumed);                                                      \
    uint64_t now = 0;                                                                                            \
    const CUresult r = tracked_alloc(t, api, ordinal, assumed, bytesize, reinterpret_cast<uint64_t>(stream), dptr, \
                                     [&] { return real(dptr, bytesize, stream); }, &now);                      \
    if (r == CUDA_SUCCESS) t.pooled_alloc(ordinal, nullptr, stream, now);                                           \
    return r;                                                                                                    \
  }
CUW_ASYNC_ALLOC(cuMemAllocAsync, ring::Api::cuMemAllocAsync)
CUW_ASYNC_ALLOC(cuMemAllocAsync_ptsz, ring::Api::cuMemAllocAsync)
#undef CUW_ASYNC_ALLOC

#define CUW_POOL_ALLOC(name)                                                                                     \
  CUW_EXPORT_HOT CUresult hook_##name(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool, CUstream stream) {     \
    auto real = REAL(name);                                                                                      \
    if (!real) return kNoDriver;                                                                                 \
    Reentry g;                                                                                                   \
    if (g.nested()) return real(dptr, bytesize, pool, stream);                                                  \
    Tracker& t = Tracker::get();                                                                                 \
    bool assumed = false;                                                                                        \
    const int ordinal = stream_device(t, stream, &assumed);                                                      \
    uint64_t now = 0;                                                                                            \
    const CUresult r = tracked_alloc(t, ring::Api::cuMemAllocFromPoolAsync, ordinal, assumed, bytesize,          \
                                     reinterpret_cast<uint64_t>(stream), dptr,                                   \
                                     [&] { return real(dptr, bytesize, pool, stream); }, &now);                \
    if (r == CUDA_SUCCESS) t.pooled_alloc(ordinal, pool, stream, now);                                              \
    return r;                                                                                                    \
  }
CUW_POOL_ALLOC(cuMemAllocFromPoolAsync)
CUW_POOL_ALLOC(cuMemAllocFromPoolAsync_ptsz)
#undef CUW_POOL_ALLOC

// ---- frees (cuMemFree_v2: with the allocations above) ------------------------------------

namespace {
/// cuMemFreeAsync of a pooled block (a cudaMalloc pointer freed stream-ordered): retired like
/// a cuMemFree (behind events on every stream, which covers `stream`). Not while `stream`
/// is being captured: the free would belong to a graph that runs later, and the block
/// could be reused before it runs; the driver's own answer for memory a graph did not
/// allocate is an error too. Returns true when handled (*r set).
bool cache_free_async_slow(cache_registry* reg, CUdeviceptr dptr, CUstream stream, bool per_thread, CUresult* r);
CUW_INLINE bool cache_free_async(Tracker& t, CUdeviceptr dptr, CUstream stream, bool per_thread, CUresult* r) {
  cache_registry* reg = t.cache();
  if (__builtin_expect(reg == nullptr, 1) || !dptr) return false;
  return cache_free_async_slow(reg, dptr, stream, per_thread, r);
}
__attribute__((noinline)) bool cache_free_async_slow(cache_registry* reg, CUdeviceptr dptr, CUstream stream,
                                                    bool per_thread, CUresult* r) {
  if (cache_registry::captures.load(std::memory_order_acquire) > 0) {
    using fn = CUresult (*)(CUstream, CUstreamCaptureStatus*);
    static auto is_cap = reinterpret_cast<fn>(cuw::hook::driver_symbol("cuStreamIsCapturing"));
    static auto is_cap_pt = reinterpret_cast<fn>(cuw::hook::driver_symbol("cuStreamIsCapturing_ptsz"));
    auto q = per_thread && is_cap_pt ? is_cap_pt : is_cap;
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    bool live = false;
    if (q && q(stream, &st) == CUDA_SUCCESS && st != CU_STREAM_CAPTURE_STATUS_NONE &&
        reg->owner_of(dptr, nullptr, &live) && live) {
      *r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
      return true;
    }
  }
  *r = cache_free(*reg, dptr, ring::Api::cuMemFreeAsync, reinterpret_cast<uint64_t>(stream));
  return *r != CUDA_ERROR_NOT_FOUND;
}
}  // namespace

#define CUW_ASYNC_FREE(name, pt)                                                                                 \
  CUW_EXPORT_HOT CUresult hook_##name(CUdeviceptr dptr, CUstream stream) {                                          \
    auto real = REAL(name);                                                                                      \
    if (!real) return kNoDriver;                                                                                 \
    Reentry g;                                                                                                   \
    if (g.nested()) return real(dptr, stream);                                                                  \
    Tracker& t = Tracker::get();                                                                                 \
    if (CUresult cr; cache_free_async(t, dptr, stream, pt, &cr)) return cr;                                     \
    return tracked_free(t, t.pointers(), dptr, ring::Api::cuMemFreeAsync, reinterpret_cast<uint64_t>(stream),  \
                        [&] { return real(dptr, stream); });                                                   \
  }
CUW_ASYNC_FREE(cuMemFreeAsync, false)
CUW_ASYNC_FREE(cuMemFreeAsync_ptsz, true)
#undef CUW_ASYNC_FREE

// ---- stream-ordered pools (CUDA driver API: Stream Ordered Memory Allocator) -------------
// What a pool keeps from the driver changes when it is trimmed or its release threshold
// changes; the device's `reserved` figure follows.

namespace {
/// The device whose figures a pool call changes: the calling thread's current device (a
/// pool's own location is not queryable for every pool kind; programs make the pool's
/// device current before using it).
int pool_device(CUmemoryPool) { return Tracker::get().current_device(); }
}  // namespace

CUW_EXPORT CUresult hook_cuMemPoolTrimTo(CUmemoryPool pool, size_t keep) {
  auto real = REAL(cuMemPoolTrimTo);
  if (!real) return kNoDriver;
  Reentry g;
  const CUresult r = real(pool, keep);
  if (!g.nested() && r == CUDA_SUCCESS) Tracker::get().refresh_pools(pool_device(pool), pool, true);
  return r;
}

CUW_EXPORT CUresult hook_cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value) {
  auto real = REAL(cuMemPoolSetAttribute);
  if (!real) return kNoDriver;
  Reentry g;
  const CUresult r = real(pool, attr, value);
  if (!g.nested() && r == CUDA_SUCCESS && attr == CU_MEMPOOL_ATTR_RELEASE_THRESHOLD)
    Tracker::get().refresh_pools(pool_device(pool), pool, true);
  return r;
}

// ---- virtual memory management (CUDA driver API: Virtual Memory Management) ---------------

CUW_EXPORT CUresult hook_cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                                     const CUmemAllocationProp* prop, unsigned long long flags) {
  auto real = REAL(cuMemCreate);
  if (!real) return kNoDriver;
  Reentry g;
  if (g.nested() || !prop || !handle || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
    return real(handle, size, prop, flags);  // host-located memory: not device memory, not capped
  Tracker& t = Tracker::get();
  return tracked_alloc_in(t, t.handles(), ring::Api::cuMemCreate, prop->location.id, false, size, 0,
                          [&] { return real(handle, size, prop, flags); }, [handle] { return uint64_t{*handle}; },
                          nullptr, ForgetArray{&t});
}

CUW_EXPORT CUresult hook_cuMemRelease(CUmemGenericAllocationHandle handle) {
  auto real = REAL(cuMemRelease);
  if (!real) return kNoDriver;
  Reentry g;
  if (g.nested()) return real(handle);
  Tracker& t = Tracker::get();
  return tracked_free(t, t.handles(), handle, ring::Api::cuMemRelease, 0, [&] { return real(handle); });
}

// ---- pointer queries and IPC of pooled memory (CUDA driver API: Memory Management) --------
// The driver knows the cache's driver allocations, not the blocks in them: for a pooled
// address these answer with the program's allocation (the block), and treat a freed block
// as the driver treats freed memory. Addresses the cache does not hold go to the driver.

CUW_EXPORT CUresult hook_cuMemGetAddressRange_v2(CUdeviceptr* pbase, size_t* psize, CUdeviceptr dptr) {
  auto real = REAL(cuMemGetAddressRange_v2);
  if (!real) return kNoDriver;
  Reentry g;
  if (cache_registry* reg = g.nested() ? nullptr : caches_if_any()) {
    cuw::backends::range rg;
    bool live = false;
    if (reg->owner_of(dptr, &rg, &live)) {
      if (!live) return CUDA_ERROR_NOT_FOUND;
      if (pbase) *pbase = rg.base;
      if (psize) *psize = rg.size;
      return CUDA_SUCCESS;
    }
  }
  return real(pbase, psize, dptr);
}

CUW_EXPORT CUresult hook_cuPointerGetAttribute(void* data, CUpointer_attribute attribute, CUdeviceptr ptr) {
  auto real = REAL(cuPointerGetAttribute);
  if (!real) return kNoDriver;
  Reentry g;
  const CUresult r = real(data, attribute, ptr);
  if (g.nested() || r != CUDA_SUCCESS || !data) return r;
  if (cache_registry* reg = caches_if_any()) {
    cuw::backends::range rg;
    bool live = false;
    if (reg->owner_of(ptr, &rg, &live)) {
      if (!live) return CUDA_ERROR_INVALID_VALUE;
      if (attribute == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR) std::memcpy(data, &rg.base, sizeof rg.base);
      if (attribute == CU_POINTER_ATTRIBUTE_RANGE_SIZE) {
        const size_t n = rg.size;
        std::memcpy(data, &n, sizeof n);
      }
    }
  }
  return r;
}

CUW_EXPORT CUresult hook_cuPointerGetAttributes(unsigned int count, CUpointer_attribute* attributes, void** data,
                                                CUdeviceptr ptr) {
  auto real = REAL(cuPointerGetAttributes);
  if (!real) return kNoDriver;
  Reentry g;
  const CUresult r = real(count, attributes, data, ptr);
  if (g.nested() || r != CUDA_SUCCESS || !attributes || !data) return r;
  if (cache_registry* reg = caches_if_any()) {
    cuw::backends::range rg;
    bool live = false;
    if (reg->owner_of(ptr, &rg, &live)) {
      for (unsigned i = 0; i < count; ++i) {
        if (!data[i]) continue;
        if (!live) {
          std::memset(data[i], 0, attribute_bytes(attributes[i]));  // as for memory CUDA does not know
        } else if (attributes[i] == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR) {
          std::memcpy(data[i], &rg.base, sizeof rg.base);
        } else if (attributes[i] == CU_POINTER_ATTRIBUTE_RANGE_SIZE) {
          const size_t n = rg.size;
          std::memcpy(data[i], &n, sizeof n);
        }
      }
    }
  }
  return r;
}

CUW_EXPORT CUresult hook_cuIpcGetMemHandle(CUipcMemHandle* handle, CUdeviceptr dptr) {
  auto real = REAL(cuIpcGetMemHandle);
  if (!real) return kNoDriver;
  Reentry g;
  if (cache_registry* reg = g.nested() ? nullptr : caches_if_any()) {
    bool live = false;
    if (cache_resource* c = reg->owner_of(dptr, nullptr, &live)) {
      if (!handle) return CUDA_ERROR_INVALID_VALUE;
      const CUresult r = c->ipc_handle(handle, dptr);
      if (r != CUDA_ERROR_NOT_FOUND) return r;
    }
  }
  return real(handle, dptr);
}

// ---- streams, captures and contexts: what the cache must know ------------------------------
// Non-blocking streams get their own event when a batch of frees is sealed; while any
// capture is active the cache records, queries and waits for nothing; a context that goes
// away takes the cache's memory with it.

CUW_EXPORT CUresult hook_cuStreamCreate(CUstream* stream, unsigned int flags) {
  auto real = REAL(cuStreamCreate);
  if (!real) return kNoDriver;
  Reentry g;
  const CUresult r = real(stream, flags);
  if (!g.nested() && r == CUDA_SUCCESS && stream)
    if (cache_registry* reg = Tracker::get().cache()) reg->stream_created(*stream, flags);
  return r;
}

CUW_EXPORT CUresult hook_cuStreamCreateWithPriority(CUstream* stream, unsigned int flags, int priority) {
  auto real = REAL(cuStreamCreateWithPriority);
  if (!real) return kNoDriver;
  Reentry g;
  const CUresult r = real(stream, flags, priority);
  if (!g.nested() && r == CUDA_SUCCESS && stream)
    if (cache_registry* reg = Tracker::get().cache()) reg->stream_created(*stream, flags);
  return r;
}

CUW_EXPORT CUresult hook_cuStreamDestroy_v2(CUstream stream) {
  auto real = REAL(cuStreamDestroy_v2);
  if (!real) return kNoDriver;
  Reentry g;
  if (!g.nested() && stream)
    if (cache_registry* reg = caches_if_any()) reg->stream_destroying(stream);
  return real(stream);
}

namespace {
void capture_begun(CUresult r) {
  if (r == CUDA_SUCCESS) cache_registry::captures.fetch_add(1, std::memory_order_acq_rel);
}
/// Ends one capture in the count if `stream` was capturing (a capture begun through an
/// entry point we do not hook never makes the count negative).
template <class End>
CUresult capture_end(CUstream stream, bool per_thread, End&& end) {
  using fn = CUresult (*)(CUstream, CUstreamCaptureStatus*);
  static auto is_cap = reinterpret_cast<fn>(cuw::hook::driver_symbol("cuStreamIsCapturing"));
  static auto is_cap_pt = reinterpret_cast<fn>(cuw::hook::driver_symbol("cuStreamIsCapturing_ptsz"));
  auto q = per_thread && is_cap_pt ? is_cap_pt : is_cap;
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  const bool was = q && q(stream, &st) == CUDA_SUCCESS && st != CU_STREAM_CAPTURE_STATUS_NONE;
  const CUresult r = end();
  if (was) {
    int n = cache_registry::captures.load(std::memory_order_relaxed);
    while (n > 0 && !cache_registry::captures.compare_exchange_weak(n, n - 1, std::memory_order_acq_rel)) {
    }
  }
  return r;
}
}  // namespace

// Every way to begin a capture: the driver call, then the count.
#define CUW_BEGIN_CAPTURE(name, params, args) \
  CUW_EXPORT CUresult hook_##name params {     \
    auto real = REAL(name);                     \
    if (!real) return kNoDriver;                \
    const CUresult r = real args;               \
    capture_begun(r);                           \
    return r;                                   \
  }
CUW_BEGIN_CAPTURE(cuStreamBeginCapture_v2, (CUstream stream, CUstreamCaptureMode mode), (stream, mode))
CUW_BEGIN_CAPTURE(cuStreamBeginCapture_v2_ptsz, (CUstream stream, CUstreamCaptureMode mode), (stream, mode))
CUW_BEGIN_CAPTURE(cuStreamBeginCaptureToGraph,
                  (CUstream stream, CUgraph graph, const CUgraphNode* deps, const CUgraphEdgeData* edges,
                   size_t ndeps, CUstreamCaptureMode mode),
                  (stream, graph, deps, edges, ndeps, mode))
CUW_BEGIN_CAPTURE(cuStreamBeginCaptureToGraph_ptsz,
                  (CUstream stream, CUgraph graph, const CUgraphNode* deps, const CUgraphEdgeData* edges,
                   size_t ndeps, CUstreamCaptureMode mode),
                  (stream, graph, deps, edges, ndeps, mode))
#undef CUW_BEGIN_CAPTURE

CUW_EXPORT CUresult hook_cuStreamEndCapture(CUstream stream, CUgraph* graph) {
  auto real = REAL(cuStreamEndCapture);
  if (!real) return kNoDriver;
  return capture_end(stream, false, [&] { return real(stream, graph); });
}

CUW_EXPORT CUresult hook_cuStreamEndCapture_ptsz(CUstream stream, CUgraph* graph) {
  auto real = REAL(cuStreamEndCapture_ptsz);
  if (!real) return kNoDriver;
  return capture_end(stream, true, [&] { return real(stream, graph); });
}

namespace {
/// After the driver destroyed a context: the allocations and pinned host memory it freed
/// with it are counted as freed (uncharged; free / host_free events with api cuCtxDestroy),
/// so that the counters and the cap do not keep memory the program can no longer free.
/// Which ones: the tracked cuMemAlloc / pitch / managed allocations and pinned host blocks
/// the driver no longer knows (cuPointerGetAttribute answers CUDA_ERROR_INVALID_VALUE).
/// Stream-ordered and graph allocations are not asked: pools outlive a context, and the
/// driver does not know a graph's memory until the graph runs (measured on an H200). CUDA
/// arrays are handles and cannot be asked: those in `arrays` (the context's, taken by
/// arrays_of() before the driver call) are counted freed (forget_arrays_of). VMM handles
/// (cuMemCreate) outlive a context and stay counted until released. Every key is asked
/// without the tracker's lock; one that looks gone is asked again and taken under it, so
/// that an address the driver has handed out again meanwhile (known again) is left to its
/// new owner. Not once cuwarden's atexit handler has run (Tracker::exiting: nothing is
/// capped any more). Cold: one driver query per live record.
CUW_COLD void forget_arrays_of(Tracker& t, const ArrayOwners::Snapshot& arrays, uint64_t now);

CUW_COLD void forget_driver_freed(Tracker& t, const ArrayOwners::Snapshot& arrays) {
  auto query = REAL(cuPointerGetAttribute);
  if (t.exiting()) return;
  const uint64_t now = cuw::core::now_ns();
  forget_arrays_of(t, arrays, now);
  if (!query) return;
  std::vector<uint64_t> dev_keys, host_keys;
  {
    std::lock_guard<cuw::spin_lock> lk(t.lock());
    t.pointers().keys(dev_keys, [](const LiveRecord& r) {
      const auto api = static_cast<ring::Api>(r.api);
      return api == ring::Api::cuMemAlloc || api == ring::Api::cuMemAllocPitch || api == ring::Api::cuMemAllocManaged;
    });
    t.host().keys(host_keys, [](const LiveRecord&) { return true; });
  }
  auto gone = [&](uint64_t key) {
    CUcontext c = nullptr;
    return query(&c, CU_POINTER_ATTRIBUTE_CONTEXT, key) == CUDA_ERROR_INVALID_VALUE;
  };
  for (const uint64_t key : dev_keys) {
    if (!gone(key)) continue;
    LiveRecord rec;
    bool took = false;
    {
      std::lock_guard<cuw::spin_lock> lk(t.lock());
      took = gone(key) && t.pointers().take(key, &rec);
      if (took) t.count_freed_unseen_locked(key, rec, ring::Api::cuCtxDestroy, now);
    }
    if (took) t.job_uncharge(rec.device, rec.bytes);
  }
  for (const uint64_t key : host_keys) {
    if (!gone(key)) continue;
    std::lock_guard<cuw::spin_lock> lk(t.lock());
    LiveRecord rec;
    if (!gone(key) || !t.host().take(key, &rec)) continue;
    if (static_cast<unsigned>(rec.device) < ring::kMaxDevices)
      cuw::core::locked_sub(t.header().devices[rec.device].host_bytes, rec.bytes);
    t.emit_locked(ring::EventKind::host_free, ring::Api::cuCtxDestroy, rec.device, key, rec.bytes, 0, CUDA_SUCCESS,
                  now);
  }
}

/// The arrays of context `ctx` (key, serial), taken just before the driver call that may
/// destroy it, for forget_arrays_of() after it. An array created by another thread between
/// this and the driver call, in the same context, is not in it (it stays counted: an
/// over-count, for a program that creates arrays in a context it is destroying); one created
/// after the call, in a context that took the handle over, is never in it. Empty if memory
/// ran out (the arrays then stay counted until destroyed). Cold: walks every array.
CUW_COLD ArrayOwners::Snapshot arrays_of(Tracker& t, CUcontext ctx) noexcept {
  ArrayOwners::Snapshot snap;
  if (!ctx) return snap;
  try {
    for (;;) {  // room first, without the lock; again should the map have grown meanwhile
      size_t n = 0;
      {
        std::lock_guard<cuw::spin_lock> lk(t.lock());
        n = t.array_owners().size();
      }
      if (n == 0) return snap;
      snap.reserve(n + 16);
      std::lock_guard<cuw::spin_lock> lk(t.lock());
      if (t.array_owners().snapshot(ctx, snap)) return snap;
    }
  } catch (...) {
    return {};
  }
}

/// The arrays in `arrays` (arrays_of()), destroyed by the driver with their context: each
/// still remembered under the same serial is counted freed (uncharged; a free event with api
/// cuCtxDestroy at `now`) and forgotten, in one critical section per sweep. One whose entry
/// is gone or carries another serial was destroyed meanwhile, or its handle now names a new
/// array: left alone. One whose record a destroy in flight has taken (cuArrayDestroy racing
/// the context's end) is marked ctx_gone: that destroy, refused by the driver, counts it
/// (tracked_array_destroy). Cold; frees the entries' nodes under the lock.
CUW_COLD void forget_arrays_of(Tracker& t, const ArrayOwners::Snapshot& arrays, uint64_t now) {
  if (arrays.empty()) return;
  std::array<uint64_t, ring::kMaxDevices> job_back{};  // the jobs' shares, given back after unlocking
  {
    std::lock_guard<cuw::spin_lock> lk(t.lock());
    ArrayOwners& owners = t.array_owners();
    for (const auto& [key, serial] : arrays) {
      ArrayOwner* o = owners.find(key);
      if (!o || o->serial != serial) continue;
      LiveRecord rec;
      if (!t.handles().take(key, &rec)) {
        o->ctx_gone = true;
        continue;
      }
      owners.forget(key, serial);
      t.count_freed_unseen_locked(key, rec, ring::Api::cuCtxDestroy, now);
      if (static_cast<unsigned>(rec.device) < ring::kMaxDevices) job_back[rec.device] += rec.bytes;
    }
  }
  for (uint32_t i = 0; i < ring::kMaxDevices; ++i)
    if (job_back[i]) t.job_uncharge(static_cast<int>(i), job_back[i]);
}
}  // namespace

CUW_EXPORT CUresult hook_cuCtxDestroy_v2(CUcontext ctx) {
  auto real = REAL(cuCtxDestroy_v2);
  if (!real) return kNoDriver;
  Reentry g;
  Tracker* t = g.nested() || !ctx ? nullptr : Tracker::instance_if_created();
  if (!t) return real(ctx);  // nothing counted yet
  CUresult r = CUDA_SUCCESS;
  ArrayOwners::Snapshot arrays;  // ctx's arrays, taken just before the driver call
  auto destroy = [&] {
    arrays = arrays_of(*t, ctx);
    return (r = real(ctx)) == CUDA_SUCCESS;
  };
  const bool gone = t->cache() ? t->cache()->context_destroy([ctx] { return ctx; }, destroy) : destroy();
  if (gone) forget_driver_freed(*t, arrays);
  return r;
}

namespace {
/// Device `dev`'s primary context if it is active (only an active one can hold pooled
/// memory; retaining it then creates nothing), else nullptr.
CUcontext active_primary(CUdevice dev) {
  using state_fn = CUresult (*)(CUdevice, unsigned*, int*);
  using retain_fn = CUresult (*)(CUcontext*, CUdevice);
  using release_fn = CUresult (*)(CUdevice);
  static auto get_state = reinterpret_cast<state_fn>(cuw::hook::driver_symbol("cuDevicePrimaryCtxGetState"));
  static auto retain = reinterpret_cast<retain_fn>(cuw::hook::driver_symbol("cuDevicePrimaryCtxRetain"));
  static auto release = reinterpret_cast<release_fn>(cuw::hook::driver_symbol("cuDevicePrimaryCtxRelease_v2"));
  unsigned flags = 0;
  int active = 0;
  CUcontext primary = nullptr;
  if (!get_state || !retain || !release || get_state(dev, &flags, &active) != CUDA_SUCCESS || !active ||
      retain(&primary, dev) != CUDA_SUCCESS)
    return nullptr;
  release(dev);  // the driver's own entry point: our retain undone, nothing else
  return primary;
}
/// Context `ctx`'s ID (CUDA driver API: cuCtxGetId, CUDA 12.0): unique to one context for
/// the process's life, so a primary context destroyed and made active again, which keeps its
/// handle, has a new one (measured on an H200). 0 when not known (the call is missing or
/// fails, e.g. for a destroyed context).
unsigned long long context_id(CUcontext ctx) {
  using id_fn = CUresult (*)(CUcontext, unsigned long long*);
  static auto get_id = reinterpret_cast<id_fn>(cuw::hook::driver_symbol("cuCtxGetId"));
  unsigned long long id = 0;
  return get_id && ctx && get_id(ctx, &id) == CUDA_SUCCESS ? id : 0;
}
/// Whether device `dev`'s primary context is inactive (destroyed) now.
bool primary_gone(CUdevice dev) {
  using state_fn = CUresult (*)(CUdevice, unsigned*, int*);
  static auto get_state = reinterpret_cast<state_fn>(cuw::hook::driver_symbol("cuDevicePrimaryCtxGetState"));
  unsigned flags = 0;
  int active = 1;
  return get_state && get_state(dev, &flags, &active) == CUDA_SUCCESS && !active;
}
/// A call that resets or releases device `dev`'s primary context: when it leaves the
/// context destroyed (a reset; the release of its last reference, even when another thread
/// has made the primary active again since: its context ID then differs), the cache forgets
/// the memory the driver freed with it (cache_registry::context_destroy), and so do the
/// counters (forget_driver_freed).
template <class Call>
CUresult primary_call(CUdevice dev, bool reset, Call&& call) {
  Reentry g;
  Tracker* t = g.nested() ? nullptr : Tracker::instance_if_created();
  if (!t) return call();
  CUresult r = CUDA_SUCCESS;
  CUcontext primary = nullptr;  // the context destroyed, if the call destroys it
  ArrayOwners::Snapshot arrays;  // its arrays, taken just before the call
  unsigned long long id = 0;     // its context ID before the call (0: not known)
  auto which = [&] {
    primary = active_primary(dev);
    id = context_id(primary);
    return primary;
  };
  auto again = [&] {  // active now, but not the context the call released
    const unsigned long long now_id = context_id(primary);
    return id != 0 && now_id != 0 && now_id != id;
  };
  auto run = [&] {
    arrays = arrays_of(*t, primary);
    r = call();
    return r == CUDA_SUCCESS && primary != nullptr && (reset || primary_gone(dev) || again());
  };
  bool gone;
  if (cache_registry* reg = t->cache()) {
    gone = reg->context_destroy(which, run);  // the check and the call under its lock (retains wait)
  } else {
    which();
    gone = run();
  }
  if (gone) forget_driver_freed(*t, arrays);
  return r;
}
}  // namespace

CUW_EXPORT CUresult hook_cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  auto real = REAL(cuDevicePrimaryCtxRetain);
  if (!real) return kNoDriver;
  Reentry g;
  cache_registry* reg = g.nested() ? nullptr : caches_if_any();
  if (!reg) return real(pctx, dev);
  return reg->serialized([&] { return real(pctx, dev); });  // not between a release and its check
}

CUW_EXPORT CUresult hook_cuDevicePrimaryCtxReset_v2(CUdevice dev) {
  auto real = REAL(cuDevicePrimaryCtxReset_v2);
  if (!real) return kNoDriver;
  return primary_call(dev, true, [&] { return real(dev); });
}

CUW_EXPORT CUresult hook_cuDevicePrimaryCtxReset(CUdevice dev) {
  auto real = REAL(cuDevicePrimaryCtxReset);
  if (!real) return kNoDriver;
  return primary_call(dev, true, [&] { return real(dev); });
}

CUW_EXPORT CUresult hook_cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  auto real = REAL(cuDevicePrimaryCtxRelease_v2);
  if (!real) return kNoDriver;
  return primary_call(dev, false, [&] { return real(dev); });
}

CUW_EXPORT CUresult hook_cuDevicePrimaryCtxRelease(CUdevice dev) {
  auto real = REAL(cuDevicePrimaryCtxRelease);
  if (!real) return kNoDriver;
  return primary_call(dev, false, [&] { return real(dev); });
}

// ---- CUDA arrays (CUDA driver API: Memory Management, arrays) -----------------------------

namespace {

/// Bytes per element of a CUarray_format (CUDA driver API: CUarray_format). Packed and
/// block-compressed formats are rounded to their per-texel size; unknown ones count 4.
uint64_t format_bytes(CUarray_format f) {
  switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
      return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
      return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT:
      return 4;
    default:
      return 4;
  }
}

/// Bytes of an array as the driver allocates it: width x max(height,1) x max(depth,1) x
/// element size, rounded to 512 bytes, summed over `levels` mip levels. Each level halves
/// width and height, and depth only for true 3D arrays: for layered and cubemap arrays
/// depth is the layer count, the same at every level.
uint64_t array_bytes(uint64_t w, uint64_t h, uint64_t d, CUarray_format f, unsigned channels, unsigned levels,
                     unsigned flags) {
  const uint64_t elem = format_bytes(f) * (channels ? channels : 1);
  const bool layers = (flags & (CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_CUBEMAP)) != 0;
  uint64_t total = 0;
  for (unsigned l = 0; l < (levels ? levels : 1); ++l) {
    const uint64_t lw = w ? w : 1, lh = h ? h : 1, ld = d ? d : 1;
    total += (lw * lh * ld * elem + 511) & ~uint64_t{511};
    w = w > 1 ? w / 2 : 1;
    h = h > 1 ? h / 2 : (h ? 1 : 0);
    if (!layers) d = d > 1 ? d / 2 : (d ? 1 : 0);
  }
  return total;
}

/// Sparse and deferred-mapping arrays take no memory until it is mapped into them
/// (cuMemMapArrayAsync, with memory from cuMemCreate, which is counted there).
bool array_takes_memory(unsigned flags) {
  return (flags & (CUDA_ARRAY3D_SPARSE | CUDA_ARRAY3D_DEFERRED_MAPPING)) == 0;
}

/// The calling thread's current context (nullptr: none, or the driver lacks the call).
CUcontext current_context() {
  using get_fn = CUresult (*)(CUcontext*);
  static auto get = reinterpret_cast<get_fn>(cuw::hook::driver_symbol("cuCtxGetCurrent"));
  CUcontext c = nullptr;
  return get && get(&c) == CUDA_SUCCESS ? c : nullptr;
}

/// tracked_alloc_in's `on_insert` for an array: remember it in the context `node` holds
/// (made before the lock; the tracker's lock held here). Without memory for the entry the
/// array is not forgotten with its context (it stays counted until destroyed: an
/// over-count, never an under-count).
struct RememberArray {
  Tracker* t;
  ArrayOwners::Node* node;  // consumed, or left for the caller to free after unlocking
  void operator()(uint64_t key) const noexcept { t->array_owners().remember(key, *node); }
};

/// A tracked array allocation: the context asked before the call, remembered with the record.
template <class Call, class Handle>
CUresult tracked_array_create(Tracker& t, ring::Api api, int ordinal, uint64_t bytes, Call&& call,
                              Handle* handle_out) {
  ArrayOwners::Node node = ArrayOwners::make_node(current_context());  // freed here if unused
  return tracked_alloc_in(
      t, t.handles(), api, ordinal, false, bytes, 0, call,
      [handle_out] { return reinterpret_cast<uint64_t>(*handle_out); }, nullptr, RememberArray{&t, &node});
}

/// A destroy of array `key` through tracked_free. Its owner entry stays while the driver
/// call runs, so that a destruction of its context meanwhile finds it (forget_arrays_of).
/// Destroyed: the entry goes, if it is still this array's (same serial; a new array may
/// have been handed the handle since). Refused by the driver, with the entry marked
/// ctx_gone: the context was destroyed while this call ran and freed the array with it,
/// so the record keep_live put back is counted freed (api cuCtxDestroy). Refused
/// otherwise: the array is still the driver's, and stays counted and remembered.
template <class Call>
CUresult tracked_array_destroy(Tracker& t, uint64_t key, ring::Api api, Call&& call) {
  uint64_t serial = 0;
  {
    std::lock_guard<cuw::spin_lock> lk(t.lock());
    if (const ArrayOwner* o = t.array_owners().find(key)) serial = o->serial;
  }
  const CUresult r = tracked_free(t, t.handles(), key, api, 0, call);
  if (serial == 0) return r;
  ArrayOwners::Node dead;  // a removed entry, freed after unlocking
  LiveRecord rec;
  bool took = false;
  const uint64_t now = r == CUDA_SUCCESS ? 0 : cuw::core::now_ns();
  {
    std::lock_guard<cuw::spin_lock> lk(t.lock());
    ArrayOwners& owners = t.array_owners();
    const ArrayOwner* o = owners.find(key);
    if (o && o->serial == serial && (r == CUDA_SUCCESS || o->ctx_gone)) {
      const bool ctx_gone = r != CUDA_SUCCESS;
      owners.forget(key, serial, &dead);
      if (ctx_gone) {
        took = t.handles().take(key, &rec);
        if (took) t.count_freed_unseen_locked(key, rec, ring::Api::cuCtxDestroy, now);
      }
    }
  }
  if (took) t.job_uncharge(rec.device, rec.bytes);
  return r;
}

}  // namespace

CUW_EXPORT CUresult hook_cuArrayCreate_v2(CUarray* handle, const CUDA_ARRAY_DESCRIPTOR* desc) {
  auto real = REAL(cuArrayCreate_v2);
  if (!real) return kNoDriver;
  Reentry g;
  if (g.nested() || !desc || !handle) return real(handle, desc);
  Tracker& t = Tracker::get();
  const int ordinal = t.current_device();
  const uint64_t bytes = array_bytes(desc->Width, desc->Height, 0, desc->Format, desc->NumChannels, 1, 0);
  return tracked_array_create(t, ring::Api::cuArrayCreate, ordinal, bytes, [&] { return real(handle, desc); },
                              handle);
}

CUW_EXPORT CUresult hook_cuArray3DCreate_v2(CUarray* handle, const CUDA_ARRAY3D_DESCRIPTOR* desc) {
  auto real = REAL(cuArray3DCreate_v2);
  if (!real) return kNoDriver;
  Reentry g;
  if (g.nested() || !desc || !handle || !array_takes_memory(desc->Flags)) return real(handle, desc);
  Tracker& t = Tracker::get();
  const uint64_t bytes =
      array_bytes(desc->Width, desc->Height, desc->Depth, desc->Format, desc->NumChannels, 1, desc->Flags);
  return tracked_array_create(t, ring::Api::cuArray3DCreate, t.current_device(), bytes,
                              [&] { return real(handle, desc); }, handle);
}

CUW_EXPORT CUresult hook_cuMipmappedArrayCreate(CUmipmappedArray* handle, const CUDA_ARRAY3D_DESCRIPTOR* desc,
                                                unsigned int levels) {
  auto real = REAL(cuMipmappedArrayCreate);
  if (!real) return kNoDriver;
  Reentry g;
  if (g.nested() || !desc || !handle || !array_takes_memory(desc->Flags)) return real(handle, desc, levels);
  Tracker& t = Tracker::get();
  const uint64_t bytes =
      array_bytes(desc->Width, desc->Height, desc->Depth, desc->Format, desc->NumChannels, levels, desc->Flags);
  return tracked_array_create(t, ring::Api::cuMipmappedArrayCreate, t.current_device(), bytes,
                              [&] { return real(handle, desc, levels); }, handle);
}

CUW_EXPORT CUresult hook_cuArrayDestroy(CUarray handle) {
  auto real = REAL(cuArrayDestroy);
  if (!real) return kNoDriver;
  Reentry g;
  if (g.nested()) return real(handle);
  Tracker& t = Tracker::get();
  return tracked_array_destroy(t, reinterpret_cast<uint64_t>(handle), ring::Api::cuArrayDestroy,
                               [&] { return real(handle); });
}

CUW_EXPORT CUresult hook_cuMipmappedArrayDestroy(CUmipmappedArray handle) {
  auto real = REAL(cuMipmappedArrayDestroy);
  if (!real) return kNoDriver;
  Reentry g;
  if (g.nested()) return real(handle);
  Tracker& t = Tracker::get();
  return tracked_array_destroy(t, reinterpret_cast<uint64_t>(handle), ring::Api::cuMipmappedArrayDestroy,
                               [&] { return real(handle); });
}

// ---- graph memory nodes (CUDA driver API: Graph Management) -------------------------------
// Counted while the graph holds the allocation: from the allocation node's creation to the
// free node's (or to cuMemFree(Async) of its address outside the graph). Stream capture of
// cudaMallocAsync reaches cuMemAllocAsync and is counted there.

CUW_EXPORT CUresult hook_cuGraphAddMemAllocNode(CUgraphNode* node, CUgraph graph, const CUgraphNode* deps,
                                                size_t ndeps, CUDA_MEM_ALLOC_NODE_PARAMS* params) {
  auto real = REAL(cuGraphAddMemAllocNode);
  if (!real) return kNoDriver;
  Reentry g;
  if (g.nested() || !params || params->poolProps.location.type != CU_MEM_LOCATION_TYPE_DEVICE)
    return real(node, graph, deps, ndeps, params);
  Tracker& t = Tracker::get();
  return tracked_alloc_in(t, t.pointers(), ring::Api::cuGraphMemAlloc, params->poolProps.location.id, false,
                          params->bytesize, 0, [&] { return real(node, graph, deps, ndeps, params); },
                          [params] { return uint64_t{params->dptr}; });
}

CUW_EXPORT CUresult hook_cuGraphAddMemFreeNode(CUgraphNode* node, CUgraph graph, const CUgraphNode* deps,
                                               size_t ndeps, CUdeviceptr dptr) {
  auto real = REAL(cuGraphAddMemFreeNode);
  if (!real) return kNoDriver;
  Reentry g;
  if (g.nested()) return real(node, graph, deps, ndeps, dptr);
  Tracker& t = Tracker::get();
  return tracked_free(t, t.pointers(), dptr, ring::Api::cuMemFree, 0,
                      [&] { return real(node, graph, deps, ndeps, dptr); });
}

// ---- pinned host memory: tracked and shown, never capped --------------------------------

namespace {

template <class Call>
CUresult tracked_host_alloc(ring::Api api, uint64_t bytes, Call&& call, void* const* result) {
  Tracker& t = Tracker::get();
  const CUresult r = call();
  if (r != CUDA_SUCCESS || !result) return r;
  const int ordinal = t.current_device();
  ring::DeviceSlot* d = t.device(ordinal);
  const uint64_t key = reinterpret_cast<uint64_t>(*result);
  const uint64_t now = cuw::core::now_ns();
  std::lock_guard<cuw::spin_lock> lk(t.lock());
  std::optional<LiveRecord> stale;  // freed where we did not see it (as count_freed_unseen_locked)
  t.host().insert(key, LiveRecord{bytes, static_cast<int8_t>(ordinal), static_cast<uint16_t>(api)}, &stale);
  if (stale) {
    if (static_cast<unsigned>(stale->device) < ring::kMaxDevices)
      cuw::core::locked_sub(t.header().devices[stale->device].host_bytes, stale->bytes);
    t.emit_locked(ring::EventKind::host_free, ring::Api::reused, stale->device, key, stale->bytes, 0, CUDA_SUCCESS,
                  now);
  }
  if (d) cuw::core::locked_add(d->host_bytes, bytes);
  t.emit_locked(ring::EventKind::host_alloc, api, ordinal, key, bytes, 0, CUDA_SUCCESS, now);
  return r;
}

template <class Call>
CUresult tracked_host_free(ring::Api api, void* p, Call&& call) {
  Tracker& t = Tracker::get();
  LiveRecord rec;
  bool live = false;
  if (p) {
    std::lock_guard<cuw::spin_lock> lk(t.lock());
    live = t.host().take(reinterpret_cast<uint64_t>(p), &rec);
  }
  const CUresult r = call();
  if (!live) return r;
  ring::DeviceSlot* d = t.device(rec.device);
  const uint64_t now = cuw::core::now_ns();
  std::lock_guard<cuw::spin_lock> lk(t.lock());
  if (r != CUDA_SUCCESS) {
    t.host().insert(reinterpret_cast<uint64_t>(p), rec);
    return r;
  }
  if (d) cuw::core::locked_sub(d->host_bytes, rec.bytes);
  t.emit_locked(ring::EventKind::host_free, api, rec.device, reinterpret_cast<uint64_t>(p), rec.bytes, 0, CUDA_SUCCESS,
                now);
  return r;
}

}  // namespace

CUW_EXPORT CUresult hook_cuMemHostAlloc(void** pp, size_t bytesize, unsigned int flags) {
  auto real = REAL(cuMemHostAlloc);
  if (!real) return kNoDriver;
  Reentry g;
  if (g.nested()) return real(pp, bytesize, flags);
  return tracked_host_alloc(ring::Api::cuMemHostAlloc, bytesize, [&] { return real(pp, bytesize, flags); }, pp);
}

CUW_EXPORT CUresult hook_cuMemAllocHost_v2(void** pp, size_t bytesize) {
  auto real = REAL(cuMemAllocHost_v2);
  if (!real) return kNoDriver;
  Reentry g;
  if (g.nested()) return real(pp, bytesize);
  return tracked_host_alloc(ring::Api::cuMemAllocHost, bytesize, [&] { return real(pp, bytesize); }, pp);
}

CUW_EXPORT CUresult hook_cuMemHostRegister_v2(void* p, size_t bytesize, unsigned int flags) {
  auto real = REAL(cuMemHostRegister_v2);
  if (!real) return kNoDriver;
  Reentry g;
  if (g.nested()) return real(p, bytesize, flags);
  return tracked_host_alloc(ring::Api::cuMemHostAlloc, bytesize, [&] { return real(p, bytesize, flags); }, &p);
}

CUW_EXPORT CUresult hook_cuMemFreeHost(void* p) {
  auto real = REAL(cuMemFreeHost);
  if (!real) return kNoDriver;
  Reentry g;
  if (g.nested()) return real(p);
  return tracked_host_free(ring::Api::cuMemFreeHost, p, [&] { return real(p); });
}

CUW_EXPORT CUresult hook_cuMemHostUnregister(void* p) {
  auto real = REAL(cuMemHostUnregister);
  if (!real) return kNoDriver;
  Reentry g;
  if (g.nested()) return real(p);
  return tracked_host_free(ring::Api::cuMemFreeHost, p, [&] { return real(p); });
}

// ---- reported sizes --------------------------------------------------------------------

CUW_EXPORT CUresult hook_cuMemGetInfo_v2(size_t* free_bytes, size_t* total_bytes) {
  auto real = REAL(cuMemGetInfo_v2);
  if (!real) return kNoDriver;
  Reentry g;
  const CUresult r = real(free_bytes, total_bytes);
  if (g.nested() || r != CUDA_SUCCESS) return r;
  Tracker& t = Tracker::get();
  if (t.config().meminfo_physical) return r;
  const int ordinal = t.current_device();
  ring::DeviceSlot* d = t.device(ordinal);
  if (!d) return r;
  t.refresh_pools(ordinal, nullptr, true, false);  // keep `reserved` current for whoever watches
  const uint64_t physical = d->physical_total ? d->physical_total : (total_bytes ? *total_bytes : ~0ULL);
  uint64_t total, free_b;
  if (!capped_view(t, *d, physical, free_bytes ? *free_bytes : ~0ULL, &total, &free_b)) {
    // Uncapped: the driver's figures, plus what the cache keeps for reuse (free for the program).
    const uint64_t cached = d->cached.load(std::memory_order_relaxed);
    if (free_bytes && cached) *free_bytes += std::min<uint64_t>(cached, physical - std::min<uint64_t>(*free_bytes, physical));
    return r;
  }
  if (total_bytes) *total_bytes = total;
  if (free_bytes) *free_bytes = free_b;
  return r;
}

CUW_EXPORT CUresult hook_cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
  auto real = REAL(cuDeviceTotalMem_v2);
  if (!real) return kNoDriver;
  Reentry g;
  const CUresult r = real(bytes, dev);
  if (g.nested() || r != CUDA_SUCCESS || !bytes) return r;
  Tracker& t = Tracker::get();
  if (t.config().meminfo_physical) return r;
  ring::DeviceSlot* d = t.device(dev);
  if (!d) return r;
  const uint64_t limit = d->limit.load(std::memory_order_relaxed);
  if (limit != ring::kNoLimit && limit < *bytes) *bytes = limit;
  uint64_t job_cap = 0, job_used = 0;
  if (t.job_view(dev, &job_cap, &job_used) && job_cap < *bytes) *bytes = job_cap;
  return r;
}

// ---- entry points that queue GPU work (work_hooks.inc, generated) -------------------------
// Each calls the driver, then counts the work for CUWARDEN_POOL=cache (cache_resource.hpp,
// "the fast case"), failed calls included: a batch may have queued part of its work.

#define CUW_WORK_HOOK(ret, name, params, args, base, version, pts, lib) \
  CUW_EXPORT ret hook_##name params {                                   \
    auto real = REAL(name);                                             \
    if (!real) return kNoDriver;                                        \
    const ret r = real args;                                            \
    cuw::backends::work_queued();                                             \
    return r;                                                           \
  }
CUW_WORK_HOOKS(CUW_WORK_HOOK)
#undef CUW_WORK_HOOK

// ---- entry-point lookup (CUDA driver API: Driver Entry Point Access) ---------------------

CUW_EXPORT CUresult hook_cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags) {
  auto real = REAL(cuGetProcAddress);
  if (!real) return kNoDriver;
  const CUresult r = real(symbol, pfn, cudaVersion, flags);
  if (r == CUDA_SUCCESS && pfn && *pfn) *pfn = cuw::hook::redirect_proc(symbol, *pfn, cudaVersion, flags);
  return r;
}

CUW_EXPORT CUresult hook_cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                                             CUdriverProcAddressQueryResult* status) {
  auto real = REAL(cuGetProcAddress_v2);
  if (!real) return kNoDriver;
  const CUresult r = real(symbol, pfn, cudaVersion, flags, status);
  if (r == CUDA_SUCCESS && pfn && *pfn) *pfn = cuw::hook::redirect_proc(symbol, *pfn, cudaVersion, flags);
  return r;
}


// ---- NVML (NVML API reference: Device Queries, nvmlDeviceGetMemoryInfo) ------------------
// Reports the cap when the process has one, in agreement with cuMemGetInfo. NVML's devices
// are physical; they are matched to the process's CUDA ordinals by UUID. Only a process
// that already used CUDA has caps to report: NVML alone never creates a ring.

namespace {

constexpr cuw_nvmlReturn_t kNvmlSuccess = 0;
constexpr cuw_nvmlReturn_t kNvmlFunctionNotFound = 13;  // NVML_ERROR_FUNCTION_NOT_FOUND

/// The CUDA device slot of an NVML device, or nullptr (no tracker, no cap, no match).
ring::DeviceSlot* slot_for_nvml(cuw_nvmlDevice_t dev) {
  Tracker* t = Tracker::instance_if_created();
  if (!t || t->config().meminfo_physical) return nullptr;
  using uuid_fn = cuw_nvmlReturn_t (*)(cuw_nvmlDevice_t, char*, unsigned int);
  static auto get_uuid = reinterpret_cast<uuid_fn>(cuw::hook::nvml_symbol("nvmlDeviceGetUUID"));
  char uuid[96] = {};
  if (!get_uuid || get_uuid(dev, uuid, sizeof uuid) != kNvmlSuccess) return nullptr;
  // "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" -> 16 bytes
  uint8_t bytes[16];
  int n = 0;
  for (const char* c = std::strncmp(uuid, "GPU-", 4) == 0 ? uuid + 4 : uuid; *c && n < 32; ++c) {
    int v = (*c >= '0' && *c <= '9') ? *c - '0' : (*c >= 'a' && *c <= 'f') ? *c - 'a' + 10
            : (*c >= 'A' && *c <= 'F') ? *c - 'A' + 10 : -1;
    if (v < 0) continue;
    if (n % 2 == 0) bytes[n / 2] = static_cast<uint8_t>(v << 4);
    else bytes[n / 2] = static_cast<uint8_t>(bytes[n / 2] | v);
    ++n;
  }
  if (n != 32) return nullptr;
  for (uint32_t o = 0; o < ring::kMaxDevices; ++o) {
    ring::DeviceSlot& d = t->header().devices[o];
    if (d.present.load(std::memory_order_acquire) && std::memcmp(d.uuid, bytes, 16) == 0) return &d;
  }
  return nullptr;
}

}  // namespace

namespace {

/// Both NVML memory structs: total/free/used from the capped view; v2's driver-reserved
/// share is folded into used, so that used + free + reserved == total still holds.
template <class Memory>
cuw_nvmlReturn_t nvml_memory(cuw_nvmlReturn_t (*real)(cuw_nvmlDevice_t, Memory*), cuw_nvmlDevice_t device,
                             Memory* memory) {
  if (!real) return kNvmlFunctionNotFound;
  const cuw_nvmlReturn_t r = real(device, memory);
  if (r != kNvmlSuccess || !memory) return r;
  if (ring::DeviceSlot* d = slot_for_nvml(device)) {
    uint64_t total, free_b;
    if (capped_view(*Tracker::instance_if_created(), *d, memory->total, memory->free, &total, &free_b)) {
      memory->total = total;
      memory->free = free_b;
      memory->used = total - free_b;
      if constexpr (std::is_same_v<Memory, cuw_nvmlMemory_v2_t>) memory->reserved = 0;
    }
  }
  return r;
}

}  // namespace

CUW_EXPORT cuw_nvmlReturn_t hook_nvmlDeviceGetMemoryInfo(cuw_nvmlDevice_t device, cuw_nvmlMemory_t* memory) {
  return nvml_memory(REAL(nvmlDeviceGetMemoryInfo), device, memory);
}

CUW_EXPORT cuw_nvmlReturn_t hook_nvmlDeviceGetMemoryInfo_v2(cuw_nvmlDevice_t device, cuw_nvmlMemory_v2_t* memory) {
  return nvml_memory(REAL(nvmlDeviceGetMemoryInfo_v2), device, memory);
}

// ---- process exit ----------------------------------------------------------------------

__attribute__((destructor)) static void cuw_on_unload() {
  if (Tracker* t = Tracker::instance_if_created()) t->on_exit();
}

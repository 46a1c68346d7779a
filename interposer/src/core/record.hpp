// cuwarden interposer core: the recording API. What a hook or a backend calls to count,
// cap and record an allocation or free that reaches the driver: the cap check before the
// call, the live table, the counters and one event after it. The hot path (tracked_alloc_in,
// tracked_free) is inline here, so that each hook's path is one stretch of code. Its rare
// paths (a driver error, a free the driver refused) are out of line (CUW_COLD) but defined
// here as well: a call to a function the compiler sees lets it keep values in the registers
// the callee leaves alone (-fipa-ra); with the callee in another file, the hot path spilled
// more and kept a frame pointer (measured with bench/cold_lines.sh). Other rare entry
// points are in record.cpp.
#pragma once

#include <cuda.h>

#include <mutex>
#include <optional>

#include "core/ledger.hpp"
#include "core/room.hpp"
#include "core/tracker.hpp"
#include "cuw/attrs.hpp"
#include "cuw/ring.hpp"

namespace cuw::core {

/// For an ordinal assumed by Tracker::allocation_device (one device, no driver call):
/// whether the thread has a context at all. Asked after a failed allocation (no context:
/// the driver's answer passes through, uncounted, as for any call without a context; under
/// a cap the bytes charged before the call are given back, though `peak` may keep them).
inline CUW_COLD bool has_context(Tracker& t) { return t.current_device() >= 0; }

/// A failed driver allocation: give back what was charged, count, record; cold.
inline CUW_COLD void count_driver_error(Tracker& t, ring::DeviceSlot& d, int ordinal, ring::Api api,
                                        uint64_t bytes, uint64_t aux, CUresult r, bool charged, uint64_t now) {
  if (charged) t.uncharge_locked(d, bytes);
  Ledger::driver_error(t, d, ordinal, api, 0, bytes, aux, r, now);
  if (charged) t.job_uncharge(ordinal, bytes);
  if (r == CUDA_ERROR_OUT_OF_MEMORY) {
    t.report_oom(ordinal, bytes, api, ring::EventKind::driver_error, r);
    // The hook may ask the daemon for room (room.hpp); with a pool, what it kept went back first.
    note_driver_oom(ordinal, bytes, t.pooling());
  }
}

/// Something the driver's checkpoint API cannot carry (managed memory, an IPC handle) was
/// used on device `ordinal`: counted in its slot, where the daemon looks before it suspends
/// the process. One atomic add; cold.
inline CUW_COLD void count_uncarried(Tracker& t, int ordinal, std::atomic<uint64_t> ring::DeviceSlot::*counter) {
  if (ring::DeviceSlot* d = t.device(ordinal)) cuw::core::counter_add((*d).*counter, 1);
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
/// compare-and-swap) before the call; the driver call; then one lock for the table insert,
/// and the counters (and, uncapped, the charge) and the event, atomics, in the same
/// stretch. Uncapped, one load more before the call: whether the daemon holds the device
/// back (Tracker::held_back), which refuses.
template <class Call, class Key, class OnInsert = NoInsertHook>
CUW_INLINE CUresult tracked_alloc_in(Tracker& t, cuw::core::LiveTable& table, ring::Api api, int ordinal, bool assumed,
                                     uint64_t bytes, uint64_t aux, Call&& call, Key&& key_of_result,
                                     uint64_t* when = nullptr, OnInsert on_insert = {}) {
  ring::DeviceSlot* d = t.device(ordinal);
  if (!d) return call();  // no context, or an ordinal past what we track
  const bool charged = !t.uncapped(*d, ordinal);
  if (__builtin_expect(charged, 0)) {  // no cap (monitoring only): the straight line
    // With a pooling backend, a refusal waits until it gave back what it keeps free (every
    // context's: the cap is the device's), then charges again: a refusal is for real need
    // only.
    const bool pooling = t.pooling();
    Tracker::Charge c = t.charge(*d, ordinal, bytes, api, assumed, pooling);
    if (__builtin_expect(c == Tracker::Charge::refused && pooling, 0)) {
      t.reclaim();
      c = t.charge(*d, ordinal, bytes, api, assumed);  // a refusal now is counted and recorded
    }
    if (__builtin_expect(c != Tracker::Charge::ok, 0)) return c == Tracker::Charge::refused ? CUDA_ERROR_OUT_OF_MEMORY : call();
  } else if (__builtin_expect(t.any_held_back(), 0) && t.held_back_refused(*d, ordinal, bytes, api, assumed)) {
    return CUDA_ERROR_OUT_OF_MEMORY;  // (charge() asks it itself)
  }
  CUresult r = call();
  t.prefetch_commit(*d);
  // The event's time: when the call returned. Read after the driver call, so that a free
  // right after it (the common alloc, use, free pattern; a free reads its time before its
  // driver call) finds the clock's code and data in the cache.
  const uint64_t now = cuw::core::now_ns();
  if (when) *when = now;
  if (__builtin_expect(r == CUDA_SUCCESS, 1)) table.prefetch(key_of_result());
  // The driver is out of memory and a pooling backend keeps some: give it back and try once
  // more (an allocation the backend does not serve, e.g. cudaMallocAsync).
  if (__builtin_expect(r == CUDA_ERROR_OUT_OF_MEMORY, 0) && t.reclaim() > 0) r = call();
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
    Ledger::allocated(t, table, *d, ordinal, api, key, bytes, aux, charged, now, &stale, on_insert);
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
inline CUW_COLD void keep_live(Tracker& t, LiveTable& table, uint64_t key, const LiveRecord& rec, bool committed,
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
      if (committed) Ledger::unfreed(t, d, rec);
      t.emit_at(ring::EventKind::driver_error, api, rec.device, key, rec.bytes, aux, r, now);
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
        Ledger::freed(t, d, key, rec, api, aux, now);
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
  // The record left the table before the call: the counters and the event need no lock.
  ring::DeviceSlot& d = t.header().devices[rec.device];  // filled when it was allocated
  t.prefetch_commit(d);
  Ledger::freed(t, d, key, rec, api, aux, now);
  t.job_uncharge(rec.device, rec.bytes);
  return r;
}

/// The ordinal a stream-ordered allocation on `stream` is counted on: the current
/// context's (Tracker::allocation_device).
CUW_INLINE int stream_device(Tracker& t, CUstream, bool* assumed) { return t.allocation_device(assumed); }

/// A stream-ordered allocation of `bytes` on `stream` through `call` (cuMemAllocAsync: `pool`
/// nullptr, the device's default pool; cuMemAllocFromPoolAsync: the program's `pool`),
/// recorded as tracked_alloc does (aux: the stream); then the device's `reserved` follows the
/// pool (Tracker::pooled_alloc).
template <class Call>
CUW_INLINE CUresult tracked_alloc_async(Tracker& t, ring::Api api, CUmemoryPool pool, CUstream stream, uint64_t bytes,
                                        CUdeviceptr* dptr, Call&& call) {
  bool assumed = false;
  const int ordinal = stream_device(t, stream, &assumed);
  uint64_t now = 0;
  const CUresult r =
      tracked_alloc(t, api, ordinal, assumed, bytes, reinterpret_cast<uint64_t>(stream), dptr, call, &now);
  if (r == CUDA_SUCCESS) t.pooled_alloc(ordinal, pool, stream, now);
  return r;
}

/// cuMemAllocPitch: the allocation was charged `estimate` bytes before the driver chose its
/// pitch; the record at `dptr`, if still live, now counts `actual` (pitch x height), charged
/// even over a cap (the driver holds it). Cold.
void settle_pitch(Tracker& t, int ordinal, CUdeviceptr dptr, uint64_t estimate, uint64_t actual);

}  // namespace cuw::core

// cuwarden interposer core: the ledger, the one writer of what an allocation, a free, and a
// pool's driver memory taken and given back count: the device counters (ring::DeviceSlot),
// the live records (the snapshot's tables) and their events. The plain path (record.hpp,
// host.hpp) and every pool (backends/) call it; none of them writes a counter itself
// (tests/interposer/check_counters.py). A counter the interposer adds is one row in
// cuw/counters.hpp and one line here. The caps (used, peak, refusals, the job's share) are
// the tracker's (Tracker::charge and uncharge).
//
// The counters are atomics, each written with one relaxed read-modify-write (counter_add,
// counter_sub), and the event is pushed with the ring's lock-free CAS, so neither needs a
// lock: in every call the counters are written before the event is published (a release
// store), which is what ring.hpp promises the daemon (an event never arrives before the
// counter change it explains). What needs a lock is what the calls keep besides: the plain
// path's live records (Tracker::lock()), and a pool's block records, which are its device's
// PoolBook's (tracker.hpp), guarded by the book's lock, the one its pools hold for their
// free lists. A pool's hit takes that lock and no other: no lock of the process's.
#pragma once

#include <cstdint>
#include <optional>

#include "core/tracker.hpp"
#include "cuw/attrs.hpp"
#include "cuw/ring.hpp"

namespace cuw::core {

/// The plain path's entries (static) and a pool's book for one device (an instance).
/// Thread-safety: the plain path's members that touch a record (allocated, freed, unfreed)
/// require Tracker::lock() held; a pool's that touch its blocks' records (recorded, hit,
/// freed, forgot, unrecord, rerecord) require its PoolBook's lock; reused and
/// forgot_segment take Tracker::lock() themselves (call them without it). The members that
/// write only counters and events (driver_error, resized, host, handed_out, moved, lost,
/// waited, called, free_memory) are safe from any thread, with or without a lock.
class Ledger {
 public:
  // ---- the plain path: driver allocations the hooks record one by one --------------------

  /// A driver allocation of `bytes` at `key` on `d` (`ordinal`) through `api` succeeded:
  /// its record in `table` (a record left at `key`, freed where no hook saw it, is counted
  /// freed first: *stale, whose job share the caller gives back after unlocking), the
  /// counters (`charged` false: also used and peak), then its event (`aux`, stamped `now`).
  /// `on_insert(key)` runs right after the insert.
  template <class OnInsert>
  CUW_INLINE static void allocated(Tracker& t, LiveTable& table, ring::DeviceSlot& d, int ordinal, ring::Api api,
                                   uint64_t key, uint64_t bytes, uint64_t aux, bool charged, uint64_t now,
                                   std::optional<LiveRecord>* stale, OnInsert& on_insert) noexcept {
    table.insert(key,
                 LiveRecord{bytes, static_cast<int8_t>(ordinal), static_cast<uint16_t>(api), aux,
                            live::make_tag(now, thread_state().site)},
                 stale);
    if (__builtin_expect(stale->has_value(), 0)) t.count_freed_unseen_locked(key, **stale, ring::Api::reused, now);
    on_insert(key);
    if (!charged) t.count_uncapped_locked(d, bytes);
    count_alloc(t, d, ordinal, bytes, pooled(api));
    t.emit_at(ring::EventKind::alloc, api, ordinal, key, bytes, aux, CUDA_SUCCESS, now);
  }
  /// The allocation `rec` at `key` (its record already taken) was freed through `api`:
  /// uncharged, counted, its event. The caller gives back the job's share after unlocking.
  CUW_INLINE static void freed(Tracker& t, ring::DeviceSlot& d, uint64_t key, const LiveRecord& rec, ring::Api api,
                               uint64_t aux, uint64_t now) noexcept {
    t.uncharge_locked(d, rec.bytes);
    count_free(t, d, rec.device, rec.bytes, pooled(static_cast<ring::Api>(rec.api)));
    t.emit_at(ring::EventKind::free, api, rec.device, key, rec.bytes, aux, CUDA_SUCCESS, now);
  }
  /// A free counted before its driver call (freed()) that the driver then refused: the
  /// allocation `rec` at `key` is live again, counted even over a cap (the driver holds it).
  static void unfreed(Tracker& t, ring::DeviceSlot& d, const LiveRecord& rec) noexcept {
    t.count_uncapped_locked(d, rec.bytes);
    if (pooled(static_cast<ring::Api>(rec.api))) counter_add(t.pool_set(rec.device).live, rec.bytes);
    else counter_add(d.reserved, rec.bytes);
    counter_add(d.live_allocations, 1);
    counter_sub(d.free_count, 1);
  }
  /// An allocation the driver failed (result `r`): counted and its event (`bytes` asked).
  static void driver_error(Tracker& t, ring::DeviceSlot& d, int ordinal, ring::Api api, uint64_t address,
                           uint64_t bytes, uint64_t aux, uint32_t r, uint64_t now) noexcept {
    counter_add(d.driver_errors, 1);
    t.emit_at(ring::EventKind::driver_error, api, ordinal, address, bytes, aux, r, now);
  }
  /// The driver holds `actual` bytes for an allocation counted as `estimate` (a pitch).
  static void resized(ring::DeviceSlot& d, uint64_t estimate, uint64_t actual) noexcept {
    counter_add(d.reserved, actual - estimate);  // wraps for a decrease
  }
  /// Pinned host memory through `d`'s context (nullptr: no tracked device): `bytes` more
  /// (`added`) or fewer. The host record and event are the caller's (host.hpp).
  static void host(ring::DeviceSlot* d, uint64_t bytes, bool added) noexcept {
    if (!d) return;
    if (added) counter_add(d->host_bytes, bytes);
    else counter_sub(d->host_bytes, bytes);
  }

  /// What an allocation and a free count on `d`: live allocations, allocations or frees,
  /// and reserved (or, for a stream-ordered one, the driver pools' live bytes).
  CUW_INLINE static void count_alloc(Tracker& t, ring::DeviceSlot& d, int ordinal, uint64_t bytes, bool pooled) noexcept {
    if (__builtin_expect(pooled, 0)) counter_add(t.pool_set(ordinal).live, bytes);
    else counter_add(d.reserved, bytes);
    counter_add(d.live_allocations, 1);
    counter_add(d.alloc_count, 1);
  }
  CUW_INLINE static void count_free(Tracker& t, ring::DeviceSlot& d, int ordinal, uint64_t bytes, bool pooled) noexcept {
    if (__builtin_expect(pooled, 0)) counter_sub(t.pool_set(ordinal).live, bytes);
    else counter_sub(d.reserved, bytes);
    counter_sub(d.live_allocations, 1);
    counter_add(d.free_count, 1);
  }

  // ---- a pool's book: one device's counters as a pooling backend moves memory -----------
  // The records below are the device's PoolBook's (tracker.hpp): its lock held, which is the
  // pool's own; Tracker::lock() not needed (the calls that need it take it, after the
  // book's: reused, forgot_segment).

  /// The book of the pool on `ordinal`, whose counters are `slot`.
  Ledger(Tracker& t, ring::DeviceSlot& slot, int ordinal) noexcept
      : t_(t), d_(slot), blocks_(t.pool_book(ordinal).blocks), ordinal_(ordinal) {}

  /// A block of `block` bytes the pool held free is handed to the program: one live
  /// allocation more, `block` bytes fewer cached; `hit`: served without the driver.
  CUW_INLINE void handed_out(uint64_t block, bool hit) noexcept {
    counter_add(d_.live_allocations, 1);
    counter_add(d_.alloc_count, 1);
    counter_sub(d_.cached, block);
    if (hit) counter_add(d_.pool_hits, 1);
  }
  /// The program's allocation at `ptr` of `requested` bytes through `api` (counted by
  /// handed_out): its record and its alloc event, stamped `now`.
  CUW_INLINE void recorded(uint64_t ptr, uint64_t requested, ring::Api api, uint64_t now) noexcept {
    blocks_.insert(ptr, LiveRecord{requested, static_cast<int8_t>(ordinal_), static_cast<uint16_t>(api), 0,
                                   live::make_tag(now, thread_state().site)});
    t_.emit_at(ring::EventKind::alloc, api, ordinal_, ptr, requested, 0, CUDA_SUCCESS, now);
  }
  /// A hit: handed_out and recorded in one.
  CUW_INLINE void hit(uint64_t ptr, uint64_t requested, uint64_t block, ring::Api api, uint64_t now) noexcept {
    handed_out(block, true);
    recorded(ptr, requested, api, now);
  }
  /// The program freed the block at `ptr` (`requested` bytes asked, `block` held) through
  /// `api` (`aux`: the stream or 0); `cached` bytes go back to the pool's free memory (the
  /// block's, or 0 when the block leaves the pool with it): counters, record, event.
  CUW_INLINE void freed(uint64_t ptr, uint64_t requested, uint64_t cached, ring::Api api, uint64_t aux,
                        uint64_t now) noexcept {
    counter_sub(d_.live_allocations, 1);
    counter_add(d_.free_count, 1);
    counter_add(d_.cached, cached);
    blocks_.take(ptr, nullptr);
    t_.emit_at(ring::EventKind::free, api, ordinal_, ptr, requested, aux, CUDA_SUCCESS, now);
  }
  /// The pool took `reserved` bytes from its upstream (the driver, or reserved ranges), of
  /// which `cached` are free; or, negative, gave them back.
  CUW_INLINE void moved(int64_t reserved, int64_t cached) noexcept {
    counter_add(d_.reserved, static_cast<uint64_t>(reserved));  // wraps for a decrease
    counter_add(d_.cached, static_cast<uint64_t>(cached));
  }
  /// The context went with `live` blocks of `live_bytes` still handed out: they count as
  /// freed (their events: forgot()), and `reserved` and `cached` bytes leave the counters.
  void lost(uint64_t live, uint64_t reserved, uint64_t cached) noexcept {
    counter_sub(d_.live_allocations, live);
    counter_add(d_.free_count, live);
    counter_sub(d_.reserved, reserved);
    counter_sub(d_.cached, cached);
  }
  /// A block live when its context went (counted by lost()): its record and free event.
  void forgot(uint64_t ptr, uint64_t requested, uint64_t now) noexcept {
    blocks_.take(ptr, nullptr);
    t_.emit_at(ring::EventKind::free, ring::Api::cuCtxDestroy, ordinal_, ptr, requested, 0, CUDA_SUCCESS, now);
  }
  /// Driver memory at `base` went with its context: its record (no event: lost() counted it).
  /// Takes Tracker::lock().
  void forgot_segment(uint64_t base) noexcept {
    const spin_guard lk(t_.lock());
    t_.pool_segments().take(base, nullptr);
  }
  /// The pool's block at `ptr` is about to be given back to the driver with its memory (an
  /// exported block): its record leaves first (*rec), so that a record at `ptr` from the
  /// driver's return on is a new owner's. False if it had none.
  bool unrecord(uint64_t ptr, LiveRecord* rec) noexcept { return blocks_.take(ptr, rec); }
  /// ... the driver refused: the record goes back.
  void rerecord(uint64_t ptr, const LiveRecord& rec) noexcept { blocks_.insert(ptr, rec); }
  /// A segment the pool takes at `base`: an allocation the hooks still count there (not a
  /// pool's: freed with a context another thread destroyed a moment ago) was freed; counted
  /// so (Tracker::count_freed_unseen_locked). True with *stale when so: the caller gives
  /// back its job share after unlocking. Takes Tracker::lock().
  bool reused(uint64_t base, LiveRecord* stale, uint64_t now) noexcept {
    const spin_guard lk(t_.lock());
    if (__builtin_expect(!t_.pointers().take(base, stale), 1)) return false;
    t_.count_freed_unseen_locked(base, *stale, ring::Api::reused, now);
    return true;
  }
  /// The pool waited for earlier GPU work before reusing a block.
  void waited() noexcept { counter_add(d_.pool_waits, 1); }

  /// What a pool called the driver for (counters.hpp: pool_driver_allocs, pool_driver_frees):
  /// memory taken, memory given back. (Its fence's waits are pool_waits: waited().)
  enum class Call : uint8_t { take, give };
  /// A pool made `n` driver calls of kind `c` for device `d`. An atomic add, without the
  /// tracker's lock: these calls are made under a pool's own mutex or none, and each costs
  /// far more than the add. Thread-safe.
  static void called(ring::DeviceSlot& d, Call c, uint64_t n = 1) noexcept {
    std::atomic<uint64_t>& f = c == Call::take ? d.pool_driver_allocs : d.pool_driver_frees;
    f.fetch_add(n, std::memory_order_relaxed);
  }
  /// The pool's upstream failed to provide `bytes` (result `r`).
  void driver_error(uint64_t bytes, uint32_t r, uint64_t now) noexcept {
    driver_error(t_, d_, ordinal_, ring::Api::cuMemAlloc, 0, bytes, 0, r, now);
  }
  /// The pool's free memory for large requests: its bytes, and the largest request it serves.
  CUW_INLINE void free_memory(uint64_t bytes, uint64_t largest) noexcept {
    d_.pool_free.store(bytes, std::memory_order_relaxed);
    d_.pool_largest_free.store(largest, std::memory_order_relaxed);
  }
  /// Driver memory [base, base + bytes) a pool on `ordinal` took (`added`) or gave back: its
  /// record in the pool's segments and a segment event (`unit` > 0: one record per `unit`
  /// bytes, the granules; `bytes` 0 on give-back: the record's size). Counters: moved().
  /// Takes the lock itself (call without it). Cold.
  static void segment(Tracker& t, int ordinal, uint64_t base, uint64_t bytes, bool added, uint64_t unit = 0) noexcept {
    t.record_segment(ordinal, base, bytes, added, unit);
  }

 private:
  Tracker& t_;
  ring::DeviceSlot& d_;
  LiveTable& blocks_;  ///< the device's PoolBook's records
  const int ordinal_;
};

}  // namespace cuw::core

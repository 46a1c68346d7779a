// cuwarden interposer: a pool's blocks (pool.hpp has the design): the block map, the free
// lists, and the hot paths, allocate and free, and whole blocks' growth. Included by a
// layout's file (with release_impl.hpp and batches_impl.hpp), which instantiates pool<Layout>.
#pragma once

#include "backends/pool/pool.hpp"

#include <algorithm>
#include <mutex>

#include "backends/pool/tuning.hpp"
#include "base/work_epoch.hpp"
#include "core/room.hpp"
#include "core/tracker.hpp"
#include "cuw/attrs.hpp"

namespace cuw::backends::pool {

using namespace tuning;  // the pool's tuning and size classes

// ---- construction ------------------------------------------------------------------------

template <class Layout>
pool<Layout>::pool(std::unique_ptr<memory_resource> upstream, Layout layout, CUcontext ctx, int ordinal,
                   ring::DeviceSlot& slot, core::Tracker& tracker, owner<Layout>& holder)
    : upstream_(std::move(upstream)),
      layout_(std::move(layout)),
      ctx_(ctx),
      ordinal_(ordinal),
      slot_(slot),
      tracker_(tracker),
      owner_(holder),
      ledger_(tracker, slot, ordinal),
      large_round_(layout_.large_round()),
      gran_(layout_.unit()),
      slab_bytes_(layout_.slab_bytes()),
      mu_(tracker.pool_book(ordinal).mu),
      free_(gran_),
      budget_(tracker.config().pool_keep, uint64_t{tracker.config().pool_idle_ms} * 1000000),
      fence_(ctx) {
  work::start_counting();
}

template <class Layout>
pool<Layout>::~pool() {
  // Segments are not freed: the pool lives as long as the process (or its context).
  // The layout takes back the Blocks it made for a segment (its own to delete).
  for (auto& [base, s] : segments_) {
    layout_.dropping_locked(s);
    delete s;
  }
}

// ---- segments and free lists (under mu_) --------------------------------------------

template <class Layout>
Segment* pool<Layout>::segment_at_locked(CUdeviceptr p) const noexcept {
  auto it = segments_.upper_bound(p);
  if (it == segments_.begin()) return nullptr;
  Segment* s = std::prev(it)->second;
  return p - s->base < s->bytes ? s : nullptr;
}

template <class Layout>
bool pool<Layout>::hooks_count(CUdeviceptr p) const noexcept {
  const spin_guard lk(tracker_.lock());  // (after the book's lock: tracker.hpp's order)
  return tracker_.pointers().contains(p);
}

template <class Layout>
CUresult pool<Layout>::not_live_unlock(CUdeviceptr p) noexcept {
  const Segment* s = segment_at_locked(p);
  const bool handed_again = s && (s->leaving || ctx_going_);
  mu_.unlock();
  if (!s) return CUDA_ERROR_NOT_FOUND;
  // Unlocked: another pool's block is looked up under its own lock (never two books' at once).
  if (handed_again && (hooks_count(p) || owner_.live_elsewhere(p, this))) return CUDA_ERROR_NOT_FOUND;
  return CUDA_ERROR_INVALID_VALUE;
}

template <class Layout>
void pool<Layout>::drop_locked(Segment* s) noexcept {
  segments_.erase(s->base);
  each_block(s, [&](Block* b) { map_.erase(b->ptr); });
  layout_.dropping_locked(s);
}

template <class Layout>
Block* pool<Layout>::block_at_locked(Segment* s, CUdeviceptr p) const noexcept {
  if (s->split) {
    for (Block* b = &s->blocks[0]; b; b = b->hi)
      if (p - b->ptr < b->size) return b;
    return nullptr;
  }
  const uint64_t idx = s->cls >= 0 ? (p - s->base) / class_size(s->cls) : 0;
  return idx < s->carved ? &s->blocks[idx] : nullptr;
}

template <class Layout>
CUW_HOT void pool<Layout>::push_free_locked(Block* b) noexcept {
  b->state = kFree;
  // A split segment's block merges with its free neighbours (the layout's). A layout that
  // never splits drops this test at compile time: its splits() is constexpr false.
  if (__builtin_expect(b->seg->split, 0) && layout_.splits()) b = layout_.merge_locked(*this, b);
  if (free_.push(b)) publish_free_locked();
}

// The pool's free large blocks in the device's slot (its `fragmentation`): their bytes, and
// the largest request they serve (the layout's answer). Where several contexts share a
// device, the last pool to change writes them.
template <class Layout>
CUW_HOT void pool<Layout>::publish_free_locked() noexcept {
  ledger_.free_memory(free_.large_bytes(), layout_.served_locked(free_));
}

template <class Layout>
void pool<Layout>::unlink_free_locked(Block* b) noexcept {
  free_.unlink(b);
  if (b->seg->cls < 0) publish_free_locked();
}

template <class Layout>
Block* pool<Layout>::carve_locked(Segment* s) noexcept {
  const uint64_t size = class_size(s->cls);
  Block* b = &s->blocks[s->carved];
  b->ptr = s->base + s->carved * size;
  b->size = size;
  b->seg = s;
  ++s->carved;
  if (s->carved == s->capacity && free_.carving(s->cls) == s) free_.carving(s->cls) = nullptr;
  map_insert_locked(b);
  return b;
}

template <class Layout>
CUW_HOT Block* pool<Layout>::take_locked(int cls, uint64_t rounded) noexcept {
  if (cls >= 0) {
    if (Block* b = free_.pop_small(cls)) return b;
    if (Segment* s = free_.carving(cls)) return carve_locked(s);
    return nullptr;
  }
  return layout_.take_large_locked(*this, rounded);
}

template <class Layout>
Block* pool<Layout>::take_whole_locked(uint64_t rounded) noexcept {
  Block* b = free_.take_within(rounded, large_slack(rounded));
  if (b) publish_free_locked();
  return b;
}

template <class Layout>
CUW_HOT void pool<Layout>::hand_out_locked(Block* b, uint64_t requested) noexcept {
  b->state = kLive;
  b->requested = requested;
  b->generation = ++hand_outs_;  // the pool's count: a Block the layout reuses starts no count anew
  ++b->seg->busy;
}

// ---- allocate ----------------------------------------------------------------------------

// Fast path, a hit: class computation, the lock, pop of a free list, four counters, the
// event. No driver call, no clock read (the caller read the time before).
template <class Layout>
CUW_HOT CUresult pool<Layout>::allocate_traced(CUdeviceptr* out, std::size_t bytes, ring::Api api, uint64_t now) {
  uint64_t rounded;
  int cls;
  if (bytes <= kSmallMax) {
    cls = small_class(bytes, &rounded);
  } else {
    cls = -1;
    rounded = (bytes + large_round_ - 1) & ~(large_round_ - 1);
    if (rounded < bytes) return CUDA_ERROR_OUT_OF_MEMORY;
  }
  mu_.lock();
  if (Block* b = take_locked(cls, rounded)) {
    hand_out_locked(b, bytes);
    *out = b->ptr;
    ledger_.hit(b->ptr, bytes, b->size, api, now);
    mu_.unlock();
    return CUDA_SUCCESS;
  }
  mu_.unlock();
  CUresult r;
  bool cap_refused = false;
  {
    std::lock_guard<std::mutex> g(slow_);
    r = slow_allocate(out, bytes, cls, rounded, false, &cap_refused);
  }
  if (__builtin_expect(cap_refused, 0)) {
    // The cap (or the driver, out of memory) refused even after this pool gave back what
    // it keeps: the other contexts' pools give back theirs (outside this one's slow_: each
    // takes its own), and the last try's refusal is the one counted.
    owner_.release_all_except(this);
    std::lock_guard<std::mutex> g(slow_);
    r = slow_allocate(out, bytes, cls, rounded, true, nullptr);
  }
  if (r == CUDA_SUCCESS) {
    const uint64_t done = core::now_ns();
    std::lock_guard<spin_lock> lk(mu_);
    ledger_.recorded(*out, bytes, api, done);
  }
  return r;
}

template <class Layout>
bool pool<Layout>::try_take(CUdeviceptr* out, uint64_t bytes, int cls, uint64_t rounded) {
  mu_.lock();
  Block* b = take_locked(cls, rounded);
  if (!b) {
    mu_.unlock();
    return false;
  }
  hand_out_locked(b, bytes);
  ledger_.handed_out(b->size, true);
  *out = b->ptr;
  mu_.unlock();
  return true;
}

template <class Layout>
CUresult pool<Layout>::slow_allocate(CUdeviceptr* out, uint64_t bytes, int cls, uint64_t rounded, bool last,
                                       bool* cap_refused) {
  if (dead_) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  const bool cap_active = work::capturing();
  layout_.prepare_slow(*this);
  if (!cap_active) poll_slow();
  if (try_take(out, bytes, cls, rounded)) return CUDA_SUCCESS;
  if (!cap_active) {
    bool seal;
    mu_.lock();
    // One event per stream per seal: amortize it. A small request would rather grow (a slab
    // serves many) than seal a batch of a few blocks; a large one seals at once.
    seal = open_count_ > 0 && (open_count_ >= kSealMinBlocks || open_bytes_ >= kSealMinBytes || cls < 0 ||
                               pending_bytes_.load(std::memory_order_relaxed) >= kGrowPending);
    mu_.unlock();
    if (seal) {
      seal_locked_slow();
      poll_slow();
      if (try_take(out, bytes, cls, rounded)) return CUDA_SUCCESS;
    }
    // Grow (one slab serves many small requests; a new large block lets the program run
    // ahead of the GPU) while what waits for the GPU, this request included, stays under
    // kGrowPending; past it, wait for the oldest batches, as long as one holds a fit.
    const uint64_t pending = pending_bytes_.load(std::memory_order_relaxed);
    const bool grow = cls >= 0 ? pending < kGrowPending : pending + rounded <= kGrowPending;
    if (!grow) {
      for (;;) {
        const bool fit = fence_.any_block([&](const Block* b) {
          return cls >= 0 ? b->seg->cls == cls : b->seg->cls < 0 && layout_.may_serve(*b, rounded);
        });
        if (!fit || !wait_oldest_slow()) break;
        if (try_take(out, bytes, cls, rounded)) return CUDA_SUCCESS;
      }
    }
  }
  return layout_.grow_slow(*this, out, bytes, cls, rounded, last, cap_refused);
}

template <class Layout>
bool pool<Layout>::charge_segment(uint64_t bytes, bool quiet) {
  return tracker_.charge(slot_, ordinal_, bytes, ring::Api::cuMemAlloc, false, quiet) == core::Tracker::Charge::ok;
}

template <class Layout>
CUresult pool<Layout>::grow_whole_slow(CUdeviceptr* out, uint64_t bytes, int cls, uint64_t rounded, bool last,
                                       bool* cap_refused) {
  uint64_t seg_bytes = cls >= 0 ? slab_bytes_ : rounded;
  // No hoarding: past the budget, free driver allocations go back before another is made.
  if (over_budget(seg_bytes) && !work::capturing()) reclaim_slow(seg_bytes);
  auto fits = [this](uint64_t n) { return core::Tracker::fits(slot_, n); };
  // The cap first: cached bytes count against it, so give back what is free, then what
  // pending frees free, before charging.
  if (!fits(seg_bytes)) {
    release_slow();
    if (!fits(seg_bytes) && !work::capturing()) {
      needing n(*this);  // a refusal otherwise: what waits behind marks goes back now
      wait_all_slow();
      release_slow();
    }
    if (!fits(seg_bytes)) {
      // Still no room for a slab or a rounded block: a block of exactly the request
      // (512-byte rounded), one driver allocation of its own.
      const uint64_t exact = (bytes + 511) & ~uint64_t{511};
      if (exact < seg_bytes) {
        seg_bytes = exact;
        cls = -1;
      }
    }
  }
  if (!charge_segment(seg_bytes, true)) {
    // Refused (a job's cap, which fits() does not see, or another thread's charge in
    // between): give back what this pool keeps, then charge again.
    release_slow();
    if (!work::capturing()) {
      needing n(*this);
      wait_all_slow();
      release_slow();
    }
    if (!charge_segment(seg_bytes, !last)) {  // the last try's refusal is counted by charge
      if (!last && cap_refused) *cap_refused = true;
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
  }
  CUdeviceptr base = 0;
  CUresult r = upstream_->allocate(&base, seg_bytes);
  if (r == CUDA_ERROR_OUT_OF_MEMORY) {
    // The driver itself is out of memory: what the pool keeps may be the reason.
    needing n(*this);
    if (!work::capturing()) wait_all_slow();
    if (release_slow() > 0) r = upstream_->allocate(&base, seg_bytes);
  }
  if (r != CUDA_SUCCESS) {
    tracker_.uncharge(slot_, seg_bytes);
    if (r == CUDA_ERROR_OUT_OF_MEMORY && !last && cap_refused) {
      // Other contexts' pools may hold what the driver lacks: the caller has them give it
      // back and tries once more; only that try's failure is counted.
      *cap_refused = true;
      return r;
    }
    const uint64_t now = core::now_ns();
    std::lock_guard<spin_lock> lk(mu_);
    ledger_.driver_error(seg_bytes, r, now);
    if (r == CUDA_ERROR_OUT_OF_MEMORY) core::note_driver_oom(ordinal_, bytes, true);  // after release_slow()
    return r;
  }
  add_segment(out, base, seg_bytes, bytes, cls);
  return CUDA_SUCCESS;
}

template <class Layout>
void pool<Layout>::add_segment(CUdeviceptr* out, CUdeviceptr base, uint64_t seg_bytes, uint64_t bytes, int cls,
                                 uint64_t first, uint64_t take) {
  auto* s = new Segment;
  s->base = base;
  s->bytes = seg_bytes;
  s->cls = cls;
  s->split = layout_.splits() && cls < 0;
  s->capacity = cls >= 0 ? static_cast<uint32_t>(seg_bytes / class_size(cls)) : 1;
  s->blocks.reset(new Block[s->capacity]);
  // An allocation the hooks still count at this address (not the pool's: freed with a
  // context another thread destroyed a moment ago) was freed: Tracker::count_freed_unseen_locked.
  // Before the book's lock, so that its hits never wait for the hooks' lock.
  core::LiveRecord stale;
  const bool reused = ledger_.reused(base, &stale, core::now_ns());
  mu_.lock();
  segments_[base] = s;
  Block* b;
  if (cls >= 0) {
    free_.carving(cls) = s;
    b = carve_locked(s);
  } else {
    b = &s->blocks[0];
    b->ptr = base;
    b->size = first ? first : seg_bytes;
    b->seg = s;
    s->carved = 1;
    map_insert_locked(b);
    if (s->split) {
      s->top = b->size;
      s->last = b;
    }
  }
  layout_.added_locked(*this, s, b, take);  // (may split b to `take`: the rest stays free)
  hand_out_locked(b, bytes);
  *out = b->ptr;
  // (Else the upstream counted what it backs reserved and cached; its block is live now.)
  if (layout_.counts_upstream()) ledger_.moved(static_cast<int64_t>(seg_bytes), static_cast<int64_t>(seg_bytes));
  ledger_.handed_out(b->size, false);
  mu_.unlock();
  if (__builtin_expect(reused, 0)) tracker_.job_uncharge(stale.device, stale.bytes);
}

template <class Layout>
bool pool<Layout>::over_budget(uint64_t more) noexcept {
  // Memory on its way back (giving_: free, waiting for its events) is no longer the pool's to
  // keep: the budget leaves it out (the cap still counts it).
  const uint64_t reserved = slot_.reserved.load(std::memory_order_relaxed);
  const uint64_t cached = slot_.cached.load(std::memory_order_relaxed);
  const uint64_t going = std::min(giving_bytes_, cached);
  return budget_.over(reserved - going, cached - going, more, core::now_ns());
}

template <class Layout>
void pool<Layout>::trim_idle() noexcept {
  if (!slow_.try_lock()) return;  // another thread is in the slow path: it will do
  std::lock_guard<std::mutex> g(slow_, std::adopt_lock);
  const uint64_t now = core::now_ns();
  if (!budget_.trim_due(now) || work::capturing()) return;  // (a later free trims)
  budget_.disarm();
  if (dead_ || dying_) return;
  poll_slow();  // frees whose work has completed (no wait on a free)
  // (Memory on its way back, giving_, is left out: as over_budget.)
  const uint64_t cached0 = slot_.cached.load(std::memory_order_relaxed);
  const uint64_t going = std::min(giving_bytes_, cached0);
  const uint64_t reserved = slot_.reserved.load(std::memory_order_relaxed) - going, cached = cached0 - going;
  const uint64_t live = reserved > cached ? reserved - cached : 0;
  const uint64_t b = budget_.restart(live, now);  // the old peak is forgotten
  if (reserved <= b) return;
  layout_.trim_slow(*this, reserved - b);
  // Pending frees, or memory waiting to go back, may still hold memory past the budget: look
  // again after another while.
  if (slot_.reserved.load(std::memory_order_relaxed) > b) budget_.retry(now);
}

// ---- free --------------------------------------------------------------------------------

// Fast path: one lock, one map probe, a push onto a free list (idle, or stream order) or the open batch,
// four counters, the event. Not idle: every kSealBlocks-th free also seals the batch (one
// event per stream), every kPollEvery-th polls.
template <class Layout>
CUW_HOT CUresult pool<Layout>::free_traced(CUdeviceptr p, ring::Api api, uint64_t aux, uint64_t now) {
  mu_.lock();
  if (__builtin_expect(ctx_going_, 0) && hooks_count(p)) {
    // The driver destroyed the context, freeing this pool's memory, and handed p out again:
    // the free is the new owner's even where a block of ours that was never freed starts.
    mu_.unlock();
    return CUDA_ERROR_NOT_FOUND;
  }
  Block* b = map_.find(p);
  if (__builtin_expect(!b || b->state != kLive, 0)) {
    // Inside memory this pool holds but not a live block's start (a second free, an
    // interior pointer): the driver's answer for a pointer it did not hand out. Passing it
    // on would free the driver allocation under the pool's other blocks.
    return not_live_unlock(p);
  }
  const uint64_t size = b->size;
  if (__builtin_expect(b->exported, 0)) {
    b->state = kPending;  // claimed: a second free of it is refused while the driver's runs
    mu_.unlock();
    return free_exported(b, api, aux, now);
  }
  ledger_.freed(p, b->requested, size, api, aux, now);
  bool ready = fence_.idle();  // nothing queued since a completed event: whatever used it has finished
  if (!ready && unordered_ == 0 && fence_.ordered()) {
    // Stream order (fence.hpp): what used it runs on the legacy stream, before any work of
    // its next owner; a new non-blocking stream, peer or capture is ordered after it first.
    ready = true;
    ++taints_;
  }
  if (ready) {
    --b->seg->busy;
    push_free_locked(b);
    mu_.unlock();
    if (__builtin_expect(budget_.trim_due(now), 0)) trim_idle();
    return CUDA_SUCCESS;
  }
  b->state = kPending;
  b->next = open_head_;
  open_head_ = b;
  open_bytes_ += size;
  pending_bytes_.store(pending_bytes_.load(std::memory_order_relaxed) + size, std::memory_order_relaxed);
  const uint32_t n = ++open_count_;
  mu_.unlock();
  // Seal a full batch, or the first free when nothing is sealed (its events may prove the
  // device idle: the fast case); poll every kPollEvery frees so that a proof is seen. The
  // poll right after a seal pays: a program that freed after waiting for the GPU often has
  // it idle, the event completes within the poll's reach, and the frees that follow are
  // fast (on the H200, leaving it out took a per-step loop from 2.6 to 4.1 us in the
  // allocator, bench/results/2026-11-30-h200-cache-fastreuse-runs.md, run E).
  const bool seal = n >= kSealBlocks || fence_.sealed() == 0;
  if ((seal || n % kPollEvery == 0) && !work::capturing() && slow_.try_lock()) {
    if (seal) seal_locked_slow();
    poll_slow();
    slow_.unlock();
  }
  if (__builtin_expect(budget_.trim_due(now), 0)) trim_idle();
  return CUDA_SUCCESS;
}

// (free_traced, for a block it set kPending.) An IPC handle was given out for this block's
// driver allocation: it is never handed out again, but freed now (cuMemFree synchronizes,
// as the program's own call would have). The free is counted only once the driver did it:
// a refused one (inside a global-mode capture, say) leaves the block live and returns the
// driver's error, as the program's own call would.
template <class Layout>
CUresult pool<Layout>::free_exported(Block* b, ring::Api api, uint64_t aux, uint64_t now) {
  std::lock_guard<std::mutex> g(slow_);
  // The context was destroyed (forget_all deleted b with its segment) or is being destroyed
  // (its memory goes with it): no driver call on an address that may be someone else's.
  if (dead_) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  Segment* s = b->seg;  // b is ours (kPending, set by free_traced), its segment busy
  if (dying_) {
    mu_.lock();
    b->state = kLive;
    mu_.unlock();
    return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  }
  // Leaving, and the block's record gone, before the driver's free: from its return on, a
  // record at this address is a new owner's (not_live_unlock), never this block's.
  core::LiveRecord rec;
  mu_.lock();
  s->leaving = true;
  const bool had_record = ledger_.unrecord(b->ptr, &rec);
  mu_.unlock();
  const CUresult r = upstream_->deallocate(s->base, s->bytes);
  mu_.lock();
  if (r != CUDA_SUCCESS) {
    b->state = kLive;
    s->leaving = false;
    if (had_record) ledger_.rerecord(b->ptr, rec);
    mu_.unlock();
    return r;
  }
  drop_locked(s);
  ledger_.moved(-static_cast<int64_t>(s->bytes), 0);
  ledger_.freed(b->ptr, b->requested, 0, api, aux, now);  // (its record: taken above)
  mu_.unlock();
  tracker_.uncharge(slot_, s->bytes);
  delete s;
  return CUDA_SUCCESS;
}

}  // namespace cuw::backends::pool

#include "backends/pool/batches_impl.hpp"
#include "backends/pool/release_impl.hpp"

// cuwarden interposer: a pool's segments (driver allocations, or ranges) once made: giving
// them back (release; a destroyed context's forget_all), and what they answer for (pointer
// queries, IPC export, the blocks and statistics the seam reports). Included by pool_impl.hpp.
#pragma once

#include "backends/pool/pool.hpp"

#include <algorithm>
#include <vector>

#include "backends/pool/tuning.hpp"
#include "base/log.hpp"
#include "base/work_epoch.hpp"
#include "core/tracker.hpp"
#include "cuw/attrs.hpp"

namespace cuw::backends::pool {

using namespace tuning;  // the pool's tuning and size classes

// ---- release -------------------------------------------------------------------------------

template <class Layout>
uint64_t pool<Layout>::release_slow(uint64_t want, Which which) {
  // No cuMemFree while a capture is active: it is not allowed in a global-mode capture (it
  // would invalidate the program's graph) and it synchronizes the device in any other. None
  // either while the context is being destroyed: its addresses may be someone else's.
  if (work::capturing() || dying_ || dead_) return 0;
  // What waits behind marks first: polled, or, when a refusal needs it, waited for (as long as
  // cudaFree's own synchronization would have taken).
  uint64_t total = give_pending_slow(need_now_);
  std::vector<Segment*> gone;
  uint64_t planned = 0;
  mu_.lock();
  for (auto& [base, s] : segments_) {
    if (planned >= want) break;
    if (s->busy != 0) continue;
    if (which == Which::slabs && s->cls < 0) continue;
    if (which == Which::holes) {
      bool only_holes = true;
      each_block(s, [&](Block* b) { only_holes = only_holes && b->state == kHole; });
      if (!only_holes) continue;
    }
    // Out of reach while the driver frees it: no block free or carvable. It stays in
    // segments_ and the block map until the free returns, so a second free of one of its
    // blocks is refused rather than passed to the driver (which would free the segment
    // under us); not_live_unlock lets through only a free of what the driver handed out again.
    each_block(s, [&](Block* b) {
      if (b->state == kFree) unlink_free_locked(b);
    });
    if (s->cls >= 0 && free_.carving(s->cls) == s) free_.carving(s->cls) = nullptr;
    ++s->busy;
    s->leaving = true;
    gone.push_back(s);
    planned += s->bytes;
  }
  mu_.unlock();
  if (gone.empty()) return total;
  // Their free blocks may have been handed out by stream order, their old owners' work still
  // queued: they go back once events recorded now have completed (kept, counted and charged
  // until then), or now when those already have.
  // Past kGivePending bytes waiting so, the GPU is far behind: wait for them (as a batch
  // waits past kGrowPending), rather than hold ever more.
  giving g;
  if (!settle_slow(&g, need_now_)) {
    if (!g.mark.events.empty() && giving_bytes_ + planned > kGivePending) {
      CtxScope scope(ctx_);
      if (fence_.done(g.mark, true)) return total + give_back_slow(gone);
    }
    if (g.mark.events.empty() || work::capturing()) {  // a capture began: nothing may wait, nothing goes back
      mu_.lock();
      for (Segment* s : gone) keep_locked(s);
      mu_.unlock();
      return total;
    }
    g.segs = std::move(gone);
    giving_bytes_ += planned;
    giving_.push_back(std::move(g));
    return total;
  }
  return total + give_back_slow(gone);
}

template <class Layout>
void pool<Layout>::keep_locked(Segment* s) noexcept {
  --s->busy;
  s->leaving = false;
  each_block(s, [&](Block* b) {
    if (b->state == kFree) push_free_locked(b);
  });
  if (s->cls >= 0 && s->carved < s->capacity && !free_.carving(s->cls)) free_.carving(s->cls) = s;
}

template <class Layout>
uint64_t pool<Layout>::give_back_slow(std::vector<Segment*>& gone) {
  // Each segment is dropped as soon as the driver's free returns: from then on the driver
  // may hand its addresses to anyone (another thread's allocation, a pool's new segment).
  uint64_t total = 0;
  for (Segment* s : gone) {
    const bool freed = upstream_->deallocate(s->base, s->bytes) == CUDA_SUCCESS;
    mu_.lock();
    if (!freed) {
      keep_locked(s);  // the driver refused to free it: still ours, still counted, usable again
      mu_.unlock();
      continue;
    }
    --s->busy;
    drop_locked(s);
    total += s->bytes;
    // (Else the upstream counts what it backs, and gives it back itself.)
    if (layout_.counts_upstream()) ledger_.moved(-static_cast<int64_t>(s->bytes), -static_cast<int64_t>(s->bytes));
    mu_.unlock();
    if (layout_.counts_upstream()) tracker_.uncharge(slot_, s->bytes);
    delete s;
  }
  return total;
}

template <class Layout>
uint64_t pool<Layout>::reclaim_slow(uint64_t want) {
  if (work::capturing() || dying_ || dead_) return 0;
  return layout_.reclaim_slow(*this, want);
}

template <class Layout>
std::size_t pool<Layout>::release() {
  std::lock_guard<std::mutex> g(slow_);
  if (dead_ || dying_) return 0;  // the context's memory is going: its addresses may be handed out again
  needing n(*this);  // (what waits behind marks too)
  wait_all_slow();  // pending frees too (not during a capture): the device-wide wait cudaFree would have done
  return layout_.release_slow(*this);
}

template <class Layout>
void pool<Layout>::set_dying(bool dying) {
  std::lock_guard<std::mutex> g(slow_);  // after any driver call of the slow path in flight
  dying_ = dying;
  mu_.lock();
  ctx_going_ = dying;
  mu_.unlock();
}

template <class Layout>
void pool<Layout>::forget_all() noexcept {
  std::lock_guard<std::mutex> g(slow_);
  // The segments' records leave the hooks' table after the book's lock is released (its
  // other pools' hits never wait for the hooks' lock): their bases, kept here (segments_
  // changes only under slow_); without memory for them, one by one under it.
  const bool counts = layout_.counts_upstream();
  std::vector<uint64_t> bases;
  if (counts) try {
      bases.reserve(segments_.size());
    } catch (...) {
    }
  mu_.lock();
  dead_ = true;
  uint64_t total = 0, live_bytes = 0, live = 0;
  const uint64_t now = core::now_ns();
  // Live, or an exported block whose free is waiting for slow_ (still counted live).
  auto counted_live = [](const Block& b) { return b.state == kLive || (b.state == kPending && b.exported); };
  for (auto& [base, s] : segments_) {
    if (!s->split) total += s->bytes;
    each_block(s, [&](Block* b) {
      if (s->split && b->state != kHole) total += b->size;
      if (counted_live(*b)) {
        live_bytes += b->size;
        ++live;
      }
    });
  }
  // The counters first, then the events (ring.hpp): the memory went with the context
  // (an upstream that counts what it backs takes its own in the layout's forget below).
  ledger_.lost(live, counts ? total : 0, total - live_bytes);
  for (auto& [base, s] : segments_) {
    // Freed by the driver with the context: a free, as forget_driver_freed counts one.
    each_block(s, [&](Block* b) {
      if (counted_live(*b)) ledger_.forgot(b->ptr, b->requested, now);
    });
    if (counts && bases.size() < bases.capacity()) bases.push_back(base);  // (else the upstream's forget)
    else if (counts) ledger_.forgot_segment(base);
    layout_.dropping_locked(s);
    delete s;
  }
  segments_.clear();
  free_.clear();
  publish_free_locked();
  open_head_ = nullptr;
  open_count_ = 0;
  open_bytes_ = 0;
  map_.rebuild(every_block());
  pending_bytes_.store(0, std::memory_order_relaxed);
  giving_.clear();  // (their segments were among segments_; their events went with the context)
  giving_bytes_ = 0;
  // Keep what a dropped pool holds small (it stays allocated for racing readers).
  map_.shrink();
  mu_.unlock();
  for (uint64_t base : bases) ledger_.forgot_segment(base);
  fence_.forget_batches();  // the context's events went with it
  layout_.forget(*this, total);  // uncharges what the pool held
}

// ---- queries -------------------------------------------------------------------------------

template <class Layout>
bool pool<Layout>::locate(CUdeviceptr p, range* out, bool* live) {
  mu_.lock();
  // A segment being given back holds nothing live, and its addresses may be the driver's
  // again; so may a destroyed context's, where the hooks count a new allocation.
  Segment* s = segment_at_locked(p);
  if (!s || s->leaving || (ctx_going_ && hooks_count(p))) {
    mu_.unlock();
    return false;
  }
  *live = false;
  if (const Block* b = block_at_locked(s, p)) {
    if (b->state == kLive && p - b->ptr < std::max<uint64_t>(b->requested, 1)) {
      *live = true;
      if (out) *out = range{b->ptr, b->requested};
    }
  }
  mu_.unlock();
  return true;
}

template <class Layout>
block_info pool<Layout>::describe_locked(const Block& b) const noexcept {
  const bool in_use = b.state == kLive || (b.state == kPending && b.exported);
  return block_info{b.ptr, b.size, in_use ? b.requested : 0, ordinal_,
                    in_use ? block_info::state::live
                           : b.state == kPending ? block_info::state::pending : block_info::state::free};
}

template <class Layout>
bool pool<Layout>::blocks(std::vector<block_info>& out) {
  // Room first, outside the lock (the hot path's: no allocation while it is held); again
  // should the pool have carved more meanwhile.
  auto carved = [this] {
    size_t n = 0;
    for (const auto& [base, s] : segments_) n += s->carved;
    return n;
  };
  try {
    for (;;) {
      mu_.lock();
      const size_t n = carved();
      mu_.unlock();
      out.reserve(out.size() + n + 64);
      mu_.lock();
      if (carved() > out.capacity() - out.size()) {
        mu_.unlock();
        continue;
      }
      for (const auto& [base, s] : segments_)
        each_block(s, [&](Block* b) {
          if (b->state != kHole) out.push_back(describe_locked(*b));
        });
      mu_.unlock();
      return true;
    }
  } catch (...) {
    return false;
  }
}

template <class Layout>
pool_stats pool<Layout>::stats() {
  pool_stats st;
  uint64_t in_use = 0;
  mu_.lock();
  for (const auto& [base, s] : segments_) {
    if (!s->split) st.reserved += s->bytes;
    each_block(s, [&](Block* b) {
      if (b->state == kHole) return;
      if (s->split) st.reserved += b->size;
      if (describe_locked(*b).status == block_info::state::live) in_use += b->size;
    });
  }
  // The largest request served without the driver (take_locked): a large one (rounded to
  // large_round_) from a free whole block at least that size, or a small one from its class's
  // free list or a slab with room. A whole block made of exactly a request's bytes under a cap
  // may be smaller than kLargeRound, and then serves neither (nothing rounds down to it).
  st.largest_free = free_.largest_size() / large_round_ * large_round_;
  for (int cls = kClasses - 1; cls >= 0; --cls) {
    if (!free_.small_available(cls)) continue;
    st.largest_free = std::max(st.largest_free, class_size(cls));
    break;
  }
  mu_.unlock();
  st.cached = st.reserved - in_use;
  return st;
}

template <class Layout>
CUresult pool<Layout>::ipc_handle(CUipcMemHandle* handle, CUdeviceptr p, ipc_span* pooled) {
  // Another process's work on the block is ordered with none of this one's streams: a block
  // handed out by stream order waits for its old owner's work before it is exported.
  mu_.lock();
  const bool tainted = !dead_ && !ctx_going_ && take_taint();
  mu_.unlock();
  if (tainted) drain_legacy(ctx_);
  mu_.lock();
  Segment* s = segment_at_locked(p);
  if (!s || s->leaving || (ctx_going_ && hooks_count(p))) {  // (as locate)
    mu_.unlock();
    return CUDA_ERROR_NOT_FOUND;
  }
  Block* b = block_at_locked(s, p);
  if (!b || b->state != kLive) {
    mu_.unlock();
    return CUDA_ERROR_INVALID_VALUE;  // freed memory, as the driver answers
  }
  const bool handles = layout_.handles_whole();
  if (!handles || s->cls >= 0) {
    // A layout without legacy handles, or a block packed into a slab with others: no
    // legacy handle names exactly its bytes (backends/ipc.hpp hands out one of ours). An
    // interior pointer exports its block, as the driver exports a whole allocation.
    describe_span_locked(*b, pooled);
    mu_.unlock();
    if (!handles) return CUDA_ERROR_NOT_SUPPORTED;
    // The slab's own handle, which the importer opens: a live block keeps its slab.
    const CUresult r = upstream_->ipc_handle(&pooled->legacy, pooled->base);
    return r == CUDA_SUCCESS ? CUDA_ERROR_NOT_SUPPORTED : r;
  }
  // A whole driver allocation: the handle maps exactly this block. It will not be reused
  // by the pool once freed (see free_exported).
  b->exported = true;
  const CUdeviceptr base = s->base;
  mu_.unlock();
  return upstream_->ipc_handle(handle, base);
}

template <class Layout>
void pool<Layout>::describe_span_locked(const Block& b, ipc_span* out) const noexcept {
  const Segment* s = b.seg;
  *out = ipc_span{};  // a legacy span unless the layout says otherwise
  // A block of a split segment lies in the units that cover it (shared with its neighbours
  // at either end); any other block lies in its segment (a slab, or a whole block).
  out->block = b.ptr;
  out->requested = b.requested;
  out->generation = b.generation;
  if (s->split) {
    out->base = b.ptr / gran_ * gran_;
    out->bytes = (b.ptr + b.size + gran_ - 1) / gran_ * gran_ - out->base;
  } else {
    out->base = s->base;
    out->bytes = s->bytes;
  }
  out->offset = b.ptr - out->base;
  layout_.describe(out);  // its kind, unit and exportability
}

template <class Layout>
CUresult pool<Layout>::ipc_describe(CUdeviceptr p, uint64_t bytes, ipc_span* out) {
  // The pool's lock only (no driver call): the slow path may hold its own across a wait for
  // the GPU, and an importer must not wait for that.
  mu_.lock();
  Block* b = dead_ ? nullptr : map_.find(p);
  if (!b || b->state != kLive || b->requested != bytes) {
    mu_.unlock();
    return CUDA_ERROR_INVALID_HANDLE;  // freed since it was exported
  }
  describe_span_locked(*b, out);
  mu_.unlock();
  return CUDA_SUCCESS;
}

}  // namespace cuw::backends::pool

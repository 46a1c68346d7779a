// cuwarden interposer: the vmm layout's arena (granule_arena.hpp has the design): how a
// pool over granules grows: a slab from a new range, a large block by extending a free
// block of the arena into the unmapped addresses around it, or at the top; past the budget,
// or when the cap or the device refuses, from granules unmapped out of free blocks
// (stitching). And the spare Block objects a hit's split takes without allocating.
#include <algorithm>
#include <mutex>
#include <new>
#include <vector>

#include "backends/vmm/granule_arena.hpp"
#include "backends/pool/pool.hpp"
#include "backends/pool/tuning.hpp"
#include "backends/vmm/granules.hpp"
#include "base/work_epoch.hpp"
#include "core/room.hpp"
#include "core/tracker.hpp"

namespace cuw::backends {

using namespace pool::tuning;  // the pool's tuning and size classes
using pool::Block;
using pool::Segment;
using pool::kFree;
using pool::kHole;
using pool::kClaimed;

// The vmm layout's growth: a new range from idle granules (the ones free blocks gave back)
// before new ones, and past the budget, or when the cap or the device refuses, stitched
// from free blocks unmapped for it (reclaim_slow).
CUresult granule_arena::grow_arena_slow(pool_type& p, CUdeviceptr* out, uint64_t bytes, int cls, uint64_t rounded,
                                        bool last, bool* cap_refused) {
  const uint64_t seg_bytes = cls >= 0 ? p.slab_bytes_ : rounded;
  // Nothing is unmapped during a capture: the unmap would not wait for the captured work.
  const bool capture = work::capturing();
  if (cls >= 0 && !capture && p.over_budget(seg_bytes)) {  // (large: extend_arena, which knows what it needs)
    // Pending frees first (as long as cudaFree's own synchronization would have taken):
    // stitching uses free memory only.
    stitching_ = true;
    p.wait_all_slow();
    p.reclaim_slow(seg_bytes);
    stitching_ = false;
  }
  bool by_cap = false;
  auto attempt = [&](bool quiet) -> CUresult {
    if (cls < 0) return extend_arena(p, out, bytes, rounded, quiet, &by_cap);
    CUdeviceptr base = 0;
    const CUresult e = granules_->map_range(&base, seg_bytes, quiet, &by_cap);
    if (e == CUDA_SUCCESS) p.add_segment(out, base, seg_bytes, bytes, cls);
    return e;
  };
  CUresult r = attempt(true);
  if (r == CUDA_ERROR_OUT_OF_MEMORY) {
    if (!capture) {  // (during a capture nothing is waited for or unmapped: the second try counts)
      pool_type::needing n(p);  // a refusal otherwise: what waits behind marks goes back now
      p.wait_all_slow();
      p.reclaim_slow(~uint64_t{0});
    }
    by_cap = false;
    r = attempt(!last);
  }
  if (!capture) granules_->trim(0);  // idle granules serve nothing until mapped: the budget keeps none
  if (r != CUDA_SUCCESS) {
    if (r == CUDA_ERROR_OUT_OF_MEMORY && !last && cap_refused) {
      *cap_refused = true;  // other contexts' pools give back theirs; the caller tries once more
      return r;
    }
    if (!by_cap) {  // the driver's answer (a cap's refusal was counted by the charge)
      const uint64_t now = core::now_ns();
      std::lock_guard<spin_lock> lk(p.mu_);
      p.ledger_.driver_error(seg_bytes, r, now);
      if (r == CUDA_ERROR_OUT_OF_MEMORY) core::note_driver_oom(p.ordinal(), bytes, true);  // after reclaim_slow()
    }
    return r;
  }
  return CUDA_SUCCESS;
}

// Large blocks live in one arena of addresses (twice the device's memory), mapped from the
// bottom up to `top`. A miss grows the free block that needs the fewest new granules to
// fit: into the unmapped addresses right above or below it (a hole left by stitching, or the
// top), so that an array grown step by step maps only its growth, and blocks freed next to
// each other merge. Past the budget, the granules come from free blocks unmapped for it
// (reclaim_slow). Without a free block to grow, a new block goes at the top. Growth comes in
// whole granules: what the request leaves of them stays free, where the next block packs.
CUresult granule_arena::extend_arena(pool_type& p, CUdeviceptr* out, uint64_t bytes, uint64_t rounded, bool quiet,
                                     bool* by_cap) {
  const uint64_t gran = unit_;
  if (rounded > ~uint64_t{0} - gran) return CUDA_ERROR_OUT_OF_MEMORY;  // no granules hold it
  auto whole = [gran](uint64_t n) { return (n + gran - 1) / gran * gran; };
  // Room to grow `f` (a free block of the arena, or nullptr: a new block at the top).
  auto room = [this](Segment* a, Block* f, uint64_t* above, uint64_t* below) {
    *above = *below = 0;
    Block* h = f ? f->hi : nullptr;
    if (f && h && h->state == kHole) *above = h->size;
    if (!f || !h || (h->state == kHole && h == a->last)) *above += a->bytes - a->top;
    if (f && f->lo && f->lo->state == kHole)
      *below = f->lo == &a->blocks[0] ? f->lo->size - std::min(f->lo->size, unit_) : f->lo->size;
  };
  const bool uncapped = p.tracker_.uncapped(p.slot_, p.ordinal_);
  p.mu_.lock();
  Segment* a = arena_;
  Block* f = nullptr;
  uint64_t need = whole(rounded);  // new granules: rooms (holes, the top) are whole granules
  if (a) {
    for (Block* b = &a->blocks[0]; b; b = b->hi) {
      if (b->state != kFree) continue;
      const uint64_t more = whole(rounded - std::min(rounded, b->size));
      // As few as a new block at the top: the free block ending there packs it. Under a cap,
      // not a request of whole granules: on granules of its own at the top, it leaves its
      // neighbours' granules whole for when they are freed (a stranded piece could turn into
      // a refusal); without one, packing holds less.
      if (more > need || (more == need && (f || b != a->last || (rounded % gran == 0 && !uncapped)))) continue;
      uint64_t up, down;
      room(a, b, &up, &down);
      if (b->size + up + down >= rounded) {
        f = b;
        need = more;
      }
    }
    if (!f) {
      uint64_t up, down;
      room(a, nullptr, &up, &down);
      if (up < need) a = nullptr;  // this arena's addresses are spent: a new one
    }
  }
  if (f) {
    p.unlink_free_locked(f);
    f->state = kClaimed;  // neither taken, merged, unmapped nor freed meanwhile
  }
  if (f && need == 0) {
    // Large enough already (a hit that found no spare Block to split with).
    if (f->size > rounded && !spares_.empty()) split_locked(p, f, rounded);
    p.hand_out_locked(f, bytes);
    p.ledger_.handed_out(f->size, false);
    *out = f->ptr;
    p.mu_.unlock();
    return CUDA_SUCCESS;
  }
  p.mu_.unlock();
  // No hoarding: past the budget, the granules for this come from free blocks (stitching).
  if (!work::capturing() && p.over_budget(need)) {
    stitching_ = true;
    p.wait_all_slow();
    p.reclaim_slow(need);
    stitching_ = false;
    // Reclaiming may have given back an arena left with nothing mapped (never f's: f is
    // claimed): choose the top again.
    if (!f) {
      p.mu_.lock();
      a = arena_;
      if (a) {
        uint64_t up, down;
        room(a, nullptr, &up, &down);
        if (up < need) a = nullptr;
      }
      p.mu_.unlock();
    }
  }
  if (!a) {
    // A new arena: the first, or this one's addresses are spent.
    const uint64_t span = std::max(need, whole(2 * granules_->device_bytes()));
    CUdeviceptr base = 0;
    CUresult r = granules_->reserve(&base, span, gran);  // (blocks and holes align to gran in addresses)
    if (r == CUDA_SUCCESS) r = granules_->map_at(base, need, quiet, by_cap);
    if (r != CUDA_SUCCESS) {
      if (base) p.upstream_->deallocate(base, span);
      return r;
    }
    p.add_segment(out, base, span, bytes, -1, need, rounded);
    return CUDA_SUCCESS;
  }
  // Where the new granules go: above first (the block keeps its address), then below.
  p.mu_.lock();
  uint64_t above, below;
  room(a, f, &above, &below);
  const uint64_t up = std::min(need, above);
  const uint64_t down = need - up;  // <= below: rooms only grew since the choice
  const CUdeviceptr up_at = f ? f->ptr + f->size : a->base + a->top;
  const CUdeviceptr down_at = f ? f->ptr - down : 0;
  // A new block's Block, taken now: hot-path splits may use up the spares meanwhile.
  Block* fresh = nullptr;
  if (!f && !spares_.empty()) {
    fresh = spares_.back();
    spares_.pop_back();
  }
  p.mu_.unlock();
  auto unclaim = [&] {
    p.mu_.lock();
    if (f) p.push_free_locked(f);
    if (fresh) spares_.push_back(fresh);  // back where it came from: within capacity
    p.mu_.unlock();
  };
  if ((!f && !fresh) || down > below) {
    unclaim();
    return CUDA_ERROR_OUT_OF_MEMORY;  // out of host memory for a Block, or rooms shrank (never)
  }
  CUresult r = up ? granules_->map_at(up_at, up, quiet, by_cap) : CUDA_SUCCESS;
  if (r == CUDA_SUCCESS && down) {
    r = granules_->map_at(down_at, down, quiet, by_cap);
    if (r != CUDA_SUCCESS && up) granules_->punch(up_at, up);
  }
  if (r != CUDA_SUCCESS) {
    unclaim();
    return r;
  }
  p.mu_.lock();
  Block* b = f;
  if (!b) {
    b = fresh;
    *b = Block{};
    b->ptr = up_at;
    b->seg = a;
    b->lo = a->last;
    if (a->last) a->last->hi = b;
    a->last = b;
    ++a->carved;
    p.map_insert_locked(b);
  }
  if (up) {
    Block* h = f ? f->hi : nullptr;
    uint64_t from_hole = 0;
    if (h && h->state == kHole) {
      from_hole = std::min(up, h->size);
      p.map_.erase(h->ptr);
      h->ptr += from_hole;
      h->size -= from_hole;
      if (h->size > 0) {
        p.map_insert_locked(h);
      } else {
        b->hi = h->hi;
        if (h->hi) h->hi->lo = b;
        if (a->last == h) a->last = b;
        --a->carved;
        spares_.push_back(h);
      }
    }
    a->top += up - from_hole;  // the rest came from above the top
    b->size += up;
  }
  if (down) {
    Block* l = b->lo;  // a hole (room() said so), never consumed whole if it heads the list
    l->size -= down;
    if (l->size == 0) {
      b->lo = l->lo;
      if (l->lo) l->lo->hi = b;
      p.map_.erase(l->ptr);
      --a->carved;
      spares_.push_back(l);
    }
    p.map_.erase(b->ptr);
    b->ptr -= down;
    b->size += down;
    p.map_insert_locked(b);
  }
  if (b->size > rounded && !spares_.empty()) split_locked(p, b, rounded);  // the rest stays free
  p.hand_out_locked(b, bytes);
  p.ledger_.handed_out(b->size, false);
  *out = b->ptr;
  p.mu_.unlock();
  return CUDA_SUCCESS;
}

// The arena part of reclaim_slow (which checked that nothing forbids it).
uint64_t granule_arena::reclaim_arena_slow(pool_type& p, uint64_t want) {
  // The whole granules inside free large blocks, smallest blocks first (the pieces least
  // likely to serve a request), the last one cut to what is still wanted; then fully free
  // slabs; then ranges left with nothing mapped. Only free blocks: their freeing work has
  // completed, and the unmap does not wait. The pieces of granules a free block shares with
  // its neighbours stay free (they are mapped as long as the neighbours are).
  //
  // A free block may have been handed out by stream order, its old owner's work still queued
  // (fence.hpp): blocks are unmapped only once events recorded now have completed (polled;
  // waited for when a refusal or stitching needs the granules now: the budget forbids new
  // ones), and only while no block was handed out that way since (a later one's old owner may
  // follow the events). Else none is unmapped this time (the idle trim looks again later);
  // the segments below go back behind their own events.
  const uint64_t gran = unit_;
  uint64_t idle = granules_->idle_bytes();
  const uint64_t start = idle;
  p.give_pending_slow(false);
  pool_type::giving g;
  const bool settled = p.settle_slow(&g, p.need_now_ || stitching_);
  if (!settled && !g.mark.events.empty()) p.giving_.push_back(std::move(g));  // settles the taint once done
  while (settled && idle < want) {
    // Three blocks may come of one: its low piece, the hole, its high piece.
    if (!refill_spares_slow(p)) break;
    p.mu_.lock();
    Block* b = p.taints_ == g.taints ? p.free_.find_with_whole() : nullptr;
    if (!b || spares_.size() < 2) {
      p.mu_.unlock();
      break;
    }
    const uint64_t lo = (b->ptr + gran - 1) / gran * gran;  // the granules inside b
    const uint64_t hi = lo + p.free_.whole(*b);
    p.unlink_free_locked(b);
    Block* low = nullptr;
    if (lo > b->ptr) {
      split_locked(p, b, lo - b->ptr);  // (the rest, b->hi, is pushed free: taken back below)
      low = b;
      b = b->hi;
      p.unlink_free_locked(b);
    }
    uint64_t cut = hi - lo;
    if (want != ~uint64_t{0}) cut = std::min(cut, (want - idle + gran - 1) / gran * gran);
    if (cut < b->size) split_locked(p, b, cut);  // the high piece stays free
    b->state = kHole;  // claimed: neither taken nor merged while it is unmapped
    if (low) p.push_free_locked(low);  // (its neighbours: a block that was not free, and the hole)
    p.mu_.unlock();
    const uint64_t size = b->size;
    const CUresult r = granules_->punch(b->ptr, size);
    p.mu_.lock();
    if (r != CUDA_SUCCESS) {
      p.push_free_locked(b);
      p.mu_.unlock();
      break;
    }
    if (Block* h = b->hi; h && h->state == kHole) absorb_locked(p, b, h);
    if (Block* l = b->lo; l && l->state == kHole) {
      absorb_locked(p, l, b);
      b = l;
    }
    // A hole at the top of the arena gives its addresses back to the top (growth maps there).
    if (Segment* s = b->seg; s->split && b == s->last && b != &s->blocks[0]) {
      s->last = b->lo;
      s->last->hi = nullptr;
      s->top -= b->size;
      p.map_.erase(b->ptr);
      --s->carved;
      spares_.push_back(b);
    }
    p.mu_.unlock();
    idle += size;
  }
  if (idle < want) p.release_slow(want - idle, pool_type::Which::slabs);
  p.release_slow(~uint64_t{0}, pool_type::Which::holes);
  return granules_->idle_bytes() - std::min(start, granules_->idle_bytes());
}

bool granule_arena::refill_spares_slow(pool_type& p) {
  p.mu_.lock();
  const size_t have = spares_.size();
  p.mu_.unlock();
  if (have >= kSpareBlocks) return true;
  Block* fresh[kSpareBlocks * 2];
  size_t n = 0;
  for (; n < std::size(fresh); ++n)
    if (!(fresh[n] = new (std::nothrow) Block)) break;
  std::vector<Block*> room;
  try {
    p.mu_.lock();
    const size_t want = (heap_blocks_ + n) * 2;
    const size_t cap = spares_.capacity();
    p.mu_.unlock();
    // A vector with room for every block this pool owns (absorb_locked pushes without
    // allocating), made outside the lock.
    if (cap < heap_blocks_ + n) room.reserve(want);
  } catch (...) {
    for (size_t i = 0; i < n; ++i) delete fresh[i];
    return false;
  }
  p.mu_.lock();
  if (room.capacity() > spares_.capacity()) {
    room.assign(spares_.begin(), spares_.end());  // within capacity: no allocation
    spares_.swap(room);
  }
  const size_t fit = std::min(n, spares_.capacity() - heap_blocks_);
  for (size_t i = 0; i < fit; ++i) spares_.push_back(fresh[i]);
  heap_blocks_ += fit;
  p.mu_.unlock();
  for (size_t i = fit; i < n; ++i) delete fresh[i];
  return true;
}

}  // namespace cuw::backends

// cuwarden interposer: the `vmm` backend (granule_arena.hpp): its pools, the split segment's
// split and merge, its steps on the hot and release paths (the growth is arena.cpp's), and
// the pool's and the backend's members for this layout.
#include "backends/vmm/granule_arena.hpp"

#include <algorithm>
#include <atomic>
#include <memory>

#include "backends/memory_resource.hpp"
#include "backends/pool/pool_impl.hpp"
#include "backends/pool/pooled_backend_impl.hpp"
#include "backends/vmm/granules.hpp"
#include "base/log.hpp"
#include "base/work_epoch.hpp"
#include "core/tracker.hpp"

namespace cuw::backends {

granule_arena::pool_type* granule_arena::make(CUcontext ctx, CUdevice dev, ring::DeviceSlot& slot, core::Tracker& t,
                                              pool::owner<granule_arena>& o, const std::vector<CUdevice>& peers) {
  auto granules = std::make_unique<granule_resource>(ctx, dev, slot, t);
  if (!granules->supported()) {
    static std::atomic<bool> said{false};
    if (!said.exchange(true))
      log::always("cuwarden: CUWARDEN_POOL=vmm: device %d (or its driver) has no virtual memory management; "
                  "its pool keeps whole driver allocations, as CUWARDEN_POOL=cache does",
                  static_cast<int>(dev));
    return new pool_type(std::make_unique<driver_resource>(&t, dev), granule_arena(nullptr), ctx, dev, slot, t, o);
  }
  granule_resource* gr = granules.get();
  auto* p = new pool_type(std::move(granules), granule_arena(gr), ctx, dev, slot, t, o);
  for (CUdevice peer : peers) gr->grant_peer(peer);  // peers enabled before this pool existed
  return p;
}

void granule_arena::grant_peer(pool_type& p, CUdevice peer) {
  if (granule_resource* g = p.layout().granules_) g->grant_peer(peer);
}

granule_arena::granule_arena(granule_resource* granules) noexcept
    : granules_(granules),
      unit_(granules ? std::max(pool::kLargeRound, granules->granularity()) : whole_blocks::unit()),
      slab_bytes_(granules ? std::max(pool::kSlabBytes, granules->granularity()) : whole_blocks::slab_bytes()) {}

granule_arena::~granule_arena() {
  for (pool::Block* b : spares_) delete b;
}

// ---- split segments (under the pool's lock) ------------------------------------------------

void granule_arena::split_locked(pool_type& p, pool::Block* b, uint64_t bytes) noexcept {
  pool::Block* r = spares_.back();
  spares_.pop_back();
  *r = pool::Block{};
  r->ptr = b->ptr + bytes;
  r->size = b->size - bytes;
  r->seg = b->seg;
  r->lo = b;
  r->hi = b->hi;
  if (b->hi) b->hi->lo = r;
  b->hi = r;
  if (b->seg->last == b) b->seg->last = r;
  b->size = bytes;
  b->state = pool::kLive;  // taken: the rest must not merge back into it
  ++b->seg->carved;
  p.map_insert_locked(r);
  p.push_free_locked(r);
}

void granule_arena::absorb_locked(pool_type& p, pool::Block* a, pool::Block* h) noexcept {
  a->size += h->size;
  a->hi = h->hi;
  if (h->hi) h->hi->lo = a;
  if (a->seg->last == h) a->seg->last = a;
  p.map_.erase(h->ptr);
  --a->seg->carved;
  spares_.push_back(h);  // room reserved by refill_spares_slow: no allocation
}

pool::Block* granule_arena::merge_locked(pool_type& p, pool::Block* b) noexcept {
  if (pool::Block* h = b->hi; h && h->state == pool::kFree) {
    p.unlink_free_locked(h);
    absorb_locked(p, b, h);
  }
  if (pool::Block* l = b->lo; l && l->state == pool::kFree) {
    p.unlink_free_locked(l);
    absorb_locked(p, l, b);
    b = l;
  }
  return b;
}

void granule_arena::added_locked(pool_type& p, pool::Segment* s, pool::Block* first, uint64_t take) noexcept {
  if (!s->split) return;
  arena_ = s;
  if (take && take < first->size && !spares_.empty()) split_locked(p, first, take);  // the rest stays free
}

void granule_arena::dropping_locked(pool::Segment* s) noexcept {
  if (s == arena_) arena_ = nullptr;
  if (s->split)
    for (pool::Block* b = s->blocks[0].hi; b; b = b->hi) spares_.push_back(b);  // room: see refill_spares_slow
}

// ---- the hot path (under the pool's lock) ------------------------------------------------

CUW_HOT pool::Block* granule_arena::take_large_locked(pool_type& p, uint64_t rounded) noexcept {
  if (!granules_) return p.take_whole_locked(rounded);
  pool::Block* b = p.free_.take_best(rounded, !spares_.empty());  // (no spare: the slow path refills)
  if (!b) return nullptr;
  // A request of whole granules starts on a granule where the block leaves room: its
  // neighbours then share none of its granules, and its own come back whole when it is freed.
  const uint64_t gran = unit_;
  if (rounded % gran == 0 && b->ptr % gran && b->size - rounded >= gran - b->ptr % gran &&
      spares_.size() >= 2) {
    split_locked(p, b, gran - b->ptr % gran);  // b: the head, the rest pushed free
    pool::Block* rest = b->hi;
    p.unlink_free_locked(rest);
    rest->state = pool::kLive;  // taken: the head must not merge it back
    p.push_free_locked(b);      // the head stays free
    b = rest;
  }
  if (b->size > rounded) split_locked(p, b, rounded);  // (pushes the rest: publishes)
  else p.publish_free_locked();
  return b;
}

// ---- the slow path (under the pool's slow_) -----------------------------------------------

CUresult granule_arena::grow_slow(pool_type& p, CUdeviceptr* out, uint64_t bytes, int cls, uint64_t rounded,
                                  bool last, bool* cap_refused) {
  if (!granules_) return p.grow_whole_slow(out, bytes, cls, rounded, last, cap_refused);
  return grow_arena_slow(p, out, bytes, cls, rounded, last, cap_refused);
}

uint64_t granule_arena::reclaim_slow(pool_type& p, uint64_t want) {
  return granules_ ? reclaim_arena_slow(p, want) : p.release_slow(want);
}

void granule_arena::trim_slow(pool_type& p, uint64_t want) {
  if (!granules_) {
    p.release_slow(want);
    return;
  }
  p.reclaim_slow(want);
  granules_->trim(0);  // idle granules serve nothing until mapped: the budget keeps none
}

uint64_t granule_arena::release_slow(pool_type& p) {
  if (!granules_) return p.release_slow();
  if (work::capturing()) return 0;  // nothing unmapped or released during a capture
  p.reclaim_slow(~uint64_t{0});
  return granules_->trim(0);
}

void granule_arena::forget(pool_type& p, uint64_t bytes) noexcept {
  if (granules_) granules_->forget();  // uncharges what it held
  else p.tracker_.uncharge(p.slot_, bytes);
}

void granule_arena::describe(ipc_span* out) const noexcept {
  if (!granules_) return;  // whole driver allocations: a legacy span
  out->how = ipc_span::kind::granules;
  out->granule_bytes = granules_->granularity();
  out->exportable = granules_->exportable();
}

template class pool::pool<granule_arena>;
template class pooled_backend<granule_arena>;

}  // namespace cuw::backends

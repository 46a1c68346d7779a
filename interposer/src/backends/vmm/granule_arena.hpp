// cuwarden interposer: the `vmm` backend's layout (CUWARDEN_POOL=vmm): each pool keeps an
// arena of addresses with granules mapped where its blocks need them (granules.hpp). A
// device without virtual memory management gets a pool of whole driver allocations
// instead, as CUWARDEN_POOL=cache does (every step then is whole_blocks').
//
// The pool (pool.hpp) over physical granules. Slabs are one granule each. Large requests
// are rounded to 512 bytes (not to granules: neighbours share the granule between them, so a block of 9 MiB + 1 byte
// holds 9 MiB + 512 bytes, not 10 MiB) and live in one arena of addresses (a Segment with split
// blocks, mapped from its base up to `top`): served from any free large block at least that
// size, split, the rest staying free (best fit); a freed block merges with its free
// neighbours. A miss grows the free block that needs the fewest new granules into the
// unmapped addresses above or below it (extend_arena), else adds a block at the top. A large
// block is a stretch of the arena, so pointer queries answer from the pool and IPC handles
// cannot name it. Past the budget, or when the cap or the device refuses, the whole granules
// inside free blocks are unmapped, smallest blocks first (holes: kHole blocks, granule-aligned;
// a hole at the top lowers it; the pieces of granules a free block shares with a neighbour
// stay mapped and free) and mapped where the new block goes: stitching, the slow path (on
// the H200 about 28 ms per GiB unmapped and mapped again, against 1.5 ms for cuMemFree and
// cuMemAlloc).
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "backends/cache/whole_blocks.hpp"
#include "backends/pool/pool.hpp"
#include "backends/pool/pooled_backend.hpp"
#include "core/config.hpp"
#include "cuw/ring.hpp"

namespace cuw::backends {

class granule_resource;

/// The layout of pool::pool<granule_arena> and pooled_backend<granule_arena> (pool.hpp and
/// pooled_backend.hpp list what a layout provides). One per pool, its state under the
/// pool's locks (the arena under mu_ and slow_, the Block count under slow_).
class granule_arena {
 public:
  using pool_type = pool::pool<granule_arena>;
  /// Large requests round to this: neighbours share granules.
  static constexpr uint64_t kFineRound = 512;

  // ---- the backend's --------------------------------------------------------------------
  static constexpr core::PoolKind kind = core::PoolKind::vmm;
  /// cuCtxEnablePeerAccess does not cover mapped memory: a peer's access is granted per range.
  static constexpr bool kGrantsPeers = true;
  /// The pool of context `ctx` on device `dev`, over granules, with `peers` (devices given
  /// access to `dev` before the pool existed) granted access. Throws std::bad_alloc when out
  /// of memory.
  static pool_type* make(CUcontext ctx, CUdevice dev, ring::DeviceSlot& slot, core::Tracker& t,
                         pool::owner<granule_arena>& o, const std::vector<CUdevice>& peers);
  /// Give device `peer` access to every range of `p`, present and future.
  static void grant_peer(pool_type& p, CUdevice peer);

  /// `granules`: the pool's upstream (the pool owns it), or nullptr: the device has no
  /// virtual memory management, and the pool keeps whole driver allocations.
  explicit granule_arena(granule_resource* granules) noexcept;
  granule_arena(granule_arena&&) noexcept = default;  // (into its pool, before any Block is made)
  granule_arena(const granule_arena&) = delete;
  granule_arena& operator=(const granule_arena&) = delete;
  /// Deletes the spare Blocks (the pool's destructor gave back those of its segments).
  ~granule_arena();

  // ---- the pool's steps (pool.hpp) ------------------------------------------------------
  uint64_t large_round() const noexcept { return granules_ ? kFineRound : whole_blocks::large_round(); }
  uint64_t unit() const noexcept { return unit_; }
  uint64_t slab_bytes() const noexcept { return slab_bytes_; }
  /// The granules count what they map reserved and cached (granules.hpp).
  bool counts_upstream() const noexcept { return !granules_; }
  bool splits() const noexcept { return granules_ != nullptr; }
  /// A freed block merged with its free neighbours (never across a live, pending or
  /// unmapped one); the block to push free.
  pool::Block* merge_locked(pool_type& p, pool::Block* b) noexcept;
  /// A large block is a stretch of the arena: no legacy handle names it.
  bool handles_whole() const noexcept { return !granules_; }
  /// Best fit over every free large block, split to the request.
  pool::Block* take_large_locked(pool_type& p, uint64_t rounded) noexcept;
  /// The whole granules in free large blocks, which stitching serves together (a little
  /// less than the most when one block's own ends would add to it).
  uint64_t served_locked(const pool::free_blocks& f) const noexcept {
    return granules_ ? f.whole_bytes() : f.largest();
  }
  /// Any large block may merge with its neighbours into a fit.
  bool may_serve(const pool::Block& b, uint64_t rounded) const noexcept {
    return granules_ || whole_blocks::may_serve(b, rounded);
  }
  /// Enough spare Blocks that a hit can split.
  void prepare_slow(pool_type& p) {
    if (granules_) refill_spares_slow(p);
  }
  /// A new range for a slab, a large block grown in the arena; stitching past the budget.
  CUresult grow_slow(pool_type& p, CUdeviceptr* out, uint64_t bytes, int cls, uint64_t rounded, bool last,
                     bool* cap_refused);
  /// Unmap the whole granules inside free blocks until `want` bytes of granules are idle,
  /// then free slabs and ranges with nothing mapped; the bytes made idle.
  uint64_t reclaim_slow(pool_type& p, uint64_t want);
  /// reclaim_slow, then the idle granules go back to the driver.
  void trim_slow(pool_type& p, uint64_t want);
  uint64_t release_slow(pool_type& p);
  /// A new range of the arena: where large blocks grow from now on; its first block cut to
  /// `take` bytes (when given), the rest staying free.
  void added_locked(pool_type& p, pool::Segment* s, pool::Block* first, uint64_t take) noexcept;
  /// The Blocks of a range given back or forgotten become spares (room for them is kept:
  /// no allocation).
  void dropping_locked(pool::Segment* s) noexcept;
  /// Forget the granules (the driver freed them with the context) and uncharge them.
  void forget(pool_type& p, uint64_t bytes) noexcept;
  /// Granules (their size, whether exportable as file descriptors).
  void describe(ipc_span* out) const noexcept;

 private:
  /// Spare Block objects kept for splits, at least this many before a miss's attempts.
  static constexpr size_t kSpareBlocks = 32;

  /// Cut `b` (free, of a split segment) to `bytes`; the rest becomes a free block (a spare).
  void split_locked(pool_type& p, pool::Block* b, uint64_t bytes) noexcept;
  /// `a` takes over its higher neighbour `h` (a free or hole pair), which becomes a spare.
  void absorb_locked(pool_type& p, pool::Block* a, pool::Block* h) noexcept;

  // The arena's slow path (arena.cpp).
  CUresult grow_arena_slow(pool_type& p, CUdeviceptr* out, uint64_t bytes, int cls, uint64_t rounded, bool last,
                           bool* cap_refused);
  /// A large block of `rounded` bytes grown in the arena (the free block that needs the
  /// fewest new granules extended, or a new one at the top), or the first of a new arena;
  /// handed out (*out).
  CUresult extend_arena(pool_type& p, CUdeviceptr* out, uint64_t bytes, uint64_t rounded, bool quiet, bool* by_cap);
  uint64_t reclaim_arena_slow(pool_type& p, uint64_t want);
  /// Enough spare Block objects that a hit can split (allocates outside mu_).
  bool refill_spares_slow(pool_type& p);

  granule_resource* granules_;  ///< the pool's upstream, or nullptr (whole driver allocations)
  uint64_t unit_;               ///< what is mapped and unmapped at once (the granularity)
  uint64_t slab_bytes_;         ///< a slab: one granule
  pool::Segment* arena_ = nullptr;  ///< where large blocks grow (under mu_)
  std::vector<pool::Block*> spares_;  ///< for splits (under mu_; filled under slow_), with room
                                      ///< for every Block allocated (absorb pushes without allocating)
  size_t heap_blocks_ = 0;          ///< Blocks allocated one by one, spare or in use (under slow_)
  /// Stitching past the budget (under slow_): the granules are needed now, so the unmap waits
  /// for blocks reused by stream order rather than leave them mapped and create new ones.
  bool stitching_ = false;
};

extern template class pool::pool<granule_arena>;
extern template class pooled_backend<granule_arena>;

}  // namespace cuw::backends

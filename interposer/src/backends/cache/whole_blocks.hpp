// cuwarden interposer: the `cache` backend's layout (CUWARDEN_POOL=cache): each pool keeps
// whole driver allocations (driver_resource), a large block one allocation and a slab one
// more (pool.hpp, "Layout of what it keeps").
#pragma once

#include <cuda.h>

#include <cstdint>
#include <vector>

#include "backends/pool/pool.hpp"
#include "backends/pool/pooled_backend.hpp"
#include "backends/pool/tuning.hpp"
#include "core/config.hpp"
#include "cuw/ring.hpp"

namespace cuw::backends {

/// The layout of pool::pool<whole_blocks> and pooled_backend<whole_blocks> (pool.hpp and
/// pooled_backend.hpp list what a layout provides). Stateless: every step is static, those
/// that need the pool's parts defined in whole_blocks.cpp, which instantiates the pool.
struct whole_blocks {
  using pool_type = pool::pool<whole_blocks>;

  // ---- the backend's --------------------------------------------------------------------
  static constexpr core::PoolKind kind = core::PoolKind::cache;
  /// Driver allocations are mapped for a peer by the driver itself: nothing to grant.
  static constexpr bool kGrantsPeers = false;
  /// The pool of context `ctx` on device `dev`, over driver allocations. Throws
  /// std::bad_alloc when out of memory.
  static pool_type* make(CUcontext ctx, CUdevice dev, ring::DeviceSlot& slot, core::Tracker& t,
                         pool::owner<whole_blocks>& o, const std::vector<CUdevice>& peers);
  static void grant_peer(pool_type&, CUdevice) noexcept {}

  // ---- the pool's steps -----------------------------------------------------------------
  static constexpr uint64_t large_round() noexcept { return pool::kLargeRound; }
  static constexpr uint64_t unit() noexcept { return pool::kLargeRound; }
  static constexpr uint64_t slab_bytes() noexcept { return pool::kSlabBytes; }
  /// Each driver allocation is counted reserved (and cached while free) by the pool.
  static constexpr bool counts_upstream() noexcept { return true; }
  static constexpr bool splits() noexcept { return false; }
  static pool::Block* merge_locked(pool_type&, pool::Block* b) noexcept { return b; }  // (never called)
  /// A large block is one driver allocation: its legacy handle names it exactly.
  static constexpr bool handles_whole() noexcept { return true; }
  /// Best fit within the slack (pool::take_whole_locked).
  static pool::Block* take_large_locked(pool_type& p, uint64_t rounded) noexcept;
  /// Blocks are not stitched: the largest serves the largest request.
  static uint64_t served_locked(const pool::free_blocks& f) noexcept { return f.largest(); }
  /// A pending block serves a request it fits within the slack.
  static bool may_serve(const pool::Block& b, uint64_t rounded) noexcept {
    return b.size >= rounded && b.size - rounded <= pool::tuning::large_slack(rounded);
  }
  static void prepare_slow(pool_type&) noexcept {}
  /// A new driver allocation (pool::grow_whole_slow).
  static CUresult grow_slow(pool_type& p, CUdeviceptr* out, uint64_t bytes, int cls, uint64_t rounded, bool last,
                            bool* cap_refused);
  /// Free driver allocations go back to the driver, until `want` bytes.
  static uint64_t reclaim_slow(pool_type& p, uint64_t want);
  static void trim_slow(pool_type& p, uint64_t want) { reclaim_slow(p, want); }
  static uint64_t release_slow(pool_type& p);
  static void added_locked(pool_type&, pool::Segment*, pool::Block*, uint64_t) noexcept {}
  static void dropping_locked(pool::Segment*) noexcept {}
  /// The driver freed the context's allocations: uncharge them.
  static void forget(pool_type& p, uint64_t bytes) noexcept;
  /// A legacy span (the pool's default).
  static void describe(ipc_span*) noexcept {}
};

extern template class pool::pool<whole_blocks>;
extern template class pooled_backend<whole_blocks>;

}  // namespace cuw::backends

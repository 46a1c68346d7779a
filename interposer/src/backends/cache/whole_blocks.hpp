// cuwarden interposer: the `cache` backend's layout (CUWARDEN_POOL=cache): each pool keeps
// whole driver allocations (driver_resource), a large block one allocation and a slab one
// more (pool.hpp, "Layout of what it keeps").
#pragma once

#include <cuda.h>

#include <vector>

#include "backends/pool/pool.hpp"
#include "backends/pool/pooled_backend.hpp"
#include "core/config.hpp"
#include "cuw/ring.hpp"

namespace cuw::backends {

/// The layout of pooled_backend<whole_blocks> (pooled_backend.hpp lists what a layout
/// provides). Stateless.
struct whole_blocks {
  static constexpr core::PoolKind kind = core::PoolKind::cache;
  /// Driver allocations are mapped for a peer by the driver itself: nothing to grant.
  static constexpr bool kGrantsPeers = false;
  /// The pool of context `ctx` on device `dev`, over driver allocations. Throws
  /// std::bad_alloc when out of memory.
  static pool::pool* make(CUcontext ctx, CUdevice dev, ring::DeviceSlot& slot, core::Tracker& t, pool::owner& o,
                          const std::vector<CUdevice>& peers);
  static void grant_peer(pool::pool&, CUdevice) noexcept {}
};

extern template class pooled_backend<whole_blocks>;

}  // namespace cuw::backends

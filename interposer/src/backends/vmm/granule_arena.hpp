// cuwarden interposer: the `vmm` backend's layout (CUWARDEN_POOL=vmm): each pool keeps an
// arena of addresses with granules mapped where its blocks need them (granules.hpp; pool.hpp,
// "The vmm layout"). A device without virtual memory management gets a pool of whole driver
// allocations instead, as CUWARDEN_POOL=cache does.
#pragma once

#include <cuda.h>

#include <vector>

#include "backends/pool/pool.hpp"
#include "backends/pool/pooled_backend.hpp"
#include "core/config.hpp"
#include "cuw/ring.hpp"

namespace cuw::backends::pool {
/// The vmm layout's slow path for its pools (vmm/arena.cpp). Thread-safe (stateless).
arena_ops& arena_calls() noexcept;
}  // namespace cuw::backends::pool

namespace cuw::backends {

/// The layout of pooled_backend<granule_arena> (pooled_backend.hpp lists what a layout
/// provides). Stateless.
struct granule_arena {
  static constexpr core::PoolKind kind = core::PoolKind::vmm;
  /// cuCtxEnablePeerAccess does not cover mapped memory: a peer's access is granted per range.
  static constexpr bool kGrantsPeers = true;
  /// The pool of context `ctx` on device `dev`, over granules, with `peers` (devices given
  /// access to `dev` before the pool existed) granted access. Throws std::bad_alloc when out
  /// of memory.
  static pool::pool* make(CUcontext ctx, CUdevice dev, ring::DeviceSlot& slot, core::Tracker& t, pool::owner& o,
                          const std::vector<CUdevice>& peers);
  /// Give device `peer` access to every range of `p`, present and future.
  static void grant_peer(pool::pool& p, CUdevice peer);
};

extern template class pooled_backend<granule_arena>;

}  // namespace cuw::backends

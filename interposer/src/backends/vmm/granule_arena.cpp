// cuwarden interposer: the `vmm` backend (granule_arena.hpp): its pools, and the backend's
// members for this layout.
#include "backends/vmm/granule_arena.hpp"

#include <atomic>
#include <memory>

#include "backends/memory_resource.hpp"
#include "backends/pool/pooled_backend_impl.hpp"
#include "backends/vmm/granules.hpp"
#include "base/log.hpp"

namespace cuw::backends {

pool::pool* granule_arena::make(CUcontext ctx, CUdevice dev, ring::DeviceSlot& slot, core::Tracker& t,
                                pool::owner& o, const std::vector<CUdevice>& peers) {
  auto granules = std::make_unique<granule_resource>(ctx, dev, slot, t);
  if (!granules->supported()) {
    static std::atomic<bool> said{false};
    if (!said.exchange(true))
      log::always("cuwarden: CUWARDEN_POOL=vmm: device %d (or its driver) has no virtual memory management; "
                  "its pool keeps whole driver allocations, as CUWARDEN_POOL=cache does",
                  static_cast<int>(dev));
    return new pool::pool(std::make_unique<driver_resource>(&t, dev), ctx, dev, slot, t, o);
  }
  granule_resource* gr = granules.get();
  auto* p = new pool::pool(std::move(granules), ctx, dev, slot, t, o, gr, &pool::arena_calls(), gr->granularity());
  for (CUdevice peer : peers) gr->grant_peer(peer);  // peers enabled before this pool existed
  return p;
}

void granule_arena::grant_peer(pool::pool& p, CUdevice peer) {
  if (granule_resource* g = p.granules()) g->grant_peer(peer);
}

template class pooled_backend<granule_arena>;

}  // namespace cuw::backends

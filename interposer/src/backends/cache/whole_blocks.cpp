// cuwarden interposer: the `cache` backend (whole_blocks.hpp): its pools, the pool's members
// (pool_impl.hpp), and the backend's members for this layout.
#include "backends/cache/whole_blocks.hpp"

#include <memory>

#include "backends/memory_resource.hpp"
#include "backends/pool/pool_impl.hpp"
#include "backends/pool/pooled_backend_impl.hpp"

namespace cuw::backends {

pool::pool* whole_blocks::make(CUcontext ctx, CUdevice dev, ring::DeviceSlot& slot, core::Tracker& t, pool::owner& o,
                               const std::vector<CUdevice>&) {
  return new pool::pool(std::make_unique<driver_resource>(&t, dev), ctx, dev, slot, t, o);
}

template class pooled_backend<whole_blocks>;

}  // namespace cuw::backends

// cuwarden interposer: the `cache` backend (whole_blocks.hpp): its pools, its steps, and the
// pool's and the backend's members for this layout.
#include "backends/cache/whole_blocks.hpp"

#include <memory>

#include "backends/memory_resource.hpp"
#include "backends/pool/pool_impl.hpp"
#include "backends/pool/pooled_backend_impl.hpp"
#include "core/tracker.hpp"

namespace cuw::backends {

whole_blocks::pool_type* whole_blocks::make(CUcontext ctx, CUdevice dev, ring::DeviceSlot& slot, core::Tracker& t,
                                            pool::owner<whole_blocks>& o, const std::vector<CUdevice>&) {
  return new pool_type(std::make_unique<driver_resource>(&t, dev), whole_blocks{}, ctx, dev, slot, t, o);
}

pool::Block* whole_blocks::take_large_locked(pool_type& p, uint64_t rounded) noexcept {
  return p.take_whole_locked(rounded);
}

CUresult whole_blocks::grow_slow(pool_type& p, CUdeviceptr* out, uint64_t bytes, int cls, uint64_t rounded, bool last,
                                 bool* cap_refused) {
  return p.grow_whole_slow(out, bytes, cls, rounded, last, cap_refused);
}

uint64_t whole_blocks::reclaim_slow(pool_type& p, uint64_t want) { return p.release_slow(want); }

uint64_t whole_blocks::release_slow(pool_type& p) { return p.release_slow(); }

void whole_blocks::forget(pool_type& p, uint64_t bytes) noexcept { p.tracker_.uncharge(p.slot_, bytes); }

template class pool::pool<whole_blocks>;
template class pooled_backend<whole_blocks>;

}  // namespace cuw::backends

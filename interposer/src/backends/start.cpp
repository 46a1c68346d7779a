// cuwarden interposer: choosing the backend (see start.hpp).
#include "backends/start.hpp"

#include <new>

#include "backends/cache/whole_blocks.hpp"
#include "backends/vmm/granule_arena.hpp"
#include "base/log.hpp"
#include "core/config.hpp"
#include "cuw/attrs.hpp"

namespace cuw::backends {

constinit passthrough g_passthrough;

CUW_COLD backend& start(core::Tracker& t) {
  core::backend_base* b = t.start_backend([&t]() -> core::backend_base* {
    const core::PoolKind kind = t.config().pool;
    backend* made = nullptr;
    switch (kind) {  // one case per backend
      case core::PoolKind::off: return &g_passthrough;
      case core::PoolKind::cache: made = new (std::nothrow) pooled_backend<whole_blocks>(t); break;
      case core::PoolKind::vmm: made = new (std::nothrow) pooled_backend<granule_arena>(t); break;
    }
    if (made) return made;
    log::always("cuwarden: no memory for the %s backend: running with CUWARDEN_POOL=off", core::pool_name(kind));
    return &g_passthrough;
  });
  return static_cast<backend&>(*b);
}

// One compare per layout, then a tail call of the class's own method (`b` is its first base).
// Each case casts to the layout whose kind it names: a layout copied without its own kind
// would be cast to the wrong class.
static_assert(whole_blocks::kind == core::PoolKind::cache && granule_arena::kind == core::PoolKind::vmm,
              "CUW_POOLED's cases cast by kind: each layout needs its own");
#define CUW_POOLED(call)                                                                   \
  switch (b.kind()) {                                                                     \
    case core::PoolKind::cache: return static_cast<pooled_backend<whole_blocks>&>(b).call; \
    case core::PoolKind::vmm: return static_cast<pooled_backend<granule_arena>&>(b).call;  \
    case core::PoolKind::off: break;                                                      \
  }                                                                                       \
  return b.call;

CUW_HOT CUresult pooled_allocate(backend& b, core::Tracker& t, CUdeviceptr* dptr, size_t bytes, alloc_fn real) {
  CUW_POOLED(allocate(t, dptr, bytes, real))
}
CUW_HOT CUresult pooled_deallocate(backend& b, core::Tracker& t, CUdeviceptr dptr, free_fn real) {
  CUW_POOLED(deallocate(t, dptr, real))
}
CUW_HOT CUresult pooled_allocate_async(backend& b, core::Tracker& t, CUdeviceptr* dptr, size_t bytes, CUstream stream,
                                       alloc_async_fn real) {
  CUW_POOLED(allocate_async(t, dptr, bytes, stream, real))
}
CUW_HOT CUresult pooled_deallocate_async(backend& b, core::Tracker& t, CUdeviceptr dptr, CUstream stream,
                                         bool per_thread, free_async_fn real) {
  CUW_POOLED(deallocate_async(t, dptr, stream, per_thread, real))
}
#undef CUW_POOLED

}  // namespace cuw::backends

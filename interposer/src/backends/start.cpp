// cuwarden interposer: choosing the backend (see start.hpp).
#include "backends/start.hpp"

#include <new>

#include "backends/cache/whole_blocks.hpp"
#include "backends/vmm/granule_arena.hpp"
#include "base/log.hpp"
#include "core/config.hpp"

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

}  // namespace cuw::backends

// cuwarden tests: backends::start for libcuwt_cache_only.so, the interposer built without the
// start objects (backends/start.cpp and the vmm layout: interposer/CMakeLists.txt). It knows
// the cache backend only, so the library links (with -z defs: every symbol resolved) only as
// long as the pool and the cache layout need nothing of the vmm arena's; the cache's cases
// then run under it (ctest interposer.cache_only).
#include <new>

#include "backends/cache/whole_blocks.hpp"
#include "backends/start.hpp"
#include "base/log.hpp"
#include "core/config.hpp"

namespace cuw::backends {

constinit passthrough g_passthrough;

backend& start(core::Tracker& t) {
  core::backend_base* b = t.start_backend([&t]() -> core::backend_base* {
    if (t.config().pool != core::PoolKind::cache) {
      log::always("cuwarden (cache-only test build): CUWARDEN_POOL=%s is not built in: running with off",
                  core::pool_name(t.config().pool));
      return &g_passthrough;
    }
    if (auto* c = new (std::nothrow) pooled_backend<whole_blocks>(t)) return c;
    return &g_passthrough;
  });
  return static_cast<backend&>(*b);
}

}  // namespace cuw::backends

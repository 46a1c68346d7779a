// cuwarden tests: backends::start and the pooled calls (start.hpp) for libcuwt_cache_only.so,
// the interposer built without the start objects (backends/start.cpp and the vmm layout:
// interposer/CMakeLists.txt). It knows the cache backend only, so the library links (with
// -z defs: every symbol resolved) only as long as the pool and the cache layout need nothing
// of the vmm arena's; the cache's cases then run under it (ctest interposer.cache_only).
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

// The pooled calls of start.hpp, for the one layout built in.
CUresult pooled_allocate(backend& b, core::Tracker& t, CUdeviceptr* dptr, size_t bytes, alloc_fn real) {
  return static_cast<pooled_backend<whole_blocks>&>(b).allocate(t, dptr, bytes, real);
}
CUresult pooled_deallocate(backend& b, core::Tracker& t, CUdeviceptr dptr, free_fn real) {
  return static_cast<pooled_backend<whole_blocks>&>(b).deallocate(t, dptr, real);
}
CUresult pooled_allocate_async(backend& b, core::Tracker& t, CUdeviceptr* dptr, size_t bytes, CUstream stream,
                               alloc_async_fn real) {
  return static_cast<pooled_backend<whole_blocks>&>(b).allocate_async(t, dptr, bytes, stream, real);
}
CUresult pooled_deallocate_async(backend& b, core::Tracker& t, CUdeviceptr dptr, CUstream stream, bool per_thread,
                                 free_async_fn real) {
  return static_cast<pooled_backend<whole_blocks>&>(b).deallocate_async(t, dptr, stream, per_thread, real);
}

}  // namespace cuw::backends

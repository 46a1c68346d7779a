// cuwarden interposer: choosing the backend (see start.hpp).
#include "backends/start.hpp"

#include <new>
#include <string>

#include "backends/cache/cache_backend.hpp"
#include "base/log.hpp"
#include "core/config.hpp"

namespace cuw::backends {

constinit passthrough g_passthrough;

CUW_COLD backend& start(core::Tracker& t) {
  core::backend_base* b = t.start_backend([&t]() -> core::backend_base* {
    const std::string pool = t.config().pool;  // validated by core/config.cpp
    // One line per backend.
    if (pool == "cache") if (auto* c = new (std::nothrow) cache_backend(t, false)) return c;
    if (pool == "vmm") if (auto* c = new (std::nothrow) cache_backend(t, true)) return c;
    if (pool != "off") log::always("cuwarden: no memory for the %s backend: running with CUWARDEN_POOL=off", pool.c_str());
    return &g_passthrough;
  });
  return static_cast<backend&>(*b);
}

}  // namespace cuw::backends

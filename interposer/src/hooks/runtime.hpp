// cuwarden interposer hooks: what the rest of the hooks tell the runtime hooks (runtime.cpp).
#pragma once

#include <cstdint>

namespace cuw::hooks::runtime {

/// A context may have been destroyed (cuCtxDestroy, a primary context's reset or last
/// release): every thread's next runtime allocation goes through the runtime once more, which
/// initializes its state for whatever context is current then. Thread-safe; one atomic add.
void contexts_changed() noexcept;

/// How many runtime calls the pool answered on the calling thread without the runtime (for
/// tests: the runtime's work was skipped). Thread-local; no lock.
uint64_t answered_on_this_thread() noexcept;

}  // namespace cuw::hooks::runtime

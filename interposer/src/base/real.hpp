// cuwarden interposer: one name for each real driver function (REAL(fn)), one place that
// resolves all of them, and the redirection used by dlsym and cuGetProcAddress.
// Resolution rejects a result that is our own wrapper (after LLVM's interception library).
#pragma once

#include <atomic>

#include "base/hook_table.hpp"

// Our hooks: C++ names hook_<fn>, exported under the driver's symbol names.
#define CUW_DECLARE_HOOK(ret, name, params, args, base, version, pts, lib) \
  extern "C" ret hook_##name params __asm__(#name);
CUW_HOOKS(CUW_DECLARE_HOOK)
#undef CUW_DECLARE_HOOK

namespace cuw::hook {

/// What every hooked call reads first, together: the tracker instance, the thread-state
/// offset and the real driver pointers, the hottest ones (the table's first six rows) in
/// the same cache line as the instance (a hooked call runs with the caches cold, so each
/// line is a miss).
struct alignas(64) HotGlobals {
  /// The core::Tracker (tracker.hpp owns it; nullptr until the first CUDA call, and in a
  /// forked child until its own).
  std::atomic<void*> instance{nullptr};
  /// Where the interposer's thread-local state (fast_clock::detail::ThreadState) is, in
  /// bytes from the thread pointer: the same in every thread (initial-exec TLS). Written
  /// once, by the library's constructor (tracker.cpp); a hook can run before it (another
  /// library's constructor, or a thread it started, calling CUDA first), and then reads 0
  /// and takes the GOT's way (core::thread_state()). Kept here so that a hooked call finds
  /// its thread's state without reading the GOT (a line and a page of its own). Relaxed
  /// loads and the one store: every value either reads is right.
  std::atomic<intptr_t> tls_offset{0};
  /// Real driver pointers, indexed by Id. Filled by resolve_lib(); nullptr = not found.
  std::atomic<void*> real[static_cast<int>(Id::count_)];
};

/// Bytes kept for the core::Tracker in HotPage: what g_hot leaves of a page (tracker.cpp
/// checks that the tracker fits).
inline constexpr size_t kTrackerBytes = (4096 - sizeof(HotGlobals)) & ~size_t{63};

/// g_hot and the core::Tracker's storage, in one 4 KiB page from its start: a hooked call
/// reads both (the tracker's first cache line holds what the hot path reads), and after a
/// synchronous driver call, which can leave the TLB cold, each page is one more walk.
/// Constant-initialized (constinit, real.cpp): hooks can run before this library's own
/// constructors (another library's constructor calling CUDA), and a dynamic initializer
/// running after them would wipe the instance and the resolved driver pointers
/// (interposer.early_ctor).
struct alignas(4096) HotPage {
  HotGlobals hot;
  alignas(64) unsigned char tracker[kTrackerBytes] = {};  ///< constructed by Tracker::create()
};
extern HotPage g_page;
inline constexpr HotGlobals& g_hot = g_page.hot;

/// Slow path: take library `lib`'s handle (0 libcuda.so.1, 1 libnvidia-ml.so.1; loading
/// it if `load` is true) and resolve every row of the table that belongs to it.
/// Idempotent and thread-safe. Returns false if the library is not there.
bool resolve_lib(int lib, bool load) noexcept;
/// Resolve the library of `id` (loading libcuda, never NVML); the real pointer or nullptr.
void* resolve_one(Id id) noexcept;

/// The real pointer for `id`, resolving on first use. Never returns one of our wrappers.
/// Cost on the hot path: one acquire load and one predictable branch.
inline void* real_ptr(Id id) noexcept {
  void* p = g_hot.real[static_cast<int>(id)].load(std::memory_order_acquire);
  if (__builtin_expect(p == nullptr, 0)) p = resolve_one(id);
  return p;
}

/// An unhooked libcuda function, resolved through the real dlsym (nullptr if absent).
void* driver_symbol(const char* name) noexcept;
/// An unhooked NVML function, if the process loaded NVML (nullptr otherwise).
void* nvml_symbol(const char* name) noexcept;

/// If `real` is libcuda's own pointer of a hooked function, our wrapper; else `real`.
void* redirect_by_pointer(void* real) noexcept;

/// cuGetProcAddress redirection: pointer match first; then, for CUDA versions this build
/// knows (<= CUDA_VERSION), the variant rules of the table (base name, version, per-thread
/// flag). Returns `real` untouched for names not hooked.
void* redirect_proc(const char* symbol, void* real, int cuda_version, cuuint64_t flags) noexcept;

/// glibc's dlsym, not ours.
void* real_dlsym(void* handle, const char* name) noexcept;
/// glibc's dlvsym, not ours (nullptr when libc has none).
void* real_dlvsym(void* handle, const char* name, const char* version) noexcept;

}  // namespace cuw::hook

#define REAL(name) (reinterpret_cast<decltype(&hook_##name)>(::cuw::hook::real_ptr(::cuw::hook::Id::name)))

// cuwarden interposer: the real functions of the shared CUDA runtimes a program loaded
// (base/cudart.hpp says why they are found this way).
#include "base/cudart.hpp"

#include <dlfcn.h>

#include <atomic>

#include "base/log.hpp"
#include "base/real.hpp"

namespace cuw::hook::cudart {

namespace {

constexpr int kFns = static_cast<int>(Fn::count_);

const char* const kFnNames[kFns] = {
#define CUW_CUDART_NAME(ret, name, params, args) #name,
    CUW_CUDART_HOOKS(CUW_CUDART_NAME)
#undef CUW_CUDART_NAME
};

const void* const kHooks[kSlots][kFns] = {
    {
#define CUW_CUDART_H12(ret, name, params, args) reinterpret_cast<const void*>(&cuw_rt12_##name),
        CUW_CUDART_HOOKS(CUW_CUDART_H12)
#undef CUW_CUDART_H12
    },
    {
#define CUW_CUDART_H13(ret, name, params, args) reinterpret_cast<const void*>(&cuw_rt13_##name),
        CUW_CUDART_HOOKS(CUW_CUDART_H13)
#undef CUW_CUDART_H13
    },
};

constinit std::atomic<bool> g_missing_logged[kSlots] = {};
constinit std::atomic<bool> g_looked_up[kSlots] = {};  ///< the library was found and searched

/// Resolves every function of `slot` from its library, if loaded; once the library was found,
/// never again (a function it lacks stays missing). The handle is kept (never closed): the
/// pointers stay valid for the life of the process, as the program's own references to the
/// library do. Racing first callers each resolve the same pointers (and each keeps a reference).
__attribute__((noinline, cold)) void resolve_all(int slot) noexcept {
  if (g_looked_up[slot].load(std::memory_order_acquire)) return;
  void* h = dlopen(kNames[slot], RTLD_LAZY | RTLD_NOLOAD);
  bool complete = h != nullptr;
  for (int f = 0; h && f < kFns; ++f) {
    void* p = real_dlvsym(h, kFnNames[f], kNames[slot]);
    if (p && is_hook(p)) p = nullptr;  // never call ourselves
    if (!p) complete = false;
    if (p) detail::g_real[slot][f].store(p, std::memory_order_release);
  }
  if (h) g_looked_up[slot].store(true, std::memory_order_release);
  if (!complete && !g_missing_logged[slot].exchange(true, std::memory_order_relaxed))
    log::warn("cuwarden: %s is not loaded, or lacks a runtime entry point cuwarden hooks: its calls "
              "return cudaErrorInitializationError",
              kNames[slot]);
}

}  // namespace

// Constant-initialized: a hook may run before this library's constructors.
constinit std::atomic<void*> detail::g_real[kSlots][kFns] = {};

void* detail::resolve(int slot, Fn f) noexcept {
  resolve_all(slot);
  return g_real[slot][static_cast<int>(f)].load(std::memory_order_acquire);
}

bool is_hook(const void* p) noexcept {
  for (const auto& row : kHooks)
    for (const void* h : row)
      if (h == p) return true;
  return false;
}

}  // namespace cuw::hook::cudart

// cuwarden interposer: resolution of real driver functions, and the dlsym hook.
#include "real.hpp"

#include "log.hpp"

#include <dlfcn.h>

#include <cstring>

namespace cuw::hook {

std::atomic<void*> g_real[static_cast<int>(Id::count_)];

namespace {

const Entry kEntries[] = {
#define CUW_ENTRY(ret, name, params, args, base, version, pts) \
  {#name, base, version, pts != 0, reinterpret_cast<void*>(&hook_##name)},
    CUW_HOOKS(CUW_ENTRY)
#undef CUW_ENTRY
};
constexpr int kCount = static_cast<int>(Id::count_);
static_assert(sizeof(kEntries) / sizeof(kEntries[0]) == kCount);

using dlsym_fn = void* (*)(void*, const char*);
std::atomic<dlsym_fn> g_real_dlsym{nullptr};
std::atomic<void*> g_libcuda{nullptr};
std::atomic<bool> g_resolved{false};
thread_local bool t_resolving_dlsym = false;

dlsym_fn get_real_dlsym() noexcept {
  dlsym_fn f = g_real_dlsym.load(std::memory_order_acquire);
  if (__builtin_expect(f != nullptr, 1)) return f;
  if (t_resolving_dlsym) return nullptr;  // dlvsym re-entered us (through someone's malloc hook)
  t_resolving_dlsym = true;
  // glibc >= 2.34 defines dlsym@@GLIBC_2.34 in libc; older ones only the 2.2.5 node.
  f = reinterpret_cast<dlsym_fn>(dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34"));
  if (!f) f = reinterpret_cast<dlsym_fn>(dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5"));
  t_resolving_dlsym = false;
  if (f) g_real_dlsym.store(f, std::memory_order_release);
  return f;
}

bool is_wrapper(void* p) noexcept {
  for (const Entry& e : kEntries)
    if (e.wrapper == p) return true;
  return false;
}

__attribute__((constructor)) void resolve_dlsym_at_load() { (void)get_real_dlsym(); }

}  // namespace

const Entry* entries(int* count) noexcept {
  if (count) *count = kCount;
  return kEntries;
}

void* real_dlsym(void* handle, const char* name) noexcept {
  dlsym_fn f = get_real_dlsym();
  return f ? f(handle, name) : nullptr;
}

bool resolve_all(bool load) noexcept {
  if (g_resolved.load(std::memory_order_acquire)) return true;
  void* h = g_libcuda.load(std::memory_order_acquire);
  if (!h) {
    h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (!h && load) h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_GLOBAL);
    if (!h) return false;
    g_libcuda.store(h, std::memory_order_release);
  }
  for (int i = 0; i < kCount; ++i) {
    void* p = real_dlsym(h, kEntries[i].name);
    if (p && is_wrapper(p)) p = nullptr;  // never call ourselves
    g_real[i].store(p, std::memory_order_release);
  }
  g_resolved.store(true, std::memory_order_release);
  return true;
}

void* driver_symbol(const char* name) noexcept {
  if (!resolve_all(true)) return nullptr;
  void* p = real_dlsym(g_libcuda.load(std::memory_order_acquire), name);
  return (p && is_wrapper(p)) ? nullptr : p;
}

void* redirect_by_pointer(void* real) noexcept {
  if (!real) return real;
  for (int i = 0; i < kCount; ++i)
    if (g_real[i].load(std::memory_order_relaxed) == real) return kEntries[i].wrapper;
  return real;
}

void* redirect_proc(const char* symbol, void* real, int cuda_version, cuuint64_t flags) noexcept {
  if (!real || !symbol) return real;
  resolve_all(false);
  void* w = redirect_by_pointer(real);
  if (w != real) {
    ipc::log::debug("cuwarden: cuGetProcAddress(%s, %d, %#llx): hooked by address", symbol, cuda_version,
                    static_cast<unsigned long long>(flags));
    return w;
  }
  // The driver handed back a pointer we do not know by address. Fall back to the variant
  // rules, but only for CUDA versions whose variants this build knows.
  if (cuda_version > CUDA_VERSION) return real;
  const bool per_thread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
  bool base_has_pt = false;
  for (const Entry& e : kEntries)
    if (e.per_thread && !std::strcmp(e.base, symbol)) base_has_pt = true;
  const Entry* best = nullptr;
  for (const Entry& e : kEntries) {
    if (std::strcmp(e.base, symbol) != 0 || e.version > cuda_version) continue;
    if (e.per_thread != (per_thread && base_has_pt)) continue;
    if (!best || e.version > best->version) best = &e;
  }
  if (best)
    ipc::log::debug("cuwarden: cuGetProcAddress(%s, %d, %#llx): unknown address, hooked by name as %s", symbol,
                    cuda_version, static_cast<unsigned long long>(flags), best->name);
  return best ? best->wrapper : real;
}

}  // namespace cuw::hook

// ---- the dlsym hook --------------------------------------------------------------------
// Only names starting with "cu" are looked at; everything else is a sibling call into
// glibc, so the caller's return address (which RTLD_NEXT is relative to) is preserved.
namespace {
__attribute__((noinline)) void* dlsym_cuda(void* handle, const char* name) {
  void* r = cuw::hook::real_dlsym(handle, name);
  if (!r) return r;
  cuw::hook::resolve_all(false);  // libcuda loaded? then know its real pointers
  return cuw::hook::redirect_by_pointer(r);
}
}  // namespace

extern "C" __attribute__((visibility("default"), optimize("O2", "optimize-sibling-calls"))) void* dlsym(
    void* handle, const char* name) {
  // dlfcn.h declares `name` nonnull; hide that from the optimizer so a NULL stays checked.
  const char* n = name;
  __asm__("" : "+r"(n));
  if (n && n[0] == 'c' && n[1] == 'u') return dlsym_cuda(handle, name);
  auto f = cuw::hook::g_real_dlsym.load(std::memory_order_acquire);
  if (__builtin_expect(f == nullptr, 0)) return cuw::hook::real_dlsym(handle, name);
  return f(handle, name);  // sibling call
}

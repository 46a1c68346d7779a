// cuwarden interposer: resolution of real driver (and NVML) functions, and the dlsym /
// dlvsym hooks. glibc's own dlsym and dlvsym are found in libc's symbol table (libc_elf.cpp)
// because every symbol reference from this library would bind to our own exports.
#include "base/real.hpp"

#include <dlfcn.h>
#include <link.h>

#include <cstring>

#include "base/libc_elf.hpp"
#include "base/log.hpp"
#include "base/work_epoch.hpp"

namespace cuw::hook {

constinit HotPage g_page;  // no dynamic initializer: see real.hpp

namespace {

const Entry kEntries[] = {
#define CUW_ENTRY(ret, name, params, args, base, version, pts, lib) \
  {#name, base, version, pts != 0, lib, reinterpret_cast<void*>(&hook_##name)},
    CUW_HOOKS(CUW_ENTRY)
#undef CUW_ENTRY
};
constexpr int kCount = static_cast<int>(Id::count_);
static_assert(sizeof(kEntries) / sizeof(kEntries[0]) == kCount);

constexpr const char* kLibNames[2] = {"libcuda.so.1", "libnvidia-ml.so.1"};
std::atomic<void*> g_lib[2] = {nullptr, nullptr};
std::atomic<bool> g_resolved[2] = {false, false};

using dlsym_fn = void* (*)(void*, const char*);
using dlvsym_fn = void* (*)(void*, const char*, const char*);
std::atomic<dlsym_fn> g_real_dlsym{nullptr};
std::atomic<dlvsym_fn> g_real_dlvsym{nullptr};

void resolve_libc() noexcept {
  // glibc >= 2.34 defines dlsym@@GLIBC_2.34 in libc; older ones only the 2.2.5 node
  // (x86-64; other architectures have their own base version, which the lookup accepts).
  auto s = reinterpret_cast<dlsym_fn>(libc_elf::find("dlsym", "GLIBC_2.34"));
  if (!s) s = reinterpret_cast<dlsym_fn>(libc_elf::find("dlsym", nullptr));
  auto v = reinterpret_cast<dlvsym_fn>(libc_elf::find("dlvsym", "GLIBC_2.34"));
  if (!v) v = reinterpret_cast<dlvsym_fn>(libc_elf::find("dlvsym", nullptr));
  if (s) g_real_dlsym.store(s, std::memory_order_release);
  if (v) g_real_dlvsym.store(v, std::memory_order_release);
}

dlsym_fn get_real_dlsym() noexcept {
  dlsym_fn f = g_real_dlsym.load(std::memory_order_acquire);
  if (__builtin_expect(f == nullptr, 0)) {
    resolve_libc();
    f = g_real_dlsym.load(std::memory_order_acquire);
  }
  return f;
}

bool is_wrapper(void* p) noexcept {
  for (const Entry& e : kEntries)
    if (e.wrapper == p) return true;
  return false;
}

__attribute__((constructor)) void resolve_at_load() { resolve_libc(); }

}  // namespace

void* real_dlsym(void* handle, const char* name) noexcept {
  dlsym_fn f = get_real_dlsym();
  return f ? f(handle, name) : nullptr;
}

void* real_dlvsym(void* handle, const char* name, const char* version) noexcept {
  dlvsym_fn f = g_real_dlvsym.load(std::memory_order_acquire);
  if (__builtin_expect(f == nullptr, 0)) {
    resolve_libc();
    f = g_real_dlvsym.load(std::memory_order_acquire);
  }
  return f ? f(handle, name, version) : nullptr;
}

bool resolve_lib(int lib, bool load) noexcept {
  if (g_resolved[lib].load(std::memory_order_acquire)) return true;
  void* h = g_lib[lib].load(std::memory_order_acquire);
  if (!h) {
    h = dlopen(kLibNames[lib], RTLD_LAZY | RTLD_NOLOAD);
    if (!h && load) h = dlopen(kLibNames[lib], RTLD_LAZY | RTLD_GLOBAL);
    if (!h) return false;
    g_lib[lib].store(h, std::memory_order_release);
  }
  for (int i = 0; i < kCount; ++i) {
    if (kEntries[i].lib != lib) continue;
    void* p = real_dlsym(h, kEntries[i].name);
    if (p && is_wrapper(p)) p = nullptr;  // never call ourselves
    g_hot.real[i].store(p, std::memory_order_release);
  }
  g_resolved[lib].store(true, std::memory_order_release);
  return true;
}

void* resolve_one(Id id) noexcept {
  const int i = static_cast<int>(id);
  // NVML is only ever used when the program loaded it; libcuda is loaded on demand.
  resolve_lib(kEntries[i].lib, kEntries[i].lib == 0);
  return g_hot.real[i].load(std::memory_order_acquire);
}

void* driver_symbol(const char* name) noexcept {
  if (!resolve_lib(0, true)) return nullptr;
  void* p = real_dlsym(g_lib[0].load(std::memory_order_acquire), name);
  return (p && is_wrapper(p)) ? nullptr : p;
}

void* nvml_symbol(const char* name) noexcept {
  if (!resolve_lib(1, false)) return nullptr;
  void* p = real_dlsym(g_lib[1].load(std::memory_order_acquire), name);
  return (p && is_wrapper(p)) ? nullptr : p;
}

void* redirect_by_pointer(void* real) noexcept {
  if (!real) return real;
  for (int i = 0; i < kCount; ++i)
    if (g_hot.real[i].load(std::memory_order_relaxed) == real) return kEntries[i].wrapper;
  return real;
}

void* redirect_proc(const char* symbol, void* real, int cuda_version, cuuint64_t flags) noexcept {
  if (!real || !symbol) return real;
  resolve_lib(0, false);
  void* w = redirect_by_pointer(real);
  if (w != real) {
    log::debug("cuwarden: cuGetProcAddress(%s, %d, %#llx): hooked by address", symbol, cuda_version,
                    static_cast<unsigned long long>(flags));
    return w;
  }
  // The driver handed back a pointer we do not know by address. Fall back to the variant
  // rules, but only for CUDA versions whose variants this build knows.
  if (cuda_version > CUDA_VERSION) {
    if (work::queues_work(symbol)) work::untracked_entry_point(symbol, cuda_version);
    return real;
  }
  const bool per_thread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
  bool base_has_pt = false;
  for (const Entry& e : kEntries)
    if (e.lib == 0 && e.per_thread && !std::strcmp(e.base, symbol)) base_has_pt = true;
  const Entry* best = nullptr;
  for (const Entry& e : kEntries) {
    if (e.lib != 0 || std::strcmp(e.base, symbol) != 0 || e.version > cuda_version) continue;
    if (e.per_thread != (per_thread && base_has_pt)) continue;
    if (!best || e.version > best->version) best = &e;
  }
  if (best)
    log::debug("cuwarden: cuGetProcAddress(%s, %d, %#llx): unknown address, hooked by name as %s", symbol,
                    cuda_version, static_cast<unsigned long long>(flags), best->name);
  if (!best && work::queues_work(symbol)) work::untracked_entry_point(symbol, cuda_version);
  return best ? best->wrapper : real;
}

}  // namespace cuw::hook

// ---- the dlsym and dlvsym hooks ---------------------------------------------------------
// Only names starting with "cu" or "nvml" are looked at; everything else is a sibling call
// into glibc, so the caller's return address (which RTLD_NEXT is relative to) is preserved.
namespace {

bool is_ours(const char* n) noexcept {
  // dlfcn.h declares `name` nonnull; hide that from the optimizer so a NULL stays checked.
  __asm__("" : "+r"(n));
  // Driver and NVML entry points: "cu" / "nvml" then an upper-case letter (cuMemAlloc_v2,
  // nvmlDeviceGetMemoryInfo). Other tools' lookups (a sanitizer's "cuserid") never match.
  auto upper = [](char c) { return c >= 'A' && c <= 'Z'; };
  return n && ((n[0] == 'c' && n[1] == 'u' && upper(n[2])) ||
               (n[0] == 'n' && n[1] == 'v' && n[2] == 'm' && n[3] == 'l' && upper(n[4])));
}

__attribute__((noinline)) void* redirect_found(void* r, const char* name) {
  if (!r) return r;
  cuw::hook::resolve_lib(name[0] == 'n' ? 1 : 0, false);  // loaded? then know its real pointers
  void* w = cuw::hook::redirect_by_pointer(r);
  if (w == r && cuw::work::queues_work(name)) cuw::work::untracked_entry_point(name, 0);
  return w;
}

/// RTLD_NEXT on behalf of the code at `caller`: the first definition in an object loaded
/// after the caller's, in load order (what glibc does for the caller itself). Asking glibc
/// with RTLD_NEXT from here would search after *this* library instead.
template <class Lookup>
void* next_after(const void* caller, Lookup&& lookup) {
  Dl_info info{};
  struct link_map* self = nullptr;
  if (!dladdr1(caller, &info, reinterpret_cast<void**>(&self), RTLD_DL_LINKMAP) || !self) return nullptr;
  for (struct link_map* m = self->l_next; m; m = m->l_next) {
    if (!m->l_name || !m->l_name[0]) continue;
    // A handle of our own (not the link_map itself: maps such as the vDSO have no scope).
    void* h = dlopen(m->l_name, RTLD_LAZY | RTLD_NOLOAD);
    if (!h) continue;
    void* r = lookup(h);
    dlclose(h);
    if (!r) continue;
    Dl_info ri{};
    struct link_map* owner = nullptr;
    if (dladdr1(r, &ri, reinterpret_cast<void**>(&owner), RTLD_DL_LINKMAP) && owner == m) return r;
  }
  return nullptr;
}

__attribute__((noinline)) void* dlsym_slow(void* handle, const char* name, const void* caller) {
  void* r = handle == RTLD_NEXT
                ? next_after(caller, [name](void* h) { return cuw::hook::real_dlsym(h, name); })
                : cuw::hook::real_dlsym(handle, name);
  return redirect_found(r, name);
}

__attribute__((noinline)) void* dlvsym_slow(void* handle, const char* name, const char* version,
                                            const void* caller) {
  auto f = cuw::hook::g_real_dlvsym.load(std::memory_order_acquire);
  if (!f) return nullptr;
  void* r = handle == RTLD_NEXT ? next_after(caller, [&](void* h) { return f(h, name, version); })
                                : f(handle, name, version);
  return redirect_found(r, name);
}

}  // namespace

// Exported as dlsym@@GLIBC_2.34 and dlsym@<base> (exports.map), likewise dlvsym.
extern "C" __attribute__((visibility("default"), optimize("O2", "optimize-sibling-calls"))) void* cuw_dlsym(
    void* handle, const char* name) {
  if (is_ours(name)) return dlsym_slow(handle, name, __builtin_return_address(0));
  auto f = cuw::hook::g_real_dlsym.load(std::memory_order_acquire);
  if (__builtin_expect(f == nullptr, 0)) {
    // Called before our constructor (a sanitizer runtime starting up): resolve without
    // calling libc, then still leave by a sibling call so RTLD_NEXT is the caller's.
    cuw::hook::resolve_libc();
    f = cuw::hook::g_real_dlsym.load(std::memory_order_acquire);
    if (!f) return nullptr;
  }
  return f(handle, name);  // sibling call
}

extern "C" __attribute__((visibility("default"), optimize("O2", "optimize-sibling-calls"))) void* cuw_dlvsym(
    void* handle, const char* name, const char* version) {
  if (is_ours(name)) return dlvsym_slow(handle, name, version, __builtin_return_address(0));
  auto f = cuw::hook::g_real_dlvsym.load(std::memory_order_acquire);
  if (__builtin_expect(f == nullptr, 0)) {
    cuw::hook::resolve_libc();
    f = cuw::hook::g_real_dlvsym.load(std::memory_order_acquire);
    if (!f) return nullptr;
  }
  return f(handle, name, version);  // sibling call
}

extern "C" __attribute__((visibility("default"), alias("cuw_dlsym"))) void* cuw_dlsym_base(void*, const char*);
extern "C" __attribute__((visibility("default"), alias("cuw_dlvsym"))) void* cuw_dlvsym_base(void*, const char*,
                                                                                           const char*);
__asm__(".symver cuw_dlsym, dlsym@@GLIBC_2.34");
__asm__(".symver cuw_dlvsym, dlvsym@@GLIBC_2.34");
#if defined(__aarch64__)
__asm__(".symver cuw_dlsym_base, dlsym@GLIBC_2.17");
__asm__(".symver cuw_dlvsym_base, dlvsym@GLIBC_2.17");
#else
__asm__(".symver cuw_dlsym_base, dlsym@GLIBC_2.2.5");
__asm__(".symver cuw_dlvsym_base, dlvsym@GLIBC_2.2.5");
#endif

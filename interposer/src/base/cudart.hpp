// cuwarden interposer: the CUDA runtime's entry points hooked where a program loads the
// runtime as a shared library (libcudart.so.12, libcudart.so.13), and their real functions.
//
// Why these exist: a shared runtime's cudaMalloc reaches the driver hooks anyway (the runtime
// finds the driver through cuGetProcAddress), so with passthrough they add nothing; with a
// pool they let the pool answer without the runtime's own work around the driver call.
// Statically linked runtimes (nvcc's default) call their own copy and keep the driver path.
//
// How they bind: a program linked against the runtime refers to `cudaMalloc@libcudart.so.13`
// (the runtime's version node), and only a definition under that node binds to such a
// reference; one under cuwarden's own node never does. So each hook is defined once per
// major, under that major's node, and both definitions are hidden (`@`, not `@@`): an
// unversioned lookup (dlsym(RTLD_DEFAULT, "cudaMalloc"), a program asking whether CUDA is
// there) finds two hidden versions here and takes neither (glibc's rule), so a process
// without a runtime never sees ours.
//
// How the real ones are found: Python loads extension modules with RTLD_LOCAL, so the
// runtime is often outside the global scope and RTLD_NEXT finds nothing; the runtime is
// found by its soname with dlopen(RTLD_NOLOAD) and each function with dlvsym under its node,
// each major in its own library when both are loaded.
//
// How to add a runtime hook: a row below (checked against the exports as the driver's rows
// are: tests/interposer/check_exports.sh), the name in both runtime nodes of
// interposer/exports.map.in, and its two definitions in hooks/runtime.cpp.
#pragma once

#include <driver_types.h>  // cudaError_t, cudaStream_t (the toolkit's, no runtime library)

#include <atomic>
#include <cstddef>

// X(ret, name, params, args): the runtime hooks (the driver's table is base/hook_table.hpp).
#define CUW_CUDART_HOOKS(X)                                                              \
  X(cudaError_t, cudaMalloc, (void** ptr, size_t size), (ptr, size))                     \
  X(cudaError_t, cudaFree, (void* ptr), (ptr))                                           \
  X(cudaError_t, cudaFreeAsync, (void* ptr, cudaStream_t stream), (ptr, stream))

// The hooks (hooks/runtime.cpp), one per major: cuw_rt12_<name> is exported as
// <name>@libcudart.so.12, cuw_rt13_<name> as <name>@libcudart.so.13.
#define CUW_CUDART_DECLARE(ret, name, params, args) \
  extern "C" ret cuw_rt12_##name params;            \
  extern "C" ret cuw_rt13_##name params;
CUW_CUDART_HOOKS(CUW_CUDART_DECLARE)
#undef CUW_CUDART_DECLARE

namespace cuw::hook::cudart {

/// The runtimes hooked, by slot: 0 is libcudart.so.12, 1 is libcudart.so.13.
inline constexpr int kSlots = 2;
/// The soname of each slot, which is also the version node of its symbols.
inline constexpr const char* kNames[kSlots] = {"libcudart.so.12", "libcudart.so.13"};

/// Index of each runtime hook, in X order.
enum class Fn : int {
#define CUW_CUDART_ID(ret, name, params, args) name,
  CUW_CUDART_HOOKS(CUW_CUDART_ID)
#undef CUW_CUDART_ID
      count_
};

namespace detail {
/// The real functions by slot and Fn (nullptr: not resolved, or not there).
extern std::atomic<void*> g_real[kSlots][static_cast<int>(Fn::count_)];
/// Resolves `slot`'s functions (real()'s slow path); returns `f`'s, or nullptr.
void* resolve(int slot, Fn f) noexcept;
}  // namespace detail

/// The real runtime function `f` of slot `slot`'s library, resolved on first use (thread-safe,
/// idempotent). nullptr when that library is not loaded or lacks the symbol (logged once per
/// slot): the hook then answers cudaErrorInitializationError. Hot path: one acquire load.
inline void* real(int slot, Fn f) noexcept {
  void* p = detail::g_real[slot][static_cast<int>(f)].load(std::memory_order_acquire);
  return __builtin_expect(p != nullptr, 1) ? p : detail::resolve(slot, f);
}

/// Whether `p` is one of our runtime hooks (resolution rejects them as real functions).
bool is_hook(const void* p) noexcept;

}  // namespace cuw::hook::cudart

// cuwarden interposer hooks: cudaMalloc, cudaFree and cudaFreeAsync of a shared CUDA runtime
// (libcudart.so.12 and .13; base/cudart.hpp: how they bind and how the real ones are found).
//
// With passthrough, and while a stream capture is active, every call goes to the runtime
// untouched (which reaches the driver hooks). With a pool, the pool answers without the
// runtime wherever the runtime's state stays what its own call would have left:
//   - Initialization: the runtime initializes itself lazily, per thread and device, inside its
//     calls. A thread's first allocation, and its first after the current context changed
//     (cudaSetDevice makes the device's primary context current, from CUDA 12 on) or a context
//     was destroyed, goes through the runtime, which initializes and reaches the pool through
//     the driver hook; later ones in the same context are answered here. cudaFree(NULL), the
//     usual way to initialize, always goes to the runtime. The device is the runtime's: the
//     pool of the context current on the thread answers, which is the one the runtime uses.
//   - Errors: the runtime keeps a per-thread last error (cudaGetLastError). A refusal (a cap
//     or the GPU out of memory, counted once here) is recorded there by asking the runtime
//     for a size no GPU has, under the re-entry guard, so the request reaches the driver
//     uncounted and the runtime records cudaErrorMemoryAllocation itself. Any other error
//     from the pool changed nothing (an allocation's driver error is counted, and counted
//     again): the call is made again through the runtime, which meets the same answer
//     through the driver hook and records it as its own.
//   - Frees: a pointer the pool does not own goes to the runtime's cudaFree (cudaFreeAsync),
//     counted once. A pooled block freed with cudaFreeAsync waits behind the pool's fence,
//     which covers the stream's work queued before the free.
#include "hooks/runtime.hpp"

#include <cuda.h>

#include <atomic>

#include "backends/driver_calls.hpp"
#include "backends/start.hpp"
#include "base/cudart.hpp"
#include "base/log.hpp"
#include "base/real.hpp"
#include "base/work_epoch.hpp"
#include "core/tracker.hpp"

namespace core = cuw::core;
namespace backends = cuw::backends;
namespace cudart = cuw::hook::cudart;
using cudart::Fn;

namespace {

using malloc_fn = cudaError_t (*)(void**, size_t);
using rt_free_fn = cudaError_t (*)(void*);
using rt_free_async_fn = cudaError_t (*)(void*, cudaStream_t);

/// Bumped when a context may have gone (contexts_changed).
constinit std::atomic<uint64_t> g_contexts{1};

// Per thread and runtime: the context the runtime last served a call in, and g_contexts then.
// Initial-exec: the library is preloaded, its TLS is static (no __tls_get_addr call).
thread_local CUcontext t_ready[cudart::kSlots] __attribute__((tls_model("initial-exec"))) = {};
thread_local uint64_t t_ready_gen[cudart::kSlots] __attribute__((tls_model("initial-exec"))) = {};
thread_local uint64_t t_answered __attribute__((tls_model("initial-exec"))) = 0;
// A free the pool did not own, made through the runtime by free_through_runtime: its answer.
thread_local bool t_runtime_ran __attribute__((tls_model("initial-exec"))) = false;
thread_local cudaError_t t_runtime_error __attribute__((tls_model("initial-exec"))) = cudaSuccess;

/// More than any GPU holds, and no overflow when the runtime or driver rounds it up.
constexpr size_t kUnservable = size_t{1} << 62;

template <class F>
F real_of(int slot, Fn f) noexcept {
  return reinterpret_cast<F>(cudart::real(slot, f));
}

CUcontext current_context() noexcept {
  auto get = backends::drv().ctx_get_current;
  CUcontext c = nullptr;
  return get && get(&c) == CUDA_SUCCESS ? c : nullptr;
}

/// Whether the calling thread is inside one of our hooks (a call the driver or the runtime
/// makes from within one): such calls pass through, as the driver hooks' nested calls do.
bool inside_hook() noexcept {
  const core::Reentry probe;
  return probe.nested();
}

/// A pool is answering: the tracker exists and chose a pooling backend.
core::Tracker* pooling() noexcept {
  core::Tracker* t = core::Tracker::instance_if_created();
  return t && t->pooling() ? t : nullptr;
}

/// The pool answers here: it is on, no stream capture is active anywhere in the process (a
/// capture gets exactly what the runtime and the driver hooks make of the call), and the call
/// is not made from inside a hook.
core::Tracker* answering() noexcept {
  core::Tracker* t = pooling();
  return t && !cuw::work::capturing() && !inside_hook() ? t : nullptr;
}

/// Whether the runtime `slot` has served a call on this thread in the current context, with
/// no context destroyed since: its lazy initialization is done there.
bool ready(int slot) noexcept {
  const CUcontext c = current_context();
  return c && c == t_ready[slot] && t_ready_gen[slot] == g_contexts.load(std::memory_order_acquire);
}

/// The runtime `slot` served a call on this thread (g_contexts was `gen` before it): with a
/// pool, remember its context. Nothing with passthrough (no driver call added).
void served(int slot, uint64_t gen) noexcept {
  if (!pooling()) return;
  t_ready[slot] = current_context();
  t_ready_gen[slot] = gen;
}

/// cudaMalloc through the runtime: initializes it, reaches the pool through the driver hook.
cudaError_t malloc_through_runtime(int slot, malloc_fn real_rt, void** ptr, size_t size) {
  const uint64_t gen = g_contexts.load(std::memory_order_acquire);
  const cudaError_t e = real_rt(ptr, size);
  if (e == cudaSuccess) served(slot, gen);
  return e;
}

/// The pool refused (counted already): the runtime records cudaErrorMemoryAllocation as its
/// last error, from a request the driver refuses uncounted. Cold.
__attribute__((noinline, cold)) void runtime_records_refusal(int slot, malloc_fn real_rt) {
  const core::Reentry guard;  // the nested driver hook passes the request through, uncounted
  void* p = nullptr;
  const cudaError_t e = real_rt(&p, kUnservable);
  if (e == cudaSuccess) {
    if (auto f = real_of<rt_free_fn>(slot, Fn::cudaFree)) f(p);
  }
  static std::atomic<bool> logged{false};
  if (e != cudaErrorMemoryAllocation && !logged.exchange(true, std::memory_order_relaxed))
    cuw::log::warn("cuwarden: %s answered %d to an unservable request: cudaGetLastError may not report "
                   "a refusal",
                   cudart::kNames[slot], static_cast<int>(e));
}

template <int S>
cudaError_t rt_cudaMalloc(void** ptr, size_t size) {
  const auto real_rt = real_of<malloc_fn>(S, Fn::cudaMalloc);
  if (__builtin_expect(real_rt == nullptr, 0)) return cudaErrorInitializationError;
  core::Tracker* t = answering();
  // A zero size or a null pointer: the runtime's own answer (cudaMalloc(&p, 0) succeeds).
  if (!t || !ptr || size == 0 || !ready(S)) return malloc_through_runtime(S, real_rt, ptr, size);
  const auto drv_alloc = REAL(cuMemAlloc_v2);  // resolved by now: the runtime reached the driver
  if (__builtin_expect(drv_alloc == nullptr, 0)) return malloc_through_runtime(S, real_rt, ptr, size);
  CUdeviceptr d = 0;
  CUresult r;
  {
    // As hook_cuMemAlloc_v2 (hooks/alloc.cpp), whose pool this is.
    const core::Reentry guard;
    const core::SiteScope site(*t, size);
    r = backends::with_backend(*t, [&](auto& b) { return b.allocate(*t, &d, size, drv_alloc); });
    if (__builtin_expect(r == CUDA_ERROR_OUT_OF_MEMORY, 0)) r = backends::allocate_after_room(*t, &d, size, drv_alloc);
  }
  if (__builtin_expect(r == CUDA_SUCCESS, 1)) {
    *ptr = reinterpret_cast<void*>(d);
    ++t_answered;
    return cudaSuccess;
  }
  if (r == CUDA_ERROR_OUT_OF_MEMORY) {
    runtime_records_refusal(S, real_rt);
    return cudaErrorMemoryAllocation;
  }
  // Another error changed nothing but the driver-error count (which the repeat counts again):
  // the runtime's own answer and last error.
  return real_rt(ptr, size);
}

/// A free the pool does not own, through the runtime (the backend's passthrough counted it):
/// its answer is kept for the hook, and the backend gets success or a generic error.
template <int S>
CUresult free_through_runtime(CUdeviceptr p) {
  t_runtime_ran = true;
  t_runtime_error = real_of<rt_free_fn>(S, Fn::cudaFree)(reinterpret_cast<void*>(p));
  return t_runtime_error == cudaSuccess ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

template <int S>
CUresult free_async_through_runtime(CUdeviceptr p, CUstream stream) {
  t_runtime_ran = true;
  t_runtime_error = real_of<rt_free_async_fn>(S, Fn::cudaFreeAsync)(reinterpret_cast<void*>(p), stream);
  return t_runtime_error == cudaSuccess ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

template <int S>
cudaError_t rt_cudaFree(void* ptr) {
  const auto real_rt = real_of<rt_free_fn>(S, Fn::cudaFree);
  if (__builtin_expect(real_rt == nullptr, 0)) return cudaErrorInitializationError;
  if (!ptr) {  // the runtime's initialization
    const uint64_t gen = g_contexts.load(std::memory_order_acquire);
    const cudaError_t e = real_rt(ptr);
    if (e == cudaSuccess) served(S, gen);
    return e;
  }
  core::Tracker* t = answering();
  if (!t) return real_rt(ptr);
  t_runtime_ran = false;
  // answering(): a pool is in place, called as its class (no virtual call).
  const CUresult r = backends::pooled_ref(*backends::started(t))
                         .deallocate(*t, reinterpret_cast<CUdeviceptr>(ptr), &free_through_runtime<S>);
  if (t_runtime_ran) return t_runtime_error;
  if (__builtin_expect(r == CUDA_SUCCESS, 1)) {
    ++t_answered;
    return cudaSuccess;
  }
  return real_rt(ptr);  // refused, nothing changed: the runtime meets the same answer and records it
}

template <int S>
cudaError_t rt_cudaFreeAsync(void* ptr, cudaStream_t stream) {
  const auto real_rt = real_of<rt_free_async_fn>(S, Fn::cudaFreeAsync);
  if (__builtin_expect(real_rt == nullptr, 0)) return cudaErrorInitializationError;
  core::Tracker* t = answering();
  if (!ptr || !t) return real_rt(ptr, stream);
  t_runtime_ran = false;
  // Not the per-thread variant: the runtime's cudaFreeAsync_ptsz (not hooked) is that one.
  const CUresult r = backends::pooled_ref(*backends::started(t))
                         .deallocate_async(*t, reinterpret_cast<CUdeviceptr>(ptr), stream, false,
                                           &free_async_through_runtime<S>);
  if (t_runtime_ran) return t_runtime_error;
  if (__builtin_expect(r == CUDA_SUCCESS, 1)) {
    ++t_answered;
    return cudaSuccess;
  }
  return real_rt(ptr, stream);
}

}  // namespace

namespace cuw::hooks::runtime {

void contexts_changed() noexcept { g_contexts.fetch_add(1, std::memory_order_acq_rel); }

uint64_t answered_on_this_thread() noexcept { return t_answered; }

}  // namespace cuw::hooks::runtime

// Each hook twice, under each runtime's version node (hidden: `@`, see base/cudart.hpp).
#define CUW_CUDART_DEFINE(ret, name, params, args)                                                           \
  extern "C" __attribute__((visibility("default"))) ret cuw_rt12_##name params { return rt_##name<0> args; } \
  extern "C" __attribute__((visibility("default"))) ret cuw_rt13_##name params { return rt_##name<1> args; } \
  __asm__(".symver cuw_rt12_" #name ", " #name "@libcudart.so.12");                                         \
  __asm__(".symver cuw_rt13_" #name ", " #name "@libcudart.so.13");
CUW_CUDART_HOOKS(CUW_CUDART_DEFINE)
#undef CUW_CUDART_DEFINE

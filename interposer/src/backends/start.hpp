// cuwarden interposer: the backend chosen at start, and the hooks' way of calling it.
#pragma once

#include "backends/backend.hpp"
#include "backends/passthrough.hpp"
#include "core/tracker.hpp"
#include "cuw/attrs.hpp"

namespace cuw::backends {

/// The passthrough backend: one for the process, constant-initialized (it exists before any
/// constructor of this library runs, as hooks may). Hidden in the declaration too, so that the
/// hooks compare against its address directly rather than load it from the GOT (a data line).
extern passthrough g_passthrough __attribute__((visibility("hidden")));

/// Chooses the backend CUWARDEN_POOL names (backends/start.cpp: one line per backend) and
/// installs it in `t`, unless another thread did first; returns the one installed. Cold: once
/// per process (and per forked child). Thread-safe.
backend& start(core::Tracker& t);

/// `t`'s backend, started if none is yet. Thread-safe.
inline backend& chosen(core::Tracker& t) {
  core::backend_base* b = t.backend();
  return __builtin_expect(b != nullptr, 1) ? static_cast<backend&>(*b) : start(t);
}

/// A started pooling backend's allocations and frees, each made on its layout's class
/// (pooled_backend<Layout>, picked by b.kind(): one load and a compare per layout) with a
/// direct call, never a virtual one. Out of line, beside the layouts that start() builds
/// (start.cpp), so that the hooks name no layout. `b` pools (b.pools()). Thread-safe.
CUresult pooled_allocate(backend& b, core::Tracker& t, CUdeviceptr* dptr, size_t bytes, alloc_fn real);
CUresult pooled_deallocate(backend& b, core::Tracker& t, CUdeviceptr dptr, free_fn real);
CUresult pooled_allocate_async(backend& b, core::Tracker& t, CUdeviceptr* dptr, size_t bytes, CUstream stream,
                               alloc_async_fn real);
CUresult pooled_deallocate_async(backend& b, core::Tracker& t, CUdeviceptr dptr, CUstream stream, bool per_thread,
                                 free_async_fn real);

/// A started pooling backend as the hooks call it: allocations and frees through
/// pooled_allocate and its siblings (direct calls), notices through backend (virtual; cold).
class pooled_ref {
 public:
  explicit pooled_ref(backend& b) noexcept : b_(b) {}
  CUresult allocate(core::Tracker& t, CUdeviceptr* dptr, size_t bytes, alloc_fn real) {
    return pooled_allocate(b_, t, dptr, bytes, real);
  }
  CUresult deallocate(core::Tracker& t, CUdeviceptr dptr, free_fn real) { return pooled_deallocate(b_, t, dptr, real); }
  CUresult allocate_async(core::Tracker& t, CUdeviceptr* dptr, size_t bytes, CUstream stream, alloc_async_fn real) {
    return pooled_allocate_async(b_, t, dptr, bytes, stream, real);
  }
  CUresult deallocate_async(core::Tracker& t, CUdeviceptr dptr, CUstream stream, bool per_thread,
                            free_async_fn real) {
    return pooled_deallocate_async(b_, t, dptr, stream, per_thread, real);
  }
  void stream_created(core::Tracker& t, CUstream s, unsigned flags) { b_.stream_created(t, s, flags); }
  void peer_access_changed(core::Tracker& t, CUcontext peer, bool enabled) {
    b_.peer_access_changed(t, peer, enabled);
  }

 private:
  backend& b_;
};

/// op(backend) for `t`'s backend, without a virtual call once it started: op(g_passthrough)
/// when passthrough is chosen, so that its inline methods are what runs (the off path costs
/// one load and one compare over calling the core directly); op(pooled_ref) for a pool;
/// op(backend&) on the process's first call, which starts the backend (start(): virtual).
/// `op` is generic: [&](auto& b) {...}, and uses only what pooled_ref has.
template <class Op>
CUW_INLINE decltype(auto) with_backend(core::Tracker& t, Op&& op) {
  core::backend_base* b = t.backend();
  if (__builtin_expect(b == &g_passthrough, 1)) return op(g_passthrough);
  if (__builtin_expect(b == nullptr, 0)) return op(start(t));
  pooled_ref pool(static_cast<backend&>(*b));
  return op(pool);
}

/// A hooked allocation (cuMemAlloc, cuMemAllocAsync) returned CUDA_ERROR_OUT_OF_MEMORY: when
/// the driver refused it and the daemon made room (core/room.hpp: retry_after_room), the
/// backend is asked once more; otherwise the error stands. Out of line, so that a hook's hot
/// path holds only the branch to it. May block up to the policy's room_wait. Cold.
CUresult allocate_after_room(core::Tracker& t, CUdeviceptr* dptr, size_t bytes, alloc_fn real);
CUresult allocate_async_after_room(core::Tracker& t, CUdeviceptr* dptr, size_t bytes, CUstream stream,
                                   alloc_async_fn real);

/// `t`'s backend if `t` exists and started one, else nullptr (never creates either): for hooks
/// about memory a pool may hold (pointer queries, IPC, a stream's destruction, retains):
/// before a backend starts, nothing is pooled. A notice whose state cannot be asked later
/// (peer access, a stream's creation) starts the backend instead (with_backend).
inline backend* started(core::Tracker* t) noexcept {
  return t ? static_cast<backend*>(t->backend()) : nullptr;
}

}  // namespace cuw::backends

// cuwarden interposer: the backend seam. Every hook that allocates, frees, or tells a pool
// something it must know calls the one backend chosen at start (CUWARDEN_POOL); passthrough
// (`off`) is a backend like the others. Hooks handle arguments and name the driver entry
// point the program called; a backend serves the call from its pool, or passes it on to
// passthrough, which calls that entry point and records it (core/record.hpp).
//
// How to add a backend:
//   1. A folder backends/<name>/ with a class deriving from `backend` that overrides every
//      do_* method below (each says what passthrough does). Hand what you do not serve to a
//      `passthrough` member. What you serve, you count and record by calling the ledger
//      (core/ledger.hpp: a block handed out, freed, driver memory taken and given back),
//      under your device's pool book lock with your own free lists (Tracker::pool_book; its
//      records are the ledger's); caps: Tracker::charge for what you
//      take from the driver. A pool of another layout is a layout type instead (the steps
//      pool/pool.hpp lists, and what pool/pooled_backend.hpp asks) whose own file
//      instantiates pool<Layout> and pooled_backend<Layout>: backends/cache/whole_blocks.hpp
//      is the example.
//   2. One case in backends/start.cpp: CUWARDEN_POOL=<name> constructs it (its literal in
//      the options row, cuw/options.hpp, and core::PoolKind in core/config.hpp, which is its
//      kind()); a pool's layout also gets a case in start.cpp's CUW_POOLED, through which
//      the hooks call its class directly.
//   3. Tests: copy the cache's cases in tests/interposer (test_cache.cpp,
//      test_cache_adversarial.cpp, test_stream_order.cpp and their ctest lines) with
//      CUWARDEN_POOL=<name>: reuse
//      only after the GPU is done, captures, pointer queries, IPC, peers, caps, context
//      destruction; then the GPU checks (COMPAT_POOL=<name> tests/gpu/compat.sh, and
//      tests/gpu/cache_reuse.sh and ctx_gone.sh with the name beside `cache`).
//
// The promises every backend keeps: a freed block is not
// handed out again before all work submitted before the free has finished, on every stream,
// or is ordered before all work its next owner can queue (pool/fence.hpp: stream order);
// nothing is synchronized, recorded or freed while a stream capture is active, and every
// allocation during one gets the driver's own answer (base/work_epoch.hpp counts captures
// from the library's load; capture_beginning is told of one just before it begins);
// memory kept for reuse counts against the caps and goes back before an allocation is
// refused; pointer queries describe the program's allocation, not the pool's segment.
//
// Thread safety: every method may be called by any number of threads at once. Methods take
// the process's tracker (created by the caller) and never block on the daemon.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>

#include "base/call_ref.hpp"
#include "core/backend_base.hpp"
#include "core/tracker.hpp"

namespace cuw::backends {

/// One allocation of the program as the driver would describe it.
struct range {
  CUdeviceptr base = 0;  ///< first byte of the allocation
  std::size_t size = 0;  ///< bytes the program asked for
};

/// One block a backend holds (for_each_block). Sizes in bytes.
struct block_info {
  enum class state : uint8_t { live, free, pending };
  CUdeviceptr address = 0;  ///< first byte
  uint64_t bytes = 0;       ///< the block as the backend carved it
  uint64_t requested = 0;   ///< the program's request while live, else 0
  int ordinal = -1;         ///< CUDA ordinal of its device
  state status = state::free;  ///< pending: freed, waiting for earlier GPU work
};

/// A backend's pool on one device, in bytes.
struct pool_stats {
  uint64_t reserved = 0;      ///< held from the driver
  uint64_t cached = 0;        ///< of which no live allocation uses (free, pending, not yet carved)
  uint64_t largest_free = 0;  ///< the largest request the pool serves now without the driver
};

/// What another process maps for one exported pooled block (backend::ipc_export and
/// ipc_describe; see backends/ipc.hpp).
struct ipc_span {
  enum class kind : uint32_t { legacy = 1, granules = 2 };
  kind how = kind::legacy;
  CUdeviceptr block = 0;       ///< the block's first byte
  uint64_t requested = 0;      ///< the program's request
  uint64_t generation = 0;     ///< changes when the block is freed and handed out again
  CUdeviceptr base = 0;        ///< the exporter's address of the span (granules: granule-aligned)
  uint64_t bytes = 0;          ///< the span's bytes (granules: a multiple of granule_bytes)
  uint64_t offset = 0;         ///< the block's first byte, from base
  uint64_t granule_bytes = 0;  ///< granules: bytes of each
  bool exportable = true;      ///< granules: created exportable as file descriptors
  CUipcMemHandle legacy{};     ///< legacy: the handle of the driver allocation at base
};

// The driver entry points a backend is handed (REAL(x) of the hook that calls it).
using alloc_fn = CUresult (*)(CUdeviceptr*, size_t);
using free_fn = CUresult (*)(CUdeviceptr);
using alloc_async_fn = CUresult (*)(CUdeviceptr*, size_t, CUstream);
using free_async_fn = CUresult (*)(CUdeviceptr, CUstream);
using ipc_export_fn = CUresult (*)(CUipcMemHandle*, CUdeviceptr);
using ipc_import_fn = CUresult (*)(CUdeviceptr*, CUipcMemHandle, unsigned int);
using ipc_close_fn = CUresult (*)(CUdeviceptr);

/// The seam (after RMM's memory resources: public non-virtual methods over private virtual
/// do_* ones). Return values are the CUresult the program gets. The hooks' allocations and
/// frees do not go through it: they call the concrete class by kind() (start.hpp); the
/// virtual methods serve the other calls, and callers that hold only a backend&.
class backend : public core::backend_base {
 public:
  // ---- the program's allocations ------------------------------------------------------
  /// cuMemAlloc_v2 through `real`: *dptr and CUDA_SUCCESS, or the error
  /// (CUDA_ERROR_OUT_OF_MEMORY when a cap or the driver refuses).
  CUresult allocate(core::Tracker& t, CUdeviceptr* dptr, size_t bytes, alloc_fn real) {
    return do_allocate(t, dptr, bytes, real);
  }
  /// cuMemFree_v2 through `real`. An address inside memory the backend holds that is no
  /// live block's start (a second free) is CUDA_ERROR_INVALID_VALUE, never the driver's.
  CUresult deallocate(core::Tracker& t, CUdeviceptr dptr, free_fn real) { return do_deallocate(t, dptr, real); }
  /// cuMemAllocAsync (or its per-thread-stream variant, `real`) on `stream`.
  CUresult allocate_async(core::Tracker& t, CUdeviceptr* dptr, size_t bytes, CUstream stream, alloc_async_fn real) {
    return do_allocate_async(t, dptr, bytes, stream, real);
  }
  /// cuMemFreeAsync (or its per-thread-stream variant: `per_thread`, `real`) on `stream`, of
  /// any allocation (the program's own pools' included).
  CUresult deallocate_async(core::Tracker& t, CUdeviceptr dptr, CUstream stream, bool per_thread,
                            free_async_fn real) {
    return do_deallocate_async(t, dptr, stream, per_thread, real);
  }

  // ---- notices ---------------------------------------------------------------------------
  /// A stream was created in the calling thread's current context (cuStreamCreate*).
  void stream_created(core::Tracker& t, CUstream s, unsigned flags) { do_stream_created(t, s, flags); }
  /// `s` is about to be destroyed (cuStreamDestroy): work queued on it may still use memory.
  void stream_destroying(core::Tracker& t, CUstream s) { do_stream_destroying(t, s); }
  /// A driver call that may destroy a context: `which()` names the context (nullptr: none
  /// known), `destroy()` makes the call and returns whether the context is gone. Returns
  /// destroy()'s answer. The backend forgets that context's memory (the driver freed it).
  bool context_destroy(core::Tracker& t, call_ref<CUcontext()> which, call_ref<bool()> destroy) {
    return do_context_destroy(t, which, destroy);
  }
  /// cuDevicePrimaryCtxRetain, made by `call`: may make a primary context active (again).
  CUresult context_retain(core::Tracker& t, call_ref<CUresult()> call) { return do_context_retain(t, call); }
  /// A stream capture is about to begin (counted already: base/work_epoch.hpp), before the
  /// driver's call.
  void capture_beginning(core::Tracker& t) { do_capture_beginning(t); }
  /// The driver enabled (or disabled) the current context's access to `peer`'s memory.
  void peer_access_changed(core::Tracker& t, CUcontext peer, bool enabled) {
    do_peer_access_changed(t, peer, enabled);
  }

  // ---- queries and IPC -------------------------------------------------------------------
  /// Whether `p` lies in memory the backend holds; if so, `*live` says whether in a live
  /// block, and `*out` (if given) describes that block as the program's allocation.
  bool locate(core::Tracker& t, CUdeviceptr p, range* out, bool* live) { return do_locate(t, p, out, live); }
  /// cuIpcGetMemHandle through `real`: a handle that maps exactly the allocation at `p`, or
  /// an error saying why not (never a handle to other bytes).
  CUresult ipc_export(core::Tracker& t, CUipcMemHandle* handle, CUdeviceptr p, ipc_export_fn real) {
    return do_ipc_export(t, handle, p, real);
  }
  /// cuIpcOpenMemHandle through `real`. Called once the backend has started: an import before
  /// a process's first allocation reaches the driver directly (an import creates no tracker).
  CUresult ipc_import(core::Tracker& t, CUdeviceptr* p, CUipcMemHandle handle, unsigned flags, ipc_import_fn real) {
    return do_ipc_import(t, p, handle, flags, real);
  }
  /// cuIpcCloseMemHandle through `real`.
  CUresult ipc_close(core::Tracker& t, CUdeviceptr p, ipc_close_fn real) { return do_ipc_close(t, p, real); }
  /// For another process importing the block at `p` that ipc_export handed out a handle of
  /// ours for: where it lies now, if it is still live with `bytes` requested (`legacy` not
  /// filled in). CUDA_SUCCESS and *out, or CUDA_ERROR_INVALID_HANDLE (no such live block).
  /// Called from the IPC listener's thread: takes no lock held across a driver call, makes
  /// no driver call.
  CUresult ipc_describe(core::Tracker& t, CUdeviceptr p, uint64_t bytes, ipc_span* out) {
    return do_ipc_describe(t, p, bytes, out);
  }
  /// Calls `visit` for every block the backend holds (not for passthrough's allocations:
  /// those are the core's live records); false when memory ran out and some were left out.
  /// Allocates, and holds a pool's lock while it copies its blocks: for snapshots
  /// and reports, never on a hot path. Each block is as it was when copied.
  bool for_each_block(core::Tracker& t, call_ref<void(const block_info&)> visit) {
    return do_for_each_block(t, visit);
  }
  /// The pool on device `ordinal` (zeros when the backend keeps nothing there). Holds a
  /// pool's lock while it walks its blocks: not on a hot path.
  pool_stats stats(core::Tracker& t, int ordinal) { return do_stats(t, ordinal); }

  /// What CUWARDEN_POOL chose, fixed at construction: which concrete class this is
  /// (passthrough for `off`, pooled_backend<Layout> with Layout::kind otherwise), so that the
  /// hooks call it as that class, without a virtual call (start.hpp: with_backend).
  core::PoolKind kind() const noexcept { return kind_; }

 protected:
  constexpr explicit backend(core::PoolKind kind) noexcept
      : backend_base(kind != core::PoolKind::off), kind_(kind) {}
  ~backend() = default;

 private:
  const core::PoolKind kind_;

  virtual CUresult do_allocate(core::Tracker& t, CUdeviceptr* dptr, size_t bytes, alloc_fn real) = 0;
  virtual CUresult do_deallocate(core::Tracker& t, CUdeviceptr dptr, free_fn real) = 0;
  virtual CUresult do_allocate_async(core::Tracker& t, CUdeviceptr* dptr, size_t bytes, CUstream stream,
                                     alloc_async_fn real) = 0;
  virtual CUresult do_deallocate_async(core::Tracker& t, CUdeviceptr dptr, CUstream stream, bool per_thread,
                                       free_async_fn real) = 0;
  virtual void do_stream_created(core::Tracker& t, CUstream s, unsigned flags) = 0;
  virtual void do_stream_destroying(core::Tracker& t, CUstream s) = 0;
  virtual bool do_context_destroy(core::Tracker& t, call_ref<CUcontext()> which, call_ref<bool()> destroy) = 0;
  virtual CUresult do_context_retain(core::Tracker& t, call_ref<CUresult()> call) = 0;
  virtual void do_peer_access_changed(core::Tracker& t, CUcontext peer, bool enabled) = 0;
  virtual void do_capture_beginning(core::Tracker& t) = 0;
  virtual bool do_locate(core::Tracker& t, CUdeviceptr p, range* out, bool* live) = 0;
  virtual CUresult do_ipc_export(core::Tracker& t, CUipcMemHandle* handle, CUdeviceptr p, ipc_export_fn real) = 0;
  virtual CUresult do_ipc_import(core::Tracker& t, CUdeviceptr* p, CUipcMemHandle handle, unsigned flags,
                                 ipc_import_fn real) = 0;
  virtual CUresult do_ipc_close(core::Tracker& t, CUdeviceptr p, ipc_close_fn real) = 0;
  virtual CUresult do_ipc_describe(core::Tracker& t, CUdeviceptr p, uint64_t bytes, ipc_span* out) = 0;
  virtual bool do_for_each_block(core::Tracker& t, call_ref<void(const block_info&)> visit) = 0;
  virtual pool_stats do_stats(core::Tracker& t, int ordinal) = 0;
};

}  // namespace cuw::backends

// cuwarden interposer: the pooling backends: one pool per CUDA context (pool.hpp has the
// design), found from the calling thread's current context, made by the backend's layout
// (the layouts: backends/README.md). What the pools do not serve
// (stream-ordered allocations, calls without a context, IPC imports) goes to passthrough.
// The members are defined in pooled_backend_impl.hpp, instantiated once per layout in the
// layout's own file.
#pragma once

#include <cuda.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <vector>

#include "backends/backend.hpp"
#include "backends/pool/pool.hpp"
#include "backends/passthrough.hpp"
#include "base/call_ref.hpp"
#include "core/config.hpp"
#include "core/tracker.hpp"
#include "cuw/ring.hpp"

namespace cuw::backends {

/// Every pool of the process, one per CUDA context, each made by `Layout`, which provides
///   static constexpr core::PoolKind kind;        the CUWARDEN_POOL value it serves
///   static constexpr bool kGrantsPeers;          whether a peer's access is the pools' to grant
///   static pool::pool<Layout>* make(CUcontext, CUdevice, ring::DeviceSlot&, core::Tracker&,
///                           pool::owner<Layout>&, const std::vector<CUdevice>& peers);
///                                                a context's pool (may throw)
///   static void grant_peer(pool::pool<Layout>&, CUdevice); let a peer device map the pool's memory
/// and the pool's steps (pool.hpp).
/// Thread-safe.
template <class Layout>
class pooled_backend final : public backend, public pool::owner<Layout> {
 public:
  explicit pooled_backend(core::Tracker& t) : backend(Layout::kind), tracker_(t) {}

  // ---- the program's allocations, called on this class (no virtual call) ------------------
  // The hooks reach these through start.hpp's with_backend, which names this class by
  // kind(); they hide backend's methods of the same names, whose do_* overrides below call
  // them for a caller that holds only a backend&. Each is what backend's says.

  /// backend::allocate: a block of the current context's pool; passthrough's answer during
  /// a capture, without a context, or for 0 bytes.
  CUresult allocate(core::Tracker& t, CUdeviceptr* dptr, size_t bytes, alloc_fn real);
  /// backend::deallocate: back to the pool that holds `dptr`, else passthrough's.
  CUresult deallocate(core::Tracker& t, CUdeviceptr dptr, free_fn real);
  /// backend::allocate_async: passthrough's (stream-ordered allocations stay the driver's).
  CUresult allocate_async(core::Tracker& t, CUdeviceptr* dptr, size_t bytes, CUstream stream, alloc_async_fn real);
  /// backend::deallocate_async: a pooled block retired like a cuMemFree, else passthrough's.
  CUresult deallocate_async(core::Tracker& t, CUdeviceptr dptr, CUstream stream, bool per_thread,
                            free_async_fn real);

  /// The cache of the calling thread's current context, created on first use; nullptr
  /// without a current context or for a device past what the ring tracks. Cost when the
  /// context is the thread's last one: one cuCtxGetCurrent and two compares.
  pool::pool<Layout>* for_current() noexcept;
  /// Free live block `p` in whichever cache owns it (free_traced; the thread's last cache
  /// first). CUDA_ERROR_INVALID_VALUE when `p` is inside a cache's memory but not a live
  /// block's start; CUDA_ERROR_NOT_FOUND when no cache holds it.
  CUresult free_traced(CUdeviceptr p, ring::Api api, uint64_t aux, uint64_t now_ns);
  /// The cache whose memory contains `p` (live or not), or nullptr.
  pool::pool<Layout>* owner_of(CUdeviceptr p, range* out, bool* live);

  /// Give back to the driver everything every cache keeps (waiting for pending frees,
  /// except during a capture); returns the bytes. For a driver allocation that failed with
  /// CUDA_ERROR_OUT_OF_MEMORY outside the caches (cudaMallocAsync, cuMemCreate, ...), or
  /// refused by a cap.
  uint64_t release() override { return release_all_except(nullptr); }
  /// The same for every cache but `skip` (the caller's own, whose slow path it holds or
  /// has just released itself).
  uint64_t release_all_except(const pool::pool<Layout>* skip) override;
  bool live_elsewhere(CUdeviceptr p, const pool::pool<Layout>* skip) override;

 private:
  CUresult do_allocate(core::Tracker& t, CUdeviceptr* dptr, size_t bytes, alloc_fn real) override {
    return allocate(t, dptr, bytes, real);
  }
  CUresult do_deallocate(core::Tracker& t, CUdeviceptr dptr, free_fn real) override {
    return deallocate(t, dptr, real);
  }
  CUresult do_allocate_async(core::Tracker& t, CUdeviceptr* dptr, size_t bytes, CUstream stream,
                             alloc_async_fn real) override {
    return allocate_async(t, dptr, bytes, stream, real);
  }
  CUresult do_deallocate_async(core::Tracker& t, CUdeviceptr dptr, CUstream stream, bool per_thread,
                               free_async_fn real) override {
    return deallocate_async(t, dptr, stream, per_thread, real);
  }
  /// A non-blocking stream gets its own event when a batch of frees is sealed.
  void do_stream_created(core::Tracker& t, CUstream s, unsigned flags) override;
  void do_stream_destroying(core::Tracker& t, CUstream s) override;
  /// Under the backend's lock: `which()` names the context a driver call may destroy
  /// (nullptr: none of ours), then `destroy` runs that call (cuCtxDestroy, a primary
  /// context's reset or last release) and returns whether the context is gone. While it
  /// runs, for_current finds no cache for the context (a thread asking waits for the
  /// outcome: a context created meanwhile under the same handle gets a cache of its own),
  /// and the context's cache makes no driver call on its memory (set_dying). When the
  /// context is gone its cache forgets its memory (the driver freed it), otherwise it stays
  /// as it was (a refused destroy frees nothing). Serializes context destructions with each
  /// other and with retains. Returns destroy's answer.
  bool do_context_destroy(core::Tracker& t, call_ref<CUcontext()> which, call_ref<bool()> destroy) override;
  /// Runs `call` (cuDevicePrimaryCtxRetain) under the backend's lock, so that no retain falls
  /// between a release and the check of whether that release destroyed the context.
  CUresult do_context_retain(core::Tracker& t, call_ref<CUresult()> call) override;
  /// A layout whose memory the driver maps for a peer itself: nothing to do. Else
  /// (Layout::kGrantsPeers: cuCtxEnablePeerAccess does not cover mapped memory) the current
  /// context's device gets access to every range of the pools on the peer's device, present
  /// and future (disabling takes nothing away: the program's own access rules still apply).
  void do_peer_access_changed(core::Tracker& t, CUcontext peer, bool enabled) override;
  /// Every pool that handed out blocks by stream order waits for its legacy stream first
  /// (pool/fence.hpp: no such block has work pending while a capture is active).
  void do_capture_beginning(core::Tracker& t) override;
  /// Stream order off for good in every pool (another pool, or a peer's access).
  void unorder_all_locked();
  bool do_locate(core::Tracker& t, CUdeviceptr p, range* out, bool* live) override;
  /// A whole driver allocation: the driver's handle. A block no legacy handle names: one of
  /// ours (backends/ipc.hpp), which importers under cuwarden open.
  CUresult do_ipc_export(core::Tracker& t, CUipcMemHandle* handle, CUdeviceptr p, ipc_export_fn real) override;
  /// Handles of ours are opened by the hook before it reaches a backend (backends/ipc.hpp):
  /// the driver opens the rest.
  CUresult do_ipc_import(core::Tracker& t, CUdeviceptr* p, CUipcMemHandle handle, unsigned flags,
                         ipc_import_fn real) override {
    return passthrough_.ipc_import(t, p, handle, flags, real);
  }
  CUresult do_ipc_close(core::Tracker& t, CUdeviceptr p, ipc_close_fn real) override {
    return passthrough_.ipc_close(t, p, real);
  }
  CUresult do_ipc_describe(core::Tracker& t, CUdeviceptr p, uint64_t bytes, ipc_span* out) override;
  bool do_for_each_block(core::Tracker& t, call_ref<void(const block_info&)> visit) override;
  pool_stats do_stats(core::Tracker& t, int ordinal) override;

  pool::pool<Layout>* create(CUcontext ctx) noexcept;
  /// passthrough_'s allocate and deallocate, out of line: inlined, passthrough's path (a
  /// driver call, a lock, the ring) would make a hit's frame its own size.
  CUresult passed_allocate(core::Tracker& t, CUdeviceptr* dptr, size_t bytes, alloc_fn real);
  CUresult passed_deallocate(core::Tracker& t, CUdeviceptr dptr, free_fn real);

  core::Tracker& tracker_;
  passthrough passthrough_;
  static constexpr int kMax = 64;  ///< contexts with a cache at once (slots of destroyed ones are reused)
  std::mutex mu_;
  std::atomic<pool::pool<Layout>*> caches_[kMax] = {};
  std::atomic<int> count_{0};  ///< slots in use or freed, [0, count_)
  std::atomic<CUcontext> dying_{nullptr};  ///< being destroyed (do_context_destroy; under mu_)
  std::atomic<uint64_t> generation_{1};  ///< bumped when a cache is dropped
  std::vector<pool::pool<Layout>*> dropped_;  ///< caches of contexts that went away (never freed)
  std::vector<CUdevice> peers_[ring::kMaxDevices];  ///< devices given access, by device (under mu_)
  bool unordered_ = false;  ///< stream order is off for good in every pool (under mu_)
};

}  // namespace cuw::backends

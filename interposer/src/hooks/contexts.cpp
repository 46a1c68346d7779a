// cuwarden interposer hooks: streams, captures, contexts and peer access: what a pool must
// know (a non-blocking stream gets its own event when a batch of frees is sealed; while any
// capture is active nothing is recorded, queried or waited for; a context that goes away takes
// its memory with it, which the counters and the pool both let go of).
#include <cuda.h>

#include "backends/ipc.hpp"
#include "backends/start.hpp"
#include "base/real.hpp"
#include "base/work_epoch.hpp"
#include "core/array_owners.hpp"
#include "core/context_sweep.hpp"
#include "core/tracker.hpp"
#include "hooks/prologue.hpp"
#include "hooks/runtime.hpp"

using cuw::core::ArrayOwners;
using cuw::core::Tracker;
namespace backends = cuw::backends;
namespace core = cuw::core;

// ---- streams (CUDA driver API: Stream Management) ---------------------------------------------

#define CUW_STREAM_CREATE(name, params, args)                                                     \
  CUW_EXPORT CUresult hook_##name params {                                                        \
    CUW_PROLOGUE(name, CUW_UNPAREN args);                                                         \
    const CUresult r = real args;                                                                 \
    if (r == CUDA_SUCCESS && stream) {                                                            \
      Tracker& t = Tracker::get();                                                                \
      backends::with_backend(t, [&](auto& b) { b.stream_created(t, *stream, flags); });          \
    }                                                                                             \
    return r;                                                                                     \
  }
#define CUW_UNPAREN(...) __VA_ARGS__
CUW_STREAM_CREATE(cuStreamCreate, (CUstream * stream, unsigned int flags), (stream, flags))
CUW_STREAM_CREATE(cuStreamCreateWithPriority, (CUstream * stream, unsigned int flags, int priority),
                  (stream, flags, priority))
#undef CUW_STREAM_CREATE
#undef CUW_UNPAREN

CUW_EXPORT CUresult hook_cuStreamDestroy_v2(CUstream stream) {
  CUW_PROLOGUE(cuStreamDestroy_v2, stream);
  Tracker* t = Tracker::instance_if_created();
  if (backends::backend* b = backends::started(t); b && stream) b->stream_destroying(*t, stream);
  return real(stream);
}

// ---- captures (CUDA driver API: Stream Management, stream capture) ----------------------------
// Counted in base/work_epoch.hpp from the library's load: every way to begin a capture, the
// count, then the backend's notice (a pool whose blocks went back by stream order waits for
// its legacy stream while that is still allowed: backends/pool/fence.hpp), then the driver
// call, and the count taken back if it refused; every way to end one, the count after the
// driver call if the stream was capturing (a capture begun through an entry point we do not
// hook never makes the count negative).

namespace {
void capture_notice() {
  Tracker* t = Tracker::instance_if_created();
  if (backends::backend* b = backends::started(t)) b->capture_beginning(*t);
}
}  // namespace

#define CUW_BEGIN_CAPTURE(name, params, args)                      \
  CUW_EXPORT CUresult hook_##name params {                         \
    CUW_REAL(name);                                                \
    cuw::work::capture_begun();                                    \
    capture_notice();                                              \
    const CUresult r = real args;                                  \
    if (r != CUDA_SUCCESS) cuw::work::capture_ended();             \
    return r;                                                      \
  }
CUW_BEGIN_CAPTURE(cuStreamBeginCapture_v2, (CUstream stream, CUstreamCaptureMode mode), (stream, mode))
CUW_BEGIN_CAPTURE(cuStreamBeginCapture_v2_ptsz, (CUstream stream, CUstreamCaptureMode mode), (stream, mode))
CUW_BEGIN_CAPTURE(cuStreamBeginCaptureToGraph,
                  (CUstream stream, CUgraph graph, const CUgraphNode* deps, const CUgraphEdgeData* edges,
                   size_t ndeps, CUstreamCaptureMode mode),
                  (stream, graph, deps, edges, ndeps, mode))
CUW_BEGIN_CAPTURE(cuStreamBeginCaptureToGraph_ptsz,
                  (CUstream stream, CUgraph graph, const CUgraphNode* deps, const CUgraphEdgeData* edges,
                   size_t ndeps, CUstreamCaptureMode mode),
                  (stream, graph, deps, edges, ndeps, mode))
#undef CUW_BEGIN_CAPTURE

#define CUW_END_CAPTURE(name, per_thread)                                  \
  CUW_EXPORT CUresult hook_##name(CUstream stream, CUgraph* graph) {       \
    CUW_REAL(name);                                                        \
    const bool was = cuw::work::stream_capturing(stream, per_thread);     \
    const CUresult r = real(stream, graph);                                \
    if (was) cuw::work::capture_ended();                                   \
    return r;                                                              \
  }
CUW_END_CAPTURE(cuStreamEndCapture, false)
CUW_END_CAPTURE(cuStreamEndCapture_ptsz, true)
#undef CUW_END_CAPTURE

// ---- contexts (CUDA driver API: Context Management, Primary Context Management) --------------
// A call that may destroy a context goes through the backend (context_destroy: it forgets the
// context's pool), around the core's sweep: the context's arrays are taken just before the
// driver call, and what the driver freed with the context is counted freed after it
// (core/context_sweep.hpp).

CUW_EXPORT CUresult hook_cuCtxDestroy_v2(CUcontext ctx) {
  CUW_PROLOGUE(cuCtxDestroy_v2, ctx);
  Tracker* t = ctx ? Tracker::instance_if_created() : nullptr;
  if (!t) {  // nothing counted yet (an importer may have mapped other processes' blocks)
    const CUresult r0 = real(ctx);
    if (r0 == CUDA_SUCCESS) backends::ipc::context_gone(ctx);
    return r0;
  }
  CUresult r = CUDA_SUCCESS;
  ArrayOwners::Snapshot arrays;  // ctx's arrays, taken just before the driver call
  auto destroy = [&] {
    arrays = core::arrays_of(*t, ctx);
    return (r = real(ctx)) == CUDA_SUCCESS;
  };
  if (backends::chosen(*t).context_destroy(*t, [ctx] { return ctx; }, destroy)) {
    backends::ipc::context_gone(ctx);
    cuw::hooks::runtime::contexts_changed();
    core::forget_driver_freed(*t, arrays);
    // CUWARDEN_CAP_SCOPE=process: its memory went with it (on whichever device it was).
    for (int d = 0; d < static_cast<int>(cuw::ring::kMaxDevices); ++d) t->measure_context(d, true);
  }
  return r;
}

namespace {
/// A call that resets or releases device `dev`'s primary context: when it leaves the
/// context destroyed (a reset; the release of its last reference, even when another thread
/// has made the primary active again since: its context ID then differs), the backend
/// forgets the memory the driver freed with it (backend::context_destroy, which for the cache
/// makes the check and the call under its lock: retains wait), and so do the counters
/// (forget_driver_freed).
template <class Call>
CUresult primary_call(CUdevice dev, bool reset, Call&& call) {
  Tracker* t = Tracker::instance_if_created();
  if (!t) {  // nothing counted yet (an importer may have mapped other processes' blocks)
    CUcontext was = backends::ipc::has_imports() ? core::active_primary(dev) : nullptr;
    const CUresult r0 = call();
    if (r0 == CUDA_SUCCESS && was && (reset || core::primary_gone(dev))) backends::ipc::context_gone(was);
    return r0;
  }
  CUresult r = CUDA_SUCCESS;
  CUcontext primary = nullptr;   // the context destroyed, if the call destroys it
  ArrayOwners::Snapshot arrays;  // its arrays, taken just before the call
  unsigned long long id = 0;     // its context ID before the call (0: not known)
  auto which = [&] {
    primary = core::active_primary(dev);
    id = core::context_id(primary);
    return primary;
  };
  auto again = [&] {  // active now, but not the context the call released
    const unsigned long long now_id = core::context_id(primary);
    return id != 0 && now_id != 0 && now_id != id;
  };
  auto run = [&] {
    arrays = core::arrays_of(*t, primary);
    r = call();
    return r == CUDA_SUCCESS && primary != nullptr && (reset || core::primary_gone(dev) || again());
  };
  if (backends::chosen(*t).context_destroy(*t, which, run)) {
    backends::ipc::context_gone(primary);
    cuw::hooks::runtime::contexts_changed();
    core::forget_driver_freed(*t, arrays);
    t->measure_context(dev, true);  // CUWARDEN_CAP_SCOPE=process: its memory went with it
  }
  return r;
}
}  // namespace

CUW_EXPORT CUresult hook_cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  CUW_PROLOGUE(cuDevicePrimaryCtxRetain, pctx, dev);
  Tracker* t = Tracker::instance_if_created();
  backends::backend* b = backends::started(t);
  const CUresult r = b ? b->context_retain(*t, [&] { return real(pctx, dev); })  // not between a release and its check
                       : real(pctx, dev);
  // A context on `dev` (what cudaSetDevice and the runtime's first call make): the process uses
  // that GPU, and has a row there, as nvidia-smi lists it, allocation or not.
  if (r == CUDA_SUCCESS) {
    Tracker& tr = Tracker::get();
    tr.device(dev);
    tr.measure_context(dev, false);  // CUWARDEN_CAP_SCOPE=process: the context now exists
  }
  return r;
}

#define CUW_PRIMARY(name, reset)                                      \
  CUW_EXPORT CUresult hook_##name(CUdevice dev) {                     \
    CUW_PROLOGUE(name, dev);                                          \
    return primary_call(dev, reset, [&] { return real(dev); });       \
  }
CUW_PRIMARY(cuDevicePrimaryCtxReset_v2, true)
CUW_PRIMARY(cuDevicePrimaryCtxReset, true)
CUW_PRIMARY(cuDevicePrimaryCtxRelease_v2, false)
CUW_PRIMARY(cuDevicePrimaryCtxRelease, false)
#undef CUW_PRIMARY

// ---- peer access (CUDA driver API: Peer Context Memory Access) --------------------------------
// A pool that maps its own memory must map it for the peer as well. Programs enable peers at
// start-up, often before their first allocation, and the driver has no query for it later: so
// the notice starts the backend, as a stream's creation does.

namespace {
void peer_notice(CUcontext peer, bool enabled) {
  Tracker& t = Tracker::get();
  backends::with_backend(t, [&](auto& b) { b.peer_access_changed(t, peer, enabled); });
}
}  // namespace

CUW_EXPORT CUresult hook_cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags) {
  CUW_PROLOGUE(cuCtxEnablePeerAccess, peer, flags);
  const CUresult r = real(peer, flags);
  if (r == CUDA_SUCCESS) peer_notice(peer, true);
  return r;
}

CUW_EXPORT CUresult hook_cuCtxDisablePeerAccess(CUcontext peer) {
  CUW_PROLOGUE(cuCtxDisablePeerAccess, peer);
  const CUresult r = real(peer);
  if (r == CUDA_SUCCESS) peer_notice(peer, false);
  return r;
}

// cuwarden interposer: the hooks themselves. Each one: re-entry guard, then the tracker's
// cap check, the real driver call through REAL(fn), the live table, one event.
// The rows of hook_table.hpp and these definitions must match one to one.
#include <cuda.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <optional>
#include <type_traits>
#include <vector>

#include "backends/cache/cache_resource.hpp"
#include "base/fast_clock.hpp"
#include "base/real.hpp"
#include "base/work_epoch.hpp"
#include "core/arrays.hpp"
#include "core/context_sweep.hpp"
#include "core/host.hpp"
#include "core/meminfo.hpp"
#include "core/record.hpp"
#include "core/tracker.hpp"
#include "cuw/attrs.hpp"

using namespace cuw::core;  // the recording API (core/record.hpp and beside it)
namespace ring = cuw::ring;

#define CUW_EXPORT extern "C" __attribute__((visibility("default")))
// Entry points on the allocation hot path: grouped with the tracker's hot code (cuw/attrs.hpp).
#define CUW_EXPORT_HOT extern "C" __attribute__((visibility("default"), hot))

namespace {

// A driver entry point we hook but cannot find: behave like a driver that lacks it.
constexpr CUresult kNoDriver = CUDA_ERROR_NOT_INITIALIZED;

// ---- CUWARDEN_POOL=cache ----------------------------------------------------------------
// Pooled blocks are not in the live table: the cache's own block map is authoritative.
// The counters and events are the passthrough path's (alloc, free, live allocations);
// used / reserved / cached follow the driver allocations the cache makes and gives back.

using cuw::backends::cache_registry;
using cuw::backends::cache_resource;

/// The caches, if the tracker exists and the pool is on (never creates the tracker).
cache_registry* caches_if_any() noexcept {
  Tracker* t = Tracker::instance_if_created();
  return t ? t->cache() : nullptr;
}

/// Hot path: the cache's allocate (a hit: one lock for the free list, the counters and the
/// event; no driver call).
CUresult cache_alloc(cache_resource& c, CUdeviceptr* dptr, size_t bytes) {
  return c.allocate_traced(dptr, bytes, ring::Api::cuMemAlloc, cuw::core::now_ns());
}

/// A free of a pooled block: CUDA_SUCCESS when `dptr` was one (freed, counted, event
/// pushed), CUDA_ERROR_INVALID_VALUE when it lies in the cache's memory but is no live
/// block's start (a second free: never passed to the driver, which would free the slab or
/// block under the cache), CUDA_ERROR_NOT_FOUND when it is not the cache's memory.
CUresult cache_free(cache_registry& reg, CUdeviceptr dptr, ring::Api api, uint64_t aux) {
  return reg.free_traced(dptr, api, aux, cuw::core::now_ns());
}

/// Bytes cuPointerGetAttributes writes for an attribute (CUDA driver API: cuPointerGetAttribute).
size_t attribute_bytes(CUpointer_attribute attr) {
  switch (attr) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
    case CU_POINTER_ATTRIBUTE_MAPPING_SIZE:
    case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR:
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
    case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID:
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
      return 8;
    case CU_POINTER_ATTRIBUTE_P2P_TOKENS:
      return sizeof(CUDA_POINTER_ATTRIBUTE_P2P_TOKENS);
    default:
      return 4;
  }
}

}  // namespace

// ---- allocations -----------------------------------------------------------------------

// The hot paths of cuMemAlloc_v2 and cuMemFree_v2 (defined right after it, so emitted right
// after it) fit in one 4 KiB page, which is where this alignment starts them (the free's
// rare paths, at its end, may run into the next; tests/interposer/check_hot_page.sh): a program that
// allocates and frees synchronously runs the pair with the driver's work in between, which
// leaves the caches, and after an unmapping the TLB, cold; each page of code is one more
// translation to walk (bench/results/2026-11-30-h200-sync-pair.md).
CUW_EXPORT_HOT __attribute__((aligned(4096))) CUresult hook_cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  auto real = REAL(cuMemAlloc_v2);
  if (!real) return kNoDriver;
  Reentry g;
  if (g.nested()) return real(dptr, bytesize);
  Tracker& t = Tracker::get();
  // CUWARDEN_POOL=cache: out of the off path's straight line (a taken branch for the cache).
  if (cache_registry* reg = t.cache(); __builtin_expect(reg != nullptr, 0) && dptr && bytesize != 0) {
    if (cache_resource* c = reg->for_current()) return cache_alloc(*c, dptr, bytesize);
  }
  bool assumed = false;
  const int ordinal = t.allocation_device(&assumed);
  return tracked_alloc(t, ring::Api::cuMemAlloc, ordinal, assumed, bytesize, 0, dptr,
                       [&] { return real(dptr, bytesize); });
}

// (Right after cuMemAlloc_v2: see there.)
CUW_EXPORT_HOT CUresult hook_cuMemFree_v2(CUdeviceptr dptr) {
  auto real = REAL(cuMemFree_v2);
  if (!real) return kNoDriver;
  Reentry g;
  if (g.nested()) return real(dptr);
  Tracker& t = Tracker::get();
  if (cache_registry* reg = t.cache(); __builtin_expect(reg != nullptr, 0) && dptr)
    if (const CUresult r = cache_free(*reg, dptr, ring::Api::cuMemFree, 0); r != CUDA_ERROR_NOT_FOUND) return r;
  return tracked_free(t, t.pointers(), dptr, ring::Api::cuMemFree, 0, [&] { return real(dptr); });
}

CUW_EXPORT CUresult hook_cuMemAllocManaged(CUdeviceptr* dptr, size_t bytesize, unsigned int flags) {
  auto real = REAL(cuMemAllocManaged);
  if (!real) return kNoDriver;
  Reentry g;
  if (g.nested()) return real(dptr, bytesize, flags);
  Tracker& t = Tracker::get();
  return tracked_alloc(t, ring::Api::cuMemAllocManaged, t.current_device(), false, bytesize, 0, dptr,
                       [&] { return real(dptr, bytesize, flags); });
}

CUW_EXPORT CUresult hook_cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pitch, size_t width, size_t height,
                                            unsigned int elem) {
  auto real = REAL(cuMemAllocPitch_v2);
  if (!real) return kNoDriver;
  Reentry g;
  if (g.nested()) return real(dptr, pitch, width, height, elem);
  Tracker& t = Tracker::get();
  const int ordinal = t.current_device();
  // The pitch is only known afterwards: charge an estimate (rows of 512 bytes, the
  // driver's smallest pitch alignment) and settle on the real pitch * height after.
  const uint64_t est = ((static_cast<uint64_t>(width) + 511) & ~uint64_t{511}) * height;
  CUresult r = tracked_alloc(t, ring::Api::cuMemAllocPitch, ordinal, false, est, 0, dptr,
                             [&] { return real(dptr, pitch, width, height, elem); });
  if (r == CUDA_SUCCESS && pitch) {
    const uint64_t actual = static_cast<uint64_t>(*pitch) * height;
    ring::DeviceSlot* d = t.device(ordinal);
    if (d && actual != est) {
      bool adjusted = false;
      {
        std::lock_guard<cuw::spin_lock> lk(t.lock());
        LiveRecord rec;
        if (t.pointers().take(*dptr, &rec)) {
          if (actual > est) t.force_charge_locked(*d, actual - est);
          else t.uncharge_locked(*d, est - actual);
          cuw::core::locked_add(d->reserved, actual - est);  // wraps for a decrease
          rec.bytes = actual;
          t.pointers().insert(*dptr, rec);
          adjusted = true;
        }
      }
      if (adjusted && actual > est) t.job_force_charge(ordinal, actual - est);
      else if (adjusted) t.job_uncharge(ordinal, est - actual);
    }
  }
  return r;
}

#define CUW_ASYNC_ALLOC(name, api)                                                                              \
  CUW_EXPORT_HOT CUresult hook_##name(CUdeviceptr* dptr, size_t bytesize, CUstream stream) {                        \
    auto real = REAL(name);                                                                                      \
    if (!real) return kNoDriver;                                                                                 \
    Reentry g;                                                                                                   \
    if (g.nested()) return real(dptr, bytesize, stream);                                                        \
    Tracker& t = Tracker::get();                                                                                 \
    bool assumed = false;                                                                                        \
    const int ordinal = stream_device(t, stream, &assumed);                                                      \
    uint64_t now = 0;                                                                                            \
    const CUresult r = tracked_alloc(t, api, ordinal, assumed, bytesize, reinterpret_cast<uint64_t>(stream), dptr, \
                                     [&] { return real(dptr, bytesize, stream); }, &now);                      \
    if (r == CUDA_SUCCESS) t.pooled_alloc(ordinal, nullptr, stream, now);                                           \
    return r;                                                                                                    \
  }
CUW_ASYNC_ALLOC(cuMemAllocAsync, ring::Api::cuMemAllocAsync)
CUW_ASYNC_ALLOC(cuMemAllocAsync_ptsz, ring::Api::cuMemAllocAsync)
#undef CUW_ASYNC_ALLOC

#define CUW_POOL_ALLOC(name)                                                                                     \
  CUW_EXPORT_HOT CUresult hook_##name(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool, CUstream stream) {     \
    auto real = REAL(name);                                                                                      \
    if (!real) return kNoDriver;                                                                                 \
    Reentry g;                                                                                                   \
    if (g.nested()) return real(dptr, bytesize, pool, stream);                                                  \
    Tracker& t = Tracker::get();                                                                                 \
    bool assumed = false;                                                                                        \
    const int ordinal = stream_device(t, stream, &assumed);                                                      \
    uint64_t now = 0;                                                                                            \
    const CUresult r = tracked_alloc(t, ring::Api::cuMemAllocFromPoolAsync, ordinal, assumed, bytesize,          \
                                     reinterpret_cast<uint64_t>(stream), dptr,                                   \
                                     [&] { return real(dptr, bytesize, pool, stream); }, &now);                \
    if (r == CUDA_SUCCESS) t.pooled_alloc(ordinal, pool, stream, now);                                              \
    return r;                                                                                                    \
  }
CUW_POOL_ALLOC(cuMemAllocFromPoolAsync)
CUW_POOL_ALLOC(cuMemAllocFromPoolAsync_ptsz)
#undef CUW_POOL_ALLOC

// ---- frees (cuMemFree_v2: with the allocations above) ------------------------------------

namespace {
/// cuMemFreeAsync of a pooled block (a cudaMalloc pointer freed stream-ordered): retired like
/// a cuMemFree (behind events on every stream, which covers `stream`). Not while `stream`
/// is being captured: the free would belong to a graph that runs later, and the block
/// could be reused before it runs; the driver's own answer for memory a graph did not
/// allocate is an error too. Returns true when handled (*r set).
bool cache_free_async_slow(cache_registry* reg, CUdeviceptr dptr, CUstream stream, bool per_thread, CUresult* r);
CUW_INLINE bool cache_free_async(Tracker& t, CUdeviceptr dptr, CUstream stream, bool per_thread, CUresult* r) {
  cache_registry* reg = t.cache();
  if (__builtin_expect(reg == nullptr, 1) || !dptr) return false;
  return cache_free_async_slow(reg, dptr, stream, per_thread, r);
}
__attribute__((noinline)) bool cache_free_async_slow(cache_registry* reg, CUdeviceptr dptr, CUstream stream,
                                                    bool per_thread, CUresult* r) {
  if (cuw::work::capturing()) {
    bool live = false;
    if (cuw::work::stream_capturing(stream, per_thread) && reg->owner_of(dptr, nullptr, &live) && live) {
      *r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
      return true;
    }
  }
  *r = cache_free(*reg, dptr, ring::Api::cuMemFreeAsync, reinterpret_cast<uint64_t>(stream));
  return *r != CUDA_ERROR_NOT_FOUND;
}
}  // namespace

#define CUW_ASYNC_FREE(name, pt)                                                                                 \
  CUW_EXPORT_HOT CUresult hook_##name(CUdeviceptr dptr, CUstream stream) {                                          \
    auto real = REAL(name);                                                                                      \
    if (!real) return kNoDriver;                                                                                 \
    Reentry g;                                                                                                   \
    if (g.nested()) return real(dptr, stream);                                                                  \
    Tracker& t = Tracker::get();                                                                                 \
    if (CUresult cr; cache_free_async(t, dptr, stream, pt, &cr)) return cr;                                     \
    return tracked_free(t, t.pointers(), dptr, ring::Api::cuMemFreeAsync, reinterpret_cast<uint64_t>(stream),  \
                        [&] { return real(dptr, stream); });                                                   \
  }
CUW_ASYNC_FREE(cuMemFreeAsync, false)
CUW_ASYNC_FREE(cuMemFreeAsync_ptsz, true)
#undef CUW_ASYNC_FREE

// ---- stream-ordered pools (CUDA driver API: Stream Ordered Memory Allocator) -------------
// What a pool keeps from the driver changes when it is trimmed or its release threshold
// changes; the device's `reserved` figure follows.

namespace {
/// The device whose figures a pool call changes: the calling thread's current device (a
/// pool's own location is not queryable for every pool kind; programs make the pool's
/// device current before using it).
int pool_device(CUmemoryPool) { return Tracker::get().current_device(); }
}  // namespace

CUW_EXPORT CUresult hook_cuMemPoolTrimTo(CUmemoryPool pool, size_t keep) {
  auto real = REAL(cuMemPoolTrimTo);
  if (!real) return kNoDriver;
  Reentry g;
  const CUresult r = real(pool, keep);
  if (!g.nested() && r == CUDA_SUCCESS) Tracker::get().refresh_pools(pool_device(pool), pool, true);
  return r;
}

CUW_EXPORT CUresult hook_cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value) {
  auto real = REAL(cuMemPoolSetAttribute);
  if (!real) return kNoDriver;
  Reentry g;
  const CUresult r = real(pool, attr, value);
  if (!g.nested() && r == CUDA_SUCCESS && attr == CU_MEMPOOL_ATTR_RELEASE_THRESHOLD)
    Tracker::get().refresh_pools(pool_device(pool), pool, true);
  return r;
}

// ---- virtual memory management (CUDA driver API: Virtual Memory Management) ---------------

CUW_EXPORT CUresult hook_cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                                     const CUmemAllocationProp* prop, unsigned long long flags) {
  auto real = REAL(cuMemCreate);
  if (!real) return kNoDriver;
  Reentry g;
  if (g.nested() || !prop || !handle || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
    return real(handle, size, prop, flags);  // host-located memory: not device memory, not capped
  Tracker& t = Tracker::get();
  return tracked_alloc_in(t, t.handles(), ring::Api::cuMemCreate, prop->location.id, false, size, 0,
                          [&] { return real(handle, size, prop, flags); }, [handle] { return uint64_t{*handle}; },
                          nullptr, ForgetArray{&t});
}

CUW_EXPORT CUresult hook_cuMemRelease(CUmemGenericAllocationHandle handle) {
  auto real = REAL(cuMemRelease);
  if (!real) return kNoDriver;
  Reentry g;
  if (g.nested()) return real(handle);
  Tracker& t = Tracker::get();
  return tracked_free(t, t.handles(), handle, ring::Api::cuMemRelease, 0, [&] { return real(handle); });
}

// ---- pointer queries and IPC of pooled memory (CUDA driver API: Memory Management) --------
// The driver knows the cache's driver allocations, not the blocks in them: for a pooled
// address these answer with the program's allocation (the block), and treat a freed block
// as the driver treats freed memory. Addresses the cache does not hold go to the driver.

CUW_EXPORT CUresult hook_cuMemGetAddressRange_v2(CUdeviceptr* pbase, size_t* psize, CUdeviceptr dptr) {
  auto real = REAL(cuMemGetAddressRange_v2);
  if (!real) return kNoDriver;
  Reentry g;
  if (cache_registry* reg = g.nested() ? nullptr : caches_if_any()) {
    cuw::backends::range rg;
    bool live = false;
    if (reg->owner_of(dptr, &rg, &live)) {
      if (!live) return CUDA_ERROR_NOT_FOUND;
      if (pbase) *pbase = rg.base;
      if (psize) *psize = rg.size;
      return CUDA_SUCCESS;
    }
  }
  return real(pbase, psize, dptr);
}

CUW_EXPORT CUresult hook_cuPointerGetAttribute(void* data, CUpointer_attribute attribute, CUdeviceptr ptr) {
  auto real = REAL(cuPointerGetAttribute);
  if (!real) return kNoDriver;
  Reentry g;
  const CUresult r = real(data, attribute, ptr);
  if (g.nested() || r != CUDA_SUCCESS || !data) return r;
  if (cache_registry* reg = caches_if_any()) {
    cuw::backends::range rg;
    bool live = false;
    if (reg->owner_of(ptr, &rg, &live)) {
      if (!live) return CUDA_ERROR_INVALID_VALUE;
      if (attribute == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR) std::memcpy(data, &rg.base, sizeof rg.base);
      if (attribute == CU_POINTER_ATTRIBUTE_RANGE_SIZE) {
        const size_t n = rg.size;
        std::memcpy(data, &n, sizeof n);
      }
    }
  }
  return r;
}

CUW_EXPORT CUresult hook_cuPointerGetAttributes(unsigned int count, CUpointer_attribute* attributes, void** data,
                                                CUdeviceptr ptr) {
  auto real = REAL(cuPointerGetAttributes);
  if (!real) return kNoDriver;
  Reentry g;
  const CUresult r = real(count, attributes, data, ptr);
  if (g.nested() || r != CUDA_SUCCESS || !attributes || !data) return r;
  if (cache_registry* reg = caches_if_any()) {
    cuw::backends::range rg;
    bool live = false;
    if (reg->owner_of(ptr, &rg, &live)) {
      for (unsigned i = 0; i < count; ++i) {
        if (!data[i]) continue;
        if (!live) {
          std::memset(data[i], 0, attribute_bytes(attributes[i]));  // as for memory CUDA does not know
        } else if (attributes[i] == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR) {
          std::memcpy(data[i], &rg.base, sizeof rg.base);
        } else if (attributes[i] == CU_POINTER_ATTRIBUTE_RANGE_SIZE) {
          const size_t n = rg.size;
          std::memcpy(data[i], &n, sizeof n);
        }
      }
    }
  }
  return r;
}

CUW_EXPORT CUresult hook_cuIpcGetMemHandle(CUipcMemHandle* handle, CUdeviceptr dptr) {
  auto real = REAL(cuIpcGetMemHandle);
  if (!real) return kNoDriver;
  Reentry g;
  if (cache_registry* reg = g.nested() ? nullptr : caches_if_any()) {
    bool live = false;
    if (cache_resource* c = reg->owner_of(dptr, nullptr, &live)) {
      if (!handle) return CUDA_ERROR_INVALID_VALUE;
      const CUresult r = c->ipc_handle(handle, dptr);
      if (r != CUDA_ERROR_NOT_FOUND) return r;
    }
  }
  return real(handle, dptr);
}

// ---- streams, captures and contexts: what the cache must know ------------------------------
// Non-blocking streams get their own event when a batch of frees is sealed; while any
// capture is active the cache records, queries and waits for nothing; a context that goes
// away takes the cache's memory with it.

CUW_EXPORT CUresult hook_cuStreamCreate(CUstream* stream, unsigned int flags) {
  auto real = REAL(cuStreamCreate);
  if (!real) return kNoDriver;
  Reentry g;
  const CUresult r = real(stream, flags);
  if (!g.nested() && r == CUDA_SUCCESS && stream)
    if (cache_registry* reg = Tracker::get().cache()) reg->stream_created(*stream, flags);
  return r;
}

CUW_EXPORT CUresult hook_cuStreamCreateWithPriority(CUstream* stream, unsigned int flags, int priority) {
  auto real = REAL(cuStreamCreateWithPriority);
  if (!real) return kNoDriver;
  Reentry g;
  const CUresult r = real(stream, flags, priority);
  if (!g.nested() && r == CUDA_SUCCESS && stream)
    if (cache_registry* reg = Tracker::get().cache()) reg->stream_created(*stream, flags);
  return r;
}

CUW_EXPORT CUresult hook_cuStreamDestroy_v2(CUstream stream) {
  auto real = REAL(cuStreamDestroy_v2);
  if (!real) return kNoDriver;
  Reentry g;
  if (!g.nested() && stream)
    if (cache_registry* reg = caches_if_any()) reg->stream_destroying(stream);
  return real(stream);
}

namespace {
void capture_begun(CUresult r) {
  if (r == CUDA_SUCCESS) cuw::work::capture_begun();
}
/// Ends one capture in the count if `stream` was capturing (a capture begun through an
/// entry point we do not hook never makes the count negative).
template <class End>
CUresult capture_end(CUstream stream, bool per_thread, End&& end) {
  const bool was = cuw::work::stream_capturing(stream, per_thread);
  const CUresult r = end();
  if (was) cuw::work::capture_ended();
  return r;
}
}  // namespace

// Every way to begin a capture: the driver call, then the count.
#define CUW_BEGIN_CAPTURE(name, params, args) \
  CUW_EXPORT CUresult hook_##name params {     \
    auto real = REAL(name);                     \
    if (!real) return kNoDriver;                \
    const CUresult r = real args;               \
    capture_begun(r);                           \
    return r;                                   \
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

CUW_EXPORT CUresult hook_cuStreamEndCapture(CUstream stream, CUgraph* graph) {
  auto real = REAL(cuStreamEndCapture);
  if (!real) return kNoDriver;
  return capture_end(stream, false, [&] { return real(stream, graph); });
}

CUW_EXPORT CUresult hook_cuStreamEndCapture_ptsz(CUstream stream, CUgraph* graph) {
  auto real = REAL(cuStreamEndCapture_ptsz);
  if (!real) return kNoDriver;
  return capture_end(stream, true, [&] { return real(stream, graph); });
}


CUW_EXPORT CUresult hook_cuCtxDestroy_v2(CUcontext ctx) {
  auto real = REAL(cuCtxDestroy_v2);
  if (!real) return kNoDriver;
  Reentry g;
  Tracker* t = g.nested() || !ctx ? nullptr : Tracker::instance_if_created();
  if (!t) return real(ctx);  // nothing counted yet
  CUresult r = CUDA_SUCCESS;
  ArrayOwners::Snapshot arrays;  // ctx's arrays, taken just before the driver call
  auto destroy = [&] {
    arrays = arrays_of(*t, ctx);
    return (r = real(ctx)) == CUDA_SUCCESS;
  };
  const bool gone = t->cache() ? t->cache()->context_destroy([ctx] { return ctx; }, destroy) : destroy();
  if (gone) forget_driver_freed(*t, arrays);
  return r;
}

namespace {
/// A call that resets or releases device `dev`'s primary context: when it leaves the
/// context destroyed (a reset; the release of its last reference, even when another thread
/// has made the primary active again since: its context ID then differs), the cache forgets
/// the memory the driver freed with it (cache_registry::context_destroy), and so do the
/// counters (forget_driver_freed).
template <class Call>
CUresult primary_call(CUdevice dev, bool reset, Call&& call) {
  Reentry g;
  Tracker* t = g.nested() ? nullptr : Tracker::instance_if_created();
  if (!t) return call();
  CUresult r = CUDA_SUCCESS;
  CUcontext primary = nullptr;  // the context destroyed, if the call destroys it
  ArrayOwners::Snapshot arrays;  // its arrays, taken just before the call
  unsigned long long id = 0;     // its context ID before the call (0: not known)
  auto which = [&] {
    primary = active_primary(dev);
    id = context_id(primary);
    return primary;
  };
  auto again = [&] {  // active now, but not the context the call released
    const unsigned long long now_id = context_id(primary);
    return id != 0 && now_id != 0 && now_id != id;
  };
  auto run = [&] {
    arrays = arrays_of(*t, primary);
    r = call();
    return r == CUDA_SUCCESS && primary != nullptr && (reset || primary_gone(dev) || again());
  };
  bool gone;
  if (cache_registry* reg = t->cache()) {
    gone = reg->context_destroy(which, run);  // the check and the call under its lock (retains wait)
  } else {
    which();
    gone = run();
  }
  if (gone) forget_driver_freed(*t, arrays);
  return r;
}
}  // namespace

CUW_EXPORT CUresult hook_cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  auto real = REAL(cuDevicePrimaryCtxRetain);
  if (!real) return kNoDriver;
  Reentry g;
  cache_registry* reg = g.nested() ? nullptr : caches_if_any();
  if (!reg) return real(pctx, dev);
  return reg->serialized([&] { return real(pctx, dev); });  // not between a release and its check
}

CUW_EXPORT CUresult hook_cuDevicePrimaryCtxReset_v2(CUdevice dev) {
  auto real = REAL(cuDevicePrimaryCtxReset_v2);
  if (!real) return kNoDriver;
  return primary_call(dev, true, [&] { return real(dev); });
}

CUW_EXPORT CUresult hook_cuDevicePrimaryCtxReset(CUdevice dev) {
  auto real = REAL(cuDevicePrimaryCtxReset);
  if (!real) return kNoDriver;
  return primary_call(dev, true, [&] { return real(dev); });
}

CUW_EXPORT CUresult hook_cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  auto real = REAL(cuDevicePrimaryCtxRelease_v2);
  if (!real) return kNoDriver;
  return primary_call(dev, false, [&] { return real(dev); });
}

CUW_EXPORT CUresult hook_cuDevicePrimaryCtxRelease(CUdevice dev) {
  auto real = REAL(cuDevicePrimaryCtxRelease);
  if (!real) return kNoDriver;
  return primary_call(dev, false, [&] { return real(dev); });
}

// ---- CUDA arrays (CUDA driver API: Memory Management, arrays) -----------------------------

CUW_EXPORT CUresult hook_cuArrayCreate_v2(CUarray* handle, const CUDA_ARRAY_DESCRIPTOR* desc) {
  auto real = REAL(cuArrayCreate_v2);
  if (!real) return kNoDriver;
  Reentry g;
  if (g.nested() || !desc || !handle) return real(handle, desc);
  Tracker& t = Tracker::get();
  const int ordinal = t.current_device();
  const uint64_t bytes = array_bytes(desc->Width, desc->Height, 0, desc->Format, desc->NumChannels, 1, 0);
  return tracked_array_create(t, ring::Api::cuArrayCreate, ordinal, bytes, [&] { return real(handle, desc); },
                              handle);
}

CUW_EXPORT CUresult hook_cuArray3DCreate_v2(CUarray* handle, const CUDA_ARRAY3D_DESCRIPTOR* desc) {
  auto real = REAL(cuArray3DCreate_v2);
  if (!real) return kNoDriver;
  Reentry g;
  if (g.nested() || !desc || !handle || !array_takes_memory(desc->Flags)) return real(handle, desc);
  Tracker& t = Tracker::get();
  const uint64_t bytes =
      array_bytes(desc->Width, desc->Height, desc->Depth, desc->Format, desc->NumChannels, 1, desc->Flags);
  return tracked_array_create(t, ring::Api::cuArray3DCreate, t.current_device(), bytes,
                              [&] { return real(handle, desc); }, handle);
}

CUW_EXPORT CUresult hook_cuMipmappedArrayCreate(CUmipmappedArray* handle, const CUDA_ARRAY3D_DESCRIPTOR* desc,
                                                unsigned int levels) {
  auto real = REAL(cuMipmappedArrayCreate);
  if (!real) return kNoDriver;
  Reentry g;
  if (g.nested() || !desc || !handle || !array_takes_memory(desc->Flags)) return real(handle, desc, levels);
  Tracker& t = Tracker::get();
  const uint64_t bytes =
      array_bytes(desc->Width, desc->Height, desc->Depth, desc->Format, desc->NumChannels, levels, desc->Flags);
  return tracked_array_create(t, ring::Api::cuMipmappedArrayCreate, t.current_device(), bytes,
                              [&] { return real(handle, desc, levels); }, handle);
}

CUW_EXPORT CUresult hook_cuArrayDestroy(CUarray handle) {
  auto real = REAL(cuArrayDestroy);
  if (!real) return kNoDriver;
  Reentry g;
  if (g.nested()) return real(handle);
  Tracker& t = Tracker::get();
  return tracked_array_destroy(t, reinterpret_cast<uint64_t>(handle), ring::Api::cuArrayDestroy,
                               [&] { return real(handle); });
}

CUW_EXPORT CUresult hook_cuMipmappedArrayDestroy(CUmipmappedArray handle) {
  auto real = REAL(cuMipmappedArrayDestroy);
  if (!real) return kNoDriver;
  Reentry g;
  if (g.nested()) return real(handle);
  Tracker& t = Tracker::get();
  return tracked_array_destroy(t, reinterpret_cast<uint64_t>(handle), ring::Api::cuMipmappedArrayDestroy,
                               [&] { return real(handle); });
}

// ---- graph memory nodes (CUDA driver API: Graph Management) -------------------------------
// Counted while the graph holds the allocation: from the allocation node's creation to the
// free node's (or to cuMemFree(Async) of its address outside the graph). Stream capture of
// cudaMallocAsync reaches cuMemAllocAsync and is counted there.

CUW_EXPORT CUresult hook_cuGraphAddMemAllocNode(CUgraphNode* node, CUgraph graph, const CUgraphNode* deps,
                                                size_t ndeps, CUDA_MEM_ALLOC_NODE_PARAMS* params) {
  auto real = REAL(cuGraphAddMemAllocNode);
  if (!real) return kNoDriver;
  Reentry g;
  if (g.nested() || !params || params->poolProps.location.type != CU_MEM_LOCATION_TYPE_DEVICE)
    return real(node, graph, deps, ndeps, params);
  Tracker& t = Tracker::get();
  return tracked_alloc_in(t, t.pointers(), ring::Api::cuGraphMemAlloc, params->poolProps.location.id, false,
                          params->bytesize, 0, [&] { return real(node, graph, deps, ndeps, params); },
                          [params] { return uint64_t{params->dptr}; });
}

CUW_EXPORT CUresult hook_cuGraphAddMemFreeNode(CUgraphNode* node, CUgraph graph, const CUgraphNode* deps,
                                               size_t ndeps, CUdeviceptr dptr) {
  auto real = REAL(cuGraphAddMemFreeNode);
  if (!real) return kNoDriver;
  Reentry g;
  if (g.nested()) return real(node, graph, deps, ndeps, dptr);
  Tracker& t = Tracker::get();
  return tracked_free(t, t.pointers(), dptr, ring::Api::cuMemFree, 0,
                      [&] { return real(node, graph, deps, ndeps, dptr); });
}

// ---- pinned host memory: tracked and shown, never capped --------------------------------

CUW_EXPORT CUresult hook_cuMemHostAlloc(void** pp, size_t bytesize, unsigned int flags) {
  auto real = REAL(cuMemHostAlloc);
  if (!real) return kNoDriver;
  Reentry g;
  if (g.nested()) return real(pp, bytesize, flags);
  return tracked_host_alloc(ring::Api::cuMemHostAlloc, bytesize, [&] { return real(pp, bytesize, flags); }, pp);
}

CUW_EXPORT CUresult hook_cuMemAllocHost_v2(void** pp, size_t bytesize) {
  auto real = REAL(cuMemAllocHost_v2);
  if (!real) return kNoDriver;
  Reentry g;
  if (g.nested()) return real(pp, bytesize);
  return tracked_host_alloc(ring::Api::cuMemAllocHost, bytesize, [&] { return real(pp, bytesize); }, pp);
}

CUW_EXPORT CUresult hook_cuMemHostRegister_v2(void* p, size_t bytesize, unsigned int flags) {
  auto real = REAL(cuMemHostRegister_v2);
  if (!real) return kNoDriver;
  Reentry g;
  if (g.nested()) return real(p, bytesize, flags);
  return tracked_host_alloc(ring::Api::cuMemHostAlloc, bytesize, [&] { return real(p, bytesize, flags); }, &p);
}

CUW_EXPORT CUresult hook_cuMemFreeHost(void* p) {
  auto real = REAL(cuMemFreeHost);
  if (!real) return kNoDriver;
  Reentry g;
  if (g.nested()) return real(p);
  return tracked_host_free(ring::Api::cuMemFreeHost, p, [&] { return real(p); });
}

CUW_EXPORT CUresult hook_cuMemHostUnregister(void* p) {
  auto real = REAL(cuMemHostUnregister);
  if (!real) return kNoDriver;
  Reentry g;
  if (g.nested()) return real(p);
  return tracked_host_free(ring::Api::cuMemFreeHost, p, [&] { return real(p); });
}

// ---- reported sizes --------------------------------------------------------------------

CUW_EXPORT CUresult hook_cuMemGetInfo_v2(size_t* free_bytes, size_t* total_bytes) {
  auto real = REAL(cuMemGetInfo_v2);
  if (!real) return kNoDriver;
  Reentry g;
  const CUresult r = real(free_bytes, total_bytes);
  if (g.nested() || r != CUDA_SUCCESS) return r;
  Tracker& t = Tracker::get();
  if (t.config().meminfo_physical) return r;
  const int ordinal = t.current_device();
  ring::DeviceSlot* d = t.device(ordinal);
  if (!d) return r;
  t.refresh_pools(ordinal, nullptr, true, false);  // keep `reserved` current for whoever watches
  const uint64_t physical = d->physical_total ? d->physical_total : (total_bytes ? *total_bytes : ~0ULL);
  uint64_t total, free_b;
  if (!capped_view(t, *d, physical, free_bytes ? *free_bytes : ~0ULL, &total, &free_b)) {
    // Uncapped: the driver's figures, plus what the cache keeps for reuse (free for the program).
    const uint64_t cached = d->cached.load(std::memory_order_relaxed);
    if (free_bytes && cached) *free_bytes += std::min<uint64_t>(cached, physical - std::min<uint64_t>(*free_bytes, physical));
    return r;
  }
  if (total_bytes) *total_bytes = total;
  if (free_bytes) *free_bytes = free_b;
  return r;
}

CUW_EXPORT CUresult hook_cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
  auto real = REAL(cuDeviceTotalMem_v2);
  if (!real) return kNoDriver;
  Reentry g;
  const CUresult r = real(bytes, dev);
  if (g.nested() || r != CUDA_SUCCESS || !bytes) return r;
  Tracker& t = Tracker::get();
  if (t.config().meminfo_physical) return r;
  ring::DeviceSlot* d = t.device(dev);
  if (!d) return r;
  const uint64_t limit = d->limit.load(std::memory_order_relaxed);
  if (limit != ring::kNoLimit && limit < *bytes) *bytes = limit;
  uint64_t job_cap = 0, job_used = 0;
  if (t.job_view(dev, &job_cap, &job_used) && job_cap < *bytes) *bytes = job_cap;
  return r;
}

// ---- entry points that queue GPU work (work_hooks.inc, generated) -------------------------
// Each calls the driver, then counts the work for CUWARDEN_POOL=cache (cache_resource.hpp,
// "the fast case"), failed calls included: a batch may have queued part of its work.

#define CUW_WORK_HOOK(ret, name, params, args, base, version, pts, lib) \
  CUW_EXPORT ret hook_##name params {                                   \
    auto real = REAL(name);                                             \
    if (!real) return kNoDriver;                                        \
    const ret r = real args;                                            \
    cuw::work::queued();                                                   \
    return r;                                                           \
  }
CUW_WORK_HOOKS(CUW_WORK_HOOK)
#undef CUW_WORK_HOOK

// ---- entry-point lookup (CUDA driver API: Driver Entry Point Access) ---------------------

CUW_EXPORT CUresult hook_cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags) {
  auto real = REAL(cuGetProcAddress);
  if (!real) return kNoDriver;
  const CUresult r = real(symbol, pfn, cudaVersion, flags);
  if (r == CUDA_SUCCESS && pfn && *pfn) *pfn = cuw::hook::redirect_proc(symbol, *pfn, cudaVersion, flags);
  return r;
}

CUW_EXPORT CUresult hook_cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                                             CUdriverProcAddressQueryResult* status) {
  auto real = REAL(cuGetProcAddress_v2);
  if (!real) return kNoDriver;
  const CUresult r = real(symbol, pfn, cudaVersion, flags, status);
  if (r == CUDA_SUCCESS && pfn && *pfn) *pfn = cuw::hook::redirect_proc(symbol, *pfn, cudaVersion, flags);
  return r;
}


// ---- NVML (NVML API reference: Device Queries, nvmlDeviceGetMemoryInfo) ------------------
// Reports the cap when the process has one, in agreement with cuMemGetInfo. NVML's devices
// are physical; they are matched to the process's CUDA ordinals by UUID. Only a process
// that already used CUDA has caps to report: NVML alone never creates a ring.

namespace {

constexpr cuw_nvmlReturn_t kNvmlSuccess = 0;
constexpr cuw_nvmlReturn_t kNvmlFunctionNotFound = 13;  // NVML_ERROR_FUNCTION_NOT_FOUND

/// The CUDA device slot of an NVML device, or nullptr (no tracker, no cap, no match).
ring::DeviceSlot* slot_for_nvml(cuw_nvmlDevice_t dev) {
  Tracker* t = Tracker::instance_if_created();
  if (!t || t->config().meminfo_physical) return nullptr;
  using uuid_fn = cuw_nvmlReturn_t (*)(cuw_nvmlDevice_t, char*, unsigned int);
  static auto get_uuid = reinterpret_cast<uuid_fn>(cuw::hook::nvml_symbol("nvmlDeviceGetUUID"));
  char uuid[96] = {};
  if (!get_uuid || get_uuid(dev, uuid, sizeof uuid) != kNvmlSuccess) return nullptr;
  // "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" -> 16 bytes
  uint8_t bytes[16];
  int n = 0;
  for (const char* c = std::strncmp(uuid, "GPU-", 4) == 0 ? uuid + 4 : uuid; *c && n < 32; ++c) {
    int v = (*c >= '0' && *c <= '9') ? *c - '0' : (*c >= 'a' && *c <= 'f') ? *c - 'a' + 10
            : (*c >= 'A' && *c <= 'F') ? *c - 'A' + 10 : -1;
    if (v < 0) continue;
    if (n % 2 == 0) bytes[n / 2] = static_cast<uint8_t>(v << 4);
    else bytes[n / 2] = static_cast<uint8_t>(bytes[n / 2] | v);
    ++n;
  }
  if (n != 32) return nullptr;
  for (uint32_t o = 0; o < ring::kMaxDevices; ++o) {
    ring::DeviceSlot& d = t->header().devices[o];
    if (d.present.load(std::memory_order_acquire) && std::memcmp(d.uuid, bytes, 16) == 0) return &d;
  }
  return nullptr;
}

}  // namespace

namespace {

/// Both NVML memory structs: total/free/used from the capped view; v2's driver-reserved
/// share is folded into used, so that used + free + reserved == total still holds.
template <class Memory>
cuw_nvmlReturn_t nvml_memory(cuw_nvmlReturn_t (*real)(cuw_nvmlDevice_t, Memory*), cuw_nvmlDevice_t device,
                             Memory* memory) {
  if (!real) return kNvmlFunctionNotFound;
  const cuw_nvmlReturn_t r = real(device, memory);
  if (r != kNvmlSuccess || !memory) return r;
  if (ring::DeviceSlot* d = slot_for_nvml(device)) {
    uint64_t total, free_b;
    if (capped_view(*Tracker::instance_if_created(), *d, memory->total, memory->free, &total, &free_b)) {
      memory->total = total;
      memory->free = free_b;
      memory->used = total - free_b;
      if constexpr (std::is_same_v<Memory, cuw_nvmlMemory_v2_t>) memory->reserved = 0;
    }
  }
  return r;
}

}  // namespace

CUW_EXPORT cuw_nvmlReturn_t hook_nvmlDeviceGetMemoryInfo(cuw_nvmlDevice_t device, cuw_nvmlMemory_t* memory) {
  return nvml_memory(REAL(nvmlDeviceGetMemoryInfo), device, memory);
}

CUW_EXPORT cuw_nvmlReturn_t hook_nvmlDeviceGetMemoryInfo_v2(cuw_nvmlDevice_t device, cuw_nvmlMemory_v2_t* memory) {
  return nvml_memory(REAL(nvmlDeviceGetMemoryInfo_v2), device, memory);
}

// ---- process exit ----------------------------------------------------------------------

__attribute__((destructor)) static void cuw_on_unload() {
  if (Tracker* t = Tracker::instance_if_created()) t->on_exit();
}

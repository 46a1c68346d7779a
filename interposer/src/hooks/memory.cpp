// cuwarden interposer hooks: the other ways a program holds GPU memory: the program's own
// stream-ordered pools, physical memory of virtual memory management, graph memory nodes,
// CUDA arrays, and pinned host memory (tracked and shown, never capped). All go to the core.
#include <cuda.h>

#include <cstdint>

#include "base/real.hpp"
#include "core/arrays.hpp"
#include "core/host.hpp"
#include "core/record.hpp"
#include "core/tracker.hpp"
#include "cuw/ring.hpp"
#include "hooks/prologue.hpp"

using cuw::core::Tracker;
namespace core = cuw::core;
namespace ring = cuw::ring;

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
  CUW_PROLOGUE(cuMemPoolTrimTo, pool, keep);
  const CUresult r = real(pool, keep);
  if (r == CUDA_SUCCESS) Tracker::get().refresh_pools(pool_device(pool), pool, true);
  return r;
}

CUW_EXPORT CUresult hook_cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value) {
  CUW_PROLOGUE(cuMemPoolSetAttribute, pool, attr, value);
  const CUresult r = real(pool, attr, value);
  if (r == CUDA_SUCCESS && attr == CU_MEMPOOL_ATTR_RELEASE_THRESHOLD)
    Tracker::get().refresh_pools(pool_device(pool), pool, true);
  return r;
}

// ---- virtual memory management (CUDA driver API: Virtual Memory Management) ---------------

CUW_EXPORT CUresult hook_cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                                     const CUmemAllocationProp* prop, unsigned long long flags) {
  CUW_PROLOGUE(cuMemCreate, handle, size, prop, flags);
  if (!prop || !handle || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
    return real(handle, size, prop, flags);  // host-located memory: not device memory, not capped
  Tracker& t = Tracker::get();
  const core::SiteScope site(t, size);
  auto attempt = [&] {
    return core::tracked_alloc_in(
        t, t.handles(), ring::Api::cuMemCreate, prop->location.id, false, size, 0,
        [&] { return real(handle, size, prop, flags); }, [handle] { return uint64_t{*handle}; }, nullptr,
        core::ForgetArray{&t});
  };
  // The driver out of memory: the daemon may make room (core/room.hpp), as for cuMemAlloc.
  const CUresult r = core::again_after_room(t, size, attempt(), attempt);
  // Made to be exportable as a shareable handle: whether it was exported, and so whether the
  // checkpoint can carry it, is not seen here (cuMemExportToShareableHandle is not hooked);
  // the other end, cuMemImportFromShareableHandle, counts below.
  if (r == CUDA_SUCCESS && prop->requestedHandleTypes != CU_MEM_HANDLE_TYPE_NONE)
    core::count_uncarried(t, prop->location.id, &ring::DeviceSlot::shared_handles);
  return r;
}

// A handle of another process's memory: the checkpoint cannot carry it, so it is counted on
// the device that holds the memory (the handle's location; the current device if the driver
// does not say). The memory is the exporter's, counted there: nothing is charged here.
CUW_EXPORT CUresult hook_cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* handle, void* osHandle,
                                                        CUmemAllocationHandleType type) {
  CUW_PROLOGUE(cuMemImportFromShareableHandle, handle, osHandle, type);
  const CUresult r = real(handle, osHandle, type);
  if (r != CUDA_SUCCESS || !handle) return r;
  Tracker& t = Tracker::get();
  using props_fn = CUresult (*)(CUmemAllocationProp*, CUmemGenericAllocationHandle);
  static auto props = reinterpret_cast<props_fn>(cuw::hook::driver_symbol("cuMemGetAllocationPropertiesFromHandle"));
  CUmemAllocationProp prop{};
  const bool located = props && props(&prop, *handle) == CUDA_SUCCESS &&
                       prop.location.type == CU_MEM_LOCATION_TYPE_DEVICE;
  const int ordinal = located ? prop.location.id : t.current_device();
  core::count_uncarried(t, ordinal < 0 ? 0 : ordinal, &ring::DeviceSlot::shared_handles);
  return r;
}

CUW_EXPORT CUresult hook_cuMemRelease(CUmemGenericAllocationHandle handle) {
  CUW_PROLOGUE(cuMemRelease, handle);
  Tracker& t = Tracker::get();
  return core::tracked_free(t, t.handles(), handle, ring::Api::cuMemRelease, 0, [&] { return real(handle); });
}

// ---- graph memory nodes (CUDA driver API: Graph Management) -------------------------------
// Counted while the graph holds the allocation: from the allocation node's creation to the
// free node's (or to cuMemFree(Async) of its address outside the graph). Stream capture of
// cudaMallocAsync reaches cuMemAllocAsync and is counted there.

CUW_EXPORT CUresult hook_cuGraphAddMemAllocNode(CUgraphNode* node, CUgraph graph, const CUgraphNode* deps,
                                                size_t ndeps, CUDA_MEM_ALLOC_NODE_PARAMS* params) {
  CUW_PROLOGUE(cuGraphAddMemAllocNode, node, graph, deps, ndeps, params);
  if (!params || params->poolProps.location.type != CU_MEM_LOCATION_TYPE_DEVICE)
    return real(node, graph, deps, ndeps, params);
  Tracker& t = Tracker::get();
  const core::SiteScope site(t, params->bytesize);
  return core::tracked_alloc_in(t, t.pointers(), ring::Api::cuGraphMemAlloc, params->poolProps.location.id, false,
                                params->bytesize, 0, [&] { return real(node, graph, deps, ndeps, params); },
                                [params] { return uint64_t{params->dptr}; });
}

CUW_EXPORT CUresult hook_cuGraphAddMemFreeNode(CUgraphNode* node, CUgraph graph, const CUgraphNode* deps,
                                               size_t ndeps, CUdeviceptr dptr) {
  CUW_PROLOGUE(cuGraphAddMemFreeNode, node, graph, deps, ndeps, dptr);
  Tracker& t = Tracker::get();
  return core::tracked_free(t, t.pointers(), dptr, ring::Api::cuMemFree, 0,
                            [&] { return real(node, graph, deps, ndeps, dptr); });
}

// ---- CUDA arrays (CUDA driver API: Memory Management, arrays) -----------------------------

CUW_EXPORT CUresult hook_cuArrayCreate_v2(CUarray* handle, const CUDA_ARRAY_DESCRIPTOR* desc) {
  CUW_PROLOGUE(cuArrayCreate_v2, handle, desc);
  if (!desc || !handle) return real(handle, desc);
  Tracker& t = Tracker::get();
  const core::SiteScope site(t);
  const int ordinal = t.current_device();
  const uint64_t bytes = core::array_bytes(desc->Width, desc->Height, 0, desc->Format, desc->NumChannels, 1, 0);
  return core::tracked_array_create(t, ring::Api::cuArrayCreate, ordinal, bytes,
                                    [&] { return real(handle, desc); }, handle);
}

CUW_EXPORT CUresult hook_cuArray3DCreate_v2(CUarray* handle, const CUDA_ARRAY3D_DESCRIPTOR* desc) {
  CUW_PROLOGUE(cuArray3DCreate_v2, handle, desc);
  if (!desc || !handle || !core::array_takes_memory(desc->Flags)) return real(handle, desc);
  Tracker& t = Tracker::get();
  const core::SiteScope site(t);
  const uint64_t bytes =
      core::array_bytes(desc->Width, desc->Height, desc->Depth, desc->Format, desc->NumChannels, 1, desc->Flags);
  return core::tracked_array_create(t, ring::Api::cuArray3DCreate, t.current_device(), bytes,
                                    [&] { return real(handle, desc); }, handle);
}

CUW_EXPORT CUresult hook_cuMipmappedArrayCreate(CUmipmappedArray* handle, const CUDA_ARRAY3D_DESCRIPTOR* desc,
                                                unsigned int levels) {
  CUW_PROLOGUE(cuMipmappedArrayCreate, handle, desc, levels);
  if (!desc || !handle || !core::array_takes_memory(desc->Flags)) return real(handle, desc, levels);
  Tracker& t = Tracker::get();
  const core::SiteScope site(t);
  const uint64_t bytes = core::array_bytes(desc->Width, desc->Height, desc->Depth, desc->Format, desc->NumChannels,
                                           levels, desc->Flags);
  return core::tracked_array_create(t, ring::Api::cuMipmappedArrayCreate, t.current_device(), bytes,
                                    [&] { return real(handle, desc, levels); }, handle);
}

CUW_EXPORT CUresult hook_cuArrayDestroy(CUarray handle) {
  CUW_PROLOGUE(cuArrayDestroy, handle);
  return core::tracked_array_destroy(Tracker::get(), reinterpret_cast<uint64_t>(handle), ring::Api::cuArrayDestroy,
                                     [&] { return real(handle); });
}

CUW_EXPORT CUresult hook_cuMipmappedArrayDestroy(CUmipmappedArray handle) {
  CUW_PROLOGUE(cuMipmappedArrayDestroy, handle);
  return core::tracked_array_destroy(Tracker::get(), reinterpret_cast<uint64_t>(handle),
                                     ring::Api::cuMipmappedArrayDestroy, [&] { return real(handle); });
}

// ---- pinned host memory: tracked and shown, never capped --------------------------------

CUW_EXPORT CUresult hook_cuMemHostAlloc(void** pp, size_t bytesize, unsigned int flags) {
  CUW_PROLOGUE(cuMemHostAlloc, pp, bytesize, flags);
  const core::SiteScope site(Tracker::get(), bytesize);
  return core::tracked_host_alloc(ring::Api::cuMemHostAlloc, bytesize, [&] { return real(pp, bytesize, flags); },
                                  pp);
}

CUW_EXPORT CUresult hook_cuMemAllocHost_v2(void** pp, size_t bytesize) {
  CUW_PROLOGUE(cuMemAllocHost_v2, pp, bytesize);
  const core::SiteScope site(Tracker::get());
  return core::tracked_host_alloc(ring::Api::cuMemAllocHost, bytesize, [&] { return real(pp, bytesize); }, pp);
}

CUW_EXPORT CUresult hook_cuMemHostRegister_v2(void* p, size_t bytesize, unsigned int flags) {
  CUW_PROLOGUE(cuMemHostRegister_v2, p, bytesize, flags);
  const core::SiteScope site(Tracker::get(), bytesize);
  return core::tracked_host_alloc(ring::Api::cuMemHostAlloc, bytesize, [&] { return real(p, bytesize, flags); },
                                  &p);
}

CUW_EXPORT CUresult hook_cuMemFreeHost(void* p) {
  CUW_PROLOGUE(cuMemFreeHost, p);
  return core::tracked_host_free(ring::Api::cuMemFreeHost, p, [&] { return real(p); });
}

CUW_EXPORT CUresult hook_cuMemHostUnregister(void* p) {
  CUW_PROLOGUE(cuMemHostUnregister, p);
  return core::tracked_host_free(ring::Api::cuMemFreeHost, p, [&] { return real(p); });
}

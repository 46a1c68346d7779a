// cuwarden interposer: THE table of hooked driver entry points.
//
// How to add an interceptor (three steps, after LLVM's interception library):
//   1. Add one X(...) line below: return type, exported name, parameter list, argument list,
//      the base name cuGetProcAddress is asked for, and the CUDA version that introduced
//      this ABI variant, and whether it is the per-thread-stream variant (_ptsz/_ptds).
//   2. Write `hook_<name>` in the hooks/ file of its family (hooks/prologue.hpp: CUW_PROLOGUE
//      gives `real`, the driver's function).
//   3. Add the exported name to interposer/exports.map.in (a test checks the two agree).
// Entry points that queue GPU work are not written here: work_hooks.inc is generated from
// the driver's export list (interposer/gen_work_hooks.py) and its names are exported by
// CMake.
// Everything else (dlsym redirection, cuGetProcAddress redirection, real-pointer
// resolution) is generated from this table; names not listed pass through untouched.
#pragma once

#include <cuda.h>

// cuda.h renames these to their _v2 variants; the table names both variants itself. In every
// file that includes this one, these names then mean the oldest ABI: call the driver through
// REAL(name) (base/real.hpp), never by these names.
#undef cuGetProcAddress
#undef cuDevicePrimaryCtxRelease
#undef cuDevicePrimaryCtxReset
#undef cuIpcOpenMemHandle

// CUW_WORK_HOOKS: every entry point that queues GPU work (generated, see the file).
#include "base/work_hooks.inc"

// X(ret, name, params, args, base, version, per_thread, lib)
//   lib: 0 = libcuda.so.1 (driver API), 1 = libnvidia-ml.so.1 (NVML; base/version unused)
#define CUW_HOOKS(X)                                                                                            \
  X(CUresult, cuMemAlloc_v2, (CUdeviceptr * dptr, size_t bytesize), (dptr, bytesize), "cuMemAlloc", 3020, 0, 0) \
  X(CUresult, cuMemFree_v2, (CUdeviceptr dptr), (dptr), "cuMemFree", 3020, 0, 0)                                \
  X(CUresult, cuMemAllocAsync, (CUdeviceptr * dptr, size_t bytesize, CUstream stream),                          \
    (dptr, bytesize, stream), "cuMemAllocAsync", 11020, 0, 0)                                                   \
  X(CUresult, cuMemFreeAsync, (CUdeviceptr dptr, CUstream stream), (dptr, stream), "cuMemFreeAsync", 11020, 0, \
    0)                                                                                                           \
  X(CUresult, cuMemAllocAsync_ptsz, (CUdeviceptr * dptr, size_t bytesize, CUstream stream),                     \
    (dptr, bytesize, stream), "cuMemAllocAsync", 11020, 1, 0)                                                   \
  X(CUresult, cuMemFreeAsync_ptsz, (CUdeviceptr dptr, CUstream stream), (dptr, stream), "cuMemFreeAsync",      \
    11020, 1, 0)                                                                                                 \
  X(CUresult, cuMemAllocFromPoolAsync,                                                                           \
    (CUdeviceptr * dptr, size_t bytesize, CUmemoryPool pool, CUstream stream), (dptr, bytesize, pool, stream), \
    "cuMemAllocFromPoolAsync", 11020, 0, 0)                                                                     \
  X(CUresult, cuMemAllocPitch_v2,                                                                                \
    (CUdeviceptr * dptr, size_t * pitch, size_t width, size_t height, unsigned int elem),                     \
    (dptr, pitch, width, height, elem), "cuMemAllocPitch", 3020, 0, 0)                                         \
  X(CUresult, cuMemAllocManaged, (CUdeviceptr * dptr, size_t bytesize, unsigned int flags),                    \
    (dptr, bytesize, flags), "cuMemAllocManaged", 6000, 0, 0)                                                   \
  X(CUresult, cuMemAllocFromPoolAsync_ptsz,                                                                      \
    (CUdeviceptr * dptr, size_t bytesize, CUmemoryPool pool, CUstream stream), (dptr, bytesize, pool, stream), \
    "cuMemAllocFromPoolAsync", 11020, 1, 0)                                                                     \
  X(CUresult, cuMemPoolTrimTo, (CUmemoryPool pool, size_t keep), (pool, keep), "cuMemPoolTrimTo", 11020, 0, 0)  \
  X(CUresult, cuMemPoolSetAttribute, (CUmemoryPool pool, CUmemPool_attribute attr, void* value),               \
    (pool, attr, value), "cuMemPoolSetAttribute", 11020, 0, 0)                                                  \
  X(CUresult, cuMemCreate,                                                                                       \
    (CUmemGenericAllocationHandle * handle, size_t size, const CUmemAllocationProp* prop,                      \
     unsigned long long flags),                                                                                  \
    (handle, size, prop, flags), "cuMemCreate", 10020, 0, 0)                                                    \
  X(CUresult, cuMemRelease, (CUmemGenericAllocationHandle handle), (handle), "cuMemRelease", 10020, 0, 0)      \
  X(CUresult, cuMemImportFromShareableHandle,                                                                    \
    (CUmemGenericAllocationHandle * handle, void* osHandle, CUmemAllocationHandleType type),                    \
    (handle, osHandle, type), "cuMemImportFromShareableHandle", 10020, 0, 0)                                    \
  X(CUresult, cuArrayCreate_v2, (CUarray * handle, const CUDA_ARRAY_DESCRIPTOR* desc), (handle, desc),         \
    "cuArrayCreate", 3020, 0, 0)                                                                                \
  X(CUresult, cuArray3DCreate_v2, (CUarray * handle, const CUDA_ARRAY3D_DESCRIPTOR* desc), (handle, desc),     \
    "cuArray3DCreate", 3020, 0, 0)                                                                              \
  X(CUresult, cuMipmappedArrayCreate,                                                                            \
    (CUmipmappedArray * handle, const CUDA_ARRAY3D_DESCRIPTOR* desc, unsigned int levels),                     \
    (handle, desc, levels), "cuMipmappedArrayCreate", 5000, 0, 0)                                               \
  X(CUresult, cuArrayDestroy, (CUarray handle), (handle), "cuArrayDestroy", 2000, 0, 0)                        \
  X(CUresult, cuMipmappedArrayDestroy, (CUmipmappedArray handle), (handle), "cuMipmappedArrayDestroy", 5000,   \
    0, 0)                                                                                                        \
  X(CUresult, cuGraphAddMemAllocNode,                                                                            \
    (CUgraphNode * node, CUgraph graph, const CUgraphNode* deps, size_t ndeps,                                 \
     CUDA_MEM_ALLOC_NODE_PARAMS* params),                                                                       \
    (node, graph, deps, ndeps, params), "cuGraphAddMemAllocNode", 11040, 0, 0)                                  \
  X(CUresult, cuGraphAddMemFreeNode,                                                                             \
    (CUgraphNode * node, CUgraph graph, const CUgraphNode* deps, size_t ndeps, CUdeviceptr dptr),              \
    (node, graph, deps, ndeps, dptr), "cuGraphAddMemFreeNode", 11040, 0, 0)                                     \
  X(CUresult, cuMemHostAlloc, (void** pp, size_t bytesize, unsigned int flags), (pp, bytesize, flags),          \
    "cuMemHostAlloc", 2020, 0, 0)                                                                               \
  X(CUresult, cuMemAllocHost_v2, (void** pp, size_t bytesize), (pp, bytesize), "cuMemAllocHost", 3020, 0, 0)   \
  X(CUresult, cuMemFreeHost, (void* p), (p), "cuMemFreeHost", 2000, 0, 0)                                       \
  X(CUresult, cuMemHostRegister_v2, (void* p, size_t bytesize, unsigned int flags), (p, bytesize, flags),       \
    "cuMemHostRegister", 6050, 0, 0)                                                                            \
  X(CUresult, cuMemHostUnregister, (void* p), (p), "cuMemHostUnregister", 4000, 0, 0)                           \
  X(CUresult, cuMemGetInfo_v2, (size_t * free_bytes, size_t * total_bytes), (free_bytes, total_bytes),          \
    "cuMemGetInfo", 3020, 0, 0)                                                                                 \
  X(CUresult, cuDeviceTotalMem_v2, (size_t * bytes, CUdevice dev), (bytes, dev), "cuDeviceTotalMem", 3020, 0,  \
    0)                                                                                                           \
  X(CUresult, cuGetProcAddress,                                                                                  \
    (const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags), (symbol, pfn, cudaVersion, flags),   \
    "cuGetProcAddress", 11030, 0, 0)                                                                            \
  X(CUresult, cuGetProcAddress_v2,                                                                               \
    (const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,                                        \
     CUdriverProcAddressQueryResult* status),                                                                   \
    (symbol, pfn, cudaVersion, flags, status), "cuGetProcAddress", 12000, 0, 0)                                 \
  X(CUresult, cuMemGetAddressRange_v2, (CUdeviceptr * pbase, size_t * psize, CUdeviceptr dptr),                \
    (pbase, psize, dptr), "cuMemGetAddressRange", 3020, 0, 0)                                                   \
  X(CUresult, cuPointerGetAttribute, (void* data, CUpointer_attribute attribute, CUdeviceptr ptr),              \
    (data, attribute, ptr), "cuPointerGetAttribute", 4000, 0, 0)                                                \
  X(CUresult, cuPointerGetAttributes,                                                                            \
    (unsigned int count, CUpointer_attribute* attributes, void** data, CUdeviceptr ptr),                       \
    (count, attributes, data, ptr), "cuPointerGetAttributes", 7000, 0, 0)                                       \
  X(CUresult, cuIpcGetMemHandle, (CUipcMemHandle * handle, CUdeviceptr dptr), (handle, dptr),                   \
    "cuIpcGetMemHandle", 4010, 0, 0)                                                                            \
  X(CUresult, cuStreamCreate, (CUstream * stream, unsigned int flags), (stream, flags), "cuStreamCreate", 2000, \
    0, 0)                                                                                                        \
  X(CUresult, cuStreamCreateWithPriority, (CUstream * stream, unsigned int flags, int priority),               \
    (stream, flags, priority), "cuStreamCreateWithPriority", 5050, 0, 0)                                        \
  X(CUresult, cuStreamDestroy_v2, (CUstream stream), (stream), "cuStreamDestroy", 4000, 0, 0)                   \
  X(CUresult, cuStreamBeginCapture_v2, (CUstream stream, CUstreamCaptureMode mode), (stream, mode),             \
    "cuStreamBeginCapture", 10010, 0, 0)                                                                        \
  X(CUresult, cuStreamBeginCapture_v2_ptsz, (CUstream stream, CUstreamCaptureMode mode), (stream, mode),        \
    "cuStreamBeginCapture", 10010, 1, 0)                                                                        \
  X(CUresult, cuStreamBeginCaptureToGraph,                                                                       \
    (CUstream stream, CUgraph graph, const CUgraphNode* deps, const CUgraphEdgeData* edges, size_t ndeps,      \
     CUstreamCaptureMode mode),                                                                                  \
    (stream, graph, deps, edges, ndeps, mode), "cuStreamBeginCaptureToGraph", 12030, 0, 0)                      \
  X(CUresult, cuStreamBeginCaptureToGraph_ptsz,                                                                  \
    (CUstream stream, CUgraph graph, const CUgraphNode* deps, const CUgraphEdgeData* edges, size_t ndeps,      \
     CUstreamCaptureMode mode),                                                                                  \
    (stream, graph, deps, edges, ndeps, mode), "cuStreamBeginCaptureToGraph", 12030, 1, 0)                      \
  X(CUresult, cuStreamEndCapture, (CUstream stream, CUgraph * graph), (stream, graph), "cuStreamEndCapture",    \
    10000, 0, 0)                                                                                                 \
  X(CUresult, cuStreamEndCapture_ptsz, (CUstream stream, CUgraph * graph), (stream, graph),                     \
    "cuStreamEndCapture", 10000, 1, 0)                                                                          \
  X(CUresult, cuCtxDestroy_v2, (CUcontext ctx), (ctx), "cuCtxDestroy", 4000, 0, 0)                              \
  X(CUresult, cuDevicePrimaryCtxReset_v2, (CUdevice dev), (dev), "cuDevicePrimaryCtxReset", 11000, 0, 0)        \
  X(CUresult, cuDevicePrimaryCtxReset, (CUdevice dev), (dev), "cuDevicePrimaryCtxReset", 7000, 0, 0)            \
  X(CUresult, cuDevicePrimaryCtxRelease_v2, (CUdevice dev), (dev), "cuDevicePrimaryCtxRelease", 11000, 0, 0)    \
  X(CUresult, cuDevicePrimaryCtxRelease, (CUdevice dev), (dev), "cuDevicePrimaryCtxRelease", 7000, 0, 0)        \
  X(CUresult, cuDevicePrimaryCtxRetain, (CUcontext * pctx, CUdevice dev), (pctx, dev), "cuDevicePrimaryCtxRetain", \
    7000, 0, 0)                                                                                                  \
  X(CUresult, cuIpcOpenMemHandle_v2, (CUdeviceptr * pdptr, CUipcMemHandle handle, unsigned int flags),       \
    (pdptr, handle, flags), "cuIpcOpenMemHandle", 11000, 0, 0)                                                   \
  X(CUresult, cuIpcOpenMemHandle, (CUdeviceptr * pdptr, CUipcMemHandle handle, unsigned int flags),          \
    (pdptr, handle, flags), "cuIpcOpenMemHandle", 4010, 0, 0)                                                    \
  X(CUresult, cuIpcCloseMemHandle, (CUdeviceptr dptr), (dptr), "cuIpcCloseMemHandle", 4010, 0, 0)              \
  X(CUresult, cuCtxEnablePeerAccess, (CUcontext peer, unsigned int flags), (peer, flags),                      \
    "cuCtxEnablePeerAccess", 4000, 0, 0)                                                                         \
  X(CUresult, cuCtxDisablePeerAccess, (CUcontext peer), (peer), "cuCtxDisablePeerAccess", 4000, 0, 0)          \
  X(cuw_nvmlReturn_t, nvmlDeviceGetMemoryInfo, (cuw_nvmlDevice_t device, cuw_nvmlMemory_t * memory),           \
    (device, memory), "", 0, 0, 1)                                                                               \
  X(cuw_nvmlReturn_t, nvmlDeviceGetMemoryInfo_v2, (cuw_nvmlDevice_t device, cuw_nvmlMemory_v2_t * memory),     \
    (device, memory), "", 0, 0, 1)                                                                               \
  CUW_WORK_HOOKS(X)

// NVML's ABI, declared here (nvml.h is not part of every CUDA toolkit install). These
// layouts are NVML's public, versioned structs (NVML API reference: Device Queries).
typedef int cuw_nvmlReturn_t;  ///< nvmlReturn_t: 0 = NVML_SUCCESS
typedef struct cuw_nvmlDevice_st* cuw_nvmlDevice_t;
typedef struct {
  unsigned long long total, free, used;  ///< bytes
} cuw_nvmlMemory_t;
typedef struct {
  unsigned int version;                            ///< nvmlMemory_v2 = sizeof | (2 << 24)
  unsigned long long total, reserved, free, used;  ///< bytes
} cuw_nvmlMemory_v2_t;

namespace cuw::hook {

/// Index of each hooked function in the table, in X order.
enum class Id : int {
#define CUW_ID(ret, name, params, args, base, version, pts, lib) name,
  CUW_HOOKS(CUW_ID)
#undef CUW_ID
      count_
};

/// One row of the table as data (for dlsym and cuGetProcAddress redirection).
struct Entry {
  const char* name;     ///< exported symbol of this ABI variant ("cuMemAlloc_v2")
  const char* base;     ///< name cuGetProcAddress is asked for ("cuMemAlloc")
  int version;          ///< CUDA version (1000*major + 10*minor) that introduced this variant
  bool per_thread;      ///< the _ptsz/_ptds variant
  int lib;              ///< 0 libcuda.so.1, 1 libnvidia-ml.so.1
  void* wrapper;        ///< our hook
};

}  // namespace cuw::hook

// cuwarden interposer: THE table of hooked driver entry points.
//
// How to add an interceptor (three steps, after LLVM's interception library):
//   1. Add one X(...) line below: return type, exported name, parameter list, argument list,
//      the base name cuGetProcAddress is asked for, and the CUDA version that introduced
//      this ABI variant, and whether it is the per-thread-stream variant (_ptsz/_ptds).
//   2. Write `hook_<name>` in hooks.cpp; call the driver through REAL(name)(args...).
//   3. Add the exported name to interposer/exports.map (a test checks the two agree).
// Everything else (dlsym redirection, cuGetProcAddress redirection, real-pointer
// resolution) is generated from this table; names not listed pass through untouched.
#pragma once

#include <cuda.h>

// cuda.h renames cuGetProcAddress to its _v2 variant; the table names both variants itself.
#undef cuGetProcAddress

// X(ret, name, params, args, base, version, per_thread)
#define CUW_HOOKS(X)                                                                                            \
  X(CUresult, cuMemAlloc_v2, (CUdeviceptr * dptr, size_t bytesize), (dptr, bytesize), "cuMemAlloc", 3020, 0)    \
  X(CUresult, cuMemAllocPitch_v2,                                                                                \
    (CUdeviceptr * dptr, size_t * pitch, size_t width, size_t height, unsigned int elem),                     \
    (dptr, pitch, width, height, elem), "cuMemAllocPitch", 3020, 0)                                            \
  X(CUresult, cuMemAllocManaged, (CUdeviceptr * dptr, size_t bytesize, unsigned int flags),                    \
    (dptr, bytesize, flags), "cuMemAllocManaged", 6000, 0)                                                      \
  X(CUresult, cuMemFree_v2, (CUdeviceptr dptr), (dptr), "cuMemFree", 3020, 0)                                   \
  X(CUresult, cuMemAllocAsync, (CUdeviceptr * dptr, size_t bytesize, CUstream stream),                          \
    (dptr, bytesize, stream), "cuMemAllocAsync", 11020, 0)                                                      \
  X(CUresult, cuMemAllocAsync_ptsz, (CUdeviceptr * dptr, size_t bytesize, CUstream stream),                     \
    (dptr, bytesize, stream), "cuMemAllocAsync", 11020, 1)                                                      \
  X(CUresult, cuMemAllocFromPoolAsync,                                                                           \
    (CUdeviceptr * dptr, size_t bytesize, CUmemoryPool pool, CUstream stream), (dptr, bytesize, pool, stream), \
    "cuMemAllocFromPoolAsync", 11020, 0)                                                                        \
  X(CUresult, cuMemAllocFromPoolAsync_ptsz,                                                                      \
    (CUdeviceptr * dptr, size_t bytesize, CUmemoryPool pool, CUstream stream), (dptr, bytesize, pool, stream), \
    "cuMemAllocFromPoolAsync", 11020, 1)                                                                        \
  X(CUresult, cuMemFreeAsync, (CUdeviceptr dptr, CUstream stream), (dptr, stream), "cuMemFreeAsync", 11020, 0) \
  X(CUresult, cuMemFreeAsync_ptsz, (CUdeviceptr dptr, CUstream stream), (dptr, stream), "cuMemFreeAsync",      \
    11020, 1)                                                                                                    \
  X(CUresult, cuMemCreate,                                                                                       \
    (CUmemGenericAllocationHandle * handle, size_t size, const CUmemAllocationProp* prop,                      \
     unsigned long long flags),                                                                                  \
    (handle, size, prop, flags), "cuMemCreate", 10020, 0)                                                       \
  X(CUresult, cuMemRelease, (CUmemGenericAllocationHandle handle), (handle), "cuMemRelease", 10020, 0)         \
  X(CUresult, cuMemGetInfo_v2, (size_t * free_bytes, size_t * total_bytes), (free_bytes, total_bytes),          \
    "cuMemGetInfo", 3020, 0)                                                                                    \
  X(CUresult, cuDeviceTotalMem_v2, (size_t * bytes, CUdevice dev), (bytes, dev), "cuDeviceTotalMem", 3020, 0)  \
  X(CUresult, cuGetProcAddress,                                                                                  \
    (const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags), (symbol, pfn, cudaVersion, flags),   \
    "cuGetProcAddress", 11030, 0)                                                                               \
  X(CUresult, cuGetProcAddress_v2,                                                                               \
    (const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,                                        \
     CUdriverProcAddressQueryResult* status),                                                                   \
    (symbol, pfn, cudaVersion, flags, status), "cuGetProcAddress", 12000, 0)

namespace cuw::hook {

/// Index of each hooked function in the table, in X order.
enum class Id : int {
#define CUW_ID(ret, name, params, args, base, version, pts) name,
  CUW_HOOKS(CUW_ID)
#undef CUW_ID
      count_
};

/// One row of the table as data (for redirection and tests).
struct Entry {
  const char* name;     ///< exported symbol of this ABI variant ("cuMemAlloc_v2")
  const char* base;     ///< name cuGetProcAddress is asked for ("cuMemAlloc")
  int version;          ///< CUDA version (1000*major + 10*minor) that introduced this variant
  bool per_thread;      ///< the _ptsz/_ptds variant
  void* wrapper;        ///< our hook
};

/// The table, `count` rows. Immutable after load.
const Entry* entries(int* count) noexcept;

}  // namespace cuw::hook

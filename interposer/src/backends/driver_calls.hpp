// cuwarden interposer: driver entry points the pools call without hooking them (events,
// contexts, streams, virtual memory), resolved once, and a scope that makes a pool's context current. For
// backends/ only: the hooks call REAL(x).
#pragma once

#include <cuda.h>

#include "base/real.hpp"

namespace cuw::backends {

/// Driver entry points the pools call and do not hook, resolved once.
struct Drv {
  CUresult (*event_create)(CUevent*, unsigned) = nullptr;
  CUresult (*event_record)(CUevent, CUstream) = nullptr;
  CUresult (*event_query)(CUevent) = nullptr;
  CUresult (*event_sync)(CUevent) = nullptr;
  CUresult (*event_destroy)(CUevent) = nullptr;
  CUresult (*ctx_get_current)(CUcontext*) = nullptr;
  CUresult (*ctx_push)(CUcontext) = nullptr;
  CUresult (*ctx_pop)(CUcontext*) = nullptr;
  CUresult (*ctx_get_device)(CUdevice*) = nullptr;
  CUresult (*stream_sync)(CUstream) = nullptr;
  CUresult (*stream_wait_event)(CUstream, CUevent, unsigned) = nullptr;
  CUresult (*stream_get_ctx)(CUstream, CUcontext*) = nullptr;
  CUresult (*ctx_sync)() = nullptr;
};

template <class F>
inline void resolve(F& f, const char* name) {
  f = reinterpret_cast<F>(hook::driver_symbol(name));
}

inline const Drv& drv() {
  static const Drv d = [] {
    Drv x;
    resolve(x.event_create, "cuEventCreate");
    resolve(x.event_record, "cuEventRecord");
    resolve(x.event_query, "cuEventQuery");
    resolve(x.event_sync, "cuEventSynchronize");
    resolve(x.event_destroy, "cuEventDestroy_v2");
    resolve(x.ctx_get_current, "cuCtxGetCurrent");
    resolve(x.ctx_push, "cuCtxPushCurrent_v2");
    resolve(x.ctx_pop, "cuCtxPopCurrent_v2");
    resolve(x.ctx_get_device, "cuCtxGetDevice");
    resolve(x.stream_sync, "cuStreamSynchronize");
    resolve(x.stream_wait_event, "cuStreamWaitEvent");
    resolve(x.stream_get_ctx, "cuStreamGetCtx");
    resolve(x.ctx_sync, "cuCtxSynchronize");
    return x;
  }();
  return d;
}

/// The virtual memory management entry points (the vmm backend's granules, IPC of mapped
/// memory), called unhooked: the pools' own physical memory is counted by the pools, not as
/// the program's cuMemCreate. Resolved once; an entry point the driver lacks is nullptr.
struct Vmm {
  CUresult (*granularity)(size_t*, const CUmemAllocationProp*, CUmemAllocationGranularity_flags) = nullptr;
  CUresult (*create)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*, unsigned long long) = nullptr;
  CUresult (*release)(CUmemGenericAllocationHandle) = nullptr;
  CUresult (*reserve)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long) = nullptr;
  CUresult (*address_free)(CUdeviceptr, size_t) = nullptr;
  CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long) = nullptr;
  CUresult (*unmap)(CUdeviceptr, size_t) = nullptr;
  CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t) = nullptr;
  CUresult (*retain)(CUmemGenericAllocationHandle*, void*) = nullptr;
  CUresult (*export_fd)(void*, CUmemGenericAllocationHandle, CUmemAllocationHandleType, unsigned long long) = nullptr;
  CUresult (*import_fd)(CUmemGenericAllocationHandle*, void*, CUmemAllocationHandleType) = nullptr;
  CUresult (*properties)(CUmemAllocationProp*, CUmemGenericAllocationHandle) = nullptr;
};

inline const Vmm& vmm() {
  static const Vmm v = [] {
    Vmm x;
    resolve(x.granularity, "cuMemGetAllocationGranularity");
    resolve(x.create, "cuMemCreate");
    resolve(x.release, "cuMemRelease");
    resolve(x.reserve, "cuMemAddressReserve");
    resolve(x.address_free, "cuMemAddressFree");
    resolve(x.map, "cuMemMap");
    resolve(x.unmap, "cuMemUnmap");
    resolve(x.set_access, "cuMemSetAccess");
    resolve(x.retain, "cuMemRetainAllocationHandle");
    resolve(x.export_fd, "cuMemExportToShareableHandle");
    resolve(x.import_fd, "cuMemImportFromShareableHandle");
    resolve(x.properties, "cuMemGetAllocationPropertiesFromHandle");
    return x;
  }();
  return v;
}

/// Makes `ctx` current for the scope when it is not already (a free made from a thread
/// whose current context is another one).
class CtxScope {
 public:
  explicit CtxScope(CUcontext ctx) noexcept {
    CUcontext cur = nullptr;
    if (drv().ctx_get_current && drv().ctx_get_current(&cur) == CUDA_SUCCESS && cur == ctx) return;
    pushed_ = drv().ctx_push && drv().ctx_push(ctx) == CUDA_SUCCESS;
  }
  ~CtxScope() {
    CUcontext out = nullptr;
    if (pushed_ && drv().ctx_pop) drv().ctx_pop(&out);
  }
  CtxScope(const CtxScope&) = delete;
  CtxScope& operator=(const CtxScope&) = delete;

 private:
  bool pushed_ = false;
};

}  // namespace cuw::backends

// cuwarden interposer: driver entry points the pools call without hooking them (events,
// contexts, streams), resolved once, and a scope that makes a pool's context current. For
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
    resolve(x.stream_get_ctx, "cuStreamGetCtx");
    resolve(x.ctx_sync, "cuCtxSynchronize");
    return x;
  }();
  return d;
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

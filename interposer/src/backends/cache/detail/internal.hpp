// cuwarden interposer: what the cache's files share (backends/cache only): its tuning, the
// driver entry points it calls without hooking them, and its size classes.
#pragma once

#include <cuda.h>

#include <algorithm>
#include <cstdint>

#include "backends/cache/cache_resource.hpp"
#include "base/real.hpp"

namespace cuw::backends::cache_detail {

inline constexpr uint32_t kSealBlocks = 64;             ///< an open batch this large is sealed by the free
inline constexpr uint32_t kPollEvery = 16;              ///< a free polls sealed batches this often
inline constexpr uint64_t kGrowPending = 64ULL << 20;   ///< past this many pending bytes, wait rather than grow
inline constexpr uint32_t kSealMinBlocks = 16;          ///< a missing small request seals a batch this large
inline constexpr uint64_t kSealMinBytes = 8ULL << 20;   ///< ... or holding this many bytes
inline constexpr uint64_t kKeepFloor = 16ULL << 20;     ///< a pool may keep this much free whatever its size
inline constexpr size_t kSpareBlocks = 32;              ///< vmm: spare Block objects kept for splits

/// Driver entry points the cache calls and does not hook, resolved once.
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

inline uint64_t class_size(int cls) noexcept {
  if (cls < 4) return static_cast<uint64_t>(cls + 1) * 512;
  const int k = 11 + (cls - 4) / 4, j = (cls - 4) % 4;
  return (1ULL << k) + static_cast<uint64_t>(j + 1) * (1ULL << (k - 2));
}

inline uint64_t large_slack(uint64_t rounded) noexcept {
  return std::max<uint64_t>(cache_resource::kLargeRound, rounded / 8);
}


}  // namespace cuw::backends::cache_detail

// cuwarden interposer hooks: entry points that queue GPU work (counted for a pool's proof that
// the GPU is done with a freed block: base/work_epoch.hpp), and the driver's entry-point lookup,
// which hands out our hooks in place of the driver's functions.
#include <cuda.h>

#include "base/hook_table.hpp"
#include "base/real.hpp"
#include "base/work_epoch.hpp"
#include "core/resume_notice.hpp"
#include "hooks/prologue.hpp"

// ---- entry points that queue GPU work (base/work_hooks.inc, generated) ----------------------
// Each calls the driver, then counts the work on the legacy stream's counter or the other
// streams' (the stream its arguments name), failed calls included: a batch may have queued
// part of its work. A call that comes back after the daemon resumed the process
// says so on stderr (core/resume_notice.hpp).

#define CUW_WORK_HOOK(ret, name, params, args, base, version, pts, lib) \
  CUW_EXPORT ret hook_##name params {                                   \
    CUW_REAL(name);                                                     \
    const ret r = real args;                                            \
    cuw::work::queued(CUW_WORK_STREAM_##name, pts);                     \
    cuw::core::check_resume_notice();                                   \
    return r;                                                           \
  }
CUW_WORK_HOOKS(CUW_WORK_HOOK)
#undef CUW_WORK_HOOK

// ---- entry-point lookup (CUDA driver API: Driver Entry Point Access) ---------------------

CUW_EXPORT CUresult hook_cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags) {
  CUW_REAL(cuGetProcAddress);
  const CUresult r = real(symbol, pfn, cudaVersion, flags);
  if (r == CUDA_SUCCESS && pfn && *pfn) *pfn = cuw::hook::redirect_proc(symbol, *pfn, cudaVersion, flags);
  return r;
}

CUW_EXPORT CUresult hook_cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                                             CUdriverProcAddressQueryResult* status) {
  CUW_REAL(cuGetProcAddress_v2);
  const CUresult r = real(symbol, pfn, cudaVersion, flags, status);
  if (r == CUDA_SUCCESS && pfn && *pfn) *pfn = cuw::hook::redirect_proc(symbol, *pfn, cudaVersion, flags);
  return r;
}

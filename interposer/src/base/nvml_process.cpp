// NVML API reference: nvmlInit_v2, nvmlDeviceGetHandleByUUID,
// nvmlDeviceGetComputeRunningProcesses(_v3/_v2/v1). The process-info struct changed size across
// versions (v1: pid, usedGpuMemory; v2/v3 add two instance ids), so each entry point is called
// with the layout of its own version.
#include "base/nvml_process.hpp"

#include <atomic>
#include <cstdio>
#include <mutex>

#include "base/real.hpp"

namespace cuw::hook {
namespace {

using nvml_ret = int;                 // nvmlReturn_t
using nvml_dev = struct nvml_dev_st*; // nvmlDevice_t
constexpr nvml_ret kSuccess = 0;
constexpr nvml_ret kInsufficientSize = 7;  // NVML_ERROR_INSUFFICIENT_SIZE

struct InfoV1 {
  unsigned int pid;
  unsigned long long usedGpuMemory;
};
struct InfoV2 {  // nvmlProcessInfo_v2_t, and v3 (nvmlProcessInfo_t) has the same layout
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId;
  unsigned int computeInstanceId;
};

struct Api {
  nvml_ret (*by_uuid)(const char*, nvml_dev*) = nullptr;
  nvml_ret (*procs_v2)(nvml_dev, unsigned int*, InfoV2*) = nullptr;  // _v3 or _v2
  nvml_ret (*procs_v1)(nvml_dev, unsigned int*, InfoV1*) = nullptr;
  bool ok = false;
};

const Api& api() {
  static const Api a = [] {
    Api r;
    if (!resolve_lib(1, true)) return r;
    auto init = reinterpret_cast<nvml_ret (*)()>(nvml_symbol("nvmlInit_v2"));
    if (!init) init = reinterpret_cast<nvml_ret (*)()>(nvml_symbol("nvmlInit"));
    if (!init || init() != kSuccess) return r;
    r.by_uuid = reinterpret_cast<decltype(r.by_uuid)>(nvml_symbol("nvmlDeviceGetHandleByUUID"));
    r.procs_v2 = reinterpret_cast<decltype(r.procs_v2)>(nvml_symbol("nvmlDeviceGetComputeRunningProcesses_v3"));
    if (!r.procs_v2)
      r.procs_v2 = reinterpret_cast<decltype(r.procs_v2)>(nvml_symbol("nvmlDeviceGetComputeRunningProcesses_v2"));
    if (!r.procs_v2)
      r.procs_v1 = reinterpret_cast<decltype(r.procs_v1)>(nvml_symbol("nvmlDeviceGetComputeRunningProcesses"));
    r.ok = r.by_uuid && (r.procs_v2 || r.procs_v1);
    return r;
  }();
  return a;
}

template <class Info, class Fn>
NvmlProcess find(Fn fn, nvml_dev dev, uint32_t pid, uint64_t* bytes) {
  // Room for a busy GPU; more processes than this: asked again with the count NVML gives.
  Info buf[64];
  unsigned int n = 64;
  nvml_ret rc = fn(dev, &n, buf);
  if (rc == kInsufficientSize) {
    unsigned int want = n + 16;
    Info* big = new (std::nothrow) Info[want];
    if (!big) return NvmlProcess::unavailable;
    n = want;
    rc = fn(dev, &n, big);
    NvmlProcess r = NvmlProcess::not_listed;
    for (unsigned int i = 0; rc == kSuccess && i < n; ++i)
      if (big[i].pid == pid) {
        *bytes = big[i].usedGpuMemory;
        r = NvmlProcess::found;
      }
    delete[] big;
    return rc == kSuccess ? r : NvmlProcess::unavailable;
  }
  if (rc != kSuccess) return NvmlProcess::unavailable;
  for (unsigned int i = 0; i < n; ++i)
    if (buf[i].pid == pid) {
      *bytes = buf[i].usedGpuMemory;
      return NvmlProcess::found;
    }
  return NvmlProcess::not_listed;
}

}  // namespace

NvmlProcess nvml_process_bytes(const uint8_t (&uuid)[16], uint32_t pid, uint64_t* bytes) noexcept {
  const Api& a = api();
  if (!a.ok) return NvmlProcess::unavailable;
  // nvidia-smi's spelling: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx
  char text[48];
  std::snprintf(text, sizeof text,
                "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", uuid[0], uuid[1],
                uuid[2], uuid[3], uuid[4], uuid[5], uuid[6], uuid[7], uuid[8], uuid[9], uuid[10], uuid[11], uuid[12],
                uuid[13], uuid[14], uuid[15]);
  nvml_dev dev = nullptr;
  if (a.by_uuid(text, &dev) != kSuccess) return NvmlProcess::unavailable;
  // An unused driver-held figure (usedGpuMemory = NVML_VALUE_NOT_AVAILABLE) counts as none.
  NvmlProcess r = a.procs_v2 ? find<InfoV2>(a.procs_v2, dev, pid, bytes) : find<InfoV1>(a.procs_v1, dev, pid, bytes);
  if (r == NvmlProcess::found && *bytes == ~0ULL) r = NvmlProcess::unavailable;
  return r;
}

}  // namespace cuw::hook

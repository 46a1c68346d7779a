// cuwarden interposer base: NVML's figure for one process on one GPU (nvml_process.hpp).
// NVML API reference: nvmlInit_v2, nvmlDeviceGetHandleByUUID,
// nvmlDeviceGetComputeRunningProcesses_v2 / v1. The process-info struct changed size across
// versions (v1: pid, usedGpuMemory; v2 adds two instance ids; v3 grew again on some drivers,
// R535's usedGpuCcProtectedMemory), so _v2 is asked first, with its own layout, then v1.
#include "base/nvml_process.hpp"

#include <dlfcn.h>

#include <cstdio>
#include <new>

#include "base/real.hpp"

namespace cuw::hook {
namespace {

using nvml_ret = int;                  // nvmlReturn_t
using nvml_dev = struct nvml_dev_st*;  // nvmlDevice_t
constexpr nvml_ret kSuccess = 0;
constexpr nvml_ret kInsufficientSize = 7;  // NVML_ERROR_INSUFFICIENT_SIZE

struct InfoV1 {
  unsigned int pid;
  unsigned long long usedGpuMemory;
};
struct InfoV2 {  // nvmlProcessInfo_v2_t
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId;
  unsigned int computeInstanceId;
};
static_assert(sizeof(InfoV2) == 24, "nvmlProcessInfo_v2_t is 24 bytes");

struct Api {
  nvml_ret (*by_uuid)(const char*, nvml_dev*) = nullptr;
  nvml_ret (*procs_v2)(nvml_dev, unsigned int*, InfoV2*) = nullptr;
  nvml_ret (*procs_v1)(nvml_dev, unsigned int*, InfoV1*) = nullptr;
  bool ok = false;
};

const Api& api() {
  static const Api a = [] {
    Api r;
    // A handle of our own, local: the program's symbol lookups are not changed by it, and a
    // program that loads NVML itself later gets the same library.
    void* h = dlopen("libnvidia-ml.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (!h) return r;
    auto sym = [h](const char* name) { return real_dlsym(h, name); };
    auto init = reinterpret_cast<nvml_ret (*)()>(sym("nvmlInit_v2"));
    if (!init) init = reinterpret_cast<nvml_ret (*)()>(sym("nvmlInit"));
    if (!init || init() != kSuccess) return r;
    r.by_uuid = reinterpret_cast<decltype(r.by_uuid)>(sym("nvmlDeviceGetHandleByUUID"));
    r.procs_v2 = reinterpret_cast<decltype(r.procs_v2)>(sym("nvmlDeviceGetComputeRunningProcesses_v2"));
    if (!r.procs_v2) r.procs_v1 = reinterpret_cast<decltype(r.procs_v1)>(sym("nvmlDeviceGetComputeRunningProcesses"));
    r.ok = r.by_uuid && (r.procs_v2 || r.procs_v1);
    return r;
  }();
  return a;
}

template <class Info, class Fn>
NvmlProcess find(Fn fn, nvml_dev dev, uint32_t pid, uint64_t* bytes) {
  // Room for a busy GPU; more processes than this: asked again with the count NVML gives,
  // and room for some more that may have started meanwhile.
  Info buf[64];
  unsigned int n = 64;
  Info* list = buf;
  Info* big = nullptr;
  nvml_ret rc = fn(dev, &n, list);
  for (int tries = 0; rc == kInsufficientSize && tries < 3; ++tries) {
    delete[] big;
    const unsigned int room = n + 64;
    big = new (std::nothrow) Info[room];
    if (!big) return NvmlProcess::unavailable;
    n = room;
    list = big;
    rc = fn(dev, &n, list);
  }
  NvmlProcess r = rc == kSuccess ? NvmlProcess::not_listed : NvmlProcess::unavailable;
  for (unsigned int i = 0; rc == kSuccess && i < n; ++i)
    if (list[i].pid == pid) {
      *bytes = list[i].usedGpuMemory;
      r = NvmlProcess::found;
      break;
    }
  delete[] big;
  return r;
}

}  // namespace

bool nvml_prepare() noexcept { return api().ok; }

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
  NvmlProcess r = a.procs_v2 ? find<InfoV2>(a.procs_v2, dev, pid, bytes) : find<InfoV1>(a.procs_v1, dev, pid, bytes);
  // A figure NVML does not have (NVML_VALUE_NOT_AVAILABLE) is as good as none.
  if (r == NvmlProcess::found && *bytes == ~0ULL) r = NvmlProcess::unavailable;
  return r;
}

}  // namespace cuw::hook

// fakenvml probe: links NVML only; the simulated driver is found by NVML's dlopen through
// LD_LIBRARY_PATH, as on a machine where a tool uses NVML alone. Then loads the driver itself
// (dlopen, like a CUDA runtime) and checks that NVML sees its allocation on the right physical
// device when CUDA_VISIBLE_DEVICES renumbers them.
// Usage: fakenvml_probe EXPECTED_COUNT UUID_OF_PHYSICAL_0   (run with CUDA_VISIBLE_DEVICES=1)
#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "fakenvml.h"

namespace {
int g_failed = 0, g_passed = 0;
void check(bool ok, const char* what) {
  (ok ? g_passed : g_failed)++;
  if (!ok) std::fprintf(stderr, "FAILED: %s\n", what);
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  const unsigned want_count = static_cast<unsigned>(std::atoi(argv[1]));
  check(nvmlInit_v2() == NVML_SUCCESS, "nvmlInit_v2");
  unsigned n = 0;
  check(nvmlDeviceGetCount_v2(&n) == NVML_SUCCESS && n == want_count, "physical device count");
  nvmlDevice_t d0 = nullptr, d1 = nullptr;
  check(nvmlDeviceGetHandleByIndex_v2(0, &d0) == NVML_SUCCESS, "handle 0");
  check(nvmlDeviceGetHandleByIndex_v2(1, &d1) == NVML_SUCCESS, "handle 1");
  char uuid[96] = {};
  check(nvmlDeviceGetUUID(d0, uuid, sizeof uuid) == NVML_SUCCESS && std::string(uuid) == argv[2], "uuid 0");
  nvmlMemory_t m{};
  check(nvmlDeviceGetMemoryInfo(d1, &m) == NVML_SUCCESS && m.total == (2ull << 30) && m.used == 0, "memory 1");

  // CUDA ordinal 0 is physical 1 under CUDA_VISIBLE_DEVICES=1.
  void* cuda = dlopen("libcuda.so.1", RTLD_NOW);
  check(cuda != nullptr, "dlopen libcuda.so.1");
  if (!cuda) return 1;
  using InitFn = int (*)(unsigned);
  using RetainFn = int (*)(void**, int);
  using SetFn = int (*)(void*);
  using AllocFn = int (*)(unsigned long long*, size_t);
  using FreeFn = int (*)(unsigned long long);
  auto cu_init = reinterpret_cast<InitFn>(dlsym(cuda, "cuInit"));
  auto retain = reinterpret_cast<RetainFn>(dlsym(cuda, "cuDevicePrimaryCtxRetain"));
  auto set = reinterpret_cast<SetFn>(dlsym(cuda, "cuCtxSetCurrent"));
  auto alloc = reinterpret_cast<AllocFn>(dlsym(cuda, "cuMemAlloc_v2"));
  auto mfree = reinterpret_cast<FreeFn>(dlsym(cuda, "cuMemFree_v2"));
  void* ctx = nullptr;
  unsigned long long p = 0;
  check(cu_init(0) == 0 && retain(&ctx, 0) == 0 && set(ctx) == 0, "CUDA context on ordinal 0");
  check(alloc(&p, 10 << 20) == 0, "cuMemAlloc 10 MiB");
  check(nvmlDeviceGetMemoryInfo(d1, &m) == NVML_SUCCESS && m.used == (10u << 20), "NVML sees it on physical 1");
  check(nvmlDeviceGetMemoryInfo(d0, &m) == NVML_SUCCESS && m.used == 0, "and not on physical 0");
  nvmlProcessInfo_t info[2];
  unsigned count = 2;
  check(nvmlDeviceGetComputeRunningProcesses_v3(d1, &count, info) == NVML_SUCCESS && count == 1 &&
            info[0].pid == static_cast<unsigned>(getpid()) && info[0].usedGpuMemory == (10u << 20),
        "process listed on physical 1");
  check(mfree(p) == 0, "cuMemFree");
  check(nvmlDeviceGetMemoryInfo(d1, &m) == NVML_SUCCESS && m.used == 0, "freed");
  check(nvmlShutdown() == NVML_SUCCESS, "nvmlShutdown");
  std::printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed ? 1 : 0;
}

// cuwarden integration tests: a driver-API program that allocates on command, for tests
// that change its cap while it runs (run under LD_PRELOAD=libcuwarden.so on the simulated
// driver). Reads lines from stdin, answers one line each:
//   alloc MIB [DEV]  -> "ok" | "refused" | "error N"   (allocations are kept)
//   free             -> "freed N"                       (frees everything it holds)
//   grow MIB         -> "grown" | "error N"             (the driver's own memory for the
//                                                        context grows: fakecuda_context_grow)
//   release          -> "released" | "error N"          (the last reference to device 0's
//                                                        primary context: it goes, with its memory)
// Prints "ready PID" once a context exists; exits 0 at EOF.
#include <cuda.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "fakecuda.h"

int main() {
  CUdevice dev;
  CUcontext ctx;
  if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx)) {
    std::printf("error no context\n");
    return 1;
  }
  std::vector<std::pair<int, CUdeviceptr>> held;
  std::printf("ready %d\n", static_cast<int>(getpid()));
  std::fflush(stdout);
  char line[256];
  while (std::fgets(line, sizeof line, stdin)) {
    char cmd[32] = {};
    unsigned long long mib = 0;
    int d = 0;
    const int n = std::sscanf(line, "%31s %llu %d", cmd, &mib, &d);
    if (n >= 2 && std::strcmp(cmd, "alloc") == 0) {
      CUcontext c = ctx;
      if (d != 0) {
        CUdevice other;
        if (cuDeviceGet(&other, d) || cuDevicePrimaryCtxRetain(&c, other)) {
          std::printf("error no device %d\n", d);
          std::fflush(stdout);
          continue;
        }
      }
      cuCtxSetCurrent(c);
      CUdeviceptr p = 0;
      const CUresult r = cuMemAlloc(&p, static_cast<size_t>(mib) << 20);
      if (r == CUDA_SUCCESS) {
        held.emplace_back(d, p);
        std::printf("ok\n");
      } else if (r == CUDA_ERROR_OUT_OF_MEMORY) {
        std::printf("refused\n");
      } else {
        std::printf("error %d\n", static_cast<int>(r));
      }
      cuCtxSetCurrent(ctx);
    } else if (n >= 2 && std::strcmp(cmd, "grow") == 0) {
      const CUresult r = fakecuda_context_grow(static_cast<size_t>(mib) << 20);
      if (r == CUDA_SUCCESS) std::printf("grown\n");
      else std::printf("error %d\n", static_cast<int>(r));
    } else if (n >= 1 && std::strcmp(cmd, "release") == 0) {
      const CUresult r = cuDevicePrimaryCtxRelease(dev);
      if (r == CUDA_SUCCESS) {
        held.clear();  // freed by the driver with the context
        std::printf("released\n");
      } else {
        std::printf("error %d\n", static_cast<int>(r));
      }
    } else if (n >= 1 && std::strcmp(cmd, "free") == 0) {
      for (auto& [dd, p] : held) cuMemFree(p);
      std::printf("freed %zu\n", held.size());
      held.clear();
    } else {
      std::printf("error unknown command\n");
    }
    std::fflush(stdout);
  }
  for (auto& [dd, p] : held) cuMemFree(p);
  return 0;
}

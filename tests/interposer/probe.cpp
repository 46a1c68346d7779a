// Interposer tests: a small driver-API program the tests run as a child process under
// LD_PRELOAD, to check what a whole process sees (exit codes, files, threads, the daemon).
//   cuw_itest_probe alloc MIB   allocate MIB MiB, print "ok", free, exit 0 (2 if refused)
//   cuw_itest_probe bytes N     as alloc, of exactly N bytes (caps are exact to the byte)
//   cuw_itest_probe hold MIB    allocate, print "ready", wait for stdin EOF, free, exit 0
//   cuw_itest_probe meminfo MIB allocate MIB MiB, print "free F total T" (cuMemGetInfo, bytes)
//   cuw_itest_probe nocuda      touch no CUDA; print the process's thread count
//   cuw_itest_probe fork MIB    allocate MIB, fork; the child allocates MIB/2 with its own
//                               context, both print "ready <pid>", wait for stdin EOF, exit 0
//   cuw_itest_probe refuse MIB N [US]  ask for MIB MiB N times in a loop (freeing what it
//                               gets), US microseconds apart; print "refused K", exit 0
//   cuw_itest_probe lookup MIB  look up entry points first (as the CUDA runtime does when it
//                               starts), then as alloc
#include <cuda.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

namespace {
int threads() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("Threads:", 0) == 0) return std::atoi(line.c_str() + 8);
  return -1;
}
int context() {
  CUdevice dev;
  CUcontext ctx;
  if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx)) {
    std::fprintf(stderr, "probe: no context\n");
    return 1;
  }
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return 64;
  const std::string mode = argv[1];
  if (mode == "nocuda") {
    std::printf("threads %d\n", threads());
    return 0;
  }
  const size_t mib = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 1;
  const size_t bytes = mode == "bytes" ? mib : mib << 20;
  if (mode == "lookup") {
    for (const char* name : {"cuMemAlloc", "cuMemFree", "cuDeviceTotalMem", "cuCtxGetDevice"}) {
      void* fn = nullptr;
      CUdriverProcAddressQueryResult st{};
      if (cuGetProcAddress_v2(name, &fn, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &st) != CUDA_SUCCESS || !fn) return 1;
    }
  }
  if (context()) return 1;
  if (mode == "refuse") {
    const long n = argc > 3 ? std::strtol(argv[3], nullptr, 10) : 1;
    const long pause_us = argc > 4 ? std::strtol(argv[4], nullptr, 10) : 0;
    long refused = 0;
    for (long i = 0; i < n; ++i) {
      if (pause_us > 0 && i > 0) ::usleep(static_cast<useconds_t>(pause_us));
      CUdeviceptr q = 0;
      const CUresult r = cuMemAlloc(&q, bytes);
      if (r == CUDA_ERROR_OUT_OF_MEMORY) ++refused;
      else if (r == CUDA_SUCCESS) cuMemFree(q);
    }
    std::printf("refused %ld\n", refused);
    return 0;
  }
  CUdeviceptr p = 0;
  const CUresult r = cuMemAlloc(&p, bytes);
  if (r == CUDA_ERROR_OUT_OF_MEMORY) {
    std::printf("refused\n");
    return 2;
  }
  if (r != CUDA_SUCCESS) {
    std::printf("error %d\n", static_cast<int>(r));
    return 1;
  }
  if (mode == "fork") {
    std::fflush(stdout);
    const pid_t child = fork();
    if (child == 0) {
      // A CUDA program's child starts its own CUDA state (on a real GPU only after exec;
      // the simulated driver allows it directly). Its allocations must land in its own ring.
      CUdeviceptr q = 0;
      if (cuMemAlloc(&q, (mib << 20) / 2) != CUDA_SUCCESS) _exit(3);
      std::printf("ready %d\n", static_cast<int>(getpid()));
      std::fflush(stdout);
      char b[64];
      while (::read(0, b, sizeof b) > 0) {
      }
      cuMemFree(q);
      _exit(0);
    }
    std::printf("ready %d\n", static_cast<int>(getpid()));
    std::fflush(stdout);
    char b[64];
    while (::read(0, b, sizeof b) > 0) {
    }
    int st = 0;
    waitpid(child, &st, 0);
    cuMemFree(p);
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
  }
  if (mode == "meminfo") {
    size_t free_b = 0, total = 0;
    if (cuMemGetInfo(&free_b, &total) != CUDA_SUCCESS) return 1;
    std::printf("free %zu total %zu\n", free_b, total);
  } else if (mode == "hold") {
    std::printf("ready\n");
    std::fflush(stdout);
    char buf[64];
    while (::read(0, buf, sizeof buf) > 0) {
    }
  } else {
    std::printf("ok\n");
  }
  cuMemFree(p);
  return 0;
}

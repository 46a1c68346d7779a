// cuwarden integration tests: the program `cuwarden fit` searches with. It needs a known
// amount of device memory: N units (argv[1]) in one cuMemAlloc on each device it uses, then
// exits 0. Out of memory: "out of memory" on stderr, exit 1 (or abort, with
// --abort-on-oom). Options:
//   --unit BYTES      bytes per unit (default 1 MiB)
//   --devices D       allocate N units on each of devices 0..D-1 (default 1)
//   --fail-above K    for N > K, print "boom: N above K" on stderr and exit 3, allocating
//                     nothing (a failure that is not a refusal)
//   --crash-above K   for N > K, die of SIGSEGV without allocating
//   --in-child        the allocation happens in a forked child; this process exits with
//                     the child's status (fit must read every process's ring)
#include <cuda.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

int allocate(unsigned long long n, unsigned long long unit, int devices, bool abort_on_oom) {
  if (cuInit(0) != CUDA_SUCCESS) {
    std::fprintf(stderr, "cuInit failed\n");
    return 2;
  }
  std::vector<CUcontext> ctxs;
  for (int d = 0; d < devices; ++d) {
    CUdevice dev;
    CUcontext ctx;
    if (cuDeviceGet(&dev, d) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx)) {
      std::fprintf(stderr, "no context on device %d\n", d);
      return 2;
    }
    CUdeviceptr p = 0;
    const CUresult r = cuMemAlloc(&p, static_cast<size_t>(n * unit));
    if (r == CUDA_ERROR_OUT_OF_MEMORY) {
      std::fprintf(stderr, "out of memory: %llu units on device %d\n", n, d);
      if (abort_on_oom) std::abort();
      return 1;
    }
    if (r != CUDA_SUCCESS) {
      std::fprintf(stderr, "cuMemAlloc: error %d\n", static_cast<int>(r));
      return 2;
    }
    ctxs.push_back(ctx);
  }
  return 0;  // the driver frees everything at exit
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: %s N [--unit BYTES] [--devices D] [--fail-above K] [--crash-above K] [--in-child] "
                 "[--abort-on-oom]\n",
                 argv[0]);
    return 2;
  }
  const unsigned long long n = std::strtoull(argv[1], nullptr, 10);
  unsigned long long unit = 1ULL << 20, fail_above = ~0ULL, crash_above = ~0ULL;
  int devices = 1;
  bool in_child = false, abort_on_oom = false;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    const char* next = i + 1 < argc ? argv[i + 1] : "0";
    if (a == "--unit") unit = std::strtoull(next, nullptr, 10), ++i;
    else if (a == "--devices") devices = std::atoi(next), ++i;
    else if (a == "--fail-above") fail_above = std::strtoull(next, nullptr, 10), ++i;
    else if (a == "--crash-above") crash_above = std::strtoull(next, nullptr, 10), ++i;
    else if (a == "--in-child") in_child = true;
    else if (a == "--abort-on-oom") abort_on_oom = true;
  }
  if (n > fail_above) {
    std::fprintf(stderr, "loading the model\nboom: %llu above %llu\n", n, fail_above);
    return 3;
  }
  if (n > crash_above) {
    signal(SIGSEGV, SIG_DFL);
    raise(SIGSEGV);
  }
  if (!in_child) return allocate(n, unit, devices, abort_on_oom);
  const pid_t pid = fork();
  if (pid == 0) _exit(allocate(n, unit, devices, abort_on_oom));
  int st = 0;
  if (pid < 0 || waitpid(pid, &st, 0) != pid) return 2;
  if (WIFSIGNALED(st)) raise(WTERMSIG(st));
  return WIFEXITED(st) ? WEXITSTATUS(st) : 2;
}

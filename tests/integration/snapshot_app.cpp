// cuwarden integration tests: the program `snapshot_test.py` takes snapshots of, built with
// -g (its frames are named by the daemon from DWARF) and -rdynamic (dladdr names them in the
// process's own reports). It allocates from functions at known lines, which it prints
// ("line big_buffer N"), then follows commands on stdin, one a line:
//   ready          print "ready" (everything above is allocated)
//   churn N        N cuMemAlloc + cuMemFree pairs of 4 KiB (fills the ring past its size
//                  when no daemon drains it: events dropped)
//   oom BYTES      one cuMemAlloc of BYTES from oversized(); print its CUresult
//   leak N         N allocations of 1 MiB from leaky(), kept (a leak growing between snapshots)
//   chain          three allocations through one 12-deep helper chain (chain_1 .. chain_12, as
//                  a framework's caching allocator is), from load_weights (twice, at two lines)
//                  and make_buffers: sites that share a dozen innermost frames
//   free           free what big_buffer and small_buffers hold
//   exit           exit 0 (what is still allocated stays: a leak for CUWARDEN_LEAKS)
#include <cuda.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

// Functions with external linkage (not in an anonymous namespace): -rdynamic exports them,
// so that dladdr, which reads only the dynamic symbol table, names them.
std::vector<CUdeviceptr> g_live;

__attribute__((noinline)) CUdeviceptr big_buffer(std::size_t bytes) {
  CUdeviceptr p = 0;
  std::printf("line big_buffer %d\n", __LINE__ + 1);
  const CUresult r = cuMemAlloc(&p, bytes);
  if (r != CUDA_SUCCESS) std::exit(3);
  return p;
}

__attribute__((noinline)) void small_buffers(int n) {
  std::printf("line small_buffers %d\n", __LINE__ + 3);
  for (int i = 0; i < n; ++i) {
    CUdeviceptr p = 0;
    if (cuMemAlloc(&p, 64 * 1024) != CUDA_SUCCESS) std::exit(3);
    g_live.push_back(p);
  }
}

__attribute__((noinline)) void leaky(int n) {
  for (int i = 0; i < n; ++i) {
    CUdeviceptr p = 0;
    if (cuMemAlloc(&p, 1 << 20) != CUDA_SUCCESS) std::exit(3);
    g_live.push_back(p);
  }
}

// The helper chain: chain_12 allocates, chain_1 is called by the sites' own functions.
__attribute__((noinline)) CUdeviceptr chain_12(std::size_t bytes) {
  CUdeviceptr p = 0;
  if (cuMemAlloc(&p, bytes) != CUDA_SUCCESS) std::exit(3);
  return p;
}
#define CUWT_CHAIN(n, next) \
  __attribute__((noinline)) CUdeviceptr chain_##n(std::size_t bytes) { return next(bytes) + 0; }
CUWT_CHAIN(11, chain_12)
CUWT_CHAIN(10, chain_11)
CUWT_CHAIN(9, chain_10)
CUWT_CHAIN(8, chain_9)
CUWT_CHAIN(7, chain_8)
CUWT_CHAIN(6, chain_7)
CUWT_CHAIN(5, chain_6)
CUWT_CHAIN(4, chain_5)
CUWT_CHAIN(3, chain_4)
CUWT_CHAIN(2, chain_3)
CUWT_CHAIN(1, chain_2)
#undef CUWT_CHAIN

__attribute__((noinline)) void load_weights() {
  std::printf("line load_weights %d\n", __LINE__ + 1);
  g_live.push_back(chain_1(3ULL << 20));
  std::printf("line load_weights_2 %d\n", __LINE__ + 1);
  g_live.push_back(chain_1(2ULL << 20));
}

__attribute__((noinline)) void make_buffers() {
  std::printf("line make_buffers %d\n", __LINE__ + 1);
  g_live.push_back(chain_1(1ULL << 20));
}

__attribute__((noinline)) CUresult oversized(std::size_t bytes, CUdeviceptr* p) {
  return cuMemAlloc(p, bytes);  // the refused call
}

int main() {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  CUdevice dev;
  CUcontext ctx;
  if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx)) return 2;
  g_live.push_back(big_buffer(64ULL << 20));
  small_buffers(10);
  std::string cmd;
  while (std::cin >> cmd) {
    if (cmd == "ready") {
      std::printf("ready\n");
    } else if (cmd == "churn") {
      int n = 0;
      std::cin >> n;
      for (int i = 0; i < n; ++i) {
        CUdeviceptr p = 0;
        if (cuMemAlloc(&p, 4096) != CUDA_SUCCESS || cuMemFree(p) != CUDA_SUCCESS) return 3;
      }
      std::printf("churned %d\n", n);
    } else if (cmd == "oom") {
      unsigned long long bytes = 0;
      std::cin >> bytes;
      CUdeviceptr p = 0;
      std::printf("oom result %d\n", static_cast<int>(oversized(bytes, &p)));
    } else if (cmd == "chain") {
      load_weights();
      make_buffers();
      std::printf("chained\n");
    } else if (cmd == "leak") {
      int n = 0;
      std::cin >> n;
      leaky(n);
      std::printf("leaked %d\n", n);
    } else if (cmd == "free") {
      for (CUdeviceptr p : g_live) cuMemFree(p);
      g_live.clear();
      std::printf("freed\n");
    } else if (cmd == "exit") {
      return 0;
    }
  }
  return 0;
}

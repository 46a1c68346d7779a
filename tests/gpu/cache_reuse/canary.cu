// cuwarden GPU test: a freed block is never handed out while work queued before its free can
// still write it (CUWARDEN_POOL=cache, cudaFree's promise), for each way a program queues
// that work. Built by tests/gpu/cache_reuse.sh with the machine's nvcc (twice: the legacy
// default stream, and --default-stream per-thread, which reaches the _ptsz entry points).
//
//   canary PATH BYTES
//     PATH: kernel (a kernel that spins ~50 ms, then writes the block), memset (one big
//     cudaMemsetAsync into it), memcpy (one big device-to-device cudaMemcpyAsync into it),
//     graph (the kernel inside a CUDA graph, cudaGraphLaunch), peer (the kernel launched on
//     device 1, writing device 0's block through peer access; needs two GPUs that can reach
//     each other: otherwise prints {"skipped": ...} and exits 0)
//
// Each run: make the cache idle (pairs of allocations with no work between), allocate A,
// queue the late write into A on a non-blocking stream through PATH (the only work queued
// since the cache was idle), cudaFree(A), cudaMalloc(B) of the same size, zero B on another
// non-blocking stream, wait for everything, count the non-zero words of B. A cache that
// reused A before the late write ran leaves that write in B, and is caught in the act when
// cudaMalloc returns A while the late write's stream is still busy. Prints one JSON line;
// exit 0 when neither happened, 1 when one did, 2 on a CUDA error.
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#define CK(call)                                                                           \
  do {                                                                                     \
    cudaError_t e_ = (call);                                                               \
    if (e_ != cudaSuccess) {                                                               \
      std::fprintf(stderr, "canary: %s: %s\n", #call, cudaGetErrorString(e_));             \
      std::exit(2);                                                                        \
    }                                                                                      \
  } while (0)

__global__ void spin_then_write(unsigned* p, size_t words, long long spin_cycles) {
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    const long long t0 = clock64();
    while (clock64() - t0 < spin_cycles) {
    }
  }
  __syncthreads();
  // One block spins; then every thread of the grid-stride loop writes. Only block 0 waits,
  // so launch one block: the write follows the spin.
  for (size_t i = threadIdx.x; i < words; i += blockDim.x) p[i] = 0xEEEEEEEEu;
}

__global__ void count_nonzero(const unsigned* p, size_t words, unsigned long long* out) {
  unsigned long long n = 0;
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < words; i += gridDim.x * blockDim.x) n += p[i] != 0;
  atomicAdd(out, n);
}

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: canary kernel|memset|memcpy|graph BYTES\n");
    return 2;
  }
  const std::string path = argv[1];
  const size_t bytes = std::strtoull(argv[2], nullptr, 10);
  const size_t words = bytes / 4;
  const bool peer = path == "peer";
  if (peer) {
    int n = 0, can = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 2 || cudaDeviceCanAccessPeer(&can, 1, 0) != cudaSuccess || !can) {
      std::printf("{\"path\":\"peer\",\"bytes\":%zu,\"skipped\":\"needs two GPUs with peer access (devices: %d)\"}\n",
                  bytes, n);
      return 0;
    }
  }
  CK(cudaSetDevice(0));
  int clock_khz = 0;
  CK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  const long long spin = static_cast<long long>(clock_khz) * 50;  // ~50 ms
  cudaStream_t s, s2;
  if (peer) {  // the late write's stream is device 1's; device 1 may write device 0's memory
    CK(cudaSetDevice(1));
    CK(cudaDeviceEnablePeerAccess(0, 0));
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CK(cudaSetDevice(0));
  } else {
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  }
  CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  unsigned* src = nullptr;
  unsigned long long* count = nullptr;
  if (path == "memcpy") {
    CK(cudaMalloc(&src, bytes));
    CK(cudaMemset(src, 0xEE, bytes));
  }
  CK(cudaMalloc(&count, sizeof *count));
  cudaGraphExec_t exec = nullptr;
  unsigned* a = nullptr;
  CK(cudaMalloc(&a, bytes));
  if (path == "graph") {
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    spin_then_write<<<1, 1024, 0, s>>>(a, words, spin);
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&exec, g, 0));
  }
  CK(cudaDeviceSynchronize());
  // Idle: no work since here. Pairs of the size let the cache prove it (its seals complete).
  for (int i = 0; i < 200; ++i) {
    void* t = nullptr;
    CK(cudaMalloc(&t, bytes));
    CK(cudaFree(t));
  }
  // The late write, the only work queued since.
  if (path == "kernel") spin_then_write<<<1, 1024, 0, s>>>(a, words, spin);
  else if (peer) {
    CK(cudaSetDevice(1));
    spin_then_write<<<1, 1024, 0, s>>>(a, words, spin);
    CK(cudaSetDevice(0));
  }
  else if (path == "memset") CK(cudaMemsetAsync(a, 0xEE, bytes, s));
  else if (path == "memcpy") CK(cudaMemcpyAsync(a, src, bytes, cudaMemcpyDeviceToDevice, s));
  else if (path == "graph") CK(cudaGraphLaunch(exec, s));
  else {
    std::fprintf(stderr, "canary: unknown path %s\n", path.c_str());
    return 2;
  }
  CK(cudaGetLastError());
  const bool still_running = cudaStreamQuery(s) == cudaErrorNotReady;
  const auto f0 = std::chrono::steady_clock::now();
  CK(cudaFree(a));
  const auto t0 = std::chrono::steady_clock::now();
  const double free_us = std::chrono::duration<double, std::micro>(t0 - f0).count();
  // Whether the free waited for the late write (the driver's cudaFree synchronizes; for the
  // peer path this says whether it also waits for the other device).
  const bool pending_after_free = cudaStreamQuery(s) == cudaErrorNotReady;
  unsigned* b = nullptr;
  CK(cudaMalloc(&b, bytes));
  const double alloc_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  // Handed A back while the late write still runs: a violation whatever B ends up holding.
  const bool early = b == a && cudaStreamQuery(s) == cudaErrorNotReady;
  CK(cudaMemsetAsync(b, 0, bytes, s2));
  CK(cudaStreamSynchronize(s2));
  CK(cudaDeviceSynchronize());
  if (peer) {
    CK(cudaSetDevice(1));
    CK(cudaDeviceSynchronize());
    CK(cudaSetDevice(0));
  }
  CK(cudaMemset(count, 0, sizeof *count));
  count_nonzero<<<1024, 256>>>(b, words, count);
  unsigned long long nonzero = 0;
  CK(cudaMemcpy(&nonzero, count, sizeof nonzero, cudaMemcpyDeviceToHost));
  const bool ok = nonzero == 0 && !early;
  std::printf("{\"path\":\"%s\",\"bytes\":%zu,\"late_write_pending_at_free\":%s,\"reused\":%s,"
              "\"reused_while_pending\":%s,\"free_us\":%.1f,\"pending_after_free\":%s,\"alloc_us\":%.1f,\"nonzero_words\":%llu,\"ok\":%s}\n",
              path.c_str(), bytes, still_running ? "true" : "false", b == a ? "true" : "false", early ? "true" : "false",
              free_us, pending_after_free ? "true" : "false", alloc_us, nonzero, ok ? "true" : "false");
  return ok ? 0 : 1;
}

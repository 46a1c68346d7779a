// Interposer test: NVIDIA's CUDA runtime (shared) on the simulated driver under a pooled
// backend. Frameworks queue their work through the runtime's default stream; stream-ordered
// reuse (backends/pool/fence.hpp) helps them only if the work hooks see that stream as the
// legacy stream. For stream 0 and cudaStreamLegacy a block freed after a cudaMemsetAsync is
// reused at once with no event; for cudaStreamPerThread (another stream) only behind an event.
// Exits 0 when every check passes; prints each failure otherwise.
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <cstdint>
#include <cstdio>

int main() {
  if (cudaFree(nullptr) != cudaSuccess) return 2;  // the context, and libcuda loaded
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  auto count = reinterpret_cast<uint64_t (*)(const char*)>(h ? dlsym(h, "fakecuda_call_count") : nullptr);
  auto reset = reinterpret_cast<void (*)()>(h ? dlsym(h, "fakecuda_reset_counters") : nullptr);
  if (!count || !reset) {
    std::fprintf(stderr, "rt_stream_order: not the simulated driver\n");
    return 2;
  }
  struct Case {
    const char* name;
    cudaStream_t stream;
    bool at_once;
  };
  const Case cases[] = {{"stream 0", nullptr, true},
                        {"cudaStreamLegacy", cudaStreamLegacy, true},
                        {"cudaStreamPerThread", cudaStreamPerThread, false}};
  int failures = 0;
  for (const Case& c : cases) {
    void* a = nullptr;
    if (cudaMalloc(&a, 4096) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess) return 2;
    reset();
    if (cudaMemsetAsync(a, 1, 4096, c.stream) != cudaSuccess || cudaFree(a) != cudaSuccess) return 2;
    void* b = nullptr;
    if (cudaMalloc(&b, 4096) != cudaSuccess) return 2;
    const uint64_t events = count("cuEventRecord");
    const bool at_once = b == a && events == 0;
    std::printf("%s: reused %s, %llu event records\n", c.name, b == a ? "yes" : "no",
                static_cast<unsigned long long>(events));
    if (at_once != c.at_once) {
      std::fprintf(stderr, "rt_stream_order: %s: expected %s\n", c.name,
                   c.at_once ? "the block reused at once, no event" : "an event before any reuse");
      ++failures;
    }
    if (cudaFree(b) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess) return 2;
  }
  return failures == 0 ? 0 : 1;
}

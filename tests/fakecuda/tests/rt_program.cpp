// fakecuda: acceptance program — NVIDIA's CUDA runtime (static or shared) on the simulated driver.
// Exits 0 when every check passes; prints the first failure otherwise.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

int g_failures = 0;

#define CHECK_RT(call)                                                                              \
  do {                                                                                              \
    cudaError_t e_ = (call);                                                                        \
    if (e_ != cudaSuccess) {                                                                        \
      std::fprintf(stderr, "%s:%d: %s -> %d (%s)\n", __FILE__, __LINE__, #call, static_cast<int>(e_), \
                   cudaGetErrorString(e_));                                                         \
      std::exit(1);                                                                                 \
    }                                                                                               \
  } while (0)

#define EXPECT(cond)                                                        \
  do {                                                                      \
    if (!(cond)) {                                                          \
      std::fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #cond); \
      ++g_failures;                                                         \
    }                                                                       \
  } while (0)

void check_device(int dev, size_t expected_total) {
  CHECK_RT(cudaSetDevice(dev));
  CHECK_RT(cudaFree(nullptr));  // the usual way to create the context: succeeds, as on a GPU
  cudaDeviceProp prop;
  CHECK_RT(cudaGetDeviceProperties(&prop, dev));
  EXPECT(prop.major == 9 && prop.minor == 0);
  EXPECT(prop.multiProcessorCount == 132);
  EXPECT(prop.totalGlobalMem == expected_total);
  EXPECT(std::strlen(prop.name) > 0);

  size_t free0 = 0, total = 0;
  CHECK_RT(cudaMemGetInfo(&free0, &total));
  EXPECT(total == expected_total);

  // cudaMalloc / cudaMemcpy round trip.
  const size_t n = 1 << 20;
  void* d = nullptr;
  CHECK_RT(cudaMalloc(&d, n));
  size_t free1 = 0;
  CHECK_RT(cudaMemGetInfo(&free1, &total));
  EXPECT(free0 - free1 == n);
  std::vector<unsigned char> src(n), dst(n, 0);
  for (size_t i = 0; i < n; ++i) src[i] = static_cast<unsigned char>(i * 7 + dev);
  CHECK_RT(cudaMemcpy(d, src.data(), n, cudaMemcpyHostToDevice));
  CHECK_RT(cudaMemset(static_cast<char*>(d) + 16, 0xab, 16));
  CHECK_RT(cudaMemcpy(dst.data(), d, n, cudaMemcpyDeviceToHost));
  for (size_t i = 16; i < 32; ++i) src[i] = 0xab;
  EXPECT(std::memcmp(src.data(), dst.data(), n) == 0);

  cudaPointerAttributes attr;
  CHECK_RT(cudaPointerGetAttributes(&attr, d));
  EXPECT(attr.type == cudaMemoryTypeDevice);
  EXPECT(attr.device == dev);

  // Device-to-device.
  void* d2 = nullptr;
  CHECK_RT(cudaMalloc(&d2, n));
  CHECK_RT(cudaMemcpy(d2, d, n, cudaMemcpyDeviceToDevice));
  std::vector<unsigned char> back(n);
  CHECK_RT(cudaMemcpy(back.data(), d2, n, cudaMemcpyDefault));
  EXPECT(std::memcmp(back.data(), dst.data(), n) == 0);
  CHECK_RT(cudaFree(d2));
  CHECK_RT(cudaFree(d));

  // Out of memory is reported as such.
  void* huge = nullptr;
  EXPECT(cudaMalloc(&huge, expected_total + 1) == cudaErrorMemoryAllocation);
  (void)cudaGetLastError();

  // Stream-ordered allocator on a stream.
  cudaStream_t s;
  CHECK_RT(cudaStreamCreate(&s));
  void* a = nullptr;
  CHECK_RT(cudaMallocAsync(&a, 4096, s));
  std::vector<int> host(1024, 5), host_back(1024, 0);
  CHECK_RT(cudaMemcpyAsync(a, host.data(), 4096, cudaMemcpyHostToDevice, s));
  CHECK_RT(cudaMemcpyAsync(host_back.data(), a, 4096, cudaMemcpyDeviceToHost, s));
  CHECK_RT(cudaFreeAsync(a, s));
  CHECK_RT(cudaStreamSynchronize(s));
  EXPECT(host_back[1023] == 5);
  cudaEvent_t e0, e1;
  CHECK_RT(cudaEventCreate(&e0));
  CHECK_RT(cudaEventCreate(&e1));
  CHECK_RT(cudaEventRecord(e0, s));
  CHECK_RT(cudaEventRecord(e1, s));
  CHECK_RT(cudaEventSynchronize(e1));
  float ms = -1;
  CHECK_RT(cudaEventElapsedTime(&ms, e0, e1));
  EXPECT(ms >= 0);
  CHECK_RT(cudaEventDestroy(e0));
  CHECK_RT(cudaEventDestroy(e1));
  CHECK_RT(cudaStreamDestroy(s));

  // Managed and pinned memory.
  int* m = nullptr;
  CHECK_RT(cudaMallocManaged(&m, 1024 * sizeof(int)));
  m[10] = 42;
  CHECK_RT(cudaDeviceSynchronize());
  EXPECT(m[10] == 42);
  CHECK_RT(cudaPointerGetAttributes(&attr, m));
  EXPECT(attr.type == cudaMemoryTypeManaged);
  CHECK_RT(cudaFree(m));
  void* pinned = nullptr;
  CHECK_RT(cudaMallocHost(&pinned, 8192));
  CHECK_RT(cudaPointerGetAttributes(&attr, pinned));
  EXPECT(attr.type == cudaMemoryTypeHost);
  CHECK_RT(cudaFreeHost(pinned));

  size_t free_end = 0;
  CHECK_RT(cudaMemGetInfo(&free_end, &total));
  EXPECT(free_end == free0);
}

}  // namespace

int main(int argc, char** argv) {
  int want_devices = 1;
  if (argc == 3 && std::strcmp(argv[1], "--devices") == 0) want_devices = std::atoi(argv[2]);
  int count = -1;
  CHECK_RT(cudaGetDeviceCount(&count));
  EXPECT(count == want_devices);
  int version = 0;
  CHECK_RT(cudaDriverGetVersion(&version));
  EXPECT(version == 13000);
  // Sizes as the ctest entries configure them: 4G for one device, "1G,512M" for two.
  for (int dev = 0; dev < count; ++dev) {
    size_t expected = want_devices == 1 ? (size_t{4} << 30) : (dev == 0 ? size_t{1} << 30 : size_t{512} << 20);
    check_device(dev, expected);
  }
  if (g_failures) {
    std::fprintf(stderr, "%d check(s) failed\n", g_failures);
    return 1;
  }
  std::printf("fakecuda runtime checks passed on %d device(s)\n", count);
  return 0;
}

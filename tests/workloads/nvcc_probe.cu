// tests/workloads: an nvcc-built program with a real kernel, the most common shape of CUDA
// application. Allocates CHUNK-sized buffers with cudaMalloc until refused (or MAX), writes
// each with a kernel and checks a sample on the host, then prints one JSON line in the
// format of cuw_alloc_probe: {"allocated_bytes":..,"chunks":..,"first_error":..,
// "first_error_is_oom":..,"meminfo_total":..,"pid":..,"kernel_checked":..}.
// Built twice: static cudart (nvcc's default) and -cudart shared.
//   cuw_nvcc_probe [--chunk BYTES_MIB] [--max MIB] [--hold-ms N]
#include <cuda_runtime.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

__global__ void fill(unsigned* p, size_t n, unsigned v) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    p[i] = v ^ static_cast<unsigned>(i);
}

int main(int argc, char** argv) {
  size_t chunk_mib = 256, max_mib = 16384, hold_ms = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--chunk")) chunk_mib = std::strtoull(argv[i + 1], nullptr, 10);
    if (!std::strcmp(argv[i], "--max")) max_mib = std::strtoull(argv[i + 1], nullptr, 10);
    if (!std::strcmp(argv[i], "--hold-ms")) hold_ms = std::strtoull(argv[i + 1], nullptr, 10);
  }
  size_t free_b = 0, total_b = 0;
  cudaError_t e = cudaMemGetInfo(&free_b, &total_b);
  if (e != cudaSuccess) {
    std::printf("{\"unexpected_error\":\"%s\"}\n", cudaGetErrorName(e));
    return 1;
  }
  const size_t chunk = chunk_mib << 20;
  std::vector<unsigned*> bufs;
  size_t allocated = 0;
  cudaError_t first = cudaSuccess;
  bool kernel_ok = true;
  while (allocated + chunk <= (max_mib << 20)) {
    unsigned* p = nullptr;
    e = cudaMalloc(&p, chunk);
    if (e != cudaSuccess) {
      first = e;
      (void)cudaGetLastError();
      break;
    }
    const size_t n = chunk / sizeof(unsigned);
    const unsigned tag = static_cast<unsigned>(bufs.size()) * 2654435761u;
    fill<<<264, 256>>>(p, n, tag);
    unsigned sample = 0;
    const size_t at = n - 1;
    if (cudaMemcpy(&sample, p + at, sizeof sample, cudaMemcpyDeviceToHost) != cudaSuccess ||
        sample != (tag ^ static_cast<unsigned>(at)))
      kernel_ok = false;
    bufs.push_back(p);
    allocated += chunk;
  }
  if (hold_ms) usleep(static_cast<useconds_t>(hold_ms * 1000));
  for (unsigned* p : bufs) cudaFree(p);
  std::printf(
      "{\"allocated_bytes\":%zu,\"chunks\":%zu,\"first_error\":%s%s%s,\"first_error_is_oom\":%s,"
      "\"meminfo_total\":%zu,\"pid\":%d,\"kernel_checked\":%s}\n",
      allocated, bufs.size(), first == cudaSuccess ? "" : "\"", first == cudaSuccess ? "null" : cudaGetErrorName(first),
      first == cudaSuccess ? "" : "\"", first == cudaErrorMemoryAllocation ? "true" : "false", total_b,
      static_cast<int>(getpid()), kernel_ok ? "true" : "false");
  return kernel_ok ? 0 : 1;
}

// cuwarden bench: an end-to-end program that allocates per step, the kind CUWARDEN_POOL=cache
// is for (C++ solvers, older research code): every step cudaMalloc's its buffers, fills its
// input, runs a kernel, reads a slice of the result back (a loss, a residual), and
// cudaFree's the buffers.
//
//   cuw_bench_e2e [--steps 2000] [--warmup 50] [--elems 1048576] [--upload] [--hoist]
//                 [--check-every 1]
//
// --check-every N reads the slice back (a synchronizing cudaMemcpy) every N-th step only,
// as solvers that test their residual every few iterations do; the other steps queue their
// work and go on. N = 1 (the default) reads back every step.
// --hoist allocates the buffers once, before the loop: the same work with no allocation
// per step, the floor any allocator can reach on this program.
// --upload fills the input by copying it from pageable host memory every step (4 MiB by
// default) instead of on the device: that copy then dominates the step, whatever the
// allocator.
//
// The kernel is PTX text JIT-compiled by the driver (cuModuleLoadData), so the program needs
// no nvcc and runs on any CUDA machine: y[i] = x[i] * 1.0001 + step, then z[i] = y[i] - x[i].
// On the simulated driver (no kernels) it falls back to cudaMemsetAsync and says so.
// Prints one JSON line: seconds, microseconds per step, and a checksum (FNV-1a over the
// bytes copied back each step): bare and cached runs must print the same checksum.
// Exit 0; 1 bad usage; 2 CUDA error.
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "driver_api.hpp"

namespace {

const char kPtx[] = R"(
.version 8.0
.target sm_75
.address_size 64
.visible .entry step_kernel(.param .u64 px, .param .u64 py, .param .u64 pz, .param .u32 n, .param .f32 s)
{
  .reg .pred p;
  .reg .b32 r<6>;
  .reg .f32 f<6>;
  .reg .b64 d<8>;
  ld.param.u64 d1, [px];
  ld.param.u64 d2, [py];
  ld.param.u64 d3, [pz];
  ld.param.u32 r1, [n];
  ld.param.f32 f1, [s];
  mov.u32 r2, %ctaid.x;
  mov.u32 r3, %ntid.x;
  mov.u32 r4, %tid.x;
  mad.lo.s32 r5, r2, r3, r4;
  setp.ge.u32 p, r5, r1;
  @p bra DONE;
  cvta.to.global.u64 d1, d1;
  cvta.to.global.u64 d2, d2;
  cvta.to.global.u64 d3, d3;
  mul.wide.u32 d4, r5, 4;
  add.s64 d5, d1, d4;
  add.s64 d6, d2, d4;
  add.s64 d7, d3, d4;
  ld.global.f32 f2, [d5];
  mul.rn.f32 f3, f2, 0f3F800347;
  add.rn.f32 f3, f3, f1;
  st.global.f32 [d6], f3;
  sub.rn.f32 f4, f3, f2;
  st.global.f32 [d7], f4;
DONE:
  ret;
}
)";

[[noreturn]] void die(const char* what, cudaError_t e) {
  std::fprintf(stderr, "cuw_bench_e2e: %s: %s\n", what, cudaGetErrorName(e));
  std::exit(2);
}

#define RT(call)                                    \
  do {                                              \
    if (cudaError_t e_ = (call); e_ != cudaSuccess) \
      die(#call, e_);                               \
  } while (0)

}  // namespace

int main(int argc, char** argv) {
  long steps = 2000, warmup = 50;
  unsigned elems = 1u << 20;
  bool upload = false, hoist = false;
  long check_every = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--upload" || a == "--hoist") {
      (a == "--upload" ? upload : hoist) = true;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr,
                   "usage: cuw_bench_e2e [--steps N] [--warmup N] [--elems N] [--upload] [--hoist] [--check-every N]\n");
      return 1;
    }
    const long v = std::atol(argv[++i]);
    if (a == "--steps") steps = v;
    else if (a == "--warmup") warmup = v;
    else if (a == "--elems") elems = static_cast<unsigned>(v);
    else if (a == "--check-every" && v >= 1) check_every = v;
    else return 1;
  }
  RT(cudaSetDevice(0));
  RT(cudaDeviceSynchronize());  // creates the primary context

  // The kernel, through the driver API (dlopen'd: the same libcuda the runtime uses).
  cuw::bench::Driver drv;
  if (!drv.open(0)) return 2;
  using load_fn = CUresult (*)(CUmodule*, const void*);
  using getfn_fn = CUresult (*)(CUfunction*, CUmodule, const char*);
  using launch_fn = CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                 CUstream, void**, void**);
  auto load = reinterpret_cast<load_fn>(dlsym(drv.lib, "cuModuleLoadData"));
  auto getfn = reinterpret_cast<getfn_fn>(dlsym(drv.lib, "cuModuleGetFunction"));
  auto launch = reinterpret_cast<launch_fn>(dlsym(drv.lib, "cuLaunchKernel"));
  CUmodule mod = nullptr;
  CUfunction fn = nullptr;
  bool kernel = load && getfn && launch && load(&mod, kPtx) == CUDA_SUCCESS &&
                getfn(&fn, mod, "step_kernel") == CUDA_SUCCESS;
  if (!kernel) std::fprintf(stderr, "cuw_bench_e2e: no kernel (simulated driver?): using cudaMemsetAsync\n");

  const size_t bytes = static_cast<size_t>(elems) * sizeof(float);
  std::vector<float> host(elems);
  for (unsigned i = 0; i < elems; ++i) host[i] = static_cast<float>(i % 1000) * 0.25f;
  constexpr unsigned kSlice = 4096;
  std::vector<float> back(kSlice * 2);
  uint64_t checksum = 1469598103934665603ULL;

  float *hx = nullptr, *hy = nullptr, *hz = nullptr;
  void* hscratch = nullptr;
  auto alloc_all = [&](float** x, float** y, float** z, void** scratch) {
    RT(cudaMalloc(reinterpret_cast<void**>(x), bytes));
    RT(cudaMalloc(reinterpret_cast<void**>(y), bytes));
    RT(cudaMalloc(reinterpret_cast<void**>(z), bytes));
    RT(cudaMalloc(scratch, 64 << 10));
  };
  if (hoist) alloc_all(&hx, &hy, &hz, &hscratch);

  // Time inside the allocator's calls (cudaMalloc x4, cudaFree x4), summed over measured steps.
  double alloc_ns = 0, free_ns = 0;
  auto step = [&](long k, bool sum) {
    // Per step, as the programs this is for do: fresh buffers of a few sizes.
    float *x = hx, *y = hy, *z = hz;
    void* scratch = hscratch;
    if (!hoist) {
      const auto a0 = std::chrono::steady_clock::now();
      alloc_all(&x, &y, &z, &scratch);
      if (sum) alloc_ns += std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - a0).count();
    }
    if (upload) RT(cudaMemcpyAsync(x, host.data(), bytes, cudaMemcpyHostToDevice, nullptr));
    else RT(cudaMemsetAsync(x, static_cast<int>(0x3f + (k & 1)), bytes, nullptr));  // floats ~0.75 / 0.76
    RT(cudaMemsetAsync(scratch, static_cast<int>(k & 0xff), 64 << 10, nullptr));
    float s = static_cast<float>(k % 97);
    if (kernel) {
      CUdeviceptr px = reinterpret_cast<CUdeviceptr>(x), py = reinterpret_cast<CUdeviceptr>(y),
                  pz = reinterpret_cast<CUdeviceptr>(z);
      unsigned n = elems;
      void* args[] = {&px, &py, &pz, &n, &s};
      if (CUresult r = launch(fn, (elems + 255) / 256, 1, 1, 256, 1, 1, 0, nullptr, args, nullptr); r != CUDA_SUCCESS) {
        std::fprintf(stderr, "cuw_bench_e2e: cuLaunchKernel: %s\n", drv.err(r).c_str());
        std::exit(2);
      }
    } else {
      RT(cudaMemsetAsync(y, static_cast<int>(k & 0x7f), bytes, nullptr));
      RT(cudaMemsetAsync(z, static_cast<int>((k + 1) & 0x7f), bytes, nullptr));
    }
    const bool check = k % check_every == 0;
    if (check) {
      RT(cudaMemcpy(back.data(), y + (k % 16) * kSlice, kSlice * sizeof(float), cudaMemcpyDeviceToHost));
      if (upload) RT(cudaMemcpy(back.data() + kSlice, z, kSlice * sizeof(float), cudaMemcpyDeviceToHost));
    }
    if (!hoist) {
      const auto f0 = std::chrono::steady_clock::now();
      RT(cudaFree(scratch));
      RT(cudaFree(z));
      RT(cudaFree(y));
      RT(cudaFree(x));
      if (sum) free_ns += std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - f0).count();
    }
    if (sum && check) {
      const auto* b = reinterpret_cast<const unsigned char*>(back.data());
      for (size_t i = 0; i < back.size() * sizeof(float); ++i) checksum = (checksum ^ b[i]) * 1099511628211ULL;
    }
  };
  for (long k = 0; k < warmup; ++k) step(k, false);
  RT(cudaDeviceSynchronize());
  const auto t0 = std::chrono::steady_clock::now();
  for (long k = 0; k < steps; ++k) step(k, true);
  RT(cudaDeviceSynchronize());
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("{\"program\":\"cuw_bench_e2e\",\"check_every\":%ld,\"upload\":%s,\"hoist\":%s,\"cuwarden\":%d,\"kernel\":%s,\"steps\":%ld,\"elems\":%u,"
              "\"seconds\":%.4f,\"us_per_step\":%.2f,\"alloc_us_per_step\":%.2f,\"free_us_per_step\":%.2f,"
              "\"checksum\":\"%016llx\"}\n",
              check_every, upload ? "true" : "false", hoist ? "true" : "false", cuw::bench::cuwarden_loaded() ? 1 : 0, kernel ? "true" : "false", steps, elems, secs,
              secs * 1e6 / static_cast<double>(steps), alloc_ns / 1e3 / static_cast<double>(steps),
              free_ns / 1e3 / static_cast<double>(steps), static_cast<unsigned long long>(checksum));
  return 0;
}

// cuwarden bench: the CUDA driver API reached through dlopen("libcuda.so.1") + dlsym, the way
// cudart, XLA and other dlopen users reach it. With libcuwarden.so preloaded, dlsym hands
// back the interposer's hooks; without it, the driver's own entry points.
//
// Header-only, no cuw_common: a benchmark program stands for a foreign application.
#pragma once

#include <cuda.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <string>

namespace cuw::bench {

/// The driver entry points the benchmarks call, resolved once by open().
struct Driver {
  void* lib = nullptr;
  CUresult (*init)(unsigned) = nullptr;
  CUresult (*driver_version)(int*) = nullptr;
  CUresult (*device_get)(CUdevice*, int) = nullptr;
  CUresult (*device_name)(char*, int, CUdevice) = nullptr;
  CUresult (*ctx_retain)(CUcontext*, CUdevice) = nullptr;
  CUresult (*ctx_set_current)(CUcontext) = nullptr;
  CUresult (*mem_alloc)(CUdeviceptr*, size_t) = nullptr;      // cuMemAlloc_v2
  CUresult (*mem_free)(CUdeviceptr) = nullptr;                // cuMemFree_v2
  CUresult (*mem_get_info)(size_t*, size_t*) = nullptr;       // cuMemGetInfo_v2
  CUresult (*error_name)(CUresult, const char**) = nullptr;
  CUdevice device = 0;
  CUcontext ctx = nullptr;

  /// Name of a CUresult ("CUDA_ERROR_OUT_OF_MEMORY"), or its number.
  std::string err(CUresult r) const {
    const char* s = nullptr;
    if (error_name && error_name(r, &s) == CUDA_SUCCESS && s) return s;
    return std::to_string(static_cast<int>(r));
  }

  /// dlopen the driver, resolve every entry point, cuInit, retain and make current the
  /// primary context of `ordinal`. False with a message on stderr when anything fails.
  bool open(int ordinal = 0) {
    lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      std::fprintf(stderr, "bench: dlopen(libcuda.so.1) failed: %s\n", dlerror());
      return false;
    }
    bool ok = sym(init, "cuInit") && sym(driver_version, "cuDriverGetVersion") && sym(device_get, "cuDeviceGet") &&
              sym(device_name, "cuDeviceGetName") && sym(ctx_retain, "cuDevicePrimaryCtxRetain") &&
              sym(ctx_set_current, "cuCtxSetCurrent") && sym(mem_alloc, "cuMemAlloc_v2") &&
              sym(mem_free, "cuMemFree_v2") && sym(mem_get_info, "cuMemGetInfo_v2") &&
              sym(error_name, "cuGetErrorName");
    if (!ok) return false;
    CUresult r = init(0);
    if (r == CUDA_SUCCESS) r = device_get(&device, ordinal);
    if (r == CUDA_SUCCESS) r = ctx_retain(&ctx, device);
    if (r == CUDA_SUCCESS) r = ctx_set_current(ctx);
    if (r != CUDA_SUCCESS) {
      std::fprintf(stderr, "bench: driver initialisation failed: %s\n", err(r).c_str());
      return false;
    }
    return true;
  }

 private:
  template <class F>
  bool sym(F& f, const char* name) {
    f = reinterpret_cast<F>(dlsym(lib, name));
    if (!f) std::fprintf(stderr, "bench: libcuda.so.1 lacks %s\n", name);
    return f != nullptr;
  }
};

/// True if libcuwarden.so is mapped into this process (preloaded under any path).
inline bool cuwarden_loaded() {
  FILE* f = std::fopen("/proc/self/maps", "r");
  if (!f) return false;
  char line[4096];
  bool found = false;
  while (!found && std::fgets(line, sizeof line, f)) found = std::strstr(line, "libcuwarden.so") != nullptr;
  std::fclose(f);
  return found;
}

/// VmRSS of this process in bytes (0 if /proc is unreadable).
inline unsigned long long vm_rss_bytes() {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return 0;
  char line[256];
  unsigned long long kb = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "VmRSS: %llu kB", &kb) == 1) break;
  std::fclose(f);
  return kb * 1024;
}

}  // namespace cuw::bench

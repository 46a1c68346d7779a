/* tests/gpu/compat: a plain C program that uses the CUDA driver API and allocates until refused.
 *
 * Two builds of this one file (compat.sh compiles both on the GPU machine with gcc):
 *   default          dlopen("libcuda.so.1") + dlsym of cuInit, cuDevicePrimaryCtxRetain,
 *                    cuCtxSetCurrent, cuMemAlloc_v2, ... (how XLA, TensorFlow and cudart's
 *                    first lookup reach the driver): `gcc driver_probe.c -ldl`
 *   -DCUW_LINKED     linked against libcuda (the exported symbols, resolved by the dynamic
 *                    loader): `gcc -DCUW_LINKED driver_probe.c -L<cuda>/lib64/stubs -lcuda`
 * No CUDA header is needed: the few types and prototypes are declared here.
 *
 * Usage: cuw_driver_probe [--chunk-mib N] [--max-mib N] [--device N] [--hold-ms N]
 * Prints one JSON line (the compat.sh row format):
 *   {"compat":1,"pid":..,"device":0,"api":"driver-dlopen","held_bytes":..,"chunks":..,
 *    "framework_bytes":..,"framework_figure":"...","outcome":"CUDA_ERROR_OUT_OF_MEMORY",
 *    "oom":true,"meminfo_total":..,"message":".."}
 * Exit status: 0 when stopped by an out-of-memory refusal or at --max; 2 on any other error.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#ifndef CUW_LINKED
#include <dlfcn.h>
#endif

typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st* CUcontext;
typedef unsigned long long CUdeviceptr;
#define CUDA_SUCCESS 0
#define CUDA_ERROR_OUT_OF_MEMORY 2

typedef CUresult (*pfn_cuInit)(unsigned int);
typedef CUresult (*pfn_cuDriverGetVersion)(int*);
typedef CUresult (*pfn_cuDeviceGet)(CUdevice*, int);
typedef CUresult (*pfn_cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice);
typedef CUresult (*pfn_cuDevicePrimaryCtxRelease)(CUdevice);
typedef CUresult (*pfn_cuCtxSetCurrent)(CUcontext);
typedef CUresult (*pfn_cuMemGetInfo)(size_t*, size_t*);
typedef CUresult (*pfn_cuMemAlloc)(CUdeviceptr*, size_t);
typedef CUresult (*pfn_cuMemFree)(CUdeviceptr);
typedef CUresult (*pfn_cuMemsetD8)(CUdeviceptr, unsigned char, size_t);
typedef CUresult (*pfn_cuGetErrorName)(CUresult, const char**);

static struct {
  pfn_cuInit init;
  pfn_cuDriverGetVersion driver_version;
  pfn_cuDeviceGet device_get;
  pfn_cuDevicePrimaryCtxRetain retain;
  pfn_cuDevicePrimaryCtxRelease release;
  pfn_cuCtxSetCurrent set_current;
  pfn_cuMemGetInfo mem_info;
  pfn_cuMemAlloc alloc;
  pfn_cuMemFree free_;
  pfn_cuMemsetD8 memset_d8;
  pfn_cuGetErrorName error_name;
} cu;

#ifdef CUW_LINKED
CUresult cuInit(unsigned int);
CUresult cuDriverGetVersion(int*);
CUresult cuDeviceGet(CUdevice*, int);
CUresult cuDevicePrimaryCtxRetain(CUcontext*, CUdevice);
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuMemGetInfo_v2(size_t*, size_t*);
CUresult cuMemAlloc_v2(CUdeviceptr*, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemsetD8_v2(CUdeviceptr, unsigned char, size_t);
CUresult cuGetErrorName(CUresult, const char**);
static const char* const kApi = "driver-linked";
static int resolve(void) {
  cu.init = cuInit;
  cu.driver_version = cuDriverGetVersion;
  cu.device_get = cuDeviceGet;
  cu.retain = cuDevicePrimaryCtxRetain;
  cu.release = cuDevicePrimaryCtxRelease_v2;
  cu.set_current = cuCtxSetCurrent;
  cu.mem_info = cuMemGetInfo_v2;
  cu.alloc = cuMemAlloc_v2;
  cu.free_ = cuMemFree_v2;
  cu.memset_d8 = cuMemsetD8_v2;
  cu.error_name = cuGetErrorName;
  return 1;
}
#else
static const char* const kApi = "driver-dlopen";
static void* lib;
static int sym(void* out, const char* name) {
  void* p = dlsym(lib, name);
  if (p == NULL) {
    fprintf(stderr, "cuw_driver_probe: libcuda.so.1 lacks %s\n", name);
    return 0;
  }
  memcpy(out, &p, sizeof p);
  return 1;
}
static int resolve(void) {
  lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    fprintf(stderr, "cuw_driver_probe: dlopen(libcuda.so.1) failed: %s\n", dlerror());
    return 0;
  }
  return sym(&cu.init, "cuInit") && sym(&cu.driver_version, "cuDriverGetVersion") &&
         sym(&cu.device_get, "cuDeviceGet") && sym(&cu.retain, "cuDevicePrimaryCtxRetain") &&
         sym(&cu.release, "cuDevicePrimaryCtxRelease_v2") && sym(&cu.set_current, "cuCtxSetCurrent") &&
         sym(&cu.mem_info, "cuMemGetInfo_v2") && sym(&cu.alloc, "cuMemAlloc_v2") &&
         sym(&cu.free_, "cuMemFree_v2") && sym(&cu.memset_d8, "cuMemsetD8_v2") &&
         sym(&cu.error_name, "cuGetErrorName");
}
#endif

static const char* err_name(CUresult r) {
  static char buf[32];
  const char* n = NULL;
  if (cu.error_name != NULL && cu.error_name(r, &n) == CUDA_SUCCESS && n != NULL) return n;
  snprintf(buf, sizeof buf, "CUresult(%d)", r);
  return buf;
}

static void sleep_ms(unsigned long ms) {
  struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

static void print_result(int device, unsigned long long held, size_t chunks, const char* outcome, int oom,
                         size_t total, const char* message) {
  printf("{\"compat\":1,\"pid\":%d,\"device\":%d,\"api\":\"%s\",\"held_bytes\":%llu,\"chunks\":%zu,"
         "\"framework_bytes\":%llu,\"framework_figure\":\"bytes cuMemAlloc_v2 returned\","
         "\"outcome\":\"%s\",\"oom\":%s,\"meminfo_total\":%zu,\"message\":\"%s\"}\n",
         (int)getpid(), device, kApi, held, chunks, held, outcome, oom ? "true" : "false", total, message);
  fflush(stdout);
}

int main(int argc, char** argv) {
  unsigned long long chunk_mib = 256, max_mib = 16384, hold_ms = 0;
  int device = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--chunk-mib")) chunk_mib = strtoull(argv[i + 1], NULL, 10);
    else if (!strcmp(argv[i], "--max-mib")) max_mib = strtoull(argv[i + 1], NULL, 10);
    else if (!strcmp(argv[i], "--hold-ms")) hold_ms = strtoull(argv[i + 1], NULL, 10);
    else if (!strcmp(argv[i], "--device")) device = atoi(argv[i + 1]);
    else {
      fprintf(stderr, "usage: %s [--chunk-mib N] [--max-mib N] [--device N] [--hold-ms N]\n", argv[0]);
      return 1;
    }
  }
  if (chunk_mib == 0 || chunk_mib > max_mib) {
    fprintf(stderr, "cuw_driver_probe: bad --chunk-mib/--max-mib\n");
    return 1;
  }
  if (!resolve()) {
    print_result(device, 0, 0, "error: cannot resolve the driver API", 0, 0, "");
    return 2;
  }
  CUresult r;
  CUdevice dev = 0;
  CUcontext ctx = NULL;
  int version = 0;
  if ((r = cu.init(0)) != CUDA_SUCCESS || (r = cu.device_get(&dev, device)) != CUDA_SUCCESS ||
      (r = cu.retain(&ctx, dev)) != CUDA_SUCCESS || (r = cu.set_current(ctx)) != CUDA_SUCCESS) {
    char what[96];
    snprintf(what, sizeof what, "error: setup failed: %s", err_name(r));
    print_result(device, 0, 0, what, 0, 0, "");
    return 2;
  }
  cu.driver_version(&version);
  size_t free_b = 0, total_b = 0;
  cu.mem_info(&free_b, &total_b);
  fprintf(stderr, "cuw_driver_probe: pid %d api %s driver %d device %d meminfo free %zu total %zu\n",
          (int)getpid(), kApi, version, device, free_b, total_b);

  const size_t chunk = (size_t)chunk_mib << 20;
  const size_t max_chunks = (size_t)(max_mib / chunk_mib);
  CUdeviceptr* held = calloc(max_chunks + 1, sizeof *held);
  size_t n = 0;
  const char* outcome = "no error (reached --max-mib)";
  int oom = 0, unexpected = 0;
  while (n < max_chunks) {
    CUdeviceptr p = 0;
    r = cu.alloc(&p, chunk);
    if (r != CUDA_SUCCESS) {
      outcome = err_name(r);
      oom = r == CUDA_ERROR_OUT_OF_MEMORY;
      unexpected = !oom;
      break;
    }
    held[n++] = p;
    if ((r = cu.memset_d8(p, 0x5a, chunk)) != CUDA_SUCCESS) {  /* touch it: real memory */
      outcome = err_name(r);
      unexpected = 1;
      break;
    }
  }
  fprintf(stderr, "cuw_driver_probe: %zu chunks of %llu MiB, then %s\n", n, chunk_mib, outcome);
  if (hold_ms) sleep_ms(hold_ms);
  char outcome_copy[96];
  snprintf(outcome_copy, sizeof outcome_copy, "%s", outcome);
  for (size_t i = 0; i < n; ++i) cu.free_(held[i]);
  free(held);
  cu.release(dev);
  print_result(device, (unsigned long long)n * chunk, n, outcome_copy, oom, total_b, "");
  return unexpected ? 2 : 0;
}

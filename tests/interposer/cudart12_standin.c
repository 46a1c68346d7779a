/* Interposer tests: a stand-in for CUDA 12's shared runtime, for a process with two runtime
   majors loaded (test_cudart.cpp). Only CUDA 13's runtime is installed where the tests build,
   so this small library takes CUDA 12's place: soname libcudart.so.12, its symbols under the
   version node libcudart.so.12 as the real one's are (cudart12_standin.map), over the driver.
   Like the real runtime it initializes itself lazily (the device's primary context made
   current), keeps a per-thread last error, and reaches the driver through the process's
   libcuda (under libcuwarden, its hooks). It counts its calls, so a test can tell a call the
   runtime made from one the pool answered without it. */
#include <cuda.h>
#include <driver_types.h>
#include <stdint.h>
#include <string.h>

static __thread cudaError_t last_error = cudaSuccess;
static uint64_t calls_malloc, calls_free, calls_free_async;

static cudaError_t fail(CUresult r) {
  cudaError_t e = cudaErrorUnknown;
  if (r == CUDA_ERROR_OUT_OF_MEMORY) e = cudaErrorMemoryAllocation;
  else if (r == CUDA_ERROR_INVALID_VALUE) e = cudaErrorInvalidValue;
  else if (r == CUDA_ERROR_NOT_INITIALIZED) e = cudaErrorInitializationError;
  last_error = e;
  return e;
}

/* The runtime's lazy initialization: device 0's primary context, current on this thread. */
static CUresult init(void) {
  CUcontext c = NULL;
  if (cuCtxGetCurrent(&c) == CUDA_SUCCESS && c) return CUDA_SUCCESS;
  CUresult r = cuInit(0);
  CUdevice d = 0;
  if (r == CUDA_SUCCESS) r = cuDeviceGet(&d, 0);
  if (r == CUDA_SUCCESS) r = cuDevicePrimaryCtxRetain(&c, d);
  if (r == CUDA_SUCCESS) r = cuCtxSetCurrent(c);
  return r;
}

cudaError_t cudaMalloc(void** ptr, size_t size) {
  __atomic_add_fetch(&calls_malloc, 1, __ATOMIC_RELAXED);
  CUresult r = init();
  if (r != CUDA_SUCCESS) return fail(r);
  if (!ptr) return fail(CUDA_ERROR_INVALID_VALUE);
  if (size == 0) {
    *ptr = NULL;
    return cudaSuccess;
  }
  CUdeviceptr d = 0;
  r = cuMemAlloc(&d, size);
  if (r != CUDA_SUCCESS) return fail(r);
  *ptr = (void*)(uintptr_t)d;
  return cudaSuccess;
}

cudaError_t cudaFree(void* ptr) {
  __atomic_add_fetch(&calls_free, 1, __ATOMIC_RELAXED);
  CUresult r = init();
  if (r == CUDA_SUCCESS && ptr) r = cuMemFree((CUdeviceptr)(uintptr_t)ptr);
  return r == CUDA_SUCCESS ? cudaSuccess : fail(r);
}

cudaError_t cudaFreeAsync(void* ptr, cudaStream_t stream) {
  __atomic_add_fetch(&calls_free_async, 1, __ATOMIC_RELAXED);
  CUresult r = init();
  if (r == CUDA_SUCCESS) r = cuMemFreeAsync((CUdeviceptr)(uintptr_t)ptr, (CUstream)stream);
  return r == CUDA_SUCCESS ? cudaSuccess : fail(r);
}

cudaError_t cudaGetLastError(void) {
  const cudaError_t e = last_error;
  last_error = cudaSuccess;
  return e;
}

/* Calls of "cudaMalloc", "cudaFree" or "cudaFreeAsync" made so far. */
uint64_t cuwt_standin12_calls(const char* name) {
  if (!strcmp(name, "cudaMalloc")) return __atomic_load_n(&calls_malloc, __ATOMIC_RELAXED);
  if (!strcmp(name, "cudaFree")) return __atomic_load_n(&calls_free, __ATOMIC_RELAXED);
  if (!strcmp(name, "cudaFreeAsync")) return __atomic_load_n(&calls_free_async, __ATOMIC_RELAXED);
  return 0;
}

/* Interposer test: a library whose constructor uses CUDA. The program links it (and the
 * driver); libcuwarden.so is preloaded. glibc runs the constructors of a program's libraries
 * before those of preloaded ones that do not depend on them, so these hooked calls come
 * before libcuwarden's own constructor (LD_DEBUG=files shows the order): the hooks must
 * already work, count and cap (the thread state found through the GOT until then). */
#include <cuda.h>

CUresult cuwt_early_result[4] = {CUDA_ERROR_UNKNOWN, CUDA_ERROR_UNKNOWN, CUDA_ERROR_UNKNOWN, CUDA_ERROR_UNKNOWN};

__attribute__((constructor)) static void cuwt_early_ctor(void) {
  CUdevice dev = 0;
  CUcontext ctx = 0;
  if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
      cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS || cuCtxSetCurrent(ctx) != CUDA_SUCCESS)
    return;
  CUdeviceptr a = 0, b = 0;
  /* Under a 64 MiB cap: the first fits, the second would pass the cap. */
  cuwt_early_result[0] = cuMemAlloc(&a, 48u << 20);
  cuwt_early_result[1] = cuMemAlloc(&b, 48u << 20);
  cuwt_early_result[2] = a ? cuMemFree(a) : CUDA_ERROR_INVALID_VALUE;
  cuwt_early_result[3] = b ? cuMemFree(b) : CUDA_SUCCESS;
}

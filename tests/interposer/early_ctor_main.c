/* Interposer test: see early_ctor.c. Exit 0 when the constructor's calls were capped and
 * counted, and the freed bytes are free again for main. */
#include <cuda.h>
#include <stdio.h>

extern CUresult cuwt_early_result[4];

int main(void) {
  const CUresult* r = cuwt_early_result;
  printf("constructor: alloc %d, alloc past the cap %d, free %d, free %d\n", r[0], r[1], r[2], r[3]);
  if (r[0] != CUDA_SUCCESS || r[1] != CUDA_ERROR_OUT_OF_MEMORY || r[2] != CUDA_SUCCESS || r[3] != CUDA_SUCCESS) return 1;
  CUdeviceptr p = 0;
  const CUresult a = cuMemAlloc(&p, 48u << 20);
  const CUresult f = p ? cuMemFree(p) : CUDA_ERROR_INVALID_VALUE;
  printf("main: alloc %d, free %d\n", a, f);
  return a == CUDA_SUCCESS && f == CUDA_SUCCESS ? 0 : 1;
}

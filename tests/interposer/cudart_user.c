/* Interposer tests: a library that uses the shared CUDA runtime it is linked against, as an
   extension module does (test_cudart.cpp loads it with RTLD_LOCAL, as Python loads one).
   Built twice: against the toolkit's libcudart.so.13 and against the CUDA 12 stand-in
   (cudart12_standin.c); CUWT_HAVE_MALLOC_ASYNC (cudaMallocAsync, cudaSetDevice) only with
   the real runtime. */
#include <cuda_runtime_api.h>

int user_malloc(void** ptr, size_t size) { return (int)cudaMalloc(ptr, size); }
int user_free(void* ptr) { return (int)cudaFree(ptr); }
int user_free_async(void* ptr, void* stream) { return (int)cudaFreeAsync(ptr, (cudaStream_t)stream); }
int user_last_error(void) { return (int)cudaGetLastError(); }
#ifdef CUWT_HAVE_MALLOC_ASYNC
int user_malloc_async(void** ptr, size_t size) { return (int)cudaMallocAsync(ptr, size, 0); }
int user_set_device(int device) { return (int)cudaSetDevice(device); }
#endif

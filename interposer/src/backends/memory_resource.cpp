// cuwarden interposer: driver_resource, a pool's upstream: the real driver's calls.
#include "backends/memory_resource.hpp"

#include "base/real.hpp"

namespace cuw::backends {

CUresult driver_resource::do_allocate(CUdeviceptr* out, std::size_t bytes) {
  auto real = REAL(cuMemAlloc_v2);
  return real ? real(out, bytes) : CUDA_ERROR_NOT_INITIALIZED;
}

CUresult driver_resource::do_deallocate(CUdeviceptr p, std::size_t) {
  auto real = REAL(cuMemFree_v2);
  return real ? real(p) : CUDA_ERROR_NOT_INITIALIZED;
}

CUresult driver_resource::do_ipc_handle(CUipcMemHandle* handle, CUdeviceptr p) {
  auto real = REAL(cuIpcGetMemHandle);
  return real ? real(handle, p) : CUDA_ERROR_NOT_INITIALIZED;
}

}  // namespace cuw::backends

// cuwarden interposer: an allocation the driver refused, tried once more through the backend
// after the daemon made room (see start.hpp). Apart from start.cpp, which a test library
// replaces with its own choice of backend.
#include "backends/start.hpp"
#include "core/room.hpp"

namespace cuw::backends {

CUW_COLD CUresult allocate_after_room(core::Tracker& t, CUdeviceptr* dptr, size_t bytes, alloc_fn real) {
  if (!core::retry_after_room(t, bytes)) return CUDA_ERROR_OUT_OF_MEMORY;
  return with_backend(t, [&](auto& b) { return b.allocate(t, dptr, bytes, real); });
}

CUW_COLD CUresult allocate_async_after_room(core::Tracker& t, CUdeviceptr* dptr, size_t bytes, CUstream stream,
                                            alloc_async_fn real) {
  if (!core::retry_after_room(t, bytes)) return CUDA_ERROR_OUT_OF_MEMORY;
  return with_backend(t, [&](auto& b) { return b.allocate_async(t, dptr, bytes, stream, real); });
}

}  // namespace cuw::backends

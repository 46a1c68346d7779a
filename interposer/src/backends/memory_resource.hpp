// cuwarden interposer: the memory-resource interface the allocation backends implement
// (after RMM's device_memory_resource), and the passthrough backend.
//
// Shape: a public non-virtual allocate/deallocate calling private virtual do_allocate /
// do_deallocate; deallocate receives the size when the caller knows it. A resource that
// wraps another owns it (std::unique_ptr upstream), so a stack is one object:
//   cache_resource(driver_resource)            CUWARDEN_POOL=cache
//   vmm_resource(granule_resource)             CUWARDEN_POOL=vmm (next): physical granules
//                                              (cuMemCreate) stitched into reserved VA
// Besides allocate/deallocate a backend answers the questions the driver would otherwise
// answer wrongly for memory it carves (find: the user's allocation that contains an
// address, for cuMemGetAddressRange / cuPointerGetAttribute range attributes; ipc_handle:
// cuIpcGetMemHandle), and gives back memory it keeps (release).
//
// Caps are not here: a backend charges what it takes from the driver (Tracker::charge) and
// uncharges what it gives back. A pooling backend counts and records the program's own
// allocations (events) itself, under the tracker's lock with its free lists.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>

#include "backends/backend.hpp"

namespace cuw::backends {

/// A source of device memory for one CUDA context. Thread safety is each backend's to
/// state; the ones here are safe for any number of threads.
class memory_resource {
 public:
  memory_resource() = default;
  memory_resource(const memory_resource&) = delete;
  memory_resource& operator=(const memory_resource&) = delete;
  virtual ~memory_resource() = default;

  /// Allocate `bytes` (> 0) of device memory, aligned to at least 256 bytes (cudaMalloc's
  /// promise). Writes *out and returns CUDA_SUCCESS, or returns the error
  /// (CUDA_ERROR_OUT_OF_MEMORY when neither the cap nor the driver allows it).
  CUresult allocate(CUdeviceptr* out, std::size_t bytes) { return do_allocate(out, bytes); }

  /// Give back an allocation made by this resource. `bytes` is its size, or 0 when the
  /// caller does not know it (cuMemFree). Returns CUDA_ERROR_NOT_FOUND, having done nothing,
  /// when `p` is not the start of a live allocation of this resource.
  CUresult deallocate(CUdeviceptr p, std::size_t bytes = 0) { return do_deallocate(p, bytes); }

  /// The live allocation of this resource that contains address `p` (any byte inside it).
  bool find(CUdeviceptr p, range* out) { return do_find(p, out); }

  /// cuIpcGetMemHandle for an allocation of this resource that starts at `p`: CUDA_SUCCESS
  /// with a handle that maps exactly the allocation's bytes, or an error (never a handle
  /// to other bytes); CUDA_ERROR_NOT_FOUND when `p` is not this resource's.
  CUresult ipc_handle(CUipcMemHandle* handle, CUdeviceptr p) { return do_ipc_handle(handle, p); }

  /// Give memory kept for reuse back to the driver; returns the bytes given back.
  std::size_t release() { return do_release(); }

 private:
  virtual CUresult do_allocate(CUdeviceptr* out, std::size_t bytes) = 0;
  virtual CUresult do_deallocate(CUdeviceptr p, std::size_t bytes) = 0;
  virtual bool do_find(CUdeviceptr p, range* out) = 0;
  virtual CUresult do_ipc_handle(CUipcMemHandle* handle, CUdeviceptr p) = 0;
  virtual std::size_t do_release() = 0;
};

/// The passthrough backend: cuMemAlloc_v2 / cuMemFree_v2 of the real driver, nothing kept.
/// It does not know which pointers are its own: deallocate and find trust the caller, and
/// find answers false (the driver answers for its own allocations). Thread-safe (the
/// driver is). The calling thread's current context must be the resource's context.
class driver_resource final : public memory_resource {
 private:
  CUresult do_allocate(CUdeviceptr* out, std::size_t bytes) override;
  CUresult do_deallocate(CUdeviceptr p, std::size_t bytes) override;
  bool do_find(CUdeviceptr, range*) override { return false; }
  CUresult do_ipc_handle(CUipcMemHandle* handle, CUdeviceptr p) override;
  std::size_t do_release() override { return 0; }
};

}  // namespace cuw::backends

// cuwarden interposer: where a pool gets its memory (its upstream), after RMM's
// device_memory_resource: a public non-virtual allocate/deallocate calling private virtual
// do_allocate / do_deallocate; deallocate receives the size when the caller knows it. A pool
// owns its upstream (std::unique_ptr):
//   pool<whole_blocks> over driver_resource    CUWARDEN_POOL=cache: whole driver allocations
//   pool<granule_arena> over granule_resource  CUWARDEN_POOL=vmm: granules mapped into an arena (vmm/)
// An upstream exports what it allocated (ipc_handle) where the driver can describe exactly
// that. Caps are not here: the pool charges what it takes from its upstream (Tracker::charge)
// and uncharges what it gives back.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>

#include "backends/backend.hpp"

namespace cuw::core {
class Tracker;
}

namespace cuw::backends {

/// A source of device memory for one CUDA context. Thread safety is each resource's to
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

  /// cuIpcGetMemHandle for an allocation of this resource that starts at `p`: CUDA_SUCCESS
  /// with a handle that maps exactly the allocation's bytes, or an error (never a handle
  /// to other bytes); CUDA_ERROR_NOT_FOUND when `p` is not this resource's.
  CUresult ipc_handle(CUipcMemHandle* handle, CUdeviceptr p) { return do_ipc_handle(handle, p); }

 private:
  virtual CUresult do_allocate(CUdeviceptr* out, std::size_t bytes) = 0;
  virtual CUresult do_deallocate(CUdeviceptr p, std::size_t bytes) = 0;
  virtual CUresult do_ipc_handle(CUipcMemHandle* handle, CUdeviceptr p) = 0;
};

/// The driver itself: cuMemAlloc_v2 / cuMemFree_v2 / cuIpcGetMemHandle of the calling thread's
/// current context, which must be the pool's. It does not know which pointers are its own:
/// deallocate trusts the caller. Thread-safe (the driver is).
class driver_resource final : public memory_resource {
 public:
  /// `tracker` (may be null: tests) records each allocation as a pool segment of `ordinal`
  /// (core::Ledger::segment).
  explicit driver_resource(core::Tracker* tracker = nullptr, int ordinal = -1) : tracker_(tracker), ordinal_(ordinal) {}

 private:
  core::Tracker* tracker_;
  int ordinal_;
  CUresult do_allocate(CUdeviceptr* out, std::size_t bytes) override;
  CUresult do_deallocate(CUdeviceptr p, std::size_t bytes) override;
  CUresult do_ipc_handle(CUipcMemHandle* handle, CUdeviceptr p) override;
};

}  // namespace cuw::backends

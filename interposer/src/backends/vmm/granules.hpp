// cuwarden interposer: the `vmm` backend's upstream (CUWARDEN_POOL=vmm): physical memory in
// granules (cuMemCreate at the device's recommended granularity, 2 MiB on the H200), each a
// handle of its own, mapped into reserved virtual ranges. The pool (pool::pool<granule_arena>,
// granule_arena.hpp) reserves an arena and has granules mapped into it where its blocks need them
// (map_at), and takes slabs as ranges of one granule (map_range); what it gives back is
// unmapped (punch, deallocate) and its granules become idle, ready to be mapped again
// wherever a block needs them: free memory in pieces scattered over the arena becomes one
// contiguous block (stitching), so the pool never needs more physical memory than its blocks
// fill.
//
// One handle per granule: any granule can be unmapped, mapped elsewhere or released alone
// (cuMemCreate costs about the same per granule either way: 12 us on the H200). Access is set
// once per mapped stretch (cuMemSetAccess costs 16-18 ms per GiB whatever the number of
// calls), for the device and every peer the program enabled. Unmapping does not wait for the
// GPU: the pool gives back only blocks whose freeing work has completed.
//
// Caps count physical memory: every granule created is charged (Tracker::charge) and
// uncharged when released; the device's `reserved` counter holds every granule, its `cached`
// counter the idle ones (the pool adds the free blocks of its ranges).
#pragma once

#include <cuda.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

#include "backends/memory_resource.hpp"
#include "cuw/ring.hpp"

namespace cuw::core {
class Tracker;
}

namespace cuw::backends {

/// Granules of one device, mapped into ranges for one CUDA context's pool. Thread-safe (its
/// own mutex; the pool calls it from its slow path only).
class granule_resource final : public memory_resource {
 public:
  /// `ctx` and `device` (its CUDA ordinal, also the ring slot's index): where granules live.
  granule_resource(CUcontext ctx, CUdevice device, ring::DeviceSlot& slot, core::Tracker& tracker);
  ~granule_resource() override = default;  // gives back nothing: the pool lives as long as its context

  /// Whether the driver and the device support virtual memory management (every entry
  /// point found, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED set).
  bool supported() const noexcept { return supported_; }
  /// Bytes of one granule (cuMemGetAllocationGranularity, recommended; 2 MiB if it fails).
  uint64_t granularity() const noexcept { return granularity_; }

  /// Whether granules are created exportable as file descriptors (the device says it
  /// supports them): IPC of pooled blocks needs it.
  bool exportable() const noexcept { return prop_.requestedHandleTypes != CU_MEM_HANDLE_TYPE_NONE; }

  /// Bytes of device memory (cuDeviceTotalMem; 64 GiB if it fails): sizes an arena.
  uint64_t device_bytes() const noexcept { return device_bytes_; }

  /// Reserves `bytes` (a multiple of granularity()) of addresses, nothing mapped yet, aligned
  /// to granularity() or to `align` if larger (a multiple of it): CUDA_SUCCESS and *out, or the
  /// driver's error.
  CUresult reserve(CUdeviceptr* out, std::size_t bytes, std::size_t align = 0);
  /// Maps `bytes` (a multiple of granularity()) at `p`, unmapped addresses of a reserved
  /// range, from idle granules first, then new ones: the new ones are charged first
  /// (`quiet`: a refusal is not counted, see Tracker::charge); access for the device and
  /// the peers, set once. CUDA_SUCCESS, or CUDA_ERROR_OUT_OF_MEMORY (the cap, then `*by_cap`
  /// is set if given, or the driver; what was taken stays idle), or the driver's error.
  CUresult map_at(CUdeviceptr p, std::size_t bytes, bool quiet, bool* by_cap = nullptr);
  /// reserve() and map_at() for a whole new range; on failure nothing stays reserved.
  CUresult map_range(CUdeviceptr* out, std::size_t bytes, bool quiet, bool* by_cap = nullptr);
  /// Unmaps [p, p + bytes) of a live range (granule-aligned, inside one range): its granules
  /// become idle and the addresses a hole of the range. CUDA_ERROR_INVALID_VALUE for a span
  /// that is not one range's mapped granules.
  CUresult punch(CUdeviceptr p, std::size_t bytes);
  /// Bytes of idle granules (created, mapped nowhere).
  uint64_t idle_bytes() const;
  /// Releases idle granules (cuMemRelease) until at most `keep` bytes stay idle; the bytes
  /// released (uncharged, off `reserved` and `cached`).
  uint64_t trim(uint64_t keep);
  /// The context is gone: unmaps every range, frees its addresses and releases every
  /// granule (they outlive contexts); uncharges them and takes them off the counters.
  /// Returns the physical bytes given back.
  uint64_t forget() noexcept;
  /// Peer device `peer` may access every range, present and future (cuMemSetAccess).
  /// CUDA_SUCCESS, or the driver's error for the first range it refused.
  CUresult grant_peer(CUdevice peer);

 private:
  CUresult do_allocate(CUdeviceptr* out, std::size_t bytes) override { return map_range(out, bytes, false); }
  /// Unmaps the whole range at `p` (its holes aside): its granules become idle, its addresses
  /// are freed. CUDA_ERROR_NOT_FOUND when `p` starts no range.
  CUresult do_deallocate(CUdeviceptr p, std::size_t bytes) override;
  /// Legacy IPC handles cannot name mapped memory.
  CUresult do_ipc_handle(CUipcMemHandle*, CUdeviceptr) override { return CUDA_ERROR_NOT_SUPPORTED; }

  struct Range {
    uint64_t bytes = 0;                                  ///< reserved
    std::vector<CUmemGenericAllocationHandle> granules;  ///< by position, up to the highest mapped; 0: unmapped
  };
  CUresult set_access_locked(CUdeviceptr base, uint64_t bytes);
  void unmap_locked(CUdeviceptr base, Range& r, uint64_t first, uint64_t count);
  void counters(int64_t reserved, int64_t cached);

  CUcontext ctx_;
  CUdevice device_;
  ring::DeviceSlot& slot_;
  core::Tracker& tracker_;
  uint64_t granularity_;
  uint64_t device_bytes_ = 64ULL << 30;
  bool supported_ = false;
  CUmemAllocationProp prop_{};
  mutable std::mutex mu_;
  std::map<CUdeviceptr, Range> ranges_;
  std::vector<CUmemGenericAllocationHandle> idle_;
  std::vector<CUdevice> peers_;
  uint64_t held_ = 0;  ///< bytes of every granule this resource holds (mapped or idle)
};

}  // namespace cuw::backends

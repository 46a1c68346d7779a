// cuwarden interposer: granule_resource (granules.hpp): cuMemCreate'd granules mapped into
// reserved ranges, given back and mapped again elsewhere.
#include "backends/vmm/granules.hpp"

#include <algorithm>

#include "backends/driver_calls.hpp"
#include "base/real.hpp"
#include "core/ledger.hpp"
#include "core/tracker.hpp"

namespace cuw::backends {

namespace {

bool complete(const Vmm& v) {
  return v.granularity && v.create && v.release && v.reserve && v.address_free && v.map && v.unmap && v.set_access;
}

}  // namespace

granule_resource::granule_resource(CUcontext ctx, CUdevice device, ring::DeviceSlot& slot, core::Tracker& tracker)
    : ctx_(ctx), device_(device), slot_(slot), tracker_(tracker), granularity_(2ULL << 20) {
  prop_.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop_.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop_.location.id = device;
  size_t g = 0;
  if (complete(vmm()) && vmm().granularity(&g, &prop_, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) == CUDA_SUCCESS && g &&
      (g & (g - 1)) == 0)
    granularity_ = g;
  CUresult (*total)(size_t*, CUdevice) = nullptr;
  resolve(total, "cuDeviceTotalMem_v2");
  if (size_t bytes = 0; total && total(&bytes, device) == CUDA_SUCCESS && bytes) device_bytes_ = bytes;
  CUresult (*attribute)(int*, CUdevice_attribute, CUdevice) = nullptr;
  resolve(attribute, "cuDeviceGetAttribute");
  int vmm_ok = 0;
  // Exportable as file descriptors where the device supports it: IPC of pooled blocks hands
  // granules to another process (backends/ipc.hpp).
  int fd_ok = 0;
  if (attribute &&
      attribute(&fd_ok, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, device) == CUDA_SUCCESS && fd_ok)
    prop_.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  supported_ = complete(vmm()) && attribute &&
               attribute(&vmm_ok, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, device) == CUDA_SUCCESS &&
               vmm_ok == 1;
  // cuMemAlloc memory can be registered for GPUDirect RDMA (NCCL, UCX); mapped memory only when
  // created so (as PyTorch's expandable segments do), where the device allows it.
  int rdma = 0;
  if (attribute &&
      attribute(&rdma, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, device) == CUDA_SUCCESS && rdma)
    prop_.allocFlags.gpuDirectRDMACapable = 1;
}

void granule_resource::counters(int64_t reserved, int64_t cached) {
  core::Ledger(tracker_, slot_, device_).moved(reserved, cached);  // atomics: no lock
}

CUresult granule_resource::set_access_locked(CUdeviceptr base, uint64_t bytes) {
  CUmemAccessDesc desc[1 + 16] = {};
  size_t n = 0;
  desc[n].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  desc[n].location.id = device_;
  desc[n++].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  for (CUdevice p : peers_) {
    if (n == std::size(desc)) break;
    desc[n].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    desc[n].location.id = p;
    desc[n++].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  }
  return vmm().set_access(base, bytes, desc, n);
}

CUresult granule_resource::reserve(CUdeviceptr* out, std::size_t bytes, std::size_t align) {
  const Vmm& v = vmm();
  if (!complete(v)) return CUDA_ERROR_NOT_SUPPORTED;
  if (bytes == 0 || bytes % granularity_ || align % granularity_) return CUDA_ERROR_INVALID_VALUE;
  CtxScope scope(ctx_);
  CUdeviceptr base = 0;
  const CUresult r = v.reserve(&base, bytes, std::max(align, granularity_), 0, 0);
  if (r != CUDA_SUCCESS) return r;
  std::lock_guard<std::mutex> g(mu_);
  Range rg;
  rg.bytes = bytes;
  ranges_.emplace(base, std::move(rg));
  *out = base;
  return CUDA_SUCCESS;
}

CUresult granule_resource::map_at(CUdeviceptr p, std::size_t bytes, bool quiet, bool* by_cap) {
  const Vmm& v = vmm();
  if (!complete(v)) return CUDA_ERROR_NOT_SUPPORTED;
  if (bytes == 0 || bytes % granularity_) return CUDA_ERROR_INVALID_VALUE;
  const uint64_t count = bytes / granularity_;
  CtxScope scope(ctx_);
  std::lock_guard<std::mutex> g(mu_);
  auto it = ranges_.upper_bound(p);
  if (it == ranges_.begin()) return CUDA_ERROR_INVALID_VALUE;
  --it;
  const CUdeviceptr base = it->first;
  Range& rg = it->second;
  if (p < base || (p - base) % granularity_ || p + bytes > base + rg.bytes) return CUDA_ERROR_INVALID_VALUE;
  const uint64_t first = (p - base) / granularity_;
  for (uint64_t i = first; i < first + count && i < rg.granules.size(); ++i)
    if (rg.granules[i]) return CUDA_ERROR_INVALID_VALUE;  // already mapped
  // New granules for what the idle ones do not cover: charged first (room for their handles
  // made before: nothing can fail between the charge and the driver's answer but the driver).
  const uint64_t have = std::min<uint64_t>(idle_.size(), count);
  const uint64_t fresh = count - have;
  try {
    idle_.reserve(idle_.size() + fresh);
    if (rg.granules.size() < first + count) rg.granules.resize(first + count, 0);
  } catch (...) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  if (fresh) {
    if (tracker_.charge(slot_, device_, fresh * granularity_, ring::Api::cuMemAlloc, false, quiet) !=
        core::Tracker::Charge::ok) {
      if (by_cap) *by_cap = true;
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    uint64_t made = 0;
    CUresult r = CUDA_SUCCESS;
    for (; made < fresh; ++made) {
      CUmemGenericAllocationHandle h = 0;
      r = v.create(&h, granularity_, &prop_, 0);
      core::Ledger::called(slot_, core::Ledger::Call::take);
      if (r != CUDA_SUCCESS && r != CUDA_ERROR_OUT_OF_MEMORY && prop_.allocFlags.gpuDirectRDMACapable) {
        prop_.allocFlags.gpuDirectRDMACapable = 0;  // refused with it (some platforms): without from now on
        r = v.create(&h, granularity_, &prop_, 0);
        core::Ledger::called(slot_, core::Ledger::Call::take);
      }
      if (r != CUDA_SUCCESS) break;
      idle_.push_back(h);
    }
    held_ += made * granularity_;
    counters(static_cast<int64_t>(made * granularity_), static_cast<int64_t>(made * granularity_));
    if (made < fresh) {
      tracker_.uncharge(slot_, (fresh - made) * granularity_);
      return r;  // what was made stays idle (charged): the pool trims or uses it
    }
  }
  CUresult r = CUDA_SUCCESS;
  uint64_t mapped = 0;
  const auto take = idle_.end() - static_cast<std::ptrdiff_t>(count);
  while (mapped < count) {
    r = v.map(p + mapped * granularity_, granularity_, 0, take[static_cast<std::ptrdiff_t>(mapped)], 0);
    core::Ledger::called(slot_, core::Ledger::Call::take);
    if (r != CUDA_SUCCESS) break;
    ++mapped;
  }
  if (r == CUDA_SUCCESS) r = set_access_locked(p, bytes);
  if (r != CUDA_SUCCESS) {
    for (uint64_t i = 0; i < mapped; ++i) v.unmap(p + i * granularity_, granularity_);
    core::Ledger::called(slot_, core::Ledger::Call::give, mapped);
    return r;  // the granules stay idle
  }
  for (uint64_t i = 0; i < count; ++i) rg.granules[first + i] = take[static_cast<std::ptrdiff_t>(i)];
  idle_.resize(idle_.size() - count);
  core::Ledger::segment(tracker_, device_, p, bytes, true, granularity_);
  return CUDA_SUCCESS;
}

CUresult granule_resource::map_range(CUdeviceptr* out, std::size_t bytes, bool quiet, bool* by_cap) {
  CUdeviceptr base = 0;
  CUresult r = reserve(&base, bytes);
  if (r != CUDA_SUCCESS) return r;
  r = map_at(base, bytes, quiet, by_cap);
  if (r != CUDA_SUCCESS) {
    do_deallocate(base, bytes);
    return r;
  }
  *out = base;
  return CUDA_SUCCESS;
}

void granule_resource::unmap_locked(CUdeviceptr base, Range& r, uint64_t first, uint64_t count) {
  uint64_t run = 0;  // granules unmapped in a row, recorded as one segment_free
  for (uint64_t i = first; i < first + count; ++i) {
    CUmemGenericAllocationHandle& h = r.granules[i];
    if (!h) {
      if (run)
        core::Ledger::segment(tracker_, device_, base + (i - run) * granularity_, run * granularity_, false,
                              granularity_);
      run = 0;
      continue;
    }
    vmm().unmap(base + i * granularity_, granularity_);
    core::Ledger::called(slot_, core::Ledger::Call::give);
    idle_.push_back(h);
    h = 0;
    ++run;
  }
  if (run)
    core::Ledger::segment(tracker_, device_, base + (first + count - run) * granularity_, run * granularity_, false,
                            granularity_);
}

CUresult granule_resource::punch(CUdeviceptr p, std::size_t bytes) {
  CtxScope scope(ctx_);
  std::lock_guard<std::mutex> g(mu_);
  auto it = ranges_.upper_bound(p);
  if (it == ranges_.begin()) return CUDA_ERROR_INVALID_VALUE;
  --it;
  Range& r = it->second;
  if (p < it->first || p + bytes > it->first + r.granules.size() * granularity_ || (p - it->first) % granularity_ ||
      bytes % granularity_)
    return CUDA_ERROR_INVALID_VALUE;
  try {
    idle_.reserve(idle_.size() + bytes / granularity_);
  } catch (...) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  unmap_locked(it->first, r, (p - it->first) / granularity_, bytes / granularity_);
  return CUDA_SUCCESS;
}

CUresult granule_resource::do_deallocate(CUdeviceptr p, std::size_t) {
  CtxScope scope(ctx_);
  std::lock_guard<std::mutex> g(mu_);
  auto it = ranges_.find(p);
  if (it == ranges_.end()) return CUDA_ERROR_NOT_FOUND;
  Range& r = it->second;
  try {
    idle_.reserve(idle_.size() + r.granules.size());
  } catch (...) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  unmap_locked(p, r, 0, r.granules.size());
  vmm().address_free(p, r.bytes);
  ranges_.erase(it);
  return CUDA_SUCCESS;
}

uint64_t granule_resource::idle_bytes() const {
  std::lock_guard<std::mutex> g(mu_);
  return idle_.size() * granularity_;
}

uint64_t granule_resource::trim(uint64_t keep) {
  CtxScope scope(ctx_);
  std::lock_guard<std::mutex> g(mu_);
  uint64_t released = 0;
  while (!idle_.empty() && idle_.size() * granularity_ > keep) {
    const CUresult r = vmm().release(idle_.back());
    core::Ledger::called(slot_, core::Ledger::Call::give);
    if (r != CUDA_SUCCESS) break;
    idle_.pop_back();
    released += granularity_;
  }
  if (released) {
    held_ -= released;
    counters(-static_cast<int64_t>(released), -static_cast<int64_t>(released));
    tracker_.uncharge(slot_, released);
  }
  return released;
}

uint64_t granule_resource::forget() noexcept {
  // Unlike cuMemAlloc memory, physical allocations and address reservations outlive the
  // context that made them: give them back. No context scope: the context is gone, and
  // these calls need none.
  std::lock_guard<std::mutex> g(mu_);
  const Vmm& v = vmm();
  const uint64_t total = held_;
  const uint64_t idle = idle_.size() * granularity_;
  for (auto& [base, r] : ranges_) {
    for (uint64_t i = 0; i < r.granules.size(); ++i) {
      if (!r.granules[i]) continue;
      v.unmap(base + i * granularity_, granularity_);
      v.release(r.granules[i]);
      core::Ledger::segment(tracker_, device_, base + i * granularity_, granularity_, false, granularity_);
    }
    v.address_free(base, r.bytes);
  }
  for (CUmemGenericAllocationHandle h : idle_) v.release(h);
  ranges_.clear();
  idle_.clear();
  held_ = 0;
  counters(-static_cast<int64_t>(total), -static_cast<int64_t>(idle));
  tracker_.uncharge(slot_, total);
  return total;
}

CUresult granule_resource::grant_peer(CUdevice peer) {
  CtxScope scope(ctx_);
  std::lock_guard<std::mutex> g(mu_);
  if (peer == device_ || std::find(peers_.begin(), peers_.end(), peer) != peers_.end()) return CUDA_SUCCESS;
  peers_.push_back(peer);
  CUresult first = CUDA_SUCCESS;
  for (auto& [base, r] : ranges_) {
    // Each mapped stretch of the range (holes have no access to set).
    for (uint64_t i = 0; i < r.granules.size();) {
      if (!r.granules[i]) {
        ++i;
        continue;
      }
      uint64_t j = i;
      while (j < r.granules.size() && r.granules[j]) ++j;
      const CUresult e = set_access_locked(base + i * granularity_, (j - i) * granularity_);
      if (e != CUDA_SUCCESS && first == CUDA_SUCCESS) first = e;
      i = j;
    }
  }
  return first;
}

}  // namespace cuw::backends

// fakecuda: virtual memory management — cuMemCreate / AddressReserve / Map / SetAccess / Unmap.
//
// A physical allocation is a memfd of its size (device ones count against the device), an
// address reservation is a PROT_NONE mapping, cuMemMap maps the memfd MAP_SHARED|MAP_FIXED at
// the address (so two mappings of one handle share their bytes) still PROT_NONE, and
// cuMemSetAccess makes it readable and writable. A handle's memory is freed once it has been
// released and is no longer mapped, as with the driver. Granularity: 2 MiB (minimum and
// recommended), sizes and offsets must be multiples of it.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <set>

#include "internal.hpp"

namespace fc {
namespace {

constexpr size_t kGranularity = kVmmGranularity;

struct PhysHandle {
  int fd = -1;
  size_t size = 0;
  CUmemAllocationProp prop{};
  int ordinal = -1;  // device it counts against; -1 for host memory
  int refs = 1;      // the creator's reference + one per mapping + one per retain
  uint64_t id = 0;
  bool shared = false;  // exported or imported: the checkpoint cannot carry it
};

struct Mapping {
  uintptr_t base = 0;
  size_t size = 0;
  size_t offset = 0;
  PhysHandle* handle = nullptr;
  uint64_t readers = 0;  // devices (bit = ordinal) given read access by cuMemSetAccess
  uint64_t writers = 0;  // ... read and write
};

std::mutex g_vmm_mu;
auto& g_handles = *new std::set<PhysHandle*>;  // these are never destroyed: used at exit
auto& g_reservations = *new std::map<uintptr_t, size_t>;  // base -> size
auto& g_mappings = *new std::map<uintptr_t, Mapping>;  // base -> mapping
std::atomic<uint64_t> g_next_handle_id{1};

// Drops one reference. Caller holds g_vmm_mu.
void unref_locked(PhysHandle* h) {
  if (--h->refs > 0) return;
  close(h->fd);
  if (h->ordinal >= 0) device(h->ordinal)->unreserve(h->size);
  g_handles.erase(h);
  delete h;
}

PhysHandle* handle_from(CUmemGenericAllocationHandle h) {
  auto* p = reinterpret_cast<PhysHandle*>(h);
  return g_handles.count(p) ? p : nullptr;
}

bool inside_reservation_locked(uintptr_t addr, size_t size) {
  auto it = g_reservations.upper_bound(addr);
  if (it == g_reservations.begin()) return false;
  --it;
  return addr >= it->first && addr + size <= it->first + it->second;
}

bool valid_location(const CUmemLocation& loc, int* ordinal) {
  switch (loc.type) {
    case CU_MEM_LOCATION_TYPE_DEVICE:
      if (!device(loc.id)) return false;
      *ordinal = loc.id;
      return true;
    case CU_MEM_LOCATION_TYPE_HOST:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT: *ordinal = -1; return true;
    default: return false;
  }
}

}  // namespace
}  // namespace fc

using namespace fc;

bool fc::vmm_reservation_of(uintptr_t addr, uintptr_t* base, size_t* size) {
  std::lock_guard lock(g_vmm_mu);
  auto it = g_reservations.upper_bound(addr);
  if (it == g_reservations.begin()) return false;
  --it;
  if (addr - it->first >= it->second) return false;
  *base = it->first;
  *size = it->second;
  return true;
}

const char* fc::vmm_uncarryable() {
  std::lock_guard lock(g_vmm_mu);
  for (const PhysHandle* h : g_handles)
    if (h->shared) return "a cuMem handle exported or imported as a shareable handle";
  return nullptr;
}

std::vector<std::pair<int, size_t>> fc::vmm_device_handles() {
  std::lock_guard lock(g_vmm_mu);
  std::vector<std::pair<int, size_t>> out;
  for (const PhysHandle* h : g_handles)
    if (h->ordinal >= 0) out.emplace_back(h->fd, h->size);
  return out;
}

FC_API CUresult cuMemGetAllocationGranularity(size_t* granularity, const CUmemAllocationProp* prop,
                                              CUmemAllocationGranularity_flags option) {
  FC_ENTER();
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!granularity || !prop) return CUDA_ERROR_INVALID_VALUE;
  if (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM && option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)
    return CUDA_ERROR_INVALID_VALUE;
  int ordinal;
  if (!valid_location(prop->location, &ordinal)) return CUDA_ERROR_INVALID_DEVICE;
  *granularity = kGranularity;
  return CUDA_SUCCESS;
}

FC_API CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp* prop,
                            unsigned long long flags) {
  FC_ENTER();
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!handle || !prop || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (size == 0 || size % kGranularity != 0) return CUDA_ERROR_INVALID_VALUE;
  if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED) return CUDA_ERROR_INVALID_VALUE;
  int ordinal;
  if (!valid_location(prop->location, &ordinal)) return CUDA_ERROR_INVALID_DEVICE;
  if (ordinal >= 0 && !device(ordinal)->reserve(size)) return CUDA_ERROR_OUT_OF_MEMORY;
  int fd = memfd_create("fakecuda-vmm", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(size)) != 0) {
    if (fd >= 0) close(fd);
    if (ordinal >= 0) device(ordinal)->unreserve(size);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  auto* h = new PhysHandle;
  h->fd = fd;
  h->size = size;
  h->prop = *prop;
  h->ordinal = ordinal;
  h->id = g_next_handle_id.fetch_add(1);
  std::lock_guard lock(g_vmm_mu);
  g_handles.insert(h);
  *handle = reinterpret_cast<CUmemGenericAllocationHandle>(h);
  return CUDA_SUCCESS;
}

FC_API CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  FC_ENTER();
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  std::lock_guard lock(g_vmm_mu);
  PhysHandle* h = handle_from(handle);
  if (!h) return CUDA_ERROR_INVALID_VALUE;
  unref_locked(h);
  return CUDA_SUCCESS;
}

FC_API CUresult cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                    unsigned long long flags) {
  FC_ENTER();
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!ptr || size == 0 || size % kGranularity != 0 || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (alignment == 0) alignment = kGranularity;
  if (alignment & (alignment - 1)) return CUDA_ERROR_INVALID_VALUE;
  // Try the hint first (without replacing anything), then over-reserve and align.
  if (addr) {
    void* p = mmap(reinterpret_cast<void*>(addr), size, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
    if (p != MAP_FAILED && reinterpret_cast<uintptr_t>(p) % alignment == 0) {
      std::lock_guard lock(g_vmm_mu);
      g_reservations[reinterpret_cast<uintptr_t>(p)] = size;
      *ptr = reinterpret_cast<CUdeviceptr>(p);
      return CUDA_SUCCESS;
    }
    if (p != MAP_FAILED) munmap(p, size);
  }
  size_t span = size + alignment;
  void* p = mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  auto raw = reinterpret_cast<uintptr_t>(p);
  uintptr_t base = (raw + alignment - 1) / alignment * alignment;
  if (base > raw) munmap(p, base - raw);
  uintptr_t end = base + size;
  if (raw + span > end) munmap(reinterpret_cast<void*>(end), raw + span - end);
  std::lock_guard lock(g_vmm_mu);
  g_reservations[base] = size;
  *ptr = base;
  return CUDA_SUCCESS;
}

FC_API CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  FC_ENTER();
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  std::lock_guard lock(g_vmm_mu);
  auto it = g_reservations.find(ptr);
  if (it == g_reservations.end() || it->second != size) return CUDA_ERROR_INVALID_VALUE;
  auto m = g_mappings.lower_bound(ptr);
  if (m != g_mappings.end() && m->first < ptr + size) return CUDA_ERROR_INVALID_VALUE;  // still mapped
  munmap(reinterpret_cast<void*>(ptr), size);
  g_reservations.erase(it);
  return CUDA_SUCCESS;
}

FC_API CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                         unsigned long long flags) {
  FC_ENTER();
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (flags != 0 || size == 0 || size % kGranularity || offset % kGranularity || ptr % kGranularity)
    return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(g_vmm_mu);
  PhysHandle* h = handle_from(handle);
  if (!h || offset + size > h->size) return CUDA_ERROR_INVALID_VALUE;
  if (!inside_reservation_locked(ptr, size)) return CUDA_ERROR_INVALID_VALUE;
  auto m = g_mappings.lower_bound(ptr);
  if (m != g_mappings.end() && m->first < ptr + size) return CUDA_ERROR_ALREADY_MAPPED;
  if (m != g_mappings.begin() && std::prev(m)->first + std::prev(m)->second.size > ptr) return CUDA_ERROR_ALREADY_MAPPED;
  void* p = mmap(reinterpret_cast<void*>(ptr), size, PROT_NONE, MAP_SHARED | MAP_FIXED, h->fd,
                 static_cast<off_t>(offset));
  if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  h->refs++;
  static CallCounter mapped{"cuMemMap bytes"};
  mapped.count.fetch_add(size, std::memory_order_relaxed);
  g_mappings[ptr] = Mapping{ptr, size, offset, h};
  Allocation a;
  a.base = ptr;
  a.size = size;
  a.block = size;
  a.kind = AllocKind::vmm;
  a.ordinal = h->ordinal >= 0 ? h->ordinal : 0;
  a.ctx = current_context();
  a.buffer_id = h->id;
  table_insert(a);
  return CUDA_SUCCESS;
}

FC_API CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  FC_ENTER();
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  std::lock_guard lock(g_vmm_mu);
  auto it = g_mappings.lower_bound(ptr);
  if (it == g_mappings.end() || it->first != ptr) return CUDA_ERROR_INVALID_VALUE;
  std::vector<uintptr_t> covered;
  for (auto m = it; m != g_mappings.end() && m->first < ptr + size; ++m) {
    if (m->first + m->second.size > ptr + size) return CUDA_ERROR_INVALID_VALUE;  // partial unmap
    covered.push_back(m->first);
  }
  static CallCounter unmapped{"cuMemUnmap bytes"};
  for (uintptr_t base : covered) {
    Mapping mp = g_mappings[base];
    unmapped.count.fetch_add(mp.size, std::memory_order_relaxed);
    // Back to a plain reservation at the same address.
    mmap(reinterpret_cast<void*>(base), mp.size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED,
         -1, 0);
    g_mappings.erase(base);
    table_erase(base, nullptr);
    unref_locked(mp.handle);
  }
  return CUDA_SUCCESS;
}

FC_API CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count) {
  FC_ENTER();
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!desc || count == 0 || size == 0) return CUDA_ERROR_INVALID_VALUE;
  int prot = PROT_NONE;
  uint64_t readers = 0, writers = 0, cleared = 0;
  for (size_t i = 0; i < count; ++i) {
    int ordinal;
    if (!valid_location(desc[i].location, &ordinal)) return CUDA_ERROR_INVALID_DEVICE;
    const uint64_t bit = ordinal >= 0 && ordinal < 64 ? uint64_t{1} << ordinal : 0;
    if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE) prot = PROT_READ | PROT_WRITE, writers |= bit;
    else if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READ && prot == PROT_NONE) prot = PROT_READ;
    if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READ) readers |= bit;
    if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_NONE) cleared |= bit;
  }
  std::lock_guard lock(g_vmm_mu);
  // The whole range must be mapped.
  uintptr_t cur = ptr;
  auto it = g_mappings.upper_bound(ptr);
  if (it == g_mappings.begin()) return CUDA_ERROR_INVALID_VALUE;
  --it;
  for (; it != g_mappings.end() && cur < ptr + size; ++it) {
    if (it->first > cur || it->first + it->second.size <= cur) return CUDA_ERROR_INVALID_VALUE;
    cur = it->first + it->second.size;
  }
  if (cur < ptr + size) return CUDA_ERROR_INVALID_VALUE;
  // The host mapping keeps the widest access any device has (the host stands in for all).
  for (auto m = g_mappings.lower_bound(ptr); m != g_mappings.end() && m->first < ptr + size; ++m) {
    m->second.writers = (m->second.writers | writers) & ~cleared & ~readers;
    m->second.readers = (m->second.readers | readers) & ~cleared & ~writers;
    if (m->second.writers) prot = PROT_READ | PROT_WRITE;
  }
  if (mprotect(reinterpret_cast<void*>(ptr), size, prot) != 0) return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}

FC_API CUresult cuMemGetAccess(unsigned long long* flags, const CUmemLocation* location, CUdeviceptr ptr) {
  FC_ENTER();
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!flags || !location) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(g_vmm_mu);
  auto it = g_mappings.upper_bound(ptr);
  if (it == g_mappings.begin()) return CUDA_ERROR_INVALID_VALUE;
  --it;
  if (ptr >= it->first + it->second.size) return CUDA_ERROR_INVALID_VALUE;
  int ordinal;
  if (!valid_location(*location, &ordinal)) return CUDA_ERROR_INVALID_DEVICE;
  const uint64_t bit = ordinal >= 0 && ordinal < 64 ? uint64_t{1} << ordinal : 0;
  *flags = it->second.writers & bit  ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE
           : it->second.readers & bit ? CU_MEM_ACCESS_FLAGS_PROT_READ
                                      : CU_MEM_ACCESS_FLAGS_PROT_NONE;
  return CUDA_SUCCESS;
}

FC_API CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp* prop, CUmemGenericAllocationHandle handle) {
  FC_ENTER();
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!prop) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(g_vmm_mu);
  PhysHandle* h = handle_from(handle);
  if (!h) return CUDA_ERROR_INVALID_VALUE;
  *prop = h->prop;
  return CUDA_SUCCESS;
}

FC_API CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* handle, void* addr) {
  FC_ENTER();
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!handle) return CUDA_ERROR_INVALID_VALUE;
  auto a = reinterpret_cast<uintptr_t>(addr);
  std::lock_guard lock(g_vmm_mu);
  auto it = g_mappings.upper_bound(a);
  if (it == g_mappings.begin()) return CUDA_ERROR_INVALID_VALUE;
  --it;
  if (a >= it->first + it->second.size) return CUDA_ERROR_INVALID_VALUE;
  it->second.handle->refs++;
  *handle = reinterpret_cast<CUmemGenericAllocationHandle>(it->second.handle);
  return CUDA_SUCCESS;
}

FC_API CUresult cuMemExportToShareableHandle(void* shareableHandle, CUmemGenericAllocationHandle handle,
                                             CUmemAllocationHandleType handleType, unsigned long long flags) {
  FC_ENTER();
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!shareableHandle || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(g_vmm_mu);
  PhysHandle* h = handle_from(handle);
  if (!h) return CUDA_ERROR_INVALID_VALUE;
  if (handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR ||
      !(h->prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
    return CUDA_ERROR_NOT_SUPPORTED;
  *static_cast<int*>(shareableHandle) = dup(h->fd);
  h->shared = true;
  return CUDA_SUCCESS;
}

// The receiving side of cuMemExportToShareableHandle: a handle of the same memory (the memfd,
// duplicated). It counts against no device of this process: the exporter's device holds it.
FC_API CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* handle, void* osHandle,
                                               CUmemAllocationHandleType shHandleType) {
  FC_ENTER();
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!handle) return CUDA_ERROR_INVALID_VALUE;
  if (shHandleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
  const int from = static_cast<int>(reinterpret_cast<intptr_t>(osHandle));
  struct stat st {};
  if (from < 0 || fstat(from, &st) != 0 || st.st_size <= 0 || st.st_size % kGranularity) return CUDA_ERROR_INVALID_VALUE;
  const int fd = fcntl(from, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  auto* h = new PhysHandle;
  h->fd = fd;
  h->size = static_cast<size_t>(st.st_size);
  h->prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  h->prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  h->prop.location.id = 0;
  h->prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  h->ordinal = -1;
  h->id = g_next_handle_id.fetch_add(1);
  h->shared = true;
  std::lock_guard lock(g_vmm_mu);
  g_handles.insert(h);
  *handle = reinterpret_cast<CUmemGenericAllocationHandle>(h);
  return CUDA_SUCCESS;
}

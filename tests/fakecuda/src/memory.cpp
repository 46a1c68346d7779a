// fakecuda: device, managed and host memory; the allocation table; pointer queries; cuMemGetInfo.
#include <sys/mman.h>

#include <cstring>
#include <shared_mutex>

#include "internal.hpp"

namespace fc {
namespace {

std::shared_mutex g_table_mu;
auto& g_table = *new std::map<uintptr_t, Allocation>;  // base -> allocation; never destroyed
std::atomic<uint64_t> g_next_buffer_id{1};

}  // namespace

void table_insert(const Allocation& a) {
  std::unique_lock lock(g_table_mu);
  Allocation copy = a;
  if (!copy.buffer_id) copy.buffer_id = g_next_buffer_id.fetch_add(1);
  g_table[a.base] = copy;
}

bool table_erase(uintptr_t base, Allocation* out) {
  std::unique_lock lock(g_table_mu);
  auto it = g_table.find(base);
  if (it == g_table.end()) return false;
  if (out) *out = it->second;
  g_table.erase(it);
  return true;
}

bool table_find(uintptr_t addr, Allocation* out) { return table_find_range(addr, 1, out); }

bool table_mark_exported(uintptr_t base) {
  std::unique_lock lock(g_table_mu);
  auto it = g_table.find(base);
  if (it == g_table.end()) return false;
  it->second.exported = true;
  return true;
}

const char* table_uncarryable() {
  std::shared_lock lock(g_table_mu);
  for (const auto& [base, a] : g_table) {
    if (a.kind == AllocKind::managed) return "managed memory";
    if (a.kind == AllocKind::ipc) return "an imported CUDA IPC mapping";
    if (a.exported) return "memory exported through a CUDA IPC handle";
  }
  return nullptr;
}

void table_free_context(Context* ctx) {
  std::vector<Allocation> gone;
  {
    std::unique_lock lock(g_table_mu);
    for (auto it = g_table.begin(); it != g_table.end();) {
      const Allocation& a = it->second;
      if (a.ctx == ctx && (a.kind == AllocKind::device || a.kind == AllocKind::managed || a.kind == AllocKind::ipc)) {
        gone.push_back(a);
        it = g_table.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (const Allocation& a : gone) {
    if (a.kind == AllocKind::ipc) ipc_unmap(a);  // the driver unmaps a context's IPC imports with it
    else device_free_block(device(a.ordinal), a.base);
  }
  arrays_free_context(ctx);
}

bool table_find_range(uintptr_t addr, size_t bytes, Allocation* out) {
  std::shared_lock lock(g_table_mu);
  auto it = g_table.upper_bound(addr);
  if (it == g_table.begin()) return false;
  --it;
  const Allocation& a = it->second;
  // A zero-size request still needs its first byte inside; ranges use the block size so that
  // the rounding slack of an allocation stays addressable, as on the device.
  size_t extent = std::max(a.size, a.block);
  if (addr < a.base || addr - a.base >= extent) return false;
  if (bytes > extent - (addr - a.base)) {
    // Mapped memory continues into the next mapping when it starts where this one ends (as
    // on the device: the addresses of a reservation, however many handles back them).
    if (a.kind != AllocKind::vmm) return false;
    uintptr_t end = a.base + extent;
    const uintptr_t want = addr + bytes;
    for (auto next = std::next(it); end < want; ++next) {
      if (next == g_table.end() || next->second.kind != AllocKind::vmm || next->second.base != end) return false;
      end += std::max(next->second.size, next->second.block);
    }
  }
  if (out) *out = a;
  return true;
}

bool table_overlaps(uintptr_t addr, size_t bytes) {
  std::shared_lock lock(g_table_mu);
  auto it = g_table.lower_bound(addr + bytes);
  if (it == g_table.begin()) return false;
  --it;
  const Allocation& a = it->second;
  return a.base + std::max(a.size, a.block) > addr;
}

CUresult device_alloc(Device* d, size_t bytes, uintptr_t* out, size_t* block) {
  size_t need = (bytes + Arena::kAlign - 1) / Arena::kAlign * Arena::kAlign;
  if (need < bytes || !d->reserve(need)) return CUDA_ERROR_OUT_OF_MEMORY;
  uintptr_t p = d->arena().allocate(need);
  if (!p) {
    d->unreserve(need);
    return CUDA_ERROR_OUT_OF_MEMORY;  // enough bytes, but no hole large enough
  }
  *out = p;
  *block = need;
  return CUDA_SUCCESS;
}

void device_free_block(Device* d, uintptr_t addr) {
  size_t len = d->arena().release(addr);
  d->unreserve(len);
}

CUresult capture_unsafe_call_check() {
  return capture_prohibits_unsafe_call() ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

}  // namespace fc

using namespace fc;

namespace {

CUresult alloc_device(CUdeviceptr* dptr, size_t bytes, AllocKind kind) {
  Context* ctx;
  if (CUresult rc = require_context(&ctx)) return rc;
  if (!dptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult rc = capture_unsafe_call_check()) return rc;
  Device* d = device(ctx->ordinal);
  uintptr_t p;
  size_t block;
  if (CUresult rc = device_alloc(d, bytes, &p, &block)) return rc;
  Allocation a;
  a.base = p;
  a.size = bytes;
  a.block = block;
  a.kind = kind;
  a.ordinal = ctx->ordinal;
  a.ctx = ctx;
  table_insert(a);
  *dptr = p;
  return CUDA_SUCCESS;
}

}  // namespace

FC_API CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  FC_ENTER();
  thrash_caches();
  return alloc_device(dptr, bytesize, AllocKind::device);
}

FC_API CUresult cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pPitch, size_t WidthInBytes, size_t Height,
                                   unsigned int ElementSizeBytes) {
  FC_ENTER();
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!dptr || !pPitch || WidthInBytes == 0 || Height == 0) return CUDA_ERROR_INVALID_VALUE;
  if (ElementSizeBytes != 4 && ElementSizeBytes != 8 && ElementSizeBytes != 16) return CUDA_ERROR_INVALID_VALUE;
  size_t pitch = (WidthInBytes + 511) / 512 * 512;
  if (CUresult rc = alloc_device(dptr, pitch * Height, AllocKind::device)) return rc;
  *pPitch = pitch;
  return CUDA_SUCCESS;
}

FC_API CUresult cuMemAllocManaged(CUdeviceptr* dptr, size_t bytesize, unsigned int flags) {
  FC_ENTER();
  if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST) return CUDA_ERROR_INVALID_VALUE;
  return alloc_device(dptr, bytesize, AllocKind::managed);
}

// Also fakecuda_free_unseen: the same free under a name no interposer hooks.
FC_API CUresult cuMemFree_v2(CUdeviceptr dptr) {
  FC_ENTER();
  thrash_caches();
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (CUresult rc = capture_unsafe_call_check()) return rc;
  // Freeing address 0 does nothing and succeeds, as on the real driver (measured on an H200,
  // driver 580): the runtime's cudaFree(0), the usual way to create the context, ends here.
  if (dptr == 0) return CUDA_SUCCESS;
  Allocation a;
  if (!table_find(dptr, &a) || a.base != dptr) return CUDA_ERROR_INVALID_VALUE;
  if (a.kind != AllocKind::device && a.kind != AllocKind::managed && a.kind != AllocKind::pool)
    return CUDA_ERROR_INVALID_VALUE;
  // cuMemFree synchronizes: work queued earlier may still use the block.
  context_synchronize(a.ctx);
  if (a.kind == AllocKind::pool) {
    Stream* legacy = a.ctx->legacy;
    return pool_free_async(a, legacy);
  }
  if (!table_erase(dptr, &a)) return CUDA_ERROR_INVALID_VALUE;  // lost a race with another free
  device_free_block(device(a.ordinal), a.base);
  pause_point("cuMemFree freed");
  return CUDA_SUCCESS;
}

FC_API CUresult fakecuda_free_unseen(CUdeviceptr dptr) { return cuMemFree_v2(dptr); }

// The driver documents both out-pointers of cuMemGetInfo as required; drivers have been seen
// to tolerate a NULL one. Conservative middle: both NULL is CUDA_ERROR_INVALID_VALUE, a single
// NULL is skipped and the other written.
FC_API CUresult cuMemGetInfo_v2(size_t* free, size_t* total) {
  FC_ENTER();
  Context* ctx;
  if (CUresult rc = require_context(&ctx)) return rc;
  if (!free && !total) return CUDA_ERROR_INVALID_VALUE;
  Device* d = device(ctx->ordinal);
  size_t used = d->device_used();
  if (free) *free = d->capacity - std::min(used, d->capacity);
  if (total) *total = d->capacity;
  return CUDA_SUCCESS;
}

FC_API CUresult cuMemGetAddressRange_v2(CUdeviceptr* pbase, size_t* psize, CUdeviceptr dptr) {
  FC_ENTER();
  Context* ctx;
  if (CUresult rc = require_context(&ctx)) return rc;
  Allocation a;
  if (!table_find(dptr, &a) || dptr - a.base >= a.size) return CUDA_ERROR_NOT_FOUND;
  if (a.kind == AllocKind::vmm) {
    // The driver answers with the granule-sized chunk of the mapping that holds the pointer
    // (measured on an H200: 2 MiB of a 1 GiB mapping).
    const uintptr_t off = (dptr - a.base) / kVmmGranularity * kVmmGranularity;
    if (pbase) *pbase = a.base + off;
    if (psize) *psize = std::min(kVmmGranularity, a.size - off);
    return CUDA_SUCCESS;
  }
  if (pbase) *pbase = a.base;
  if (psize) *psize = a.size;
  return CUDA_SUCCESS;
}

// ------------------------------------------------------------------ host memory

namespace {

CUresult host_alloc(void** pp, size_t bytes, unsigned flags) {
  Context* ctx;
  if (CUresult rc = require_context(&ctx)) return rc;
  if (!pp || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  if (flags & ~static_cast<unsigned>(CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED))
    return CUDA_ERROR_INVALID_VALUE;
  if (CUresult rc = capture_unsafe_call_check()) return rc;
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  Allocation a;
  a.base = reinterpret_cast<uintptr_t>(p);
  a.size = bytes;
  a.block = bytes;
  a.kind = AllocKind::host;
  a.ordinal = ctx->ordinal;
  a.ctx = ctx;
  a.host_flags = flags;
  table_insert(a);
  *pp = p;
  return CUDA_SUCCESS;
}

CUresult host_register(void* p, size_t bytes, unsigned flags) {
  Context* ctx;
  if (CUresult rc = require_context(&ctx)) return rc;
  if (!p || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  auto base = reinterpret_cast<uintptr_t>(p);
  if (table_overlaps(base, bytes)) return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
  Allocation a;
  a.base = base;
  a.size = bytes;
  a.block = bytes;
  a.kind = AllocKind::registered;
  a.ordinal = ctx->ordinal;
  a.ctx = ctx;
  a.host_flags = flags;
  table_insert(a);
  return CUDA_SUCCESS;
}

}  // namespace

FC_API CUresult cuMemHostAlloc(void** pp, size_t bytesize, unsigned int Flags) {
  FC_ENTER();
  return host_alloc(pp, bytesize, Flags);
}

FC_API CUresult cuMemAllocHost_v2(void** pp, size_t bytesize) {
  FC_ENTER();
  return host_alloc(pp, bytesize, 0);
}

FC_API CUresult cuMemFreeHost(void* p) {
  FC_ENTER();
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (CUresult rc = capture_unsafe_call_check()) return rc;
  Allocation a;
  auto base = reinterpret_cast<uintptr_t>(p);
  if (!table_find(base, &a) || a.base != base || a.kind != AllocKind::host) return CUDA_ERROR_INVALID_VALUE;
  context_synchronize(a.ctx);
  if (!table_erase(base, &a)) return CUDA_ERROR_INVALID_VALUE;
  munmap(p, a.size);
  return CUDA_SUCCESS;
}

FC_API CUresult cuMemHostRegister(void* p, size_t bytesize, unsigned int Flags) {
  FC_ENTER();
  return host_register(p, bytesize, Flags);
}

FC_API CUresult cuMemHostRegister_v2(void* p, size_t bytesize, unsigned int Flags) {
  FC_ENTER();
  return host_register(p, bytesize, Flags);
}

FC_API CUresult cuMemHostUnregister(void* p) {
  FC_ENTER();
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  Allocation a;
  auto base = reinterpret_cast<uintptr_t>(p);
  if (!table_find(base, &a) || a.base != base || a.kind != AllocKind::registered)
    return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
  context_synchronize(a.ctx);
  table_erase(base, nullptr);
  return CUDA_SUCCESS;
}

FC_API CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr* pdptr, void* p, unsigned int Flags) {
  FC_ENTER();
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!pdptr || Flags != 0) return CUDA_ERROR_INVALID_VALUE;
  Allocation a;
  if (!table_find(reinterpret_cast<uintptr_t>(p), &a) ||
      (a.kind != AllocKind::host && a.kind != AllocKind::registered))
    return CUDA_ERROR_INVALID_VALUE;
  *pdptr = reinterpret_cast<CUdeviceptr>(p);  // unified addressing: the same address
  return CUDA_SUCCESS;
}

FC_API CUresult cuMemHostGetFlags(unsigned int* pFlags, void* p) {
  FC_ENTER();
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!pFlags) return CUDA_ERROR_INVALID_VALUE;
  Allocation a;
  if (!table_find(reinterpret_cast<uintptr_t>(p), &a) ||
      (a.kind != AllocKind::host && a.kind != AllocKind::registered))
    return CUDA_ERROR_INVALID_VALUE;
  *pFlags = a.host_flags;
  return CUDA_SUCCESS;
}

// Unified memory hints have nothing to do here; they validate and succeed.
FC_API CUresult cuMemAdvise_v2(CUdeviceptr devPtr, size_t count, CUmem_advise advice, CUmemLocation location) {
  FC_ENTER();
  (void)advice;
  (void)location;
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  return table_find_range(devPtr, count, nullptr) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

FC_API CUresult cuMemPrefetchAsync_v2(CUdeviceptr devPtr, size_t count, CUmemLocation location, unsigned int flags,
                                      CUstream hStream) {
  FC_ENTER();
  (void)location;
  (void)flags;
  Stream* s;
  if (CUresult rc = resolve_stream(hStream, false, &s)) return rc;
  return table_find_range(devPtr, count, nullptr) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

// ------------------------------------------------------------------ pointer attributes

namespace {

size_t attribute_size(CUpointer_attribute attr) {
  switch (attr) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
    case CU_POINTER_ATTRIBUTE_MAPPING_SIZE:
    case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR:
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
    case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID:
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES: return 8;
    case CU_POINTER_ATTRIBUTE_P2P_TOKENS: return sizeof(CUDA_POINTER_ATTRIBUTE_P2P_TOKENS);
    default: return 4;  // CUmemorytype, int ordinal, and the booleans (written as int)
  }
}

template <typename T>
void put(void* data, T v) {
  std::memcpy(data, &v, sizeof v);
}

// Fills one attribute of a known allocation. CUDA_ERROR_INVALID_VALUE where the attribute does
// not apply (a host pointer of device memory) or is unknown.
CUresult fill_attribute(void* data, CUpointer_attribute attr, const Allocation& a, CUdeviceptr ptr) {
  bool host = a.kind == AllocKind::host || a.kind == AllocKind::registered;
  switch (attr) {
    case CU_POINTER_ATTRIBUTE_CONTEXT: put(data, reinterpret_cast<CUcontext>(a.ctx)); break;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
      put<unsigned int>(data, host ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE);
      break;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER: put<CUdeviceptr>(data, ptr); break;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
      if (!host && a.kind != AllocKind::managed) return CUDA_ERROR_INVALID_VALUE;
      put(data, reinterpret_cast<void*>(ptr));
      break;
    case CU_POINTER_ATTRIBUTE_P2P_TOKENS: return CUDA_ERROR_NOT_SUPPORTED;
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS: put<int>(data, 1); break;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID: put<unsigned long long>(data, a.buffer_id); break;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED: put<int>(data, a.kind == AllocKind::managed); break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: put<int>(data, a.ordinal); break;
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE: put<int>(data, a.kind == AllocKind::device); break;
    // Mapped memory: the whole reservation (as the driver answers); else the allocation.
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: {
      uintptr_t base = a.base;
      size_t size = a.size;
      if (a.kind == AllocKind::vmm) vmm_reservation_of(ptr, &base, &size);
      if (attr == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR) put<CUdeviceptr>(data, base);
      else put<size_t>(data, size);
      break;
    }
    case CU_POINTER_ATTRIBUTE_MAPPED: put<int>(data, 1); break;
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
      put<unsigned long long>(data, a.kind == AllocKind::vmm ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : 0);
      break;
    case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE: put<int>(data, !host); break;
    case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS: put<int>(data, CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE); break;
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE: put(data, reinterpret_cast<CUmemoryPool>(a.pool)); break;
    case CU_POINTER_ATTRIBUTE_MAPPING_SIZE: put<size_t>(data, std::max(a.size, a.block)); break;
    case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR: put(data, reinterpret_cast<void*>(a.base)); break;
    case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID: put<unsigned long long>(data, a.buffer_id); break;
    case CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE: put<int>(data, 0); break;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

}  // namespace

FC_API CUresult cuPointerGetAttribute(void* data, CUpointer_attribute attribute, CUdeviceptr ptr) {
  FC_ENTER();
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!data) return CUDA_ERROR_INVALID_VALUE;
  Allocation a;
  if (!table_find(ptr, &a)) return CUDA_ERROR_INVALID_VALUE;
  return fill_attribute(data, attribute, a, ptr);
}

FC_API CUresult cuPointerGetAttributes(unsigned int numAttributes, CUpointer_attribute* attributes, void** data,
                                       CUdeviceptr ptr) {
  FC_ENTER();
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!attributes || !data) return CUDA_ERROR_INVALID_VALUE;
  Allocation a;
  bool known = table_find(ptr, &a);
  for (unsigned i = 0; i < numAttributes; ++i) {
    if (!data[i]) continue;
    if (!known || fill_attribute(data[i], attributes[i], a, ptr) != CUDA_SUCCESS) {
      // Unknown pointers (plain host memory) and attributes that do not apply read as zero.
      std::memset(data[i], 0, attribute_size(attributes[i]));
    }
  }
  return CUDA_SUCCESS;
}

FC_API CUresult cuPointerSetAttribute(const void* value, CUpointer_attribute attribute, CUdeviceptr ptr) {
  FC_ENTER();
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  (void)value;
  if (attribute != CU_POINTER_ATTRIBUTE_SYNC_MEMOPS) return CUDA_ERROR_INVALID_VALUE;
  return table_find(ptr, nullptr) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

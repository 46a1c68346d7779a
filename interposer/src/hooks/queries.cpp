// cuwarden interposer hooks: what a program asks about memory. Pointer queries and IPC of
// pooled memory (the driver knows a pool's driver allocations, not the blocks in them: for a
// pooled address the backend answers with the program's allocation, and treats a freed block
// as the driver treats freed memory), and the sizes reported under a cap (cuMemGetInfo,
// cuDeviceTotalMem, NVML; core/meminfo.hpp).
#include <cuda.h>

#include <cstring>
#include <type_traits>

#include "backends/ipc.hpp"
#include "backends/start.hpp"
#include "base/real.hpp"
#include "core/meminfo.hpp"
#include "core/record.hpp"
#include "core/tracker.hpp"
#include "hooks/prologue.hpp"

using cuw::core::Tracker;
namespace backends = cuw::backends;
namespace core = cuw::core;

namespace {

/// Bytes cuPointerGetAttributes writes for an attribute (CUDA driver API: cuPointerGetAttribute).
size_t attribute_bytes(CUpointer_attribute attr) {
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
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
      return 8;
    case CU_POINTER_ATTRIBUTE_P2P_TOKENS:
      return sizeof(CUDA_POINTER_ATTRIBUTE_P2P_TOKENS);
    default:
      return 4;
  }
}

/// Whether `p` lies in memory the backend holds (see backends::backend::locate); never
/// creates the tracker or a backend (none: nothing is pooled).
bool pooled(CUdeviceptr p, backends::range* out, bool* live) {
  if (backends::ipc::imported(p, out)) {  // another process's pooled block, mapped here
    *live = true;
    return true;
  }
  Tracker* t = Tracker::instance_if_created();
  backends::backend* b = backends::started(t);
  return b && b->locate(*t, p, out, live);
}

}  // namespace

// ---- pointer queries (CUDA driver API: Memory Management, Unified Addressing) --------------

CUW_EXPORT CUresult hook_cuMemGetAddressRange_v2(CUdeviceptr* pbase, size_t* psize, CUdeviceptr dptr) {
  CUW_PROLOGUE(cuMemGetAddressRange_v2, pbase, psize, dptr);
  backends::range rg;
  bool live = false;
  if (pooled(dptr, &rg, &live)) {
    if (!live) return CUDA_ERROR_NOT_FOUND;
    if (pbase) *pbase = rg.base;
    if (psize) *psize = rg.size;
    return CUDA_SUCCESS;
  }
  return real(pbase, psize, dptr);
}

CUW_EXPORT CUresult hook_cuPointerGetAttribute(void* data, CUpointer_attribute attribute, CUdeviceptr ptr) {
  CUW_PROLOGUE(cuPointerGetAttribute, data, attribute, ptr);
  const CUresult r = real(data, attribute, ptr);
  if (r != CUDA_SUCCESS || !data) return r;
  backends::range rg;
  bool live = false;
  if (pooled(ptr, &rg, &live)) {
    if (!live) return CUDA_ERROR_INVALID_VALUE;
    if (attribute == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR) std::memcpy(data, &rg.base, sizeof rg.base);
    if (attribute == CU_POINTER_ATTRIBUTE_RANGE_SIZE) {
      const size_t n = rg.size;
      std::memcpy(data, &n, sizeof n);
    }
  }
  return r;
}

CUW_EXPORT CUresult hook_cuPointerGetAttributes(unsigned int count, CUpointer_attribute* attributes, void** data,
                                                CUdeviceptr ptr) {
  CUW_PROLOGUE(cuPointerGetAttributes, count, attributes, data, ptr);
  const CUresult r = real(count, attributes, data, ptr);
  if (r != CUDA_SUCCESS || !attributes || !data) return r;
  backends::range rg;
  bool live = false;
  if (pooled(ptr, &rg, &live)) {
    for (unsigned i = 0; i < count; ++i) {
      if (!data[i]) continue;
      if (!live) {
        std::memset(data[i], 0, attribute_bytes(attributes[i]));  // as for memory CUDA does not know
      } else if (attributes[i] == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR) {
        std::memcpy(data[i], &rg.base, sizeof rg.base);
      } else if (attributes[i] == CU_POINTER_ATTRIBUTE_RANGE_SIZE) {
        const size_t n = rg.size;
        std::memcpy(data[i], &n, sizeof n);
      }
    }
  }
  return r;
}

// ---- IPC (CUDA driver API: Memory Management, cuIpc*) ---------------------------------------
// Through the backend: one that carves driver allocations exports and imports what it can
// describe exactly, and says why not otherwise.

CUW_EXPORT CUresult hook_cuIpcGetMemHandle(CUipcMemHandle* handle, CUdeviceptr dptr) {
  CUW_PROLOGUE(cuIpcGetMemHandle, handle, dptr);
  Tracker* t = Tracker::instance_if_created();
  const CUresult r = [&] {
    if (backends::backend* b = backends::started(t)) return b->ipc_export(*t, handle, dptr, real);
    return real(handle, dptr);
  }();
  if (r == CUDA_SUCCESS && t) core::count_uncarried(*t, t->current_device(), &cuw::ring::DeviceSlot::ipc_handles);
  return r;
}

// cuda.h maps cuIpcOpenMemHandle to its _v2; both ABI variants are hooked (hook_table.hpp).
// An import creates no tracker: a process whose first CUDA call is an import (a worker that
// receives tensors) is left as it was before the call was hooked. A handle of ours (another
// process's pooled block) is opened whatever this process's backend.
#define CUW_IPC_OPEN(name)                                                                      \
  CUW_EXPORT CUresult hook_##name(CUdeviceptr* pdptr, CUipcMemHandle handle, unsigned int flags) { \
    CUW_PROLOGUE(name, pdptr, handle, flags);                                                   \
    Tracker* t = Tracker::instance_if_created();                                                \
    const CUresult r = [&] {                                                                    \
      if (backends::ipc::is_ours(handle)) return backends::ipc::open(pdptr, handle, flags);     \
      if (backends::backend* b = backends::started(t)) return b->ipc_import(*t, pdptr, handle, flags, real); \
      return real(pdptr, handle, flags);                                                        \
    }();                                                                                        \
    if (r == CUDA_SUCCESS && t) core::count_uncarried(*t, t->current_device(), &cuw::ring::DeviceSlot::ipc_handles); \
    return r;                                                                                   \
  }
CUW_IPC_OPEN(cuIpcOpenMemHandle_v2)
CUW_IPC_OPEN(cuIpcOpenMemHandle)
#undef CUW_IPC_OPEN

CUW_EXPORT CUresult hook_cuIpcCloseMemHandle(CUdeviceptr dptr) {
  CUW_PROLOGUE(cuIpcCloseMemHandle, dptr);
  if (CUresult r; backends::ipc::close(dptr, &r)) return r;
  Tracker* t = Tracker::instance_if_created();
  if (backends::backend* b = backends::started(t)) return b->ipc_close(*t, dptr, real);
  return real(dptr);
}

// ---- reported sizes --------------------------------------------------------------------

CUW_EXPORT CUresult hook_cuMemGetInfo_v2(size_t* free_bytes, size_t* total_bytes) {
  CUW_PROLOGUE(cuMemGetInfo_v2, free_bytes, total_bytes);
  const CUresult r = real(free_bytes, total_bytes);
  if (r == CUDA_SUCCESS) core::report_meminfo(Tracker::get(), free_bytes, total_bytes);
  return r;
}

CUW_EXPORT CUresult hook_cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
  CUW_PROLOGUE(cuDeviceTotalMem_v2, bytes, dev);
  const CUresult r = real(bytes, dev);
  if (r == CUDA_SUCCESS && bytes) core::report_total_mem(Tracker::get(), dev, bytes);
  return r;
}

// ---- NVML (NVML API reference: Device Queries, nvmlDeviceGetMemoryInfo) ------------------
// Reports the cap when the process has one, in agreement with cuMemGetInfo. NVML's devices
// are physical; they are matched to the process's CUDA ordinals by UUID. Only a process
// that already used CUDA has caps to report: NVML alone never creates a ring.

namespace {

constexpr cuw_nvmlReturn_t kNvmlSuccess = 0;
constexpr cuw_nvmlReturn_t kNvmlFunctionNotFound = 13;  // NVML_ERROR_FUNCTION_NOT_FOUND

/// Both NVML memory structs: total/free/used from the capped view; v2's driver-reserved
/// share is folded into used, so that used + free + reserved == total still holds.
template <class Memory>
cuw_nvmlReturn_t nvml_memory(cuw_nvmlReturn_t (*real)(cuw_nvmlDevice_t, Memory*), cuw_nvmlDevice_t device,
                             Memory* memory) {
  if (!real) return kNvmlFunctionNotFound;
  const cuw_nvmlReturn_t r = real(device, memory);
  if (r != kNvmlSuccess || !memory) return r;
  Tracker* t = Tracker::instance_if_created();
  if (!t || t->config().meminfo_physical) return r;  // no NVML call for what is reported as is
  using uuid_fn = cuw_nvmlReturn_t (*)(cuw_nvmlDevice_t, char*, unsigned int);
  static auto get_uuid = reinterpret_cast<uuid_fn>(cuw::hook::nvml_symbol("nvmlDeviceGetUUID"));
  char uuid[96] = {};
  if (!get_uuid || get_uuid(device, uuid, sizeof uuid) != kNvmlSuccess) return r;
  if (core::report_nvml(*t, uuid, &memory->total, &memory->free, &memory->used)) {
    if constexpr (std::is_same_v<Memory, cuw_nvmlMemory_v2_t>) memory->reserved = 0;
  }
  return r;
}

}  // namespace

CUW_EXPORT cuw_nvmlReturn_t hook_nvmlDeviceGetMemoryInfo(cuw_nvmlDevice_t device, cuw_nvmlMemory_t* memory) {
  return nvml_memory(REAL(nvmlDeviceGetMemoryInfo), device, memory);
}

CUW_EXPORT cuw_nvmlReturn_t hook_nvmlDeviceGetMemoryInfo_v2(cuw_nvmlDevice_t device, cuw_nvmlMemory_v2_t* memory) {
  return nvml_memory(REAL(nvmlDeviceGetMemoryInfo_v2), device, memory);
}

// cuwarden interposer: the hooks themselves. Each one: re-entry guard, then the tracker's
// cap check, the real driver call through REAL(fn), the live table, one event.
// The rows of hook_table.hpp and these definitions must match one to one.
#include <cuda.h>

#include <cstring>

#include "real.hpp"
#include "tracker.hpp"

using cuw::ipc::LiveRecord;
using cuw::ipc::Reentry;
using cuw::ipc::Tracker;
namespace ring = cuw::ring;

#define CUW_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

// A driver entry point we hook but cannot find: behave like a driver that lacks it.
constexpr CUresult kNoDriver = CUDA_ERROR_NOT_INITIALIZED;

/// Count, call, record. `call` performs the real allocation and writes *out on success.
/// Hot path: tracker lookup (one branch), device slot (one branch), charge (one CAS),
/// the driver call, one table insert, one ring push.
template <class Call>
CUresult tracked_alloc(Tracker& t, ring::Api api, int ordinal, uint64_t bytes, uint64_t aux, CUdeviceptr* out,
                       Call&& call) {
  ring::DeviceSlot* d = t.device(ordinal);
  if (!d) return call();  // no context, or an ordinal past what we track
  if (!t.charge(*d, ordinal, bytes, api)) return CUDA_ERROR_OUT_OF_MEMORY;
  const CUresult r = call();
  if (r != CUDA_SUCCESS) {
    t.uncharge(*d, bytes);
    d->driver_errors.fetch_add(1, std::memory_order_relaxed);
    t.emit(ring::EventKind::driver_error, api, ordinal, 0, bytes, aux, r);
    return r;
  }
  t.pointers().insert(*out, LiveRecord{bytes, static_cast<int8_t>(ordinal), static_cast<uint16_t>(api)});
  d->reserved.fetch_add(bytes, std::memory_order_relaxed);
  d->live_allocations.fetch_add(1, std::memory_order_relaxed);
  d->alloc_count.fetch_add(1, std::memory_order_relaxed);
  t.emit(ring::EventKind::alloc, api, ordinal, *out, bytes, aux, CUDA_SUCCESS);
  return r;
}

/// Account a successful free of a live record.
void account_free(Tracker& t, uint64_t key, const LiveRecord& rec, ring::Api api, uint64_t aux) {
  ring::DeviceSlot* d = t.device(rec.device);
  if (!d) return;
  t.uncharge(*d, rec.bytes);
  d->reserved.fetch_sub(rec.bytes, std::memory_order_relaxed);
  d->live_allocations.fetch_sub(1, std::memory_order_relaxed);
  d->free_count.fetch_add(1, std::memory_order_relaxed);
  t.emit(ring::EventKind::free, api, rec.device, key, rec.bytes, aux, CUDA_SUCCESS);
}

/// Free through `call`, taking the pointer out of the live table first so that a
/// concurrent allocation handed the same address is never erased by us.
template <class Call>
CUresult tracked_free(Tracker& t, cuw::ipc::LiveTable& table, uint64_t key, ring::Api api, uint64_t aux,
                      Call&& call) {
  LiveRecord rec;
  const bool live = key != 0 && table.take(key, &rec);
  const CUresult r = call();
  if (!live) return r;  // not counted by us (allocated before we were loaded, or invalid)
  if (r != CUDA_SUCCESS) {
    table.insert(key, rec);  // the driver kept it
    return r;
  }
  account_free(t, key, rec, api, aux);
  return r;
}

int stream_device(Tracker& t, CUstream) { return t.current_device(); }

}  // namespace

// ---- allocations -----------------------------------------------------------------------

CUW_EXPORT CUresult hook_cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  auto real = REAL(cuMemAlloc_v2);
  if (!real) return kNoDriver;
  Reentry g;
  if (g.nested()) return real(dptr, bytesize);
  Tracker& t = Tracker::get();
  return tracked_alloc(t, ring::Api::cuMemAlloc, t.current_device(), bytesize, 0, dptr,
                       [&] { return real(dptr, bytesize); });
}

CUW_EXPORT CUresult hook_cuMemAllocManaged(CUdeviceptr* dptr, size_t bytesize, unsigned int flags) {
  auto real = REAL(cuMemAllocManaged);
  if (!real) return kNoDriver;
  Reentry g;
  if (g.nested()) return real(dptr, bytesize, flags);
  Tracker& t = Tracker::get();
  return tracked_alloc(t, ring::Api::cuMemAllocManaged, t.current_device(), bytesize, 0, dptr,
                       [&] { return real(dptr, bytesize, flags); });
}

CUW_EXPORT CUresult hook_cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pitch, size_t width, size_t height,
                                            unsigned int elem) {
  auto real = REAL(cuMemAllocPitch_v2);
  if (!real) return kNoDriver;
  Reentry g;
  if (g.nested()) return real(dptr, pitch, width, height, elem);
  Tracker& t = Tracker::get();
  const int ordinal = t.current_device();
  // The pitch is only known afterwards: charge an estimate (rows of 512 bytes, the
  // driver's smallest pitch alignment) and settle on the real pitch * height after.
  const uint64_t est = ((static_cast<uint64_t>(width) + 511) & ~uint64_t{511}) * height;
  CUresult r = tracked_alloc(t, ring::Api::cuMemAllocPitch, ordinal, est, 0, dptr,
                             [&] { return real(dptr, pitch, width, height, elem); });
  if (r == CUDA_SUCCESS && pitch) {
    const uint64_t actual = static_cast<uint64_t>(*pitch) * height;
    ring::DeviceSlot* d = t.device(ordinal);
    if (d && actual != est) {
      LiveRecord rec;
      if (t.pointers().take(*dptr, &rec)) {
        if (actual > est) {
          t.force_charge(*d, actual - est);
          d->reserved.fetch_add(actual - est, std::memory_order_relaxed);
        } else {
          t.uncharge(*d, est - actual);
          d->reserved.fetch_sub(est - actual, std::memory_order_relaxed);
        }
        rec.bytes = actual;
        t.pointers().insert(*dptr, rec);
      }
    }
  }
  return r;
}

#define CUW_ASYNC_ALLOC(name, api)                                                                              \
  CUW_EXPORT CUresult hook_##name(CUdeviceptr* dptr, size_t bytesize, CUstream stream) {                        \
    auto real = REAL(name);                                                                                      \
    if (!real) return kNoDriver;                                                                                 \
    Reentry g;                                                                                                   \
    if (g.nested()) return real(dptr, bytesize, stream);                                                        \
    Tracker& t = Tracker::get();                                                                                 \
    return tracked_alloc(t, api, stream_device(t, stream), bytesize, reinterpret_cast<uint64_t>(stream), dptr, \
                         [&] { return real(dptr, bytesize, stream); });                                        \
  }
CUW_ASYNC_ALLOC(cuMemAllocAsync, ring::Api::cuMemAllocAsync)
CUW_ASYNC_ALLOC(cuMemAllocAsync_ptsz, ring::Api::cuMemAllocAsync)
#undef CUW_ASYNC_ALLOC

#define CUW_POOL_ALLOC(name)                                                                                     \
  CUW_EXPORT CUresult hook_##name(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool, CUstream stream) {     \
    auto real = REAL(name);                                                                                      \
    if (!real) return kNoDriver;                                                                                 \
    Reentry g;                                                                                                   \
    if (g.nested()) return real(dptr, bytesize, pool, stream);                                                  \
    Tracker& t = Tracker::get();                                                                                 \
    return tracked_alloc(t, ring::Api::cuMemAllocFromPoolAsync, stream_device(t, stream), bytesize,              \
                         reinterpret_cast<uint64_t>(stream), dptr,                                               \
                         [&] { return real(dptr, bytesize, pool, stream); });                                  \
  }
CUW_POOL_ALLOC(cuMemAllocFromPoolAsync)
CUW_POOL_ALLOC(cuMemAllocFromPoolAsync_ptsz)
#undef CUW_POOL_ALLOC

// ---- frees -----------------------------------------------------------------------------

CUW_EXPORT CUresult hook_cuMemFree_v2(CUdeviceptr dptr) {
  auto real = REAL(cuMemFree_v2);
  if (!real) return kNoDriver;
  Reentry g;
  if (g.nested()) return real(dptr);
  Tracker& t = Tracker::get();
  return tracked_free(t, t.pointers(), dptr, ring::Api::cuMemFree, 0, [&] { return real(dptr); });
}

#define CUW_ASYNC_FREE(name)                                                                                     \
  CUW_EXPORT CUresult hook_##name(CUdeviceptr dptr, CUstream stream) {                                          \
    auto real = REAL(name);                                                                                      \
    if (!real) return kNoDriver;                                                                                 \
    Reentry g;                                                                                                   \
    if (g.nested()) return real(dptr, stream);                                                                  \
    Tracker& t = Tracker::get();                                                                                 \
    return tracked_free(t, t.pointers(), dptr, ring::Api::cuMemFreeAsync, reinterpret_cast<uint64_t>(stream),  \
                        [&] { return real(dptr, stream); });                                                   \
  }
CUW_ASYNC_FREE(cuMemFreeAsync)
CUW_ASYNC_FREE(cuMemFreeAsync_ptsz)
#undef CUW_ASYNC_FREE

// ---- virtual memory management (CUDA driver API: Virtual Memory Management) ---------------

CUW_EXPORT CUresult hook_cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                                     const CUmemAllocationProp* prop, unsigned long long flags) {
  auto real = REAL(cuMemCreate);
  if (!real) return kNoDriver;
  Reentry g;
  if (g.nested() || !prop || !handle || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
    return real(handle, size, prop, flags);  // host-located memory: not device memory, not capped
  Tracker& t = Tracker::get();
  static_assert(sizeof(CUmemGenericAllocationHandle) == sizeof(CUdeviceptr));
  return tracked_alloc(t, ring::Api::cuMemCreate, prop->location.id, size, 0,
                       reinterpret_cast<CUdeviceptr*>(handle), [&] { return real(handle, size, prop, flags); });
}

CUW_EXPORT CUresult hook_cuMemRelease(CUmemGenericAllocationHandle handle) {
  auto real = REAL(cuMemRelease);
  if (!real) return kNoDriver;
  Reentry g;
  if (g.nested()) return real(handle);
  Tracker& t = Tracker::get();
  return tracked_free(t, t.pointers(), handle, ring::Api::cuMemRelease, 0, [&] { return real(handle); });
}

// ---- reported sizes --------------------------------------------------------------------

CUW_EXPORT CUresult hook_cuMemGetInfo_v2(size_t* free_bytes, size_t* total_bytes) {
  auto real = REAL(cuMemGetInfo_v2);
  if (!real) return kNoDriver;
  Reentry g;
  const CUresult r = real(free_bytes, total_bytes);
  if (g.nested() || r != CUDA_SUCCESS) return r;
  Tracker& t = Tracker::get();
  if (t.config().meminfo_physical) return r;
  ring::DeviceSlot* d = t.device(t.current_device());
  if (!d) return r;
  const uint64_t limit = d->limit.load(std::memory_order_relaxed);
  if (limit == ring::kNoLimit) return r;
  const uint64_t physical = d->physical_total ? d->physical_total : (total_bytes ? *total_bytes : limit);
  const uint64_t cap_total = limit < physical ? limit : physical;
  const uint64_t used = d->used.load(std::memory_order_relaxed);
  const uint64_t cap_free = used >= cap_total ? 0 : cap_total - used;  // never underflows
  if (total_bytes) *total_bytes = cap_total;
  if (free_bytes && *free_bytes > cap_free) *free_bytes = cap_free;
  return r;
}

CUW_EXPORT CUresult hook_cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
  auto real = REAL(cuDeviceTotalMem_v2);
  if (!real) return kNoDriver;
  Reentry g;
  const CUresult r = real(bytes, dev);
  if (g.nested() || r != CUDA_SUCCESS || !bytes) return r;
  Tracker& t = Tracker::get();
  if (t.config().meminfo_physical) return r;
  ring::DeviceSlot* d = t.device(dev);
  if (!d) return r;
  const uint64_t limit = d->limit.load(std::memory_order_relaxed);
  if (limit != ring::kNoLimit && limit < *bytes) *bytes = limit;
  return r;
}

// ---- entry-point lookup (CUDA driver API: Driver Entry Point Access) ---------------------

CUW_EXPORT CUresult hook_cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags) {
  auto real = REAL(cuGetProcAddress);
  if (!real) return kNoDriver;
  const CUresult r = real(symbol, pfn, cudaVersion, flags);
  if (r == CUDA_SUCCESS && pfn && *pfn) *pfn = cuw::hook::redirect_proc(symbol, *pfn, cudaVersion, flags);
  return r;
}

CUW_EXPORT CUresult hook_cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                                             CUdriverProcAddressQueryResult* status) {
  auto real = REAL(cuGetProcAddress_v2);
  if (!real) return kNoDriver;
  const CUresult r = real(symbol, pfn, cudaVersion, flags, status);
  if (r == CUDA_SUCCESS && pfn && *pfn) *pfn = cuw::hook::redirect_proc(symbol, *pfn, cudaVersion, flags);
  return r;
}

// ---- process exit ----------------------------------------------------------------------

__attribute__((destructor)) static void cuw_on_unload() {
  if (Tracker* t = Tracker::instance_if_created()) t->on_exit();
}

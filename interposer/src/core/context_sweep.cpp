// cuwarden interposer core: the context sweep (see context_sweep.hpp).
#include "core/context_sweep.hpp"

#include <array>
#include <mutex>
#include <vector>

#include "base/real.hpp"
#include "core/ledger.hpp"
#include "cuw/ring.hpp"

namespace cuw::core {

namespace {
/// The arrays in `arrays` (arrays_of()), destroyed by the driver with their context: each
/// still remembered under the same serial is counted freed (uncharged; a free event with api
/// cuCtxDestroy at `now`) and forgotten, in one critical section per sweep. One whose entry
/// is gone or carries another serial was destroyed meanwhile, or its handle now names a new
/// array: left alone. One whose record a destroy in flight has taken (cuArrayDestroy racing
/// the context's end) is marked ctx_gone: that destroy, refused by the driver, counts it
/// (tracked_array_destroy). Cold; frees the entries' nodes under the lock.
CUW_COLD void forget_arrays_of(Tracker& t, const ArrayOwners::Snapshot& arrays, uint64_t now);
}  // namespace

CUW_COLD void forget_driver_freed(Tracker& t, const ArrayOwners::Snapshot& arrays) {
  auto query = REAL(cuPointerGetAttribute);
  if (t.exiting()) return;
  const uint64_t now = cuw::core::now_ns();
  forget_arrays_of(t, arrays, now);
  if (!query) return;
  std::vector<uint64_t> dev_keys, host_keys;
  {
    std::lock_guard<cuw::spin_lock> lk(t.lock());
    t.pointers().keys(dev_keys, [](const LiveRecord& r) {
      const auto api = static_cast<ring::Api>(r.api);
      return api == ring::Api::cuMemAlloc || api == ring::Api::cuMemAllocPitch || api == ring::Api::cuMemAllocManaged;
    });
    t.host().keys(host_keys, [](const LiveRecord&) { return true; });
  }
  auto gone = [&](uint64_t key) {
    CUcontext c = nullptr;
    return query(&c, CU_POINTER_ATTRIBUTE_CONTEXT, key) == CUDA_ERROR_INVALID_VALUE;
  };
  for (const uint64_t key : dev_keys) {
    if (!gone(key)) continue;
    LiveRecord rec;
    bool took = false;
    {
      std::lock_guard<cuw::spin_lock> lk(t.lock());
      took = gone(key) && t.pointers().take(key, &rec);
      if (took) t.count_freed_unseen_locked(key, rec, ring::Api::cuCtxDestroy, now);
    }
    if (took) t.job_uncharge(rec.device, rec.bytes);
  }
  for (const uint64_t key : host_keys) {
    if (!gone(key)) continue;
    std::lock_guard<cuw::spin_lock> lk(t.lock());
    LiveRecord rec;
    if (!gone(key) || !t.host().take(key, &rec)) continue;
    if (static_cast<unsigned>(rec.device) < ring::kMaxDevices)
      Ledger::host(&t.header().devices[rec.device], rec.bytes, false);
    t.emit_at(ring::EventKind::host_free, ring::Api::cuCtxDestroy, rec.device, key, rec.bytes, 0, CUDA_SUCCESS,
              now);
  }
}

CUW_COLD ArrayOwners::Snapshot arrays_of(Tracker& t, CUcontext ctx) noexcept {
  ArrayOwners::Snapshot snap;
  if (!ctx) return snap;
  try {
    for (;;) {  // room first, without the lock; again should the map have grown meanwhile
      size_t n = 0;
      {
        std::lock_guard<cuw::spin_lock> lk(t.lock());
        n = t.array_owners().size();
      }
      if (n == 0) return snap;
      snap.reserve(n + 16);
      std::lock_guard<cuw::spin_lock> lk(t.lock());
      if (t.array_owners().snapshot(ctx, snap)) return snap;
    }
  } catch (...) {
    return {};
  }
}

namespace {
CUW_COLD void forget_arrays_of(Tracker& t, const ArrayOwners::Snapshot& arrays, uint64_t now) {
  if (arrays.empty()) return;
  std::array<uint64_t, ring::kMaxDevices> job_back{};  // the jobs' shares, given back after unlocking
  {
    std::lock_guard<cuw::spin_lock> lk(t.lock());
    ArrayOwners& owners = t.array_owners();
    for (const auto& [key, serial] : arrays) {
      ArrayOwner* o = owners.find(key);
      if (!o || o->serial != serial) continue;
      LiveRecord rec;
      if (!t.handles().take(key, &rec)) {
        o->ctx_gone = true;
        continue;
      }
      owners.forget(key, serial);
      t.count_freed_unseen_locked(key, rec, ring::Api::cuCtxDestroy, now);
      if (static_cast<unsigned>(rec.device) < ring::kMaxDevices) job_back[rec.device] += rec.bytes;
    }
  }
  for (uint32_t i = 0; i < ring::kMaxDevices; ++i)
    if (job_back[i]) t.job_uncharge(static_cast<int>(i), job_back[i]);
}
}  // namespace

CUcontext active_primary(CUdevice dev) {
  using state_fn = CUresult (*)(CUdevice, unsigned*, int*);
  using retain_fn = CUresult (*)(CUcontext*, CUdevice);
  using release_fn = CUresult (*)(CUdevice);
  static auto get_state = reinterpret_cast<state_fn>(cuw::hook::driver_symbol("cuDevicePrimaryCtxGetState"));
  static auto retain = reinterpret_cast<retain_fn>(cuw::hook::driver_symbol("cuDevicePrimaryCtxRetain"));
  static auto release = reinterpret_cast<release_fn>(cuw::hook::driver_symbol("cuDevicePrimaryCtxRelease_v2"));
  unsigned flags = 0;
  int active = 0;
  CUcontext primary = nullptr;
  if (!get_state || !retain || !release || get_state(dev, &flags, &active) != CUDA_SUCCESS || !active ||
      retain(&primary, dev) != CUDA_SUCCESS)
    return nullptr;
  release(dev);  // the driver's own entry point: our retain undone, nothing else
  return primary;
}

unsigned long long context_id(CUcontext ctx) {
  using id_fn = CUresult (*)(CUcontext, unsigned long long*);
  static auto get_id = reinterpret_cast<id_fn>(cuw::hook::driver_symbol("cuCtxGetId"));
  unsigned long long id = 0;
  return get_id && ctx && get_id(ctx, &id) == CUDA_SUCCESS ? id : 0;
}

bool primary_gone(CUdevice dev) {
  using state_fn = CUresult (*)(CUdevice, unsigned*, int*);
  static auto get_state = reinterpret_cast<state_fn>(cuw::hook::driver_symbol("cuDevicePrimaryCtxGetState"));
  unsigned flags = 0;
  int active = 1;
  return get_state && get_state(dev, &flags, &active) == CUDA_SUCCESS && !active;
}

}  // namespace cuw::core

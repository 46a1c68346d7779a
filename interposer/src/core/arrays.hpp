// cuwarden interposer core: CUDA arrays. What an array takes from the driver (from its
// descriptor), and its accounting: an array is counted from its creation to its destroy, or to
// its context's destruction (the context it was created in is remembered: array_owners.hpp).
#pragma once

#include <cuda.h>

#include <cstdint>
#include <mutex>

#include "core/array_owners.hpp"
#include "core/record.hpp"
#include "core/tracker.hpp"

namespace cuw::core {

/// Bytes per element of a CUarray_format (CUDA driver API: CUarray_format). Packed and
/// block-compressed formats are rounded to their per-texel size; unknown ones count 4.
uint64_t format_bytes(CUarray_format f);

/// Bytes of an array as the driver allocates it: width x max(height,1) x max(depth,1) x
/// element size, rounded to 512 bytes, summed over `levels` mip levels. Each level halves
/// width and height, and depth only for true 3D arrays: for layered and cubemap arrays
/// depth is the layer count, the same at every level.
uint64_t array_bytes(uint64_t w, uint64_t h, uint64_t d, CUarray_format f, unsigned channels, unsigned levels,
                     unsigned flags);

/// Sparse and deferred-mapping arrays take no memory until it is mapped into them
/// (cuMemMapArrayAsync, with memory from cuMemCreate, which is counted there).
bool array_takes_memory(unsigned flags);

/// The calling thread's current context (nullptr: none, or the driver lacks the call).
CUcontext current_context();

/// tracked_alloc_in's `on_insert` for an array: remember it in the context `node` holds
/// (made before the lock; the tracker's lock held here). Without memory for the entry the
/// array is not forgotten with its context (it stays counted until destroyed: an
/// over-count, never an under-count).
struct RememberArray {
  Tracker* t;
  ArrayOwners::Node* node;  // consumed, or left for the caller to free after unlocking
  void operator()(uint64_t key) const noexcept { t->array_owners().remember(key, *node); }
};

/// A tracked array allocation: the context asked before the call, remembered with the record.
template <class Call, class Handle>
CUresult tracked_array_create(Tracker& t, ring::Api api, int ordinal, uint64_t bytes, Call&& call,
                              Handle* handle_out) {
  ArrayOwners::Node node = ArrayOwners::make_node(current_context());  // freed here if unused
  return tracked_alloc_in(
      t, t.handles(), api, ordinal, false, bytes, 0, call,
      [handle_out] { return reinterpret_cast<uint64_t>(*handle_out); }, nullptr, RememberArray{&t, &node});
}

/// A destroy of array `key` through tracked_free. Its owner entry stays while the driver
/// call runs, so that a destruction of its context meanwhile finds it (forget_arrays_of).
/// Destroyed: the entry goes, if it is still this array's (same serial; a new array may
/// have been handed the handle since). Refused by the driver, with the entry marked
/// ctx_gone: the context was destroyed while this call ran and freed the array with it,
/// so the record keep_live put back is counted freed (api cuCtxDestroy). Refused
/// otherwise: the array is still the driver's, and stays counted and remembered.
template <class Call>
CUresult tracked_array_destroy(Tracker& t, uint64_t key, ring::Api api, Call&& call) {
  uint64_t serial = 0;
  {
    std::lock_guard<cuw::spin_lock> lk(t.lock());
    if (const ArrayOwner* o = t.array_owners().find(key)) serial = o->serial;
  }
  const CUresult r = tracked_free(t, t.handles(), key, api, 0, call);
  if (serial == 0) return r;
  ArrayOwners::Node dead;  // a removed entry, freed after unlocking
  LiveRecord rec;
  bool took = false;
  const uint64_t now = r == CUDA_SUCCESS ? 0 : cuw::core::now_ns();
  {
    std::lock_guard<cuw::spin_lock> lk(t.lock());
    ArrayOwners& owners = t.array_owners();
    const ArrayOwner* o = owners.find(key);
    if (o && o->serial == serial && (r == CUDA_SUCCESS || o->ctx_gone)) {
      const bool ctx_gone = r != CUDA_SUCCESS;
      owners.forget(key, serial, &dead);
      if (ctx_gone) {
        took = t.handles().take(key, &rec);
        if (took) t.count_freed_unseen_locked(key, rec, ring::Api::cuCtxDestroy, now);
      }
    }
  }
  if (took) t.job_uncharge(rec.device, rec.bytes);
  return r;
}

}  // namespace cuw::core

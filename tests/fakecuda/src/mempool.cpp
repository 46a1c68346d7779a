// fakecuda: the stream-ordered allocator — memory pools, cuMemAllocAsync / cuMemFreeAsync.
//
// Like the driver's pools: memory freed into a pool stays reserved (it still counts in
// cuMemGetInfo) and is reused by later allocations; a free takes effect when its stream
// reaches it; at synchronization points (stream, event, context sync) each pool is trimmed
// down to its release threshold (default 0); cuMemPoolTrimTo trims explicitly; an
// allocation that finds no room first gives the pool's cached memory back and retries.
// Simplification: a freed block is reused only once its free has executed (no same-stream
// reuse of a block whose free is still queued).
#include <list>
#include <set>

#include "internal.hpp"

namespace fc {

struct MemPool {
  int ordinal = 0;
  CUmemPoolProps props{};
  bool is_default = false;
  bool alive = true;
  std::mutex mu;
  std::multimap<size_t, uintptr_t> cached;  // block size -> base, free and reserved
  size_t reserved = 0, used = 0, reserved_high = 0, used_high = 0;
  cuuint64_t release_threshold = 0;
  int reuse_follow = 1, reuse_opportunistic = 1, reuse_internal = 1;
};

namespace {

std::mutex g_pools_mu;
auto& g_pools = *new std::set<MemPool*>;  // never destroyed

MemPool* new_pool(int ordinal, const CUmemPoolProps* props, bool is_default) {
  auto* p = new MemPool;
  p->ordinal = ordinal;
  if (props) p->props = *props;
  p->props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  p->props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p->props.location.id = ordinal;
  p->is_default = is_default;
  std::lock_guard lock(g_pools_mu);
  g_pools.insert(p);
  return p;
}

MemPool* pool_from_handle(CUmemoryPool h) {
  auto* p = reinterpret_cast<MemPool*>(h);
  std::lock_guard lock(g_pools_mu);
  return g_pools.count(p) && p->alive ? p : nullptr;
}

// Releases cached blocks (largest first) until reserved <= keep. Caller holds p->mu.
void trim_locked(MemPool* p, size_t keep) {
  Device* d = device(p->ordinal);
  while (p->reserved > keep && !p->cached.empty()) {
    auto it = std::prev(p->cached.end());
    device_free_block(d, it->second);
    p->reserved -= it->first;
    p->cached.erase(it);
  }
}

CUresult pool_alloc(MemPool* p, size_t bytes, Stream* s, CUdeviceptr* dptr) {
  size_t need = (bytes + Arena::kAlign - 1) / Arena::kAlign * Arena::kAlign;
  uintptr_t base = 0;
  size_t block = 0;
  {
    std::lock_guard lk(p->mu);
    auto it = p->cached.lower_bound(need);
    // Reuse a cached block unless it would waste most of itself on a small request.
    if (it != p->cached.end() && (it->first <= 2 * need || it->first - need < (size_t{1} << 20))) {
      block = it->first;
      base = it->second;
      p->cached.erase(it);
    }
  }
  if (!base) {
    Device* d = device(p->ordinal);
    CUresult rc = device_alloc(d, need, &base, &block);
    if (rc == CUDA_ERROR_OUT_OF_MEMORY) {
      {
        std::lock_guard lk(p->mu);
        trim_locked(p, 0);
      }
      rc = device_alloc(d, need, &base, &block);
    }
    if (rc) return rc;
    std::lock_guard lk(p->mu);
    p->reserved += block;
    p->reserved_high = std::max(p->reserved_high, p->reserved);
  }
  {
    std::lock_guard lk(p->mu);
    p->used += block;
    p->used_high = std::max(p->used_high, p->used);
  }
  Allocation a;
  a.base = base;
  a.size = bytes;
  a.block = block;
  a.kind = AllocKind::pool;
  a.ordinal = p->ordinal;
  a.ctx = s->ctx;
  a.pool = p;
  table_insert(a);
  *dptr = base;
  return CUDA_SUCCESS;
}

CUresult alloc_async(CUdeviceptr* dptr, size_t bytes, MemPool* pool, CUstream h, bool pt) {
  Stream* s;
  if (CUresult rc = resolve_stream(h, pt, &s)) return rc;
  if (!dptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  if (!pool) pool = device_default_pool(device(s->ctx->ordinal));
  {
    // Find out under the lock whether the stream records instead of executing.
    std::lock_guard lk(s->mu);
    if (s->capture == CU_STREAM_CAPTURE_STATUS_INVALIDATED) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  }
  if (stream_is_capturing(s)) return graph_capture_alloc(s, bytes, pool->ordinal, dptr);
  if (s->legacy && any_blocking_stream_capturing(s->ctx)) {
    invalidate_captures_of(s->ctx);
    return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
  }
  return pool_alloc(pool, bytes, s, dptr);
}

CUresult free_async(CUdeviceptr dptr, CUstream h, bool pt) {
  Stream* s;
  if (CUresult rc = resolve_stream(h, pt, &s)) return rc;
  Allocation a;
  if (!table_find(dptr, &a) || a.base != dptr) return CUDA_ERROR_INVALID_VALUE;
  if (a.kind == AllocKind::graph) {
    CUresult rc;
    graph_free_outside(a, s, &rc);
    return rc;
  }
  if (stream_is_capturing(s)) return graph_capture_free(s, dptr);
  if (a.kind == AllocKind::pool) return pool_free_async(a, s);
  if (a.kind == AllocKind::device) {
    // Stream-ordered free of cuMemAlloc memory: back to the arena when the stream gets there.
    if (!table_erase(dptr, &a)) return CUDA_ERROR_INVALID_VALUE;
    Device* d = device(a.ordinal);
    CUresult err;
    uintptr_t base = a.base;
    stream_enqueue(s, [d, base] { device_free_block(d, base); }, &err);
    return err;
  }
  return CUDA_ERROR_INVALID_VALUE;
}

}  // namespace

MemPool* device_default_pool(Device* d) {
  std::lock_guard lock(d->pool_mu);
  if (!d->default_pool) {
    d->default_pool = new_pool(d->ordinal, nullptr, true);
    if (!d->current_pool) d->current_pool = d->default_pool;
  }
  return d->default_pool;
}

namespace {
MemPool* device_current_pool(Device* d) {
  device_default_pool(d);
  std::lock_guard lock(d->pool_mu);
  return d->current_pool;
}
}  // namespace

CUresult pool_free_async(const Allocation& a, Stream* s) {
  Allocation removed;
  if (!table_erase(a.base, &removed)) return CUDA_ERROR_INVALID_VALUE;  // double free
  MemPool* p = removed.pool;
  uintptr_t base = removed.base;
  size_t block = removed.block;
  CUresult err;
  auto give_back = [p, base, block] {
    std::lock_guard lk(p->mu);
    p->used -= block;
    if (p->alive) {
      p->cached.emplace(block, base);
    } else {
      device_free_block(device(p->ordinal), base);
      p->reserved -= block;
    }
  };
  stream_enqueue(s, give_back, &err);
  if (err) {
    table_insert(removed);  // nothing happened
    return err;
  }
  return CUDA_SUCCESS;
}

void pools_trim_to_threshold() {
  std::vector<MemPool*> pools;
  {
    std::lock_guard lock(g_pools_mu);
    pools.assign(g_pools.begin(), g_pools.end());
  }
  for (MemPool* p : pools) {
    std::lock_guard lk(p->mu);
    if (p->reserved > p->release_threshold) trim_locked(p, p->release_threshold);
  }
}

}  // namespace fc

using namespace fc;

FC_API CUresult cuMemAllocAsync(CUdeviceptr* dptr, size_t bytesize, CUstream hStream) {
  FC_ENTER();
  thrash_caches();
  return alloc_async(dptr, bytesize, nullptr, hStream, false);
}
FC_API CUresult cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUstream hStream) {
  FC_ENTER();
  thrash_caches();
  return alloc_async(dptr, bytesize, nullptr, hStream, true);
}

namespace {
CUresult alloc_from_pool(CUdeviceptr* dptr, size_t bytes, CUmemoryPool pool, CUstream h, bool pt) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  MemPool* p = pool_from_handle(pool);
  if (!p) return CUDA_ERROR_INVALID_VALUE;
  return alloc_async(dptr, bytes, p, h, pt);
}
}  // namespace

FC_API CUresult cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream) {
  FC_ENTER();
  return alloc_from_pool(dptr, bytesize, pool, hStream, false);
}
FC_API CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool,
                                             CUstream hStream) {
  FC_ENTER();
  return alloc_from_pool(dptr, bytesize, pool, hStream, true);
}
FC_API CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) {
  FC_ENTER();
  thrash_caches();
  return free_async(dptr, hStream, false);
}
FC_API CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream) {
  FC_ENTER();
  thrash_caches();
  return free_async(dptr, hStream, true);
}

FC_API CUresult cuMemPoolCreate(CUmemoryPool* pool, const CUmemPoolProps* poolProps) {
  FC_ENTER();
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!pool || !poolProps) return CUDA_ERROR_INVALID_VALUE;
  if (poolProps->allocType != CU_MEM_ALLOCATION_TYPE_PINNED) return CUDA_ERROR_INVALID_VALUE;
  if (poolProps->location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_NOT_SUPPORTED;
  if (!device(poolProps->location.id)) return CUDA_ERROR_INVALID_DEVICE;
  *pool = reinterpret_cast<CUmemoryPool>(new_pool(poolProps->location.id, poolProps, false));
  return CUDA_SUCCESS;
}

FC_API CUresult cuMemPoolDestroy(CUmemoryPool pool) {
  FC_ENTER();
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  MemPool* p = pool_from_handle(pool);
  if (!p || p->is_default) return CUDA_ERROR_INVALID_VALUE;
  Device* d = device(p->ordinal);
  {
    std::lock_guard lock(d->pool_mu);
    if (d->current_pool == p) d->current_pool = d->default_pool;
  }
  std::lock_guard lk(p->mu);
  trim_locked(p, 0);
  p->alive = false;  // outstanding allocations go straight back to the device when freed
  return CUDA_SUCCESS;
}

FC_API CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep) {
  FC_ENTER();
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  MemPool* p = pool_from_handle(pool);
  if (!p) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lk(p->mu);
  trim_locked(p, minBytesToKeep);
  return CUDA_SUCCESS;
}

FC_API CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value) {
  FC_ENTER();
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  MemPool* p = pool_from_handle(pool);
  if (!p || !value) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lk(p->mu);
  switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES: p->reuse_follow = *static_cast<int*>(value); break;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC: p->reuse_opportunistic = *static_cast<int*>(value); break;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: p->reuse_internal = *static_cast<int*>(value); break;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: p->release_threshold = *static_cast<cuuint64_t*>(value); break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
      if (*static_cast<cuuint64_t*>(value) != 0) return CUDA_ERROR_INVALID_VALUE;
      p->reserved_high = p->reserved;
      break;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
      if (*static_cast<cuuint64_t*>(value) != 0) return CUDA_ERROR_INVALID_VALUE;
      p->used_high = p->used;
      break;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

FC_API CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value) {
  FC_ENTER();
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  MemPool* p = pool_from_handle(pool);
  if (!p || !value) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lk(p->mu);
  auto u64 = static_cast<cuuint64_t*>(value);
  switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES: *static_cast<int*>(value) = p->reuse_follow; break;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC: *static_cast<int*>(value) = p->reuse_opportunistic; break;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: *static_cast<int*>(value) = p->reuse_internal; break;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: *u64 = p->release_threshold; break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: *u64 = p->reserved; break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: *u64 = p->reserved_high; break;
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT: *u64 = p->used; break;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH: *u64 = p->used_high; break;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

FC_API CUresult cuMemPoolSetAccess(CUmemoryPool pool, const CUmemAccessDesc* map, size_t count) {
  FC_ENTER();
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!pool_from_handle(pool) || (count && !map)) return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}

FC_API CUresult cuMemPoolGetAccess(CUmemAccess_flags* flags, CUmemoryPool memPool, CUmemLocation* location) {
  FC_ENTER();
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!pool_from_handle(memPool) || !flags || !location) return CUDA_ERROR_INVALID_VALUE;
  *flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return CUDA_SUCCESS;
}

FC_API CUresult cuDeviceGetDefaultMemPool(CUmemoryPool* pool_out, CUdevice dev) {
  FC_ENTER();
  if (CUresult rc = check_device(dev)) return rc;
  if (!pool_out) return CUDA_ERROR_INVALID_VALUE;
  *pool_out = reinterpret_cast<CUmemoryPool>(device_default_pool(device(dev)));
  return CUDA_SUCCESS;
}

FC_API CUresult cuDeviceGetMemPool(CUmemoryPool* pool, CUdevice dev) {
  FC_ENTER();
  if (CUresult rc = check_device(dev)) return rc;
  if (!pool) return CUDA_ERROR_INVALID_VALUE;
  *pool = reinterpret_cast<CUmemoryPool>(device_current_pool(device(dev)));
  return CUDA_SUCCESS;
}

FC_API CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool) {
  FC_ENTER();
  if (CUresult rc = check_device(dev)) return rc;
  MemPool* p = pool_from_handle(pool);
  if (!p || p->ordinal != dev) return CUDA_ERROR_INVALID_VALUE;
  Device* d = device(dev);
  device_default_pool(d);
  std::lock_guard lock(d->pool_mu);
  d->current_pool = p;
  return CUDA_SUCCESS;
}

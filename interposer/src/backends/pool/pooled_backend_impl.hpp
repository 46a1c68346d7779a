// cuwarden interposer: the pooling backends' members (pooled_backend.hpp): the pools of the
// process's contexts, and what the hooks ask of them. Included only by a layout's file, which
// instantiates pooled_backend for its layout.
#pragma once

#include "backends/pool/pooled_backend.hpp"

#include <algorithm>
#include <new>

#include "backends/driver_calls.hpp"
#include "backends/ipc.hpp"
#include "base/log.hpp"
#include "base/work_epoch.hpp"
#include "cuw/attrs.hpp"

namespace cuw::backends {

// ---- the program's allocations ---------------------------------------------------------------
// Pooled blocks are not in the core's live table: a cache's own block map is authoritative.
// The counters and events are passthrough's (alloc, free, live allocations); used, reserved
// and cached follow the driver allocations the caches make and give back.

// Hot path: the cache's allocate (a hit: its device's pool book lock for the free list and
// the block's record; the counters and the event are atomics; no driver call).
// During a stream capture every allocation gets exactly the driver's answer (in a global-mode
// capture, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED): a pooled block would let the capture
// succeed and the graph write the block after its free, when it may be someone else's.
template <class Layout>
CUW_HOT CUresult pooled_backend<Layout>::allocate(core::Tracker& t, CUdeviceptr* dptr, size_t bytes, alloc_fn real) {
  if (dptr && bytes != 0 && __builtin_expect(!work::capturing(), 1))
    if (pool::pool<Layout>* c = for_current()) return c->allocate_traced(dptr, bytes, ring::Api::cuMemAlloc, core::now_ns());
  return passed_allocate(t, dptr, bytes, real);
}

template <class Layout>
CUW_COLD CUresult pooled_backend<Layout>::passed_allocate(core::Tracker& t, CUdeviceptr* dptr, size_t bytes,
                                                          alloc_fn real) {
  return passthrough_.allocate(t, dptr, bytes, real);
}

// A free of a pooled block: CUDA_SUCCESS when `dptr` was one (freed, counted, event pushed),
// CUDA_ERROR_INVALID_VALUE when it lies in a cache's memory but is no live block's start (a
// second free: never passed to the driver, which would free the slab or block under the
// cache); otherwise the driver's (not the caches' memory).
template <class Layout>
CUW_HOT CUresult pooled_backend<Layout>::deallocate(core::Tracker& t, CUdeviceptr dptr, free_fn real) {
  if (dptr)
    if (const CUresult r = free_traced(dptr, ring::Api::cuMemFree, 0, core::now_ns()); r != CUDA_ERROR_NOT_FOUND)
      return r;
  return passed_deallocate(t, dptr, real);
}

template <class Layout>
CUW_COLD CUresult pooled_backend<Layout>::passed_deallocate(core::Tracker& t, CUdeviceptr dptr, free_fn real) {
  return passthrough_.deallocate(t, dptr, real);
}

// Stream-ordered allocations stay in the driver's pools.
template <class Layout>
CUresult pooled_backend<Layout>::allocate_async(core::Tracker& t, CUdeviceptr* dptr, size_t bytes, CUstream stream,
                                                alloc_async_fn real) {
  return passthrough_.allocate_async(t, dptr, bytes, stream, real);
}

// cuMemFreeAsync of a pooled block (a cudaMalloc pointer freed stream-ordered): retired like a
// cuMemFree (behind events on every stream, which covers `stream`). Not while `stream` is
// being captured: the free would belong to a graph that runs later, and the block could be
// reused before it runs; the driver's own answer for memory a graph did not allocate is an
// error too.
template <class Layout>
CUresult pooled_backend<Layout>::deallocate_async(core::Tracker& t, CUdeviceptr dptr, CUstream stream,
                                                  bool per_thread, free_async_fn real) {
  if (dptr) {
    if (work::capturing()) {
      bool live = false;
      if (work::stream_capturing(stream, per_thread) && owner_of(dptr, nullptr, &live) && live)
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    const CUresult r = free_traced(dptr, ring::Api::cuMemFreeAsync, reinterpret_cast<uint64_t>(stream), core::now_ns());
    if (r != CUDA_ERROR_NOT_FOUND) return r;
  }
  return passthrough_.deallocate_async(t, dptr, stream, per_thread, real);
}

// ---- the caches ---------------------------------------------------------------------------------

// The calling thread's last context and its pool (initial-exec: the library is preloaded,
// its TLS is static; no __tls_get_addr call). Internal linkage: each layout's file has its
// own, and a process runs one backend.
static thread_local CUcontext t_ctx __attribute__((tls_model("initial-exec"))) = nullptr;
template <class Layout>
static thread_local pool::pool<Layout>* t_cache __attribute__((tls_model("initial-exec"))) = nullptr;
static thread_local uint64_t t_gen __attribute__((tls_model("initial-exec"))) = 0;

template <class Layout>
CUW_HOT pool::pool<Layout>* pooled_backend<Layout>::for_current() noexcept {
  static auto get_current = drv().ctx_get_current;
  CUcontext ctx = nullptr;
  if (!get_current || get_current(&ctx) != CUDA_SUCCESS || !ctx) return nullptr;
  const uint64_t gen = generation_.load(std::memory_order_acquire);
  if (__builtin_expect(ctx == t_ctx && gen == t_gen, 1)) return t_cache<Layout>;
  pool::pool<Layout>* found = nullptr;
  const int n = count_.load(std::memory_order_acquire);
  if (ctx != dying_.load(std::memory_order_acquire)) {
    for (int i = 0; i < n && !found; ++i) {
      pool::pool<Layout>* c = caches_[i].load(std::memory_order_acquire);
      if (c && c->context() == ctx) found = c;
    }
  }
  if (!found) found = create(ctx);  // waits for a destruction of ctx in progress (mu_)
  t_ctx = ctx;
  t_cache<Layout> = found;
  t_gen = gen;
  return found;
}

template <class Layout>
pool::pool<Layout>* pooled_backend<Layout>::create(CUcontext ctx) noexcept {
  std::lock_guard<std::mutex> g(mu_);
  const int n = count_.load(std::memory_order_relaxed);
  int slot_index = n;  // the first free slot (a destroyed context's), else a new one
  for (int i = 0; i < n; ++i) {
    pool::pool<Layout>* c = caches_[i].load(std::memory_order_relaxed);
    if (c && c->context() == ctx) return c;
    if (!c && slot_index == n) slot_index = i;
  }
  if (slot_index >= kMax || !drv().ctx_get_device) return nullptr;
  CUdevice dev = -1;
  if (drv().ctx_get_device(&dev) != CUDA_SUCCESS) return nullptr;
  ring::DeviceSlot* slot = tracker_.device(dev);
  if (!slot) return nullptr;
  pool::pool<Layout>* c = nullptr;
  try {
    c = Layout::make(ctx, dev, *slot, tracker_, *this, peers_[dev & (ring::kMaxDevices - 1)]);
  } catch (...) {
    return nullptr;
  }
  if (!c) return nullptr;
  bool other = unordered_;  // another pool: its context's work is not ordered with this one's
  for (int i = 0; i < n && !other; ++i) other = caches_[i].load(std::memory_order_relaxed) != nullptr;
  if (other) c->unorder();
  caches_[slot_index].store(c, std::memory_order_release);
  if (slot_index == n) count_.store(n + 1, std::memory_order_release);
  if (other) unorder_all_locked();
  return c;
}

template <class Layout>
void pooled_backend<Layout>::unorder_all_locked() {
  unordered_ = true;
  const int n = count_.load(std::memory_order_relaxed);
  for (int i = 0; i < n; ++i)
    if (pool::pool<Layout>* c = caches_[i].load(std::memory_order_relaxed)) c->unorder();
}

template <class Layout>
void pooled_backend<Layout>::do_capture_beginning(core::Tracker&) {
  std::lock_guard<std::mutex> g(mu_);  // no context is being destroyed meanwhile
  const int n = count_.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i)
    if (pool::pool<Layout>* c = caches_[i].load(std::memory_order_acquire)) c->capture_beginning();
}

template <class Layout>
CUW_HOT CUresult pooled_backend<Layout>::free_traced(CUdeviceptr p, ring::Api api, uint64_t aux, uint64_t now) {
  // The block map answers whatever the current context is: try the thread's last cache
  // first without asking the driver (a dropped cache finds nothing and is skipped). The
  // cache of a context being destroyed is asked last: once the driver destroyed it, another
  // context's cache may hold a block where one of the dying cache's starts.
  pool::pool<Layout>* first = t_cache<Layout>;
  if (!first) first = for_current();
  const CUcontext going = dying_.load(std::memory_order_acquire);
  pool::pool<Layout>* last = nullptr;
  if (__builtin_expect(going != nullptr, 0) && first && first->context() == going) std::swap(first, last);
  if (first)
    if (const CUresult r = first->free_traced(p, api, aux, now); r != CUDA_ERROR_NOT_FOUND) return r;
  const int n = count_.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i) {
    pool::pool<Layout>* c = caches_[i].load(std::memory_order_acquire);
    if (!c || c == first || c == last) continue;
    if (going && c->context() == going) {
      last = c;
      continue;
    }
    if (const CUresult r = c->free_traced(p, api, aux, now); r != CUDA_ERROR_NOT_FOUND) return r;
  }
  return last ? last->free_traced(p, api, aux, now) : CUDA_ERROR_NOT_FOUND;
}

template <class Layout>
pool::pool<Layout>* pooled_backend<Layout>::owner_of(CUdeviceptr p, range* out, bool* live) {
  // As free_traced: a context being destroyed is asked last.
  const CUcontext going = dying_.load(std::memory_order_acquire);
  pool::pool<Layout>* last = nullptr;
  const int n = count_.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i) {
    pool::pool<Layout>* c = caches_[i].load(std::memory_order_acquire);
    if (!c) continue;
    if (going && c->context() == going) {
      last = c;
      continue;
    }
    if (c->locate(p, out, live)) return c;
  }
  return last && last->locate(p, out, live) ? last : nullptr;
}

template <class Layout>
uint64_t pooled_backend<Layout>::release_all_except(const pool::pool<Layout>* skip) {
  uint64_t total = 0;
  const int n = count_.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i)
    if (pool::pool<Layout>* c = caches_[i].load(std::memory_order_acquire); c && c != skip) total += c->release();
  return total;
}

template <class Layout>
bool pooled_backend<Layout>::live_elsewhere(CUdeviceptr p, const pool::pool<Layout>* skip) {
  const int n = count_.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i) {
    pool::pool<Layout>* c = caches_[i].load(std::memory_order_acquire);
    range r{};
    bool live = false;
    if (c && c != skip && c->locate(p, &r, &live) && live && r.base == p) return true;
  }
  return false;
}

template <class Layout>
void pooled_backend<Layout>::do_stream_created(core::Tracker&, CUstream s, unsigned flags) {
  if (!(flags & CU_STREAM_NON_BLOCKING)) return;  // covered by the legacy stream's event
  if (pool::pool<Layout>* c = for_current()) c->add_stream(s);
}

template <class Layout>
void pooled_backend<Layout>::do_stream_destroying(core::Tracker&, CUstream s) {
  const int n = count_.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i) {
    pool::pool<Layout>* c = caches_[i].load(std::memory_order_acquire);
    if (c && c->remove_stream(s)) return;
  }
  // A blocking stream (not tracked: the legacy stream's event follows its work while it
  // exists): its work queued before the destroy is marked with an event of its own, not
  // left to the legacy stream's ordering with a stream that no longer exists.
  CUcontext ctx = nullptr;
  if (s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD || !drv().stream_get_ctx ||
      drv().stream_get_ctx(s, &ctx) != CUDA_SUCCESS || !ctx)
    return;
  for (int i = 0; i < n; ++i) {
    pool::pool<Layout>* c = caches_[i].load(std::memory_order_acquire);
    if (c && c->context() == ctx) {
      c->orphan_stream(s);
      return;
    }
  }
}

template <class Layout>
bool pooled_backend<Layout>::do_context_destroy(core::Tracker&, call_ref<CUcontext()> which, call_ref<bool()> destroy) {
  std::lock_guard<std::mutex> g(mu_);
  const CUcontext ctx = which();
  if (!ctx) return destroy();
  // Hide ctx's cache from for_current (its per-thread shortcut too) until the outcome, and
  // stop its driver calls on its memory (release, frees of exported blocks, stream events).
  dying_.store(ctx, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  const int n0 = count_.load(std::memory_order_relaxed);
  for (int i = 0; i < n0; ++i)
    if (pool::pool<Layout>* c = caches_[i].load(std::memory_order_relaxed); c && c->context() == ctx) c->set_dying(true);
  const bool gone = destroy();
  if (gone) {
    const int n = count_.load(std::memory_order_relaxed);
    for (int i = 0; i < n; ++i) {
      pool::pool<Layout>* c = caches_[i].load(std::memory_order_relaxed);
      if (c && c->context() == ctx) {
        c->forget_all();
        caches_[i].store(nullptr, std::memory_order_release);
        dropped_.push_back(c);  // kept allocated (and reachable): a racing thread may hold it
      }
    }
    generation_.fetch_add(1, std::memory_order_acq_rel);
  } else {
    for (int i = 0; i < n0; ++i)
      if (pool::pool<Layout>* c = caches_[i].load(std::memory_order_relaxed); c && c->context() == ctx) c->set_dying(false);
  }
  dying_.store(nullptr, std::memory_order_release);
  return gone;
}

template <class Layout>
void pooled_backend<Layout>::do_peer_access_changed(core::Tracker&, CUcontext peer, bool enabled) {
  if (enabled) {  // the peer's work may reach this context's memory, unordered with its streams
    std::lock_guard<std::mutex> g(mu_);
    unorder_all_locked();
  }
  if (!Layout::kGrantsPeers || !enabled || !peer || !drv().ctx_get_device) return;
  CUdevice self = -1, other = -1;
  if (drv().ctx_get_device(&self) != CUDA_SUCCESS) return;
  {
    CtxScope scope(peer);
    if (drv().ctx_get_device(&other) != CUDA_SUCCESS) return;
  }
  if (self < 0 || other < 0 || self == other) return;
  // The current context (on `self`) may now access the peer's memory: the pools of the
  // peer's device let `self` in.
  std::lock_guard<std::mutex> g(mu_);
  auto& peers = peers_[other & (ring::kMaxDevices - 1)];
  if (std::find(peers.begin(), peers.end(), self) == peers.end()) peers.push_back(self);
  const int n = count_.load(std::memory_order_relaxed);
  for (int i = 0; i < n; ++i)
    if (pool::pool<Layout>* c = caches_[i].load(std::memory_order_relaxed); c && c->ordinal() == other)
      Layout::grant_peer(*c, self);
}

template <class Layout>
CUresult pooled_backend<Layout>::do_context_retain(core::Tracker&, call_ref<CUresult()> call) {
  std::lock_guard<std::mutex> g(mu_);
  return call();
}

// ---- queries and IPC ------------------------------------------------------------------------------
// The driver knows the caches' driver allocations, not the blocks in them: for a pooled
// address these answer with the program's allocation (the block).

template <class Layout>
bool pooled_backend<Layout>::do_locate(core::Tracker&, CUdeviceptr p, range* out, bool* live) {
  return owner_of(p, out, live) != nullptr;
}

template <class Layout>
CUresult pooled_backend<Layout>::do_ipc_export(core::Tracker& t, CUipcMemHandle* handle, CUdeviceptr p, ipc_export_fn real) {
  bool live = false;
  if (pool::pool<Layout>* c = owner_of(p, nullptr, &live)) {
    if (!handle) return CUDA_ERROR_INVALID_VALUE;
    ipc_span span;
    const CUresult r = c->ipc_handle(handle, p, &span);
    if (r == CUDA_ERROR_NOT_SUPPORTED) return ipc::make_handle(handle, span, this);
    if (r != CUDA_ERROR_NOT_FOUND) return r;
  }
  return passthrough_.ipc_export(t, handle, p, real);
}

template <class Layout>
CUresult pooled_backend<Layout>::do_ipc_describe(core::Tracker&, CUdeviceptr p, uint64_t bytes, ipc_span* out) {
  bool live = false;
  pool::pool<Layout>* c = owner_of(p, nullptr, &live);
  if (!c || !live) return CUDA_ERROR_INVALID_HANDLE;
  return c->ipc_describe(p, bytes, out);
}

template <class Layout>
bool pooled_backend<Layout>::do_for_each_block(core::Tracker&, call_ref<void(const block_info&)> visit) {
  std::vector<block_info> all;
  bool complete = true;
  const int n = count_.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i)
    if (pool::pool<Layout>* c = caches_[i].load(std::memory_order_acquire)) complete = c->blocks(all) && complete;
  for (const block_info& b : all) visit(b);
  return complete;
}

template <class Layout>
pool_stats pooled_backend<Layout>::do_stats(core::Tracker&, int ordinal) {
  pool_stats total;
  const int n = count_.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i) {
    pool::pool<Layout>* c = caches_[i].load(std::memory_order_acquire);
    if (!c || c->ordinal() != ordinal) continue;
    const pool_stats s = c->stats();
    total.reserved += s.reserved;
    total.cached += s.cached;
    total.largest_free = std::max(total.largest_free, s.largest_free);
  }
  return total;
}

}  // namespace cuw::backends

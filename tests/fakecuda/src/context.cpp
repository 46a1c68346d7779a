// fakecuda: contexts — primary contexts, created contexts, and the per-thread current-context stack.
//
// Context objects are never freed: a destroyed context stays a known-dead handle, so a stale
// handle gives CUDA_ERROR_INVALID_CONTEXT instead of a crash, as with the real driver.
#include <set>

#include "internal.hpp"

namespace fc {
namespace {

std::mutex g_ctx_mu;
auto& g_live = *new std::set<Context*>;  // alive contexts; never destroyed: used at exit
std::atomic<uint64_t> g_next_ctx_id{1};
thread_local std::vector<Context*>* t_stack_ptr;  // back() is current; leaked per thread

std::vector<Context*>& stack() {
  if (!t_stack_ptr) t_stack_ptr = new std::vector<Context*>;
  return *t_stack_ptr;
}

void make_live(Context* c, bool live);

Context* new_context(int ordinal, unsigned flags, bool primary) {
  auto* c = new Context;
  c->ordinal = ordinal;
  c->flags = flags;
  c->is_primary = primary;
  c->id = g_next_ctx_id.fetch_add(1);
  c->legacy = stream_create(c, 0, 0, /*legacy=*/true, /*per_thread=*/false);
  c->alive = false;
  make_live(c, true);
  return c;
}

// CUWARDEN_FAKE_CONTEXT_MEMORY: what the driver takes from the device for each context
// (about 0.5 GiB on an H200: the context, its heaps, the modules it loads). Counted in the
// device's used bytes, so cuMemGetInfo and NVML's per-process figure include it, as on a GPU.
size_t context_bytes() {
  static const size_t bytes = [] {
    const char* v = std::getenv("CUWARDEN_FAKE_CONTEXT_MEMORY");
    bool ok = false;
    const size_t b = v && *v ? parse_size(v, &ok) : 0;
    if (v && *v && !ok) {
      std::fprintf(stderr, "[fakecuda] bad CUWARDEN_FAKE_CONTEXT_MEMORY '%s'\n", v);
      std::abort();
    }
    return b;
  }();
  return bytes;
}

void make_live(Context* c, bool live) {
  std::lock_guard lock(g_ctx_mu);
  if (live == c->alive.load() && live == (g_live.count(c) != 0)) return;
  if (live) g_live.insert(c);
  else g_live.erase(c);
  c->alive = live;
  // The driver's own memory for the context: taken while it lives (capacity permitting, as
  // the driver's reserve is not refused here), given back with it.
  Device* d = device(c->ordinal);
  if (live) {
    c->driver_bytes = context_bytes();
    d->charge(c->driver_bytes);
  } else {
    d->unreserve(c->driver_bytes);
    c->driver_bytes = 0;
  }
}

CUresult create_context(CUcontext* pctx, unsigned flags, CUdevice dev) {
  if (CUresult rc = check_device(dev)) return rc;
  if (!pctx) return CUDA_ERROR_INVALID_VALUE;
  Context* c = new_context(dev, flags, false);
  stack().push_back(c);
  *pctx = reinterpret_cast<CUcontext>(c);
  return CUDA_SUCCESS;
}

CUresult destroy_context(CUcontext h) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  Context* c = context_from_handle(h);
  if (!c) return CUDA_ERROR_INVALID_CONTEXT;
  if (c->is_primary) return CUDA_ERROR_INVALID_CONTEXT;
  context_synchronize(c);
  table_free_context(c);  // the driver destroys every allocation of the context
  make_live(c, false);
  // The driver pops it from the calling thread's stack if it is current there.
  if (!stack().empty() && stack().back() == c) stack().pop_back();
  return CUDA_SUCCESS;
}

}  // namespace

uint64_t thread_token() {
  static std::atomic<uint64_t> next{1};
  thread_local uint64_t token = next.fetch_add(1);
  return token;
}

Context* current_context() {
  if (stack().empty()) return nullptr;
  Context* c = stack().back();
  return c->alive ? c : nullptr;
}

CUresult require_context(Context** out) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  Context* c = current_context();
  if (!c) return CUDA_ERROR_INVALID_CONTEXT;
  *out = c;
  return CUDA_SUCCESS;
}

Context* context_from_handle(CUcontext h) {
  auto* c = reinterpret_cast<Context*>(h);
  std::lock_guard lock(g_ctx_mu);
  return g_live.count(c) ? c : nullptr;
}

void context_attach_stream(Context* ctx, Stream* s) {
  std::lock_guard lock(ctx->streams_mu);
  ctx->streams.push_back(s);
}

void context_detach_stream(Context* ctx, Stream* s) {
  std::lock_guard lock(ctx->streams_mu);
  std::erase(ctx->streams, s);
  // Its queued work still belongs to the context: a synchronization (and the context's
  // destruction, which frees its memory) waits for it, as the real driver does.
  ctx->draining.push_back(s);
}

std::vector<Stream*> all_streams() {
  std::vector<Context*> live;
  {
    std::lock_guard lock(g_ctx_mu);
    live.assign(g_live.begin(), g_live.end());
  }
  std::vector<Stream*> out;
  for (Context* c : live) {
    std::lock_guard lock(c->streams_mu);
    out.insert(out.end(), c->streams.begin(), c->streams.end());
    out.insert(out.end(), c->draining.begin(), c->draining.end());
  }
  return out;
}

CUresult context_synchronize(Context* ctx) {
  std::vector<Stream*> streams;
  {
    std::lock_guard lock(ctx->streams_mu);
    streams = ctx->streams;
    streams.insert(streams.end(), ctx->draining.begin(), ctx->draining.end());
  }
  for (Stream* s : streams) stream_wait(s, stream_submitted(s));
  {
    std::lock_guard lock(ctx->streams_mu);  // drained: destroyed streams are never freed, only forgotten
    std::erase_if(ctx->draining, [](Stream* s) { return stream_done(s, stream_submitted(s)); });
  }
  pools_trim_to_threshold();
  return CUDA_SUCCESS;
}

CUresult primary_retain(CUcontext* pctx, CUdevice dev) {
  if (CUresult rc = check_device(dev)) return rc;
  if (!pctx) return CUDA_ERROR_INVALID_VALUE;
  Device* d = device(dev);
  std::lock_guard lock(d->primary_mu);
  if (!d->primary) {
    d->primary = new_context(dev, d->primary_flags, true);
  } else if (d->primary_refs == 0 && !d->primary->alive) {
    // Made active again after its last release destroyed it: the same handle, a new ID
    // (cuCtxGetId), as the driver does (measured on an H200, driver 580).
    d->primary->id = g_next_ctx_id.fetch_add(1);
  }
  if (d->primary_refs++ == 0) make_live(d->primary, true);
  *pctx = reinterpret_cast<CUcontext>(d->primary);
  return CUDA_SUCCESS;
}

}  // namespace fc

using namespace fc;

FC_API CUresult fakecuda_context_grow(size_t bytes) {
  Context* c = current_context();
  if (!c) return CUDA_ERROR_INVALID_CONTEXT;
  std::lock_guard lock(g_ctx_mu);
  c->driver_bytes += bytes;
  device(c->ordinal)->charge(bytes);
  return CUDA_SUCCESS;
}

FC_API CUresult cuCtxCreate(CUcontext* pctx, unsigned int flags, CUdevice dev) {
  FC_ENTER();
  return create_context(pctx, flags, dev);
}
FC_API CUresult cuCtxCreate_v2(CUcontext* pctx, unsigned int flags, CUdevice dev) {
  FC_ENTER();
  return create_context(pctx, flags, dev);
}
FC_API CUresult cuCtxCreate_v3(CUcontext* pctx, CUexecAffinityParam* paramsArray, int numParams,
                               unsigned int flags, CUdevice dev) {
  FC_ENTER();
  (void)paramsArray;
  (void)numParams;
  return create_context(pctx, flags, dev);
}
FC_API CUresult cuCtxCreate_v4(CUcontext* pctx, CUctxCreateParams* ctxCreateParams, unsigned int flags,
                               CUdevice dev) {
  FC_ENTER();
  (void)ctxCreateParams;
  return create_context(pctx, flags, dev);
}

FC_API CUresult cuCtxDestroy(CUcontext ctx) {
  FC_ENTER();
  return destroy_context(ctx);
}
FC_API CUresult cuCtxDestroy_v2(CUcontext ctx) {
  FC_ENTER();
  const CUresult r = destroy_context(ctx);
  if (r == CUDA_SUCCESS) pause_point("cuCtxDestroy destroyed");
  return r;
}

FC_API CUresult cuCtxSetCurrent(CUcontext ctx) {
  FC_ENTER();
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!ctx) {
    if (!stack().empty()) stack().pop_back();
    return CUDA_SUCCESS;
  }
  Context* c = context_from_handle(ctx);
  if (!c) return CUDA_ERROR_INVALID_CONTEXT;
  if (stack().empty()) stack().push_back(c);
  else stack().back() = c;
  return CUDA_SUCCESS;
}

FC_API CUresult cuCtxGetCurrent(CUcontext* pctx) {
  FC_ENTER();
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!pctx) return CUDA_ERROR_INVALID_VALUE;
  *pctx = reinterpret_cast<CUcontext>(current_context());
  return CUDA_SUCCESS;
}

namespace {
CUresult push_current(CUcontext ctx) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  Context* c = context_from_handle(ctx);
  if (!c) return CUDA_ERROR_INVALID_CONTEXT;
  stack().push_back(c);
  return CUDA_SUCCESS;
}
CUresult pop_current(CUcontext* pctx) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (stack().empty()) return CUDA_ERROR_INVALID_CONTEXT;
  Context* c = stack().back();
  stack().pop_back();
  if (pctx) *pctx = reinterpret_cast<CUcontext>(c);
  return CUDA_SUCCESS;
}
}  // namespace

FC_API CUresult cuCtxPushCurrent(CUcontext ctx) {
  FC_ENTER();
  return push_current(ctx);
}
FC_API CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
  FC_ENTER();
  return push_current(ctx);
}
FC_API CUresult cuCtxPopCurrent(CUcontext* pctx) {
  FC_ENTER();
  return pop_current(pctx);
}
FC_API CUresult cuCtxPopCurrent_v2(CUcontext* pctx) {
  FC_ENTER();
  return pop_current(pctx);
}

FC_API CUresult cuCtxGetDevice(CUdevice* device_out) {
  FC_ENTER();
  Context* c;
  if (CUresult rc = require_context(&c)) return rc;
  if (!device_out) return CUDA_ERROR_INVALID_VALUE;
  *device_out = c->ordinal;
  return CUDA_SUCCESS;
}

FC_API CUresult cuCtxGetDevice_v2(CUdevice* device_out, CUcontext ctx) {
  FC_ENTER();
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  Context* c = ctx ? context_from_handle(ctx) : current_context();
  if (!c) return CUDA_ERROR_INVALID_CONTEXT;
  if (!device_out) return CUDA_ERROR_INVALID_VALUE;
  *device_out = c->ordinal;
  return CUDA_SUCCESS;
}

FC_API CUresult cuCtxSynchronize(void) {
  FC_ENTER();
  Context* c;
  if (CUresult rc = require_context(&c)) return rc;
  if (capture_prohibits_unsafe_call()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  return context_synchronize(c);
}

FC_API CUresult cuCtxSynchronize_v2(CUcontext ctx) {
  FC_ENTER();
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  Context* c = ctx ? context_from_handle(ctx) : current_context();
  if (!c) return CUDA_ERROR_INVALID_CONTEXT;
  if (capture_prohibits_unsafe_call()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  return context_synchronize(c);
}

FC_API CUresult cuCtxGetApiVersion(CUcontext ctx, unsigned int* version) {
  FC_ENTER();
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  Context* c = ctx ? context_from_handle(ctx) : current_context();
  if (!c) return CUDA_ERROR_INVALID_CONTEXT;
  if (!version) return CUDA_ERROR_INVALID_VALUE;
  *version = 3020;  // what the real driver reports for every context since CUDA 3.2
  return CUDA_SUCCESS;
}

FC_API CUresult cuCtxGetFlags(unsigned int* flags) {
  FC_ENTER();
  Context* c;
  if (CUresult rc = require_context(&c)) return rc;
  if (!flags) return CUDA_ERROR_INVALID_VALUE;
  *flags = c->flags;
  return CUDA_SUCCESS;
}

FC_API CUresult cuCtxSetFlags(unsigned int flags) {
  FC_ENTER();
  Context* c;
  if (CUresult rc = require_context(&c)) return rc;
  c->flags = flags;
  return CUDA_SUCCESS;
}

FC_API CUresult cuCtxGetId(CUcontext ctx, unsigned long long* ctxId) {
  FC_ENTER();
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  Context* c = ctx ? context_from_handle(ctx) : current_context();
  if (!c) return CUDA_ERROR_INVALID_CONTEXT;
  if (!ctxId) return CUDA_ERROR_INVALID_VALUE;
  *ctxId = c->id;
  return CUDA_SUCCESS;
}

FC_API CUresult cuCtxGetLimit(size_t* pvalue, CUlimit limit) {
  FC_ENTER();
  Context* c;
  if (CUresult rc = require_context(&c)) return rc;
  if (!pvalue) return CUDA_ERROR_INVALID_VALUE;
  switch (limit) {
    case CU_LIMIT_STACK_SIZE: *pvalue = 1024; break;
    case CU_LIMIT_PRINTF_FIFO_SIZE: *pvalue = 1 << 20; break;
    case CU_LIMIT_MALLOC_HEAP_SIZE: *pvalue = 8 << 20; break;
    case CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT: *pvalue = 2048; break;
    case CU_LIMIT_MAX_L2_FETCH_GRANULARITY: *pvalue = 64; break;
    case CU_LIMIT_PERSISTING_L2_CACHE_SIZE: *pvalue = 0; break;
    default: return CUDA_ERROR_UNSUPPORTED_LIMIT;
  }
  return CUDA_SUCCESS;
}

FC_API CUresult cuCtxSetLimit(CUlimit limit, size_t value) {
  FC_ENTER();
  Context* c;
  if (CUresult rc = require_context(&c)) return rc;
  (void)limit;
  (void)value;
  return CUDA_SUCCESS;
}

FC_API CUresult cuCtxGetStreamPriorityRange(int* leastPriority, int* greatestPriority) {
  FC_ENTER();
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (leastPriority) *leastPriority = 0;
  if (greatestPriority) *greatestPriority = -5;
  return CUDA_SUCCESS;
}

FC_API CUresult cuCtxGetCacheConfig(CUfunc_cache* pconfig) {
  FC_ENTER();
  Context* c;
  if (CUresult rc = require_context(&c)) return rc;
  if (!pconfig) return CUDA_ERROR_INVALID_VALUE;
  *pconfig = CU_FUNC_CACHE_PREFER_NONE;
  return CUDA_SUCCESS;
}

FC_API CUresult cuCtxSetCacheConfig(CUfunc_cache config) {
  FC_ENTER();
  Context* c;
  (void)config;
  return require_context(&c);
}

FC_API CUresult cuCtxResetPersistingL2Cache(void) {
  FC_ENTER();
  Context* c;
  return require_context(&c);
}

FC_API CUresult cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  FC_ENTER();
  return primary_retain(pctx, dev);
}

namespace {
CUresult primary_release(CUdevice dev) {
  if (CUresult rc = check_device(dev)) return rc;
  Device* d = device(dev);
  bool destroyed = false;
  {
    std::lock_guard lock(d->primary_mu);
    if (d->primary_refs <= 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (--d->primary_refs == 0) {
      context_synchronize(d->primary);
      table_free_context(d->primary);  // the last reference destroys the context and its memory
      make_live(d->primary, false);
      destroyed = true;
    }
  }
  if (destroyed) pause_point("cuDevicePrimaryCtxRelease");
  return CUDA_SUCCESS;
}
CUresult primary_set_flags(CUdevice dev, unsigned flags) {
  if (CUresult rc = check_device(dev)) return rc;
  Device* d = device(dev);
  std::lock_guard lock(d->primary_mu);
  d->primary_flags = flags;
  if (d->primary) d->primary->flags = flags;
  return CUDA_SUCCESS;
}
CUresult primary_reset(CUdevice dev) {
  if (CUresult rc = check_device(dev)) return rc;
  Device* d = device(dev);
  std::lock_guard lock(d->primary_mu);
  if (d->primary && d->primary->alive) {
    context_synchronize(d->primary);
    table_free_context(d->primary);  // the driver destroys every allocation of the context
  }
  return CUDA_SUCCESS;
}
}  // namespace

FC_API CUresult cuDevicePrimaryCtxRelease(CUdevice dev) {
  FC_ENTER();
  return primary_release(dev);
}
FC_API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  FC_ENTER();
  return primary_release(dev);
}
FC_API CUresult cuDevicePrimaryCtxSetFlags(CUdevice dev, unsigned int flags) {
  FC_ENTER();
  return primary_set_flags(dev, flags);
}
FC_API CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags) {
  FC_ENTER();
  return primary_set_flags(dev, flags);
}
FC_API CUresult cuDevicePrimaryCtxReset(CUdevice dev) {
  FC_ENTER();
  return primary_reset(dev);
}
FC_API CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
  FC_ENTER();
  return primary_reset(dev);
}

FC_API CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int* flags, int* active) {
  FC_ENTER();
  if (CUresult rc = check_device(dev)) return rc;
  if (!flags || !active) return CUDA_ERROR_INVALID_VALUE;
  Device* d = device(dev);
  {
    std::lock_guard lock(d->primary_mu);
    *flags = d->primary_flags;
    *active = d->primary_refs > 0 ? 1 : 0;
  }
  if (!*active) pause_point("cuDevicePrimaryCtxGetState");
  return CUDA_SUCCESS;
}

// fakecuda: streams and events — queued work executed in order by one worker thread per stream.
//
// Semantics kept from the driver:
//  - work on one stream runs in submission order, later than the call that queued it;
//  - the legacy default stream waits for all blocking streams of its context and they wait
//    for it (CU_STREAM_NON_BLOCKING streams opt out); the per-thread default stream is a
//    blocking stream of its own per thread;
//  - events mark a point in a stream; cuStreamWaitEvent makes another stream wait for it;
//  - synchronous copies wait for their copy; async copies from pageable host memory take a
//    snapshot of the source at call time, async copies into pageable memory wait, like the
//    driver's staging; copies and memsets with pinned/device memory are really asynchronous.
// Stream objects are never freed (a destroyed stream's worker exits once drained); handles of
// destroyed streams are rejected with CUDA_ERROR_INVALID_HANDLE.
#include <chrono>
#include <cstring>
#include <map>
#include <set>
#include <thread>
#include <unordered_map>

#include "internal.hpp"  // before fakecuda.h: it sets up cuda.h for the driver side
#include "../fakecuda.h"

namespace fc {
namespace {

std::mutex g_streams_mu;
auto& g_live_streams = *new std::set<Stream*>;  // never destroyed: the runtime tears down at exit
std::atomic<uint64_t> g_next_stream_id{1};
thread_local std::map<Context*, Stream*>* t_per_thread;  // leaked per thread, valid during exit

// Test hook (fakecuda_inline_gate): while closed, a marker run by its caller waits between
// taking its number and completing, where a preempted thread would be.
std::mutex g_gate_mu;
std::condition_variable g_gate_cv;
bool g_gate_closed = false;
int g_gate_waiting = 0;

void inline_gate() {
  std::unique_lock lk(g_gate_mu);
  if (!g_gate_closed) return;
  ++g_gate_waiting;
  g_gate_cv.notify_all();
  g_gate_cv.wait(lk, [] { return !g_gate_closed; });
  --g_gate_waiting;
}

void worker_loop(Stream* s) {
  for (;;) {
    std::unique_lock lk(s->mu);
    // In order: an op queued while the caller ran an earlier marker itself starts after it.
    s->cv.wait(lk, [s] { return (!s->queue.empty() && s->inline_running == 0) || (s->queue.empty() && !s->alive); });
    if (s->queue.empty()) return;  // destroyed and drained
    Stream::Op op = std::move(s->queue.front());
    lk.unlock();
    for (auto& [dep, seq] : op.deps) stream_wait(dep, seq);
    if (op.fn) op.fn();
    lk.lock();
    s->queue.pop_front();
    s->completed = op.seq;
    s->cv.notify_all();
  }
}

Stream* per_thread_stream(Context* ctx) {
  if (!t_per_thread) t_per_thread = new std::map<Context*, Stream*>;
  auto it = t_per_thread->find(ctx);
  if (it != t_per_thread->end()) return it->second;
  Stream* s = stream_create(ctx, 0, 0, false, true);
  (*t_per_thread)[ctx] = s;
  return s;
}

uint64_t enqueue_with_deps(Stream* s, OpFn fn, std::vector<std::pair<Stream*, uint64_t>> deps, CUresult* err,
                           bool inline_if_idle = false) {
  *err = CUDA_SUCCESS;
  if (s->legacy && any_blocking_stream_capturing(s->ctx)) {
    invalidate_captures_of(s->ctx);
    *err = CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    return 0;
  }
  {
    std::lock_guard lk(s->mu);
    if (s->capture == CU_STREAM_CAPTURE_STATUS_ACTIVE) {
      graph_capture_op(s->capture_graph, std::move(fn));
      return 0;
    }
    if (s->capture == CU_STREAM_CAPTURE_STATUS_INVALIDATED) {
      *err = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
      return 0;
    }
  }
  // Implicit synchronization with the legacy stream.
  if (s->legacy) {
    std::vector<Stream*> others;
    {
      std::lock_guard lk(s->ctx->streams_mu);
      others = s->ctx->streams;
    }
    for (Stream* t : others) {
      if (t != s && !(t->flags & CU_STREAM_NON_BLOCKING)) deps.emplace_back(t, stream_submitted(t));
    }
  } else if (!(s->flags & CU_STREAM_NON_BLOCKING)) {
    deps.emplace_back(s->ctx->legacy, stream_submitted(s->ctx->legacy));
  }
  if (inline_if_idle) {
    // A marker (event record) on a stream with nothing queued and nothing to wait for
    // completes at once, as on an idle device (within microseconds there).
    bool ready = true;
    for (auto& [dep, dseq] : deps) ready = ready && stream_done(dep, dseq);
    std::unique_lock lk(s->mu);
    if (ready && s->queue.empty() && s->completed == s->submitted) {
      const uint64_t seq = ++s->submitted;
      s->inline_running = seq;
      lk.unlock();
      inline_gate();
      if (fn) fn();
      lk.lock();
      // Everything before it had completed, and work queued meanwhile waits for it (the
      // worker starts nothing while inline_running is set): it is complete, whatever is
      // queued. (Marking it only when the queue was empty hung: an op queued on this stream
      // meanwhile, waiting for a legacy-stream op that waits for this marker, never ran.)
      s->completed = seq;
      s->inline_running = 0;
      s->cv.notify_all();
      return seq;
    }
  }
  std::lock_guard lk(s->mu);
  uint64_t seq = ++s->submitted;
  s->queue.push_back(Stream::Op{std::move(fn), std::move(deps), seq});
  if (!s->worker_started) {
    s->worker_started = true;
    std::thread(worker_loop, s).detach();
  }
  s->cv.notify_all();
  return seq;
}

}  // namespace

Stream* stream_create(Context* ctx, unsigned flags, int priority, bool legacy, bool per_thread) {
  auto* s = new Stream;
  s->ctx = ctx;
  s->flags = flags;
  s->priority = priority;
  s->legacy = legacy;
  s->per_thread = per_thread;
  s->id = g_next_stream_id.fetch_add(1);
  {
    std::lock_guard lock(g_streams_mu);
    g_live_streams.insert(s);
  }
  context_attach_stream(ctx, s);
  return s;
}

CUresult resolve_stream(CUstream h, bool per_thread_default, Stream** out) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (h == nullptr || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD) {
    Context* ctx = current_context();
    if (!ctx) return CUDA_ERROR_INVALID_CONTEXT;
    bool pt = h == CU_STREAM_PER_THREAD || (h == nullptr && per_thread_default);
    *out = pt ? per_thread_stream(ctx) : ctx->legacy;
    return CUDA_SUCCESS;
  }
  auto* s = reinterpret_cast<Stream*>(h);
  std::lock_guard lock(g_streams_mu);
  if (!g_live_streams.count(s)) return CUDA_ERROR_INVALID_HANDLE;
  *out = s;
  return CUDA_SUCCESS;
}

uint64_t stream_enqueue(Stream* s, OpFn fn, CUresult* err) { return enqueue_with_deps(s, std::move(fn), {}, err); }

void stream_wait(Stream* s, uint64_t seq) {
  std::unique_lock lk(s->mu);
  s->cv.wait(lk, [&] { return s->completed >= seq; });
}

bool stream_wait_until(Stream* s, uint64_t seq, std::chrono::steady_clock::time_point deadline) {
  std::unique_lock lk(s->mu);
  return s->cv.wait_until(lk, deadline, [&] { return s->completed >= seq; });
}

bool stream_done(Stream* s, uint64_t seq) {
  std::lock_guard lk(s->mu);
  return s->completed >= seq;
}

uint64_t stream_submitted(Stream* s) {
  std::lock_guard lk(s->mu);
  return s->submitted;
}

bool stream_is_capturing(Stream* s) {
  std::lock_guard lk(s->mu);
  return s->capture != CU_STREAM_CAPTURE_STATUS_NONE;
}

CUresult stream_synchronize(Stream* s) {
  {
    std::lock_guard lk(s->mu);
    if (s->capture != CU_STREAM_CAPTURE_STATUS_NONE) {
      s->capture = CU_STREAM_CAPTURE_STATUS_INVALIDATED;
      return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
  }
  if (s->legacy && any_blocking_stream_capturing(s->ctx)) {
    invalidate_captures_of(s->ctx);
    return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
  }
  if (s->legacy) {
    // The legacy stream's sync also waits for every blocking stream's earlier work.
    std::vector<Stream*> others;
    {
      std::lock_guard lk(s->ctx->streams_mu);
      others = s->ctx->streams;
    }
    for (Stream* t : others)
      if (!(t->flags & CU_STREAM_NON_BLOCKING)) stream_wait(t, stream_submitted(t));
  } else {
    stream_wait(s, stream_submitted(s));
  }
  pools_trim_to_threshold();
  return CUDA_SUCCESS;
}

}  // namespace fc

using namespace fc;

// ------------------------------------------------------------------ streams

namespace {

CUresult create_stream(CUstream* ph, unsigned flags, int priority) {
  Context* ctx;
  if (CUresult rc = require_context(&ctx)) return rc;
  if (!ph) return CUDA_ERROR_INVALID_VALUE;
  if (flags & ~static_cast<unsigned>(CU_STREAM_NON_BLOCKING)) return CUDA_ERROR_INVALID_VALUE;
  if (priority > 0) priority = 0;
  if (priority < -5) priority = -5;
  *ph = reinterpret_cast<CUstream>(stream_create(ctx, flags, priority, false, false));
  return CUDA_SUCCESS;
}

CUresult destroy_stream(CUstream h) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (h == nullptr || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD) return CUDA_ERROR_INVALID_HANDLE;
  auto* s = reinterpret_cast<Stream*>(h);
  {
    std::lock_guard lock(g_streams_mu);
    if (!g_live_streams.erase(s)) return CUDA_ERROR_INVALID_HANDLE;
  }
  context_detach_stream(s->ctx, s);
  std::lock_guard lk(s->mu);
  s->alive = false;  // the worker drains what is queued, then exits
  s->cv.notify_all();
  return CUDA_SUCCESS;
}

CUresult query_stream(CUstream h, bool pt) {
  Stream* s;
  if (CUresult rc = resolve_stream(h, pt, &s)) return rc;
  std::lock_guard lk(s->mu);
  if (s->capture != CU_STREAM_CAPTURE_STATUS_NONE) {
    s->capture = CU_STREAM_CAPTURE_STATUS_INVALIDATED;
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  return s->completed >= s->submitted ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult sync_stream(CUstream h, bool pt) {
  Stream* s;
  if (CUresult rc = resolve_stream(h, pt, &s)) return rc;
  return stream_synchronize(s);
}

}  // namespace

FC_API CUresult cuStreamCreate(CUstream* phStream, unsigned int Flags) {
  FC_ENTER();
  return create_stream(phStream, Flags, 0);
}
FC_API CUresult cuStreamCreateWithPriority(CUstream* phStream, unsigned int flags, int priority) {
  FC_ENTER();
  return create_stream(phStream, flags, priority);
}
FC_API CUresult cuStreamDestroy(CUstream hStream) {
  FC_ENTER();
  return destroy_stream(hStream);
}
FC_API CUresult cuStreamDestroy_v2(CUstream hStream) {
  FC_ENTER();
  return destroy_stream(hStream);
}
FC_API CUresult cuStreamQuery(CUstream hStream) {
  FC_ENTER();
  return query_stream(hStream, false);
}
FC_API CUresult cuStreamQuery_ptsz(CUstream hStream) {
  FC_ENTER();
  return query_stream(hStream, true);
}
FC_API CUresult cuStreamSynchronize(CUstream hStream) {
  FC_ENTER();
  return sync_stream(hStream, false);
}
FC_API CUresult cuStreamSynchronize_ptsz(CUstream hStream) {
  FC_ENTER();
  return sync_stream(hStream, true);
}

namespace {
CUresult stream_get_priority(CUstream h, int* priority, bool pt) {
  Stream* s;
  if (CUresult rc = resolve_stream(h, pt, &s)) return rc;
  if (!priority) return CUDA_ERROR_INVALID_VALUE;
  *priority = s->priority;
  return CUDA_SUCCESS;
}
CUresult stream_get_flags(CUstream h, unsigned* flags, bool pt) {
  Stream* s;
  if (CUresult rc = resolve_stream(h, pt, &s)) return rc;
  if (!flags) return CUDA_ERROR_INVALID_VALUE;
  *flags = s->flags;
  return CUDA_SUCCESS;
}
CUresult stream_get_ctx(CUstream h, CUcontext* pctx, bool pt) {
  Stream* s;
  if (CUresult rc = resolve_stream(h, pt, &s)) return rc;
  if (!pctx) return CUDA_ERROR_INVALID_VALUE;
  *pctx = reinterpret_cast<CUcontext>(s->ctx);
  return CUDA_SUCCESS;
}
CUresult stream_get_id(CUstream h, unsigned long long* id, bool pt) {
  Stream* s;
  if (CUresult rc = resolve_stream(h, pt, &s)) return rc;
  if (!id) return CUDA_ERROR_INVALID_VALUE;
  *id = s->id;
  return CUDA_SUCCESS;
}
CUresult stream_get_device(CUstream h, CUdevice* dev, bool pt) {
  Stream* s;
  if (CUresult rc = resolve_stream(h, pt, &s)) return rc;
  if (!dev) return CUDA_ERROR_INVALID_VALUE;
  *dev = s->ctx->ordinal;
  return CUDA_SUCCESS;
}
}  // namespace

FC_API CUresult cuStreamGetPriority(CUstream hStream, int* priority) {
  FC_ENTER();
  return stream_get_priority(hStream, priority, false);
}
FC_API CUresult cuStreamGetPriority_ptsz(CUstream hStream, int* priority) {
  FC_ENTER();
  return stream_get_priority(hStream, priority, true);
}
FC_API CUresult cuStreamGetFlags(CUstream hStream, unsigned int* flags) {
  FC_ENTER();
  return stream_get_flags(hStream, flags, false);
}
FC_API CUresult cuStreamGetFlags_ptsz(CUstream hStream, unsigned int* flags) {
  FC_ENTER();
  return stream_get_flags(hStream, flags, true);
}
FC_API CUresult cuStreamGetCtx(CUstream hStream, CUcontext* pctx) {
  FC_ENTER();
  return stream_get_ctx(hStream, pctx, false);
}
FC_API CUresult cuStreamGetCtx_ptsz(CUstream hStream, CUcontext* pctx) {
  FC_ENTER();
  return stream_get_ctx(hStream, pctx, true);
}
FC_API CUresult cuStreamGetCtx_v2(CUstream hStream, CUcontext* pCtx, CUgreenCtx* pGreenCtx) {
  FC_ENTER();
  if (pGreenCtx) *pGreenCtx = nullptr;
  return stream_get_ctx(hStream, pCtx, false);
}
FC_API CUresult cuStreamGetCtx_v2_ptsz(CUstream hStream, CUcontext* pCtx, CUgreenCtx* pGreenCtx) {
  FC_ENTER();
  if (pGreenCtx) *pGreenCtx = nullptr;
  return stream_get_ctx(hStream, pCtx, true);
}
FC_API CUresult cuStreamGetId(CUstream hStream, unsigned long long* streamId) {
  FC_ENTER();
  return stream_get_id(hStream, streamId, false);
}
FC_API CUresult cuStreamGetId_ptsz(CUstream hStream, unsigned long long* streamId) {
  FC_ENTER();
  return stream_get_id(hStream, streamId, true);
}
FC_API CUresult cuStreamGetDevice(CUstream hStream, CUdevice* device) {
  FC_ENTER();
  return stream_get_device(hStream, device, false);
}
FC_API CUresult cuStreamGetDevice_ptsz(CUstream hStream, CUdevice* device) {
  FC_ENTER();
  return stream_get_device(hStream, device, true);
}

// ------------------------------------------------------------------ host functions

namespace {
CUresult launch_host_func(CUstream h, CUhostFn fn, void* user, bool pt) {
  Stream* s;
  if (CUresult rc = resolve_stream(h, pt, &s)) return rc;
  if (!fn) return CUDA_ERROR_INVALID_VALUE;
  CUresult err;
  stream_enqueue(s, [fn, user] { fn(user); }, &err);
  return err;
}
CUresult add_callback(CUstream h, CUstreamCallback cb, void* user, unsigned flags, bool pt) {
  Stream* s;
  if (CUresult rc = resolve_stream(h, pt, &s)) return rc;
  if (!cb || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  CUresult err;
  stream_enqueue(s, [cb, user, h] { cb(h, CUDA_SUCCESS, user); }, &err);
  return err;
}
}  // namespace

FC_API CUresult cuLaunchHostFunc(CUstream hStream, CUhostFn fn, void* userData) {
  FC_ENTER();
  return launch_host_func(hStream, fn, userData, false);
}
FC_API CUresult cuLaunchHostFunc_ptsz(CUstream hStream, CUhostFn fn, void* userData) {
  FC_ENTER();
  return launch_host_func(hStream, fn, userData, true);
}
FC_API CUresult cuStreamAddCallback(CUstream hStream, CUstreamCallback callback, void* userData, unsigned int flags) {
  FC_ENTER();
  return add_callback(hStream, callback, userData, flags, false);
}
FC_API CUresult cuStreamAddCallback_ptsz(CUstream hStream, CUstreamCallback callback, void* userData,
                                         unsigned int flags) {
  FC_ENTER();
  return add_callback(hStream, callback, userData, flags, true);
}

// ------------------------------------------------------------------ events

namespace {

struct Event {
  unsigned flags = 0;
  std::mutex mu;
  Stream* stream = nullptr;  // where it was last recorded; nullptr: never (complete)
  uint64_t seq = 0;
  uint64_t generation = 0;
  bool has_time = false;
  std::chrono::steady_clock::time_point time{};
};

std::mutex g_events_mu;
auto& g_events = *new std::unordered_map<CUevent, std::shared_ptr<Event>>;  // never destroyed

std::shared_ptr<Event> find_event(CUevent h) {
  std::lock_guard lock(g_events_mu);
  auto it = g_events.find(h);
  return it == g_events.end() ? nullptr : it->second;
}

CUresult record_event(CUevent h, CUstream hs, bool pt) {
  auto ev = find_event(h);
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!ev) return CUDA_ERROR_INVALID_HANDLE;
  Stream* s;
  if (CUresult rc = resolve_stream(hs, pt, &s)) return rc;
  uint64_t gen;
  {
    std::lock_guard lk(ev->mu);
    gen = ++ev->generation;
    ev->has_time = false;
  }
  CUresult err;
  uint64_t seq = enqueue_with_deps(
      s,
      [ev, gen] {
        std::lock_guard lk(ev->mu);
        if (ev->generation == gen) {
          ev->time = std::chrono::steady_clock::now();
          ev->has_time = true;
        }
      },
      {}, &err, /*inline_if_idle=*/true);
  if (err) return err;
  std::lock_guard lk(ev->mu);
  if (seq == 0) return CUDA_SUCCESS;  // captured: becomes part of the graph
  if (ev->generation == gen) {
    ev->stream = s;
    ev->seq = seq;
  }
  return CUDA_SUCCESS;
}

CUresult wait_event(CUstream hs, CUevent h, unsigned flags, bool pt) {
  auto ev = find_event(h);
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!ev) return CUDA_ERROR_INVALID_HANDLE;
  (void)flags;
  Stream* s;
  if (CUresult rc = resolve_stream(hs, pt, &s)) return rc;
  std::vector<std::pair<Stream*, uint64_t>> deps;
  {
    std::lock_guard lk(ev->mu);
    if (ev->stream) deps.emplace_back(ev->stream, ev->seq);
  }
  CUresult err;
  enqueue_with_deps(s, nullptr, std::move(deps), &err);
  return err;
}

}  // namespace

FC_API CUresult cuEventCreate(CUevent* phEvent, unsigned int Flags) {
  FC_ENTER();
  Context* ctx;
  if (CUresult rc = require_context(&ctx)) return rc;
  if (!phEvent) return CUDA_ERROR_INVALID_VALUE;
  auto ev = std::make_shared<Event>();
  ev->flags = Flags;
  auto h = reinterpret_cast<CUevent>(ev.get());
  std::lock_guard lock(g_events_mu);
  g_events[h] = std::move(ev);
  *phEvent = h;
  return CUDA_SUCCESS;
}

namespace {
CUresult destroy_event(CUevent h) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  std::lock_guard lock(g_events_mu);
  return g_events.erase(h) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}
CUresult elapsed(float* ms, CUevent a, CUevent b) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!ms) return CUDA_ERROR_INVALID_VALUE;
  auto ea = find_event(a), eb = find_event(b);
  if (!ea || !eb) return CUDA_ERROR_INVALID_HANDLE;
  if ((ea->flags | eb->flags) & CU_EVENT_DISABLE_TIMING) return CUDA_ERROR_INVALID_HANDLE;
  std::chrono::steady_clock::time_point ta, tb;
  for (auto* e : {ea.get(), eb.get()}) {
    Stream* s;
    uint64_t seq;
    {
      std::lock_guard lk(e->mu);
      if (!e->stream) return CUDA_ERROR_INVALID_HANDLE;
      s = e->stream;
      seq = e->seq;
    }
    if (!stream_done(s, seq)) return CUDA_ERROR_NOT_READY;
    std::lock_guard lk(e->mu);
    if (!e->has_time) return CUDA_ERROR_NOT_READY;
    (e == ea.get() ? ta : tb) = e->time;
  }
  *ms = std::chrono::duration<float, std::milli>(tb - ta).count();
  return CUDA_SUCCESS;
}
}  // namespace

FC_API CUresult cuEventDestroy(CUevent hEvent) {
  FC_ENTER();
  return destroy_event(hEvent);
}
FC_API CUresult cuEventDestroy_v2(CUevent hEvent) {
  FC_ENTER();
  return destroy_event(hEvent);
}
FC_API CUresult cuEventRecord(CUevent hEvent, CUstream hStream) {
  FC_ENTER();
  return record_event(hEvent, hStream, false);
}
FC_API CUresult cuEventRecord_ptsz(CUevent hEvent, CUstream hStream) {
  FC_ENTER();
  return record_event(hEvent, hStream, true);
}
FC_API CUresult cuEventRecordWithFlags(CUevent hEvent, CUstream hStream, unsigned int flags) {
  FC_ENTER();
  (void)flags;
  return record_event(hEvent, hStream, false);
}
FC_API CUresult cuEventRecordWithFlags_ptsz(CUevent hEvent, CUstream hStream, unsigned int flags) {
  FC_ENTER();
  (void)flags;
  return record_event(hEvent, hStream, true);
}
FC_API CUresult cuEventQuery(CUevent hEvent) {
  FC_ENTER();
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  auto ev = find_event(hEvent);
  if (!ev) return CUDA_ERROR_INVALID_HANDLE;
  std::lock_guard lk(ev->mu);
  if (!ev->stream) return CUDA_SUCCESS;
  return stream_done(ev->stream, ev->seq) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}
FC_API CUresult cuEventSynchronize(CUevent hEvent) {
  FC_ENTER();
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  auto ev = find_event(hEvent);
  if (!ev) return CUDA_ERROR_INVALID_HANDLE;
  Stream* s;
  uint64_t seq;
  {
    std::lock_guard lk(ev->mu);
    s = ev->stream;
    seq = ev->seq;
  }
  if (s) stream_wait(s, seq);
  pools_trim_to_threshold();
  return CUDA_SUCCESS;
}
FC_API CUresult cuEventElapsedTime(float* pMilliseconds, CUevent hStart, CUevent hEnd) {
  FC_ENTER();
  return elapsed(pMilliseconds, hStart, hEnd);
}
FC_API CUresult cuEventElapsedTime_v2(float* pMilliseconds, CUevent hStart, CUevent hEnd) {
  FC_ENTER();
  return elapsed(pMilliseconds, hStart, hEnd);
}
FC_API CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags) {
  FC_ENTER();
  return wait_event(hStream, hEvent, Flags, false);
}
FC_API CUresult cuStreamWaitEvent_ptsz(CUstream hStream, CUevent hEvent, unsigned int Flags) {
  FC_ENTER();
  return wait_event(hStream, hEvent, Flags, true);
}

// ------------------------------------------------------------------ copies and memsets

namespace {

bool is_pinned_host(const void* p, size_t n) {
  Allocation a;
  if (!table_find_range(reinterpret_cast<uintptr_t>(p), n ? n : 1, &a)) return false;
  return a.kind == AllocKind::host || a.kind == AllocKind::registered || a.kind == AllocKind::managed;
}

bool is_device_range(CUdeviceptr p, size_t n) {
  Allocation a;
  return table_find_range(p, n ? n : 1, &a);
}

enum class Wait { no, yes };

// Queues memcpy(dst, src, n) on `s`. `snapshot`: copy the source now (pageable source).
CUresult queue_copy(Stream* s, void* dst, const void* src, size_t n, bool snapshot, Wait wait) {
  if (n == 0) return CUDA_SUCCESS;
  if (!dst || !src) return CUDA_ERROR_INVALID_VALUE;
  CUresult err;
  uint64_t seq;
  if (snapshot) {
    auto buf = std::make_shared<std::vector<unsigned char>>(static_cast<const unsigned char*>(src),
                                                            static_cast<const unsigned char*>(src) + n);
    seq = stream_enqueue(s, [dst, buf] { std::memcpy(dst, buf->data(), buf->size()); }, &err);
  } else {
    seq = stream_enqueue(s, [dst, src, n] { std::memmove(dst, src, n); }, &err);
  }
  if (err) return err;
  if (wait == Wait::yes && seq) stream_wait(s, seq);
  return CUDA_SUCCESS;
}

CUresult htod(CUdeviceptr dst, const void* src, size_t n, CUstream h, bool pt, bool async) {
  Stream* s;
  if (CUresult rc = resolve_stream(h, pt, &s)) return rc;
  if (n && !is_device_range(dst, n)) return CUDA_ERROR_INVALID_VALUE;
  bool pinned = is_pinned_host(src, n);
  return queue_copy(s, reinterpret_cast<void*>(dst), src, n, async && !pinned, async ? Wait::no : Wait::yes);
}

CUresult dtoh(void* dst, CUdeviceptr src, size_t n, CUstream h, bool pt, bool async) {
  Stream* s;
  if (CUresult rc = resolve_stream(h, pt, &s)) return rc;
  if (n && !is_device_range(src, n)) return CUDA_ERROR_INVALID_VALUE;
  bool pinned = is_pinned_host(dst, n);
  return queue_copy(s, dst, reinterpret_cast<const void*>(src), n, false,
                    async && pinned ? Wait::no : Wait::yes);
}

CUresult dtod(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream h, bool pt, bool async) {
  Stream* s;
  if (CUresult rc = resolve_stream(h, pt, &s)) return rc;
  if (n && (!is_device_range(dst, n) || !is_device_range(src, n))) return CUDA_ERROR_INVALID_VALUE;
  return queue_copy(s, reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), n, false,
                    async ? Wait::no : Wait::yes);
}

// Unified addressing: either side may be host memory.
CUresult unified(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream h, bool pt, bool async) {
  Stream* s;
  if (CUresult rc = resolve_stream(h, pt, &s)) return rc;
  auto* d = reinterpret_cast<void*>(dst);
  auto* sp = reinterpret_cast<const void*>(src);
  bool src_known = is_device_range(src, n);
  bool dst_known = is_device_range(dst, n);
  return queue_copy(s, d, sp, n, async && !src_known, async && dst_known ? Wait::no : Wait::yes);
}

template <typename T>
CUresult memset_n(CUdeviceptr dst, T value, size_t count, CUstream h, bool pt) {
  Stream* s;
  if (CUresult rc = resolve_stream(h, pt, &s)) return rc;
  if (count == 0) return CUDA_SUCCESS;
  if (dst % sizeof(T) != 0) return CUDA_ERROR_INVALID_VALUE;
  if (!is_device_range(dst, count * sizeof(T))) return CUDA_ERROR_INVALID_VALUE;
  CUresult err;
  stream_enqueue(
      s,
      [dst, value, count] {
        T* p = reinterpret_cast<T*>(dst);
        if constexpr (sizeof(T) == 1) std::memset(p, value, count);
        else
          for (size_t i = 0; i < count; ++i) p[i] = value;
      },
      &err);
  return err;
}

}  // namespace

FC_API CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void* srcHost, size_t ByteCount) {
  FC_ENTER();
  return htod(dstDevice, srcHost, ByteCount, nullptr, false, false);
}
FC_API CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dstDevice, const void* srcHost, size_t ByteCount) {
  FC_ENTER();
  return htod(dstDevice, srcHost, ByteCount, nullptr, true, false);
}
FC_API CUresult cuMemcpyDtoH_v2(void* dstHost, CUdeviceptr srcDevice, size_t ByteCount) {
  FC_ENTER();
  return dtoh(dstHost, srcDevice, ByteCount, nullptr, false, false);
}
FC_API CUresult cuMemcpyDtoH_v2_ptds(void* dstHost, CUdeviceptr srcDevice, size_t ByteCount) {
  FC_ENTER();
  return dtoh(dstHost, srcDevice, ByteCount, nullptr, true, false);
}
FC_API CUresult cuMemcpyDtoD_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount) {
  FC_ENTER();
  return dtod(dstDevice, srcDevice, ByteCount, nullptr, false, false);
}
FC_API CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount) {
  FC_ENTER();
  return dtod(dstDevice, srcDevice, ByteCount, nullptr, true, false);
}
FC_API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void* srcHost, size_t ByteCount, CUstream hStream) {
  FC_ENTER();
  return htod(dstDevice, srcHost, ByteCount, hStream, false, true);
}
FC_API CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dstDevice, const void* srcHost, size_t ByteCount,
                                          CUstream hStream) {
  FC_ENTER();
  return htod(dstDevice, srcHost, ByteCount, hStream, true, true);
}
FC_API CUresult cuMemcpyDtoHAsync_v2(void* dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream) {
  FC_ENTER();
  return dtoh(dstHost, srcDevice, ByteCount, hStream, false, true);
}
FC_API CUresult cuMemcpyDtoHAsync_v2_ptsz(void* dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream) {
  FC_ENTER();
  return dtoh(dstHost, srcDevice, ByteCount, hStream, true, true);
}
FC_API CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream) {
  FC_ENTER();
  return dtod(dstDevice, srcDevice, ByteCount, hStream, false, true);
}
FC_API CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount,
                                          CUstream hStream) {
  FC_ENTER();
  return dtod(dstDevice, srcDevice, ByteCount, hStream, true, true);
}
FC_API CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount) {
  FC_ENTER();
  return unified(dst, src, ByteCount, nullptr, false, false);
}
FC_API CUresult cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount) {
  FC_ENTER();
  return unified(dst, src, ByteCount, nullptr, true, false);
}
FC_API CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream) {
  FC_ENTER();
  return unified(dst, src, ByteCount, hStream, false, true);
}
FC_API CUresult cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream) {
  FC_ENTER();
  return unified(dst, src, ByteCount, hStream, true, true);
}
FC_API CUresult cuMemcpyPeer(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice,
                             CUcontext srcContext, size_t ByteCount) {
  FC_ENTER();
  (void)dstContext;
  (void)srcContext;
  return dtod(dstDevice, srcDevice, ByteCount, nullptr, false, false);
}
FC_API CUresult cuMemcpyPeer_ptds(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice,
                                  CUcontext srcContext, size_t ByteCount) {
  FC_ENTER();
  (void)dstContext;
  (void)srcContext;
  return dtod(dstDevice, srcDevice, ByteCount, nullptr, true, false);
}
FC_API CUresult cuMemcpyPeerAsync(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice,
                                  CUcontext srcContext, size_t ByteCount, CUstream hStream) {
  FC_ENTER();
  (void)dstContext;
  (void)srcContext;
  return dtod(dstDevice, srcDevice, ByteCount, hStream, false, true);
}
FC_API CUresult cuMemcpyPeerAsync_ptsz(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice,
                                       CUcontext srcContext, size_t ByteCount, CUstream hStream) {
  FC_ENTER();
  (void)dstContext;
  (void)srcContext;
  return dtod(dstDevice, srcDevice, ByteCount, hStream, true, true);
}

FC_API CUresult cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N) {
  FC_ENTER();
  return memset_n<unsigned char>(dstDevice, uc, N, nullptr, false);
}
FC_API CUresult cuMemsetD8_v2_ptds(CUdeviceptr dstDevice, unsigned char uc, size_t N) {
  FC_ENTER();
  return memset_n<unsigned char>(dstDevice, uc, N, nullptr, true);
}
FC_API CUresult cuMemsetD16_v2(CUdeviceptr dstDevice, unsigned short us, size_t N) {
  FC_ENTER();
  return memset_n<unsigned short>(dstDevice, us, N, nullptr, false);
}
FC_API CUresult cuMemsetD16_v2_ptds(CUdeviceptr dstDevice, unsigned short us, size_t N) {
  FC_ENTER();
  return memset_n<unsigned short>(dstDevice, us, N, nullptr, true);
}
FC_API CUresult cuMemsetD32_v2(CUdeviceptr dstDevice, unsigned int ui, size_t N) {
  FC_ENTER();
  return memset_n<unsigned int>(dstDevice, ui, N, nullptr, false);
}
FC_API CUresult cuMemsetD32_v2_ptds(CUdeviceptr dstDevice, unsigned int ui, size_t N) {
  FC_ENTER();
  return memset_n<unsigned int>(dstDevice, ui, N, nullptr, true);
}
FC_API CUresult cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream) {
  FC_ENTER();
  return memset_n<unsigned char>(dstDevice, uc, N, hStream, false);
}
FC_API CUresult cuMemsetD8Async_ptsz(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream) {
  FC_ENTER();
  return memset_n<unsigned char>(dstDevice, uc, N, hStream, true);
}
FC_API CUresult cuMemsetD16Async(CUdeviceptr dstDevice, unsigned short us, size_t N, CUstream hStream) {
  FC_ENTER();
  return memset_n<unsigned short>(dstDevice, us, N, hStream, false);
}
FC_API CUresult cuMemsetD16Async_ptsz(CUdeviceptr dstDevice, unsigned short us, size_t N, CUstream hStream) {
  FC_ENTER();
  return memset_n<unsigned short>(dstDevice, us, N, hStream, true);
}
FC_API CUresult cuMemsetD32Async(CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream) {
  FC_ENTER();
  return memset_n<unsigned int>(dstDevice, ui, N, hStream, false);
}
FC_API CUresult cuMemsetD32Async_ptsz(CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream) {
  FC_ENTER();
  return memset_n<unsigned int>(dstDevice, ui, N, hStream, true);
}

// ------------------------------------------------------------------ test extensions

// Like kernel launches, these wait at the checkpoint gate.
FC_API CUresult fakecuda_stream_delay(CUstream stream, unsigned ms) {
  FC_ENTER();
  Stream* s;
  if (CUresult rc = resolve_stream(stream, false, &s)) return rc;
  CUresult err;
  stream_enqueue(s, [ms] { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }, &err);
  return err;
}

FC_API void fakecuda_inline_gate(int closed) {
  std::lock_guard lk(g_gate_mu);
  g_gate_closed = closed != 0;
  g_gate_cv.notify_all();
}

FC_API int fakecuda_inline_gate_waiting(unsigned timeout_ms) {
  std::unique_lock lk(g_gate_mu);
  g_gate_cv.wait_for(lk, std::chrono::milliseconds(timeout_ms), [] { return g_gate_waiting > 0; });
  return g_gate_waiting;
}

FC_API CUresult fakecuda_stream_fill_async(CUstream stream, CUdeviceptr dptr, unsigned char value, size_t bytes,
                                           unsigned delay_ms) {
  FC_ENTER();
  Stream* s;
  if (CUresult rc = resolve_stream(stream, false, &s)) return rc;
  if (bytes && !is_device_range(dptr, bytes)) return CUDA_ERROR_INVALID_VALUE;
  CUresult err;
  stream_enqueue(
      s,
      [dptr, value, bytes, delay_ms] {
        std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
        std::memset(reinterpret_cast<void*>(dptr), value, bytes);
      },
      &err);
  return err;
}

// cuwarden interposer: a pool's stream fence (fence.hpp): recording, polling and waiting for
// the events of sealed batches and of destroyed streams.
#include "backends/pool/fence.hpp"

#include <algorithm>

#include "backends/driver_calls.hpp"

namespace cuw::backends::pool {

CUevent stream_events::event() {
  if (!spare_events_.empty()) {
    CUevent e = spare_events_.back();
    spare_events_.pop_back();
    return e;
  }
  CUevent e = nullptr;
  if (!drv().event_create || drv().event_create(&e, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) return nullptr;
  return e;
}

bool stream_events::record(seal_mark* out) {
  // Read the work counters (read-modify-writes: each synchronizes with every count before
  // it) before recording: all work counted so far precedes the events.
  out->epoch = work::epoch_for_seal();
  bool ok = drv().event_record != nullptr;
  {
    CtxScope scope(ctx_);
    // The legacy stream's event follows all earlier work of every blocking stream; each
    // non-blocking stream needs its own.
    for (size_t i = 0; ok && i <= streams_.size(); ++i) {
      CUevent e = event();
      CUstream s = i == 0 ? CU_STREAM_LEGACY : streams_[i - 1];
      if (!e || drv().event_record(e, s) != CUDA_SUCCESS) {
        if (e) spare_events_.push_back(e);
        ok = false;
        break;
      }
      out->events.push_back(e);
    }
  }
  if (!ok) {
    for (CUevent e : out->events) spare_events_.push_back(e);
    out->events.clear();
  }
  return ok;
}

bool stream_events::done(seal_mark& m, bool wait) {
  // A stream was destroyed when its work could not be marked with an event (during a
  // capture): only a synchronization of the whole context says that work has finished.
  // Only a wait does that (a poll must not block), and never during a capture; a failed
  // synchronization means a broken context, where, as for events, only a wait decides.
  if (__builtin_expect(unsure_, 0)) {
    if (!wait || work::capturing()) return false;
    if (drv().ctx_sync) drv().ctx_sync();
    unsure_ = false;
  }
  // Events of destroyed streams first: every batch waits for them.
  while (!orphans_.empty()) {
    CUevent e = orphans_.back();
    const CUresult r = wait ? drv().event_sync(e) : drv().event_query(e);
    if (r == CUDA_ERROR_NOT_READY) return false;
    if (!wait && r != CUDA_SUCCESS) return false;
    orphans_.pop_back();
    spare_events_.push_back(e);
  }
  while (!m.events.empty()) {
    CUevent e = m.events.back();
    const CUresult r = wait ? drv().event_sync(e) : drv().event_query(e);
    if (r == CUDA_ERROR_NOT_READY) return false;
    if (!wait && r != CUDA_SUCCESS) return false;  // a broken context: only a wait decides
    m.events.pop_back();
    spare_events_.push_back(e);
  }
  return true;
}

void stream_events::order_after_legacy(CUstream s) {
  CtxScope scope(ctx_);
  CUevent e = event();
  const bool ok = e && drv().event_record && drv().stream_wait_event &&
                  drv().event_record(e, CU_STREAM_LEGACY) == CUDA_SUCCESS && drv().stream_wait_event(s, e, 0) == CUDA_SUCCESS;
  // (A recorded event may be recorded again: the wait is for this record.)
  if (e) spare_events_.push_back(e);
  if (!ok) drain_legacy(ctx_);
}

void drain_legacy(CUcontext ctx) {
  CtxScope scope(ctx);
  if (!drv().stream_sync || drv().stream_sync(CU_STREAM_LEGACY) != CUDA_SUCCESS)
    if (drv().ctx_sync) drv().ctx_sync();
}

bool stream_events::remove_stream(CUstream s) noexcept {
  auto it = std::find(streams_.begin(), streams_.end(), s);
  if (it == streams_.end()) return false;
  streams_.erase(it);
  return true;
}

void stream_events::orphan(CUstream s) {
  // Work queued on it may still use blocks freed later: later batches wait for this event.
  // While a capture is active nothing may be recorded (nor the stream synchronized): the
  // next batch to complete synchronizes the context first instead (done).
  if (work::capturing()) {
    unsure_ = true;
    return;
  }
  CtxScope scope(ctx_);
  CUevent e = event();
  if (e && drv().event_record(e, s) == CUDA_SUCCESS) {
    orphans_.push_back(e);
    return;
  }
  if (e) spare_events_.push_back(e);
  if (!drv().stream_sync || drv().stream_sync(s) != CUDA_SUCCESS) unsure_ = true;
}

void stream_events::forget() noexcept {
  spare_events_.clear();
  orphans_.clear();
  unsure_ = false;
  streams_.clear();
}

}  // namespace cuw::backends::pool

// cuwarden interposer: the `cache` backend's event batches (cache_resource.hpp: cudaFree's
// promise). Freed blocks wait in an open batch; a seal records one event per stream behind
// it; a sealed batch's blocks go back to the free lists once its events have completed.
// Streams destroyed with work still queued leave an event every later batch waits for.
#include "backends/cache/cache_resource.hpp"

#include <algorithm>
#include <vector>

#include "backends/cache/detail/internal.hpp"
#include "base/work_epoch.hpp"
#include "cuw/attrs.hpp"

namespace cuw::backends {

using namespace cache_detail;  // this folder's own helpers

// ---- batches (under slow_) -----------------------------------------------------------------

CUevent cache_resource::event_slow() {
  if (!spare_events_.empty()) {
    CUevent e = spare_events_.back();
    spare_events_.pop_back();
    return e;
  }
  CUevent e = nullptr;
  if (!drv().event_create || drv().event_create(&e, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) return nullptr;
  return e;
}

void cache_resource::seal_locked_slow() {
  Batch bt;
  mu_.lock();
  bt.head = open_head_;
  bt.bytes = open_bytes_;
  open_head_ = nullptr;
  open_count_ = 0;
  open_bytes_ = 0;
  mu_.unlock();
  if (!bt.head) return;
  // Read the work counter (a read-modify-write: it synchronizes with every count before it)
  // before recording: all work counted so far precedes the events.
  bt.epoch = work::epoch_for_seal();
  bool ok = drv().event_record != nullptr;
  {
    CtxScope scope(ctx_);
    // The legacy stream's event follows all earlier work of every blocking stream; each
    // non-blocking stream needs its own.
    for (size_t i = 0; ok && i <= streams_.size(); ++i) {
      CUevent e = event_slow();
      CUstream s = i == 0 ? CU_STREAM_LEGACY : streams_[i - 1];
      if (!e || drv().event_record(e, s) != CUDA_SUCCESS) {
        if (e) spare_events_.push_back(e);
        ok = false;
        break;
      }
      bt.events.push_back(e);
    }
  }
  if (!ok) {
    // Nothing proves these blocks unused: put them back into the open batch, so that a
    // later seal (or the release after a device synchronization) decides.
    for (CUevent e : bt.events) spare_events_.push_back(e);
    mu_.lock();
    Block* tail = bt.head;
    uint32_t n = 1;
    while (tail->next) tail = tail->next, ++n;
    tail->next = open_head_;
    open_head_ = bt.head;
    open_count_ += n;
    open_bytes_ += bt.bytes;
    mu_.unlock();
    return;
  }
  batches_.push_back(std::move(bt));
  sealed_.store(static_cast<uint32_t>(batches_.size()), std::memory_order_relaxed);
}

bool cache_resource::batch_done(Batch& bt, bool wait) {
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
  while (!bt.events.empty()) {
    CUevent e = bt.events.back();
    const CUresult r = wait ? drv().event_sync(e) : drv().event_query(e);
    if (r == CUDA_ERROR_NOT_READY) return false;
    if (!wait && r != CUDA_SUCCESS) return false;  // a broken context: only a wait decides
    bt.events.pop_back();
    spare_events_.push_back(e);
  }
  return true;
}

void cache_resource::retire_front() {
  Batch& bt = batches_.front();
  mu_.lock();
  for (Block* b = bt.head; b;) {
    Block* next = b->next;
    --b->seg->busy;
    push_free_locked(b);
    b = next;
  }
  core::locked_sub(pending_bytes_, bt.bytes);
  mu_.unlock();
  const uint64_t epoch = bt.epoch;
  batches_.pop_front();
  sealed_.store(static_cast<uint32_t>(batches_.size()), std::memory_order_relaxed);
  if (epoch > idle_epoch_.load(std::memory_order_relaxed)) {
    idle_epoch_.store(epoch, std::memory_order_release);
    retire_open_if_idle();
  }
}

void cache_resource::retire_open_if_idle() {
  mu_.lock();
  if (!open_head_ || !idle()) {
    mu_.unlock();
    return;
  }
  // Freed after the proving seal read the counter, which has not moved since: nothing used
  // these blocks after their free, and everything before has finished.
  for (Block* b = open_head_; b;) {
    Block* next = b->next;
    --b->seg->busy;
    push_free_locked(b);
    b = next;
  }
  core::locked_sub(pending_bytes_, open_bytes_);
  open_head_ = nullptr;
  open_count_ = 0;
  open_bytes_ = 0;
  mu_.unlock();
}

bool cache_resource::poll_slow() {
  bool any = false;
  if (!batches_.empty()) {
    CtxScope scope(ctx_);
    while (!batches_.empty() && batch_done(batches_.front(), false)) {
      retire_front();
      any = true;
    }
  }
  return any;
}

bool cache_resource::wait_oldest_slow() {
  if (batches_.empty()) return false;
  bool done;
  {
    CtxScope scope(ctx_);
    done = batch_done(batches_.front(), true);
  }
  if (!done) return false;  // a capture began: nothing may be waited for now
  retire_front();
  mu_.lock();
  core::locked_add(slot_.pool_waits, 1);
  mu_.unlock();
  return true;
}

void cache_resource::wait_all_slow() {
  if (work::capturing()) return;
  seal_locked_slow();
  while (wait_oldest_slow()) {
  }
}

// ---- streams ---------------------------------------------------------------------------------

void cache_resource::add_stream(CUstream s) {
  std::lock_guard<std::mutex> g(slow_);
  streams_.push_back(s);
}

bool cache_resource::remove_stream(CUstream s) {
  std::lock_guard<std::mutex> g(slow_);
  auto it = std::find(streams_.begin(), streams_.end(), s);
  if (it == streams_.end()) return false;
  streams_.erase(it);
  orphan_slow(s);
  return true;
}

void cache_resource::orphan_stream(CUstream s) {
  std::lock_guard<std::mutex> g(slow_);
  orphan_slow(s);
}

void cache_resource::orphan_slow(CUstream s) {
  // Work queued on it may still use blocks freed later: later batches wait for this event.
  // While a capture is active nothing may be recorded (nor the stream synchronized): the
  // next batch to complete synchronizes the context first instead (batch_done).
  if (dead_ || dying_) return;
  if (work::capturing()) {
    unsure_ = true;
    return;
  }
  CtxScope scope(ctx_);
  CUevent e = event_slow();
  if (e && drv().event_record(e, s) == CUDA_SUCCESS) {
    orphans_.push_back(e);
    return;
  }
  if (e) spare_events_.push_back(e);
  if (!drv().stream_sync || drv().stream_sync(s) != CUDA_SUCCESS) unsure_ = true;
}

}  // namespace cuw::backends

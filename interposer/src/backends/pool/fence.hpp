// cuwarden interposer: a pool's stream fence, which keeps cudaFree's promise: a freed block is
// not handed out again until all work submitted before the free has finished, on every stream
// of the context.
//
// The fast case: no work queued since a completed event. Every entry point that queues GPU
// work (launches, copies, memsets, graph launches, stream memory operations ...; the
// generated work_hooks.inc) bumps one process-wide work counter after the driver accepted
// the work (a locked add: its release joins the counter's release sequence). A seal reads
// the counter with a read-modify-write before recording its events, so every piece of work
// counted before that read was queued before the events. When a seal's events have completed
// and the counter still reads what the seal read, nothing was queued since and everything
// queued before has finished: idle() is true, and a block freed now goes straight back to its
// free list (no event, no query). One counter for the process also covers work of other
// contexts on this memory (peer access). A work-queuing entry point handed out by the driver
// that the table does not hook (an older ABI variant, or a newer driver's new entry point)
// turns the fast case off for the process.
//
// Otherwise frees wait in batches: a batch is sealed by recording one event on the legacy
// default stream (it runs after all earlier work of every blocking stream, per-thread default
// streams included) and one on every non-blocking stream of the context (add_stream); a
// destroyed one leaves an event that every later batch also waits for (orphan). A sealed
// batch's blocks become reusable when its events have completed (done: polled, or waited for).
// While any stream capture is active in the process nothing is recorded, queried or waited for.
#pragma once

#include <cuda.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <vector>

#include "base/work_epoch.hpp"
#include "cuw/attrs.hpp"

namespace cuw::backends::pool {

/// The events, streams and orphans of one context. Thread-safety: idle() from any thread
/// without a lock; everything else under the pool's slow-path mutex.
class stream_events {
 public:
  /// A sealed batch's marks: the work counter as its seal read it, and its events.
  struct seal_mark {
    uint64_t epoch = 0;
    std::vector<CUevent> events;
  };

  explicit stream_events(CUcontext ctx) noexcept : ctx_(ctx) {}

  /// Nothing queued since a seal whose events were seen complete (see the top).
  CUW_HOT bool idle() const noexcept {
    if (work::untracked()) return false;
    const uint64_t now = work::epoch();
    return idle_epoch_.load(std::memory_order_acquire) == now;
  }

  /// Reads the work counter, then records an event on the legacy stream and on every
  /// non-blocking stream (in the context). False when one could not be recorded: nothing
  /// proves the batch's blocks unused, and its events went back to the spares.
  bool record(seal_mark* out);
  /// Whether `m`'s events (and every destroyed stream's) have completed: polled, or waited
  /// for (`wait`), where false then only means a capture is active and the context must be
  /// synchronized first. A failed wait counts as done (a broken context). The caller holds
  /// the context current (CtxScope).
  bool done(seal_mark& m, bool wait);
  /// A batch sealed at `epoch` completed: true when that advanced the idle proof (the pool
  /// then retires its open batch if idle()).
  bool proved(uint64_t epoch) noexcept {
    if (epoch <= idle_epoch_.load(std::memory_order_relaxed)) return false;
    idle_epoch_.store(epoch, std::memory_order_release);
    return true;
  }

  /// A non-blocking stream of the context: later seals record on it too.
  void add_stream(CUstream s) { streams_.push_back(s); }
  /// Stops recording on `s`; true if it was one of the context's non-blocking streams.
  bool remove_stream(CUstream s) noexcept;
  /// `s` is about to be destroyed: records an event on it that every later batch waits for
  /// (during a capture, or when that fails, the next wait synchronizes the context first).
  void orphan(CUstream s);
  /// The context is gone: its events went with it.
  void forget() noexcept;

 private:
  CUevent event();

  CUcontext ctx_;
  /// The work counter's value read by the newest seal whose events were seen complete
  /// (written under the slow path's mutex; 0 = none yet). Idle iff the counter still reads this.
  std::atomic<uint64_t> idle_epoch_{0};
  std::vector<CUevent> spare_events_;
  std::vector<CUstream> streams_;  ///< non-blocking streams of the context
  std::vector<CUevent> orphans_;   ///< last events of destroyed streams
  bool unsure_ = false;            ///< a destroyed stream left no event: synchronize first
};

/// The stream fence of a pool of `Block`s (anything with a `next` link): stream_events plus
/// the sealed batches of freed blocks, oldest first. Thread-safety as stream_events; sealed()
/// from any thread.
template <class Block>
class fence : public stream_events {
 public:
  struct batch {
    Block* head = nullptr;
    uint64_t bytes = 0;
    seal_mark mark;
  };

  using stream_events::stream_events;

  /// Seals the blocks from `head` (`bytes` of them) behind events. False: nothing recorded,
  /// the caller keeps them (a later seal decides).
  bool seal(Block* head, uint64_t bytes) {
    batch bt;
    bt.head = head;
    bt.bytes = bytes;
    if (!record(&bt.mark)) return false;
    batches_.push_back(std::move(bt));
    sealed_.store(static_cast<uint32_t>(batches_.size()), std::memory_order_relaxed);
    return true;
  }
  bool empty() const noexcept { return batches_.empty(); }
  /// Sealed batches, readable without the mutex (a hint).
  uint32_t sealed() const noexcept { return sealed_.load(std::memory_order_relaxed); }
  batch& front() noexcept { return batches_.front(); }
  /// Drops the oldest batch (its blocks retired); true when it advanced the idle proof.
  bool pop_front() noexcept {
    const uint64_t epoch = batches_.front().mark.epoch;
    batches_.pop_front();
    sealed_.store(static_cast<uint32_t>(batches_.size()), std::memory_order_relaxed);
    return proved(epoch);
  }
  /// Calls f(Block*) for each block waiting in a sealed batch until f returns true; whether it did.
  template <class F>
  bool any_block(F&& f) const {
    for (const batch& bt : batches_)
      for (Block* b = bt.head; b; b = b->next)
        if (f(b)) return true;
    return false;
  }
  /// The context is gone: every batch and event with it.
  void forget_batches() noexcept {
    batches_.clear();
    batches_.shrink_to_fit();
    sealed_.store(0, std::memory_order_relaxed);
    forget();
  }

 private:
  std::deque<batch> batches_;
  std::atomic<uint32_t> sealed_{0};  ///< batches_.size(), readable without the mutex
};

}  // namespace cuw::backends::pool

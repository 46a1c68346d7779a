// cuwarden interposer: a pool's stream fence, which keeps cudaFree's promise: a freed block is
// not handed out again until all work submitted before the free has finished, on every stream
// of the context, or is ordered before all work its next owner can queue.
//
// The counters: every entry point that queues GPU work (launches, copies, memsets, graph
// launches, stream memory operations ...; the generated work_hooks.inc) bumps one of two
// process-wide counters after the driver accepted the work (a locked add: its release joins
// the counter's release sequence): the legacy counter for work on a legacy default stream
// (handle 0 or CU_STREAM_LEGACY, stream-less synchronous calls; not the per-thread variants'
// 0), the other counter for everything else (base/work_epoch.hpp). A seal reads both with a
// read-modify-write before recording its events, so every piece of work counted before those
// reads was queued before the events. When a seal's events have completed, the work counted
// before its reads has finished: the seal's marks are a proof (proved()). A work-queuing
// entry point handed out by the driver that the table does not hook (an older ABI variant,
// or a newer driver's new entry point) turns both cases below off for the process.
//
// The fast case (idle()): both counters still read a proof's marks. Nothing was queued since
// and everything queued before has finished: a block freed now goes straight back to its free
// list (no event, no query). One counter pair for the process also covers work of other
// contexts on this memory (peer access) queued after the proof.
//
// Stream order (ordered(), PyTorch's rule): the other counter still reads a proof's mark, so
// since the proof every piece of work in the process went to a legacy stream; the pool's
// context C has no non-blocking stream; the process has no other pool and no peer access
// (the pool's `unordered_`); no capture is active. Then a block freed now goes straight back
// to its free list although work that used it may still be queued. Why that keeps the promise:
//   - the old owner's work W was queued before the free (the program's promise to cudaFree),
//     so it was counted before the free read the other counter. W counted on the other
//     counter was counted before the proof's mark and has finished. W counted on the legacy
//     counter went to a legacy stream, of a context that reaches C's memory: only C itself
//     does (a context reaches another's memory through peer access, and the process has
//     none, nor another pool), so W is on C's legacy stream, pending or not. (A copy that a
//     context with no pool queues on its own legacy stream is not seen as such: docs/cache.md
//     names it.)
//   - the next owner's work W' is queued after the hand-out. On C's legacy stream, on a
//     blocking stream of C or on a per-thread default stream of C, it runs after all work
//     queued before it on C's legacy stream (the legacy stream's implicit synchronization):
//     after W. Only a non-blocking stream of C, or another context, can run W' unordered.
//   - the pool counts the blocks it hands out this way (`taints_`, under its lock) and how
//     many of them are settled (`settled_`): it is tainted while they differ, until it next
//     waits for C's legacy stream (drain_legacy) or sees complete the events of a settle mark
//     recorded after the hand-outs it counted. Whatever makes such W' possible first turns
//     the shortcut off under the same lock, then, if tainted, orders the new agent after C's
//     legacy stream: each non-blocking stream created in C meanwhile waits for an event
//     recorded on C's legacy stream (cuStreamWaitEvent: all of its work runs after W; the
//     taint stays, for the next stream); peer access or a second pool waits for C's legacy
//     stream (drain_legacy, which settles the taint). Lock order makes W (queued before a
//     free that took the shortcut, before the lock was taken again) precede that event or
//     wait. Exporting a block to another process (an IPC handle) waits for C's legacy stream
//     first while tainted.
//   - giving memory back to the driver (release, reclaim, trim: neither a free nor an unmap
//     waits for the GPU) while tainted: the memory is first taken out of reach under the lock
//     (no longer free, not carvable: `leaving`, or a claimed hole), so every W on it was
//     queued before; then a settle mark records events on C's legacy stream and its
//     non-blocking streams (record(): all W precede them) and the memory goes back only once
//     they have completed: polled at once and where the pool polls or grows, never waited
//     for unless a refusal (or vmm's stitching, which needs the granules now) needs it. Until
//     then it stays in the pool's segments, counted reserved and charged. A vmm reclaim
//     settles before it picks the free blocks to unmap, and stops picking once a block was
//     handed out by stream order since (its W may follow the mark). During a capture nothing
//     is recorded and nothing goes back.
//   - captures: a capture's begin is counted before the driver's call (no shortcut from then
//     on) and, where a pool is tainted, waits for its legacy stream before the capture exists
//     (the drain is not allowed during one), so no shortcut block has pending work while any
//     capture is active: a stream or context made during the capture finds nothing to order.
//     A graph's work W' runs when the graph is launched, on the launch's stream: as above.
//   - work after the first non-legacy work: the other counter moves, the shortcut is off for
//     blocks freed from then on until a later proof; blocks handed out before stay safe by
//     the cases above (a blocking stream's W' runs after W; non-blocking streams and other
//     contexts were ordered when they appeared).
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
  /// A sealed batch's marks: the work counters as its seal read them, and its events.
  struct seal_mark {
    work::marks epoch;
    std::vector<CUevent> events;
  };

  /// The pool is made before any of its blocks exists: no work counted before can use one,
  /// so the other counter now is a proof of stream order (see the top).
  explicit stream_events(CUcontext ctx) noexcept : ctx_(ctx), ordered_epoch_(work::epoch_for_seal().other) {}

  /// Nothing queued since a seal whose events were seen complete (see the top).
  CUW_HOT bool idle() const noexcept {
    if (work::untracked()) return false;
    const uint64_t now = work::epoch(), other = work::other_epoch();
    return idle_epoch_.load(std::memory_order_acquire) == now &&
           ordered_epoch_.load(std::memory_order_acquire) == other;
  }
  /// All work since a proof went to a legacy stream, and no capture is active (see the top:
  /// the pool adds what it knows of its context's streams, peers and taint).
  CUW_HOT bool ordered() const noexcept {
    if (work::untracked() || work::capturing()) return false;
    return ordered_epoch_.load(std::memory_order_acquire) == work::other_epoch();
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
  /// A batch sealed at `epoch` completed: true when that advanced the proof (the pool then
  /// retires its open batch if idle()). Each mark only grows, and any mix of two completed
  /// proofs' marks is a proof: a reader that sees one mark updated and not the other is right.
  bool proved(const work::marks& epoch) noexcept {
    bool advanced = false;
    if (epoch.legacy > idle_epoch_.load(std::memory_order_relaxed)) {
      idle_epoch_.store(epoch.legacy, std::memory_order_release);
      advanced = true;
    }
    if (epoch.other > ordered_epoch_.load(std::memory_order_relaxed)) {
      ordered_epoch_.store(epoch.other, std::memory_order_release);
      advanced = true;
    }
    return advanced;
  }
  /// Makes `s` (a stream of the context, just made) wait for an event recorded on the legacy
  /// stream now: all its work runs after the legacy stream's work queued so far. Falls back to
  /// drain_legacy() when that cannot be recorded. Not during a capture.
  void order_after_legacy(CUstream s);

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
  /// The legacy counter's value read by the newest seal whose events were seen complete
  /// (written under the slow path's mutex; 0 = none yet). Idle iff the counter still reads this
  /// and the other counter ordered_epoch_.
  std::atomic<uint64_t> idle_epoch_{0};
  /// The other counter's value read by that seal (or at the pool's making): stream order
  /// holds while the other counter reads this.
  std::atomic<uint64_t> ordered_epoch_;
  std::vector<CUevent> spare_events_;
  std::vector<CUstream> streams_;  ///< non-blocking streams of the context
  std::vector<CUevent> orphans_;   ///< last events of destroyed streams
  bool unsure_ = false;            ///< a destroyed stream left no event: synchronize first
};

/// Waits for the legacy stream of `ctx` (a live context): its work queued so far has finished
/// (cuStreamSynchronize; failing that, the context's synchronization). Not during a capture.
/// Needs no lock: no fence state.
void drain_legacy(CUcontext ctx);

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
    const work::marks epoch = batches_.front().mark.epoch;
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

// cuwarden interposer: a pool's batches of freed blocks (pool.hpp:
// cudaFree's promise). Freed blocks wait in an open batch; a seal puts them behind the
// fence's events (backends/pool/fence.hpp); a sealed batch's blocks go back to the free lists
// once its events have completed. Included by pool_impl.hpp.
#pragma once

#include "backends/pool/pool.hpp"

#include "backends/pool/tuning.hpp"
#include "base/work_epoch.hpp"
#include "cuw/attrs.hpp"

namespace cuw::backends::pool {

using namespace tuning;  // the pool's tuning and size classes

// ---- batches (under slow_) -----------------------------------------------------------------

template <class Layout>
void pool<Layout>::seal_locked_slow() {
  mu_.lock();
  Block* head = open_head_;
  const uint64_t bytes = open_bytes_;
  open_head_ = nullptr;
  open_count_ = 0;
  open_bytes_ = 0;
  mu_.unlock();
  if (!head || fence_.seal(head, bytes)) return;
  // Nothing proves these blocks unused: put them back into the open batch, so that a
  // later seal (or the release after a device synchronization) decides.
  mu_.lock();
  Block* tail = head;
  uint32_t n = 1;
  while (tail->next) tail = tail->next, ++n;
  tail->next = open_head_;
  open_head_ = head;
  open_count_ += n;
  open_bytes_ += bytes;
  mu_.unlock();
}

template <class Layout>
void pool<Layout>::retire_front() {
  auto& bt = fence_.front();
  mu_.lock();
  for (Block* b = bt.head; b;) {
    Block* next = b->next;
    --b->seg->busy;
    push_free_locked(b);
    b = next;
  }
  pending_bytes_.store(pending_bytes_.load(std::memory_order_relaxed) - bt.bytes, std::memory_order_relaxed);
  mu_.unlock();
  if (fence_.pop_front()) retire_open_if_idle();
}

template <class Layout>
void pool<Layout>::retire_open_if_idle() {
  mu_.lock();
  if (!open_head_ || !fence_.idle()) {
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
  pending_bytes_.store(pending_bytes_.load(std::memory_order_relaxed) - open_bytes_, std::memory_order_relaxed);
  open_head_ = nullptr;
  open_count_ = 0;
  open_bytes_ = 0;
  mu_.unlock();
}

template <class Layout>
bool pool<Layout>::poll_slow() {
  give_pending_slow(false);  // memory whose give-back waited for its events
  bool any = false;
  if (!fence_.empty()) {
    CtxScope scope(ctx_);
    while (!fence_.empty() && fence_.done(fence_.front().mark, false)) {
      retire_front();
      any = true;
    }
  }
  return any;
}

template <class Layout>
bool pool<Layout>::wait_oldest_slow() {
  if (fence_.empty()) return false;
  bool done;
  {
    CtxScope scope(ctx_);
    done = fence_.done(fence_.front().mark, true);
  }
  if (!done) return false;  // a capture began: nothing may be waited for now
  retire_front();
  mu_.lock();
  ledger_.waited();
  mu_.unlock();
  return true;
}

template <class Layout>
void pool<Layout>::wait_all_slow() {
  if (work::capturing()) return;
  seal_locked_slow();
  while (wait_oldest_slow()) {
  }
}

// ---- streams ---------------------------------------------------------------------------------

template <class Layout>
void pool<Layout>::add_stream(CUstream s) {
  std::lock_guard<std::mutex> g(slow_);
  fence_.add_stream(s);
  mu_.lock();
  ++unordered_;  // before the taint is read: no block is handed out by stream order after it
  // Read, not taken: the wait orders this stream only, and every non-blocking stream made
  // until a drain needs its own.
  const bool tainted = tainted_locked();
  mu_.unlock();
  // (Never during a capture: its begin drained the taint, and nothing taints during one.)
  if (tainted && !dead_ && !dying_ && !work::capturing()) fence_.order_after_legacy(s);
}

template <class Layout>
bool pool<Layout>::remove_stream(CUstream s) {
  std::lock_guard<std::mutex> g(slow_);
  if (!fence_.remove_stream(s)) return false;
  mu_.lock();
  --unordered_;
  mu_.unlock();
  orphan_slow(s);
  return true;
}

template <class Layout>
bool pool<Layout>::take_taint() noexcept {
  const bool t = tainted_locked();
  settled_ = taints_;
  return t;
}

// (unorder and capture_beginning: under the backend's lock, so the context is neither dying
// nor gone; not under slow_, which another thread may hold across a driver call.)
template <class Layout>
void pool<Layout>::unorder() {
  mu_.lock();
  unordered_ |= kUnorderedForGood;
  const bool tainted = take_taint();
  mu_.unlock();
  if (tainted && !work::capturing()) drain_legacy(ctx_);
}

template <class Layout>
void pool<Layout>::capture_beginning() {
  mu_.lock();
  const bool tainted = take_taint();
  mu_.unlock();
  // (The capture is counted already, but not begun: the drain is still allowed.)
  if (tainted) drain_legacy(ctx_);
}

template <class Layout>
bool pool<Layout>::settle_slow(giving* g, bool wait) {
  if (work::capturing()) return false;  // nothing recorded, queried or waited for
  mu_.lock();
  const uint64_t taints = taints_;  // (hand-outs counted here were queued after their old owners' work)
  const bool tainted = tainted_locked();
  mu_.unlock();
  g->taints = taints;
  if (!tainted) return true;
  // Events recorded after the memory was made unreachable: its old owners' work precedes them
  // (fence.hpp). A poll, not a wait (a synchronizing call would stop the program from running
  // ahead of the GPU), unless a refusal needs the memory now.
  if (!fence_.record(&g->mark)) {
    // Nothing recorded: wait for the legacy stream, as a drain does.
    mu_.lock();
    take_taint();
    mu_.unlock();
    drain_legacy(ctx_);
    return true;
  }
  bool done;
  {
    CtxScope scope(ctx_);
    done = fence_.done(g->mark, false) || (wait && fence_.done(g->mark, true));
  }
  if (!done) return false;
  mu_.lock();
  if (taints > settled_) settled_ = taints;
  mu_.unlock();
  return true;
}

template <class Layout>
uint64_t pool<Layout>::give_pending_slow(bool wait) {
  if (giving_.empty() || work::capturing() || dying_ || dead_) return 0;
  uint64_t total = 0;
  // Oldest first: a later mark's events were recorded after an earlier one's.
  size_t n = 0;
  {
    CtxScope scope(ctx_);
    while (n < giving_.size() && fence_.done(giving_[n].mark, wait)) ++n;
  }
  for (size_t i = 0; i < n; ++i) {
    mu_.lock();
    if (giving_[i].taints > settled_) settled_ = giving_[i].taints;
    mu_.unlock();
    for (Segment* s : giving_[i].segs) giving_bytes_ -= s->bytes;
    total += give_back_slow(giving_[i].segs);
  }
  giving_.erase(giving_.begin(), giving_.begin() + static_cast<std::ptrdiff_t>(n));
  return total;
}

template <class Layout>
void pool<Layout>::orphan_stream(CUstream s) {
  std::lock_guard<std::mutex> g(slow_);
  orphan_slow(s);
}

template <class Layout>
void pool<Layout>::orphan_slow(CUstream s) {
  if (dead_ || dying_) return;  // the context's memory is going: no driver call on it
  fence_.orphan(s);
}

}  // namespace cuw::backends::pool

// cuwarden interposer: the pool of one CUDA context, generic over its layout (the backend's
// layouts: backends/README.md; pool/pooled_backend.hpp finds the pool of the calling thread).
// The design:
//
// Layout of what it keeps:
//   small requests (<= 1 MiB) are rounded to one of 40 size classes (512 B steps up to
//   2 KiB, then four classes per power of two) and carved from 2 MiB slabs, one class per
//   slab: a freed block is reused whole by the next request of its class, no coalescing
//   needed; a slab goes back to the driver when none of its blocks is in use.
//   large requests (> 1 MiB) are rounded to 2 MiB and kept whole, one driver allocation
//   each; a freed one serves the smallest request it fits with at most 1/8 (or 2 MiB) to
//   spare (best fit). No splitting: a driver allocation is one block, so IPC handles and
//   range queries stay exact. That is the layout of whole blocks; a layout may instead
//   keep large blocks in a split segment (Segment::split: blocks split to a request and
//   merged with their free neighbours, stretches given back as holes), and says how large
//   requests round, what it maps at once, how it grows and how it gives memory back.
//
// cudaFree's promise: a freed block is not handed out again until all work submitted before
// the free has finished, on every stream of the context, or is ordered before all work its
// next owner can queue (backends/pool/fence.hpp: the fast case, where the device is proven
// idle and a freed block goes straight back to its free list, as does the open batch; stream
// order, where all work since a proof went to the context's legacy stream, the context has
// no non-blocking stream, no other context can reach its memory and no capture is active,
// and a freed block goes straight back too: whatever its next owner queues on a blocking
// stream runs after the legacy stream's earlier work; event batches otherwise).
//
// Frees are collected in an open batch, sealed behind events (the fence); a sealed batch's
// blocks become reusable when its events have completed (cuEventQuery, polled oldest first
// when an allocation misses). Only when no freed block is ready, and growing is not the
// better answer (the bytes waiting for the GPU, with this request, would pass 64 MiB),
// does an allocation wait for
// the oldest batch (cuEventSynchronize): never longer than the device synchronization
// that cudaFree itself would have done, earlier. While any stream capture is active in
// the process nothing is recorded, queried or waited for: frees stay in the open batch, and
// no allocation reaches the pool: each gets exactly the driver's answer (the backend passes
// it to cuMemAlloc: CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED in a global-mode capture). A pooled
// block would let the capture succeed and the graph write it later, after its free.
//
// Caps: all memory the pool takes from its upstream is charged (Tracker::charge) and what it
// gives back is uncharged, so cached bytes count against the cap. Memory on its way back
// (after blocks were handed out by stream order it waits for events recorded on the legacy
// stream, fence.hpp) stays charged until the upstream has it; the budget leaves it out.
// Before an allocation is refused, the pool waits for its pending frees and for that
// memory, gives its free memory back, then charges again; a refusal is for real need only.
//
// No hoarding: before it takes more from its upstream, a pool whose memory would pass its
// budget gives back free memory first; an idle pool's next free trims it to its budget
// (backends/pool/budget.hpp).
#pragma once

#include <cuda.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "backends/memory_resource.hpp"
#include "backends/pool/block_map.hpp"
#include "backends/pool/budget.hpp"
#include "backends/pool/fence.hpp"
#include "backends/pool/free_lists.hpp"
#include "base/spin_lock.hpp"
#include "core/ledger.hpp"
#include "cuw/ring.hpp"
#include "cuw/size.hpp"

namespace cuw::core {
class Tracker;
}

namespace cuw::backends::pool {

// ---- sizes ---------------------------------------------------------------------------------
// Sizes as every pool rounds them (exposed for tests and benchmarks).
inline constexpr uint64_t kSmallMax = 1ULL << 20;    ///< largest request packed into slabs
inline constexpr uint64_t kSlabBytes = 2ULL << 20;   ///< slab size, bytes (at least)
inline constexpr uint64_t kLargeRound = 2ULL << 20;  ///< large requests round to this (whole blocks)
inline constexpr int kClasses = 40;

/// Size class of a small request (1..kSmallMax bytes): index and rounded size.
CUW_HOT inline int small_class(uint64_t n, uint64_t* rounded) noexcept {
  if (n <= 2048) {
    const uint64_t r = n == 0 ? 512 : (n + 511) & ~uint64_t{511};
    *rounded = r;
    return static_cast<int>(r >> 9) - 1;
  }
  const int k = 63 - __builtin_clzll(n - 1);  // 2^k < n <= 2^(k+1), k >= 11
  const uint64_t step = 1ULL << (k - 2);
  const uint64_t r = (n + step - 1) & ~(step - 1);
  *rounded = r;
  return 4 + (k - 11) * 4 + static_cast<int>(r >> (k - 2)) - 5;
}

// ---- blocks and segments -------------------------------------------------------------------

struct Segment;
/// A block a pool hands out, keeps free or waits on (under the pool's lock).
struct Block {
  CUdeviceptr ptr = 0;
  uint64_t size = 0;       ///< bytes of the block
  uint64_t requested = 0;  ///< the program's request while live
  Segment* seg = nullptr;
  Block* prev = nullptr;   ///< free list or batch list
  Block* next = nullptr;
  Block* lo = nullptr;     ///< address neighbours in a split segment
  Block* hi = nullptr;
  uint8_t state = 0;       ///< kFree, kLive, kPending, kHole, kClaimed
  bool exported = false;   ///< an IPC handle was handed out for it
  uint32_t generation = 0; ///< the pool's hand-out count when it was handed out: an exported
                           ///< block is still the one exported
};
/// What a pool took from its upstream at once: a slab, a whole large block, or a split
/// segment of large blocks.
struct Segment {
  CUdeviceptr base = 0;
  uint64_t bytes = 0;
  int cls = -1;            ///< small class, or -1: large blocks
  uint32_t capacity = 0;   ///< blocks it can hold
  uint32_t carved = 0;     ///< blocks made so far (a slab is carved on demand)
  uint32_t busy = 0;       ///< blocks live or pending
  bool leaving = false;    ///< being given back to the upstream (release_slow, free_exported):
                           ///< nothing in it is live, and once the upstream's free returns its
                           ///< range may be handed to anyone (drop_locked)
  bool split = false;      ///< blocks[0] heads an address list (lo/hi) of blocks split and
                           ///< merged as needed; `carved` counts them
  uint64_t top = 0;        ///< split: bytes from base that blocks cover (backed or holes)
  Block* last = nullptr;   ///< split: the block that ends at top
  std::unique_ptr<Block[]> blocks;
};
/// kHole: a stretch of a split segment whose memory went back to the upstream; in no list.
/// kClaimed: a free block the slow path is growing: in no list, not live.
inline constexpr uint8_t kFree = 0, kLive = 1, kPending = 2, kHole = 3, kClaimed = 4;

/// A pool's free lists.
using free_blocks = free_lists<Block, kClasses>;

template <class Layout>
class pool;

/// What a pool asks of the backend that holds it (pooled_backend.hpp).
template <class Layout>
class owner {
 public:
  /// Give back what every other pool of the process keeps (waiting for their pending frees);
  /// the bytes. From a pool's slow path after the cap or the driver refused it; thread-safe.
  virtual uint64_t release_all_except(const pool<Layout>* skip) = 0;
  /// Whether a pool other than `skip` has a live block that starts at `p`. Takes each pool's
  /// lock in turn; call with none held. Thread-safe; cold.
  virtual bool live_elsewhere(CUdeviceptr p, const pool<Layout>* skip) = 0;

 protected:
  ~owner() = default;
};

/// The pool of one CUDA context (see the top of this file), its memory laid out by `Layout`.
/// Thread-safe: the device's pool book lock guards the free lists (held for a few dozen
/// instructions, never across a driver call); a mutex serializes the slow path (upstream
/// allocation, event record, query and wait, release). Allocations and frees it serves are
/// counted and recorded (events) here, through the ledger, not by the hooks. Memory is given
/// back only by release(), by the budget, by the cap, or by the upstream's own out-of-memory
/// answer; the destructor gives back nothing.
///
/// `Layout` is an object of the pool (`layout()`), a friend, and provides these steps (static
/// or member functions; its own file instantiates pool<Layout>, so a layout links alone):
///   uint64_t large_round(), unit(), slab_bytes()   large requests round to; what is backed
///                                                  and given back at once; a slab's bytes
///   bool counts_upstream()    the ledger counts each segment reserved and cached (else the
///                             upstream counts what it backs)
///   bool splits()             large blocks live in split segments (constexpr false: the
///                             free path is compiled without its merge test)
///   Block* merge_locked(pool&, Block* freed)   a freed block of a split segment merged with
///                                              its free neighbours (the block to push)
///   Block* take_large_locked(pool&, uint64_t rounded)   a hit of a large request (under mu_)
///   uint64_t served_locked(const free_blocks&)          the largest request free large blocks
///                                                       serve (the device's fragmentation)
///   bool may_serve(const Block& pending, uint64_t rounded)  a pending large block may, once free
///   void prepare_slow(pool&)                 before a miss's slow path (under slow_)
///   CUresult grow_slow(pool&, CUdeviceptr* out, uint64_t bytes, int cls, uint64_t rounded,
///                      bool last, bool* cap_refused)      a miss's growth (as pool::grow_whole_slow)
///   uint64_t reclaim_slow(pool&, uint64_t want)  give back free memory (nothing forbids it)
///   void trim_slow(pool&, uint64_t want)         the idle trim's, past the budget
///   uint64_t release_slow(pool&)                 release()'s, pending frees waited for
///   void added_locked(pool&, Segment*, Block* first, uint64_t take)  a segment made, its
///                             first block about to be handed out (a split one: cut to `take`)
///   void dropping_locked(Segment*)  a segment given back or forgotten (the Blocks the layout
///                             made for it are its own again)
///   void forget(pool&, uint64_t bytes)           the context is gone: uncharge what the
///                                                pool held (`bytes`: its segments' counted)
///   bool handles_whole()          a whole large block is one upstream allocation, which a
///                                 legacy IPC handle names
///   void describe(ipc_span*)      how another process maps a block (kind, unit, exportable)
template <class Layout>
class pool final {
 public:
  /// `upstream` provides the memory (owned), `layout` lays it out. `slot` holds the device's
  /// counters (cap, used, reserved, cached), `ordinal` its CUDA ordinal.
  pool(std::unique_ptr<memory_resource> upstream, Layout layout, CUcontext ctx, int ordinal, ring::DeviceSlot& slot,
       core::Tracker& tracker, owner<Layout>& holder);
  ~pool();
  pool(const pool&) = delete;
  pool& operator=(const pool&) = delete;

  CUcontext context() const noexcept { return ctx_; }
  int ordinal() const noexcept { return ordinal_; }
  Layout& layout() noexcept { return layout_; }

  /// The program's allocation of `bytes` (> 0) through `api`, aligned to at least 256 bytes
  /// (cudaMalloc's promise): *out and CUDA_SUCCESS, or CUDA_ERROR_OUT_OF_MEMORY when neither
  /// the cap nor the driver allows it (or the driver's error). Its event (stamped `now_ns`,
  /// CLOCK_REALTIME read before) goes into the ring under the same lock as the free list and
  /// the counters on a hit.
  CUresult allocate_traced(CUdeviceptr* out, std::size_t bytes, ring::Api api, uint64_t now_ns);
  /// The program's free of `p`: its event (`api`, `aux` = stream or 0, stamped `now_ns`)
  /// under the same lock. Having done nothing: CUDA_ERROR_INVALID_VALUE
  /// when `p` lies in memory this pool holds but is not the start of a live block (freed
  /// twice, or an interior pointer: the driver's answer), CUDA_ERROR_NOT_FOUND when it is
  /// not this pool's memory at all (the caller passes it to the driver), which includes
  /// memory this pool is giving back, or whose context is being destroyed, that the driver
  /// handed out again (not_live_unlock).
  CUresult free_traced(CUdeviceptr p, ring::Api api, uint64_t aux, uint64_t now_ns);

  /// Whether `p` lies in memory this pool took from its upstream; if in a live block, *out
  /// describes that block as the program's allocation and `live` is set.
  bool locate(CUdeviceptr p, range* out, bool* live);
  /// Appends every block this pool has carved to `out` (live, free or pending), in one
  /// critical section (allocates outside it). Returns false if memory ran out.
  bool blocks(std::vector<block_info>& out);
  /// Reserved and cached bytes, and the largest request served without the driver now.
  pool_stats stats();
  /// cuIpcGetMemHandle for the live block at (or containing) `p`: a handle of its whole driver
  /// allocation (a large block of whole blocks is one), which the pool then never hands out
  /// again; CUDA_ERROR_NOT_SUPPORTED and *pooled (the block's span; for a slab of driver
  /// memory, with its legacy handle) for a block no legacy handle names (packed into a slab
  /// with others, or laid out by a layout without handles); CUDA_ERROR_INVALID_VALUE for a
  /// freed block; CUDA_ERROR_NOT_FOUND when `p` is not this pool's memory; or the driver's
  /// error for the slab's handle. Waits for the legacy stream first when a block was handed
  /// out by stream order since the last such wait (fence.hpp).
  CUresult ipc_handle(CUipcMemHandle* handle, CUdeviceptr p, ipc_span* pooled);
  /// The live block at `p` of `bytes` requested, as another process maps it (see
  /// backend::ipc_describe; no legacy handle filled in). CUDA_ERROR_INVALID_HANDLE when no
  /// such block is live. Takes the pool's lock only; no driver call.
  CUresult ipc_describe(CUdeviceptr p, uint64_t bytes, ipc_span* out);
  /// Give back to the upstream every segment no block of which is in use, after waiting for
  /// pending frees (not during a capture, nor while the context is being destroyed); the bytes.
  std::size_t release();

  /// A non-blocking stream of this context was created: later batches record on it too, and
  /// stream order is off while it exists (blocks handed out by it: `s` waits for the legacy
  /// stream's work queued so far).
  void add_stream(CUstream s);
  /// Stream order is off for good: another pool exists or a peer was given access
  /// (fence.hpp). Blocks handed out by it: waits for the legacy stream's work first. Under
  /// the backend's lock (the context is live); takes the pool's lock, not its slow path's.
  void unorder();
  /// A stream capture is about to begin (already counted: no hand-out by stream order from
  /// now on): blocks handed out by it, waits for the legacy stream's work first. As unorder().
  void capture_beginning();
  /// `s` is about to be destroyed: if it is ours, record an event on it that every later
  /// batch waits for, and stop recording on it. True if it was one of this pool's streams.
  bool remove_stream(CUstream s);
  /// A blocking stream of this context is about to be destroyed: record an event on it that
  /// every later batch waits for (while a capture is active: synchronize the context before
  /// the next batch completes instead).
  void orphan_stream(CUstream s);

  /// The context is being destroyed (`true`: no driver call on its memory from now on:
  /// releases, frees of exported blocks and stream events are skipped, since its addresses
  /// may be handed out again as the driver frees them), or its destruction was refused
  /// (`false`). Waits for a slow-path driver call in flight.
  void set_dying(bool dying);

  /// The context was destroyed or reset: its memory went with it. Forget every block
  /// without calling the driver, count the live ones freed (free events, api cuCtxDestroy),
  /// and take the pool's bytes off the counters.
  void forget_all() noexcept;

 private:
  friend Layout;

  /// Calls f(Block*) for each block of `s` (carved, or on its address list).
  template <class F>
  static void each_block(Segment* s, F&& f) {
    if (s->split) {
      for (Block* b = &s->blocks[0]; b;) {
        Block* hi = b->hi;
        f(b);
        b = hi;
      }
    } else {
      for (uint32_t k = 0; k < s->carved; ++k) f(&s->blocks[k]);
    }
  }
  /// The block of `s` that contains `p` (inside s), or nullptr (an uncarved slab slot).
  Block* block_at_locked(Segment* s, CUdeviceptr p) const noexcept;

  // Under mu_.
  /// The block as the seam describes it (an exported block whose free waits for the driver
  /// is still live).
  block_info describe_locked(const Block& b) const noexcept;
  /// The span another process maps for the live block `b` (ipc_handle, ipc_describe).
  void describe_span_locked(const Block& b, ipc_span* out) const noexcept;
  Block* take_locked(int cls, uint64_t rounded) noexcept;
  /// Whole blocks: the free large block that fits `rounded` best, within the slack.
  Block* take_whole_locked(uint64_t rounded) noexcept;
  void push_free_locked(Block* b) noexcept;
  void unlink_free_locked(Block* b) noexcept;
  void publish_free_locked() noexcept;
  /// The segment whose range holds `p`, or nullptr.
  Segment* segment_at_locked(CUdeviceptr p) const noexcept;
  /// Whether the hooks count a live allocation of the driver's at `p` (pointers()): takes
  /// Tracker::lock(), with mu_ held or not (the order tracker.hpp gives). Cold: memory being
  /// given back, or a context being destroyed.
  bool hooks_count(CUdeviceptr p) const noexcept;
  /// The answer to a free of `p`, which is no live block's start, with mu_ held (released
  /// here): CUDA_ERROR_INVALID_VALUE when p lies in memory this pool holds (refused rather
  /// than passed on); CUDA_ERROR_NOT_FOUND when it does not, and when it lies in a segment
  /// being given back, or of a context being destroyed, where the driver handed the address
  /// out again before the segment was dropped: the hooks count a live allocation there, or
  /// another pool a live block (asked after mu_ is released, under its own lock).
  CUresult not_live_unlock(CUdeviceptr p) noexcept;
  /// `s` was given back to the upstream: out of segments_ and the block map, so its addresses
  /// answer as someone else's. (Segments are added and given back under slow_: no newer
  /// segment of this pool can lie at its addresses meanwhile.)
  void drop_locked(Segment* s) noexcept;
  /// Calls f(Block*) for every block of every segment (the block map's rebuild).
  auto every_block() {
    return [this](auto&& f) {
      for (auto& [base, s] : segments_) each_block(s, f);
    };
  }
  void map_insert_locked(Block* b) { map_.insert(b, every_block()); }
  Block* carve_locked(Segment* s) noexcept;
  void hand_out_locked(Block* b, uint64_t requested) noexcept;

  CUresult free_exported(Block* b, ring::Api api, uint64_t aux, uint64_t now);  // takes slow_

  // Under slow_.
  // `last` = false: a refusal by the cap, or the driver's out-of-memory, is not counted but
  // reported in *cap_refused (the caller makes room in the other pools and tries once more
  // with `last`).
  CUresult slow_allocate(CUdeviceptr* out, uint64_t bytes, int cls, uint64_t rounded, bool last, bool* cap_refused);
  bool try_take(CUdeviceptr* out, uint64_t bytes, int cls, uint64_t rounded);
  void seal_locked_slow();
  void retire_front();
  bool poll_slow();
  bool wait_oldest_slow();
  void wait_all_slow();
  /// Which free segments release_slow gives back: any, slabs only, or split segments left
  /// with nothing backed (holes only).
  enum class Which { any, slabs, holes };
  /// Gives back segments with no live or pending block (`which`), until `want` bytes.
  uint64_t release_slow(uint64_t want = ~uint64_t{0}, Which which = Which::any);
  /// Whole blocks' growth: a new slab or large block, one upstream allocation, charged.
  CUresult grow_whole_slow(CUdeviceptr* out, uint64_t bytes, int cls, uint64_t rounded, bool last, bool* cap_refused);
  bool charge_segment(uint64_t bytes, bool quiet);
  /// A new segment at `base` from the upstream (charged), its first block handed out for a
  /// request of `bytes` (class `cls`, or -1: the whole segment); *out is that block.
  /// Split (the layout's splits()): `seg_bytes` of addresses whose first `first` bytes are
  /// backed, the block handed out (its first `take` bytes when given: the rest stays free).
  void add_segment(CUdeviceptr* out, CUdeviceptr base, uint64_t seg_bytes, uint64_t bytes, int cls,
                   uint64_t first = 0, uint64_t take = 0);
  /// Whether taking `more` bytes from the upstream would pass the budget (budget::over).
  bool over_budget(uint64_t more) noexcept;
  /// From a free, once the budget's trim is due: give back what passes the budget.
  void trim_idle() noexcept;
  /// Give back free memory (the layout's reclaim_slow), unless a capture or the context's
  /// end forbids it. Returns bytes given back.
  uint64_t reclaim_slow(uint64_t want);

  std::unique_ptr<memory_resource> upstream_;
  Layout layout_;
  CUcontext ctx_;
  int ordinal_;
  ring::DeviceSlot& slot_;
  core::Tracker& tracker_;
  owner<Layout>& owner_;  ///< the backend this pool is one of
  core::Ledger ledger_;               ///< what the pool's calls count (the only writer of slot_)
  const uint64_t large_round_;        ///< large requests round to this (the layout's)
  const uint64_t gran_;               ///< what is backed and given back at once (the layout's unit)
  const uint64_t slab_bytes_;         ///< a slab's bytes

  /// The device's PoolBook lock (tracker.hpp; shared with the device's other pools, never
  /// Tracker::lock()): guards the free lists, the open batch, the block map and the records
  /// of the blocks handed out, so a hit or a free takes this one lock; its counters are
  /// atomics and its event a lock-free push, written in the same stretch.
  spin_lock& mu_;
  free_blocks free_;                       ///< free blocks and slabs with room (gran_ units)
  uint32_t hand_outs_ = 0;                 ///< blocks handed out so far: Block::generation
  Block* open_head_ = nullptr;             ///< freed, not yet behind an event
  uint32_t open_count_ = 0;
  uint64_t open_bytes_ = 0;
  std::atomic<uint64_t> pending_bytes_{0};  ///< open + sealed; written under mu_, read without
  std::map<CUdeviceptr, Segment*> segments_;  ///< by base address
  block_map<Block> map_;                ///< block start -> block
  bool dead_ = false;                          ///< context gone (forget_all)
  bool dying_ = false;                         ///< context being destroyed (set_dying; under slow_)
  bool ctx_going_ = false;                     ///< dying_, under mu_ (the free path holds mu_ only,
                                               ///< and reads it): once the driver destroyed the
                                               ///< context, its addresses may be someone else's
  budget budget_;                              ///< peak, keep, idle trim (under slow_; trim_due lock-free)
  /// Stream order is off while nonzero (under mu_): the context's non-blocking streams, plus
  /// kUnorderedForGood (fence.hpp).
  uint32_t unordered_ = 0;
  static constexpr uint32_t kUnorderedForGood = 1u << 31;
  /// Blocks handed out by stream order so far (under mu_), and how many of them are settled:
  /// their old owners' work has finished (a wait for the legacy stream, or a settle mark seen
  /// complete, after their hand-out). The pool is tainted while they differ: each non-blocking
  /// stream made meanwhile waits for the legacy stream's queued work.
  uint64_t taints_ = 0;
  uint64_t settled_ = 0;
  bool tainted_locked() const noexcept { return taints_ != settled_; }

  /// Segments waiting to go back to the upstream until their mark's events complete (under
  /// slow_): planned (leaving, busy) before the mark was recorded, so every piece of work on
  /// them precedes its events; still in segments_, reserved and charged.
  struct giving {
    stream_events::seal_mark mark;
    uint64_t taints = 0;  ///< taints_ when the mark was recorded: settled once it completes
    std::vector<Segment*> segs;
  };
  std::vector<giving> giving_;
  uint64_t giving_bytes_ = 0;  ///< the bytes of giving_'s segments (under slow_)
  /// A refusal is being decided (under slow_): memory goes back now, waiting for the GPU if
  /// it must, rather than behind a mark.
  bool need_now_ = false;
  /// Sets need_now_ for a refusal's give-back (under slow_).
  struct needing {
    explicit needing(pool& p) noexcept : p_(p), was_(p.need_now_) { p.need_now_ = true; }
    ~needing() { p_.need_now_ = was_; }
    needing(const needing&) = delete;
    needing& operator=(const needing&) = delete;
    pool& p_;
    bool was_;
  };

  void retire_open_if_idle();
  /// Whether memory made unreachable before this call (no longer free, not carvable) may go
  /// back to the upstream now, whose free or unmap does not wait for the GPU: true when no
  /// block handed out by stream order may still be in use, or once events recorded now on
  /// the legacy stream (and the context's non-blocking streams) have completed, polled, or
  /// waited for (`wait`). False: `*g` holds those events (pending: the memory goes back once
  /// they complete, give_pending_slow), or none (a capture: nothing may be waited for).
  bool settle_slow(giving* g, bool wait);
  /// Gives back the segments of every entry of giving_ whose events completed (`wait`: all of
  /// them, waiting); the bytes. Not during a capture, nor while the context is dying.
  uint64_t give_pending_slow(bool wait);
  /// Gives `gone` (planned by release_slow) back to the upstream now; the bytes.
  uint64_t give_back_slow(std::vector<Segment*>& gone);
  /// `s` stays: planned to go back, then not (under mu_).
  void keep_locked(Segment* s) noexcept;
  /// Whether a block was handed out by stream order since the last wait for the legacy
  /// stream (under mu_); taken (settled) by the caller, which then waits.
  bool take_taint() noexcept;

  std::mutex slow_;
  fence<Block> fence_;  ///< sealed batches, events, streams (under slow_; idle() lock-free)
  void orphan_slow(CUstream s);
};

}  // namespace cuw::backends::pool

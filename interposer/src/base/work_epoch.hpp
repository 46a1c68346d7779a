// cuwarden interposer base: the process-wide work epoch and capture count.
//
// A pooling backend may hand a freed block straight out again only when it can prove that no
// GPU work queued before the free still runs (cudaFree's promise, backends/pool/pool.hpp: "the
// fast case"). Two process-wide facts let it:
//   - the work counters (the epoch): every hooked entry point that queues GPU work bumps one
//     after the driver accepted the work (the generated work hooks, base/work_hooks.inc):
//     work on the legacy default stream (handle 0 or CU_STREAM_LEGACY of an entry point that
//     is not a per-thread variant, or its stream-less synchronous calls) bumps the legacy
//     counter, all other work (any other stream, per-thread default streams, work across
//     contexts) the other counter. Nothing counted on the other counter since a proof means
//     all work since went to a legacy stream: stream order (backends/pool/fence.hpp). A
//     work-queuing entry point the driver hands out that has no hook (an older ABI variant,
//     a newer driver's new entry point) turns both proofs off for the process, for good;
//   - the stream captures active: while one is, nothing may be recorded, queried, waited
//     for or freed (it would fail, or become part of the program's graph).
// Captures are counted from the library's load, before any backend exists (a capture begun
// before the first allocation still counts); work from when a pool first needs it
// (start_counting: before, no pooled block exists for work to use).
#pragma once

#include <cuda.h>

#include <atomic>
#include <cstdint>

namespace cuw::work {

namespace detail {
// Start at 1, so that a pool that has seen no completed event (its proof 0) is never idle.
inline std::atomic<uint64_t> g_epoch{1};  ///< work on a legacy default stream
inline std::atomic<uint64_t> g_other{1};  ///< all other work
// Set once a pool exists (start_counting): before that no pooled block exists for work to use.
inline std::atomic<bool> g_counting{false};
inline std::atomic<bool> g_untracked{false};
inline std::atomic<int> g_captures{0};
}  // namespace detail

/// From now on queued() counts (a pooling backend, when it makes its first pool). Lock-free.
inline void start_counting() noexcept { detail::g_counting.store(true, std::memory_order_relaxed); }

/// Whether work queued through an entry point on `stream` runs on the legacy default stream
/// (`per_thread`: the entry point is a _ptsz/_ptds variant, where 0 names the thread's own
/// default stream and only CU_STREAM_LEGACY the legacy one).
inline bool on_legacy(CUstream stream, bool per_thread) noexcept {
  return stream == CU_STREAM_LEGACY || (!per_thread && stream == nullptr);
}

/// Called by every hooked entry point that queues GPU work on `stream` (see on_legacy),
/// after the driver accepted it. One locked add on the legacy or the other counter while
/// counting (its release joins the counter's release sequence); otherwise one load and
/// nothing else. Lock-free, thread-safe, never calls the driver.
void queued(CUstream stream, bool per_thread) noexcept;

/// The counters as one read saw them.
struct marks {
  uint64_t legacy = 0;  ///< legacy-stream work
  uint64_t other = 0;   ///< all other work
};

/// The legacy counter now (acquire). Lock-free.
inline uint64_t epoch() noexcept { return detail::g_epoch.load(std::memory_order_acquire); }
/// The other counter now (acquire): equal to what a completed seal read means all work since
/// went to a legacy stream. Lock-free.
inline uint64_t other_epoch() noexcept { return detail::g_other.load(std::memory_order_acquire); }

/// Both counters read with a read-modify-write each (acq_rel): each synchronizes with every
/// count before it, so all work counted so far precedes what the caller records next (a
/// seal's events). Lock-free.
inline marks epoch_for_seal() noexcept {
  return {detail::g_epoch.fetch_add(0, std::memory_order_acq_rel),
          detail::g_other.fetch_add(0, std::memory_order_acq_rel)};
}

/// True for good once the program was handed a work-queuing entry point that is not
/// hooked: the counter can no longer prove the GPU idle. Lock-free.
inline bool untracked() noexcept { return detail::g_untracked.load(std::memory_order_relaxed); }

/// True for the name of a driver entry point that queues GPU work (the prefixes
/// gen_work_hooks.py matched the driver's exports with: CUW_WORK_PREFIXES).
bool queues_work(const char* name) noexcept;

/// The driver handed out `name`, a work-queuing entry point that is not hooked (through
/// cuGetProcAddress for CUDA `cuda_version`, or dlsym: 0): untracked() from now on, logged
/// once. Thread-safe.
void untracked_entry_point(const char* name, int cuda_version) noexcept;

/// A capture begins (counted before the driver's cuStreamBeginCapture*, so that no block is
/// handed out by stream order from then on; capture_ended() takes back a refused one).
/// Lock-free.
inline void capture_begun() noexcept { detail::g_captures.fetch_add(1, std::memory_order_acq_rel); }
/// A capture ended (cuStreamEndCapture* of a stream that was capturing). Never below zero (a
/// capture begun through an entry point that is not hooked). Lock-free.
void capture_ended() noexcept;
/// Whether any stream capture is active in the process. Lock-free.
inline bool capturing() noexcept { return detail::g_captures.load(std::memory_order_acquire) > 0; }

/// Whether `stream` is being captured now (cuStreamIsCapturing, or its per-thread-stream
/// variant when `per_thread`); false when the driver cannot say. One driver call.
bool stream_capturing(CUstream stream, bool per_thread) noexcept;

}  // namespace cuw::work

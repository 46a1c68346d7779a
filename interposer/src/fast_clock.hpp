// cuwarden interposer: CLOCK_REALTIME for event timestamps, from the CPU's own counter.
//
// Every ring event carries a wall-clock time. clock_gettime(CLOCK_REALTIME) costs about
// 29 ns on an H200 host (bench/results, cuw_bench_primitives), two per alloc+free pair; the
// CPU's counter (rdtsc on x86-64, cntvct_el0 on aarch64) costs about half. So the time is
// interpolated: each thread keeps an anchor (counter, CLOCK_REALTIME) taken with
// clock_gettime, and converts counter ticks since its anchor with one process-wide rate
// (ns per tick, measured between two anchors at least 50 ms apart). A thread takes a fresh
// anchor every ~100 ms of counter time, which bounds the drift from a rate error of a few
// ppm to well under a microsecond and follows wall-clock steps within 100 ms.
//
// The counter is only used when the kernel itself times with it (clocksource "tsc" or
// "arch_sys_counter": then it runs at a constant rate and agrees across CPUs); otherwise,
// and until the rate is measured, every call is a clock_gettime.
#pragma once

#include <atomic>
#include <cstdint>

#include "cuw/attrs.hpp"

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace cuw::ipc::fast_clock {

namespace detail {
/// The process-wide state of the clock. mult: ns per tick, 32.32 fixed point, 0 until
/// measured; period: the anchor period in ticks; usable: the kernel times with the counter
/// (init()). The hot path reads each thread's copy (ThreadState), not this.
struct alignas(64) State {
  std::atomic<uint64_t> mult{0};
  std::atomic<uint64_t> period{0};
  std::atomic<bool> usable{false};
};
extern State g_state;
/// A thread's anchor: a counter reading and the CLOCK_REALTIME it corresponds to.
struct Anchor {
  uint64_t ticks = 0, ns = 0;
};
/// What the interposer's hot path keeps per thread, in one cache line: the clock's anchor
/// with the thread's copies of the process-wide rate and period (set with each anchor; 0
/// until the thread has one and the rate is measured, or always with the counter unusable:
/// then every call takes the slow path), and two fields for the tracker (tracker.hpp),
/// which uses this line rather than one of its own. A hooked call runs with the caches
/// cold (the driver's work evicted them): each line it reads is a miss, and measured on an
/// H200 host a shared line for the rate cost about 40 ns a call (bench/results,
/// 2026-11-30-h200-off-hotpath.md).
struct alignas(64) ThreadState {
  Anchor anchor;
  uint64_t mult = 0;        ///< g_state.mult when the anchor was taken
  uint64_t period = 0;      ///< g_state.period when the anchor was taken
  uint32_t tid = 0;         ///< Linux thread id, 0 until first needed (tracker.hpp)
  int reentry_depth = 0;    ///< hooks on this thread's stack (tracker.hpp: Reentry)
};
extern constinit thread_local ThreadState t_state __attribute__((tls_model("initial-exec")));
/// No usable per-thread rate yet (or the counter is not used): clock_gettime, calibration,
/// or a first anchor (cold).
uint64_t slow_path() noexcept;
uint64_t reanchor() noexcept;   ///< the thread's anchor is old (or the counter jumped) (cold)

CUW_INLINE uint64_t ticks() noexcept {
#if defined(__x86_64__)
  return __rdtsc();
#elif defined(__aarch64__)
  uint64_t v;
  __asm__ volatile("mrs %0, cntvct_el0" : "=r"(v));
  return v;
#else
  return 0;
#endif
}
}  // namespace detail

/// Decide whether the CPU counter may be used (reads the kernel's current clocksource from
/// sysfs once). Call before the first realtime_ns() of the process that should be fast;
/// without it, or with `allow_counter` false (CUWARDEN_CLOCK=syscall), every call is a
/// clock_gettime. Thread-safe; the first call decides.
void init(bool allow_counter = true) noexcept;

/// CLOCK_REALTIME in ns since the Unix epoch. Lock-free; no system call on the fast path
/// (a counter read, a multiply, a compare). Never goes backwards by more than the anchor
/// error (< 1 us) within a thread. Thread-safe. Inline: the hooks' hot path.
uint64_t realtime_ns() noexcept;

/// The same, always through clock_gettime (for tests and anchors).
uint64_t realtime_ns_slow() noexcept;

CUW_INLINE uint64_t realtime_ns() noexcept {
  using namespace detail;
  ThreadState& ts = t_state;
  const uint64_t mult = ts.mult;
  if (__builtin_expect(mult == 0, 0)) return slow_path();
  const uint64_t d = ticks() - ts.anchor.ticks;
  if (__builtin_expect(d >= ts.period, 0)) return reanchor();
  // d < one anchor period (~100 ms of ticks), so d * mult stays below 2^63.
  return ts.anchor.ns + ((d * mult) >> 32);
}

}  // namespace cuw::ipc::fast_clock

// cuwarden interposer: CLOCK_REALTIME for event timestamps, at one of three costs.
//
// Every ring event carries a wall-clock time, read on the hooks' hot path (two per
// alloc+free pair). What a read costs inside a hooked call, on an H200 host (Intel Xeon VM,
// bench/results/2026-11-30-h200-off-clock.md), per pair, interleaved in one machine call:
// no clock at all ~40 ns added by the hooks, the kernel's coarse clock ~50 ns, the CPU's
// counter ~95 ns. The counter instruction (rdtsc: microcoded, ~20 ns each there) dominates
// the whole hook. So the modes (CUWARDEN_CLOCK):
//
// - coarse (the default): CLOCK_REALTIME_COARSE, the kernel's time as of its last
//   timekeeping update, read from the vDSO's data page without a counter read (through the
//   vDSO's own clock_gettime, called directly, where its symbol table has one): resolution
//   one tick (clock_getres: 1-4 ms, CONFIG_HZ), never ahead of CLOCK_REALTIME and behind
//   it by a tick or two (up to 7 ms measured with 4 ms ticks on a VM; more while the
//   kernel's ticks come late). Events keep their exact order (the ring's); what they lose
//   is sub-tick timing.
// - fine: CLOCK_REALTIME interpolated from the CPU's counter (rdtsc on x86-64, cntvct_el0 on
//   aarch64). Each thread keeps an anchor (counter, CLOCK_REALTIME) taken with
//   clock_gettime and converts counter ticks since its anchor with one process-wide rate
//   (ns per tick, measured between two anchors at least 50 ms apart). A thread takes a fresh
//   anchor every ~100 ms of counter time, which bounds the drift from a rate error of a few
//   ppm to well under a microsecond and follows wall-clock steps within 100 ms. The counter
//   is only used when the kernel itself times with it (clocksource "tsc" or
//   "arch_sys_counter": then it runs at a constant rate and agrees across CPUs); otherwise,
//   and until the rate is measured, every call is a clock_gettime.
// - syscall: clock_gettime(CLOCK_REALTIME) every time.
#pragma once

#include <time.h>

#include <atomic>
#include <cstdint>

#include "cuw/attrs.hpp"

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace cuw::fast_clock {

/// CUWARDEN_CLOCK: see the top of this file.
enum class Mode : uint8_t { coarse, fine, syscall };

namespace detail {
/// clock_gettime's signature (libc's, or the vDSO's own entry point: coarse mode).
using clock_fn = int (*)(clockid_t, timespec*);
/// The process-wide state of the clock. mode: init()'s (until then every call is a
/// clock_gettime); mult: ns per tick, 32.32 fixed point, 0 until measured; period: the
/// anchor period in ticks; usable: fine mode and the kernel times with the counter. The hot
/// path reads each thread's copy (ThreadState), not this.
struct alignas(64) State {
  std::atomic<uint64_t> mult{0};
  std::atomic<uint64_t> period{0};
  std::atomic<bool> usable{false};
  std::atomic<bool> ready{false};  ///< init() ran
  std::atomic<Mode> mode{Mode::syscall};
  /// Coarse mode: the vDSO's clock_gettime (found once by init()), else libc's.
  std::atomic<clock_fn> coarse_fn{nullptr};
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
  uint64_t mult = 0;        ///< g_state.mult when the anchor was taken; kCoarse: coarse mode
  uint64_t period = 0;      ///< g_state.period when the anchor was taken
  uint32_t tid = 0;         ///< Linux thread id, 0 until first needed (tracker.hpp)
  int reentry_depth = 0;    ///< hooks on this thread's stack (tracker.hpp: Reentry)
  clock_fn coarse_fn = nullptr;  ///< g_state.coarse_fn, set with mult = kCoarse
  /// The call site (core/callsites/callsites.hpp) of the allocation this thread is making, for the
  /// events and reports made deeper in (a refusal); 0: none, or call sites are off.
  uint32_t site = 0;
  /// A refusal on this thread waits to be reported (core/reports.cpp) until its hook has
  /// left every backend lock (SiteScope's end).
  uint8_t oom_pending = 0;
};
/// ThreadState::mult of a thread in coarse mode (no real rate is this large).
inline constexpr uint64_t kCoarse = ~0ULL;
extern constinit thread_local ThreadState t_state __attribute__((tls_model("initial-exec")));
/// The thread's first call since init() (then coarse mode sets kCoarse), no usable
/// per-thread rate yet, or the counter is not used: clock_gettime, calibration, or a first
/// anchor (cold).
uint64_t slow_path() noexcept;
uint64_t reanchor() noexcept;   ///< the thread's anchor is old (or the counter jumped) (cold)
/// The vDSO's clock_gettime, or libc's where the vDSO (or its symbol) is not found, or its
/// image is not one this reads (fast_clock.cpp). Reads only the mapped image, checking every
/// offset against it. Thread-safe.
clock_fn vdso_clock_gettime() noexcept;

/// CLOCK_REALTIME_COARSE in ns (no system call, no counter read) through `fn`:
/// ThreadState::coarse_fn, the vDSO's entry point called directly, which skips libc's PLT
/// stub, its wrapper and the dynamic linker's data that the wrapper reads (three cache lines
/// fewer on a cold hot path); or libc's clock_gettime where there is no vDSO.
CUW_INLINE uint64_t coarse_ns(clock_fn fn) noexcept {
  timespec t;
  fn(CLOCK_REALTIME_COARSE, &t);
  return static_cast<uint64_t>(t.tv_sec) * 1000000000ULL + static_cast<uint64_t>(t.tv_nsec);
}

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

/// Set the process's mode (CUWARDEN_CLOCK); for fine, also decide whether the CPU counter
/// may be used (reads the kernel's current clocksource from sysfs once). Call before the
/// first realtime_ns() that should be fast; until then every call is a clock_gettime.
/// Thread-safe; the first call decides.
void init(Mode mode = Mode::fine) noexcept;

/// CLOCK_REALTIME in ns since the Unix epoch, as the mode reads it. Lock-free; no system
/// call on the fast path (coarse: one vDSO read; fine: a counter read, a multiply, a
/// compare). Within a thread never goes backwards (fine: by more than the anchor error,
/// < 1 us), wall-clock steps aside; coarse lags CLOCK_REALTIME by a tick or two.
/// Thread-safe. Inline: the hooks' hot path.
uint64_t realtime_ns() noexcept;

/// The same with the calling thread's state given (`ts` must be its detail::t_state: the
/// interposer finds it without the GOT, tracker.hpp's thread_state()).
uint64_t realtime_ns(detail::ThreadState& ts) noexcept;

/// The same, always through clock_gettime (for tests and anchors).
uint64_t realtime_ns_slow() noexcept;

CUW_INLINE uint64_t realtime_ns() noexcept { return realtime_ns(detail::t_state); }

CUW_INLINE uint64_t realtime_ns(detail::ThreadState& ts) noexcept {
  using namespace detail;
  const uint64_t mult = ts.mult;
  if (__builtin_expect(mult == kCoarse, 1)) return coarse_ns(ts.coarse_fn);
  if (__builtin_expect(mult == 0, 0)) return slow_path();
  const uint64_t d = ticks() - ts.anchor.ticks;
  if (__builtin_expect(d >= ts.period, 0)) return reanchor();
  // d < one anchor period (~100 ms of ticks), so d * mult stays below 2^63.
  return ts.anchor.ns + ((d * mult) >> 32);
}

}  // namespace cuw::fast_clock

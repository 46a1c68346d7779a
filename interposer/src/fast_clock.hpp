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

#include <cstdint>

namespace cuw::ipc::fast_clock {

/// Decide whether the CPU counter may be used (reads the kernel's current clocksource from
/// sysfs once). Call before the first realtime_ns() of the process that should be fast;
/// without it, or with `allow_counter` false (CUWARDEN_CLOCK=syscall), every call is a
/// clock_gettime. Thread-safe; the first call decides.
void init(bool allow_counter = true) noexcept;

/// CLOCK_REALTIME in ns since the Unix epoch. Lock-free; no system call on the fast path
/// (a counter read, a multiply, a compare). Never goes backwards by more than the anchor
/// error (< 1 us) within a thread. Thread-safe.
uint64_t realtime_ns() noexcept;

/// The same, always through clock_gettime (for tests and anchors).
uint64_t realtime_ns_slow() noexcept;

}  // namespace cuw::ipc::fast_clock

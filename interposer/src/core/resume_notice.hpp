// cuwarden interposer core: the line a resumed process prints on its stderr.
//
// The daemon suspends a process from outside (the driver's checkpoint API) and, once it has
// resumed it, writes how long and by whom into the ring's header and increments its
// `resumes` word (ring.hpp). The process learns it at its next hooked call that queues GPU
// work, without a thread of its own: one acquire load of a header word the daemon writes
// only at a resume, and a branch.
#pragma once

#include <atomic>
#include <cstdint>

#include "core/tracker.hpp"
#include "cuw/ring.hpp"

namespace cuw::core {

namespace detail {
/// The header's `resumes` when the process last printed the line.
inline std::atomic<uint64_t> g_resumes_seen{0};
}  // namespace detail

/// Print "cuwarden: suspended N s by USER; resumed" for resume number `n` (once: a thread
/// that loses the race to another prints nothing). Async-signal-safe formatting, one write(2).
void print_resume_notice(const ring::RingHeader& h, uint64_t n) noexcept;

/// The line above if the daemon resumed the process since the last call. Lock-free; about
/// five instructions and one untaken branch when there is nothing to print.
inline void check_resume_notice() noexcept {
  Tracker* t = Tracker::instance_if_created();
  if (!t) return;
  const ring::RingHeader& h = t->header();
  const uint64_t n = h.resumes.load(std::memory_order_acquire);
  if (__builtin_expect(n != detail::g_resumes_seen.load(std::memory_order_relaxed), 0)) print_resume_notice(h, n);
}

}  // namespace cuw::core

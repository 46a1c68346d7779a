// cuwarden interposer: the small lock of the hot path (critical sections of a few dozen
// instructions, never across a driver call or a system call).
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstdint>

#include "cuw/attrs.hpp"

namespace cuw {

namespace detail {

/// Where waiters past their spin budget sleep, for every spin_lock of the process: one futex
/// word, so that a lock stays one byte (the tracker's first cache line has no room for a
/// word of its own). An unlock that finds its lock marked as waited for wakes them all;
/// those of other locks go back to sleep. Sleeping is for a holder that lost the CPU, so
/// this is rare.
struct Parking {
  alignas(64) std::atomic<uint32_t> seq{0};  ///< the futex word: bumped by each wake-up
};
inline Parking g_parking;
static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t) && std::atomic<uint32_t>::is_always_lock_free,
              "the futex word is the atomic itself");

}  // namespace detail

/// Spin-then-sleep lock of one byte: 0 free, 1 held, 2 held and maybe waited for (Drepper,
/// "Futexes Are Tricky", with the futex word shared: detail::Parking). Uncontended: one
/// compare-exchange to lock, one locked decrement to unlock (on x86-64 `lock cmpxchg` and
/// `lock sub` + a branch; no other line touched). A waiter spins with pause for many times a
/// critical section's length (kSpins), then marks the lock waited for and sleeps on the
/// futex until an unlock wakes it: a holder preempted on a busy machine gets the CPU instead
/// of its waiters burning their time slices (sched_yield, which CFS barely honours, made each
/// hand-over cost a time slice). Not recursive; satisfies BasicLockable (std::lock_guard
/// works). Process-private (FUTEX_PRIVATE_FLAG).
class spin_lock {
 public:
  CUW_INLINE void lock() noexcept {
    uint8_t free = 0;
    if (__builtin_expect(locked_.compare_exchange_strong(free, 1, std::memory_order_acquire,
                                                         std::memory_order_relaxed), 1))
      return;
    contended();
  }
  CUW_INLINE void unlock() noexcept {
    // From 1 to 0: nobody waits. From 2 (a waiter marked it before sleeping): free it and
    // wake the sleepers. The decrement is ordered after a waiter's mark (one location), and
    // the waiter read the futex word before marking: it sees the wake-up's bump or is woken.
    if (__builtin_expect(locked_.fetch_sub(1, std::memory_order_acq_rel) != 1, 0)) wake();
  }

 private:
  static constexpr int kSpins = 128;  ///< pauses before sleeping: microseconds, dozens of critical sections

  __attribute__((noinline)) void contended() noexcept {
    for (int i = 0; i < kSpins; ++i) {
      uint8_t free = 0;
      if (locked_.load(std::memory_order_relaxed) == 0 &&
          locked_.compare_exchange_strong(free, 1, std::memory_order_acquire, std::memory_order_relaxed))
        return;
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#elif defined(__aarch64__)
      __asm__ volatile("yield");
#endif
    }
    detail::Parking& p = detail::g_parking;
    for (;;) {
      const uint32_t seq = p.seq.load(std::memory_order_seq_cst);
      // Held as 2 when it was free: the unlock then wakes others, who mark it again if they
      // still wait (one spurious wake-up, never a lost one).
      if (locked_.exchange(2, std::memory_order_seq_cst) == 0) return;
      // Asleep until a wake-up moves seq on (at once if one already has).
      syscall(SYS_futex, reinterpret_cast<uint32_t*>(&p.seq), FUTEX_WAIT_PRIVATE, seq, nullptr, nullptr, 0);
    }
  }
  __attribute__((noinline)) void wake() noexcept {
    locked_.store(0, std::memory_order_seq_cst);
    detail::Parking& p = detail::g_parking;
    p.seq.fetch_add(1, std::memory_order_seq_cst);
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&p.seq), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
  }

  std::atomic<uint8_t> locked_{0};
};

/// std::lock_guard for a spin_lock, whose constructor and destructor are always inlined: GCC
/// keeps std::lock_guard's destructor out of line in a function with several guards and a
/// path that may throw (Tracker::charge: a call and a stack slot per allocation).
class spin_guard {
 public:
  CUW_INLINE explicit spin_guard(spin_lock& l) noexcept : l_(l) { l_.lock(); }
  CUW_INLINE ~spin_guard() { l_.unlock(); }
  spin_guard(const spin_guard&) = delete;
  spin_guard& operator=(const spin_guard&) = delete;

 private:
  spin_lock& l_;
};

}  // namespace cuw

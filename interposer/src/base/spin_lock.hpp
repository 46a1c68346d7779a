// cuwarden interposer: the small spin lock of the hot path (critical sections of a few dozen
// instructions, never across a driver call or a system call).
#pragma once

#include <sched.h>

#include <atomic>

namespace cuw {

/// Test-and-test-and-set lock. Uncontended: one atomic exchange to lock, one release store
/// to unlock. A waiter spins with pause, then yields (a holder that was descheduled gets to
/// run). Not recursive; satisfies BasicLockable (std::lock_guard works).
class spin_lock {
 public:
  void lock() noexcept {
    if (__builtin_expect(!locked_.exchange(true, std::memory_order_acquire), 1)) return;
    contended();
  }
  void unlock() noexcept { locked_.store(false, std::memory_order_release); }

 private:
  __attribute__((noinline)) void contended() noexcept {
    for (int spins = 0;; ++spins) {
      if (!locked_.exchange(true, std::memory_order_acquire)) return;
      while (locked_.load(std::memory_order_relaxed)) {
        if (spins++ > 64) {
          sched_yield();
        } else {
#if defined(__x86_64__) || defined(__i386__)
          __builtin_ia32_pause();
#elif defined(__aarch64__)
          __asm__ volatile("yield");
#endif
        }
      }
    }
  }
  std::atomic<bool> locked_{false};
};

}  // namespace cuw

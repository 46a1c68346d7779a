// cuwarden interposer: the small lock of the hot path (critical sections of a few dozen
// instructions, never across a driver call or a system call).
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstdint>

namespace cuw {

namespace detail {

/// Where waiters past their spin budget sleep, for every spin_lock of the process: one futex
/// word, so that a lock stays one byte (the tracker's first cache line has no room for a
/// word of its own). An unlock that sees sleepers wakes them all; those of other locks go
/// back to sleep. Sleeping is for a holder that lost the CPU, so this is rare.
struct Parking {
  alignas(64) std::atomic<uint32_t> seq{0};  ///< the futex word: bumped by each wake-up
  std::atomic<uint32_t> sleepers{0};         ///< waiters about to sleep or asleep
};
inline Parking g_parking;
static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t) && std::atomic<uint32_t>::is_always_lock_free,
              "the futex word is the atomic itself");

}  // namespace detail

/// Spin-then-sleep lock of one byte. Uncontended: one atomic exchange to lock; to unlock, a
/// sequentially consistent store and one load of the sleepers' count (on x86-64 an xchg and
/// a mov, no call). A waiter spins with pause for many times a critical section's length
/// (kSpins), then sleeps on a futex until an unlock wakes it: a holder preempted on a busy
/// machine gets the CPU instead of its waiters burning their time slices (sched_yield,
/// which CFS barely honours, made each hand-over cost a time slice). Not recursive;
/// satisfies BasicLockable (std::lock_guard works). Process-private (FUTEX_PRIVATE_FLAG).
class spin_lock {
 public:
  void lock() noexcept {
    if (__builtin_expect(!locked_.exchange(true, std::memory_order_acquire), 1)) return;
    contended();
  }
  void unlock() noexcept {
    // Sequentially consistent, with the waiter's count then exchange below: either it sees
    // the lock free, or this unlock sees it counted and wakes it.
    locked_.store(false, std::memory_order_seq_cst);
    if (__builtin_expect(detail::g_parking.sleepers.load(std::memory_order_seq_cst) != 0, 0)) wake();
  }

 private:
  static constexpr int kSpins = 128;  ///< pauses before sleeping: microseconds, dozens of critical sections

  __attribute__((noinline)) void contended() noexcept {
    for (int i = 0; i < kSpins; ++i) {
      if (!locked_.load(std::memory_order_relaxed) && !locked_.exchange(true, std::memory_order_acquire)) return;
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#elif defined(__aarch64__)
      __asm__ volatile("yield");
#endif
    }
    detail::Parking& p = detail::g_parking;
    for (;;) {
      const uint32_t seq = p.seq.load(std::memory_order_seq_cst);
      p.sleepers.fetch_add(1, std::memory_order_seq_cst);
      const bool got = !locked_.exchange(true, std::memory_order_seq_cst);
      // Asleep until a wake-up moves seq on (at once if one already has).
      if (!got) syscall(SYS_futex, reinterpret_cast<uint32_t*>(&p.seq), FUTEX_WAIT_PRIVATE, seq, nullptr, nullptr, 0);
      p.sleepers.fetch_sub(1, std::memory_order_seq_cst);
      if (got || !locked_.exchange(true, std::memory_order_acquire)) return;
    }
  }
  __attribute__((noinline)) static void wake() noexcept {
    detail::Parking& p = detail::g_parking;
    p.seq.fetch_add(1, std::memory_order_seq_cst);
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&p.seq), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
  }

  std::atomic<bool> locked_{false};
};

}  // namespace cuw

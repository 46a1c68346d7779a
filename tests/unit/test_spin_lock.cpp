// cuwarden unit tests: the interposer's hot-path lock (interposer/src/base/spin_lock.hpp):
// mutual exclusion, and waiters that sleep rather than spin while the holder keeps it.
#include <time.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "base/spin_lock.hpp"

namespace {

double thread_cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

}  // namespace

TEST_CASE("spin lock: one holder at a time, under contention", "[spin_lock]") {
  cuw::spin_lock mu;
  uint64_t counter = 0;  // not atomic: the lock alone keeps the increments whole
  constexpr int kThreads = 4, kEach = 200000;
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t)
    ts.emplace_back([&] {
      for (int i = 0; i < kEach; ++i) {
        std::lock_guard<cuw::spin_lock> g(mu);
        ++counter;
      }
    });
  for (auto& t : ts) t.join();
  CHECK(counter == uint64_t{kThreads} * kEach);
}

TEST_CASE("spin lock: waiters sleep while the holder keeps it (a preempted holder costs them no CPU)",
          "[spin_lock]") {
  cuw::spin_lock mu;
  constexpr int kWaiters = 3;
  std::atomic<int> arrived{0};
  std::vector<double> cpu_ms(kWaiters, 0);
  mu.lock();
  std::vector<std::thread> ts;
  for (int t = 0; t < kWaiters; ++t)
    ts.emplace_back([&, t] {
      const double before = thread_cpu_ms();
      ++arrived;
      mu.lock();
      mu.unlock();
      cpu_ms[static_cast<size_t>(t)] = thread_cpu_ms() - before;
    });
  while (arrived.load() < kWaiters) std::this_thread::yield();
  // Held for half a second of wall time past their arrival, as by a holder that lost the CPU.
  // A load on the machine only lowers what spinning waiters could burn, never raises it.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  mu.unlock();
  for (auto& t : ts) t.join();
  for (int t = 0; t < kWaiters; ++t) {
    INFO("waiter " << t << " used " << cpu_ms[static_cast<size_t>(t)] << " ms of CPU in 500 ms of waiting");
    CHECK(cpu_ms[static_cast<size_t>(t)] < 50.0);  // a spin budget of microseconds, then asleep
  }
}

TEST_CASE("spin lock: waiters that slept are all woken, and exclusion holds across sleeps", "[spin_lock]") {
  // Holders that sometimes keep the lock past the waiters' spin budget, so that waiters mark
  // it waited for and sleep over and over; a lost wake-up hangs here (the ctest deadline).
  cuw::spin_lock mu;
  uint64_t counter = 0;
  constexpr int kThreads = 4, kEach = 400;
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t)
    ts.emplace_back([&] {
      for (int i = 0; i < kEach; ++i) {
        std::lock_guard<cuw::spin_lock> g(mu);
        const uint64_t seen = counter;
        if (i % 16 == 0) std::this_thread::sleep_for(std::chrono::microseconds(300));
        counter = seen + 1;  // a second holder meanwhile would lose an increment
      }
    });
  for (auto& t : ts) t.join();
  CHECK(counter == uint64_t{kThreads} * kEach);
}

TEST_CASE("spin lock: locks that share the one futex word wake their own waiters, nested too", "[spin_lock]") {
  // Every lock parks on one word (detail::Parking): a wake-up for one lock wakes the sleepers
  // of all, who must go back to sleep or take their own lock, never take another's or stay
  // asleep. Three locks, six threads, a lock sometimes taken inside another (in one order),
  // holders that sometimes sleep past the spin budget. A lost wake-up hangs (the ctest deadline).
  cuw::spin_lock mu[3];
  uint64_t counter[3] = {0, 0, 0};
  constexpr int kThreads = 6, kEach = 300;
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t)
    ts.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        const int a = (t + i) % 3;
        std::lock_guard<cuw::spin_lock> g(mu[a]);
        const uint64_t seen = counter[a];
        if (i % 16 == t % 16) std::this_thread::sleep_for(std::chrono::microseconds(300));
        if (a < 2 && i % 5 == 0) {  // nested: always a lower index first, so no deadlock
          std::lock_guard<cuw::spin_lock> inner(mu[2]);
          ++counter[2];
        }
        counter[a] = seen + 1;
      }
    });
  for (auto& t : ts) t.join();
  uint64_t nested = 0;
  for (int t = 0; t < kThreads; ++t)
    for (int i = 0; i < kEach; ++i) nested += ((t + i) % 3 < 2 && i % 5 == 0) ? 1 : 0;
  CHECK(counter[0] + counter[1] + counter[2] == uint64_t{kThreads} * kEach + nested);
  uint64_t expected[3] = {0, 0, 0};
  for (int t = 0; t < kThreads; ++t)
    for (int i = 0; i < kEach; ++i) ++expected[(t + i) % 3];
  expected[2] += nested;
  CHECK(counter[0] == expected[0]);
  CHECK(counter[1] == expected[1]);
  CHECK(counter[2] == expected[2]);
}

// Unit tests: the interposer's event clock (fast_clock.hpp) agrees with CLOCK_REALTIME,
// whether it interpolates the CPU counter (kernel clocksource tsc / arch_sys_counter) or not.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "fast_clock.hpp"

namespace fc = cuw::ipc::fast_clock;

TEST_CASE("fast clock: within microseconds of CLOCK_REALTIME over half a second, in several threads",
          "[fast_clock]") {
  fc::init();
  constexpr int64_t kTolNs = 50'000;  // anchor and rate error are < 1 us; the rest is preemption slack
  auto run = [](int64_t* worst, uint64_t* samples, uint64_t* backwards) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
    uint64_t last = 0;
    while (std::chrono::steady_clock::now() < end) {
      const uint64_t before = fc::realtime_ns_slow();
      const uint64_t t = fc::realtime_ns();
      const uint64_t after = fc::realtime_ns_slow();
      const int64_t early = static_cast<int64_t>(before) - static_cast<int64_t>(t);
      const int64_t late = static_cast<int64_t>(t) - static_cast<int64_t>(after);
      *worst = std::max({*worst, early, late});
      if (last != 0 && t + 1000 < last) ++*backwards;  // more than 1 us backwards
      last = t;
      ++*samples;
    }
  };
  constexpr int kThreads = 3;
  std::vector<int64_t> worst(kThreads, INT64_MIN);
  std::vector<uint64_t> samples(kThreads, 0), backwards(kThreads, 0);
  std::vector<std::thread> ts;
  for (int i = 0; i < kThreads; ++i) ts.emplace_back(run, &worst[i], &samples[i], &backwards[i]);
  for (auto& t : ts) t.join();
  for (int i = 0; i < kThreads; ++i) {
    INFO("thread " << i << ": " << samples[i] << " samples, worst outside [before, after] by " << worst[i] << " ns");
    CHECK(samples[i] > 1000);
    CHECK(worst[i] < kTolNs);
    CHECK(backwards[i] == 0);
  }
}

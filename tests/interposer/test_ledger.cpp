// Interposer tests: what the daemon may rely on when it reads counters and events together
// (cuw/ring.hpp, "Counters and events"), under each backend: ctest runs [ledger] as
// interposer.ledger_off, ledger_cache and ledger_vmm.
//
// Four threads allocate and free while this one reads the ring as the daemon does (drain) and,
// after each event, the device's counters: a counter never lags the events already read (an
// event never arrives before the counter change it explains). The counters are exact at
// every instant: once the program is quiet they agree with the events, one for one.
#include <atomic>
#include <thread>
#include <vector>

#include "fakecuda.h"
#include "support.hpp"

using namespace cuwtest;

namespace {

using cuwtest::kMiB;

struct Seen {
  uint64_t allocs = 0, frees = 0;
};

/// Drains the process's ring (this test is its only consumer), counting device 0's alloc and
/// free events; `after_each` runs after each event, with the counts so far.
template <class F>
size_t drain_counting(Seen& seen, F&& after_each) {
  auto& h = own_ring();
  auto* slots = reinterpret_cast<cuw::ring::EventSlot*>(reinterpret_cast<char*>(&h) + cuw::ring::kHeaderBytes);
  std::vector<cuw::ring::Event> buf(512);
  const size_t n = cuw::ring::drain(h, slots, cuw::ring::kDefaultSlotCount, buf.data(), buf.size(), false, nullptr);
  for (size_t i = 0; i < n; ++i) {
    const auto& e = buf[i];
    if (e.device != 0) continue;
    if (e.kind == static_cast<uint8_t>(cuw::ring::EventKind::alloc)) ++seen.allocs;
    if (e.kind == static_cast<uint8_t>(cuw::ring::EventKind::free)) ++seen.frees;
    after_each(seen);
  }
  return n;
}

}  // namespace

TEST_CASE("ledger: an event read from the ring never arrives before the counters it explains", "[ledger]") {
  make_context();
  touch_interposer();
  auto& d = dev_counters(0);
  Seen ignored;
  while (drain_counting(ignored, [](const Seen&) {}) > 0) {
  }
  // From here on every alloc and free event is one of the counts below.
  const uint64_t alloc0 = d.alloc_count.load(), free0 = d.free_count.load(), hits0 = d.pool_hits.load();
  const uint64_t dropped0 = own_ring().events_dropped.load();
  const bool pooled = pool_name() != "off";

  // Several threads: the counters are atomics written under no common lock (a cap's check,
  // a pool's hit), so each event's counters must be in place before its own publish.
  constexpr int kThreads = 4, kPairs = 200000;
  std::atomic<int> running{kThreads};
  std::atomic<bool> done{false};
  std::atomic<int> failed{0};
  std::vector<std::thread> program;
  for (int t = 0; t < kThreads; ++t)
    program.emplace_back([&] {
      make_context();
      for (int i = 0; i < kPairs / kThreads; ++i) {
        CUdeviceptr p = 0;
        // 1 MiB (a slab class: a hit once warm) and 3 MiB (a whole block, or the vmm arena).
        const uint64_t bytes = i % 4 == 3 ? 3 * kMiB : kMiB;
        if (cuMemAlloc(&p, bytes) != CUDA_SUCCESS || cuMemFree(p) != CUDA_SUCCESS) {
          failed.fetch_add(1);
          break;
        }
      }
      if (running.fetch_sub(1) == 1) done.store(true, std::memory_order_release);
    });

  Seen seen;
  uint64_t lagging = 0, checks = 0;
  auto check = [&](const Seen& s) {
    // Read after the event (drain's acquire of its slot): the counters already count it.
    const uint64_t allocs = d.alloc_count.load(std::memory_order_acquire) - alloc0;
    const uint64_t frees = d.free_count.load(std::memory_order_acquire) - free0;
    ++checks;
    if (allocs < s.allocs || frees < s.frees) ++lagging;
  };
  while (!done.load(std::memory_order_acquire)) drain_counting(seen, check);
  for (auto& th : program) th.join();
  while (drain_counting(seen, check) > 0) {
  }
  REQUIRE(failed.load() == 0);
  INFO("events read " << seen.allocs << " allocs, " << seen.frees << " frees; " << checks << " checks");
  CHECK(lagging == 0);
  CHECK(checks > 0);
  // Quiet now: counters and events agree one for one (unless the ring was full: then the
  // events lost are counted as dropped).
  const uint64_t dropped = own_ring().events_dropped.load() - dropped0;
  CHECK(d.alloc_count.load() - alloc0 == uint64_t{kPairs});
  CHECK(d.free_count.load() - free0 == uint64_t{kPairs});
  CHECK(seen.allocs + seen.frees + dropped >= 2 * uint64_t{kPairs});
  if (dropped == 0) {
    CHECK(seen.allocs == uint64_t{kPairs});
    CHECK(seen.frees == uint64_t{kPairs});
  }
  // Nothing is live: what is still counted used is what a pool keeps free (cached).
  CHECK(d.live_allocations.load() == 0);
  CHECK(d.used.load() == d.cached.load());
  // A pool served most of them from what it kept; its hits are allocations too.
  if (pooled) CHECK(d.pool_hits.load() - hits0 > 0);
  CHECK(d.pool_hits.load() - hits0 <= uint64_t{kPairs});
}

TEST_CASE("ledger: a pool counts each driver call it makes for memory", "[ledger]") {
  make_context();
  touch_interposer();
  auto& d = dev_counters(0);
  const bool pooled = pool_name() != "off";
  const uint64_t take0 = d.pool_driver_allocs.load(), give0 = d.pool_driver_frees.load();
  fakecuda_reset_counters();

  // Misses (new sizes), frees while a slow "kernel" still runs, reuse after it.
  std::atomic<bool> ran{false};
  std::vector<CUdeviceptr> held;
  for (uint64_t mib : {3, 5, 9, 17}) {
    CUdeviceptr p = 0;
    REQUIRE(cuMemAlloc(&p, mib * kMiB) == CUDA_SUCCESS);
    held.push_back(p);
  }
  REQUIRE(slow_fill(nullptr, held[0], 0x5A, kMiB, 20, &ran) == CUDA_SUCCESS);
  for (CUdeviceptr p : held) REQUIRE(cuMemFree(p) == CUDA_SUCCESS);
  REQUIRE(cuCtxSynchronize() == CUDA_SUCCESS);
  REQUIRE(ran.load(std::memory_order_acquire));
  for (uint64_t mib : {3, 5, 9, 17}) {
    CUdeviceptr p = 0;
    REQUIRE(cuMemAlloc(&p, mib * kMiB) == CUDA_SUCCESS);
    REQUIRE(cuMemFree(p) == CUDA_SUCCESS);
  }

  const uint64_t take = d.pool_driver_allocs.load() - take0, give = d.pool_driver_frees.load() - give0;
  INFO("pool " << pool_name() << ": take " << take << ", give " << give);
  if (!pooled) {
    CHECK(take == 0);  // the program's own calls are not a pool's
    CHECK(give == 0);
    return;
  }
  // Every such call the simulated driver saw came from the pool (the program made none).
  if (vmm_pool()) {
    CHECK(take == fakecuda_call_count("cuMemCreate") + fakecuda_call_count("cuMemMap"));
    CHECK(give == fakecuda_call_count("cuMemUnmap") + fakecuda_call_count("cuMemRelease"));
  } else {
    CHECK(take == fakecuda_call_count("cuMemAlloc"));
    CHECK(give == fakecuda_call_count("cuMemFree"));
  }
  CHECK(take > 0);
}

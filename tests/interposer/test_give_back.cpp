// Interposer tests: memory a pool gives back to the driver while blocks were reused by stream
// order (backends/pool/fence.hpp), on the simulated driver, under CUWARDEN_POOL=cache and vmm.
// Tags, each in its own process (tests/interposer/CMakeLists.txt): [give_pending] (no cap,
// CUWARDEN_POOL_IDLE=1s), [give_refusal] (a 256 MiB cap).
//
// What they prove: the idle trim gives memory back without a synchronizing call, and only
// once the work its old owner queued before the free has finished (the memory still counted
// and charged until then); a refusal by the cap still gets that memory back first, waiting.
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "fakecuda.h"
#include "support.hpp"

using namespace cuwtest;

namespace {

using cuwtest::kMiB;

/// The old owner's last kernel, held by the test: queued on `s`, it waits until `go` is set
/// (or 20 s, so that code which waits for it cannot hang the test), then fills `n` bytes at
/// `p` with `v` (the simulated device's memory is host memory) and sets `done`.
struct Gate {
  std::atomic<bool> go{false}, done{false};
  CUdeviceptr p = 0;
  size_t n = 0;
  unsigned char v = 0;
};

CUresult gated_fill(CUstream s, Gate* g) {
  return cuLaunchHostFunc(
      s,
      [](void* data) {
        auto* gate = static_cast<Gate*>(data);
        const auto t0 = std::chrono::steady_clock::now();
        while (!gate->go.load(std::memory_order_acquire) && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20))
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        std::memset(reinterpret_cast<void*>(gate->p), gate->v, gate->n);
        gate->done.store(true, std::memory_order_release);
      },
      g);
}

void wait_done(const std::atomic<bool>& done) {
  const auto t0 = std::chrono::steady_clock::now();
  while (!done.load(std::memory_order_acquire) && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60))
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  REQUIRE(done.load(std::memory_order_acquire));
}

/// Whether the old owner's write had finished when the driver freed memory (cache: its
/// cuMemFree; armed with fakecuda_pause_in("cuMemFree freed", ...)).
struct AtFree {
  const std::atomic<bool>* done;
  std::atomic<int> frees{0}, early{0};
  static void seen(void* self) {
    auto* a = static_cast<AtFree*>(self);
    a->frees.fetch_add(1);
    if (!a->done->load(std::memory_order_acquire)) a->early.fetch_add(1);
    fakecuda_pause_in("cuMemFree freed", &AtFree::seen, self);  // every free, not just the first
  }
};

uint64_t given_back() { return fakecuda_call_count(vmm_pool() ? "cuMemUnmap" : "cuMemFree"); }

uint64_t syncs() {
  return fakecuda_call_count("cuStreamSynchronize") + fakecuda_call_count("cuCtxSynchronize") +
         fakecuda_call_count("cuEventSynchronize");
}

}  // namespace

TEST_CASE("pools: memory trimmed under its old owner's queued work goes back after it, with no synchronizing call",
          "[give_pending]") {
  make_context();
  touch_interposer();
  REQUIRE(reach_idle(4096));
  auto& d = dev_counters();
  // A peak of 256 MiB live, the first block's last write queued (held) on the legacy stream,
  // then all freed: stream order puts them straight back on the free lists.
  std::vector<CUdeviceptr> big(16);
  for (auto& p : big) REQUIRE(cuMemAlloc(&p, 16 * kMiB) == CUDA_SUCCESS);
  CUdeviceptr small = 0;
  REQUIRE(cuMemAlloc(&small, 4096) == CUDA_SUCCESS);
  Gate g;
  g.p = big[0];
  g.n = 16 * kMiB;
  g.v = 0xCD;
  REQUIRE(gated_fill(CU_STREAM_LEGACY, &g) == CUDA_SUCCESS);
  fakecuda_reset_counters();
  for (CUdeviceptr p : big) REQUIRE(cuMemFree(p) == CUDA_SUCCESS);
  CHECK(fakecuda_call_count("cuEventRecord") == 0);  // (stream order: no fence)
  const uint64_t held = d.reserved.load(), charged = d.used.load();
  CHECK(held >= 256 * kMiB);
  AtFree at{&g.done};
  if (!vmm_pool()) fakecuda_pause_in("cuMemFree freed", &AtFree::seen, &at);

  // The idle trim (the next free, once CUWARDEN_POOL_IDLE has passed) gives back what passes
  // the budget: not while the held write may still run, and without waiting for it.
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  REQUIRE(cuMemFree(small) == CUDA_SUCCESS);
  CHECK_FALSE(g.done.load(std::memory_order_acquire));
  CHECK(syncs() == 0);
  CHECK(given_back() == 0);
  CHECK(d.reserved.load() == held);  // still held, still charged against the cap
  CHECK(d.used.load() == charged);

  // Once the write has finished, the next trim gives it back.
  g.go.store(true, std::memory_order_release);
  wait_done(g.done);
  bool back = false;
  for (int i = 0; i < 10 && !back; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1100));
    CUdeviceptr p = 0;
    REQUIRE(cuMemAlloc(&p, 4096) == CUDA_SUCCESS);
    REQUIRE(cuMemFree(p) == CUDA_SUCCESS);
    back = d.reserved.load() <= 16 * kMiB + 2 * kMiB;
  }
  CHECK(back);
  CHECK(given_back() > 0);
  CHECK(d.used.load() == d.reserved.load());  // uncharged as it went back
  CHECK(syncs() == 0);
  if (!vmm_pool()) {
    fakecuda_pause_in("cuMemFree freed", nullptr, nullptr);
    CHECK(at.frees.load() > 0);
    CHECK(at.early.load() == 0);  // no cuMemFree before the old owner's write had finished
  }
}

TEST_CASE("pools: a refusal by the cap still gets memory trimmed under queued work back first", "[give_refusal]") {
  make_context();
  touch_interposer();
  REQUIRE(reach_idle(4096));
  auto& d = dev_counters();
  REQUIRE(d.limit.load() == 256 * kMiB);
  // Twelve 16 MiB blocks; every other one freed (not neighbours: under vmm they do not merge),
  // the first with its last write queued (held) on the legacy stream.
  std::vector<CUdeviceptr> big(12);
  for (auto& p : big) REQUIRE(cuMemAlloc(&p, 16 * kMiB) == CUDA_SUCCESS);
  Gate g;
  g.p = big[0];
  g.n = 16 * kMiB;
  g.v = 0xCD;
  REQUIRE(gated_fill(CU_STREAM_LEGACY, &g) == CUDA_SUCCESS);
  for (size_t i = 0; i < big.size(); i += 2) REQUIRE(cuMemFree(big[i]) == CUDA_SUCCESS);
  AtFree at{&g.done};
  if (!vmm_pool()) fakecuda_pause_in("cuMemFree freed", &AtFree::seen, &at);
  const uint64_t refusals = d.refusals.load();
  // The gate opens a little later, on another thread: the allocation below must wait for it.
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    g.go.store(true, std::memory_order_release);
  });
  fakecuda_reset_counters();
  // 100 MiB fits the cap only once the 96 MiB of free blocks went back.
  CUdeviceptr p = 0;
  const CUresult r = cuMemAlloc(&p, 100 * kMiB);
  const bool done_then = g.done.load(std::memory_order_acquire);
  opener.join();
  REQUIRE(r == CUDA_SUCCESS);
  CHECK(d.refusals.load() == refusals);
  CHECK(done_then);  // it waited for the write (the driver got the memory only after it)
  CHECK(given_back() > 0);
  CHECK(d.used.load() <= 256 * kMiB);
  if (!vmm_pool()) {
    fakecuda_pause_in("cuMemFree freed", nullptr, nullptr);
    CHECK(at.frees.load() > 0);
    CHECK(at.early.load() == 0);
  }
  REQUIRE(cuMemFree(p) == CUDA_SUCCESS);
  for (size_t i = 1; i < big.size(); i += 2) REQUIRE(cuMemFree(big[i]) == CUDA_SUCCESS);
}

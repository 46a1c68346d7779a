// Adversarial tests of the `cache` backend (CUWARDEN_POOL=cache) on the simulated driver.
// Each tag runs in its own process (tests/interposer/CMakeLists.txt, "cadv_*"): a 256 MiB cap
// on two 1 GiB devices unless the registration says otherwise.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "fakecuda.h"
#include "support.hpp"

using namespace cuwtest;

namespace {

using cuwtest::kMiB;
constexpr uint64_t kAdvCap = 256 * kMiB;

struct Snap {
  uint64_t used, reserved, cached, live;
};
Snap snap(int ordinal = 0) {
  auto& d = dev_counters(ordinal);
  return {d.used.load(), d.reserved.load(), d.cached.load(), d.live_allocations.load()};
}

bool overlap(CUdeviceptr a, size_t an, CUdeviceptr b, size_t bn) { return a < b + bn && b < a + an; }

/// Make every pending free of the current context's cache ready (synchronize, then one
/// allocation that seals and polls).
void settle() {
  REQUIRE(cuCtxSynchronize() == CUDA_SUCCESS);
  for (int i = 0; i < 3; ++i) {
    CUdeviceptr p = 0;
    REQUIRE(cuMemAlloc(&p, 3 * kMiB) == CUDA_SUCCESS);  // a large request seals at once
    REQUIRE(cuMemFree(p) == CUDA_SUCCESS);
    REQUIRE(cuCtxSynchronize() == CUDA_SUCCESS);
  }
}

}  // namespace

// ---- bad frees -----------------------------------------------------------------------------

TEST_CASE("cadv: a double free of a whole (large) block is refused and does not free the cache's memory",
          "[cadv_dfree_large]") {
  make_context();
  touch_interposer();
  CUdeviceptr big = 0;
  REQUIRE(cuMemAlloc(&big, 8 * kMiB) == CUDA_SUCCESS);
  REQUIRE(cuMemFree(big) == CUDA_SUCCESS);
  const Snap s0 = snap();
  const size_t live0 = fakecuda_live_bytes(0);
  fakecuda_reset_counters();
  CHECK(cuMemFree(big) == CUDA_ERROR_INVALID_VALUE);          // as the driver answers a double free
  CHECK(fakecuda_call_count("cuMemFree") == 0);               // the cache's driver allocation is untouched
  CHECK(fakecuda_live_bytes(0) == live0);
  const Snap s1 = snap();
  CHECK(s1.used == s0.used);
  CHECK(s1.reserved == s0.reserved);
  CHECK(s1.cached == s0.cached);
  CHECK(s1.live == s0.live);
  // Consequence when it is not refused: the cache still hands `big` out, and the driver hands
  // the same bytes to another allocation.
  settle();
  CUdeviceptr again = 0;
  REQUIRE(cuMemAlloc(&again, 8 * kMiB) == CUDA_SUCCESS);
  CUdeviceptr m = 0;
  REQUIRE(cuMemAllocManaged(&m, 8 * kMiB, CU_MEM_ATTACH_GLOBAL) == CUDA_SUCCESS);
  INFO("pooled " << std::hex << again << " managed " << m);
  CHECK_FALSE(overlap(again, 8 * kMiB, m, 8 * kMiB));
  REQUIRE(cuMemFree(m) == CUDA_SUCCESS);
  REQUIRE(cuMemFree(again) == CUDA_SUCCESS);
}

TEST_CASE("cadv: a double free of the first block of a slab is refused and leaves its neighbours alive",
          "[cadv_dfree_small]") {
  make_context();
  touch_interposer();
  // 7000 bytes: a class no earlier allocation used, so `a` is the first block of a new slab.
  CUdeviceptr a = 0, b = 0;
  REQUIRE(cuMemAlloc(&a, 7000) == CUDA_SUCCESS);
  REQUIRE(cuMemAlloc(&b, 7000) == CUDA_SUCCESS);
  REQUIRE(cuMemsetD8(b, 0x5B, 7000) == CUDA_SUCCESS);
  REQUIRE(cuMemFree(a) == CUDA_SUCCESS);
  const Snap s0 = snap();
  const size_t live0 = fakecuda_live_bytes(0);
  fakecuda_reset_counters();
  CHECK(cuMemFree(a) == CUDA_ERROR_INVALID_VALUE);
  CHECK(fakecuda_call_count("cuMemFree") == 0);
  CHECK(fakecuda_live_bytes(0) == live0);
  CHECK(snap().live == s0.live);
  // b must still be a live allocation the driver backs: a new driver allocation cannot overlap it.
  CUdeviceptr m = 0;
  REQUIRE(cuMemAllocManaged(&m, 2 * kMiB, CU_MEM_ATTACH_GLOBAL) == CUDA_SUCCESS);
  INFO("b " << std::hex << b << " managed " << m);
  CHECK_FALSE(overlap(b, 7000, m, 2 * kMiB));
  REQUIRE(cuMemsetD8(m, 0x11, 2 * kMiB) == CUDA_SUCCESS);
  CHECK(all_bytes(b, 7000, 0x5B));
  REQUIRE(cuMemFree(m) == CUDA_SUCCESS);
  CHECK(cuMemFree(b) == CUDA_SUCCESS);
}

TEST_CASE("cadv: interior, foreign, stale and pending pointers are refused without side effects", "[cadv_badfree]") {
  make_context();
  touch_interposer();
  CUdeviceptr small = 0, big = 0;
  REQUIRE(cuMemAlloc(&small, 4096) == CUDA_SUCCESS);
  REQUIRE(cuMemAlloc(&big, 5 * kMiB) == CUDA_SUCCESS);
  const Snap s0 = snap();
  const size_t live0 = fakecuda_live_bytes(0);
  CHECK(cuMemFree(small + 512) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemFree(small + 1) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemFree(big + 2 * kMiB) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemFree(big + 5 * kMiB + 512) == CUDA_ERROR_INVALID_VALUE);  // in the 6 MiB segment, past the block
  CHECK(cuMemFree(small + 2 * kMiB - 512) == CUDA_ERROR_INVALID_VALUE);  // uncarved tail of the slab (if same slab)
  CHECK(cuMemFree(0x1234000) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemFree(~CUdeviceptr{0} - 4095) == CUDA_ERROR_INVALID_VALUE);
  CUstream s = nullptr;
  REQUIRE(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  CHECK(cuMemFreeAsync(small + 512, s) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemFreeAsync(big + 512, s) == CUDA_ERROR_INVALID_VALUE);
  const Snap s1 = snap();
  CHECK(s1.used == s0.used);
  CHECK(s1.reserved == s0.reserved);
  CHECK(s1.cached == s0.cached);
  CHECK(s1.live == s0.live);
  CHECK(fakecuda_live_bytes(0) == live0);
  // A pending block (work still queued) freed twice.
  REQUIRE(slow_fill(s, small, 0xEE, 4096, 200) == CUDA_SUCCESS);
  REQUIRE(cuMemFree(small) == CUDA_SUCCESS);
  CHECK(cuMemFree(small) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemFreeAsync(small, s) == CUDA_ERROR_INVALID_VALUE);
  // Freed through cuMemFreeAsync, then freed again with cuMemFree.
  REQUIRE(cuMemFreeAsync(big, s) == CUDA_SUCCESS);
  CHECK(cuMemFreeAsync(big, s) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemFree(big) == CUDA_ERROR_INVALID_VALUE);
  REQUIRE(cuStreamSynchronize(s) == CUDA_SUCCESS);
  CHECK(snap().live == s0.live - 2);
  REQUIRE(cuStreamDestroy(s) == CUDA_SUCCESS);
}

// ---- sizes ---------------------------------------------------------------------------------

TEST_CASE("cadv: zero, null and enormous sizes", "[cadv_sizes]") {
  make_context();
  touch_interposer();
  const Snap s0 = snap();
  CUdeviceptr p = 0;
  CHECK(cuMemAlloc(&p, 0) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemAlloc(nullptr, 4096) == CUDA_ERROR_INVALID_VALUE);
  const size_t kMax = ~size_t{0};
  for (size_t n : {kMax, kMax - 1, kMax - 511, kMax - (2 * kMiB) + 2, kMax - (2 * kMiB) + 1, kMax - (4 * kMiB),
                   size_t{1} << 63, size_t{1} << 40, size_t{kAdvCap} + 1, size_t{1} << 30, (size_t{1} << 30) + 1}) {
    INFO("bytes " << n);
    p = 0xdead;
    CHECK(cuMemAlloc(&p, n) == CUDA_ERROR_OUT_OF_MEMORY);
    const Snap s = snap();
    CHECK(s.live == s0.live);
    CHECK(s.used - s.cached == s0.used - s0.cached);  // in use unchanged
    CHECK(s.used <= kAdvCap);
  }
  // Boundaries of the size classes and the packing limit.
  for (size_t n : {size_t{1}, size_t{511}, size_t{512}, size_t{513}, size_t{2048}, size_t{2049}, size_t{kMiB - 1},
                   size_t{kMiB}, size_t{kMiB + 1}, size_t{2 * kMiB}, size_t{2 * kMiB + 1}}) {
    INFO("bytes " << n);
    REQUIRE(cuMemAlloc(&p, n) == CUDA_SUCCESS);
    CUdeviceptr base = 0;
    size_t size = 0;
    REQUIRE(cuMemGetAddressRange(&base, &size, p + n - 1) == CUDA_SUCCESS);
    CHECK(base == p);
    CHECK(size == n);
    CHECK(cuMemGetAddressRange(&base, &size, p + n) != CUDA_SUCCESS);  // one past: not this allocation
    REQUIRE(cuMemsetD8(p, 0x42, n) == CUDA_SUCCESS);
    REQUIRE(cuMemFree(p) == CUDA_SUCCESS);
  }
  CHECK(snap().live == s0.live);
}

// ---- the cap ---------------------------------------------------------------------------------

namespace {
/// Fill the cache with 200 MiB of freed, ready memory (the cap is 256 MiB).
void fill_cache_200() {
  CUdeviceptr p = 0;
  REQUIRE(cuMemAlloc(&p, 200 * kMiB) == CUDA_SUCCESS);
  REQUIRE(cuMemsetD8(p, 1, 200 * kMiB) == CUDA_SUCCESS);
  REQUIRE(cuMemFree(p) == CUDA_SUCCESS);
  REQUIRE(cuCtxSynchronize() == CUDA_SUCCESS);
  CHECK(dev_counters().cached.load() >= 200 * kMiB);
}
}  // namespace

TEST_CASE("cadv: an allocation the cache does not serve is not refused while the cache keeps free memory",
          "[cadv_cap_other]") {
  make_context();
  touch_interposer();
  auto& d = dev_counters();
  REQUIRE(d.limit.load() == kAdvCap);
  const uint64_t refusals0 = d.refusals.load();
  size_t f = 0, t = 0;
  SECTION("cuMemAllocAsync") {
    fill_cache_200();
    REQUIRE(cuMemGetInfo(&f, &t) == CUDA_SUCCESS);
    CHECK(f >= 200 * kMiB);  // the program is told the memory is free
    CUdeviceptr a = 0;
    CHECK(cuMemAllocAsync(&a, 100 * kMiB, CU_STREAM_LEGACY) == CUDA_SUCCESS);
    if (a) REQUIRE(cuMemFreeAsync(a, CU_STREAM_LEGACY) == CUDA_SUCCESS);
  }
  SECTION("cuMemAllocPitch") {
    fill_cache_200();
    CUdeviceptr a = 0;
    size_t pitch = 0;
    CHECK(cuMemAllocPitch(&a, &pitch, 1024 * 1024, 100, 4) == CUDA_SUCCESS);
    if (a) REQUIRE(cuMemFree(a) == CUDA_SUCCESS);
  }
  SECTION("cuMemAllocManaged") {
    fill_cache_200();
    CUdeviceptr a = 0;
    CHECK(cuMemAllocManaged(&a, 100 * kMiB, CU_MEM_ATTACH_GLOBAL) == CUDA_SUCCESS);
    if (a) REQUIRE(cuMemFree(a) == CUDA_SUCCESS);
  }
  SECTION("cuMemAlloc in a second context of the same device") {
    CUcontext primary = nullptr;
    REQUIRE(cuCtxGetCurrent(&primary) == CUDA_SUCCESS);
    fill_cache_200();
    CUcontext other = nullptr;
    CUdevice dev = 0;
    REQUIRE(cuDeviceGet(&dev, 0) == CUDA_SUCCESS);
    REQUIRE(cuCtxCreate(&other, nullptr, 0, dev) == CUDA_SUCCESS);
    CUdeviceptr a = 0;
    CHECK(cuMemAlloc(&a, 100 * kMiB) == CUDA_SUCCESS);
    if (a) REQUIRE(cuMemFree(a) == CUDA_SUCCESS);
    REQUIRE(cuCtxDestroy(other) == CUDA_SUCCESS);
    REQUIRE(cuCtxSetCurrent(primary) == CUDA_SUCCESS);
  }
  CHECK(d.refusals.load() == refusals0);
}

// ---- contexts --------------------------------------------------------------------------------

TEST_CASE("cadv: a cuCtxDestroy the driver refuses (primary context) does not make the cache forget live blocks",
          "[cadv_ctxdestroy_fail]") {
  make_context();
  touch_interposer();
  CUcontext primary = nullptr;
  REQUIRE(cuCtxGetCurrent(&primary) == CUDA_SUCCESS);
  const Snap s0 = snap();
  CUdeviceptr a = 0, b = 0;
  REQUIRE(cuMemAlloc(&a, 9000) == CUDA_SUCCESS);  // a fresh class: a = slab base
  REQUIRE(cuMemAlloc(&b, 9000) == CUDA_SUCCESS);
  const CUresult r = cuCtxDestroy(primary);
  INFO("cuCtxDestroy(primary) = " << r);
  REQUIRE(r != CUDA_SUCCESS);  // the driver refused: the context and its memory are still there
  REQUIRE(cuCtxSetCurrent(primary) == CUDA_SUCCESS);
  CHECK(snap().live == s0.live + 2);
  CHECK(cuMemFree(b) == CUDA_SUCCESS);
  CHECK(cuMemFree(a) == CUDA_SUCCESS);
  CHECK(snap().live == s0.live);
}

TEST_CASE("cadv: many created contexts with live and pending blocks, destroyed; counters return to baseline",
          "[cadv_ctx_many]") {
  make_context();
  touch_interposer();
  CUcontext primary = nullptr;
  REQUIRE(cuCtxGetCurrent(&primary) == CUDA_SUCCESS);
  const Snap base0 = snap(), base1 = snap(1);
  std::atomic<int> bad{0};
  std::vector<std::thread> th;
  for (int t = 0; t < 4; ++t) {
    th.emplace_back([&, t] {
      std::mt19937 rng(t);
      for (int round = 0; round < 14; ++round) {  // 56 contexts, at most 4 at once
        CUdevice dev = 0;
        if (cuDeviceGet(&dev, (t + round) % 2) != CUDA_SUCCESS) ++bad;
        CUcontext c = nullptr;
        if (cuCtxCreate(&c, nullptr, 0, dev) != CUDA_SUCCESS) {
          ++bad;
          continue;
        }
        CUstream s = nullptr;
        if (cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) ++bad;
        std::vector<CUdeviceptr> ps;
        for (int i = 0; i < 30; ++i) {
          CUdeviceptr p = 0;
          const size_t n = i == 0 ? 3 * kMiB : 1 + rng() % 4096;
          if (cuMemAlloc(&p, n) != CUDA_SUCCESS) {
            ++bad;
            continue;
          }
          ps.push_back(p);
        }
        // Some freed while work is queued (pending), some freed at once, some left live.
        for (size_t i = 0; i < ps.size(); ++i) {
          if (i % 3 == 0) {
            if (slow_fill(s, ps[i], 1, 16, 1) != CUDA_SUCCESS) ++bad;
            if (cuMemFree(ps[i]) != CUDA_SUCCESS) ++bad;
          } else if (i % 3 == 1) {
            if (cuMemFreeAsync(ps[i], s) != CUDA_SUCCESS) ++bad;
          }
        }
        if (round % 2 == 0 && cuStreamDestroy(s) != CUDA_SUCCESS) ++bad;  // pending frees behind it
        if (cuCtxDestroy(c) != CUDA_SUCCESS) ++bad;
      }
    });
  }
  for (auto& x : th) x.join();
  CHECK(bad.load() == 0);
  REQUIRE(cuCtxSetCurrent(primary) == CUDA_SUCCESS);
  for (int o = 0; o < 2; ++o) {
    INFO("device " << o);
    const Snap s = snap(o), b = o ? base1 : base0;
    CHECK(s.live == b.live);
    CHECK(s.used == b.used);
    CHECK(s.reserved == b.reserved);
    CHECK(s.cached == b.cached);
  }
  // 56 contexts came and went: the cache still serves the primary context (not the driver).
  auto& d = dev_counters();
  const uint64_t hits0 = d.pool_hits.load();
  for (int i = 0; i < 10; ++i) {
    CUdeviceptr p = 0;
    REQUIRE(cuMemAlloc(&p, 4096) == CUDA_SUCCESS);
    REQUIRE(cuMemFree(p) == CUDA_SUCCESS);
  }
  CHECK(d.pool_hits.load() > hits0);
  // New contexts after that still get a cache.
  CUcontext c = nullptr;
  CUdevice dev = 0;
  REQUIRE(cuDeviceGet(&dev, 0) == CUDA_SUCCESS);
  REQUIRE(cuCtxCreate(&c, nullptr, 0, dev) == CUDA_SUCCESS);
  const uint64_t h1 = d.pool_hits.load();
  for (int i = 0; i < 10; ++i) {
    CUdeviceptr p = 0;
    REQUIRE(cuMemAlloc(&p, 4096) == CUDA_SUCCESS);
    REQUIRE(cuMemFree(p) == CUDA_SUCCESS);
  }
  CHECK(d.pool_hits.load() > h1);
  REQUIRE(cuCtxDestroy(c) == CUDA_SUCCESS);
  REQUIRE(cuCtxSetCurrent(primary) == CUDA_SUCCESS);
}

// ---- streams and pending work ---------------------------------------------------------------

TEST_CASE("cadv: a destroyed blocking stream's queued work still holds back blocks freed after the destroy",
          "[cadv_blocking_destroy]") {
  make_context();
  touch_interposer();
  CUstream s = nullptr;
  REQUIRE(cuStreamCreate(&s, CU_STREAM_DEFAULT) == CUDA_SUCCESS);
  CUdeviceptr p = 0;
  REQUIRE(cuMemAlloc(&p, 8192) == CUDA_SUCCESS);
  std::atomic<bool> written{false};
  REQUIRE(slow_fill(s, p, 0xEE, 8192, 300, &written) == CUDA_SUCCESS);
  REQUIRE(cuStreamDestroy(s) == CUDA_SUCCESS);
  REQUIRE(cuMemFree(p) == CUDA_SUCCESS);
  bool early = false;
  std::vector<CUdeviceptr> got;
  for (int i = 0; i < 200; ++i) {
    CUdeviceptr q = 0;
    REQUIRE(cuMemAlloc(&q, 8192) == CUDA_SUCCESS);
    if (q == p && !written.load()) early = true;
    REQUIRE(cuMemsetD8(q, 0x33, 8192) == CUDA_SUCCESS);
    got.push_back(q);
  }
  while (!written.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  CHECK_FALSE(early);
  int intact = 0;
  for (CUdeviceptr q : got) intact += all_bytes(q, 8192, 0x33) ? 1 : 0;
  CHECK(intact == 200);
  for (CUdeviceptr q : got) REQUIRE(cuMemFree(q) == CUDA_SUCCESS);
}

TEST_CASE("cadv: a host callback (cuStreamAddCallback) still queued holds back reuse", "[cadv_callback]") {
  make_context();
  touch_interposer();
  CUstream s = nullptr;
  REQUIRE(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  // Reach the idle state (no work since a completed event).
  for (int i = 0; i < 200; ++i) {
    CUdeviceptr p = 0;
    REQUIRE(cuMemAlloc(&p, 4096) == CUDA_SUCCESS);
    REQUIRE(cuMemFree(p) == CUDA_SUCCESS);
  }
  CUdeviceptr p = 0;
  REQUIRE(cuMemAlloc(&p, 4096) == CUDA_SUCCESS);
  static std::atomic<bool> written{false};
  static CUdeviceptr target = 0;
  target = p;
  REQUIRE(cuStreamAddCallback(
              s,
              [](CUstream, CUresult, void*) {
                std::this_thread::sleep_for(std::chrono::milliseconds(300));
                std::memset(reinterpret_cast<void*>(target), 0xEE, 4096);
                written.store(true);
              },
              nullptr, 0) == CUDA_SUCCESS);
  REQUIRE(cuMemFree(p) == CUDA_SUCCESS);
  CUdeviceptr q = 0;
  REQUIRE(cuMemAlloc(&q, 4096) == CUDA_SUCCESS);
  const bool early = q == p && !written.load();
  CHECK_FALSE(early);
  REQUIRE(cuStreamSynchronize(s) == CUDA_SUCCESS);
  REQUIRE(cuMemFree(q) == CUDA_SUCCESS);
  REQUIRE(cuStreamDestroy(s) == CUDA_SUCCESS);
}

TEST_CASE("cadv: cuMemFreeAsync of pooled blocks with queued work on various streams is never reused early",
          "[cadv_freeasync_pending]") {
  make_context();
  touch_interposer();
  CUstream nb = nullptr, bl = nullptr;
  REQUIRE(cuStreamCreate(&nb, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  REQUIRE(cuStreamCreate(&bl, CU_STREAM_DEFAULT) == CUDA_SUCCESS);
  for (CUstream work : {nb, bl, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD}) {
    for (CUstream freer : {nb, bl, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD}) {
      INFO("work " << work << " free on " << freer);
      for (size_t n : {size_t{4096}, size_t{3 * kMiB}}) {
        CUdeviceptr p = 0;
        REQUIRE(cuMemAlloc(&p, n) == CUDA_SUCCESS);
        std::atomic<bool> done{false};
        REQUIRE(slow_fill(work, p, 0xEE, n, 50, &done) == CUDA_SUCCESS);
        REQUIRE(cuMemFreeAsync(p, freer) == CUDA_SUCCESS);
        std::vector<CUdeviceptr> got;
        bool early = false;
        for (int i = 0; i < 40; ++i) {
          CUdeviceptr q = 0;
          REQUIRE(cuMemAlloc(&q, n) == CUDA_SUCCESS);
          if (q == p && !done.load()) early = true;
          got.push_back(q);
        }
        CHECK_FALSE(early);
        while (!done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(2));
        for (CUdeviceptr q : got) REQUIRE(cuMemFree(q) == CUDA_SUCCESS);
      }
    }
  }
  REQUIRE(cuCtxSynchronize() == CUDA_SUCCESS);
  REQUIRE(cuStreamDestroy(nb) == CUDA_SUCCESS);
  REQUIRE(cuStreamDestroy(bl) == CUDA_SUCCESS);
}

// ---- captures --------------------------------------------------------------------------------

TEST_CASE("cadv: destroying a stream during another stream's capture records no event", "[cadv_capture_destroy]") {
  make_context();
  touch_interposer();
  CUstream s1 = nullptr, s2 = nullptr;
  REQUIRE(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  REQUIRE(cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  CUdeviceptr p = 0;
  REQUIRE(cuMemAlloc(&p, 4096) == CUDA_SUCCESS);
  REQUIRE(cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
  fakecuda_reset_counters();
  REQUIRE(cuStreamDestroy(s2) == CUDA_SUCCESS);
  for (const char* fn : {"cuEventRecord", "cuEventQuery", "cuEventSynchronize", "cuStreamSynchronize"}) {
    INFO(fn);
    CHECK(fakecuda_call_count(fn) == 0);
  }
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  REQUIRE(cuStreamIsCapturing(s1, &st) == CUDA_SUCCESS);
  CHECK(st == CU_STREAM_CAPTURE_STATUS_ACTIVE);
  CUgraph g = nullptr;
  CHECK(cuStreamEndCapture(s1, &g) == CUDA_SUCCESS);
  if (g) cuGraphDestroy(g);
  REQUIRE(cuMemFree(p) == CUDA_SUCCESS);
  REQUIRE(cuStreamDestroy(s1) == CUDA_SUCCESS);
}

TEST_CASE("cadv: work queued on a stream destroyed during a capture still holds back reuse after it",
          "[cadv_capture_destroy]") {
  make_context();
  touch_interposer();
  CUstream s1 = nullptr, s2 = nullptr;
  REQUIRE(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  REQUIRE(cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  // Reach the idle state (no work since a completed event), so that only s2's work is pending.
  for (int i = 0; i < 200; ++i) {
    CUdeviceptr q = 0;
    REQUIRE(cuMemAlloc(&q, 8192) == CUDA_SUCCESS);
    REQUIRE(cuMemFree(q) == CUDA_SUCCESS);
  }
  CUdeviceptr p = 0;
  REQUIRE(cuMemAlloc(&p, 8192) == CUDA_SUCCESS);
  std::atomic<bool> written{false};
  REQUIRE(slow_fill(s2, p, 0xEE, 8192, 300, &written) == CUDA_SUCCESS);
  // s2 dies while s1 captures: no event can be recorded on it then.
  REQUIRE(cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
  REQUIRE(cuStreamDestroy(s2) == CUDA_SUCCESS);
  CUgraph g = nullptr;
  REQUIRE(cuStreamEndCapture(s1, &g) == CUDA_SUCCESS);
  if (g) cuGraphDestroy(g);
  // Freed after the capture: its fill (queued before the free, on the dead stream) may not
  // land in a block handed out again.
  REQUIRE(cuMemFree(p) == CUDA_SUCCESS);
  bool early = false;
  std::vector<CUdeviceptr> got;
  for (int i = 0; i < 200; ++i) {
    CUdeviceptr q = 0;
    REQUIRE(cuMemAlloc(&q, 8192) == CUDA_SUCCESS);
    if (q == p && !written.load()) early = true;
    REQUIRE(cuMemsetD8(q, 0x33, 8192) == CUDA_SUCCESS);
    got.push_back(q);
  }
  while (!written.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  CHECK_FALSE(early);
  int intact = 0;
  for (CUdeviceptr q : got) intact += all_bytes(q, 8192, 0x33) ? 1 : 0;
  CHECK(intact == 200);
  for (CUdeviceptr q : got) REQUIRE(cuMemFree(q) == CUDA_SUCCESS);
  REQUIRE(cuStreamDestroy(s1) == CUDA_SUCCESS);
}

TEST_CASE("cadv: cap pressure during a capture gives nothing back to the driver (no cuMemFree during capture)",
          "[cadv_capture_cap]") {
  make_context();
  touch_interposer();
  auto& d = dev_counters();
  CUstream s = nullptr;
  REQUIRE(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  fill_cache_200();
  settle();
  const auto mode = static_cast<CUstreamCaptureMode>(GENERATE(int{CU_STREAM_CAPTURE_MODE_RELAXED}, int{CU_STREAM_CAPTURE_MODE_GLOBAL}));
  INFO("mode " << mode);
  REQUIRE(cuStreamBeginCapture(s, mode) == CUDA_SUCCESS);
  fakecuda_reset_counters();
  CUdeviceptr p = 0;
  const CUresult r = cuMemAlloc(&p, 100 * kMiB);
  INFO("cuMemAlloc during capture = " << r);
  CHECK(fakecuda_call_count("cuMemFree") == 0);
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  REQUIRE(cuStreamIsCapturing(s, &st) == CUDA_SUCCESS);
  CUgraph g = nullptr;
  cuStreamEndCapture(s, &g);
  if (g) cuGraphDestroy(g);
  if (r == CUDA_SUCCESS) REQUIRE(cuMemFree(p) == CUDA_SUCCESS);
  // Whatever happened, the counters match what the driver holds (nothing else is allocated).
  CHECK(d.reserved.load() == fakecuda_live_bytes(0));
  CHECK(d.used.load() == fakecuda_live_bytes(0));
  REQUIRE(cuStreamDestroy(s) == CUDA_SUCCESS);
}

// ---- queries and IPC ------------------------------------------------------------------------

TEST_CASE("cadv: a reused whole block answers range queries with the new request's size", "[cadv_query]") {
  make_context();
  touch_interposer();
  CUdeviceptr p = 0;
  REQUIRE(cuMemAlloc(&p, 8 * kMiB) == CUDA_SUCCESS);
  REQUIRE(cuMemFree(p) == CUDA_SUCCESS);
  settle();
  CUdeviceptr q = 0;
  REQUIRE(cuMemAlloc(&q, 7 * kMiB) == CUDA_SUCCESS);
  INFO("p " << std::hex << p << " q " << q);
  CUdeviceptr base = 0;
  size_t size = 0;
  REQUIRE(cuMemGetAddressRange(&base, &size, q) == CUDA_SUCCESS);
  CHECK(base == q);
  CHECK(size == 7 * kMiB);
  CHECK(cuMemGetAddressRange(&base, &size, q + 7 * kMiB) == CUDA_ERROR_NOT_FOUND);
  size_t rsize = 0;
  REQUIRE(cuPointerGetAttribute(&rsize, CU_POINTER_ATTRIBUTE_RANGE_SIZE, q + 7 * kMiB - 1) == CUDA_SUCCESS);
  CHECK(rsize == 7 * kMiB);
  // The handle names the block's own driver allocation: the request rounded to 2 MiB (the
  // driver's own granularity for a 7 MiB cuMemAlloc), no other allocation's bytes.
  CUipcMemHandle h{};
  REQUIRE(cuIpcGetMemHandle(&h, q) == CUDA_SUCCESS);
  CUdeviceptr hb = 0;
  size_t hs = 0;
  REQUIRE(fakecuda_ipc_handle_range(&h, &hb, &hs) == 0);
  CHECK(hb == q);
  CHECK(hs == 8 * kMiB);
  REQUIRE(cuMemFree(q) == CUDA_SUCCESS);
}

// ---- addresses given back while other threads allocate -----------------------------------

namespace {
/// An allocation another thread got at addresses a pool was letting go of: its result, then
/// its range query and free (from whichever thread calls query_and_free).
struct NewOwner {
  CUdeviceptr p = 0, base = 0;
  size_t bytes = 0;
  CUresult made = CUDA_ERROR_UNKNOWN, ranged = CUDA_ERROR_UNKNOWN, freed = CUDA_ERROR_UNKNOWN;
  void query_and_free() {
    ranged = cuMemGetAddressRange(&base, &bytes, p);
    freed = cuMemFree(p);
  }
};

/// `o` got `at` (the simulated driver's arena is first-fit) and its query and free were its
/// own: the range is its `n` bytes, the free succeeded.
void check_new_owner(const NewOwner& o, CUdeviceptr at, size_t n) {
  REQUIRE(o.made == CUDA_SUCCESS);
  CHECK(o.p == at);
  CHECK(o.ranged == CUDA_SUCCESS);
  CHECK(o.base == o.p);
  CHECK(o.bytes == n);
  CHECK(o.freed == CUDA_SUCCESS);
}
}  // namespace

// The cache gives a free slab back (the cap wants room) and, between the driver's free and the
// cache's forgetting the slab, other threads get its addresses from the driver: a managed
// allocation, then another context's slab. Their frees and range queries are theirs, also
// from a thread whose cache is the one giving the slab back and is asked first (a refusal
// there, as a bad free of the cache's own memory, would leak the allocation).
TEST_CASE("cadv: a slab's addresses handed out again while the cache gives it back belong to their new owner",
          "[cadv_release_reuse]") {
  make_context();
  touch_interposer();
  CUcontext a = nullptr, b = nullptr;
  REQUIRE(cuCtxGetCurrent(&a) == CUDA_SUCCESS);
  CUdevice dev = 0;
  REQUIRE(cuDeviceGet(&dev, 0) == CUDA_SUCCESS);
  REQUIRE(cuCtxCreate(&b, nullptr, 0, dev) == CUDA_SUCCESS);
  REQUIRE(cuCtxSetCurrent(a) == CUDA_SUCCESS);
  const Snap s0 = snap();
  CUdeviceptr small = 0;
  REQUIRE(cuMemAlloc(&small, 512) == CUDA_SUCCESS);  // touch_interposer's block: the first of the only slab
  const CUdeviceptr slab = small;
  REQUIRE(cuMemFree(small) == CUDA_SUCCESS);

  NewOwner managed, other;
  Meanwhile m;
  m.work = [&] {
    // In context a: the driver hands the slab's first addresses to a managed allocation.
    std::thread([&] {
      if (cuCtxSetCurrent(a) != CUDA_SUCCESS) return;
      managed.made = cuMemAllocManaged(&managed.p, 4096, CU_MEM_ATTACH_GLOBAL);
      if (managed.made == CUDA_SUCCESS) managed.query_and_free();
    }).join();
    // Context b's cache makes a slab of its own there.
    std::thread([&] {
      if (cuCtxSetCurrent(b) == CUDA_SUCCESS) other.made = cuMemAlloc(&other.p, 4096);
    }).join();
    if (other.made != CUDA_SUCCESS) return;
    // A fresh thread in context a, whose cache is asked first.
    std::thread([&] {
      if (cuCtxSetCurrent(a) == CUDA_SUCCESS) other.query_and_free();
    }).join();
  };
  fakecuda_pause_in("cuMemFree freed", &Meanwhile::run, &m);
  // Past the 5 MiB cap with the free slab kept: the cache gives the slab back first.
  CUdeviceptr big = 0;
  const CUresult big_alloc = cuMemAlloc(&big, 3 * kMiB + kMiB / 2);
  m.join();
  fakecuda_pause_in(nullptr, nullptr, nullptr);
  REQUIRE(m.started.load());
  CHECK(big_alloc == CUDA_SUCCESS);
  check_new_owner(managed, slab, 4096);
  check_new_owner(other, slab, 4096);
  if (big_alloc == CUDA_SUCCESS) REQUIRE(cuMemFree(big) == CUDA_SUCCESS);
  const Snap s1 = snap();
  CHECK(s1.live == s0.live);
  CHECK(s1.used - s1.cached == s0.used - s0.cached);
  REQUIRE(cuCtxDestroy(b) == CUDA_SUCCESS);
}

namespace {
// Context b's cache makes a slab (its block `leave_live` or freed), then b is destroyed; the
// simulated driver pauses after the destroy, and another thread allocates managed memory
// (the arena's first fit: the slab's addresses) and frees it. The free and the counts must
// be the new owner's, whether or not a block of b's that was never freed starts there.
void destroy_reuse(bool leave_live) {
  make_context();
  touch_interposer();
  CUcontext a = nullptr, b = nullptr;
  REQUIRE(cuCtxGetCurrent(&a) == CUDA_SUCCESS);
  CUdevice dev = 0;
  REQUIRE(cuDeviceGet(&dev, 0) == CUDA_SUCCESS);
  const Snap s0 = snap();
  REQUIRE(cuCtxCreate(&b, nullptr, 0, dev) == CUDA_SUCCESS);  // current now
  CUdeviceptr in_b = 0;
  REQUIRE(cuMemAlloc(&in_b, 4096) == CUDA_SUCCESS);  // b's cache makes a slab: the arena's next addresses
  const CUdeviceptr slab = in_b;
  if (!leave_live) REQUIRE(cuMemFree(in_b) == CUDA_SUCCESS);
  REQUIRE(cuCtxSetCurrent(a) == CUDA_SUCCESS);

  NewOwner managed;
  Meanwhile m;
  m.work = [&] {
    if (cuCtxSetCurrent(a) != CUDA_SUCCESS) return;
    managed.made = cuMemAllocManaged(&managed.p, 4096, CU_MEM_ATTACH_GLOBAL);
    if (managed.made == CUDA_SUCCESS) managed.query_and_free();
  };
  fakecuda_pause_in("cuCtxDestroy destroyed", &Meanwhile::run, &m);
  REQUIRE(cuCtxDestroy(b) == CUDA_SUCCESS);
  m.join();
  fakecuda_pause_in(nullptr, nullptr, nullptr);
  REQUIRE(m.started.load());
  check_new_owner(managed, slab, 4096);  // (the destroyed context's slab was the lowest hole)
  // b's block, freed by the program or with its context, is counted freed; the managed
  // allocation too.
  const Snap s1 = snap();
  CHECK(s1.live == s0.live);
  CHECK(s1.used - s1.cached == s0.used - s0.cached);
}
}  // namespace

// The same while a context is destroyed: between the driver's destroy (which frees the
// context's memory) and the cache's forgetting that memory, another context's allocation at
// those addresses is freed from a thread that asks the dying cache too.
TEST_CASE("cadv: addresses of a context being destroyed handed out again belong to their new owner",
          "[cadv_destroy_reuse]") {
  destroy_reuse(false);
}

// ... also where a block the program never freed started (the context's destroy frees it).
TEST_CASE("cadv: addresses of a context being destroyed belong to their new owner over a block never freed",
          "[cadv_destroy_reuse_live]") {
  destroy_reuse(true);
}

// ---- churn with every API, threads and contexts ---------------------------------------------

TEST_CASE("cadv: no two live allocations overlap and data survives churn mixing every allocation API",
          "[cadv_churn]") {
  make_context();
  touch_interposer();
  CUcontext ctx0 = nullptr;
  REQUIRE(cuCtxGetCurrent(&ctx0) == CUDA_SUCCESS);
  make_context(1);
  CUcontext ctx1 = nullptr;
  REQUIRE(cuCtxGetCurrent(&ctx1) == CUDA_SUCCESS);
  REQUIRE(cuCtxSetCurrent(ctx0) == CUDA_SUCCESS);
  const Snap b0 = snap(0), b1 = snap(1);

  enum Kind { kPool, kPitch, kManaged, kAsync, kHost };
  struct Live {
    CUdeviceptr p;
    size_t n;
    unsigned char v;
    Kind k;
    CUcontext ctx;
  };
  std::mutex mu;
  std::map<CUdeviceptr, size_t> live_ranges;  // every live device allocation of every thread
  std::atomic<int> overlaps{0}, corrupt{0}, bad{0};
  std::string failed;  // which calls failed, for the report (under mu)
  auto fail = [&](const char* call, CUresult r, int kind, size_t n, CUdeviceptr p) {
    ++bad;
    std::lock_guard<std::mutex> g(mu);
    char line[160];
    std::snprintf(line, sizeof line, "%s -> %d (kind %d, %zu bytes at 0x%llx)\n", call, static_cast<int>(r), kind, n,
                  static_cast<unsigned long long>(p));
    if (failed.size() < 2000) failed += line;
  };
  auto add = [&](CUdeviceptr p, size_t n) {
    std::lock_guard<std::mutex> g(mu);
    auto it = live_ranges.upper_bound(p);
    if (it != live_ranges.end() && it->first < p + n) ++overlaps;
    if (it != live_ranges.begin()) {
      auto pr = std::prev(it);
      if (pr->first + pr->second > p) ++overlaps;
    }
    live_ranges[p] = n;
  };
  auto del = [&](CUdeviceptr p) {
    std::lock_guard<std::mutex> g(mu);
    live_ranges.erase(p);
  };
  std::vector<std::thread> th;
  for (int t = 0; t < 4; ++t) {
    th.emplace_back([&, t] {
      CUcontext my = t % 2 ? ctx1 : ctx0;
      if (cuCtxSetCurrent(my) != CUDA_SUCCESS) ++bad;
      CUstream streams[2] = {};
      if (cuStreamCreate(&streams[0], CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) ++bad;
      if (cuStreamCreate(&streams[1], CU_STREAM_DEFAULT) != CUDA_SUCCESS) ++bad;
      const CUstream all[4] = {streams[0], streams[1], CU_STREAM_LEGACY, CU_STREAM_PER_THREAD};
      std::mt19937_64 rng(1000 + t);
      std::vector<Live> live;
      auto verify_and_free = [&](size_t k) {
        Live l = live[k];
        live.erase(live.begin() + static_cast<long>(k));
        if (l.k != kHost) {
          std::vector<unsigned char> h(l.n);
          if (const CUresult e = cuMemcpyDtoH(h.data(), l.p, l.n); e != CUDA_SUCCESS) fail("cuMemcpyDtoH", e, l.k, l.n, l.p);
          for (size_t q = 0; q < h.size(); ++q)
            if (h[q] != l.v) {
              ++corrupt;
              std::fprintf(stderr, "CORRUPT kind %d n %zu at %zu: %02x want %02x p %llx\n", int(l.k), l.n, q, h[q], l.v, (unsigned long long)l.p);
              break;
            }
          del(l.p);
        }
        const CUstream s = all[rng() % 4];
        CUresult r = CUDA_SUCCESS;
        switch (l.k) {
          case kPool:
            if (rng() % 3 == 0) {
              if (slow_fill(s, l.p, 0xEE, l.n, rng() % 2) != CUDA_SUCCESS) ++bad;  // late write, then free
              r = rng() % 2 ? cuMemFreeAsync(l.p, all[rng() % 4]) : cuMemFree(l.p);
            } else {
              r = cuMemFree(l.p);
            }
            break;
          case kPitch:
          case kManaged: r = cuMemFree(l.p); break;
          case kAsync: r = cuMemFreeAsync(l.p, s); break;
          case kHost: r = cuMemFreeHost(reinterpret_cast<void*>(l.p)); break;
        }
        if (r != CUDA_SUCCESS) fail("free", r, l.k, l.n, l.p);
      };
      for (int i = 0; i < 1200; ++i) {
        if (live.size() < 20 && (live.empty() || rng() % 2)) {
          const uint64_t r = rng() % 100;
          size_t n = r < 50 ? 1 + rng() % 20000 : r < 80 ? 20000 + rng() % kMiB : 2 * kMiB + rng() % (5 * kMiB);
          if (rng() % 10 == 0) n = std::vector<size_t>{1, 512, 513, kMiB, kMiB + 1, 2 * kMiB, 2 * kMiB + 1}[rng() % 7];
          const unsigned char v = static_cast<unsigned char>(1 + (t * 37 + i) % 200);
          const Kind k = rng() % 10 < 6 ? kPool : static_cast<Kind>(rng() % 4 + 1);
          CUdeviceptr p = 0;
          CUresult res = CUDA_SUCCESS;
          size_t span = n;
          switch (k) {
            case kPool: res = cuMemAlloc(&p, n); break;
            case kPitch: {
              size_t pitch = 0;
              res = cuMemAllocPitch(&p, &pitch, n % 4096 + 16, 4, 4);
              span = n = pitch * 4;
              break;
            }
            case kManaged: res = cuMemAllocManaged(&p, n, CU_MEM_ATTACH_GLOBAL); break;
            case kAsync: res = cuMemAllocAsync(&p, n, all[rng() % 4]); break;
            case kHost: {
              void* h = nullptr;
              res = cuMemHostAlloc(&h, n, 0);
              p = reinterpret_cast<CUdeviceptr>(h);
              break;
            }
          }
          if (res != CUDA_SUCCESS) {
            fail("allocation", res, k, n, 0);
            continue;
          }
          if (k != kHost) {
            add(p, span);
            if (const CUresult e = cuMemsetD8(p, v, n); e != CUDA_SUCCESS) fail("cuMemsetD8", e, k, n, p);
          }
          live.push_back({p, n, v, k, my});
        } else {
          verify_and_free(rng() % live.size());
        }
        if (i % 200 == 199) {
          for (CUstream s : all)
            if (cuStreamSynchronize(s) != CUDA_SUCCESS) ++bad;
        }
      }
      for (CUstream s : all)
        if (cuStreamSynchronize(s) != CUDA_SUCCESS) ++bad;
      while (!live.empty()) verify_and_free(live.size() - 1);
      for (CUstream s : all)
        if (cuStreamSynchronize(s) != CUDA_SUCCESS) ++bad;
      for (CUstream s : streams)
        if (cuStreamDestroy(s) != CUDA_SUCCESS) ++bad;
    });
  }
  for (auto& x : th) x.join();
  {
    INFO(failed);
    CHECK(bad.load() == 0);
  }
  CHECK(overlaps.load() == 0);
  CHECK(corrupt.load() == 0);
  for (int o = 0; o < 2; ++o) {
    INFO("device " << o);
    const Snap s = snap(o), b = o ? b1 : b0;
    CHECK(s.live == b.live);
    // In use (what the program holds) back to where it was; the pools' reserve may remain.
    INFO("used " << s.used << " cached " << s.cached << " reserved " << s.reserved);
    CHECK(s.cached <= s.used);
    CHECK(s.used - s.cached == b.used - b.cached);
  }
}

TEST_CASE("cadv: contexts created and destroyed one after another keep getting a cache", "[cadv_ctx_slots]") {
  make_context();
  touch_interposer();
  CUcontext primary = nullptr;
  REQUIRE(cuCtxGetCurrent(&primary) == CUDA_SUCCESS);
  CUdevice dev = 0;
  REQUIRE(cuDeviceGet(&dev, 0) == CUDA_SUCCESS);
  auto& d = dev_counters();
  const Snap s0 = snap();
  int no_cache = -1;
  for (int i = 0; i < 80; ++i) {  // never more than two contexts alive at once
    CUcontext c = nullptr;
    REQUIRE(cuCtxCreate(&c, nullptr, 0, dev) == CUDA_SUCCESS);
    const uint64_t hits = d.pool_hits.load();
    CUdeviceptr p = 0, q = 0;
    REQUIRE(cuMemAlloc(&p, 4096) == CUDA_SUCCESS);
    REQUIRE(cuMemFree(p) == CUDA_SUCCESS);
    REQUIRE(cuMemAlloc(&q, 4096) == CUDA_SUCCESS);  // a cache serves this from what p left
    REQUIRE(cuMemFree(q) == CUDA_SUCCESS);
    if (d.pool_hits.load() == hits && no_cache < 0) no_cache = i;
    REQUIRE(cuCtxDestroy(c) == CUDA_SUCCESS);
  }
  INFO("first context without a cache: #" << no_cache);
  CHECK(no_cache == -1);
  REQUIRE(cuCtxSetCurrent(primary) == CUDA_SUCCESS);
  CHECK(snap().live == s0.live);
}

TEST_CASE("cadv: a primary context reset with live and pending blocks and tracked streams", "[cadv_reset_pending]") {
  make_context();
  touch_interposer();
  CUstream s = nullptr;
  REQUIRE(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  std::vector<CUdeviceptr> ps;
  for (int i = 0; i < 100; ++i) {
    CUdeviceptr p = 0;
    REQUIRE(cuMemAlloc(&p, i % 10 ? 4096 : 3 * kMiB) == CUDA_SUCCESS);
    ps.push_back(p);
  }
  for (int i = 0; i < 60; ++i) {
    REQUIRE(slow_fill(s, ps[i], 1, 16, 1) == CUDA_SUCCESS);
    REQUIRE(cuMemFree(ps[i]) == CUDA_SUCCESS);  // pending
  }
  REQUIRE(cuDevicePrimaryCtxReset(0) == CUDA_SUCCESS);
  const Snap z = snap();
  CHECK(z.live == 0);
  CHECK(z.used == 0);
  CHECK(z.reserved == 0);
  CHECK(z.cached == 0);
  // The stream handle died with the context; destroying it must not touch the forgotten cache.
  cuStreamDestroy(s);
  make_context();
  for (int i = 60; i < 100; ++i) CHECK(cuMemFree(ps[i]) != CUDA_SUCCESS);
  CUdeviceptr r = 0;
  REQUIRE(cuMemAlloc(&r, 4096) == CUDA_SUCCESS);
  REQUIRE(cuMemFree(r) == CUDA_SUCCESS);
  CHECK(snap().live == 0);
  CHECK(snap().used == snap().reserved);
}

TEST_CASE("cadv: freeing an exported whole block during a capture", "[cadv_ipc_capture]") {
  make_context();
  touch_interposer();
  auto& d = dev_counters();
  CUstream s = nullptr;
  REQUIRE(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  CUdeviceptr big = 0;
  REQUIRE(cuMemAlloc(&big, 8 * kMiB) == CUDA_SUCCESS);
  CUipcMemHandle h{};
  REQUIRE(cuIpcGetMemHandle(&h, big) == CUDA_SUCCESS);
  REQUIRE(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
  const CUresult r = cuMemFree(big);
  INFO("cuMemFree during capture = " << r);
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  REQUIRE(cuStreamIsCapturing(s, &st) == CUDA_SUCCESS);
  CUgraph g = nullptr;
  cuStreamEndCapture(s, &g);
  if (g) cuGraphDestroy(g);
  // Either the free failed as the driver's would (and the block is still the program's), or it
  // happened: in both cases the counters match what the driver holds.
  if (r != CUDA_SUCCESS) CHECK(cuMemFree(big) == CUDA_SUCCESS);
  CHECK(d.reserved.load() == fakecuda_live_bytes(0));
  CHECK(d.used.load() == fakecuda_live_bytes(0));
  REQUIRE(cuStreamDestroy(s) == CUDA_SUCCESS);
}

TEST_CASE("cadv: the primary context's last release makes the cache forget what the driver freed with it",
          "[cadv_primary_release]") {
  make_context();  // the process's one reference to device 0's primary context
  touch_interposer();
  const Snap s0 = snap();
  CUdeviceptr a = 0, big = 0;
  REQUIRE(cuMemAlloc(&a, 4096) == CUDA_SUCCESS);
  REQUIRE(cuMemAlloc(&big, 8 * kMiB) == CUDA_SUCCESS);
  CUdevice dev = 0;
  REQUIRE(cuDeviceGet(&dev, 0) == CUDA_SUCCESS);
  // Another reference, released: the context stays, and so do the cache's blocks.
  CUcontext again = nullptr;
  REQUIRE(cuDevicePrimaryCtxRetain(&again, dev) == CUDA_SUCCESS);
  REQUIRE(cuDevicePrimaryCtxRelease(dev) == CUDA_SUCCESS);
  CHECK(snap().live == s0.live + 2);
  CHECK(snap().used > s0.used);
  // The last one: the driver destroys the context with its memory; the cache forgets it.
  REQUIRE(cuDevicePrimaryCtxRelease(dev) == CUDA_SUCCESS);
  // Everything the process held on device 0 was the cache's (the blocks, and the slab of
  // touch_interposer's allocation, cached): all of it went with the context.
  const Snap s1 = snap();
  CHECK(s1.live == s0.live);
  CHECK(s0.used == s0.cached);
  CHECK(s1.used == 0);
  CHECK(s1.reserved == 0);
  CHECK(s1.cached == 0);
  // Retained anew: a cache of its own, which works.
  make_context();
  CUdeviceptr b = 0;
  REQUIRE(cuMemAlloc(&b, 4096) == CUDA_SUCCESS);
  CHECK(snap().live == s0.live + 1);
  REQUIRE(cuMemFree(b) == CUDA_SUCCESS);
  CHECK(snap().live == s0.live);
}

// Registered with 256 MiB of simulated device memory and no cap.
TEST_CASE("cadv: the driver out of memory in one context gets back what another context's cache keeps",
          "[cadv_driver_oom]") {
  make_context();
  touch_interposer();
  auto& d = dev_counters();
  CUcontext primary = nullptr;
  REQUIRE(cuCtxGetCurrent(&primary) == CUDA_SUCCESS);
  CUdeviceptr big = 0;
  REQUIRE(cuMemAlloc(&big, 200 * kMiB) == CUDA_SUCCESS);
  REQUIRE(cuMemFree(big) == CUDA_SUCCESS);  // kept by the primary context's cache
  CHECK(d.cached.load() >= 200 * kMiB);
  const uint64_t errors0 = d.driver_errors.load();
  CUdevice dev = 0;
  REQUIRE(cuDeviceGet(&dev, 0) == CUDA_SUCCESS);
  CUcontext other = nullptr;
  REQUIRE(cuCtxCreate(&other, nullptr, 0, dev) == CUDA_SUCCESS);
  CUdeviceptr p = 0;
  CHECK(cuMemAlloc(&p, 200 * kMiB) == CUDA_SUCCESS);  // only after the primary's cache gave its block back
  CHECK(d.driver_errors.load() == errors0);           // the first, failed try is not counted
  if (p) REQUIRE(cuMemFree(p) == CUDA_SUCCESS);
  // Past what the device has at all: refused by the driver, counted once.
  CUdeviceptr q = 0;
  CHECK(cuMemAlloc(&q, 512 * kMiB) == CUDA_ERROR_OUT_OF_MEMORY);
  CHECK(d.driver_errors.load() == errors0 + 1);
  REQUIRE(cuCtxDestroy(other) == CUDA_SUCCESS);
  REQUIRE(cuCtxSetCurrent(primary) == CUDA_SUCCESS);
}

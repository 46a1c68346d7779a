// Interposer tests: what the `vmm` layout adds to the pool (CUWARDEN_POOL=vmm), on the
// simulated driver (granules of 2 MiB, as on the H200). The promises both pooled backends
// keep (cudaFree's, captures, caps, contexts, pointer queries) are test_cache.cpp's and
// test_cache_adversarial.cpp's cases, which ctest runs under vmm too.
//
// Tags, each in its own process (tests/interposer/CMakeLists.txt): [vmm] (two 1 GiB devices,
// no cap), [vmm_cap] (a 64 MiB cap), [vmm_pack] (a 42 MiB cap), [vmm_pack_whole] (a 32 MiB
// cap), [vmm_keep] (no cap, CUWARDEN_POOL_KEEP=8M), [vmm_fallback] (a device without virtual
// memory management), [pool_idle] (under both pools, CUWARDEN_POOL_IDLE=1s).
#include <cstring>
#include <random>
#include <vector>

#include "fakecuda.h"
#include "support.hpp"

using namespace cuwtest;

namespace {

using cuwtest::kMiB;

/// Fills `n` bytes at `p` with `v` (synchronously).
void fill(CUdeviceptr p, size_t n, unsigned char v) { REQUIRE(cuMemsetD8(p, v, n) == CUDA_SUCCESS); }

uint64_t calls(const char* name) { return fakecuda_call_count(name); }

}  // namespace

TEST_CASE("vmm: a freed large block is split for smaller requests and merges back, with no driver call",
          "[vmm]") {
  make_context();
  touch_interposer();
  REQUIRE(reach_idle(64 * kMiB));  // frees retire at once (nothing queued on the GPU)
  CUdeviceptr a = 0;
  REQUIRE(cuMemAlloc(&a, 64 * kMiB) == CUDA_SUCCESS);
  REQUIRE(cuMemFree(a) == CUDA_SUCCESS);
  fakecuda_reset_counters();
  CUdeviceptr b1 = 0, b2 = 0, b3 = 0;
  REQUIRE(cuMemAlloc(&b1, 30 * kMiB) == CUDA_SUCCESS);
  REQUIRE(cuMemAlloc(&b2, 20 * kMiB) == CUDA_SUCCESS);
  REQUIRE(cuMemAlloc(&b3, 14 * kMiB) == CUDA_SUCCESS);
  // Three stretches of the one free block, in address order.
  CHECK(b1 == a);
  CHECK(b2 == a + 30 * kMiB);
  CHECK(b3 == a + 50 * kMiB);
  fill(b1, 30 * kMiB, 1);
  fill(b3, 14 * kMiB, 3);
  // Freed out of order, they merge into the one 64 MiB block again.
  REQUIRE(cuMemFree(b3) == CUDA_SUCCESS);
  REQUIRE(cuMemFree(b1) == CUDA_SUCCESS);
  REQUIRE(cuMemFree(b2) == CUDA_SUCCESS);
  CUdeviceptr c = 0;
  REQUIRE(cuMemAlloc(&c, 64 * kMiB) == CUDA_SUCCESS);
  CHECK(c == a);
  for (const char* f : {"cuMemCreate", "cuMemMap", "cuMemUnmap", "cuMemSetAccess", "cuMemAlloc"}) {
    INFO(f);
    CHECK(calls(f) == 0);
  }
  REQUIRE(cuMemFree(c) == CUDA_SUCCESS);
}

TEST_CASE("vmm: large blocks share granules: under a cap they fit where whole granules would not", "[vmm_pack]") {
  make_context();
  touch_interposer();
  auto& d = dev_counters();
  REQUIRE(d.limit.load() == 42 * kMiB);
  // Eight blocks of 5 MiB + 1000 bytes side by side: 40 MiB + 8 KiB in 21 granules of 2 MiB,
  // the cap; blocks of whole granules would need 48 MiB.
  constexpr size_t kBlock = 5 * kMiB + 1000;
  constexpr size_t kStep = 5 * kMiB + 1024;  // the next 512-byte boundary
  std::vector<CUdeviceptr> p(8);
  for (size_t i = 0; i < p.size(); ++i) {
    INFO("block " << i);
    REQUIRE(cuMemAlloc(&p[i], kBlock) == CUDA_SUCCESS);
    if (i) CHECK(p[i] == p[i - 1] + kStep);
    fill(p[i], kBlock, static_cast<unsigned char>(0x40 + i));
  }
  CHECK(d.used.load() == 42 * kMiB);
  CHECK(fakecuda_live_bytes(0) == 42 * kMiB);
  // Each answers for its own bytes, and its neighbours' writes left it as it was.
  auto live_intact = [&](size_t from) {
    for (size_t i = from; i < p.size(); i += from ? 2 : 1) {
      INFO("block " << i);
      CUdeviceptr base = 0;
      size_t size = 0;
      REQUIRE(cuMemGetAddressRange(&base, &size, p[i] + kBlock - 1) == CUDA_SUCCESS);
      CHECK(base == p[i]);
      CHECK(size == kBlock);
      CHECK(all_bytes(p[i], kBlock, static_cast<unsigned char>(0x40 + i)));
    }
  };
  live_intact(0);
  // Every other one freed: 20 MiB free in four pieces, none next to another. A piece gives
  // back only the whole granules inside it (its ends are mapped for its live neighbours):
  // 2 + 1 + 1 + 1 here. 10 MiB at once under the full cap: those five granules, unmapped and
  // mapped again as one stretch (with what is free at the top).
  for (size_t i = 0; i < p.size(); i += 2) REQUIRE(cuMemFree(p[i]) == CUDA_SUCCESS);
  // The fragmentation gauges: 20 MiB and more free, of which one request gets 10 MiB.
  CHECK(d.pool_free.load() >= 4 * kStep);
  CHECK(d.pool_largest_free.load() == 10 * kMiB);
  const uint64_t refusals = d.refusals.load();
  fakecuda_reset_counters();
  CUdeviceptr stitched = 0;
  REQUIRE(cuMemAlloc(&stitched, 10 * kMiB) == CUDA_SUCCESS);
  CHECK(calls("cuMemCreate") == 0);
  CHECK(calls("cuMemUnmap") == 5);
  CHECK(calls("cuMemMap") == 5);
  CHECK(d.refusals.load() == refusals);
  CHECK(d.used.load() == 42 * kMiB);
  fill(stitched, 10 * kMiB, 0x77);
  CHECK(all_bytes(stitched, 10 * kMiB, 0x77));
  live_intact(1);
  // What is left free (about 10 MiB in pieces under 2 MiB, no whole granule among them) has
  // nothing to unmap for 10 MiB more: a refusal, counted once, and nothing lost.
  CUdeviceptr more = 0;
  CHECK(cuMemAlloc(&more, 10 * kMiB) == CUDA_ERROR_OUT_OF_MEMORY);
  CHECK(d.refusals.load() == refusals + 1);
  CHECK(d.used.load() == 42 * kMiB);
  live_intact(1);
  CHECK(all_bytes(stitched, 10 * kMiB, 0x77));
  REQUIRE(cuMemFree(stitched) == CUDA_SUCCESS);
  for (size_t i = 1; i < p.size(); i += 2) REQUIRE(cuMemFree(p[i]) == CUDA_SUCCESS);
  // All free again: the pieces merge into whole granules, and the cap's worth is served in
  // one request from what the pool holds.
  fakecuda_reset_counters();
  REQUIRE(cuMemAlloc(&more, 42 * kMiB) == CUDA_SUCCESS);
  CHECK(calls("cuMemCreate") == 0);
  CHECK(d.used.load() == 42 * kMiB);
  fill(more, 42 * kMiB, 0x11);
  CHECK(all_bytes(more, 42 * kMiB, 0x11));
  REQUIRE(cuMemFree(more) == CUDA_SUCCESS);
}

TEST_CASE("vmm: a request of whole granules gets granules of its own, so its neighbours' come back whole",
          "[vmm_pack_whole]") {
  make_context();
  touch_interposer();
  auto& d = dev_counters();
  REQUIRE(d.limit.load() == 32 * kMiB);
  // Eight pairs of 1 MiB + 512 bytes and 2 MiB: the cap.
  std::vector<CUdeviceptr> odd(8), whole(8);
  for (size_t i = 0; i < odd.size(); ++i) {
    INFO("pair " << i);
    REQUIRE(cuMemAlloc(&odd[i], kMiB + 512) == CUDA_SUCCESS);
    REQUIRE(cuMemAlloc(&whole[i], 2 * kMiB) == CUDA_SUCCESS);
    CHECK(whole[i] % (2 * kMiB) == 0);
    fill(whole[i], 2 * kMiB, static_cast<unsigned char>(0x10 + i));
  }
  // The odd ones freed: their granules are theirs alone, and serve 16 MiB at once.
  for (CUdeviceptr p : odd) REQUIRE(cuMemFree(p) == CUDA_SUCCESS);
  const uint64_t refusals = d.refusals.load();
  fakecuda_reset_counters();
  CUdeviceptr big = 0;
  REQUIRE(cuMemAlloc(&big, 16 * kMiB) == CUDA_SUCCESS);
  CHECK(calls("cuMemCreate") == 0);
  CHECK(d.refusals.load() == refusals);
  CHECK(d.used.load() == 32 * kMiB);
  fill(big, 16 * kMiB, 0x77);
  for (size_t i = 0; i < whole.size(); ++i) CHECK(all_bytes(whole[i], 2 * kMiB, static_cast<unsigned char>(0x10 + i)));
  REQUIRE(cuMemFree(big) == CUDA_SUCCESS);
  for (CUdeviceptr p : whole) REQUIRE(cuMemFree(p) == CUDA_SUCCESS);
}

TEST_CASE("vmm: free every other block, then ask for their sum: stitched, no new physical memory", "[vmm]") {
  make_context();
  touch_interposer();
  REQUIRE(reach_idle(16 * kMiB));
  auto& d = dev_counters();
  // Sixteen 16 MiB blocks side by side at the top of the arena (nothing free to split meanwhile).
  std::vector<CUdeviceptr> p(16);
  for (size_t i = 0; i < p.size(); ++i) {
    REQUIRE(cuMemAlloc(&p[i], 16 * kMiB) == CUDA_SUCCESS);
    fill(p[i], 16 * kMiB, static_cast<unsigned char>(i + 1));
  }
  const size_t held = fakecuda_live_bytes(0);
  for (size_t i = 0; i < p.size(); i += 2) REQUIRE(cuMemFree(p[i]) == CUDA_SUCCESS);
  // 128 MiB free in eight pieces, no two adjacent: only stitching serves 128 MiB at once.
  fakecuda_reset_counters();
  CUdeviceptr sum = 0;
  REQUIRE(cuMemAlloc(&sum, 128 * kMiB) == CUDA_SUCCESS);
  CHECK(calls("cuMemCreate") == 0);
  CHECK(calls("cuMemUnmap") == 64);  // the eight free blocks' granules
  CHECK(calls("cuMemMap") == 64);
  CHECK(calls("cuMemSetAccess") == 1);  // once for the new range
  CHECK(fakecuda_live_bytes(0) == held);
  CHECK(d.reserved.load() <= held);
  // The live blocks kept their data; the stitched range is one usable stretch.
  for (size_t i = 1; i < p.size(); i += 2) CHECK(all_bytes(p[i], 16 * kMiB, static_cast<unsigned char>(i + 1)));
  fill(sum, 128 * kMiB, 0x77);
  CHECK(all_bytes(sum, 128 * kMiB, 0x77));
  CUdeviceptr base = 0;
  size_t size = 0;
  REQUIRE(cuMemGetAddressRange(&base, &size, sum + 100 * kMiB) == CUDA_SUCCESS);
  CHECK(base == sum);
  CHECK(size == 128 * kMiB);
  // Freed addresses stay refused while their ranges have holes.
  CHECK(cuMemFree(p[0]) == CUDA_ERROR_INVALID_VALUE);
  REQUIRE(cuMemFree(sum) == CUDA_SUCCESS);
  for (size_t i = 1; i < p.size(); i += 2) REQUIRE(cuMemFree(p[i]) == CUDA_SUCCESS);
}

TEST_CASE("vmm: a peer the program enabled reaches every pooled range, present and future", "[vmm]") {
  make_context(1);
  CUcontext c1 = nullptr;
  REQUIRE(cuCtxGetCurrent(&c1) == CUDA_SUCCESS);
  CUdeviceptr before = 0;
  REQUIRE(cuMemAlloc(&before, 8 * kMiB) == CUDA_SUCCESS);  // device 1's pool
  CUmemLocation dev0{};
  dev0.type = CU_MEM_LOCATION_TYPE_DEVICE;
  dev0.id = 0;
  unsigned long long flags = 0;
  REQUIRE(cuMemGetAccess(&flags, &dev0, before) == CUDA_SUCCESS);
  CHECK(flags == CU_MEM_ACCESS_FLAGS_PROT_NONE);  // the driver gives only the owner access
  make_context(0);
  REQUIRE(cuCtxEnablePeerAccess(c1, 0) == CUDA_SUCCESS);  // device 0 may use device 1's memory
  REQUIRE(cuMemGetAccess(&flags, &dev0, before) == CUDA_SUCCESS);
  CHECK(flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  REQUIRE(cuCtxSetCurrent(c1) == CUDA_SUCCESS);
  CUdeviceptr after = 0, small = 0;
  REQUIRE(cuMemAlloc(&after, 8 * kMiB) == CUDA_SUCCESS);
  REQUIRE(cuMemAlloc(&small, 4096) == CUDA_SUCCESS);
  for (CUdeviceptr p : {after, small}) {
    REQUIRE(cuMemGetAccess(&flags, &dev0, p) == CUDA_SUCCESS);
    CHECK(flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  }
  for (CUdeviceptr p : {before, after, small}) REQUIRE(cuMemFree(p) == CUDA_SUCCESS);
}

TEST_CASE("vmm: a destroyed context's granules go back to the device", "[vmm]") {
  make_context();
  touch_interposer();
  const size_t held0 = fakecuda_live_bytes(0);
  CUdevice dev = 0;
  REQUIRE(cuDeviceGet(&dev, 0) == CUDA_SUCCESS);
  CUcontext prev = nullptr, ctx = nullptr;
  REQUIRE(cuCtxGetCurrent(&prev) == CUDA_SUCCESS);
  REQUIRE(cuCtxCreate(&ctx, nullptr, 0, dev) == CUDA_SUCCESS);
  CUdeviceptr p = 0, q = 0;
  REQUIRE(cuMemAlloc(&p, 40 * kMiB) == CUDA_SUCCESS);
  REQUIRE(cuMemAlloc(&q, 4096) == CUDA_SUCCESS);
  REQUIRE(cuMemFree(q) == CUDA_SUCCESS);
  CHECK(fakecuda_live_bytes(0) >= held0 + 42 * kMiB);
  REQUIRE(cuCtxDestroy(ctx) == CUDA_SUCCESS);
  CHECK(fakecuda_live_bytes(0) == held0);
  REQUIRE(cuCtxSetCurrent(prev) == CUDA_SUCCESS);
}

TEST_CASE("vmm: a destroyed context's pool leaves no free memory on the device's gauges", "[vmm]") {
  make_context();
  touch_interposer();
  // Device 1: no other context's pool writes its gauges.
  auto& d = dev_counters(1);
  CUdevice dev = 0;
  REQUIRE(cuDeviceGet(&dev, 1) == CUDA_SUCCESS);
  CUcontext prev = nullptr, ctx = nullptr;
  REQUIRE(cuCtxGetCurrent(&prev) == CUDA_SUCCESS);
  REQUIRE(cuCtxCreate(&ctx, nullptr, 0, dev) == CUDA_SUCCESS);
  CUdeviceptr p = 0, q = 0;
  REQUIRE(cuMemAlloc(&p, 40 * kMiB) == CUDA_SUCCESS);
  REQUIRE(cuMemAlloc(&q, 8 * kMiB) == CUDA_SUCCESS);
  REQUIRE(cuMemFree(p) == CUDA_SUCCESS);
  REQUIRE(d.pool_free.load() >= 40 * kMiB);
  REQUIRE(d.pool_largest_free.load() >= 40 * kMiB);
  REQUIRE(cuCtxDestroy(ctx) == CUDA_SUCCESS);
  CHECK(d.pool_free.load() == 0);
  CHECK(d.pool_largest_free.load() == 0);
  REQUIRE(cuCtxSetCurrent(prev) == CUDA_SUCCESS);
}

TEST_CASE("vmm: the cap counts physical memory, and refuses only what stitching cannot serve", "[vmm_cap]") {
  make_context();
  touch_interposer();
  auto& d = dev_counters();
  REQUIRE(d.limit.load() == 64 * kMiB);
  REQUIRE(reach_idle(16 * kMiB));
  std::vector<CUdeviceptr> p(4);
  for (auto& x : p) REQUIRE(cuMemAlloc(&x, 16 * kMiB) == CUDA_SUCCESS);  // the cap is full
  CHECK(d.used.load() == 64 * kMiB);
  const uint64_t refusals = d.refusals.load();
  REQUIRE(cuMemFree(p[0]) == CUDA_SUCCESS);
  REQUIRE(cuMemFree(p[2]) == CUDA_SUCCESS);
  CUdeviceptr both = 0;
  REQUIRE(cuMemAlloc(&both, 32 * kMiB) == CUDA_SUCCESS);  // two non-adjacent free blocks, stitched
  CHECK(d.refusals.load() == refusals);
  CHECK(d.used.load() == 64 * kMiB);
  CUdeviceptr more = 0;
  CHECK(cuMemAlloc(&more, 2 * kMiB) == CUDA_ERROR_OUT_OF_MEMORY);  // a real shortage
  CHECK(d.refusals.load() == refusals + 1);
  CHECK(d.used.load() == 64 * kMiB);
  for (CUdeviceptr x : {p[1], p[3], both}) REQUIRE(cuMemFree(x) == CUDA_SUCCESS);
  // Everything free again: a request of the whole cap is served from what the pool holds.
  REQUIRE(cuMemAlloc(&more, 64 * kMiB) == CUDA_SUCCESS);
  CHECK(d.used.load() == 64 * kMiB);
  REQUIRE(cuMemFree(more) == CUDA_SUCCESS);
}

TEST_CASE("vmm: without a cap the pool keeps at most CUWARDEN_POOL_KEEP beyond its live blocks", "[vmm_keep]") {
  make_context();
  touch_interposer();
  REQUIRE(reach_idle(4 * kMiB));
  auto& d = dev_counters();
  // Arrays that grow: each step frees the old one and asks for a larger one, with a few
  // small temporaries. A pool that keeps what it frees would hold the sum of every size.
  std::mt19937 rng(7);
  CUdeviceptr a = 0;
  uint64_t size = 4 * kMiB, peak_over = 0;
  REQUIRE(cuMemAlloc(&a, size) == CUDA_SUCCESS);
  for (int step = 0; step < 60; ++step) {
    CUdeviceptr b = 0, tmp = 0;
    const uint64_t next = size + (1 + rng() % 4) * kMiB + rng() % 4096;
    REQUIRE(cuMemAlloc(&tmp, 100000 + rng() % 100000) == CUDA_SUCCESS);
    REQUIRE(cuMemAlloc(&b, next) == CUDA_SUCCESS);
    REQUIRE(cuMemFree(a) == CUDA_SUCCESS);
    REQUIRE(cuMemFree(tmp) == CUDA_SUCCESS);
    a = b;
    size = next;
    const uint64_t live = (size + 2 * kMiB - 1) / (2 * kMiB) * (2 * kMiB);
    const uint64_t held = d.reserved.load();
    peak_over = std::max(peak_over, held > live ? held - live : 0);
  }
  INFO("largest excess " << peak_over / kMiB << " MiB over a block of " << size / kMiB << " MiB");
  // The keep (8 MiB), the slab of the temporaries (2 MiB), and the block just freed
  // before the next request saw it (a step's growth: at most 5 MiB, rounded: 6).
  CHECK(peak_over <= (8 + 2 + 6) * kMiB + size);
  CHECK(d.reserved.load() <= 2 * size + 16 * kMiB);
  REQUIRE(cuMemFree(a) == CUDA_SUCCESS);
}

// Registered with CUWARDEN_FAKE_NO_VMM=1: the device says it has no virtual memory management.
TEST_CASE("vmm: a device without virtual memory management gets the cache's layout", "[vmm_fallback]") {
  make_context();
  touch_interposer();
  fakecuda_reset_counters();
  CUdeviceptr p = 0;
  REQUIRE(cuMemAlloc(&p, 8 * kMiB) == CUDA_SUCCESS);
  CHECK(calls("cuMemCreate") == 0);
  CHECK(calls("cuMemAlloc") == 1);  // a whole driver allocation, as the cache keeps
  CUipcMemHandle h{};
  CHECK(cuIpcGetMemHandle(&h, p) == CUDA_SUCCESS);  // and exportable, as under the cache
  REQUIRE(cuMemFree(p) == CUDA_SUCCESS);
}

TEST_CASE("vmm: blocks split and merged while the block map grows are all found again", "[vmm]") {
  make_context();
  touch_interposer();
  REQUIRE(reach_idle(2 * kMiB));
  // Small blocks fill the map (each carved block is an entry) while large ones are split from
  // and merged back into free space: the map grows in the middle of splits and merges, and
  // every address must still lead to its own block.
  std::mt19937 rng(11);
  struct Live {
    CUdeviceptr p;
    size_t n;
  };
  std::vector<Live> live;
  uint64_t bad_alloc = 0, bad_free = 0;
  for (int i = 0; i < 6000; ++i) {
    if (live.size() < 1200 && (rng() % 3 != 0 || live.empty())) {  // at most about 600 MiB live
      const size_t n = rng() % 10 == 0 ? (1 + rng() % 4) * 2 * kMiB - rng() % 4096 : 512 + rng() % 8192;
      CUdeviceptr p = 0;
      if (cuMemAlloc(&p, n) != CUDA_SUCCESS) {
        ++bad_alloc;
        continue;
      }
      live.push_back({p, n});
    } else {
      const size_t k = rng() % live.size();
      if (cuMemFree(live[k].p) != CUDA_SUCCESS) ++bad_free;
      live[k] = live.back();
      live.pop_back();
    }
  }
  CHECK(bad_alloc == 0);
  CHECK(bad_free == 0);
  for (const Live& l : live) {
    CUdeviceptr base = 0;
    size_t size = 0;
    REQUIRE(cuMemGetAddressRange(&base, &size, l.p + l.n - 1) == CUDA_SUCCESS);
    CHECK(base == l.p);
    CHECK(size == l.n);
    CHECK(cuMemFree(l.p) == CUDA_SUCCESS);
    CHECK(cuMemFree(l.p) == CUDA_ERROR_INVALID_VALUE);  // and only once
  }
}

// Registered under both pools with CUWARDEN_POOL_IDLE=1s (and the default keep).
TEST_CASE("pools: memory idle past CUWARDEN_POOL_IDLE goes back at the next free", "[pool_idle]") {
  make_context();
  touch_interposer();
  REQUIRE(reach_idle(4096));
  auto& d = dev_counters();
  // A peak of 256 MiB live, then nearly everything freed: the pool may keep it for the next
  // step, within CUWARDEN_POOL_IDLE of the peak.
  std::vector<CUdeviceptr> big(16);
  for (auto& p : big) REQUIRE(cuMemAlloc(&p, 16 * kMiB) == CUDA_SUCCESS);
  CUdeviceptr small = 0;
  REQUIRE(cuMemAlloc(&small, 4096) == CUDA_SUCCESS);
  for (CUdeviceptr p : big) REQUIRE(cuMemFree(p) == CUDA_SUCCESS);
  REQUIRE(cuCtxSynchronize() == CUDA_SUCCESS);
  CHECK(d.reserved.load() >= 256 * kMiB);  // kept: the peak is recent
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  // The next free after the pool has been idle that long gives back what passes the budget
  // of what is live then (a small block and its slab: the 16 MiB floor).
  REQUIRE(cuMemFree(small) == CUDA_SUCCESS);
  CHECK(d.reserved.load() <= 16 * kMiB + 2 * kMiB);
  CHECK(d.used.load() == d.reserved.load());  // given back to the driver, uncharged
  // And it grows again when asked.
  CUdeviceptr again = 0;
  REQUIRE(cuMemAlloc(&again, 64 * kMiB) == CUDA_SUCCESS);
  REQUIRE(cuMemFree(again) == CUDA_SUCCESS);
}

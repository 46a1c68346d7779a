// Interposer tests: the per-process cap (CUWARDEN_LIMIT=64MiB in this test's environment).
// Exact at the byte, never passed under concurrency, reported by cuMemGetInfo.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <latch>
#include <random>
#include <thread>
#include <vector>

#include "fakecuda.h"
#include "support.hpp"

using namespace cuwtest;

namespace {
using cuwtest::kMiB;
constexpr uint64_t kCap = 64 * kMiB;
}  // namespace

TEST_CASE("the cap is hit exactly at the byte, and refusals never reach the driver", "[cap]") {
  make_context();
  touch_interposer();
  auto& d = dev_counters();
  REQUIRE(d.limit.load() == kCap);
  const uint64_t refusals = d.refusals.load();

  CUdeviceptr a = 0, b = 0, c = 0;
  REQUIRE(cuMemAlloc(&a, kCap - 1000) == CUDA_SUCCESS);
  REQUIRE(cuMemAlloc(&b, 1000) == CUDA_SUCCESS);  // exactly at the cap
  CHECK(used() == kCap);
  CHECK(d.peak.load() == kCap);

  fakecuda_reset_counters();
  CHECK(cuMemAlloc(&c, 1) == CUDA_ERROR_OUT_OF_MEMORY);  // one byte over
  CHECK(fakecuda_call_count("cuMemAlloc") == 0);         // the driver was never asked
  CHECK(d.refusals.load() == refusals + 1);
  CHECK(used() == kCap);

  REQUIRE(cuMemFree(b) == CUDA_SUCCESS);
  CHECK(cuMemAlloc(&c, 1001) == CUDA_ERROR_OUT_OF_MEMORY);
  REQUIRE(cuMemAlloc(&c, 1000) == CUDA_SUCCESS);
  REQUIRE(cuMemFree(c) == CUDA_SUCCESS);
  REQUIRE(cuMemFree(a) == CUDA_SUCCESS);
  CHECK(used() == 0);
  CHECK(cuMemAlloc(&c, kCap + 1) == CUDA_ERROR_OUT_OF_MEMORY);
  CHECK(d.refusals.load() == refusals + 3);
}

TEST_CASE("a driver failure is passed on and counts nothing", "[cap]") {
  make_context();
  touch_interposer();
  CUdeviceptr p = 0;
  CHECK(cuMemAlloc(&p, 0) == CUDA_ERROR_INVALID_VALUE);  // the driver's answer for size 0
  CHECK(used() == 0);
  CHECK(cuMemFree(0xdead000) == CUDA_ERROR_INVALID_VALUE);  // not ours, not the driver's
  CHECK(used() == 0);
}

TEST_CASE("cuMemGetInfo and cuDeviceTotalMem report the cap, under and over it", "[cap][meminfo]") {
  make_context();
  touch_interposer();
  size_t f = 0, t = 0;
  REQUIRE(cuMemGetInfo(&f, &t) == CUDA_SUCCESS);
  CHECK(t == kCap);
  CHECK(f == kCap);
  size_t tm = 0;
  REQUIRE(cuDeviceTotalMem(&tm, 0) == CUDA_SUCCESS);
  CHECK(tm == kCap);

  CUdeviceptr p = 0;
  REQUIRE(cuMemAlloc(&p, 24 * kMiB) == CUDA_SUCCESS);
  REQUIRE(cuMemGetInfo(&f, &t) == CUDA_SUCCESS);
  CHECK(t == kCap);
  CHECK(f == kCap - 24 * kMiB);

  // A cap lowered live below what is in use (as the daemon does through the header):
  // free is 0, never an underflow; new allocations are refused until use drops.
  auto& d = dev_counters();
  d.limit.store(8 * kMiB);
  REQUIRE(cuMemGetInfo(&f, &t) == CUDA_SUCCESS);
  CHECK(t == 8 * kMiB);
  CHECK(f == 0);
  REQUIRE(cuDeviceTotalMem(&tm, 0) == CUDA_SUCCESS);
  CHECK(tm == 8 * kMiB);
  CUdeviceptr q = 0;
  CHECK(cuMemAlloc(&q, 512) == CUDA_ERROR_OUT_OF_MEMORY);
  REQUIRE(cuMemFree(p) == CUDA_SUCCESS);
  REQUIRE(cuMemAlloc(&q, 512) == CUDA_SUCCESS);
  REQUIRE(cuMemFree(q) == CUDA_SUCCESS);
  d.limit.store(kCap);

  // NULL out-pointers behave as the driver does: the call's result is the driver's, and
  // whichever pointer was given is filled.
  // (The simulated driver, like the real one as far as its documentation goes, fills the
  // pointer it is given and refuses only when both are NULL.)
  size_t only_total = 0;
  REQUIRE(cuMemGetInfo(nullptr, &only_total) == CUDA_SUCCESS);
  CHECK(only_total == kCap);
  size_t only_free = 0;
  REQUIRE(cuMemGetInfo(&only_free, nullptr) == CUDA_SUCCESS);
  CHECK(only_free == kCap);
  CHECK(cuMemGetInfo(nullptr, nullptr) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuDeviceTotalMem(nullptr, 0) == CUDA_ERROR_INVALID_VALUE);
}

TEST_CASE("a device the process only asks about has no row; a context or an allocation gives it one", "[rows]") {
  REQUIRE(cuInit(0) == CUDA_SUCCESS);
  // The CUDA runtime asks every device's total memory when it starts: the answer is the cap...
  for (int dev : {0, 1}) {
    size_t tm = 0;
    REQUIRE(cuDeviceTotalMem(&tm, dev) == CUDA_SUCCESS);
    CHECK(tm == kCap);
  }
  // ...but asking is no use: after allocating on GPU 0 only, GPU 1 has no row (nvidia-smi
  // lists a process only where it has a context).
  make_context(0);
  touch_interposer();
  CHECK(dev_counters(0).present.load() == 1);
  CHECK(dev_counters(1).present.load() == 0);
  CHECK(own_ring().device_count.load() == 1);
  // A context on GPU 1 (cudaSetDevice(1), then the runtime's first call) gives it one, with
  // its cap, before any allocation there.
  CUdevice d1 = 0;
  REQUIRE(cuDeviceGet(&d1, 1) == CUDA_SUCCESS);
  CUcontext c1 = nullptr;
  REQUIRE(cuDevicePrimaryCtxRetain(&c1, d1) == CUDA_SUCCESS);
  CHECK(dev_counters(1).present.load() == 1);
  CHECK(dev_counters(1).limit.load() == kCap);
  CHECK(dev_counters(1).used.load() == 0);
  REQUIRE(cuDevicePrimaryCtxRelease(d1) == CUDA_SUCCESS);
}

// Also run without a cap (interposer.concurrency_nocap): then frees are counted before their
// driver call (one lock per free), and no allocation is refused (16 threads hold at most
// 8 x 6 MiB each, on a simulated 4 GiB device there).
TEST_CASE("16 threads allocating and freeing never pass the cap and end with exact counters", "[cap][concurrency]") {
  make_context();
  touch_interposer();
  auto& d = dev_counters();
  const bool capped = d.limit.load() != cuw::ring::kNoLimit;
  INFO((capped ? "with a 64 MiB cap" : "without a cap"));
  const uint64_t allocs0 = d.alloc_count.load(), frees0 = d.free_count.load(), refusals0 = d.refusals.load();
  CUcontext ctx = nullptr;
  REQUIRE(cuCtxGetCurrent(&ctx) == CUDA_SUCCESS);

  constexpr int kThreads = 16;
  constexpr int kIters = 2000;
  // Catch2's assertions are not thread-safe: the workers count failures, the test checks them.
  std::atomic<uint64_t> ok{0}, refused{0}, over_cap_seen{0}, unexpected{0};
  std::vector<std::thread> threads;
  // Every thread first takes 4 x 4 MiB and holds them until all have asked: 256 MiB against a
  // 64 MiB cap, so some are refused however the threads are scheduled (a loaded machine may
  // otherwise run them one after another, each alone under the cap).
  std::latch all_asked(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      if (cuCtxSetCurrent(ctx) != CUDA_SUCCESS) ++unexpected;
      std::mt19937_64 rng(1000 + t);
      std::vector<std::pair<CUdeviceptr, size_t>> live;
      for (int i = 0; i < 4; ++i) {
        CUdeviceptr p = 0;
        const CUresult r = cuMemAlloc(&p, 4 * kMiB);
        if (r == CUDA_SUCCESS) {
          live.emplace_back(p, 4 * kMiB);
          ++ok;
        } else {
          if (r != CUDA_ERROR_OUT_OF_MEMORY) ++unexpected;
          ++refused;
        }
      }
      all_asked.arrive_and_wait();
      for (int i = 0; i < kIters; ++i) {
        if (live.size() < 8 && (rng() % 3 != 0 || live.empty())) {
          const size_t sz = 512 + rng() % (6 * kMiB);
          CUdeviceptr p = 0;
          const CUresult r = cuMemAlloc(&p, sz);
          if (r == CUDA_SUCCESS) {
            live.emplace_back(p, sz);
            ++ok;
          } else {
            if (r != CUDA_ERROR_OUT_OF_MEMORY) ++unexpected;
            ++refused;
          }
        } else {
          const size_t k = rng() % live.size();
          if (cuMemFree(live[k].first) != CUDA_SUCCESS) ++unexpected;
          live.erase(live.begin() + static_cast<long>(k));
        }
        if (d.used.load() > kCap) ++over_cap_seen;
      }
      for (auto& [p, sz] : live)
        if (cuMemFree(p) != CUDA_SUCCESS) ++unexpected;
    });
  }
  for (auto& th : threads) th.join();
  CHECK(unexpected.load() == 0);
  if (capped) {
    CHECK(over_cap_seen.load() == 0);
    CHECK(d.peak.load() <= kCap);
  }
  CHECK(d.used.load() == 0);
  CHECK(d.reserved.load() == 0);
  CHECK(d.live_allocations.load() == 0);
  CHECK(d.alloc_count.load() - allocs0 == ok.load());
  CHECK(d.free_count.load() - frees0 == ok.load());
  CHECK(d.refusals.load() - refusals0 == refused.load());
  if (capped) CHECK(refused.load() > 0);  // the workload really pressed against the cap (the first phase alone)
  else CHECK(refused.load() == 0);
  CHECK(fakecuda_live_bytes(0) == 0);
}

TEST_CASE("every allocation, free and refusal is an event in the ring", "[cap][events]") {
  make_context();
  touch_interposer();
  auto& h = own_ring();
  // Drain what is there, as a daemon would.
  std::vector<cuw::ring::Event> buf(cuw::ring::kDefaultSlotCount);
  auto* slots = reinterpret_cast<cuw::ring::EventSlot*>(reinterpret_cast<char*>(&h) + cuw::ring::kHeaderBytes);
  cuw::ring::drain(h, slots, cuw::ring::kDefaultSlotCount, buf.data(), buf.size(), false, nullptr);

  CUdeviceptr p = 0, q = 0;
  REQUIRE(cuMemAlloc(&p, 5 * kMiB) == CUDA_SUCCESS);
  REQUIRE(cuMemAlloc(&q, kCap) == CUDA_ERROR_OUT_OF_MEMORY);
  REQUIRE(cuMemFree(p) == CUDA_SUCCESS);
  const size_t n = cuw::ring::drain(h, slots, cuw::ring::kDefaultSlotCount, buf.data(), buf.size(), false, nullptr);
  REQUIRE(n == 3);
  using K = cuw::ring::EventKind;
  CHECK(buf[0].kind == static_cast<uint8_t>(K::alloc));
  CHECK(buf[0].address == p);
  CHECK(buf[0].bytes == 5 * kMiB);
  CHECK(buf[0].used_after == 5 * kMiB);
  CHECK(buf[0].device == 0);
  CHECK(buf[0].tid == static_cast<uint32_t>(gettid()));
  CHECK(buf[0].time_ns > 1'600'000'000'000'000'000ULL);
  CHECK(buf[1].kind == static_cast<uint8_t>(K::refuse));
  CHECK(buf[1].bytes == kCap);
  CHECK(buf[1].result == CUDA_ERROR_OUT_OF_MEMORY);
  CHECK(buf[2].kind == static_cast<uint8_t>(K::free));
  CHECK(buf[2].address == p);
  CHECK(buf[2].used_after == 0);
  CHECK(h.pid == static_cast<uint32_t>(getpid()));
  CHECK(std::string(h.comm).size() > 0);
}

// Run as interposer.ctx_gone (off) and interposer.ctx_gone_cache (CUWARDEN_POOL=cache: the
// same allocations the cache does not serve), each with a 64 MiB cap.
TEST_CASE("memory the driver frees with a destroyed context stops counting against the cap", "[ctx_gone]") {
  make_context();
  touch_interposer();
  auto& d = dev_counters();
  // What the program holds (the cache, where on, may keep or give back memory of its own).
  auto in_use = [&d] { return d.used.load() - d.cached.load(); };
  CUcontext primary = nullptr;
  REQUIRE(cuCtxGetCurrent(&primary) == CUDA_SUCCESS);
  CUdevice dev = 0;
  REQUIRE(cuDeviceGet(&dev, 0) == CUDA_SUCCESS);
  const uint64_t use0 = in_use(), live0 = d.live_allocations.load(), frees0 = d.free_count.load();
  // In the primary context: stays.
  CUdeviceptr keep = 0;
  REQUIRE(cuMemAllocManaged(&keep, 4 * kMiB, CU_MEM_ATTACH_GLOBAL) == CUDA_SUCCESS);
  const uint64_t use_keep = in_use();
  REQUIRE(use_keep == use0 + 4 * kMiB);
  // In a context of its own, destroyed with them.
  CUcontext other = nullptr;
  REQUIRE(cuCtxCreate(&other, nullptr, 0, dev) == CUDA_SUCCESS);
  CUdeviceptr managed = 0, pitched = 0;
  size_t pitch = 0;
  REQUIRE(cuMemAllocManaged(&managed, 24 * kMiB, CU_MEM_ATTACH_GLOBAL) == CUDA_SUCCESS);
  REQUIRE(cuMemAllocPitch(&pitched, &pitch, 4096, 2048, 4) == CUDA_SUCCESS);
  CHECK(in_use() > use_keep + 24 * kMiB);
  // More than the cap leaves is refused while they are counted.
  CUdeviceptr big = 0;
  CHECK(cuMemAllocManaged(&big, 40 * kMiB, CU_MEM_ATTACH_GLOBAL) == CUDA_ERROR_OUT_OF_MEMORY);
  REQUIRE(cuCtxDestroy(other) == CUDA_SUCCESS);
  REQUIRE(cuCtxSetCurrent(primary) == CUDA_SUCCESS);
  CHECK(in_use() == use_keep);
  CHECK(d.live_allocations.load() == live0 + 1);
  CHECK(d.free_count.load() == frees0 + 2);
  // A free of the destroyed context's memory is the driver's answer, and counts nothing.
  CHECK(cuMemFree(managed) != CUDA_SUCCESS);
  CHECK(in_use() == use_keep);
  // The cap sees the room again.
  REQUIRE(cuMemAllocManaged(&big, 40 * kMiB, CU_MEM_ATTACH_GLOBAL) == CUDA_SUCCESS);
  REQUIRE(cuMemFree(big) == CUDA_SUCCESS);
  REQUIRE(cuMemFree(keep) == CUDA_SUCCESS);
  CHECK(in_use() == use0);
  CHECK(d.live_allocations.load() == live0);
}

namespace {
/// Waits until `v` holds `want`: spins for up to 50 us (awake when the other side signals,
/// the race tests start both sides close together), then sleeps on the value (a futex) until
/// publish() changes it. A waiter that spins or yields for longer stays runnable: beside
/// busy processes on a 2-core machine each of the thousands of handoffs below then waited for
/// a time slice (70 s instead of 0.3 s).
void await_value(const std::atomic<int>& v, int want) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(50);
  for (int looks = 1; v.load() != want; ++looks)
    if (looks % 64 == 0 && std::chrono::steady_clock::now() > until) {
      for (int now = v.load(); now != want; now = v.load()) v.wait(now);
      return;
    }
}

/// Stores `value` in `v` and wakes every await_value() on it.
void publish(std::atomic<int>& v, int value) {
  v.store(value);
  v.notify_all();
}

/// Every event published since the last call (the ring drained as a daemon would), but a
/// pool's segment_alloc / segment_free (what the driver holds for the pool, not what the
/// program allocated: those tests run with and without a pool).
std::vector<cuw::ring::Event> drain_events() {
  auto& h = own_ring();
  std::vector<cuw::ring::Event> buf(cuw::ring::kDefaultSlotCount);
  auto* slots = reinterpret_cast<cuw::ring::EventSlot*>(reinterpret_cast<char*>(&h) + cuw::ring::kHeaderBytes);
  buf.resize(cuw::ring::drain(h, slots, cuw::ring::kDefaultSlotCount, buf.data(), buf.size(), false, nullptr));
  std::erase_if(buf, [](const cuw::ring::Event& e) {
    return e.kind == static_cast<uint8_t>(cuw::ring::EventKind::segment_alloc) ||
           e.kind == static_cast<uint8_t>(cuw::ring::EventKind::segment_free);
  });
  return buf;
}
/// CUDA arrays of 2D floats, `mib` MiB each (width 1024 floats: 4 KiB rows).
CUDA_ARRAY_DESCRIPTOR float_2d(uint64_t mib) {
  CUDA_ARRAY_DESCRIPTOR d{};
  d.Width = 1024;
  d.Height = mib * 256;
  d.Format = CU_AD_FORMAT_FLOAT;
  d.NumChannels = 1;
  return d;
}
}  // namespace

TEST_CASE("CUDA arrays destroyed with their context stop counting against the cap", "[ctx_gone]") {
  make_context();
  touch_interposer();
  auto& d = dev_counters();
  auto in_use = [&d] { return d.used.load() - d.cached.load(); };
  CUcontext primary = nullptr;
  REQUIRE(cuCtxGetCurrent(&primary) == CUDA_SUCCESS);
  CUdevice dev = 0;
  REQUIRE(cuDeviceGet(&dev, 0) == CUDA_SUCCESS);
  // One array in the primary context stays.
  const CUDA_ARRAY_DESCRIPTOR small = float_2d(4);
  CUarray keep = nullptr;
  REQUIRE(cuArrayCreate(&keep, &small) == CUDA_SUCCESS);
  const uint64_t use_keep = in_use(), live_keep = d.live_allocations.load(), frees0 = d.free_count.load();
  // A context of its own with a 2D array, a 3D array and a mipmapped array: 48 MiB.
  CUcontext other = nullptr;
  REQUIRE(cuCtxCreate(&other, nullptr, 0, dev) == CUDA_SUCCESS);
  const CUDA_ARRAY_DESCRIPTOR big = float_2d(16);
  CUarray a2 = nullptr, a3 = nullptr;
  REQUIRE(cuArrayCreate(&a2, &big) == CUDA_SUCCESS);
  CUDA_ARRAY3D_DESCRIPTOR d3{};
  d3.Width = 1024;
  d3.Height = 1024;
  d3.Depth = 4;
  d3.Format = CU_AD_FORMAT_FLOAT;
  d3.NumChannels = 1;
  REQUIRE(cuArray3DCreate(&a3, &d3) == CUDA_SUCCESS);
  CUmipmappedArray mip = nullptr;
  CUDA_ARRAY3D_DESCRIPTOR dm = d3;
  dm.Depth = 0;
  dm.Width = 2048;
  REQUIRE(cuMipmappedArrayCreate(&mip, &dm, 2) == CUDA_SUCCESS);  // 8 + 2 MiB
  CHECK(in_use() >= use_keep + 16 * kMiB + 16 * kMiB + 10 * kMiB);
  CHECK(d.live_allocations.load() == live_keep + 3);
  drain_events();
  REQUIRE(cuCtxDestroy(other) == CUDA_SUCCESS);
  REQUIRE(cuCtxSetCurrent(primary) == CUDA_SUCCESS);
  CHECK(in_use() == use_keep);
  CHECK(d.live_allocations.load() == live_keep);
  CHECK(d.free_count.load() == frees0 + 3);
  // One free event each, api cuCtxDestroy, naming the handles.
  std::vector<uint64_t> freed;
  for (const auto& e : drain_events())
    if (e.kind == static_cast<uint8_t>(cuw::ring::EventKind::free) &&
        e.api == static_cast<uint16_t>(cuw::ring::Api::cuCtxDestroy))
      freed.push_back(e.address);
  std::sort(freed.begin(), freed.end());
  std::vector<uint64_t> want{reinterpret_cast<uint64_t>(a2), reinterpret_cast<uint64_t>(a3),
                             reinterpret_cast<uint64_t>(mip)};
  std::sort(want.begin(), want.end());
  CHECK(freed == want);
  // The cap sees the room again (56 MiB with the 4 MiB array kept, under 64 MiB).
  CUarray again = nullptr;
  const CUDA_ARRAY_DESCRIPTOR room = float_2d(56);
  REQUIRE(cuArrayCreate(&again, &room) == CUDA_SUCCESS);
  REQUIRE(cuArrayDestroy(again) == CUDA_SUCCESS);
  // The primary context's array was not touched, and its destroy counts as before.
  REQUIRE(cuArrayDestroy(keep) == CUDA_SUCCESS);
  CHECK(d.live_allocations.load() == live_keep - 1);
  CHECK(in_use() == use_keep - 4 * kMiB);
}

TEST_CASE("an address the driver hands out again counts its old allocation freed", "[ctx_gone]") {
  make_context();
  touch_interposer();
  auto& d = dev_counters();
  auto in_use = [&d] { return d.used.load() - d.cached.load(); };
  // The simulated driver's own free under a name cuwarden does not hook: memory freed
  // where the hooks do not see it (as when another thread's context destruction freed it
  // before the sweep reached it).
  auto unhooked_free = fakecuda_free_unseen;
  const uint64_t use0 = in_use(), live0 = d.live_allocations.load(), frees0 = d.free_count.load();
  CUdeviceptr a = 0, b = 0;
  REQUIRE(cuMemAllocManaged(&a, 40 * kMiB, CU_MEM_ATTACH_GLOBAL) == CUDA_SUCCESS);
  REQUIRE(unhooked_free(a) == CUDA_SUCCESS);
  CHECK(in_use() == use0 + 40 * kMiB);  // still counted: nothing told the hooks
  drain_events();
  // Under a 64 MiB cap, 20 MiB fits beside the 40 still counted; the driver gives the
  // same address (to cuMemAlloc, or with CUWARDEN_POOL=cache to the cache's new block).
  REQUIRE(cuMemAlloc(&b, 20 * kMiB) == CUDA_SUCCESS);
  REQUIRE(b == a);
  CHECK(in_use() == use0 + 20 * kMiB);
  CHECK(d.live_allocations.load() == live0 + 1);
  CHECK(d.free_count.load() == frees0 + 1);
  const auto ev = drain_events();
  REQUIRE(ev.size() == 2);
  CHECK(ev[0].kind == static_cast<uint8_t>(cuw::ring::EventKind::free));
  CHECK(ev[0].api == static_cast<uint16_t>(cuw::ring::Api::reused));
  CHECK(ev[0].address == a);
  CHECK(ev[0].bytes == 40 * kMiB);
  CHECK(ev[1].kind == static_cast<uint8_t>(cuw::ring::EventKind::alloc));
  CHECK(ev[1].address == b);
  CHECK(ev[1].bytes == 20 * kMiB);
  CHECK(ev[1].used_after == d.used.load());
  CHECK(ev[0].used_after <= ev[1].used_after);  // the old bytes out (the new, capped, were charged first)
  // The new allocation frees as any other, and the cap has all its room.
  REQUIRE(cuMemFree(b) == CUDA_SUCCESS);
  CHECK(in_use() == use0);
  CHECK(d.live_allocations.load() == live0);
  REQUIRE(cuMemAllocManaged(&b, 60 * kMiB, CU_MEM_ATTACH_GLOBAL) == CUDA_SUCCESS);
  REQUIRE(cuMemFree(b) == CUDA_SUCCESS);
}

TEST_CASE("a primary context's reset stops counting what the driver freed with it", "[ctx_gone]") {
  make_context();
  touch_interposer();
  auto& d = dev_counters();
  const uint64_t live0 = d.live_allocations.load();
  CUdeviceptr a = 0;
  REQUIRE(cuMemAllocManaged(&a, 16 * kMiB, CU_MEM_ATTACH_GLOBAL) == CUDA_SUCCESS);
  CHECK(d.live_allocations.load() == live0 + 1);
  CUdevice dev = 0;
  REQUIRE(cuDeviceGet(&dev, 0) == CUDA_SUCCESS);
  REQUIRE(cuDevicePrimaryCtxReset(dev) == CUDA_SUCCESS);
  CHECK(d.live_allocations.load() == live0);
  make_context();
  CUdeviceptr b = 0;
  REQUIRE(cuMemAllocManaged(&b, 60 * kMiB, CU_MEM_ATTACH_GLOBAL) == CUDA_SUCCESS);  // the cap's room is back
  REQUIRE(cuMemFree(b) == CUDA_SUCCESS);
}

// ---- races between a context's destruction and its arrays ----------------------------------

namespace {
/// The test's setup: device 0's primary context current (make_context), the interposer
/// loaded; returns device 0, and the primary in `*primary` if given.
CUdevice on_primary(CUcontext* primary = nullptr) {
  make_context();
  touch_interposer();
  CUdevice dev = 0;
  REQUIRE(cuDeviceGet(&dev, 0) == CUDA_SUCCESS);
  if (primary) REQUIRE(cuCtxGetCurrent(primary) == CUDA_SUCCESS);
  return dev;
}

/// Releases device `dev`'s primary context until it is inactive (destroyed): earlier tests
/// of the process may hold references of their own.
void release_primary_fully(CUdevice dev) {
  unsigned flags = 0;
  int active = 1;
  for (int i = 0; i < 256 && active; ++i) {
    REQUIRE(cuDevicePrimaryCtxRelease(dev) == CUDA_SUCCESS);
    REQUIRE(cuDevicePrimaryCtxGetState(dev, &flags, &active) == CUDA_SUCCESS);
  }
  REQUIRE(active == 0);
}

/// Releases device `dev`'s primary context until a release destroys it, which the pause
/// armed for `b` notices (earlier tests of the process may hold references of their own).
void release_primary_until_destroyed(CUdevice dev, const Meanwhile& b) {
  for (int i = 0; i < 256 && !b.started.load(); ++i) REQUIRE(cuDevicePrimaryCtxRelease(dev) == CUDA_SUCCESS);
  REQUIRE(b.started.load());
}
}  // namespace

// Thread B makes the primary context active again and creates an array in it after A's
// release destroyed it and found it inactive, before A counts the old context's arrays
// freed (the simulated driver pauses A there). The primary keeps its handle, but B's array
// is not the old context's: it stays counted, and the old array is counted freed. With
// CUWARDEN_POOL=cache B's retain waits for the release's check (the cache serializes them)
// and then races A's sweep, which usually wins: the exact case is the one without the
// cache; the racing case below covers the cache.
TEST_CASE("a primary context's release counts its own arrays freed, not those of its next activation",
          "[ctx_gone_race]") {
  const CUdevice dev = on_primary();
  auto& d = dev_counters();
  // The program's bytes (used - cached): the release also frees what the cache keeps.
  auto own = [&d] { return d.used.load() - d.cached.load(); };
  const uint64_t live0 = d.live_allocations.load(), own0 = own();
  const CUDA_ARRAY_DESCRIPTOR small = float_2d(1);
  CUarray old = nullptr;
  REQUIRE(cuArrayCreate(&old, &small) == CUDA_SUCCESS);  // freed by the driver with the primary
  REQUIRE(d.live_allocations.load() == live0 + 1);
  CUarray fresh = nullptr;
  CUresult made = CUDA_ERROR_UNKNOWN;
  Meanwhile b;
  b.may_block = std::getenv("CUWARDEN_POOL") != nullptr;  // the cache's retain waits for the release
  b.work = [&] {
    CUcontext p = nullptr;
    if (cuDevicePrimaryCtxRetain(&p, dev) == CUDA_SUCCESS && cuCtxSetCurrent(p) == CUDA_SUCCESS)
      made = cuArrayCreate(&fresh, &small);
  };
  fakecuda_pause_in("cuDevicePrimaryCtxGetState", &Meanwhile::run, &b);
  release_primary_until_destroyed(dev, b);
  b.join();
  fakecuda_pause_in(nullptr, nullptr, nullptr);
  REQUIRE(made == CUDA_SUCCESS);
  CHECK(d.live_allocations.load() == live0 + 1);  // B's array; the old one is gone
  REQUIRE(cuArrayDestroy(fresh) == CUDA_SUCCESS);
  CHECK(d.live_allocations.load() == live0);
  CHECK(own() == own0);
}  // B's retain is the primary's reference now

// Thread B makes the primary context active again while A's last release, which destroyed
// it, is still in the driver (paused there), so that A finds the primary active when it
// checks. It is a new activation (the same handle, a new context ID, as on the real
// driver): the memory and arrays of the old one are gone and stop counting. (With
// CUWARDEN_POOL=cache B's retain waits for A's check: then A finds the primary inactive.)
TEST_CASE("a primary context's last release counts its memory freed when another thread made it active again at once",
          "[ctx_gone_race]") {
  const CUdevice dev = on_primary();
  auto& d = dev_counters();
  auto own = [&d] { return d.used.load() - d.cached.load(); };
  const uint64_t live0 = d.live_allocations.load(), own0 = own();
  CUdeviceptr p = 0;
  REQUIRE(cuMemAlloc(&p, kMiB) == CUDA_SUCCESS);
  const CUDA_ARRAY_DESCRIPTOR small = float_2d(1);
  CUarray a = nullptr;
  REQUIRE(cuArrayCreate(&a, &small) == CUDA_SUCCESS);
  REQUIRE(d.live_allocations.load() == live0 + 2);
  CUresult retained = CUDA_ERROR_UNKNOWN;
  Meanwhile b;
  b.may_block = std::getenv("CUWARDEN_POOL") != nullptr;
  b.work = [&] {
    CUcontext c = nullptr;
    retained = cuDevicePrimaryCtxRetain(&c, dev);
    if (retained == CUDA_SUCCESS) retained = cuCtxSetCurrent(c);
  };
  fakecuda_pause_in("cuDevicePrimaryCtxRelease", &Meanwhile::run, &b);
  release_primary_until_destroyed(dev, b);
  b.join();
  fakecuda_pause_in(nullptr, nullptr, nullptr);
  REQUIRE(retained == CUDA_SUCCESS);
  CHECK(d.live_allocations.load() == live0);
  CHECK(own() == own0);
}  // B's retain is the primary's reference now

// cuArrayDestroy(H) on thread A; H's context X destroyed by thread B while A's driver call
// runs, before it finds H (the simulated driver pauses A there). The driver freed H with X
// and refuses A's destroy (CUDA_ERROR_INVALID_HANDLE): H is counted freed once, not kept
// counted forever (the record A took out is out of the table while B counts X's arrays).
TEST_CASE("an array destroy its context's destruction overtakes counts the array freed once", "[ctx_gone_race]") {
  CUcontext primary = nullptr;
  const CUdevice dev = on_primary(&primary);
  auto& d = dev_counters();
  const uint64_t live0 = d.live_allocations.load(), used0 = d.used.load(), frees0 = d.free_count.load();
  const CUDA_ARRAY_DESCRIPTOR small = float_2d(1);
  CUcontext x = nullptr;
  REQUIRE(cuCtxCreate(&x, nullptr, 0, dev) == CUDA_SUCCESS);
  CUarray h = nullptr;
  REQUIRE(cuArrayCreate(&h, &small) == CUDA_SUCCESS);
  REQUIRE(cuCtxSetCurrent(primary) == CUDA_SUCCESS);
  REQUIRE(d.live_allocations.load() == live0 + 1);
  CUresult destroyed = CUDA_ERROR_UNKNOWN;
  Meanwhile b;
  b.work = [&] { destroyed = cuCtxDestroy(x); };
  fakecuda_pause_in("cuArrayDestroy", &Meanwhile::run, &b);
  CHECK(cuArrayDestroy(h) == CUDA_ERROR_INVALID_HANDLE);  // the context took it first
  b.join();
  fakecuda_pause_in(nullptr, nullptr, nullptr);
  REQUIRE(destroyed == CUDA_SUCCESS);
  CHECK(d.live_allocations.load() == live0);
  CHECK(d.used.load() == used0);
  CHECK(d.free_count.load() == frees0 + 1);
}

// As above, and after the driver has refused A's destroy (H names no array any more) B
// creates an array, to which the driver hands H again (the simulated driver recycles
// handles, the last destroyed first), before A's hook has put H's record back. A's old
// array, gone with X, is counted freed once (api reused); B's array keeps H and its record,
// and stays counted until B destroys it.
TEST_CASE("an array destroy refused after its handle went to a new array leaves the new one counted",
          "[ctx_gone_race]") {
  CUcontext primary = nullptr;
  const CUdevice dev = on_primary(&primary);
  auto& d = dev_counters();
  const CUDA_ARRAY_DESCRIPTOR small = float_2d(1);
  drain_events();
  const uint64_t live0 = d.live_allocations.load(), frees0 = d.free_count.load();
  CUcontext x = nullptr;
  REQUIRE(cuCtxCreate(&x, nullptr, 0, dev) == CUDA_SUCCESS);
  CUarray h = nullptr;
  REQUIRE(cuArrayCreate(&h, &small) == CUDA_SUCCESS);
  REQUIRE(cuCtxSetCurrent(primary) == CUDA_SUCCESS);
  CUarray h2 = nullptr;
  CUresult destroyed = CUDA_ERROR_UNKNOWN, made = CUDA_ERROR_UNKNOWN;
  Meanwhile create;
  create.work = [&] {
    if (cuCtxSetCurrent(primary) == CUDA_SUCCESS) made = cuArrayCreate(&h2, &small);
  };
  Meanwhile destroy;
  destroy.work = [&] {
    destroyed = cuCtxDestroy(x);
    fakecuda_pause_in("cuArrayDestroy refused", &Meanwhile::run, &create);
  };
  fakecuda_pause_in("cuArrayDestroy", &Meanwhile::run, &destroy);
  CHECK(cuArrayDestroy(h) == CUDA_ERROR_INVALID_HANDLE);
  destroy.join();
  create.join();
  fakecuda_pause_in(nullptr, nullptr, nullptr);
  REQUIRE(destroyed == CUDA_SUCCESS);
  REQUIRE(made == CUDA_SUCCESS);
  REQUIRE(h2 == h);  // the driver handed the handle out again
  CHECK(d.live_allocations.load() == live0 + 1);  // B's array
  CHECK(d.free_count.load() == frees0 + 1);       // A's, once
  const auto events = drain_events();
  const auto old_freed = std::count_if(events.begin(), events.end(), [&](const cuw::ring::Event& e) {
    return e.kind == static_cast<uint8_t>(cuw::ring::EventKind::free) && e.address == reinterpret_cast<uint64_t>(h);
  });
  CHECK(old_freed == 1);
  REQUIRE(cuArrayDestroy(h2) == CUDA_SUCCESS);  // B's record is there to be freed
  CHECK(d.live_allocations.load() == live0);
  CHECK(d.free_count.load() == frees0 + 2);
}

// A primary context keeps its handle when it is destroyed and made active again (the
// simulated driver, like the real one, hands out the same CUcontext). Thread B retains the
// primary right after thread A's release destroyed it, and creates an array in it: that array
// is live (the driver holds it), so it stays counted, whenever A's sweep of the old
// context's arrays runs. Matching arrays by context handle alone counted it freed.
TEST_CASE("an array created in a primary context another thread made active again stays counted",
          "[ctx_gone_race]") {
  CUcontext primary = nullptr;
  const CUdevice dev = on_primary(&primary);
  auto& d = dev_counters();
  release_primary_fully(dev);  // refs 0: each round's release below destroys it unless B retained first
  const uint64_t live0 = d.live_allocations.load();
  const CUDA_ARRAY_DESCRIPTOR small = float_2d(1);
  constexpr int kIters = 20000;
  // Per iteration, two handoffs (each can wait for a time slice on a loaded machine): A
  // retains (refs 1) and signals go; A releases (destroying the primary unless B retained
  // first) while B retains and creates an array; when B has made it, A (whose release and
  // sweep are over) checks that the live array is counted, destroys it and drops B's reference.
  std::atomic<int> go{0}, made{0};
  std::atomic<CUarray> array{nullptr};
  std::atomic<CUresult> result{CUDA_ERROR_UNKNOWN};
  std::atomic<uint64_t> swept_live{0}, created{0}, unexpected{0};
  std::thread b([&] {
    for (int i = 1; i <= kIters; ++i) {
      await_value(go, i);
      for (int s = 0; s < (i % 64) * 8; ++s) __asm__ volatile("" ::: "memory");  // sweep the window
      CUcontext p = nullptr;
      if (cuDevicePrimaryCtxRetain(&p, dev) != CUDA_SUCCESS || p != primary) ++unexpected;
      if (i == 1 && cuCtxSetCurrent(p) != CUDA_SUCCESS) ++unexpected;
      CUarray h = nullptr;
      result.store(cuArrayCreate(&h, &small));
      array.store(h);
      publish(made, i);
    }
  });
  for (int i = 1; i <= kIters; ++i) {
    CUcontext p = nullptr;
    REQUIRE(cuDevicePrimaryCtxRetain(&p, dev) == CUDA_SUCCESS);  // active, refs 1
    publish(go, i);
    REQUIRE(cuDevicePrimaryCtxRelease(dev) == CUDA_SUCCESS);  // destroys it unless B retained first
    await_value(made, i);
    if (result.load() == CUDA_SUCCESS) {
      ++created;
      // The array is the driver's (its destroy below succeeds): it must be counted.
      if (d.live_allocations.load() != live0 + 1) ++swept_live;
      if (cuArrayDestroy(array.load()) != CUDA_SUCCESS) ++unexpected;
    } else {
      ++unexpected;
    }
    if (cuDevicePrimaryCtxRelease(dev) != CUDA_SUCCESS) ++unexpected;  // B's reference
  }
  b.join();
  REQUIRE(cuDevicePrimaryCtxRetain(&primary, dev) == CUDA_SUCCESS);
  CHECK(unexpected.load() == 0);
  CHECK(created.load() == kIters);
  CHECK(swept_live.load() == 0);
  CHECK(d.live_allocations.load() == live0);
}

// cuArrayDestroy(H) on one thread racing cuCtxDestroy(X) (H's context) on another. Whoever
// reaches the driver first frees H; either way H is gone and stops counting. When the
// context wins, the array destroy fails (CUDA_ERROR_INVALID_HANDLE) while its record is out
// of the table; the record put back is then counted freed, not kept forever.
TEST_CASE("an array destroy that loses to its context's destruction is counted freed",
          "[ctx_gone_race]") {
  CUcontext primary = nullptr;
  const CUdevice dev = on_primary(&primary);
  auto& d = dev_counters();
  const uint64_t live0 = d.live_allocations.load(), used0 = d.used.load(), frees0 = d.free_count.load();
  const CUDA_ARRAY_DESCRIPTOR small = float_2d(1);
  // Up to kIters rounds, more while one side has always won (a loaded machine can keep one
  // thread ahead): the side that always wins sleeps in the next rounds.
  constexpr int kIters = 2000, kMaxIters = 8000;
  std::atomic<int> go{0}, a_done{0}, b_done{0}, rounds{kMaxIters};
  std::atomic<int> delay_a{0}, delay_b{0};
  std::atomic<CUarray> arr{nullptr};
  std::atomic<CUcontext> ctx{nullptr};
  std::atomic<uint64_t> lost_to_ctx{0}, unexpected{0};
  std::thread a([&] {
    for (int i = 1; i <= rounds.load(); ++i) {
      await_value(go, i);
      if (i > rounds.load()) break;
      for (int s = 0; s < (i % 32) * 16; ++s) __asm__ volatile("" ::: "memory");
      if (const int us = delay_a.load()) std::this_thread::sleep_for(std::chrono::microseconds(us));
      const CUresult r = cuArrayDestroy(arr.load());
      if (r == CUDA_ERROR_INVALID_HANDLE) ++lost_to_ctx;
      else if (r != CUDA_SUCCESS) ++unexpected;
      publish(a_done, i);
    }
  });
  std::thread b([&] {
    for (int i = 1; i <= rounds.load(); ++i) {
      await_value(go, i);
      if (i > rounds.load()) break;
      for (int s = 0; s < ((i / 32) % 32) * 16; ++s) __asm__ volatile("" ::: "memory");
      if (const int us = delay_b.load()) std::this_thread::sleep_for(std::chrono::microseconds(us));
      if (cuCtxDestroy(ctx.load()) != CUDA_SUCCESS) ++unexpected;
      publish(b_done, i);
    }
  });
  uint64_t drift_at = 0;
  int done = 0;
  for (int i = 1; i <= kMaxIters; ++i) {
    if (i > kIters && lost_to_ctx.load() > 0 && lost_to_ctx.load() < static_cast<uint64_t>(i - 1)) break;
    // On a loaded machine one thread can run its whole turn before the other is scheduled:
    // the side that always won sleeps, a little longer each 500 rounds (50 us to 12.8 ms),
    // and some rounds of each are spread by the sleep's own jitter.
    if (i > 1 && (i - 1) % 500 == 0) {
      const auto grow = [](std::atomic<int>& us) { us.store(us.load() ? std::min(us.load() * 2, 12800) : 50); };
      if (lost_to_ctx.load() == static_cast<uint64_t>(i - 1)) grow(delay_b);  // the context always won
      if (lost_to_ctx.load() == 0) grow(delay_a);                              // the array destroy did
    }
    CUcontext x = nullptr;
    REQUIRE(cuCtxCreate(&x, nullptr, 0, dev) == CUDA_SUCCESS);
    CUarray h = nullptr;
    REQUIRE(cuArrayCreate(&h, &small) == CUDA_SUCCESS);
    REQUIRE(cuCtxSetCurrent(primary) == CUDA_SUCCESS);
    ctx.store(x);
    arr.store(h);
    publish(go, i);
    await_value(a_done, i);
    await_value(b_done, i);
    done = i;
    if (!drift_at && d.live_allocations.load() != live0) drift_at = static_cast<uint64_t>(i);
  }
  rounds.store(done);
  publish(go, done + 1);  // releases both threads from their wait for a round that does not come
  a.join();
  b.join();
  INFO("array destroys that lost to the context: " << lost_to_ctx.load() << " of " << done
                                                    << "; first drift at iteration " << drift_at);
  CHECK(lost_to_ctx.load() > 0);  // the race was run both ways
  CHECK(lost_to_ctx.load() < static_cast<uint64_t>(done));
  CHECK(unexpected.load() == 0);
  CHECK(d.live_allocations.load() == live0);
  CHECK(d.used.load() == used0);
  CHECK(d.free_count.load() == frees0 + static_cast<uint64_t>(done));  // each array counted freed once
}

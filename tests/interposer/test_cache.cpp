// Interposer tests: the pooled backends (CUWARDEN_POOL=cache, and vmm: the same pool over
// granules), on the simulated driver. ctest runs each tag in its own process, under each
// backend: [cache] (cap 256 MiB, two 1 GiB devices), [cache_cap] (cap 256 MiB),
// [cache_reset] (runs last things: a primary context reset). Where the layouts differ (IPC,
// what gives memory back to the driver) a test checks the one it runs under.
//
// What they prove: cudaFree's promise (a block freed while queued work still uses it is not
// handed out before that work completes, on any stream; data of every live block is intact
// under churn across threads and streams), no event, query or synchronization while a
// capture is active, the cap refused only after the cache gave back what it keeps, range
// queries and IPC describing the program's allocation, peer copies, the counters.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "fakecuda.h"
#include "support.hpp"

using namespace cuwtest;

namespace {

using cuwtest::kMiB;
constexpr uint64_t kCacheCap = 256 * kMiB;

using clock_type = std::chrono::steady_clock;

double ms_since(clock_type::time_point t0) {
  return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
}

CUstream make_stream(unsigned flags = CU_STREAM_NON_BLOCKING) {
  CUstream s = nullptr;
  REQUIRE(cuStreamCreate(&s, flags) == CUDA_SUCCESS);
  return s;
}

}  // namespace

TEST_CASE("cache: a block freed while queued work still writes it is not handed out before that work is done",
          "[cache]") {
  make_context();
  touch_interposer();
  REQUIRE(std::string(own_ring().pool) == pool_name());
  for (unsigned flags : {unsigned{CU_STREAM_NON_BLOCKING}, unsigned{CU_STREAM_DEFAULT}}) {
    INFO("stream flags " << flags);
    CUstream s = make_stream(flags);
    CUdeviceptr p = 0;
    REQUIRE(cuMemAlloc(&p, 4096) == CUDA_SUCCESS);
    // A slow "kernel" that writes p a second from now, then the free: cudaFree's promise says
    // p may not back another allocation before that write has happened.
    REQUIRE(slow_fill(s, p, 0xEE, 4096, 1000) == CUDA_SUCCESS);
    REQUIRE(cuMemFree(p) == CUDA_SUCCESS);
    // No device-wide synchronization per free: the free returned with the write still queued.
    CHECK(cuStreamQuery(s) == CUDA_ERROR_NOT_READY);
    std::vector<CUdeviceptr> got;
    bool reused_early = false;
    for (int i = 0; i < 300; ++i) {
      CUdeviceptr q = 0;
      REQUIRE(cuMemAlloc(&q, 4096) == CUDA_SUCCESS);
      if (q == p && cuStreamQuery(s) == CUDA_ERROR_NOT_READY) reused_early = true;
      REQUIRE(cuMemsetD8(q, 0x11, 4096) == CUDA_SUCCESS);
      got.push_back(q);
    }
    CHECK_FALSE(reused_early);
    REQUIRE(cuStreamSynchronize(s) == CUDA_SUCCESS);
    // The late write landed in p alone: every block handed out keeps its own bytes.
    int intact = 0;
    for (CUdeviceptr q : got) intact += all_bytes(q, 4096, 0x11) ? 1 : 0;
    CHECK(intact == 300);
    for (CUdeviceptr q : got) REQUIRE(cuMemFree(q) == CUDA_SUCCESS);
    // Once the work is done the block is reused (the cache does not simply never reuse):
    // allocating more blocks than the cache holds of this size reaches it.
    got.clear();
    bool reused_later = false;
    for (int i = 0; i < 2000 && !reused_later; ++i) {
      CUdeviceptr q = 0;
      REQUIRE(cuMemAlloc(&q, 4096) == CUDA_SUCCESS);
      reused_later = q == p;
      got.push_back(q);
    }
    CHECK(reused_later);
    for (CUdeviceptr q : got) REQUIRE(cuMemFree(q) == CUDA_SUCCESS);
    REQUIRE(cuStreamDestroy(s) == CUDA_SUCCESS);
  }
}

TEST_CASE("cache: a large block freed while queued work uses it is waited for, never reused early", "[cache]") {
  make_context();
  touch_interposer();
  auto& d = dev_counters();
  CUstream s = make_stream();
  CUdeviceptr p = 0;
  REQUIRE(cuMemAlloc(&p, 64 * kMiB) == CUDA_SUCCESS);
  REQUIRE(slow_fill(s, p, 0xEE, 64 * kMiB, 300) == CUDA_SUCCESS);
  REQUIRE(cuMemFree(p) == CUDA_SUCCESS);
  const uint64_t waits0 = d.pool_waits.load();
  CUdeviceptr q = 0;
  REQUIRE(cuMemAlloc(&q, 64 * kMiB) == CUDA_SUCCESS);
  if (q == p) {
    // Reused: only after the write completed (the cache waited on its event).
    CHECK(cuStreamQuery(s) == CUDA_SUCCESS);
    CHECK(d.pool_waits.load() > waits0);
  }
  REQUIRE(cuMemsetD8(q, 0x22, 64 * kMiB) == CUDA_SUCCESS);
  REQUIRE(cuStreamSynchronize(s) == CUDA_SUCCESS);
  CHECK(all_bytes(q, 64 * kMiB, 0x22));
  REQUIRE(cuMemFree(q) == CUDA_SUCCESS);
  REQUIRE(cuStreamDestroy(s) == CUDA_SUCCESS);
}

TEST_CASE("cache: with no work queued since a completed event, a freed block is reused at once, with no event",
          "[cache]") {
  make_context();
  touch_interposer();
  auto& d = dev_counters();
  CUstream s = make_stream();
  for (size_t bytes : {size_t{4096}, size_t{1 * kMiB}, size_t{64 * kMiB}}) {
    INFO(bytes << " bytes");
    // The block has been written by work that has finished; then pairs with no work between.
    CUdeviceptr p = 0;
    REQUIRE(cuMemAlloc(&p, bytes) == CUDA_SUCCESS);
    REQUIRE(cuMemsetD8Async(p, 0x5A, bytes, s) == CUDA_SUCCESS);
    REQUIRE(cuStreamSynchronize(s) == CUDA_SUCCESS);
    REQUIRE(cuMemFree(p) == CUDA_SUCCESS);
    REQUIRE(reach_idle(bytes));
    fakecuda_reset_counters();
    const uint64_t hits0 = d.pool_hits.load(), allocs0 = fakecuda_call_count("cuMemAlloc");
    CUdeviceptr first = 0;
    int same = 0;
    for (int i = 0; i < 1000; ++i) {
      CUdeviceptr q = 0;
      REQUIRE(cuMemAlloc(&q, bytes) == CUDA_SUCCESS);
      if (i == 0) first = q;
      same += q == first ? 1 : 0;
      REQUIRE(cuMemFree(q) == CUDA_SUCCESS);
    }
    CHECK(same == 1000);  // the same block every time: reused at once
    CHECK(d.pool_hits.load() - hits0 == 1000);
    CHECK(fakecuda_call_count("cuMemAlloc") == allocs0);
    for (const char* fn : {"cuEventRecord", "cuEventQuery", "cuEventSynchronize", "cuCtxSynchronize"}) {
      INFO(fn);
      CHECK(fakecuda_call_count(fn) == 0);
    }
  }
  REQUIRE(cuStreamDestroy(s) == CUDA_SUCCESS);
}

TEST_CASE("cache: work queued through any kind of entry point holds back reuse of the blocks it uses", "[cache]") {
  make_context();
  touch_interposer();
  CUstream s = make_stream();
  constexpr size_t kBytes = 8 * kMiB;
  std::vector<unsigned char> host(kBytes, 0xEE);
  CUdeviceptr src = 0;
  REQUIRE(cuMemAlloc(&src, kBytes) == CUDA_SUCCESS);
  REQUIRE(cuMemsetD8(src, 0xEE, kBytes) == CUDA_SUCCESS);
  // Each writes p late: queued behind 300 ms of earlier work on the non-blocking stream s.
  const std::pair<const char*, std::function<CUresult(CUdeviceptr)>> ways[] = {
      {"cuMemsetD8Async", [&](CUdeviceptr p) { return cuMemsetD8Async(p, 0xEE, kBytes, s); }},
      {"cuMemsetD32Async", [&](CUdeviceptr p) { return cuMemsetD32Async(p, 0xEEEEEEEE, kBytes / 4, s); }},
      {"cuMemcpyHtoDAsync", [&](CUdeviceptr p) { return cuMemcpyHtoDAsync(p, host.data(), kBytes, s); }},
      {"cuMemcpyDtoDAsync", [&](CUdeviceptr p) { return cuMemcpyDtoDAsync(p, src, kBytes, s); }},
      {"cuMemcpyAsync", [&](CUdeviceptr p) { return cuMemcpyAsync(p, src, kBytes, s); }},
      {"cuLaunchHostFunc", [&](CUdeviceptr p) { return slow_fill(s, p, 0xEE, kBytes, 0); }},
  };
  for (const auto& [name, write] : ways) {
    INFO(name);
    REQUIRE(reach_idle(kBytes));
    CUdeviceptr p = 0;
    REQUIRE(cuMemAlloc(&p, kBytes) == CUDA_SUCCESS);
    // The earlier part of the "kernel" is not a driver call the interposer sees; the write
    // that follows it on the same stream is.
    REQUIRE(fakecuda_stream_delay(s, 300) == CUDA_SUCCESS);
    REQUIRE(write(p) == CUDA_SUCCESS);
    REQUIRE(cuMemFree(p) == CUDA_SUCCESS);
    CUdeviceptr q = 0;
    REQUIRE(cuMemAlloc(&q, kBytes) == CUDA_SUCCESS);
    if (q == p) CHECK(cuStreamQuery(s) == CUDA_SUCCESS);  // reused only once the write ran
    REQUIRE(cuMemsetD8(q, 0x22, kBytes) == CUDA_SUCCESS);
    REQUIRE(cuStreamSynchronize(s) == CUDA_SUCCESS);
    CHECK(all_bytes(q, kBytes, 0x22));
    REQUIRE(cuMemFree(q) == CUDA_SUCCESS);
  }
  REQUIRE(cuMemFree(src) == CUDA_SUCCESS);
  REQUIRE(cuStreamDestroy(s) == CUDA_SUCCESS);
}

TEST_CASE("cache: a work entry point cuwarden does not hook turns the fast reuse off", "[cache_untracked]") {
  make_context();
  touch_interposer();
  CUstream s = make_stream();
  CUdeviceptr p = 0;
  REQUIRE(cuMemAlloc(&p, 4096) == CUDA_SUCCESS);
  REQUIRE(cuMemsetD8Async(p, 1, 4096, s) == CUDA_SUCCESS);
  REQUIRE(cuStreamSynchronize(s) == CUDA_SUCCESS);
  REQUIRE(cuMemFree(p) == CUDA_SUCCESS);
  REQUIRE(reach_idle(4096));
  // The 32-bit-era cuMemcpyHtoD (CUDA 2.0 ABI) is not hooked: once the program holds it,
  // the interposer can no longer see all work, and every reuse waits for an event again.
  void* fn = nullptr;
  REQUIRE(cuGetProcAddress_v2("cuMemcpyHtoD", &fn, 2000, CU_GET_PROC_ADDRESS_DEFAULT, nullptr) == CUDA_SUCCESS);
  REQUIRE(fn != nullptr);
  fakecuda_reset_counters();
  for (int i = 0; i < 200; ++i) {
    CUdeviceptr q = 0;
    REQUIRE(cuMemAlloc(&q, 4096) == CUDA_SUCCESS);
    REQUIRE(cuMemFree(q) == CUDA_SUCCESS);
  }
  CHECK(fakecuda_call_count("cuEventRecord") > 0);
  CHECK_FALSE(reach_idle(4096, 5));
  REQUIRE(cuStreamDestroy(s) == CUDA_SUCCESS);
}

TEST_CASE("cache: a destroyed stream's queued work still holds back blocks freed after the destroy", "[cache]") {
  make_context();
  touch_interposer();
  CUstream s = make_stream();
  CUdeviceptr p = 0;
  REQUIRE(cuMemAlloc(&p, 8192) == CUDA_SUCCESS);
  std::atomic<bool> written{false};
  REQUIRE(slow_fill(s, p, 0xEE, 8192, 300, &written) == CUDA_SUCCESS);
  REQUIRE(cuStreamDestroy(s) == CUDA_SUCCESS);  // legal: the queued work still runs
  REQUIRE(cuMemFree(p) == CUDA_SUCCESS);
  std::vector<CUdeviceptr> got;
  for (int i = 0; i < 200; ++i) {
    CUdeviceptr q = 0;
    REQUIRE(cuMemAlloc(&q, 8192) == CUDA_SUCCESS);
    REQUIRE(cuMemsetD8(q, 0x33, 8192) == CUDA_SUCCESS);
    got.push_back(q);
  }
  // Wait for the destroyed stream's write to have run: p then reads 0xEE (whether or not it
  // was wrongly handed out again, which the check below catches).
  const auto t0 = clock_type::now();
  while (!written.load(std::memory_order_acquire) && ms_since(t0) < 30000)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  REQUIRE(written.load(std::memory_order_acquire));
  REQUIRE(all_bytes(p, 8192, 0xEE));
  int intact = 0;
  for (CUdeviceptr q : got) intact += all_bytes(q, 8192, 0x33) ? 1 : 0;
  CHECK(intact == 200);
  for (CUdeviceptr q : got) REQUIRE(cuMemFree(q) == CUDA_SUCCESS);
}

TEST_CASE("cache: data of every live block is intact after random churn across threads and streams",
          "[cache][churn]") {
  make_context();
  touch_interposer();
  CUcontext ctx = nullptr;
  REQUIRE(cuCtxGetCurrent(&ctx) == CUDA_SUCCESS);
  constexpr int kThreads = 4;
  constexpr int kOps = 1500;
  std::atomic<uint64_t> unexpected{0}, corrupt{0}, checked{0}, hits_before{dev_counters().pool_hits.load()};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      if (cuCtxSetCurrent(ctx) != CUDA_SUCCESS) ++unexpected;
      // Two non-blocking streams and the default (legacy) stream per thread.
      CUstream streams[3] = {nullptr, nullptr, nullptr};
      for (int k = 0; k < 2; ++k)
        if (cuStreamCreate(&streams[k], CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) ++unexpected;
      std::mt19937_64 rng(77 + t);
      struct Live {
        CUdeviceptr p;
        size_t n;
        unsigned char v;
        CUstream s;  ///< where its data was written
      };
      std::vector<Live> live;
      auto verify = [&](const Live& l) {
        std::vector<unsigned char> h(l.n);
        if (cuMemcpyDtoH(h.data(), l.p, l.n) != CUDA_SUCCESS) ++unexpected;
        for (unsigned char c : h)
          if (c != l.v) {
            ++corrupt;
            break;
          }
        ++checked;
      };
      for (int i = 0; i < kOps; ++i) {
        CUstream s = streams[rng() % 3];
        if (live.size() < 24 && (rng() % 2 == 0 || live.empty())) {
          const uint64_t r = rng() % 100;
          const size_t n = r < 70 ? 1 + rng() % 16384 : r < 95 ? 16384 + rng() % kMiB : 2 * kMiB + rng() % (6 * kMiB);
          CUdeviceptr p = 0;
          if (cuMemAlloc(&p, n) != CUDA_SUCCESS) {
            ++unexpected;
            continue;
          }
          const unsigned char v = static_cast<unsigned char>(1 + (t * 61 + i) % 200);
          // The owner's data, written by work on one of its streams.
          if (cuMemsetD8Async(p, v, n, s) != CUDA_SUCCESS) ++unexpected;
          live.push_back({p, n, v, s});
        } else {
          const size_t k = rng() % live.size();
          Live l = live[k];
          live.erase(live.begin() + static_cast<long>(k));
          // Queued work that still writes the block after the free is called (one in four
          // of them slow), after the owner's own write on the same stream: if the block
          // were handed out before it ran, it would overwrite the next owner's data.
          const unsigned delay = rng() % 4 == 0 ? 2 : 0;
          if (slow_fill(l.s, l.p, 0xEE, l.n, delay) != CUDA_SUCCESS) ++unexpected;
          if (cuMemFree(l.p) != CUDA_SUCCESS) ++unexpected;
        }
        if (i % 300 == 299) {  // check the live blocks once their own writes are done
          for (CUstream q : streams)
            if (cuStreamSynchronize(q) != CUDA_SUCCESS) ++unexpected;
          for (const Live& l : live) verify(l);
        }
      }
      for (CUstream q : streams)
        if (cuStreamSynchronize(q) != CUDA_SUCCESS) ++unexpected;
      for (const Live& l : live) {
        verify(l);
        if (cuMemFree(l.p) != CUDA_SUCCESS) ++unexpected;
      }
      for (int k = 0; k < 2; ++k)
        if (cuStreamDestroy(streams[k]) != CUDA_SUCCESS) ++unexpected;
    });
  }
  for (auto& th : threads) th.join();
  REQUIRE(cuCtxSynchronize() == CUDA_SUCCESS);
  CHECK(unexpected.load() == 0);
  CHECK(corrupt.load() == 0);
  CHECK(checked.load() > 200);
  CHECK(dev_counters().pool_hits.load() - hits_before.load() > 1000);  // the cache really reused blocks
  CHECK(dev_counters().live_allocations.load() == 0);
}

TEST_CASE("cache: while a capture is active nothing is recorded, queried or synchronized", "[cache][capture]") {
  make_context();
  touch_interposer();
  // Warm the cache with ready blocks of two sizes.
  std::vector<CUdeviceptr> warm;
  for (int i = 0; i < 200; ++i) {
    CUdeviceptr p = 0;
    REQUIRE(cuMemAlloc(&p, i % 10 ? 4096 : 3 * kMiB) == CUDA_SUCCESS);
    warm.push_back(p);
  }
  for (CUdeviceptr p : warm) REQUIRE(cuMemFree(p) == CUDA_SUCCESS);
  REQUIRE(cuCtxSynchronize() == CUDA_SUCCESS);
  {  // one allocation after the synchronization retires everything (seal + poll)
    CUdeviceptr p = 0;
    REQUIRE(cuMemAlloc(&p, 4096) == CUDA_SUCCESS);
    REQUIRE(cuMemFree(p) == CUDA_SUCCESS);
  }

  CUstream s = make_stream();
  CUdeviceptr captured = 0;
  REQUIRE(cuMemAlloc(&captured, 4096) == CUDA_SUCCESS);
  // (Allocations during the capture get the driver's answer: test_stream_order.cpp.)
  std::vector<CUdeviceptr> got;
  for (int i = 0; i < 270; ++i) {  // more frees than a batch: the free path would seal
    CUdeviceptr p = 0;
    REQUIRE(cuMemAlloc(&p, i % 90 ? 4096 : 3 * kMiB) == CUDA_SUCCESS);
    got.push_back(p);
  }
  REQUIRE(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
  fakecuda_reset_counters();
  // Work queued during the capture (a graph node): frees can no longer be proven idle, so
  // they go through batches, which are not sealed while the capture lasts.
  REQUIRE(cuMemsetD8Async(captured, 1, 4096, s) == CUDA_SUCCESS);
  for (CUdeviceptr p : got) REQUIRE(cuMemFree(p) == CUDA_SUCCESS);
  got.clear();
  for (const char* fn : {"cuEventRecord", "cuEventQuery", "cuEventSynchronize", "cuCtxSynchronize",
                         "cuStreamSynchronize", "cuStreamQuery", "cuMemAlloc", "cuMemFree", "cuStreamWaitEvent"}) {
    INFO(fn);
    CHECK(fakecuda_call_count(fn) == 0);
  }
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  REQUIRE(cuStreamIsCapturing(s, &st) == CUDA_SUCCESS);
  CHECK(st == CU_STREAM_CAPTURE_STATUS_ACTIVE);  // the capture was not invalidated
  CUgraph g = nullptr;
  REQUIRE(cuStreamEndCapture(s, &g) == CUDA_SUCCESS);
  REQUIRE(g != nullptr);
  REQUIRE(cuGraphDestroy(g) == CUDA_SUCCESS);

  // After the capture the frees made during it are retired as usual (the next free seals).
  fakecuda_reset_counters();
  REQUIRE(cuMemFree(captured) == CUDA_SUCCESS);
  for (int i = 0; i < 300; ++i) {
    CUdeviceptr p = 0;
    REQUIRE(cuMemAlloc(&p, 4096) == CUDA_SUCCESS);
    REQUIRE(cuMemFree(p) == CUDA_SUCCESS);
  }
  CHECK(fakecuda_call_count("cuEventRecord") > 0);
  REQUIRE(cuStreamDestroy(s) == CUDA_SUCCESS);
}

TEST_CASE("cache: cuMemFreeAsync of a pooled block inside a capture is refused, outside it is a free",
          "[cache][capture]") {
  make_context();
  touch_interposer();
  CUstream s = make_stream();
  CUdeviceptr p = 0;
  REQUIRE(cuMemAlloc(&p, 4096) == CUDA_SUCCESS);
  REQUIRE(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED) == CUDA_SUCCESS);
  CHECK(cuMemFreeAsync(p, s) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  CUgraph g = nullptr;
  REQUIRE(cuStreamEndCapture(s, &g) == CUDA_SUCCESS);
  if (g) REQUIRE(cuGraphDestroy(g) == CUDA_SUCCESS);
  const uint64_t live = dev_counters().live_allocations.load();
  CHECK(cuMemFreeAsync(p, s) == CUDA_SUCCESS);
  CHECK(dev_counters().live_allocations.load() == live - 1);
  REQUIRE(cuStreamDestroy(s) == CUDA_SUCCESS);
}

// Under both pools (ctest interposer.cache and interposer.vmm_cache): the driver alone would
// answer with the pool's segment (a slab, a whole block), or under vmm with a 2 MiB chunk of
// the mapping (cuMemGetAddressRange) or the whole reservation (the range attributes).
TEST_CASE("pools: address-range queries describe the program's allocation, not the pool's memory",
          "[cache][query]") {
  make_context();
  touch_interposer();
  REQUIRE(std::string(own_ring().pool) == pool_name());
  CUdeviceptr a = 0, b = 0, big = 0;
  REQUIRE(cuMemAlloc(&a, 1000) == CUDA_SUCCESS);
  REQUIRE(cuMemAlloc(&b, 1000) == CUDA_SUCCESS);
  REQUIRE(cuMemAlloc(&big, 3 * kMiB + 7) == CUDA_SUCCESS);
  if (vmm_pool()) CHECK(big % 512 == 0);  // a stretch of a range (large blocks pack to 512 bytes)
  for (auto [p, n] : {std::pair{a, size_t{1000}}, std::pair{b, size_t{1000}}, std::pair{big, size_t{3 * kMiB + 7}}}) {
    INFO("block " << std::hex << p << " of " << std::dec << n);
    CHECK(p % 256 == 0);  // cudaMalloc's alignment
    CUdeviceptr base = 0;
    size_t size = 0;
    for (CUdeviceptr q : {p, p + n / 2, p + n - 1}) {
      REQUIRE(cuMemGetAddressRange(&base, &size, q) == CUDA_SUCCESS);
      CHECK(base == p);
      CHECK(size == n);
    }
    CUdeviceptr start = 0;
    size_t rsize = 0;
    REQUIRE(cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p + 1) == CUDA_SUCCESS);
    REQUIRE(cuPointerGetAttribute(&rsize, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p + 1) == CUDA_SUCCESS);
    CHECK(start == p);
    CHECK(rsize == n);
    CUpointer_attribute attrs[3] = {CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                                    CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL};
    CUdeviceptr s2 = 0;
    size_t n2 = 0;
    int ord = -1;
    void* data[3] = {&s2, &n2, &ord};
    REQUIRE(cuPointerGetAttributes(3, attrs, data, p + n - 1) == CUDA_SUCCESS);
    CHECK(s2 == p);
    CHECK(n2 == n);
    CHECK(ord == 0);
    // The whole allocation is the program's to write.
    REQUIRE(cuMemsetD8(p, 0x3C, n) == CUDA_SUCCESS);
    CHECK(all_bytes(p, n, 0x3C));
  }
  // Freed: as the driver answers for freed memory; a second free is refused.
  REQUIRE(cuMemFree(a) == CUDA_SUCCESS);
  REQUIRE(cuMemFree(big) == CUDA_SUCCESS);
  for (CUdeviceptr p : {a, big}) {
    INFO("freed block " << std::hex << p);
    CUdeviceptr base = 0;
    size_t size = 0;
    CHECK(cuMemGetAddressRange(&base, &size, p) == CUDA_ERROR_NOT_FOUND);
    CUdeviceptr start = 0;
    CHECK(cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p) == CUDA_ERROR_INVALID_VALUE);
    unsigned type = 99;
    CUpointer_attribute attr = CU_POINTER_ATTRIBUTE_MEMORY_TYPE;
    void* data[1] = {&type};
    REQUIRE(cuPointerGetAttributes(1, &attr, data, p) == CUDA_SUCCESS);
    CHECK(type == 0);
    CHECK(cuMemFree(p) == CUDA_ERROR_INVALID_VALUE);
  }
  // b is untouched by the frees.
  CUdeviceptr base = 0;
  size_t size = 0;
  REQUIRE(cuMemGetAddressRange(&base, &size, b) == CUDA_SUCCESS);
  CHECK(base == b);
  REQUIRE(cuMemFree(b) == CUDA_SUCCESS);
}

TEST_CASE("cache: IPC export is the driver's for whole blocks and ours for packed or mapped ones", "[cache][ipc]") {
  make_context();
  touch_interposer();
  CUdeviceptr small = 0, big = 0;
  REQUIRE(cuMemAlloc(&small, 4096) == CUDA_SUCCESS);
  REQUIRE(cuMemAlloc(&big, 8 * kMiB) == CUDA_SUCCESS);
  CUipcMemHandle h{};
  CUdeviceptr hb = 0, q = 0;
  size_t hs = 0;
  // A packed block shares its driver allocation, and mapped granules have no legacy handle:
  // the handle is ours (not the driver's), which this process cannot open (as the driver
  // answers a process opening its own export). Other processes do: interposer.ipc.*.
  REQUIRE(cuIpcGetMemHandle(&h, small) == CUDA_SUCCESS);
  CHECK(fakecuda_ipc_handle_range(&h, &hb, &hs) != 0);
  CHECK(cuIpcOpenMemHandle(&q, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) == CUDA_ERROR_INVALID_CONTEXT);
  if (vmm_pool()) {
    REQUIRE(cuIpcGetMemHandle(&h, big) == CUDA_SUCCESS);
    CHECK(fakecuda_ipc_handle_range(&h, &hb, &hs) != 0);
    REQUIRE(cuMemFree(big) == CUDA_SUCCESS);
    REQUIRE(cuMemFree(small) == CUDA_SUCCESS);
    return;
  }
  // A whole block is its own driver allocation: the handle names exactly it.
  REQUIRE(cuIpcGetMemHandle(&h, big) == CUDA_SUCCESS);
  REQUIRE(fakecuda_ipc_handle_range(&h, &hb, &hs) == 0);
  CHECK(hb == big);
  CHECK(hs == 8 * kMiB);
  // Freed after export: given back to the driver, never handed to another allocation.
  fakecuda_reset_counters();
  REQUIRE(cuMemFree(big) == CUDA_SUCCESS);
  CHECK(fakecuda_call_count("cuMemFree") == 1);
  CHECK(cuIpcGetMemHandle(&h, big) != CUDA_SUCCESS);
  REQUIRE(cuMemFree(small) == CUDA_SUCCESS);
}

TEST_CASE("cache: peer copies between pooled blocks of two devices", "[cache][peer]") {
  make_context(1);
  CUcontext c1 = nullptr;
  REQUIRE(cuCtxGetCurrent(&c1) == CUDA_SUCCESS);
  CUdeviceptr on1 = 0;
  REQUIRE(cuMemAlloc(&on1, 65536) == CUDA_SUCCESS);
  REQUIRE(cuMemsetD8(on1, 0x5A, 65536) == CUDA_SUCCESS);
  REQUIRE(cuCtxSynchronize() == CUDA_SUCCESS);  // device 1's memset before device 0's copy
  int ord = -1;
  REQUIRE(cuPointerGetAttribute(&ord, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, on1) == CUDA_SUCCESS);
  CHECK(ord == 1);
  make_context(0);
  CUcontext c0 = nullptr;
  REQUIRE(cuCtxGetCurrent(&c0) == CUDA_SUCCESS);
  const CUresult e = cuCtxEnablePeerAccess(c1, 0);
  CHECK((e == CUDA_SUCCESS || e == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED));
  CHECK(fakecuda_peer_access_enabled(c0, c1) == 1);
  CUdeviceptr on0 = 0;
  REQUIRE(cuMemAlloc(&on0, 65536) == CUDA_SUCCESS);
  REQUIRE(cuMemcpyPeer(on0, c0, on1, c1, 65536) == CUDA_SUCCESS);
  CHECK(all_bytes(on0, 65536, 0x5A));
  CHECK(dev_counters(1).live_allocations.load() == 1);
  REQUIRE(cuMemFree(on0) == CUDA_SUCCESS);
  REQUIRE(cuMemFree(on1) == CUDA_SUCCESS);  // a block of device 1 freed from device 0's context
  CHECK(dev_counters(1).live_allocations.load() == 0);
}

TEST_CASE("cache: counters show reserved vs in use; cuMemGetInfo counts cached bytes as free", "[cache][counters]") {
  make_context();
  touch_interposer();
  auto& d = dev_counters();
  CUdeviceptr p = 0, q = 0;
  // The cache: a whole block of 6 MiB; vmm: 5 MiB of the arena's granules (the rest of the
  // third granule stays free for the next block).
  REQUIRE(cuMemAlloc(&p, 5 * kMiB) == CUDA_SUCCESS);
  REQUIRE(cuMemAlloc(&q, 1000) == CUDA_SUCCESS);  // 1 KiB of a 2 MiB slab
  const uint64_t block = vmm_pool() ? 5 * kMiB : 6 * kMiB;
  const uint64_t used = d.used.load(), cached = d.cached.load();
  CHECK(d.reserved.load() == used);  // nothing else allocated: what is counted is what is held
  CHECK(used >= 6 * kMiB + 2 * kMiB);
  CHECK(used % (2 * kMiB) == 0);
  CHECK(cached <= used);
  size_t f = 0, t = 0;
  REQUIRE(cuMemGetInfo(&f, &t) == CUDA_SUCCESS);
  CHECK(t == kCacheCap);
  CHECK(f == kCacheCap - (used - cached));
  REQUIRE(cuMemFree(p) == CUDA_SUCCESS);
  // p's whole block moves to cached, or (the cache) a cached block of an earlier case within
  // its slack (2 MiB more) that served the request.
  const uint64_t freed = d.cached.load() - cached;
  CHECK(freed >= block);
  CHECK(freed <= (vmm_pool() ? block : 8 * kMiB));
  CHECK(freed % (vmm_pool() ? 512 : 2 * kMiB) == 0);
  CHECK(d.used.load() == used);  // kept, still counted against the cap
  REQUIRE(cuMemFree(q) == CUDA_SUCCESS);
  CHECK(d.cached.load() == used);  // everything the cache holds is free for the program
}

TEST_CASE("cache: the cap refuses only after the cache gave back what it keeps", "[cache_cap]") {
  make_context();
  touch_interposer();
  auto& d = dev_counters();
  REQUIRE(d.limit.load() == kCacheCap);
  // Fill the cache: three 64 MiB blocks and many small ones, all freed (pending, not ready:
  // a slow write is queued on a stream).
  CUstream s = make_stream();
  std::vector<CUdeviceptr> ps;
  for (int i = 0; i < 3; ++i) {
    CUdeviceptr p = 0;
    REQUIRE(cuMemAlloc(&p, 64 * kMiB) == CUDA_SUCCESS);
    ps.push_back(p);
  }
  for (int i = 0; i < 100; ++i) {
    CUdeviceptr p = 0;
    REQUIRE(cuMemAlloc(&p, 100000) == CUDA_SUCCESS);
    ps.push_back(p);
  }
  std::atomic<bool> written{false};
  REQUIRE(slow_fill(s, ps[0], 0xEE, 64 * kMiB, 200, &written) == CUDA_SUCCESS);
  for (CUdeviceptr p : ps) REQUIRE(cuMemFree(p) == CUDA_SUCCESS);
  const uint64_t held = d.used.load();
  CHECK(held >= 192 * kMiB);
  CHECK(d.cached.load() == held);
  const uint64_t refusals = d.refusals.load();

  // 200 MiB fits the cap only if the cache gives back what it keeps: it must, without a refusal.
  fakecuda_reset_counters();
  CUdeviceptr big = 0;
  REQUIRE(cuMemAlloc(&big, 200 * kMiB) == CUDA_SUCCESS);
  CHECK(d.refusals.load() == refusals);
  if (vmm_pool()) {
    // The three 64 MiB blocks lie side by side in the arena and merged: only the 8 MiB they
    // lack were mapped (from the granules of free slabs, or new ones).
    CHECK(fakecuda_call_count("cuMemMap") == 4);
    CHECK(fakecuda_call_count("cuMemCreate") <= 4);
  } else {
    CHECK(fakecuda_call_count("cuMemFree") >= 3);  // the cached driver allocations went back
  }
  // ps[0] was given back only after its write (a flag the write sets: the stream itself may
  // still run the pool's own event records, queued after it).
  CHECK(written.load(std::memory_order_acquire));
  CHECK(d.used.load() <= kCacheCap);
  // (vmm: stitched from the free blocks under the cap's room, keeping free slabs within
  // CUWARDEN_POOL_KEEP's 16 MiB floor.)
  if (vmm_pool()) CHECK(d.used.load() <= 216 * kMiB);
  else CHECK(d.used.load() == 200 * kMiB);
  // Now a real shortage: refused, counted once, and nothing passes the cap.
  CUdeviceptr more = 0;
  CHECK(cuMemAlloc(&more, 60 * kMiB) == CUDA_ERROR_OUT_OF_MEMORY);
  CHECK(d.refusals.load() == refusals + 1);
  CHECK(d.used.load() <= kCacheCap);
  // What fits exactly still fits: the request is not rounded past the cap.
  const uint64_t room = kCacheCap - d.used.load();
  CUdeviceptr last = 0;
  REQUIRE(cuMemAlloc(&last, room - 100) == CUDA_SUCCESS);
  CHECK(d.used.load() <= kCacheCap);
  REQUIRE(cuMemFree(last) == CUDA_SUCCESS);
  REQUIRE(cuMemFree(big) == CUDA_SUCCESS);
  REQUIRE(cuStreamDestroy(s) == CUDA_SUCCESS);
}

TEST_CASE("cache: a primary context reset takes the cache's memory off the counters", "[cache_reset]") {
  make_context();
  touch_interposer();
  auto& d = dev_counters();
  CUdeviceptr p = 0, q = 0;
  REQUIRE(cuMemAlloc(&p, 4096) == CUDA_SUCCESS);
  REQUIRE(cuMemAlloc(&q, 5 * kMiB) == CUDA_SUCCESS);
  REQUIRE(cuMemFree(q) == CUDA_SUCCESS);
  CHECK(d.used.load() > 0);
  REQUIRE(cuDevicePrimaryCtxReset(0) == CUDA_SUCCESS);
  CHECK(d.used.load() == 0);
  CHECK(d.reserved.load() == 0);
  CHECK(d.cached.load() == 0);
  CHECK(d.live_allocations.load() == 0);
  CHECK(fakecuda_live_bytes(0) == 0);
  // The old pointer is not ours any more; a new context gets a fresh cache.
  make_context();
  CHECK(cuMemFree(p) != CUDA_SUCCESS);
  CUdeviceptr r = 0;
  REQUIRE(cuMemAlloc(&r, 4096) == CUDA_SUCCESS);
  REQUIRE(cuMemFree(r) == CUDA_SUCCESS);
  CHECK(d.live_allocations.load() == 0);
}

TEST_CASE("cache: a driver allocation the cache does not serve gets the cache's memory back when short",
          "[cache_nocap]") {
  make_context();
  touch_interposer();
  auto& d = dev_counters();
  REQUIRE(d.limit.load() == cuw::ring::kNoLimit);
  // The cache keeps 640 MiB of the 1 GiB device after the program freed it.
  std::vector<CUdeviceptr> ps;
  for (int i = 0; i < 10; ++i) {
    CUdeviceptr p = 0;
    REQUIRE(cuMemAlloc(&p, 64 * kMiB) == CUDA_SUCCESS);
    ps.push_back(p);
  }
  for (CUdeviceptr p : ps) REQUIRE(cuMemFree(p) == CUDA_SUCCESS);
  CHECK(d.cached.load() >= 640 * kMiB);
  // cuMemGetInfo counts what the cache keeps as free.
  size_t f = 0, t = 0;
  REQUIRE(cuMemGetInfo(&f, &t) == CUDA_SUCCESS);
  CHECK(f >= 900 * kMiB);
  // A stream-ordered allocation the device can only hold without the cache's bytes.
  CUstream s = make_stream();
  CUdeviceptr a = 0;
  REQUIRE(cuMemAllocAsync(&a, 700 * kMiB, s) == CUDA_SUCCESS);
  CHECK(d.cached.load() == 0);
  REQUIRE(cuMemFreeAsync(a, s) == CUDA_SUCCESS);
  REQUIRE(cuStreamSynchronize(s) == CUDA_SUCCESS);
  REQUIRE(cuStreamDestroy(s) == CUDA_SUCCESS);
}

TEST_CASE("cache: the device's slot says how much of the pool's free memory one request can get",
          "[cache][counters]") {
  make_context();
  touch_interposer();
  REQUIRE(reach_idle(8 * kMiB));
  auto& d = dev_counters();
  CUdeviceptr p[3] = {};
  for (auto& x : p) REQUIRE(cuMemAlloc(&x, 8 * kMiB) == CUDA_SUCCESS);
  const uint64_t free0 = d.pool_free.load();
  REQUIRE(cuMemFree(p[0]) == CUDA_SUCCESS);
  REQUIRE(cuMemFree(p[2]) == CUDA_SUCCESS);
  // Two free 8 MiB blocks, not side by side (p[1] lies between them under vmm; whole driver
  // allocations under the cache).
  CHECK(d.pool_free.load() == free0 + 16 * kMiB);
  if (vmm_pool()) {
    CHECK(d.pool_largest_free.load() == d.pool_free.load());  // one request gets all of it, stitched
  } else {
    CHECK(d.pool_largest_free.load() >= 8 * kMiB);
    CHECK(d.pool_largest_free.load() < d.pool_free.load());
  }
  REQUIRE(cuMemFree(p[1]) == CUDA_SUCCESS);
  CHECK(d.pool_free.load() == free0 + 24 * kMiB);
  if (vmm_pool()) CHECK(d.pool_largest_free.load() == d.pool_free.load());
}

// Interposer tests: stream-ordered reuse and stream capture in the pooled backends
// (backends/pool/fence.hpp), on the simulated driver, under CUWARDEN_POOL=cache and vmm. Each
// tag runs in a process of its own (device 0's context; device 1's where a case says so):
// what one case does to the process (a non-blocking stream, a capture, a second context)
// would change what another may show.
//
// What they prove: a block freed while all work went to the legacy stream is handed out at
// once, with no event and no wait; its old owner's queued work still never sees the new
// owner's bytes, whether the new owner writes on the legacy stream, a blocking stream, a
// non-blocking stream that existed before or one made after the hand-out; work on two
// blocking streams, or on a non-blocking one, holds reuse back; peer access or a second
// context's pool waits for such blocks and turns stream order off. During a capture every
// allocation gets the driver's own answer, never a pooled block.
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "fakecuda.h"
#include "support.hpp"

using namespace cuwtest;

namespace {

using cuwtest::kMiB;

/// What the old owner's slow "kernel" saw: set once it ran.
struct Seen {
  std::atomic<bool> ran{false};
  std::atomic<bool> intact{false};
};

/// The old owner's last use of `p`: queued on `s` through a hooked work entry point
/// (cuLaunchHostFunc), it waits `ms`, then reads `n` bytes at `p` (the simulated device's
/// memory is host memory) and says whether all are still `v`.
CUresult slow_read(CUstream s, CUdeviceptr p, unsigned char v, size_t n, unsigned ms, Seen* seen) {
  struct Work {
    CUdeviceptr p;
    unsigned char v;
    size_t n;
    unsigned ms;
    Seen* seen;
  };
  auto* w = new Work{p, v, n, ms, seen};
  const CUresult r = cuLaunchHostFunc(
      s,
      [](void* data) {
        auto* work = static_cast<Work*>(data);
        std::this_thread::sleep_for(std::chrono::milliseconds(work->ms));
        const auto* b = reinterpret_cast<const unsigned char*>(work->p);
        bool same = true;
        for (size_t i = 0; i < work->n && same; ++i) same = b[i] == work->v;
        work->seen->intact.store(same, std::memory_order_relaxed);
        work->seen->ran.store(true, std::memory_order_release);
        delete work;
      },
      w);
  if (r != CUDA_SUCCESS) delete w;
  return r;
}

void wait_ran(const Seen& seen) {
  const auto t0 = std::chrono::steady_clock::now();
  while (!seen.ran.load(std::memory_order_acquire) && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60))
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  REQUIRE(seen.ran.load(std::memory_order_acquire));
}

/// The old owner: `p` (n bytes) set to 0xAA, then its slow last read, both queued on
/// `old_stream`, then the free. Returns with the read still pending.
void old_owner_frees(CUdeviceptr p, size_t n, CUstream old_stream, Seen* seen) {
  REQUIRE(cuMemsetD8Async(p, 0xAA, n, old_stream) == CUDA_SUCCESS);
  REQUIRE(slow_read(old_stream, p, 0xAA, n, 300, seen) == CUDA_SUCCESS);
  REQUIRE(cuMemFree(p) == CUDA_SUCCESS);
}

/// Allocations of `n` bytes until one is `p` (at most `tries`); the others are freed. The
/// block, or 0. `pending` is set when `p` came back while `seen`'s read had not run.
CUdeviceptr take_back(CUdeviceptr p, size_t n, const Seen& seen, bool* pending, int tries = 64) {
  std::vector<CUdeviceptr> others;
  CUdeviceptr got = 0;
  for (int i = 0; i < tries && !got; ++i) {
    CUdeviceptr q = 0;
    REQUIRE(cuMemAlloc(&q, n) == CUDA_SUCCESS);
    if (q == p) {
      *pending = !seen.ran.load(std::memory_order_acquire);
      got = q;
    } else {
      others.push_back(q);
    }
  }
  for (CUdeviceptr q : others) REQUIRE(cuMemFree(q) == CUDA_SUCCESS);
  return got;
}

}  // namespace

TEST_CASE("order: with all work on the legacy stream a freed block is reused at once, with no event and no wait",
          "[order_legacy]") {
  make_context();
  touch_interposer();
  auto& d = dev_counters();
  for (size_t n : {size_t{4096}, size_t{3 * kMiB}}) {
    INFO(n << " bytes");
    CUdeviceptr p = 0;
    REQUIRE(cuMemAlloc(&p, n) == CUDA_SUCCESS);
    fakecuda_reset_counters();
    const uint64_t waits0 = d.pool_waits.load(), hits0 = d.pool_hits.load();
    Seen seen;
    old_owner_frees(p, n, CU_STREAM_LEGACY, &seen);
    // The same block at once, while the old owner's read is still queued.
    CUdeviceptr q = 0;
    REQUIRE(cuMemAlloc(&q, n) == CUDA_SUCCESS);
    CHECK(q == p);
    CHECK_FALSE(seen.ran.load(std::memory_order_acquire));
    CHECK(d.pool_hits.load() - hits0 == 1);
    // The new owner writes on the legacy stream: after the old owner's read.
    REQUIRE(cuMemsetD8Async(q, 0xBB, n, nullptr) == CUDA_SUCCESS);
    for (const char* fn : {"cuEventRecord", "cuEventQuery", "cuEventSynchronize", "cuStreamWaitEvent",
                           "cuStreamSynchronize", "cuCtxSynchronize"}) {
      INFO(fn);
      CHECK(fakecuda_call_count(fn) == 0);
    }
    CHECK(d.pool_waits.load() == waits0);
    wait_ran(seen);
    CHECK(seen.intact.load());
    CHECK(all_bytes(q, n, 0xBB));
    REQUIRE(cuMemFree(q) == CUDA_SUCCESS);
  }
}

TEST_CASE("order: a non-blocking stream never writes a reused block under its old owner's pending work",
          "[order_nonblocking]") {
  make_context();
  touch_interposer();
  CUstream s = nullptr;
  REQUIRE(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  for (size_t n : {size_t{4096}, size_t{3 * kMiB}}) {
    // The old owner's last read on the legacy stream, then on the non-blocking stream
    // itself; the new owner writes on the non-blocking stream as soon as it has the block.
    for (CUstream old_stream : {CU_STREAM_LEGACY, s}) {
      INFO(n << " bytes, old owner on " << (old_stream == s ? "the non-blocking stream" : "the legacy stream"));
      CUdeviceptr p = 0;
      REQUIRE(cuMemAlloc(&p, n) == CUDA_SUCCESS);
      Seen seen;
      old_owner_frees(p, n, old_stream, &seen);
      bool pending = false;
      const CUdeviceptr q = take_back(p, n, seen, &pending);
      CHECK_FALSE(pending);
      if (q) REQUIRE(cuMemsetD8Async(q, 0xBB, n, s) == CUDA_SUCCESS);
      wait_ran(seen);
      CHECK(seen.intact.load());
      REQUIRE(cuStreamSynchronize(s) == CUDA_SUCCESS);
      if (q) {
        CHECK(all_bytes(q, n, 0xBB));
        REQUIRE(cuMemFree(q) == CUDA_SUCCESS);
      }
    }
  }
  REQUIRE(cuStreamDestroy(s) == CUDA_SUCCESS);
}

TEST_CASE("order: a non-blocking stream made after a block was reused by stream order runs after its old owner",
          "[order_late_stream]") {
  make_context();
  touch_interposer();
  const size_t n = 3 * kMiB;
  CUdeviceptr p = 0;
  REQUIRE(cuMemAlloc(&p, n) == CUDA_SUCCESS);
  Seen seen;
  old_owner_frees(p, n, CU_STREAM_LEGACY, &seen);
  CUdeviceptr q = 0;
  REQUIRE(cuMemAlloc(&q, n) == CUDA_SUCCESS);
  REQUIRE(q == p);  // handed out at once: no other stream existed
  CHECK_FALSE(seen.ran.load(std::memory_order_acquire));
  // Made now, each stream is ordered after the legacy stream's queued work (one wait on an
  // event, no synchronization): the new owner's write waits for the old owner's read, on
  // whichever of them it goes (PyTorch makes its pool's streams at once, then hands out one).
  fakecuda_reset_counters();
  CUstream first = nullptr, s = nullptr;
  REQUIRE(cuStreamCreate(&first, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  REQUIRE(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  CHECK(fakecuda_call_count("cuStreamWaitEvent") == 2);
  CHECK(fakecuda_call_count("cuEventSynchronize") + fakecuda_call_count("cuStreamSynchronize") == 0);
  REQUIRE(cuMemsetD8Async(q, 0xBB, n, s) == CUDA_SUCCESS);
  wait_ran(seen);
  CHECK(seen.intact.load());
  REQUIRE(cuStreamSynchronize(s) == CUDA_SUCCESS);
  CHECK(all_bytes(q, n, 0xBB));
  REQUIRE(cuMemFree(q) == CUDA_SUCCESS);
  REQUIRE(cuStreamDestroy(s) == CUDA_SUCCESS);
  REQUIRE(cuStreamDestroy(first) == CUDA_SUCCESS);
}

TEST_CASE("order: two blocking streams are not ordered with each other; the legacy stream is ordered before both",
          "[order_blocking]") {
  make_context();
  touch_interposer();
  CUstream s1 = nullptr, s2 = nullptr;
  REQUIRE(cuStreamCreate(&s1, CU_STREAM_DEFAULT) == CUDA_SUCCESS);
  REQUIRE(cuStreamCreate(&s2, CU_STREAM_DEFAULT) == CUDA_SUCCESS);
  const size_t n = 3 * kMiB;
  {
    INFO("old owner on one blocking stream, new owner on another");
    CUdeviceptr p = 0;
    REQUIRE(cuMemAlloc(&p, n) == CUDA_SUCCESS);
    Seen seen;
    old_owner_frees(p, n, s1, &seen);
    bool pending = false;
    const CUdeviceptr q = take_back(p, n, seen, &pending);
    CHECK_FALSE(pending);
    if (q) REQUIRE(cuMemsetD8Async(q, 0xBB, n, s2) == CUDA_SUCCESS);
    wait_ran(seen);
    CHECK(seen.intact.load());
    REQUIRE(cuStreamSynchronize(s2) == CUDA_SUCCESS);
    if (q) REQUIRE(cuMemFree(q) == CUDA_SUCCESS);
  }
  {
    INFO("old owner on the legacy stream, new owner on a blocking stream");
    // Once the work on the blocking streams is proven finished, stream order holds again.
    REQUIRE(cuCtxSynchronize() == CUDA_SUCCESS);
    REQUIRE(reach_idle(n));
    CUdeviceptr p = 0;
    REQUIRE(cuMemAlloc(&p, n) == CUDA_SUCCESS);
    fakecuda_reset_counters();
    Seen seen;
    old_owner_frees(p, n, CU_STREAM_LEGACY, &seen);
    CUdeviceptr q = 0;
    REQUIRE(cuMemAlloc(&q, n) == CUDA_SUCCESS);
    CHECK(q == p);
    CHECK_FALSE(seen.ran.load(std::memory_order_acquire));
    REQUIRE(cuMemsetD8Async(q, 0xBB, n, s2) == CUDA_SUCCESS);
    CHECK(fakecuda_call_count("cuEventRecord") == 0);
    wait_ran(seen);
    CHECK(seen.intact.load());
    REQUIRE(cuStreamSynchronize(s2) == CUDA_SUCCESS);
    CHECK(all_bytes(q, n, 0xBB));
    REQUIRE(cuMemFree(q) == CUDA_SUCCESS);
  }
  REQUIRE(cuStreamDestroy(s1) == CUDA_SUCCESS);
  REQUIRE(cuStreamDestroy(s2) == CUDA_SUCCESS);
}

TEST_CASE("order: during a capture every allocation gets the driver's answer, never a pooled block",
          "[order_capture]") {
  make_context();
  touch_interposer();
  CUstream s = nullptr;
  REQUIRE(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  // Ready blocks of two sizes, and one live block of each.
  std::vector<CUdeviceptr> warm;
  for (int i = 0; i < 20; ++i) {
    CUdeviceptr p = 0;
    REQUIRE(cuMemAlloc(&p, i % 2 ? 4096 : 3 * kMiB) == CUDA_SUCCESS);
    warm.push_back(p);
  }
  for (CUdeviceptr p : warm) REQUIRE(cuMemFree(p) == CUDA_SUCCESS);
  REQUIRE(cuCtxSynchronize() == CUDA_SUCCESS);
  REQUIRE(reach_idle(4096));
  REQUIRE(reach_idle(3 * kMiB));
  CUdeviceptr small = 0, big = 0;
  REQUIRE(cuMemAlloc(&small, 4096) == CUDA_SUCCESS);
  REQUIRE(cuMemAlloc(&big, 3 * kMiB) == CUDA_SUCCESS);

  SECTION("global mode: the driver's refusal, and the capture invalidated as the driver does") {
    REQUIRE(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
    fakecuda_reset_counters();
    CUdeviceptr p = 0;
    CHECK(cuMemAlloc(&p, 4096) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    CHECK(fakecuda_call_count("cuMemAlloc") == 1);
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    REQUIRE(cuStreamIsCapturing(s, &st) == CUDA_SUCCESS);
    CHECK(st == CU_STREAM_CAPTURE_STATUS_INVALIDATED);
    CUgraph g = nullptr;
    CHECK(cuStreamEndCapture(s, &g) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    if (g) REQUIRE(cuGraphDestroy(g) == CUDA_SUCCESS);
  }
  SECTION("relaxed mode: driver memory; a block freed during the capture is not handed out in it") {
    REQUIRE(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED) == CUDA_SUCCESS);
    fakecuda_reset_counters();
    REQUIRE(cuMemsetD8Async(small, 1, 4096, s) == CUDA_SUCCESS);  // a graph node using it
    REQUIRE(cuMemFree(small) == CUDA_SUCCESS);
    REQUIRE(cuMemFree(big) == CUDA_SUCCESS);
    std::vector<CUdeviceptr> got;
    for (int i = 0; i < 8; ++i) {
      const size_t n = i % 2 ? 4096 : 3 * kMiB;
      CUdeviceptr p = 0;
      REQUIRE(cuMemAlloc(&p, n) == CUDA_SUCCESS);
      CHECK(p != small);
      CHECK(p != big);
      // The driver's allocation, of the request's own size (no pool's block or segment).
      CUdeviceptr base = 0;
      size_t size = 0;
      REQUIRE(cuMemGetAddressRange(&base, &size, p) == CUDA_SUCCESS);
      CHECK(base == p);
      CHECK(size == n);
      got.push_back(p);
    }
    CHECK(fakecuda_call_count("cuMemAlloc") == 8);
    for (const char* fn : {"cuEventRecord", "cuEventQuery", "cuEventSynchronize", "cuCtxSynchronize"}) {
      INFO(fn);
      CHECK(fakecuda_call_count(fn) == 0);
    }
    for (CUdeviceptr p : got) REQUIRE(cuMemFree(p) == CUDA_SUCCESS);  // the driver's frees
    CHECK(fakecuda_call_count("cuMemFree") == 8);
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    REQUIRE(cuStreamIsCapturing(s, &st) == CUDA_SUCCESS);
    CHECK(st == CU_STREAM_CAPTURE_STATUS_ACTIVE);
    CUgraph g = nullptr;
    REQUIRE(cuStreamEndCapture(s, &g) == CUDA_SUCCESS);
    REQUIRE(cuGraphDestroy(g) == CUDA_SUCCESS);
    // After the capture the pool serves again, the blocks freed during it included.
    bool small_back = false, big_back = false;
    got.clear();
    for (int i = 0; i < 60 && !(small_back && big_back); ++i) {
      const size_t n = i % 2 ? 4096 : 3 * kMiB;
      CUdeviceptr p = 0;
      REQUIRE(cuMemAlloc(&p, n) == CUDA_SUCCESS);
      small_back = small_back || p == small;
      big_back = big_back || p == big;
      got.push_back(p);
    }
    CHECK(small_back);
    CHECK(big_back);
    for (CUdeviceptr p : got) REQUIRE(cuMemFree(p) == CUDA_SUCCESS);
    small = big = 0;
  }
  if (small) REQUIRE(cuMemFree(small) == CUDA_SUCCESS);
  if (big) REQUIRE(cuMemFree(big) == CUDA_SUCCESS);
  REQUIRE(cuStreamDestroy(s) == CUDA_SUCCESS);
}

namespace {

/// Device 0's context: a block handed out by stream order while its old owner's read is
/// still queued on the legacy stream; then `reach` lets another context reach device 0's
/// memory (or makes one). When `reach` returns the old owner's read has run (the pool waited
/// for its legacy stream), and from then on a free waits for its work even on the legacy stream.
void another_context_reaches(const std::function<void(CUcontext ctx0)>& reach) {
  make_context(0);
  touch_interposer();
  CUcontext ctx0 = nullptr;
  REQUIRE(cuCtxGetCurrent(&ctx0) == CUDA_SUCCESS);
  const size_t n = 3 * kMiB;
  CUdeviceptr p = 0;
  REQUIRE(cuMemAlloc(&p, n) == CUDA_SUCCESS);
  Seen seen;
  old_owner_frees(p, n, CU_STREAM_LEGACY, &seen);
  CUdeviceptr q = 0;
  REQUIRE(cuMemAlloc(&q, n) == CUDA_SUCCESS);
  REQUIRE(q == p);
  REQUIRE_FALSE(seen.ran.load(std::memory_order_acquire));
  reach(ctx0);
  CHECK(seen.ran.load(std::memory_order_acquire));
  CHECK(seen.intact.load());
  REQUIRE(cuCtxSetCurrent(ctx0) == CUDA_SUCCESS);
  REQUIRE(cuMemFree(q) == CUDA_SUCCESS);
  // Stream order is off for good: the legacy stream's pending work holds reuse back.
  CUdeviceptr p2 = 0;
  REQUIRE(cuMemAlloc(&p2, n) == CUDA_SUCCESS);
  Seen seen2;
  old_owner_frees(p2, n, CU_STREAM_LEGACY, &seen2);
  bool pending = false;
  const CUdeviceptr q2 = take_back(p2, n, seen2, &pending);
  CHECK_FALSE(pending);
  wait_ran(seen2);
  CHECK(seen2.intact.load());
  if (q2) REQUIRE(cuMemFree(q2) == CUDA_SUCCESS);
}

}  // namespace

TEST_CASE("order: peer access waits for blocks reused by stream order and turns it off", "[order_peer]") {
  another_context_reaches([](CUcontext ctx0) {
    make_context(1);
    REQUIRE(cuCtxEnablePeerAccess(ctx0, 0) == CUDA_SUCCESS);
  });
}

TEST_CASE("order: a second context's pool waits for blocks reused by stream order and turns it off",
          "[order_second_pool]") {
  another_context_reaches([](CUcontext) {
    make_context(1);
    CUdeviceptr r = 0;
    REQUIRE(cuMemAlloc(&r, 4096) == CUDA_SUCCESS);
    REQUIRE(cuMemFree(r) == CUDA_SUCCESS);
  });
}

TEST_CASE("order: a capture's begin first waits for blocks reused by stream order", "[order_capture_begin]") {
  make_context();
  touch_interposer();
  CUstream s = nullptr;
  REQUIRE(cuStreamCreate(&s, CU_STREAM_DEFAULT) == CUDA_SUCCESS);  // blocking: stream order stays on
  const size_t n = 3 * kMiB;
  CUdeviceptr p = 0;
  REQUIRE(cuMemAlloc(&p, n) == CUDA_SUCCESS);
  Seen seen;
  old_owner_frees(p, n, CU_STREAM_LEGACY, &seen);
  CUdeviceptr q = 0;
  REQUIRE(cuMemAlloc(&q, n) == CUDA_SUCCESS);
  REQUIRE(q == p);
  REQUIRE_FALSE(seen.ran.load(std::memory_order_acquire));
  // Nothing may be waited for once the capture exists: the wait comes before it.
  fakecuda_reset_counters();
  REQUIRE(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
  CHECK(seen.ran.load(std::memory_order_acquire));
  CHECK(seen.intact.load());
  CHECK(fakecuda_call_count("cuStreamSynchronize") == 1);
  REQUIRE(cuMemsetD8Async(q, 0xBB, n, s) == CUDA_SUCCESS);  // a graph node writing the block
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  REQUIRE(cuStreamIsCapturing(s, &st) == CUDA_SUCCESS);
  CHECK(st == CU_STREAM_CAPTURE_STATUS_ACTIVE);
  CUgraph g = nullptr;
  REQUIRE(cuStreamEndCapture(s, &g) == CUDA_SUCCESS);
  REQUIRE(cuGraphDestroy(g) == CUDA_SUCCESS);
  REQUIRE(cuMemFree(q) == CUDA_SUCCESS);
  REQUIRE(cuStreamDestroy(s) == CUDA_SUCCESS);
}

TEST_CASE("order: exporting a block reused by stream order waits for its old owner's work first", "[order_ipc]") {
  make_context();
  touch_interposer();
  const size_t n = 3 * kMiB;
  CUdeviceptr p = 0;
  REQUIRE(cuMemAlloc(&p, n) == CUDA_SUCCESS);
  Seen seen;
  old_owner_frees(p, n, CU_STREAM_LEGACY, &seen);
  CUdeviceptr q = 0;
  REQUIRE(cuMemAlloc(&q, n) == CUDA_SUCCESS);
  REQUIRE(q == p);
  REQUIRE_FALSE(seen.ran.load(std::memory_order_acquire));
  // Another process's work on the block would be ordered with none of this one's streams.
  CUipcMemHandle h{};
  REQUIRE(cuIpcGetMemHandle(&h, q) == CUDA_SUCCESS);
  CHECK(seen.ran.load(std::memory_order_acquire));
  CHECK(seen.intact.load());
  REQUIRE(cuMemFree(q) == CUDA_SUCCESS);
}

// Interposer tests: the backend seam (interposer/src/backends/backend.hpp). The backend chosen
// at start is the one CUWARDEN_POOL names; a pooling backend's blocks and pool statistics agree
// with what the ring's counters say it holds, and passthrough holds none; IPC imports and
// closes and peer-access changes reach the driver through the backend. Runs with
// libcuwarden_testing.so preloaded (the product's objects and testing_api.cpp, which exports
// the queries no hooked entry point answers).
#include <dlfcn.h>

#include <atomic>
#include <thread>
#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include "fakecuda.h"
#include "support.hpp"
#include "testing_api.h"

using namespace cuwtest;

namespace {

using cuwtest::kMiB;

template <class F>
F testing(const char* name) {
  auto f = reinterpret_cast<F>(dlsym(RTLD_DEFAULT, name));
  INFO(name << ": this test runs with libcuwarden_testing.so preloaded");
  REQUIRE(f);
  return f;
}

cuwt_pool_stats stats(int ordinal = 0) {
  cuwt_pool_stats s{};
  REQUIRE(testing<cuwt_pool_stats_fn>("cuwarden_testing_pool_stats")(ordinal, &s) == 0);
  return s;
}

std::vector<cuwt_block> blocks() {
  auto f = testing<cuwt_blocks_fn>("cuwarden_testing_blocks");
  std::vector<cuwt_block> out(f(nullptr, 0) + 64);
  out.resize(f(out.data(), out.size()));
  return out;
}

const cuwt_block* block_at(const std::vector<cuwt_block>& all, CUdeviceptr p) {
  for (const cuwt_block& b : all)
    if (b.address == p) return &b;
  return nullptr;
}

constexpr int kLive = 0, kFree = 1;

}  // namespace

TEST_CASE("backend: the one chosen at start is the one CUWARDEN_POOL names", "[seam_off][seam_cache]") {
  make_context();
  touch_interposer();
  const char* pool = std::getenv("CUWARDEN_POOL");
  const char* name = testing<cuwt_backend_name_fn>("cuwarden_testing_backend_name")();
  REQUIRE(name);
  CHECK(std::string(name) == (pool ? pool : "off"));
}

TEST_CASE("backend: a pool's hit and free wait for no lock but their device's pool book", "[seam_cache]") {
  // The hooks' lock (the live tables) and another device's book held: a thread's hits and
  // frees on device 0 still complete. Their counters are atomics and their events a
  // lock-free push; the records of their blocks are device 0's book's.
  auto hold = testing<cuwt_hold_lock_fn>("cuwarden_testing_hold_lock");
  make_context();
  touch_interposer();
  auto& d = dev_counters();
  for (int i = 0; i < 50; ++i) {  // warm: a slab of 1 MiB blocks and a large block kept free
    CUdeviceptr a = 0, b = 0;
    REQUIRE(cuMemAlloc(&a, kMiB) == CUDA_SUCCESS);
    REQUIRE(cuMemAlloc(&b, 3 * kMiB) == CUDA_SUCCESS);
    REQUIRE(cuMemFree(a) == CUDA_SUCCESS);
    REQUIRE(cuMemFree(b) == CUDA_SUCCESS);
  }
  constexpr int kPairs = 2000;
  const uint64_t hits0 = d.pool_hits.load(), allocs0 = d.alloc_count.load();
  std::atomic<bool> go{false}, done{false};
  std::atomic<int> failed{0};
  CUcontext ctx = nullptr;
  REQUIRE(cuCtxGetCurrent(&ctx) == CUDA_SUCCESS);
  std::thread program([&] {  // (no Catch2 assertion off the main thread: not thread-safe)
    if (cuCtxSetCurrent(ctx) != CUDA_SUCCESS) failed.fetch_add(1);
    while (!go.load()) std::this_thread::yield();
    for (int i = 0; i < kPairs; ++i) {
      CUdeviceptr p = 0;
      const uint64_t bytes = i % 2 ? 3 * kMiB : kMiB;
      if (cuMemAlloc(&p, bytes) != CUDA_SUCCESS || cuMemFree(p) != CUDA_SUCCESS) failed.fetch_add(1);
    }
    done.store(true);
  });
  REQUIRE(hold(1, 1) == 0);  // (the lock order tracker.hpp gives: a book's, then the hooks')
  REQUIRE(hold(-1, 1) == 0);
  go.store(true);
  // Waits for the thread to finish (a condition); 60 s is a hang's bound, not a timing.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!done.load() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const bool finished = done.load();
  REQUIRE(hold(-1, 0) == 0);
  REQUIRE(hold(1, 0) == 0);
  program.join();
  CHECK(finished);
  CHECK(failed.load() == 0);
  CHECK(d.alloc_count.load() - allocs0 == uint64_t{kPairs});
  CHECK(d.pool_hits.load() - hits0 == uint64_t{kPairs});  // every one a hit, none a driver call
}

TEST_CASE("backend: the cache's blocks and pool statistics agree with the ring's counters", "[seam_cache]") {
  make_context();
  touch_interposer();
  auto& d = dev_counters();
  CUdeviceptr small = 0, large = 0;
  REQUIRE(cuMemAlloc(&small, 3000) == CUDA_SUCCESS);       // a 3 KiB block of a slab
  REQUIRE(cuMemAlloc(&large, 3 * kMiB) == CUDA_SUCCESS);   // the cache: a whole 4 MiB block; vmm: 3 MiB of two granules
  cuwt_pool_stats s = stats();
  CHECK(s.reserved == d.reserved.load());
  CHECK(s.cached == d.cached.load());
  CHECK(s.reserved >= 4 * kMiB + 2 * kMiB);
  std::vector<cuwt_block> all = blocks();
  const cuwt_block* bs = block_at(all, small);
  const cuwt_block* bl = block_at(all, large);
  REQUIRE(bs);
  REQUIRE(bl);
  CHECK(bs->state == kLive);
  CHECK(bs->requested == 3000);
  CHECK(bs->bytes == 3072);
  CHECK(bs->ordinal == 0);
  CHECK(bl->state == kLive);
  CHECK(bl->requested == 3 * kMiB);
  CHECK(bl->bytes == (vmm_pool() ? 3 * kMiB : 4 * kMiB));
  uint64_t live = 0;
  for (const cuwt_block& b : all) live += b.state == kLive ? b.bytes : 0;
  CHECK(live == s.reserved - s.cached);  // what no live block uses is what the pool caches
  CHECK(stats(1).reserved == 0);         // nothing pooled on the other device

  // Freed, and once the device is known idle, free for reuse: the largest request served
  // without the driver is that block.
  REQUIRE(cuMemFree(large) == CUDA_SUCCESS);
  REQUIRE(reach_idle(512));
  s = stats();
  CHECK(s.reserved == d.reserved.load());
  CHECK(s.cached == d.cached.load());
  CHECK(s.largest_free == 4 * kMiB);
  all = blocks();
  bl = block_at(all, large);
  REQUIRE(bl);
  CHECK(bl->state == kFree);
  CHECK(bl->requested == 0);
  REQUIRE(cuMemFree(small) == CUDA_SUCCESS);
}

TEST_CASE("backend: the largest free request counts only blocks that can serve one", "[seam_cache_cap]") {
  // Under a 5 MiB cap a 3000-byte request finds no room for a 2 MiB slab: the cache makes a
  // block of exactly its bytes, which no later request is served from (small requests come
  // from slabs, large ones round up to 2 MiB).
  make_context();
  touch_interposer();
  CUdeviceptr mid = 0, whole = 0, exact = 0;
  REQUIRE(cuMemAlloc(&mid, 600 * 1024) == CUDA_SUCCESS);  // a 640 KiB block of a 2 MiB slab
  REQUIRE(cuMemAlloc(&whole, 2 * kMiB) == CUDA_SUCCESS);
  REQUIRE(cuMemAlloc(&exact, 3000) == CUDA_SUCCESS);
  std::vector<cuwt_block> all = blocks();
  const cuwt_block* be = block_at(all, exact);
  REQUIRE(be);
  CHECK(be->bytes == 3072);
  REQUIRE(cuMemFree(exact) == CUDA_SUCCESS);
  REQUIRE(cuMemFree(mid) == CUDA_SUCCESS);
  all = blocks();
  REQUIRE(block_at(all, exact));
  REQUIRE(block_at(all, mid));
  REQUIRE(block_at(all, exact)->state == kFree);  // the device was idle: free at once
  REQUIRE(block_at(all, mid)->state == kFree);
  CHECK(stats().largest_free == 640 * 1024);  // the slab's class, not the 3 KiB whole block
  REQUIRE(cuMemFree(whole) == CUDA_SUCCESS);
  CHECK(stats().largest_free == 2 * kMiB);
}

TEST_CASE("backend: passthrough keeps nothing: no blocks, an empty pool", "[seam_off]") {
  make_context();
  touch_interposer();
  CUdeviceptr p = 0;
  REQUIRE(cuMemAlloc(&p, 3 * kMiB) == CUDA_SUCCESS);
  CHECK(dev_counters().live_allocations.load() == 1);  // the core records it
  CHECK(blocks().empty());
  const cuwt_pool_stats s = stats();
  CHECK(s.reserved == 0);
  CHECK(s.cached == 0);
  CHECK(s.largest_free == 0);
  REQUIRE(cuMemFree(p) == CUDA_SUCCESS);
}

TEST_CASE("backend: IPC imports and closes reach the driver, by every ABI variant", "[seam_off][seam_cache]") {
  make_context();
  touch_interposer();
  CUdeviceptr p = 0, q = 0;
  REQUIRE(cuMemAlloc(&p, 4 * kMiB) == CUDA_SUCCESS);  // a whole block under the cache: exportable
  CUipcMemHandle h{};
  REQUIRE(cuIpcGetMemHandle(&h, p) == CUDA_SUCCESS);
  CUdeviceptr base = 0;
  size_t size = 0;
  if (vmm_pool()) {  // mapped granules: a handle of ours, which this process cannot open either
    CHECK(fakecuda_ipc_handle_range(&h, &base, &size) != 0);
    CHECK(cuIpcOpenMemHandle(&q, h, 0) == CUDA_ERROR_INVALID_VALUE);  // the one flag is required
    CHECK(cuIpcOpenMemHandle(&q, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) == CUDA_ERROR_INVALID_CONTEXT);
    REQUIRE(cuMemFree(p) == CUDA_SUCCESS);
    return;
  }
  REQUIRE(fakecuda_ipc_handle_range(&h, &base, &size) == 0);
  CHECK(base == p);
  CHECK(size == 4 * kMiB);
  // The driver's own answers: a process opening its own export, a close of nothing opened.
  CHECK(cuIpcOpenMemHandle(&q, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) == CUDA_ERROR_INVALID_CONTEXT);
  using open_fn = CUresult (*)(CUdeviceptr*, CUipcMemHandle, unsigned);
  void* libcuda = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  REQUIRE(libcuda);
  for (const char* variant : {"cuIpcOpenMemHandle", "cuIpcOpenMemHandle_v2"}) {
    INFO(variant);
    auto open = reinterpret_cast<open_fn>(dlsym(libcuda, variant));
    REQUIRE(open);
    CHECK(open(&q, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) == CUDA_ERROR_INVALID_CONTEXT);
    CHECK(open(&q, h, 0) == CUDA_ERROR_INVALID_VALUE);     // the driver takes exactly the one flag
    CHECK(open(&q, h, 0x80) == CUDA_ERROR_INVALID_VALUE);  // an unknown flag
  }
  CHECK(cuIpcCloseMemHandle(p) == CUDA_ERROR_INVALID_VALUE);
  REQUIRE(cuMemFree(p) == CUDA_SUCCESS);
}

TEST_CASE("backend: peer access is enabled and disabled through the backend as the driver answers",
          "[seam_off][seam_cache]") {
  make_context(1);
  CUcontext peer = nullptr;
  REQUIRE(cuCtxGetCurrent(&peer) == CUDA_SUCCESS);
  make_context(0);
  touch_interposer();
  CUcontext self = nullptr;
  REQUIRE(cuCtxGetCurrent(&self) == CUDA_SUCCESS);
  CHECK(cuCtxEnablePeerAccess(peer, 0) == CUDA_SUCCESS);
  CHECK(fakecuda_peer_access_enabled(self, peer) == 1);
  CHECK(cuCtxEnablePeerAccess(peer, 0) == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
  CHECK(cuCtxEnablePeerAccess(self, 0) == CUDA_ERROR_INVALID_DEVICE);
  CHECK(cuCtxDisablePeerAccess(peer) == CUDA_SUCCESS);
  CHECK(fakecuda_peer_access_enabled(self, peer) == 0);
  CHECK(cuCtxDisablePeerAccess(peer) == CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
}

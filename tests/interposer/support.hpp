// Interposer tests: helpers shared by the test files (run inside a process that has
// libcuwarden.so preloaded and the simulated driver as libcuda.so.1).
#pragma once

#include <cuda.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "cuw/paths.hpp"
#include "fakecuda.h"
#include "cuw/ring.hpp"

namespace cuwtest {

/// One MiB in bytes; the test files' `using cuwtest::kMiB;` (one definition for unity builds).
inline constexpr uint64_t kMiB = 1ULL << 20;

/// Calls cuInit and makes device `ordinal`'s primary context current on this thread.
inline void make_context(int ordinal = 0) {
  REQUIRE(cuInit(0) == CUDA_SUCCESS);
  CUdevice dev = 0;
  REQUIRE(cuDeviceGet(&dev, ordinal) == CUDA_SUCCESS);
  CUcontext ctx = nullptr;
  REQUIRE(cuDevicePrimaryCtxRetain(&ctx, dev) == CUDA_SUCCESS);
  REQUIRE(cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
}

/// This process's ring, mapped read-write (the daemon's view). Requires that the
/// interposer has created it (any hooked allocation call does).
inline cuw::ring::RingHeader& own_ring() {
  static cuw::ring::RingHeader* h = [] {
    const uint32_t pid = static_cast<uint32_t>(getpid());
    const std::string path =
        cuw::paths::run_dir() + "/" + cuw::paths::ring_file_name(pid, cuw::paths::process_start_time(pid));
    int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    INFO("ring file " << path);
    REQUIRE(fd >= 0);
    const uint64_t bytes = cuw::ring::file_size(cuw::ring::kDefaultSlotCount);
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    REQUIRE(p != MAP_FAILED);
    REQUIRE(cuw::ring::validate(p, bytes) == cuw::ring::Invalid::none);
    return static_cast<cuw::ring::RingHeader*>(p);
  }();
  return *h;
}

/// The backend the test process runs under (CUWARDEN_POOL, "off" when unset): the pooled
/// backends' tests run under `cache` and `vmm`, and check what differs by layout.
inline std::string pool_name() {
  const char* v = getenv("CUWARDEN_POOL");
  return v && *v ? v : "off";
}
inline bool vmm_pool() { return pool_name() == "vmm"; }

inline cuw::ring::DeviceSlot& dev_counters(int ordinal = 0) { return own_ring().devices[ordinal]; }
inline uint64_t used(int ordinal = 0) { return dev_counters(ordinal).used.load(); }

/// Allocate and free once so the ring exists, then return to zero.
inline void touch_interposer() {
  CUdeviceptr p = 0;
  REQUIRE(cuMemAlloc(&p, 512) == CUDA_SUCCESS);
  REQUIRE(cuMemFree(p) == CUDA_SUCCESS);
}

/// A slow "kernel": queued on `s` through a real work entry point (cuLaunchHostFunc, which
/// the interposer sees as it sees every launch); `ms` milliseconds after it starts it sets
/// `n` bytes at `p` to `v` (the simulated device's memory is host memory), then sets
/// *done (release), if given.
inline CUresult slow_fill(CUstream s, CUdeviceptr p, unsigned char v, size_t n, unsigned ms,
                   std::atomic<bool>* done = nullptr) {
  struct Work {
    CUdeviceptr p;
    unsigned char v;
    size_t n;
    unsigned ms;
    std::atomic<bool>* done;
  };
  auto* w = new Work{p, v, n, ms, done};
  const CUresult r = cuLaunchHostFunc(
      s,
      [](void* data) {
        auto* work = static_cast<Work*>(data);
        std::this_thread::sleep_for(std::chrono::milliseconds(work->ms));
        std::memset(reinterpret_cast<void*>(work->p), work->v, work->n);
        if (work->done) work->done->store(true, std::memory_order_release);
        delete work;
      },
      w);
  if (r != CUDA_SUCCESS) delete w;
  return r;
}

/// True when all `n` bytes at device address `p` equal `v` (a synchronous copy).
inline bool all_bytes(CUdeviceptr p, size_t n, unsigned char v) {
  std::vector<unsigned char> h(n);
  if (cuMemcpyDtoH(h.data(), p, n) != CUDA_SUCCESS) return false;
  for (unsigned char c : h)
    if (c != v) return false;
  return true;
}

/// Alloc+free pairs of `bytes` until 64 pairs in a row need no event work (the cache proved
/// the device idle; a cache that has not polls and seals within 16 frees), at most `tries`
/// rounds; true when it got there.
inline bool reach_idle(size_t bytes, int tries = 50) {
  for (int i = 0; i < tries; ++i) {
    fakecuda_reset_counters();
    for (int k = 0; k < 64; ++k) {
      CUdeviceptr p = 0;
      if (cuMemAlloc(&p, bytes) != CUDA_SUCCESS || cuMemFree(p) != CUDA_SUCCESS) return false;
    }
    if (fakecuda_call_count("cuEventRecord") == 0 && fakecuda_call_count("cuEventQuery") == 0 &&
        fakecuda_call_count("cuEventSynchronize") == 0)
      return true;
  }
  return false;
}

/// Runs `work` on another thread from inside a paused driver call (fakecuda_pause_in) and
/// waits for it: to the end, or, when `may_block` (the work may wait on a lock the paused
/// call's caller holds), for at most half a second, after which it finishes after the call
/// instead. join() waits for it either way.
struct Meanwhile {
  std::function<void()> work;
  bool may_block = false;
  std::thread thread;
  std::atomic<bool> started{false}, done{false};
  static void run(void* self) {
    auto* m = static_cast<Meanwhile*>(self);
    m->started.store(true);
    m->thread = std::thread([m] {
      m->work();
      m->done.store(true);
    });
    for (int i = 0; !m->done.load() && (!m->may_block || i < 500); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  void join() {
    if (thread.joinable()) thread.join();
  }
};

}  // namespace cuwtest

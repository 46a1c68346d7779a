// Interposer tests: helpers shared by the test files (run inside a process that has
// libcuwarden.so preloaded and the simulated driver as libcuda.so.1).
#pragma once

#include <cuda.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>

#include "cuw/paths.hpp"
#include "cuw/ring.hpp"

namespace cuwtest {

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

inline cuw::ring::DeviceSlot& dev_counters(int ordinal = 0) { return own_ring().devices[ordinal]; }
inline uint64_t used(int ordinal = 0) { return dev_counters(ordinal).used.load(); }

/// Allocate and free once so the ring exists, then return to zero.
inline void touch_interposer() {
  CUdeviceptr p = 0;
  REQUIRE(cuMemAlloc(&p, 512) == CUDA_SUCCESS);
  REQUIRE(cuMemFree(p) == CUDA_SUCCESS);
}

}  // namespace cuwtest

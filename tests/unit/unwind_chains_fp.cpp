// Unit tests of the stack walk: a chain built with -O2 -fno-omit-frame-pointer (tests/unit/CMakeLists.txt).
#include "unwind_chains.hpp"

#define CUWT_FRAME(name, next, bytes)              \
  __attribute__((noinline)) int name(Job* job) {   \
    volatile char pad[bytes];                      \
    pad[0] = 1;                                    \
    const int r = next(job);                       \
    __asm__ volatile("" ::: "memory");             \
    return r + pad[0] - 1;                         \
  }

namespace {
CUWT_FRAME(fp_d, take, 24)
CUWT_FRAME(fp_c, fp_d, 72)
CUWT_FRAME(fp_b, fp_c, 520)
}  // namespace
CUWT_FRAME(chain_fp, fp_b, 8)

// Unit tests of the stack walk: chains built with -O2 -fomit-frame-pointer (tests/unit/CMakeLists.txt).
#include <alloca.h>

#include <cstring>

#include "unwind_chains.hpp"

// Each frame keeps a buffer of its own size alive across the call (so the CFA offsets
// differ), and does work after it (no tail call: the frame stays on the stack).
#define CUWT_FRAME(name, next, bytes)              \
  __attribute__((noinline)) int name(Job* job) {   \
    volatile char pad[bytes];                      \
    pad[0] = 1;                                    \
    const int r = next(job);                       \
    __asm__ volatile("" ::: "memory");             \
    return r + pad[0] - 1;                         \
  }

namespace {
CUWT_FRAME(nofp_d, take, 8)
CUWT_FRAME(nofp_c, nofp_d, 200)
CUWT_FRAME(nofp_b, nofp_c, 40)
}  // namespace
CUWT_FRAME(chain_nofp, nofp_b, 1000)

namespace {
__attribute__((noinline)) int alloca_inner(Job* job, int bytes) {
  auto* p = static_cast<char*>(alloca(static_cast<unsigned>(bytes)));
  std::memset(p, 1, static_cast<unsigned>(bytes));
  __asm__ volatile("" : : "r"(p) : "memory");
  const int r = chain_nofp(job);
  __asm__ volatile("" : : "r"(p) : "memory");
  return r + p[bytes - 1] - 1;
}
}  // namespace

__attribute__((noinline)) int chain_alloca(Job* job, int bytes) {
  auto* p = static_cast<char*>(alloca(static_cast<unsigned>(bytes)));
  std::memset(p, 1, static_cast<unsigned>(bytes));
  __asm__ volatile("" : : "r"(p) : "memory");
  const int r = alloca_inner(job, bytes + 24);
  __asm__ volatile("" : : "r"(p) : "memory");
  return r + p[0] - 1;
}

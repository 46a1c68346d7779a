// cuwarden bench: what capturing a call site costs (CUWARDEN_CALLSITES), two ways.
//
//   cuw_bench_callsites pairs [--pairs N] [--depth D]
//       N cuMemAlloc_v2 + cuMemFree_v2 pairs of 1 MiB made D noinline frames deep (so that a
//       16-frame capture has 16 frames to take); prints "ns_per_pair X". Run with and without
//       CUWARDEN_CALLSITES by bench/callsites_cost.sh, interleaved.
//   cuw_bench_callsites unwind [--reps N] [--depth D]
//       glibc's backtrace(), the call sites' walk (interposer/src/core/callsites/unwind.hpp: .eh_frame
//       rules cached per return address) and a frame-pointer walk bounded by the thread's
//       stack, 16 frames each, warm and with the CPU caches cold (64 MiB written between two
//       captures), and the walk with its rule table emptied before each capture (each distinct
//       return address through its cold path: dl_iterate_phdr, .eh_frame_hdr, the FDE); prints
//       "backtrace_warm_ns X", "walk_warm_ns X", "fpwalk_warm_ns X", the same _cold_ns,
//       "walk_uncached_ns X" and the return addresses it looked up, the frames each found and
//       how many of the walks fell back to backtrace().
#include <execinfo.h>
#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/callsites/unwind.hpp"
#include "driver_api.hpp"

namespace {

using Clock = std::chrono::steady_clock;

cuw::bench::Driver g_drv;
int g_pairs = 20000;

__attribute__((noinline)) void pairs_at(int depth) {
  if (depth > 0) {
    pairs_at(depth - 1);
    __asm__ volatile("" ::: "memory");  // not a tail call: the frame stays
    return;
  }
  CUdeviceptr p = 0;
  for (int i = 0; i < g_pairs; ++i) {
    if (g_drv.mem_alloc(&p, 1 << 20) != CUDA_SUCCESS || g_drv.mem_free(p) != CUDA_SUCCESS) std::exit(2);
  }
}

/// Frame-pointer walk: each frame's saved rbp chain, stopping outside the thread's stack or
/// when the chain does not go up (what a bounded walk in a hook would have to do).
__attribute__((noinline)) int fp_walk(void** out, int max, uintptr_t lo, uintptr_t hi) {
  auto* fp = static_cast<uintptr_t*>(__builtin_frame_address(0));
  int n = 0;
  while (n < max && reinterpret_cast<uintptr_t>(fp) >= lo && reinterpret_cast<uintptr_t>(fp) + 16 <= hi &&
         (reinterpret_cast<uintptr_t>(fp) & 7) == 0) {
    const uintptr_t ret = fp[1];
    if (ret == 0) break;
    out[n++] = reinterpret_cast<void*>(ret);
    auto* next = reinterpret_cast<uintptr_t*>(fp[0]);
    if (next <= fp) break;
    fp = next;
  }
  return n;
}

std::vector<char> g_flush(64 << 20);
void flush_caches() {
  for (std::size_t i = 0; i < g_flush.size(); i += 64) g_flush[i] = static_cast<char>(g_flush[i] + 1);
}

struct Unwind {
  int reps;
  uintptr_t lo, hi;
  double bt_warm = 0, walk_warm = 0, fp_warm = 0, bt_cold = 0, walk_cold = 0, fp_cold = 0, walk_uncached = 0;
  int bt_frames = 0, walk_frames = 0, fp_frames = 0;
  int walk_fallbacks = 0;
  double walk_uncached_lookups = 0;  ///< return addresses each uncached walk looked up (distinct ones)
};

namespace unwind = cuw::core::unwind;

__attribute__((noinline)) void unwind_at(int depth, Unwind& u) {
  if (depth > 0) {
    unwind_at(depth - 1, u);
    __asm__ volatile("" ::: "memory");
    return;
  }
  void* buf[16];
  enum Prep { warm, cold, uncached };
  auto time = [&](auto&& f, Prep prep) {
    std::vector<double> v;
    for (int i = 0; i < u.reps; ++i) {
      if (prep == cold) flush_caches();
      if (prep == uncached) unwind::forget();
      const auto t0 = Clock::now();
      f();
      v.push_back(std::chrono::duration<double, std::nano>(Clock::now() - t0).count());
    }
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  auto walk = [&] {
    const int n = unwind::walk(buf, 16);
    u.walk_fallbacks += n == unwind::kFallback;
    return n;
  };
  u.bt_warm = time([&] { u.bt_frames = backtrace(buf, 16); }, warm);
  u.walk_warm = time([&] { u.walk_frames = walk(); }, warm);
  u.fp_warm = time([&] { u.fp_frames = fp_walk(buf, 16, u.lo, u.hi); }, warm);
  u.bt_cold = time([&] { backtrace(buf, 16); }, cold);
  u.walk_cold = time([&] { walk(); }, cold);
  u.fp_cold = time([&] { fp_walk(buf, 16, u.lo, u.hi); }, cold);
  const uint64_t looked_up = unwind::stats().cold;
  u.walk_uncached = time([&] { walk(); }, uncached);
  u.walk_uncached_lookups = static_cast<double>(unwind::stats().cold - looked_up) / u.reps;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s pairs|unwind [--pairs N] [--reps N] [--depth D]\n", argv[0]);
    return 1;
  }
  const std::string mode = argv[1];
  int depth = 20, reps = 2000;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--pairs") g_pairs = std::atoi(argv[i + 1]);
    else if (k == "--depth") depth = std::atoi(argv[i + 1]);
    else if (k == "--reps") reps = std::atoi(argv[i + 1]);
  }
  if (mode == "pairs") {
    if (!g_drv.open()) return 2;
    const int n = g_pairs;
    g_pairs = 200;
    pairs_at(depth);  // warm-up: the first capture stores the site
    g_pairs = n;
    const auto t0 = Clock::now();
    pairs_at(depth);
    const double ns = std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / n;
    std::printf("ns_per_pair %.1f\n", ns);
    return 0;
  }
  if (mode == "unwind") {
    pthread_attr_t attr;
    void* addr = nullptr;
    size_t size = 0;
    pthread_getattr_np(pthread_self(), &attr);
    pthread_attr_getstack(&attr, &addr, &size);
    pthread_attr_destroy(&attr);
    Unwind u{reps, reinterpret_cast<uintptr_t>(addr), reinterpret_cast<uintptr_t>(addr) + size};
    void* warm[4];
    backtrace(warm, 4);  // its first call loads libgcc_s
    unwind_at(depth, u);
    std::printf("backtrace_warm_ns %.0f\nwalk_warm_ns %.0f\nfpwalk_warm_ns %.0f\n", u.bt_warm, u.walk_warm, u.fp_warm);
    std::printf("backtrace_cold_ns %.0f\nwalk_cold_ns %.0f\nfpwalk_cold_ns %.0f\n", u.bt_cold, u.walk_cold, u.fp_cold);
    std::printf("walk_uncached_ns %.0f\nwalk_uncached_lookups %.1f\n", u.walk_uncached, u.walk_uncached_lookups);
    std::printf("backtrace_frames %d\nwalk_frames %d\nfpwalk_frames %d\n", u.bt_frames, u.walk_frames, u.fp_frames);
    const unwind::Stats st = unwind::stats();
    std::printf("walk_fallbacks %d of %d (frame rule %llu, code %llu, stack %llu)\n", u.walk_fallbacks, 4 * u.reps,
                static_cast<unsigned long long>(st.fallback_rule), static_cast<unsigned long long>(st.fallback_code),
                static_cast<unsigned long long>(st.fallback_stack));
    return 0;
  }
  return 1;
}

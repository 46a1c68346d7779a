// cuwarden bench: the program the CI guard (bench/callgrind_guard.sh) runs under callgrind.
//
// Makes `--warmup` cuMemAlloc_v2 + cuMemFree_v2 pairs, then `--pairs` more with callgrind's
// collection switched on around that loop only (run valgrind with --collect-atstart=no), so
// the profile's total is the instruction count of exactly N pairs: the driver's work, plus
// cuwarden's when it is preloaded (under a pooling backend, after the warm-up, a pair is a
// pool hit and a free: cuwarden's work only). Outside valgrind the client requests are no-ops.
//
// With --expect-limit BYTES it first checks that cuMemGetInfo_v2 reports that total, i.e.
// that the interposer really is loaded and capping (a guard that measured a run without the
// hook would pass for the wrong reason); with --expect-bare it checks that it is not loaded.
//
// With --async the pairs are cuMemAllocAsync + cuMemFreeAsync on the legacy stream.
//
// Usage: cuw_callgrind_pairs [--pairs N] [--warmup N] [--size BYTES] [--async]
//                            [--expect-limit BYTES | --expect-bare]
// stdout: one line `pairs=N size=B cuwarden=0|1 meminfo_total=T`. Exit 0 ok, 1 bad usage,
// 2 driver error, 3 the expectation about the interposer failed.
#ifndef CUW_NO_VALGRIND_H
#include <valgrind/callgrind.h>
#else
#define CALLGRIND_TOGGLE_COLLECT
#endif

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "driver_api.hpp"

namespace {

bool parse_u64(const char* s, unsigned long long* out) {
  char* end = nullptr;
  *out = std::strtoull(s, &end, 10);
  return end && *end == '\0' && end != s;
}

}  // namespace

int main(int argc, char** argv) {
  unsigned long long pairs = 2000, warmup = 200, size = 1 << 20, expect_limit = 0;
  bool expect_bare = false, async = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    unsigned long long* target = a == "--pairs" ? &pairs : a == "--warmup" ? &warmup : a == "--size" ? &size
                               : a == "--expect-limit" ? &expect_limit : nullptr;
    if (a == "--expect-bare") {
      expect_bare = true;
    } else if (a == "--async") {
      async = true;
    } else if (!target || i + 1 >= argc || !parse_u64(argv[++i], target)) {
      std::fprintf(stderr,
                   "usage: cuw_callgrind_pairs [--pairs N] [--warmup N] [--size BYTES] [--async] "
                   "[--expect-limit BYTES | --expect-bare]\n");
      return 1;
    }
  }

  cuw::bench::Driver d;
  if (!d.open()) return 2;
  const bool loaded = cuw::bench::cuwarden_loaded();
  size_t free_bytes = 0, total = 0;
  if (CUresult r = d.mem_get_info(&free_bytes, &total); r != CUDA_SUCCESS) {
    std::fprintf(stderr, "cuw_callgrind_pairs: cuMemGetInfo_v2: %s\n", d.err(r).c_str());
    return 2;
  }
  if (expect_limit != 0 && (!loaded || total != expect_limit)) {
    std::fprintf(stderr,
                 "cuw_callgrind_pairs: the interposer is not active: libcuwarden.so %s, cuMemGetInfo total %zu, "
                 "expected the cap %llu\n",
                 loaded ? "mapped" : "not mapped", total, expect_limit);
    return 3;
  }
  if (expect_bare && loaded) {
    std::fprintf(stderr, "cuw_callgrind_pairs: libcuwarden.so is loaded in the bare run\n");
    return 3;
  }

  using alloc_async_fn = CUresult (*)(CUdeviceptr*, size_t, CUstream);
  using free_async_fn = CUresult (*)(CUdeviceptr, CUstream);
  const auto alloc_async = reinterpret_cast<alloc_async_fn>(dlsym(d.lib, "cuMemAllocAsync"));
  const auto free_async = reinterpret_cast<free_async_fn>(dlsym(d.lib, "cuMemFreeAsync"));
  if (async && (!alloc_async || !free_async)) {
    std::fprintf(stderr, "cuw_callgrind_pairs: the driver lacks cuMemAllocAsync / cuMemFreeAsync\n");
    return 2;
  }
  auto pair = [&]() -> bool {
    CUdeviceptr p = 0;
    CUresult r = async ? alloc_async(&p, size, nullptr) : d.mem_alloc(&p, size);
    if (r == CUDA_SUCCESS) r = async ? free_async(p, nullptr) : d.mem_free(p);
    if (r != CUDA_SUCCESS) std::fprintf(stderr, "cuw_callgrind_pairs: %s\n", d.err(r).c_str());
    return r == CUDA_SUCCESS;
  };
  for (unsigned long long i = 0; i < warmup; ++i)
    if (!pair()) return 2;

  bool ok = true;
  CALLGRIND_TOGGLE_COLLECT;
  for (unsigned long long i = 0; i < pairs && ok; ++i) ok = pair();
  CALLGRIND_TOGGLE_COLLECT;
  if (!ok) return 2;

  std::printf("pairs=%llu size=%llu cuwarden=%d meminfo_total=%zu\n", pairs, size, loaded ? 1 : 0, total);
  return 0;
}

// cuwarden bench: Google Benchmark micro-benchmarks of the hooked driver entry points.
//
// Run the same binary twice, bare and with libcuwarden.so preloaded (bench/micro.sh does):
// the difference is the hook's cost. On the simulated driver (build/fakecuda) the driver
// side is cheap, so the difference is mostly cuwarden's own work.
//
//   BM_alloc_free/<bytes>  one cuMemAlloc_v2 + cuMemFree_v2 pair
//   BM_alloc_free_per_device/<bytes>/threads:N  the same pair on N threads at once, thread i on
//                          device i % CUWARDEN_FAKE_DEVICES (its primary context): whether the
//                          threads of different devices wait for each other (real time per pair,
//                          all threads together)
//   BM_mem_get_info        one cuMemGetInfo_v2
// Each benchmark reports the counter `cuwarden` (1 when the interposer is loaded).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdlib>

#include "driver_api.hpp"

namespace {

cuw::bench::Driver& driver() {
  static cuw::bench::Driver d = [] {
    cuw::bench::Driver x;
    if (!x.open()) std::exit(2);
    return x;
  }();
  return d;
}

/// The timed loop of both pair benchmarks: cuMemAlloc_v2 + cuMemFree_v2 of range(0) bytes in
/// the thread's current context (`ready`: the setup's result; an error skips the benchmark).
void alloc_free_pairs(benchmark::State& state, cuw::bench::Driver& d, CUresult ready) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  CUresult r = ready;
  for (auto _ : state) {
    CUdeviceptr p = 0;
    if (r == CUDA_SUCCESS) r = d.mem_alloc(&p, bytes);
    if (r == CUDA_SUCCESS) r = d.mem_free(p);
    if (r != CUDA_SUCCESS) {
      state.SkipWithError(("driver error " + d.err(r)).c_str());
      break;
    }
    benchmark::DoNotOptimize(p);
  }
  // Averaged over threads (1 when loaded, whatever their number: micro.sh checks it).
  state.counters["cuwarden"] = benchmark::Counter(cuw::bench::cuwarden_loaded() ? 1 : 0, benchmark::Counter::kAvgThreads);
  state.SetItemsProcessed(state.iterations());
}

void BM_alloc_free(benchmark::State& state) { alloc_free_pairs(state, driver(), CUDA_SUCCESS); }
BENCHMARK(BM_alloc_free)->Arg(4 << 10)->Arg(1 << 20)->Arg(64 << 20);

void BM_alloc_free_per_device(benchmark::State& state) {
  auto& d = driver();
  int devices = 1;
  if (const char* n = std::getenv("CUWARDEN_FAKE_DEVICES")) devices = std::max(1, std::atoi(n));
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  CUresult r = d.device_get(&dev, state.thread_index() % devices);
  if (r == CUDA_SUCCESS) r = d.ctx_retain(&ctx, dev);
  if (r == CUDA_SUCCESS) r = d.ctx_set_current(ctx);
  alloc_free_pairs(state, d, r);
}
BENCHMARK(BM_alloc_free_per_device)->Arg(1 << 20)->Threads(2)->UseRealTime();

void BM_mem_get_info(benchmark::State& state) {
  auto& d = driver();
  for (auto _ : state) {
    size_t free_bytes = 0, total = 0;
    CUresult r = d.mem_get_info(&free_bytes, &total);
    if (r != CUDA_SUCCESS) {
      state.SkipWithError(("driver error " + d.err(r)).c_str());
      break;
    }
    benchmark::DoNotOptimize(free_bytes);
    benchmark::DoNotOptimize(total);
  }
  state.counters["cuwarden"] = cuw::bench::cuwarden_loaded() ? 1 : 0;
}
BENCHMARK(BM_mem_get_info);

}  // namespace

BENCHMARK_MAIN();

// cuwarden bench: hook overhead and interposer memory on a real GPU (or the simulated driver).
//
// Run it bare and with libcuwarden.so preloaded (bench/gpu.sh does both, interleaved); each
// run prints one JSON line, and the difference between the two is cuwarden's cost.
// Static cudart (nvcc's default), driver API through dlopen("libcuda.so.1"), so both of a
// real application's ways into the driver are measured.
//
//   cuw_bench_gpu pairs [--sizes 4K,1M,64M,1G] [--reps 5] [--rep-ms 100]
//     per size: driver  cuMemAlloc_v2 + cuMemFree_v2
//               runtime cudaMalloc + cudaFree
//               async   cudaMallocAsync + cudaFreeAsync on one stream (stream-ordered pool;
//                       the stream is synchronized at the end of each repetition, and
//                       every N pairs with --async-sync-every N: the simulated driver has
//                       no same-stream reuse, so without it its pool only grows)
//     and once: meminfo_driver cuMemGetInfo_v2, meminfo_runtime cudaMemGetInfo.
//     Each repetition times a fixed count of operations sized to take about --rep-ms;
//     "ns" holds one ns/operation figure per repetition.
//   cuw_bench_gpu hookcost [--sizes 4K,1M,64M] [--rounds 300]
//     What the hooks add to a driver-API pair, measured inside one process: the pair through
//     the entry points dlsym hands out (cuwarden's hooks when it is preloaded) and through
//     libcuda's own definitions (found in its ELF symbol table, past any interposer), in
//     alternating batches; per size and API (driver cuMemAlloc_v2+cuMemFree_v2, async
//     cuMemAllocAsync+cuMemFreeAsync), the median of the per-batch differences. Run without
//     a preload it measures the method's own noise (both paths are the driver's).
//   cuw_bench_gpu hookraw --out FILE [--size 1M] [--pairs 30000] [--block 8] [--api driver|async]
//     Per-pair times (alloc and free separately) for offline analysis: the hooked path and
//     libcuda's own entry points twice (an A/A control in the same process), in blocks of
//     --block pairs, each group of three blocks in a random order (bench/hookraw_report.py).
//     --own-stack-shift B: libcuda's own entry points called B bytes deeper (the hooks'
//     frame); --random-stack 1: each block at a random stack depth in [0, 4096) bytes.
//   cuw_bench_gpu rss [--count 100000] [--size 4K]
//     VmRSS after warm-up, with --count allocations live (cuMemAlloc_v2), after freeing them.
//
// Exit 0; 1 bad usage; 2 CUDA error (message on stderr).
#include <alloca.h>
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "driver_api.hpp"
#include "base/libc_elf.hpp"

namespace {

using clock_type = std::chrono::steady_clock;

bool parse_size(const std::string& s, uint64_t* out) {
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (!end || end == s.c_str() || v < 0) return false;
  const std::string unit = end;
  double mul = 1;
  if (unit == "" || unit == "B") mul = 1;
  else if (unit == "K" || unit == "KiB") mul = 1024.0;
  else if (unit == "M" || unit == "MiB") mul = 1024.0 * 1024;
  else if (unit == "G" || unit == "GiB") mul = 1024.0 * 1024 * 1024;
  else return false;
  *out = static_cast<uint64_t>(v * mul);
  return true;
}

std::string json_str(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if (static_cast<unsigned char>(c) >= 0x20) o += c;
  }
  return o + "\"";
}

[[noreturn]] void die_rt(const char* what, cudaError_t e) {
  std::fprintf(stderr, "cuw_bench_gpu: %s: %s\n", what, cudaGetErrorName(e));
  std::exit(2);
}

[[noreturn]] void die_drv(const cuw::bench::Driver& d, const char* what, CUresult r) {
  std::fprintf(stderr, "cuw_bench_gpu: %s: %s\n", what, d.err(r).c_str());
  std::exit(2);
}

/// ns per call of `op` for each of `reps` repetitions of about `rep_ms` each.
/// `finish` runs inside the timed region once per repetition (stream synchronization).
std::vector<double> time_op(const std::function<void()>& op, const std::function<void()>& finish, int reps,
                            double rep_ms) {
  // Calibrate: double the batch until it takes a tenth of a repetition.
  uint64_t batch = 1;
  double batch_ns = 0;
  for (;;) {
    const auto t0 = clock_type::now();
    for (uint64_t i = 0; i < batch; ++i) op();
    finish();
    batch_ns = std::chrono::duration<double, std::nano>(clock_type::now() - t0).count();
    if (batch_ns >= rep_ms * 1e5 || batch >= (1ULL << 26)) break;
    batch *= 2;
  }
  uint64_t n = std::max<uint64_t>(3, static_cast<uint64_t>(static_cast<double>(batch) * rep_ms * 1e6 / batch_ns));
  std::vector<double> out;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = clock_type::now();
    for (uint64_t i = 0; i < n; ++i) op();
    finish();
    out.push_back(std::chrono::duration<double, std::nano>(clock_type::now() - t0).count() / static_cast<double>(n));
  }
  return out;
}

std::string json_list(const std::vector<double>& v) {
  std::string s = "[";
  char buf[64];
  for (size_t i = 0; i < v.size(); ++i) {
    std::snprintf(buf, sizeof buf, "%s%.2f", i ? "," : "", v[i]);
    s += buf;
  }
  return s + "]";
}

struct Context {
  cuw::bench::Driver drv;
  std::string device_name;
  int runtime_version = 0;
  int driver_version = 0;
};

void init(Context& c) {
  if (cudaError_t e = cudaSetDevice(0); e != cudaSuccess) die_rt("cudaSetDevice", e);
  // cudaSetDevice creates the primary context (CUDA >= 12); a first allocation makes sure.
  void* p = nullptr;
  if (cudaError_t e = cudaMalloc(&p, 512); e != cudaSuccess) die_rt("cudaMalloc", e);
  if (cudaError_t e = cudaFree(p); e != cudaSuccess) die_rt("cudaFree", e);
  cudaRuntimeGetVersion(&c.runtime_version);
  cudaDriverGetVersion(&c.driver_version);
  if (!c.drv.open(0)) std::exit(2);
  char name[256] = {};
  c.drv.device_name(name, sizeof name - 1, c.drv.device);
  c.device_name = name;
}

std::string header(const Context& c, const char* mode) {
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "{\"program\":\"cuw_bench_gpu\",\"mode\":\"%s\",\"pid\":%d,\"cuwarden\":%d,\"device\":%s,"
                "\"driver_version\":%d,\"runtime_version\":%d",
                mode, static_cast<int>(getpid()), cuw::bench::cuwarden_loaded() ? 1 : 0, json_str(c.device_name).c_str(),
                c.driver_version, c.runtime_version);
  return buf;
}

int run_pairs(const std::vector<uint64_t>& sizes, int reps, double rep_ms, uint64_t sync_every) {
  uint64_t async_pairs = 0;
  Context c;
  init(c);
  cudaStream_t stream = nullptr;
  if (cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking); e != cudaSuccess)
    die_rt("cudaStreamCreate", e);
  auto& d = c.drv;
  auto nothing = [] {};
  std::string results;
  auto add = [&](const char* api, const char* op, uint64_t bytes, const std::vector<double>& ns) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "%s{\"api\":\"%s\",\"op\":\"%s\",\"bytes\":%llu,\"ns\":", results.empty() ? "" : ",",
                  api, op, static_cast<unsigned long long>(bytes));
    results += buf + json_list(ns) + "}";
  };

  for (uint64_t bytes : sizes) {
    add("driver", "alloc_free", bytes, time_op([&] {
          CUdeviceptr p = 0;
          if (CUresult r = d.mem_alloc(&p, bytes); r != CUDA_SUCCESS) die_drv(d, "cuMemAlloc_v2", r);
          if (CUresult r = d.mem_free(p); r != CUDA_SUCCESS) die_drv(d, "cuMemFree_v2", r);
        }, nothing, reps, rep_ms));
    add("runtime", "alloc_free", bytes, time_op([&] {
          void* p = nullptr;
          if (cudaError_t e = cudaMalloc(&p, bytes); e != cudaSuccess) die_rt("cudaMalloc", e);
          if (cudaError_t e = cudaFree(p); e != cudaSuccess) die_rt("cudaFree", e);
        }, nothing, reps, rep_ms));
    add("async", "alloc_free", bytes, time_op([&] {
          void* p = nullptr;
          if (cudaError_t e = cudaMallocAsync(&p, bytes, stream); e != cudaSuccess) die_rt("cudaMallocAsync", e);
          if (cudaError_t e = cudaFreeAsync(p, stream); e != cudaSuccess) die_rt("cudaFreeAsync", e);
          if (sync_every && ++async_pairs % sync_every == 0) {
            if (cudaError_t e = cudaStreamSynchronize(stream); e != cudaSuccess) die_rt("cudaStreamSynchronize", e);
          }
        }, [&] {
          if (cudaError_t e = cudaStreamSynchronize(stream); e != cudaSuccess) die_rt("cudaStreamSynchronize", e);
        }, reps, rep_ms));
  }
  add("driver", "meminfo", 0, time_op([&] {
        size_t f = 0, t = 0;
        if (CUresult r = d.mem_get_info(&f, &t); r != CUDA_SUCCESS) die_drv(d, "cuMemGetInfo_v2", r);
      }, nothing, reps, rep_ms));
  add("runtime", "meminfo", 0, time_op([&] {
        size_t f = 0, t = 0;
        if (cudaError_t e = cudaMemGetInfo(&f, &t); e != cudaSuccess) die_rt("cudaMemGetInfo", e);
      }, nothing, reps, rep_ms));

  size_t free_bytes = 0, total = 0;
  d.mem_get_info(&free_bytes, &total);
  std::printf("%s,\"reps\":%d,\"rep_ms\":%.1f,\"async_sync_every\":%llu,\"meminfo_total\":%zu,\"results\":[%s]}\n",
              header(c, "pairs").c_str(), reps, rep_ms, static_cast<unsigned long long>(sync_every), total,
              results.c_str());
  cudaStreamDestroy(stream);
  return 0;
}

int run_rss(uint64_t count, uint64_t bytes) {
  Context c;
  init(c);
  auto& d = c.drv;
  // Warm-up: fill the event ring once (it is a fixed cost, not a per-allocation one) and
  // let the driver set up its small-allocation heaps.
  for (int i = 0; i < 20000; ++i) {
    CUdeviceptr p = 0;
    if (CUresult r = d.mem_alloc(&p, bytes); r != CUDA_SUCCESS) die_drv(d, "cuMemAlloc_v2", r);
    if (CUresult r = d.mem_free(p); r != CUDA_SUCCESS) die_drv(d, "cuMemFree_v2", r);
  }
  std::vector<CUdeviceptr> ptrs(count, 0);  // touched now, so it is part of the baseline
  const unsigned long long rss_base = cuw::bench::vm_rss_bytes();
  const auto t0 = clock_type::now();
  for (uint64_t i = 0; i < count; ++i)
    if (CUresult r = d.mem_alloc(&ptrs[i], bytes); r != CUDA_SUCCESS) die_drv(d, "cuMemAlloc_v2", r);
  const double alloc_ns = std::chrono::duration<double, std::nano>(clock_type::now() - t0).count() /
                          static_cast<double>(count ? count : 1);
  const unsigned long long rss_live = cuw::bench::vm_rss_bytes();
  const auto t1 = clock_type::now();
  for (uint64_t i = 0; i < count; ++i)
    if (CUresult r = d.mem_free(ptrs[i]); r != CUDA_SUCCESS) die_drv(d, "cuMemFree_v2", r);
  const double free_ns = std::chrono::duration<double, std::nano>(clock_type::now() - t1).count() /
                         static_cast<double>(count ? count : 1);
  const unsigned long long rss_freed = cuw::bench::vm_rss_bytes();
  std::printf("%s,\"count\":%llu,\"bytes\":%llu,\"rss_base\":%llu,\"rss_live\":%llu,\"rss_freed\":%llu,"
              "\"alloc_ns\":%.1f,\"free_ns\":%.1f}\n",
              header(c, "rss").c_str(), static_cast<unsigned long long>(count), static_cast<unsigned long long>(bytes),
              rss_base, rss_live, rss_freed, alloc_ns, free_ns);
  return 0;
}

/// The driver-API pair's entry points two ways: [0] the ones dlsym hands out (cuwarden's
/// hooks when it is preloaded), [1] libcuda's own definitions, found in its ELF symbol table
/// past any interposer; and libcuda's own cuStreamSynchronize. False (with a message) when
/// one is missing.
struct PairPaths {
  using alloc_fn = CUresult (*)(CUdeviceptr*, size_t);
  using free_fn = CUresult (*)(CUdeviceptr);
  using aalloc_fn = CUresult (*)(CUdeviceptr*, size_t, CUstream);
  using afree_fn = CUresult (*)(CUdeviceptr, CUstream);
  alloc_fn alloc[2];
  free_fn dfree[2];
  aalloc_fn aalloc[2];
  afree_fn afree[2];
  CUresult (*ssync)(CUstream);

  bool resolve(const cuw::bench::Driver& d, const char* mode) {
    auto own = [](const char* n) { return cuw::libc_elf::find_in("libcuda.so", n, nullptr); };
    for (int k = 0; k < 2; ++k) {
      auto get = [&](const char* n) { return k == 0 ? dlsym(d.lib, n) : own(n); };
      alloc[k] = reinterpret_cast<alloc_fn>(get("cuMemAlloc_v2"));
      dfree[k] = reinterpret_cast<free_fn>(get("cuMemFree_v2"));
      aalloc[k] = reinterpret_cast<aalloc_fn>(get("cuMemAllocAsync"));
      afree[k] = reinterpret_cast<afree_fn>(get("cuMemFreeAsync"));
    }
    ssync = reinterpret_cast<CUresult (*)(CUstream)>(own("cuStreamSynchronize"));
    for (int k = 0; k < 2; ++k)
      if (!alloc[k] || !dfree[k] || !aalloc[k] || !afree[k] || !ssync) {
        std::fprintf(stderr, "cuw_bench_gpu: %s: driver entry points not found\n", mode);
        return false;
      }
    return true;
  }
};

/// A non-blocking stream (exits 2 on failure).
CUstream make_stream() {
  CUstream stream = nullptr;
  if (cudaError_t e = cudaStreamCreateWithFlags(reinterpret_cast<cudaStream_t*>(&stream), cudaStreamNonBlocking);
      e != cudaSuccess)
    die_rt("cudaStreamCreate", e);
  return stream;
}

int run_hookcost(const std::vector<uint64_t>& sizes, int rounds) {
  Context c;
  init(c);
  auto& d = c.drv;
  PairPaths pp;
  if (!pp.resolve(d, "hookcost")) return 2;
  const auto& [alloc, dfree, aalloc, afree, ssync] = pp;
  CUstream stream = make_stream();
  std::string results;
  for (uint64_t bytes : sizes) {
    for (int api = 0; api < 2; ++api) {  // 0 driver, 1 async
      const int batch = api == 0 ? 8 : 64;
      // One batch of pairs through path k (0 hooked, 1 the driver's own), ns per pair.
      auto run_batch = [&](int k) {
        const auto t0 = clock_type::now();
        for (int i = 0; i < batch; ++i) {
          CUdeviceptr p = 0;
          if (api == 0) {
            if (CUresult r = alloc[k](&p, bytes); r != CUDA_SUCCESS) die_drv(d, "cuMemAlloc_v2", r);
            if (CUresult r = dfree[k](p); r != CUDA_SUCCESS) die_drv(d, "cuMemFree_v2", r);
          } else {
            if (CUresult r = aalloc[k](&p, bytes, stream); r != CUDA_SUCCESS) die_drv(d, "cuMemAllocAsync", r);
            if (CUresult r = afree[k](p, stream); r != CUDA_SUCCESS) die_drv(d, "cuMemFreeAsync", r);
          }
        }
        if (api == 1) ssync(stream);
        return std::chrono::duration<double, std::nano>(clock_type::now() - t0).count() / batch;
      };
      // Warm both paths: at least 20 batches and 200 ms. On an H200 host the first
      // stream-ordered phase of a process ran with the driver's own pair at 3.2-3.5 us,
      // against 2.1 us later in the same process (bench/results/2026-11-30-h200-off-clock.md).
      const auto warm_until = clock_type::now() + std::chrono::milliseconds(200);
      for (int w = 0; w < 20 || clock_type::now() < warm_until; ++w) run_batch(w & 1);
      std::vector<double> hooked, own_ns, diff;
      for (int r = 0; r < rounds; ++r) {
        const int first = r & 1;  // alternate which path goes first
        const double a = run_batch(first), b = run_batch(1 - first);
        const double h = first == 0 ? a : b, o = first == 0 ? b : a;
        hooked.push_back(h);
        own_ns.push_back(o);
        diff.push_back(h - o);
      }
      auto median = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        return v[v.size() / 2];
      };
      auto quart = [](std::vector<double> v, double q) {
        std::sort(v.begin(), v.end());
        return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1))];
      };
      char buf[320];
      std::snprintf(buf, sizeof buf,
                    "%s{\"api\":\"%s\",\"bytes\":%llu,\"batch\":%d,\"rounds\":%d,\"hooked_ns\":%.1f,\"driver_ns\":%.1f,"
                    "\"added_ns\":%.1f,\"added_q1_ns\":%.1f,\"added_q3_ns\":%.1f}",
                    results.empty() ? "" : ",", api == 0 ? "driver" : "async", static_cast<unsigned long long>(bytes),
                    batch, rounds, median(hooked), median(own_ns), median(diff), quart(diff, 0.25), quart(diff, 0.75));
      results += buf;
    }
  }
  std::printf("%s,\"results\":[%s]}\n", header(c, "hookcost").c_str(), results.c_str());
  return 0;
}

/// Run `f` with `shift` more bytes of stack below this frame (alloca), so that what `f`
/// calls runs that much deeper.
__attribute__((noinline)) void with_stack_shift(size_t shift, const std::function<void()>& f) {
  char* p = static_cast<char*>(alloca(shift + 16));
  __asm__ volatile("" : : "r"(p) : "memory");  // keep the allocation
  f();
}

/// Raw per-pair times for offline analysis of what the hooks add to one pair, with an A/A
/// control in the same process: path 0 the entry points dlsym hands out (cuwarden's hooks
/// when it is preloaded), paths 1 and 2 libcuda's own definitions (the same function twice:
/// 2 - 1 is the method's noise). Pairs run in blocks of `block` on one path; each group of
/// three blocks takes the paths in a random order (seed 1). Writes one line per pair to
/// `path` after a "# ..." header line (api, bytes, block, stack options):
/// "path position-in-block alloc_ns free_ns"; the stream-ordered pair (`async`)
/// synchronizes its stream after each block, outside the timed calls.
int run_hookraw(uint64_t bytes, uint64_t pairs, int block, bool async, size_t own_shift, bool random_shift,
                const std::string& path) {
  Context c;
  init(c);
  auto& d = c.drv;
  PairPaths pp;
  if (!pp.resolve(d, "hookraw")) return 2;
  CUstream stream = make_stream();
  struct Row {
    uint8_t path;
    uint16_t pos;
    float alloc_ns, free_ns;
  };
  std::vector<Row> rows;
  rows.reserve(pairs);
  auto run_block = [&](int k, bool keep) {
    const int e = k == 0 ? 0 : 1;  // paths 1 and 2 both call libcuda's own entry points
    for (int i = 0; i < block; ++i) {
      CUdeviceptr p = 0;
      const auto t0 = clock_type::now();
      if (CUresult r = async ? pp.aalloc[e](&p, bytes, stream) : pp.alloc[e](&p, bytes); r != CUDA_SUCCESS)
        die_drv(d, "alloc", r);
      const auto t1 = clock_type::now();
      if (CUresult r = async ? pp.afree[e](p, stream) : pp.dfree[e](p); r != CUDA_SUCCESS) die_drv(d, "free", r);
      const auto t2 = clock_type::now();
      if (keep)
        rows.push_back(Row{static_cast<uint8_t>(k), static_cast<uint16_t>(i),
                           static_cast<float>(std::chrono::duration<double, std::nano>(t1 - t0).count()),
                           static_cast<float>(std::chrono::duration<double, std::nano>(t2 - t1).count())});
    }
    if (async) pp.ssync(stream);
  };
  // The stack depth at which a path calls the driver: libcuda's own entry points are called
  // `own_shift` bytes deeper (the hooks' frame, to compare at equal depth), and with
  // `random_shift` every block runs at a random depth in [0, 4096) bytes, 16-byte steps
  // (the driver's speed could depend on where its stack falls: 4K aliasing of loads with
  // stores; a program calls it at whatever depth it has).
  std::mt19937 rng(1), depth_rng(2);
  auto at_depth = [&](int k, bool keep) {
    size_t shift = k == 1 ? own_shift : 0;
    if (random_shift) shift += 16 * (depth_rng() % 256);
    with_stack_shift(shift, [&] { run_block(k, keep); });
  };
  const auto warm_until = clock_type::now() + std::chrono::milliseconds(200);
  for (int w = 0; w < 30 || clock_type::now() < warm_until; ++w) at_depth(w % 3, false);
  int order[3] = {0, 1, 2};
  while (rows.size() + 3 * static_cast<uint64_t>(block) <= pairs) {
    std::shuffle(order, order + 3, rng);
    for (int k : order) at_depth(k, true);
  }
  cudaStreamDestroy(reinterpret_cast<cudaStream_t>(stream));
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) {
    std::fprintf(stderr, "cuw_bench_gpu: hookraw: cannot write %s\n", path.c_str());
    return 2;
  }
  std::fprintf(f, "# cuw_bench_gpu hookraw api=%s bytes=%llu block=%d own_shift=%zu random_shift=%d\n",
               async ? "async" : "driver", static_cast<unsigned long long>(bytes), block, own_shift, random_shift ? 1 : 0);
  for (const Row& r : rows) std::fprintf(f, "%u %u %.0f %.0f\n", r.path, r.pos, r.alloc_ns, r.free_ns);
  std::fclose(f);
  std::printf("%s,\"api\":\"%s\",\"bytes\":%llu,\"pairs\":%zu,\"block\":%d,\"file\":%s}\n",
              header(c, "hookraw").c_str(), async ? "async" : "driver", static_cast<unsigned long long>(bytes), rows.size(),
              block, json_str(path).c_str());
  return 0;
}

[[noreturn]] void usage() {
  std::fprintf(stderr,
               "usage: cuw_bench_gpu pairs [--sizes 4K,1M,64M,1G] [--reps N] [--rep-ms MS] [--async-sync-every N]\n"
               "       cuw_bench_gpu hookcost [--sizes 4K,1M,64M] [--rounds N]\n"
               "       cuw_bench_gpu rss [--count N] [--size BYTES]\n"
               "       cuw_bench_gpu hookraw --out FILE [--size BYTES] [--pairs N] [--block N] [--api driver|async]\n"
               "                              [--own-stack-shift BYTES] [--random-stack 0|1]\n");
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) usage();
  const std::string mode = argv[1];
  std::vector<uint64_t> sizes = {4ULL << 10, 1ULL << 20, 64ULL << 20, 1ULL << 30};
  int reps = 5;
  double rep_ms = 100;
  uint64_t count = 100000, size = 4096, sync_every = 0;
  int rounds = 300, block = 8;
  bool async = false;
  std::string out_path;
  uint64_t pairs = 30000, own_shift = 0;
  bool random_shift = false;
  if (mode == "hookraw") size = 1ULL << 20;
  if (mode == "hookcost") sizes = {4ULL << 10, 1ULL << 20, 64ULL << 20};
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) usage();
    const std::string v = argv[++i];
    if (a == "--sizes") {
      sizes.clear();
      size_t pos = 0;
      while (pos <= v.size()) {
        const size_t comma = std::min(v.find(',', pos), v.size());
        uint64_t s = 0;
        if (!parse_size(v.substr(pos, comma - pos), &s) || s == 0) usage();
        sizes.push_back(s);
        pos = comma + 1;
      }
    } else if (a == "--reps") {
      reps = std::atoi(v.c_str());
      if (reps < 1 || reps > 1000) usage();
    } else if (a == "--rep-ms") {
      rep_ms = std::atof(v.c_str());
      if (rep_ms <= 0) usage();
    } else if (a == "--async-sync-every") {
      if (!parse_size(v, &sync_every)) usage();
    } else if (a == "--rounds") {
      rounds = std::atoi(v.c_str());
      if (rounds < 1 || rounds > 100000) usage();
    } else if (a == "--count") {
      if (!parse_size(v, &count)) usage();
    } else if (a == "--pairs") {
      if (!parse_size(v, &pairs) || pairs == 0 || pairs > 100000000) usage();
    } else if (a == "--block") {
      block = std::atoi(v.c_str());
      if (block < 1 || block > 65535) usage();
    } else if (a == "--api") {
      if (v != "driver" && v != "async") usage();
      async = v == "async";
    } else if (a == "--own-stack-shift") {
      if (!parse_size(v, &own_shift) || own_shift > 65536) usage();
    } else if (a == "--random-stack") {
      if (v != "0" && v != "1") usage();
      random_shift = v == "1";
    } else if (a == "--out") {
      out_path = v;
    } else if (a == "--size") {
      if (!parse_size(v, &size) || size == 0) usage();
    } else {
      usage();
    }
  }
  if (mode == "pairs") return run_pairs(sizes, reps, rep_ms, sync_every);
  if (mode == "rss") return run_rss(count, size);
  if (mode == "hookcost") return run_hookcost(sizes, rounds);
  if (mode == "hookraw") {
    if (out_path.empty()) usage();
    return run_hookraw(size, pairs, block, async, own_shift, random_shift, out_path);
  }
  usage();
}

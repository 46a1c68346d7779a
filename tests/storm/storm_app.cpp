// cuwarden storm tests: an application that allocates and frees device memory without a
// pause, on several threads, through the driver API (run under LD_PRELOAD=libcuwarden.so
// on the simulated driver). It keeps its own exact account, to compare with cuwarden's.
//
//   cuw_storm_app THREADS SEED [MAX_LIVE_PER_THREAD]
//
// stdout: "ready" once every thread has allocated. stdin commands, one byte each:
//   p   pause every thread between two calls, then print
//       "paused used=B live=N allocs=A frees=F errors=E ops=O max_op_us=U"
//   r   resume, print "resumed"
//   EOF free everything, print "done ..." (same fields), exit 0, or 1 if any call failed.
// Any failure other than a cap refusal is an application error (errors=); a refusal also
// counts as one here: the storms set a cap the app never reaches.
#include <cuda.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

namespace {

std::atomic<bool> g_pause{false};
std::atomic<bool> g_stop{false};
std::atomic<int> g_parked{0};
std::atomic<int> g_started{0};
std::atomic<uint64_t> g_used{0}, g_live{0}, g_allocs{0}, g_frees{0}, g_errors{0}, g_ops{0}, g_max_op_ns{0};
CUcontext g_ctx = nullptr;

uint64_t mono_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

void note_op(uint64_t t0) {
  const uint64_t d = mono_ns() - t0;
  uint64_t m = g_max_op_ns.load(std::memory_order_relaxed);
  while (d > m && !g_max_op_ns.compare_exchange_weak(m, d, std::memory_order_relaxed)) {
  }
  g_ops.fetch_add(1, std::memory_order_relaxed);
}

struct Block {
  CUdeviceptr p;
  size_t bytes;
};

void release(Block b) {
  const uint64_t t0 = mono_ns();
  if (cuMemFree(b.p) != CUDA_SUCCESS) {
    g_errors.fetch_add(1);
  } else {
    g_frees.fetch_add(1);
    g_live.fetch_sub(1);
    g_used.fetch_sub(b.bytes);
  }
  note_op(t0);
}

void worker(unsigned seed, size_t max_live) {
  if (cuCtxSetCurrent(g_ctx) != CUDA_SUCCESS) g_errors.fetch_add(1);
  std::mt19937_64 rng(seed);
  static constexpr size_t kSizes[] = {256, 4096, 65536, 1 << 20, (3 << 20) + 17, 512 * 1024 + 1};
  std::vector<Block> live;
  bool first = true;
  while (!g_stop.load(std::memory_order_relaxed)) {
    if (g_pause.load(std::memory_order_acquire)) {
      g_parked.fetch_add(1);
      while (g_pause.load(std::memory_order_acquire) && !g_stop.load()) usleep(200);
      g_parked.fetch_sub(1);
      continue;
    }
    if (live.empty() || (live.size() < max_live && rng() % 2 == 0)) {
      const size_t bytes = kSizes[rng() % (sizeof kSizes / sizeof kSizes[0])];
      CUdeviceptr p = 0;
      const uint64_t t0 = mono_ns();
      const CUresult r = cuMemAlloc(&p, bytes);
      if (r == CUDA_SUCCESS) {
        // Counted before the next pause check: a paused thread's account is complete.
        g_allocs.fetch_add(1);
        g_live.fetch_add(1);
        g_used.fetch_add(bytes);
        live.push_back({p, bytes});
      } else {
        g_errors.fetch_add(1);
        std::fprintf(stderr, "storm_app: cuMemAlloc(%zu) = %d\n", bytes, static_cast<int>(r));
      }
      note_op(t0);
      if (first) {
        first = false;
        g_started.fetch_add(1);
      }
    } else {
      const size_t i = rng() % live.size();
      release(live[i]);
      live[i] = live.back();
      live.pop_back();
    }
  }
  for (const Block& b : live) release(b);
}

void report(const char* what) {
  std::printf("%s used=%llu live=%llu allocs=%llu frees=%llu errors=%llu ops=%llu max_op_us=%llu\n", what,
              static_cast<unsigned long long>(g_used.load()), static_cast<unsigned long long>(g_live.load()),
              static_cast<unsigned long long>(g_allocs.load()), static_cast<unsigned long long>(g_frees.load()),
              static_cast<unsigned long long>(g_errors.load()), static_cast<unsigned long long>(g_ops.load()),
              static_cast<unsigned long long>(g_max_op_ns.load() / 1000));
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s THREADS SEED [MAX_LIVE_PER_THREAD]\n", argv[0]);
    return 64;
  }
  const int threads = std::atoi(argv[1]);
  const unsigned seed = static_cast<unsigned>(std::strtoul(argv[2], nullptr, 10));
  const size_t max_live = argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 16;
  CUdevice dev;
  if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&g_ctx, dev) || cuCtxSetCurrent(g_ctx)) {
    std::fprintf(stderr, "storm_app: no context\n");
    return 1;
  }
  std::vector<std::thread> ts;
  for (int i = 0; i < threads; ++i) ts.emplace_back(worker, seed * 1000u + static_cast<unsigned>(i), max_live);
  while (g_started.load() < threads && g_errors.load() == 0) usleep(1000);
  std::printf("ready\n");
  std::fflush(stdout);
  char c;
  while (::read(0, &c, 1) == 1) {
    if (c == 'p') {
      g_pause.store(true, std::memory_order_release);
      while (g_parked.load() < threads) usleep(100);
      report("paused");
    } else if (c == 'r') {
      g_pause.store(false, std::memory_order_release);
      std::printf("resumed\n");
      std::fflush(stdout);
    }
  }
  g_pause.store(false);
  g_stop.store(true);
  for (auto& t : ts) t.join();
  report("done");
  cuDevicePrimaryCtxRelease(dev);
  return g_errors.load() == 0 ? 0 : 1;
}

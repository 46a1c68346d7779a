// cuwarden job tests: one member of a job (run under LD_PRELOAD=libcuwarden.so with
// CUWARDEN_JOB / CUWARDEN_JOB_LIMIT on the simulated driver).
//
//   cuw_job_app hammer WITNESS INDEX THREADS SEED CAP
//       THREADS threads allocate (1..16 MiB) and free at random through cuMemAlloc/cuMemFree
//       until WITNESS's stop word is set, then free everything, count itself in `drained`
//       and exit 0 once the `exit` word is set.
//   cuw_job_app rounds WITNESS INDEX THREADS SEED CAP ROUNDS CHURN ALL_THREADS
//       THREADS threads, ROUNDS rounds each: CHURN random allocations and frees (as hammer,
//       of 1 MiB..kLargestRequest); wait until all ALL_THREADS threads of every app have churned (`churned`); then allocate
//       without freeing until refused, count itself in `full` and wait until the test has
//       looked (`released`); then free about half of what it holds. After the last round it
//       frees everything, counts itself in `drained` and exits 0 once `exit` is set. So the
//       storm presses the cap by construction: at each `full` barrier every thread has
//       just been refused, and nobody allocates or frees until the test has looked.
//   cuw_job_app hold BYTES            allocate BYTES, print "held", sleep until killed
//   cuw_job_app retry BYTES SECONDS   try cuMemAlloc(BYTES) until it succeeds; print
//                                     "ok <CLOCK_MONOTONIC ns of the success>", or "timeout"
//   cuw_job_app join WITNESS INDEX    one 1 MiB allocation; store the time from main() to
//                                     its success in the witness; wait for stop; exit 0
//
// The witness is a shared file the test maps too (JobWitness). After each successful
// allocation an app adds the bytes to `held` (its own slot first, then the global sum) and
// checks the global sum against CAP; before each free it takes them out (global first).
// So `global` only ever counts allocations that cuwarden's job cap has let through and not
// yet given back: if it passes the cap, the cap failed (`violations`). An app stopped
// between its two updates leaves the global sum lower than the truth (never higher): the
// check can miss but cannot raise a false alarm.
#include <cuda.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "job_witness.hpp"

namespace {

uint64_t mono_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

CUcontext g_ctx = nullptr;

bool make_context() {
  CUdevice dev;
  return cuInit(0) == CUDA_SUCCESS && cuDeviceGet(&dev, 0) == CUDA_SUCCESS &&
         cuDevicePrimaryCtxRetain(&g_ctx, dev) == CUDA_SUCCESS && cuCtxSetCurrent(g_ctx) == CUDA_SUCCESS;
}

cuwj::JobWitness* map_witness(const char* path) {
  const int fd = ::open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return nullptr;
  void* p = ::mmap(nullptr, sizeof(cuwj::JobWitness), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  return p == MAP_FAILED ? nullptr : static_cast<cuwj::JobWitness*>(p);
}

/// One thread's blocks, and the witness bookkeeping around each cuMemAlloc/cuMemFree.
struct Hammer {
  cuwj::JobWitness* w;
  cuwj::AppSlot* me;
  uint64_t cap;
  uint64_t largest;  ///< bytes: requests are 1 MiB..largest, whole MiB
  std::mt19937_64 rng;
  struct Block {
    CUdeviceptr p;
    uint64_t bytes;
  };
  std::vector<Block> live;

  /// One allocation of a random size. Returns the driver's answer.
  CUresult alloc() {
    const uint64_t bytes = (1 + rng() % (largest >> 20)) << 20;
    CUdeviceptr p = 0;
    const CUresult r = cuMemAlloc(&p, bytes);
    if (r == CUDA_SUCCESS) {
      me->held.fetch_add(bytes);
      // Signed: the kill storm's bookkeeping may leave `global` below the truth, even
      // below zero (see the top of this file).
      const int64_t now = static_cast<int64_t>(w->global.fetch_add(bytes) + bytes);
      if (now > static_cast<int64_t>(cap)) w->violations.fetch_add(1);
      int64_t m = w->max_global.load();
      while (now > m && !w->max_global.compare_exchange_weak(m, now)) {
      }
      me->allocs.fetch_add(1);
      live.push_back({p, bytes});
    } else if (r == CUDA_ERROR_OUT_OF_MEMORY) {
      me->refusals.fetch_add(1);
    } else {
      me->errors.fetch_add(1);
    }
    me->ops.fetch_add(1, std::memory_order_relaxed);
    return r;
  }
  void release(size_t i) {
    const Block b = live[i];
    w->global.fetch_sub(b.bytes);
    me->held.fetch_sub(b.bytes);
    if (cuMemFree(b.p) != CUDA_SUCCESS) me->errors.fetch_add(1);
    live[i] = live.back();
    live.pop_back();
    me->ops.fetch_add(1, std::memory_order_relaxed);
  }
  /// A random allocation or free, at most 8 blocks held.
  void step() {
    if (live.empty() || (live.size() < 8 && rng() % 2 == 0)) alloc();
    else release(rng() % live.size());
  }
  void release_all() {
    while (!live.empty()) release(live.size() - 1);
  }
};

void hammer_thread(cuwj::JobWitness* w, cuwj::AppSlot* me, unsigned seed, uint64_t cap) {
  if (cuCtxSetCurrent(g_ctx) != CUDA_SUCCESS) me->errors.fetch_add(1);
  Hammer h{w, me, cap, 16 << 20, std::mt19937_64(seed), {}};
  while (!w->stop.load(std::memory_order_relaxed)) h.step();
  h.release_all();
}

/// Wait (sleeping: the machine may be busy) until `word` reaches `target`.
void wait_for(const std::atomic<uint64_t>& word, uint64_t target) {
  while (word.load() < target) usleep(200);
}

void rounds_thread(cuwj::JobWitness* w, cuwj::AppSlot* me, unsigned seed, uint64_t cap, uint64_t all_threads,
                   int rounds, int churn) {
  if (cuCtxSetCurrent(g_ctx) != CUDA_SUCCESS) me->errors.fetch_add(1);
  Hammer h{w, me, cap, cuwj::kLargestRequest, std::mt19937_64(seed), {}};
  for (int r = 1; r <= rounds; ++r) {
    for (int i = 0; i < churn; ++i) h.step();
    // Nobody frees while others fill: a refusal then means the job really was full.
    w->churned.fetch_add(1);
    wait_for(w->churned, all_threads * static_cast<uint64_t>(r));
    CUresult res;
    do res = h.alloc();
    while (res == CUDA_SUCCESS);
    if (res != CUDA_ERROR_OUT_OF_MEMORY) break;  // counted in `errors`
    w->full.fetch_add(1);
    wait_for(w->released, static_cast<uint64_t>(r));
    for (size_t i = h.live.size(); i-- > 0;)
      if (h.rng() % 2 == 0) h.release(i);
  }
  h.release_all();
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "hammer" && argc == 7) {
    cuwj::JobWitness* w = map_witness(argv[2]);
    const int index = std::atoi(argv[3]);
    const int threads = std::atoi(argv[4]);
    const unsigned seed = static_cast<unsigned>(std::strtoul(argv[5], nullptr, 10));
    const uint64_t cap = std::strtoull(argv[6], nullptr, 10);
    if (!w || index < 0 || index >= static_cast<int>(cuwj::kMaxApps) || !make_context()) return 2;
    cuwj::AppSlot* me = &w->apps[index];
    std::vector<std::thread> ts;
    for (int i = 0; i < threads; ++i) ts.emplace_back(hammer_thread, w, me, seed * 131u + static_cast<unsigned>(i), cap);
    for (auto& t : ts) t.join();
    // Everything is freed: say so, and stay a member until the test has looked.
    w->drained.fetch_add(1);
    while (!w->exit.load()) usleep(1000);
    return me->errors.load() == 0 ? 0 : 1;
  }
  if (mode == "rounds" && argc == 10) {
    cuwj::JobWitness* w = map_witness(argv[2]);
    const int index = std::atoi(argv[3]);
    const int threads = std::atoi(argv[4]);
    const unsigned seed = static_cast<unsigned>(std::strtoul(argv[5], nullptr, 10));
    const uint64_t cap = std::strtoull(argv[6], nullptr, 10);
    const int rounds = std::atoi(argv[7]);
    const int churn = std::atoi(argv[8]);
    const uint64_t all_threads = std::strtoull(argv[9], nullptr, 10);
    if (!w || index < 0 || index >= static_cast<int>(cuwj::kMaxApps) || all_threads == 0 || !make_context()) return 2;
    cuwj::AppSlot* me = &w->apps[index];
    std::vector<std::thread> ts;
    for (int i = 0; i < threads; ++i)
      ts.emplace_back(rounds_thread, w, me, seed * 131u + static_cast<unsigned>(i), cap, all_threads, rounds, churn);
    for (auto& t : ts) t.join();
    w->drained.fetch_add(1);
    while (!w->exit.load()) usleep(1000);
    return me->errors.load() == 0 ? 0 : 1;
  }
  if (mode == "hold" && argc == 3) {
    if (!make_context()) return 2;
    CUdeviceptr p = 0;
    const CUresult r = cuMemAlloc(&p, std::strtoull(argv[2], nullptr, 10));
    std::printf("%s\n", r == CUDA_SUCCESS ? "held" : "refused");
    std::fflush(stdout);
    if (r != CUDA_SUCCESS) return 1;
    for (;;) pause();
  }
  if (mode == "retry" && argc == 4) {
    if (!make_context()) return 2;
    const uint64_t bytes = std::strtoull(argv[2], nullptr, 10);
    const uint64_t deadline = mono_ns() + static_cast<uint64_t>(std::atof(argv[3]) * 1e9);
    bool announced = false;
    while (mono_ns() < deadline) {
      CUdeviceptr p = 0;
      if (cuMemAlloc(&p, bytes) == CUDA_SUCCESS) {
        std::printf("ok %llu\n", static_cast<unsigned long long>(mono_ns()));
        std::fflush(stdout);
        cuMemFree(p);
        return 0;
      }
      if (!announced) {
        std::printf("refused\n");  // the first attempt failed: the job is full
        std::fflush(stdout);
        announced = true;
      }
      usleep(1000);
    }
    std::printf("timeout\n");
    return 1;
  }
  if (mode == "join" && argc == 4) {
    const uint64_t t0 = mono_ns();
    cuwj::JobWitness* w = map_witness(argv[2]);
    const int index = std::atoi(argv[3]);
    if (!w || index < 0 || index >= static_cast<int>(cuwj::kMaxApps) || !make_context()) return 2;
    CUdeviceptr p = 0;
    if (cuMemAlloc(&p, 1 << 20) != CUDA_SUCCESS) return 1;
    w->apps[index].join_ns.store(mono_ns() - t0);
    w->apps[index].held.store(1 << 20);
    while (!w->stop.load()) usleep(2000);
    cuMemFree(p);
    return 0;
  }
  std::fprintf(stderr, "usage: %s hammer WITNESS INDEX THREADS SEED CAP | rounds WITNESS INDEX THREADS SEED CAP ROUNDS CHURN ALL_THREADS"
               " | hold BYTES | retry BYTES SECONDS | join WITNESS INDEX\n",
               argv[0]);
  return 64;
}

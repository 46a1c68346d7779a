// Interposer test: the runtime hooks (interposer/src/hooks/runtime.cpp) with shared runtimes
// loaded as Python loads an extension module, RTLD_LOCAL, so that no runtime is in the global
// scope: the toolkit's real libcudart.so.13, and a stand-in for CUDA 12's libcudart.so.12
// (cudart12_standin.c: CUDA 12's runtime is not installed here), both in one process, over the
// simulated driver, under libcuwarden_testing.so (the product's objects and a few queries).
//   test_cudart pool|off USER13 USER12
// pool: CUWARDEN_POOL=cache or vmm and CUWARDEN_LIMIT=64MiB, the pool answers; off: passthrough,
// every call reaches its runtime. Prints "ok" and exits 0, or names the first failed check.
#include <cuda.h>
#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "fakecuda.h"
#include "testing_api.h"

namespace {

#define CHECK(cond)                                                           \
  do {                                                                        \
    if (!(cond)) {                                                            \
      std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      std::exit(1);                                                           \
    }                                                                         \
  } while (0)

constexpr int kSuccess = 0, kMemoryAllocation = 2, kInitializationError = 3, kInvalidValue = 1;
constexpr size_t kMiB = size_t{1} << 20;

/// One user library: its calls into the runtime it is linked against.
struct User {
  int (*malloc)(void**, size_t) = nullptr;
  int (*free)(void*) = nullptr;
  int (*free_async)(void*, void*) = nullptr;
  int (*last_error)() = nullptr;
  int (*malloc_async)(void**, size_t) = nullptr;  // the real runtime's only
  int (*set_device)(int) = nullptr;                // the real runtime's only
  void* handle = nullptr;
};

template <class F>
void sym(void* h, const char* name, F& out) {
  out = reinterpret_cast<F>(dlsym(h, name));
}

User load(const char* path) {
  User u;
  u.handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!u.handle) std::fprintf(stderr, "dlopen %s: %s\n", path, dlerror());
  CHECK(u.handle != nullptr);
  sym(u.handle, "user_malloc", u.malloc);
  sym(u.handle, "user_free", u.free);
  sym(u.handle, "user_free_async", u.free_async);
  sym(u.handle, "user_last_error", u.last_error);
  sym(u.handle, "user_malloc_async", u.malloc_async);
  sym(u.handle, "user_set_device", u.set_device);
  CHECK(u.malloc && u.free && u.free_async && u.last_error);
  return u;
}

cuwt_runtime_answers_fn answers = nullptr;
cuwt_refusals_fn refusals = nullptr;
cuwt_blocks_fn blocks = nullptr;

/// The device of the pooled block at `p`, or -1.
int block_device(const void* p) {
  cuwt_block b[256];
  const size_t n = blocks(b, 256);
  for (size_t i = 0; i < n && i < 256; ++i)
    if (b[i].address == reinterpret_cast<uint64_t>(p) && b[i].state == 0) return b[i].ordinal;
  return -1;
}
uint64_t (*standin_calls)(const char*) = nullptr;

/// A refusal of `u`'s runtime: cudaErrorMemoryAllocation, counted once by cuwarden, then
/// cudaGetLastError says so once.
void check_refusal(const User& u) {
  const int64_t before = refusals(0);
  void* p = nullptr;
  CHECK(u.malloc(&p, 128 * kMiB) == kMemoryAllocation);  // over CUWARDEN_LIMIT=64MiB
  CHECK(refusals(0) == before + 1);
  CHECK(u.last_error() == kMemoryAllocation);
  CHECK(u.last_error() == kSuccess);
}

void run_pool(const User& u13, const User& u12) {
  // A first allocation, and its block back to the pool.
  void* a = nullptr;
  CHECK(u13.malloc(&a, kMiB) == kSuccess && a);
  CHECK(u13.free(a) == kSuccess);
  // A pool hit, answered without the runtime: no driver allocation, counted as answered here.
  fakecuda_reset_counters();
  uint64_t n = answers();
  void* b = nullptr;
  CHECK(u13.malloc(&b, kMiB) == kSuccess && b);
  CHECK(fakecuda_call_count("cuMemAlloc") == 0);
  CHECK(answers() == n + 1);
  // Freed into the pool: no driver free.
  CHECK(u13.free(b) == kSuccess);
  CHECK(fakecuda_call_count("cuMemFree") == 0);
  CHECK(answers() == n + 2);
  // A second free of a pooled block: the runtime's error, and its last error.
  CHECK(u13.free(b) == kInvalidValue);
  CHECK(u13.last_error() == kInvalidValue);
  CHECK(u13.last_error() == kSuccess);
  check_refusal(u13);

  // Pointers the pool does not own (the driver's stream-ordered pool, through the runtime's
  // cudaMallocAsync) go to the runtime's cudaFree and cudaFreeAsync, which free them.
  CHECK(u13.malloc_async);
  void* m = nullptr;
  CHECK(u13.malloc_async(&m, 4096) == kSuccess && m);
  fakecuda_reset_counters();
  n = answers();
  CHECK(u13.free(m) == kSuccess);
  CHECK(fakecuda_call_count("cuMemFree") == 1);
  CHECK(answers() == n);
  CHECK(u13.malloc_async(&m, 4096) == kSuccess && m);
  fakecuda_reset_counters();
  CHECK(u13.free_async(m, nullptr) == kSuccess);
  CHECK(fakecuda_call_count("cuMemFreeAsync") == 1);
  CHECK(answers() == n);
  // A pooled block freed stream-ordered: the pool's, no driver call.
  CHECK(u13.malloc(&b, kMiB) == kSuccess);
  fakecuda_reset_counters();
  CHECK(u13.free_async(b, nullptr) == kSuccess);
  CHECK(fakecuda_call_count("cuMemFreeAsync") == 0 && fakecuda_call_count("cuMemFree") == 0);
  CHECK(answers() == n + 2);

  // The CUDA 12 runtime (the stand-in): once it served this thread (cudaFree(NULL), now that
  // the pool has started), the pool answers without it; its own refusal and last error; CUDA
  // 13's calls never reach it.
  CHECK(u12.free(nullptr) == kSuccess && standin_calls("cudaFree") == 2);
  const uint64_t calls = standin_calls("cudaMalloc");
  n = answers();
  CHECK(u12.malloc(&a, kMiB) == kSuccess && a);
  CHECK(u12.free(a) == kSuccess);
  CHECK(standin_calls("cudaMalloc") == calls && standin_calls("cudaFree") == 2);
  CHECK(answers() == n + 2);
  check_refusal(u12);
  CHECK(standin_calls("cudaMalloc") == calls + 1);  // the runtime recorded the refusal
  CHECK(u13.malloc(&a, kMiB) == kSuccess && u13.free(a) == kSuccess);
  CHECK(standin_calls("cudaMalloc") == calls + 1 && standin_calls("cudaFree") == 2);

  // While a stream capture is active, the runtime makes the call (and the driver hooks see it).
  CUstream s = nullptr;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  CHECK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED) == CUDA_SUCCESS);
  n = answers();
  void* c = nullptr;
  const int during = u13.malloc(&c, kMiB);
  CHECK(answers() == n);
  CUgraph graph = nullptr;
  CHECK(cuStreamEndCapture(s, &graph) == CUDA_SUCCESS);
  if (graph) cuGraphDestroy(graph);
  CHECK(cuStreamDestroy(s) == CUDA_SUCCESS);
  // What a capture allocated is the driver's own allocation, not a pooled block (the pools
  // answer nothing during a capture): its free goes to the runtime too.
  if (during == kSuccess) CHECK(u13.free(c) == kSuccess && answers() == n);
  u13.last_error();

  // The device is the runtime's: after cudaSetDevice(1) (its primary context made current) the
  // runtime serves the first allocation there, and device 1's pool answers the next.
  CHECK(u13.set_device);
  CHECK(u13.set_device(1) == kSuccess);
  n = answers();
  CHECK(u13.malloc(&a, kMiB) == kSuccess && answers() == n && block_device(a) == 1);
  CHECK(u13.malloc(&b, kMiB) == kSuccess && answers() == n + 1 && block_device(b) == 1);
  CHECK(u13.free(a) == kSuccess && u13.free(b) == kSuccess);
  CHECK(u13.set_device(0) == kSuccess);
  CHECK(u13.malloc(&a, kMiB) == kSuccess && block_device(a) == 0);
  CHECK(u13.free(a) == kSuccess);

  // A context destroyed (the driver call of cudaDeviceReset): the next allocation goes through
  // the runtime again, which initializes itself anew, and the one after is answered here.
  CHECK(cuDevicePrimaryCtxReset(0) == CUDA_SUCCESS);
  n = answers();
  CHECK(u13.malloc(&a, kMiB) == kSuccess && answers() == n);
  CHECK(u13.free(a) == kSuccess && answers() == n + 1);
  CHECK(u13.malloc(&a, kMiB) == kSuccess && answers() == n + 2);
  CHECK(u13.free(a) == kSuccess);

  // A new thread: each runtime's first allocation there goes through the runtime (its lazy
  // initialization for the thread), the next is answered without it.
  std::thread([&] {
    uint64_t k = answers();
    void* p = nullptr;
    CHECK(u12.malloc(&p, kMiB) == kSuccess);
    CHECK(standin_calls("cudaMalloc") == calls + 2 && answers() == k);
    CHECK(u12.free(p) == kSuccess && answers() == k + 1);
    CHECK(u12.malloc(&p, kMiB) == kSuccess);
    CHECK(standin_calls("cudaMalloc") == calls + 2 && answers() == k + 2);
    CHECK(u12.free(p) == kSuccess);
    k = answers();
    CHECK(u13.malloc(&p, kMiB) == kSuccess && answers() == k);
    CHECK(u13.free(p) == kSuccess);
    CHECK(u13.malloc(&p, kMiB) == kSuccess && answers() == k + 2);
    CHECK(u13.free(p) == kSuccess);
  }).join();
}

void run_off(const User& u13, const User& u12) {
  // Passthrough: every call reaches its runtime, none is answered here; caps still hold.
  const uint64_t calls = standin_calls("cudaMalloc");
  void* a = nullptr;
  CHECK(u12.malloc(&a, kMiB) == kSuccess && u12.free(a) == kSuccess);
  CHECK(u12.malloc(&a, kMiB) == kSuccess && u12.free(a) == kSuccess);
  CHECK(standin_calls("cudaMalloc") == calls + 2 && standin_calls("cudaFree") == 3);
  fakecuda_reset_counters();
  CHECK(u13.malloc(&a, kMiB) == kSuccess);
  CHECK(fakecuda_call_count("cuMemAlloc") == 1);
  CHECK(u13.free(a) == kSuccess);
  CHECK(fakecuda_call_count("cuMemFree") == 1);
  check_refusal(u13);
  check_refusal(u12);
  CHECK(answers() == 0);
}

}  // namespace

int main(int argc, char** argv) {
  CHECK(argc == 4);
  const bool pool = std::strcmp(argv[1], "pool") == 0;
  answers = reinterpret_cast<cuwt_runtime_answers_fn>(dlsym(RTLD_DEFAULT, "cuwarden_testing_runtime_answers"));
  refusals = reinterpret_cast<cuwt_refusals_fn>(dlsym(RTLD_DEFAULT, "cuwarden_testing_refusals"));
  blocks = reinterpret_cast<cuwt_blocks_fn>(dlsym(RTLD_DEFAULT, "cuwarden_testing_blocks"));
  CHECK(answers && refusals && blocks);  // libcuwarden_testing.so is preloaded

  // No runtime loaded: the hooks are found only by asking for their version, and then fail
  // safely, without a crash.
  using malloc_fn = int (*)(void**, size_t);
  auto early = reinterpret_cast<malloc_fn>(dlvsym(RTLD_DEFAULT, "cudaMalloc", "libcudart.so.13"));
  CHECK(early != nullptr);
  void* p = nullptr;
  CHECK(early(&p, kMiB) == kInitializationError);

  const User u13 = load(argv[2]);
  const User u12 = load(argv[3]);
  sym(u12.handle, "cuwt_standin12_calls", standin_calls);
  CHECK(standin_calls);
  // Loaded locally: neither runtime is in the global scope, and an unversioned lookup does not
  // find the hooks (defined hidden under the runtimes' nodes).
  CHECK(dlsym(RTLD_DEFAULT, "cudaMalloc") == nullptr);

  // cudaFree(NULL) goes to each runtime, which initializes itself: its context current.
  CUcontext ctx = nullptr;
  CHECK(cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || ctx == nullptr);  // before cuInit: an error
  CHECK(u13.free(nullptr) == kSuccess);
  CHECK(cuCtxGetCurrent(&ctx) == CUDA_SUCCESS && ctx != nullptr);
  CHECK(standin_calls("cudaFree") == 0);
  CHECK(u12.free(nullptr) == kSuccess);
  CHECK(standin_calls("cudaFree") == 1);

  if (pool)
    run_pool(u13, u12);
  else
    run_off(u13, u12);
  std::printf("ok\n");
  return 0;
}

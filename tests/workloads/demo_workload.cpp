// cuwarden test workload: the demo's "training-like" program.
//
// Allocates model state once (weights, gradients, optimizer state), then runs steps that
// each allocate activations of increasing size plus a transient workspace, free the
// previous step's activations, and hold the working set. At the end it asks for more
// memory than is left (by default: the whole total that cudaMemGetInfo reports, which under
// cuwarden is the cap) and reports the refusal in one clear line:
//   refused: cudaMalloc(2.0 GiB) -> cudaErrorMemoryAllocation (out of memory) — cap reached
// Host-only code: no kernels, so it runs on the simulated driver as on a GPU.
//
// Usage: cuw_demo_workload [--steps N] [--base SIZE] [--model SIZE] [--final SIZE]
//                          [--sleep-ms N] [--hold-ms N | --hold] [--expect-refusal] [--device N]
// --hold keeps the final state until the program is stopped (a signal), for a watcher.
// Exit status: 0 (a refusal is an expected outcome); 1 bad usage; 2 an unexpected CUDA
// error; 3 with --expect-refusal when nothing was refused.
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "workload_util.hpp"

namespace {

using cuw::workload::human;
using cuw::workload::parse_size;
using cuw::workload::parse_uint;

struct Options {
  uint64_t steps = 8;
  uint64_t base = 64ULL << 20;    // activations of step s: base * s
  uint64_t model = 128ULL << 20;  // weights; gradients the same, optimizer state twice that
  uint64_t final_request = 0;     // 0: the total cudaMemGetInfo reports
  uint64_t sleep_ms = 0;
  uint64_t hold_ms = 0;
  bool hold_set = false;
  bool hold_forever = false;
  bool expect_refusal = false;
  int device = 0;
};

// One device buffer we hold, with what it is for (for the printout).
struct Buffer {
  void* ptr = nullptr;
  uint64_t bytes = 0;
};

class Workload {
 public:
  explicit Workload(const Options& o) : opt_(o) {}

  int run() {
    if (!init()) return 2;
    if (!setup()) return finish();
    for (uint64_t s = 1; s <= opt_.steps; ++s) {
      if (!step(s)) return finish();
      cuw::workload::sleep_ms(opt_.sleep_ms);
    }
    release(activations_);
    std::printf("\ntraining loop done: in use %s (model state held)\n", human(in_use_).c_str());
    final_request();
    return finish();
  }

 private:
  bool init() {
    int runtime_version = 0, driver_version = 0;
    cudaRuntimeGetVersion(&runtime_version);
    cudaDriverGetVersion(&driver_version);
    if (cudaError_t e = cudaSetDevice(opt_.device); e != cudaSuccess) return unexpected("cudaSetDevice", e);
    cudaDeviceProp prop{};
    if (cudaError_t e = cudaGetDeviceProperties(&prop, opt_.device); e != cudaSuccess)
      return unexpected("cudaGetDeviceProperties", e);
    size_t free_bytes = 0, total_bytes = 0;
    if (cudaError_t e = cudaMemGetInfo(&free_bytes, &total_bytes); e != cudaSuccess)
      return unexpected("cudaMemGetInfo", e);
    std::printf("cuw_demo_workload: device %d \"%s\", CUDA runtime %d, driver %d\n", opt_.device, prop.name,
                runtime_version, driver_version);
    std::printf("cudaMemGetInfo: total %s, free %s%s\n", human(total_bytes).c_str(), human(free_bytes).c_str(),
                cuwarden_ ? "  (cuwarden is loaded: total is the cap)" : "  (cuwarden is not loaded)");
    return true;
  }

  bool setup() {
    std::printf("\nsetup: weights %s, gradients %s, optimizer state %s\n", human(opt_.model).c_str(),
                human(opt_.model).c_str(), human(2 * opt_.model).c_str());
    if (!alloc(opt_.model, "weights", &model_state_) || !alloc(opt_.model, "gradients", &model_state_) ||
        !alloc(2 * opt_.model, "optimizer state", &model_state_))
      return false;
    std::printf("setup: in use %s\n\n", human(in_use_).c_str());
    return true;
  }

  bool step(uint64_t s) {
    const uint64_t act_bytes = opt_.base * s;
    const uint64_t work_bytes = opt_.base * 2;
    std::vector<Buffer> next;
    std::vector<Buffer> workspace;
    if (!alloc(act_bytes, "activations", &next)) return false;
    if (!alloc(work_bytes, "workspace", &workspace)) {
      release(next);
      return false;
    }
    const uint64_t peak_in_step = in_use_;
    // Backward pass done: the workspace and the previous step's activations go.
    const uint64_t freed = total_bytes(workspace) + total_bytes(activations_);
    release(workspace);
    release(activations_);
    activations_ = std::move(next);
    if (peak_in_step > peak_) peak_ = peak_in_step;

    size_t free_bytes = 0, total_bytes_now = 0;
    cudaMemGetInfo(&free_bytes, &total_bytes_now);
    std::printf("step %" PRIu64 ": allocated %s, freed %s, in use %s (peak %s, cudaMemGetInfo free %s)\n", s,
                human(act_bytes + work_bytes).c_str(), human(freed).c_str(), human(in_use_).c_str(),
                human(peak_).c_str(), human(free_bytes).c_str());
    return true;
  }

  void final_request() {
    size_t free_bytes = 0, total_bytes_now = 0;
    cudaMemGetInfo(&free_bytes, &total_bytes_now);
    const uint64_t want = opt_.final_request != 0 ? opt_.final_request : total_bytes_now;
    std::printf("final: asking for %s at once (cudaMemGetInfo: %s free of %s)\n", human(want).c_str(),
                human(free_bytes).c_str(), human(total_bytes_now).c_str());
    std::vector<Buffer> big;
    if (alloc(want, "final request", &big)) {
      std::printf("granted: cudaMalloc(%s) succeeded — no cap stopped it\n", human(want).c_str());
      release(big);
    }
  }

  // Allocates `bytes` into `into`. On refusal prints the refusal line and returns false.
  bool alloc(uint64_t bytes, const char* what, std::vector<Buffer>* into) {
    // What the cap leaves, read just before the request: read after a refusal, another job
    // member may have freed or exited meanwhile, and the line would say "64 MiB requested >
    // 800 MiB free".
    size_t free_before = 0, total_before = 0;
    cudaMemGetInfo(&free_before, &total_before);
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes);
    if (e == cudaSuccess) {
      into->push_back({p, bytes});
      in_use_ += bytes;
      if (in_use_ > peak_) peak_ = in_use_;
      return true;
    }
    (void)cudaGetLastError();
    if (e != cudaErrorMemoryAllocation) {
      unexpected(what, e);
      return false;
    }
    refused_ = true;
    // Under cuwarden the refusal comes from the cap; without it, from the device itself.
    std::printf("refused: cudaMalloc(%s) -> %s (%s) — %s\n", human(bytes).c_str(), cudaGetErrorName(e),
                cudaGetErrorString(e), cuwarden_ ? "cap reached" : "device out of memory");
    // What is free is what the cap leaves: under a job cap, the other members' use is
    // already taken out of it, so it is named (total - free - this process's use).
    const uint64_t others = total_before > free_before + in_use_ ? total_before - free_before - in_use_ : 0;
    std::printf("         (%s: %s requested > %s free of %s by cudaMemGetInfo; this process holds %s", what,
                human(bytes).c_str(), human(free_before).c_str(), human(total_before).c_str(),
                human(in_use_).c_str());
    if (others >= (1u << 20)) std::printf(", others sharing it %s", human(others).c_str());
    std::printf(")\n");
    return false;
  }

  void release(std::vector<Buffer>& buffers) {
    for (const Buffer& b : buffers) {
      if (cudaError_t e = cudaFree(b.ptr); e != cudaSuccess) unexpected("cudaFree", e);
      in_use_ -= b.bytes;
    }
    buffers.clear();
  }

  static uint64_t total_bytes(const std::vector<Buffer>& buffers) {
    uint64_t sum = 0;
    for (const Buffer& b : buffers) sum += b.bytes;
    return sum;
  }

  bool unexpected(const char* what, cudaError_t e) {
    std::fprintf(stderr, "cuw_demo_workload: unexpected error in %s: %s (%s)\n", what, cudaGetErrorName(e),
                 cudaGetErrorString(e));
    failed_ = true;
    return false;
  }

  int finish() {
    if (opt_.hold_forever) {
      std::printf("holding its memory until stopped (pid %d)\n", static_cast<int>(getpid()));
      for (;;) pause();
    }
    const uint64_t hold = opt_.hold_set ? opt_.hold_ms : opt_.sleep_ms;
    cuw::workload::sleep_ms(hold);  // let a watcher see the final state
    release(activations_);
    release(model_state_);
    std::printf("done: peak %s, %s\n", human(peak_).c_str(), refused_ ? "one allocation was refused" : "nothing refused");
    if (failed_) return 2;
    if (opt_.expect_refusal && !refused_) {
      std::fprintf(stderr, "cuw_demo_workload: --expect-refusal, but every allocation succeeded\n");
      return 3;
    }
    return 0;
  }

  const Options opt_;
  const bool cuwarden_ = cuw::workload::cuwarden_loaded();
  uint64_t in_use_ = 0;
  uint64_t peak_ = 0;
  bool refused_ = false;
  bool failed_ = false;
  std::vector<Buffer> model_state_;
  std::vector<Buffer> activations_;
};

void usage(FILE* to) {
  std::fprintf(to,
               "usage: cuw_demo_workload [--steps N] [--base SIZE] [--model SIZE] [--final SIZE]\n"
               "                         [--sleep-ms N] [--hold-ms N | --hold] [--expect-refusal] [--device N]\n"
               "  A training-like allocation pattern: model state (--model weights, as much again for\n"
               "  gradients, twice that for optimizer state), then --steps steps with activations of\n"
               "  --base * step bytes and a workspace of 2 * --base. Finally asks for --final bytes\n"
               "  (default: the total cudaMemGetInfo reports, i.e. the cap under cuwarden).\n"
               "  Then holds its memory --hold-ms (default: --sleep-ms), or with --hold until stopped.\n"
               "  Defaults: --steps 8 --base 64M --model 128M: peak 1.6 GiB, fits a 2 GiB cap.\n");
}

bool parse_args(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      usage(stdout);
      std::exit(0);
    }
    if (a == "--expect-refusal") {
      o->expect_refusal = true;
      continue;
    }
    if (a == "--hold") {
      o->hold_forever = true;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "cuw_demo_workload: %s needs a value\n", a.c_str());
      return false;
    }
    const std::string v = argv[++i];
    if (a == "--base" || a == "--model" || a == "--final") {
      auto s = parse_size(v);
      if (!s || *s == 0) {
        std::fprintf(stderr, "cuw_demo_workload: bad size '%s' for %s\n", v.c_str(), a.c_str());
        return false;
      }
      (a == "--base" ? o->base : a == "--model" ? o->model : o->final_request) = *s;
    } else if (a == "--steps" || a == "--sleep-ms" || a == "--hold-ms" || a == "--device") {
      auto n = parse_uint(v);
      if (!n || (a == "--device" && *n > 1023)) {
        std::fprintf(stderr, "cuw_demo_workload: bad number '%s' for %s\n", v.c_str(), a.c_str());
        return false;
      }
      if (a == "--steps") o->steps = *n;
      else if (a == "--sleep-ms") o->sleep_ms = *n;
      else if (a == "--hold-ms") o->hold_ms = *n, o->hold_set = true;
      else o->device = static_cast<int>(*n);
    } else {
      std::fprintf(stderr, "cuw_demo_workload: unknown option %s\n", a.c_str());
      return false;
    }
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // line by line, so the demo shows progress live
  Options opt;
  if (!parse_args(argc, argv, &opt)) {
    usage(stderr);
    return 1;
  }
  return Workload(opt).run();
}

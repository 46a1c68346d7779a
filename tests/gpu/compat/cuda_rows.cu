// tests/gpu/compat: nvcc-built programs for the compatibility matrix (one binary, three modes).
// compat.sh compiles it on the GPU machine: nvcc -O2 -o cuw_cuda_rows cuda_rows.cu (static cudart).
//
//   --mode managed    cudaMallocManaged until refused; a kernel writes each buffer on the GPU
//                     and the host reads a sample back. Never asks for more than --max-mib,
//                     which is clamped to 8 GiB: never ask for more managed memory than the
//                     card has free.
//   --mode mempool    RMM-style: cudaMemPoolCreate (device-located, release threshold = max),
//                     cudaMallocFromPoolAsync on a stream until refused (driver:
//                     cuMemAllocFromPoolAsync). Framework figure: the pool's reserved high mark.
//   --mode graphmem   CUDA graph memory nodes: each step captures cudaMallocAsync + memset into
//                     a graph, instantiates it (auto-free-on-launch) and launches it, keeping
//                     the memory; until a step fails. Framework figure: the device's graph
//                     memory high mark (cudaGraphMemAttrReservedMemHigh).
// Options: --chunk-mib N (256) --max-mib N (16384) --device N (0) --hold-ms N (0) --no-kernel
// Prints one JSON line in the compat.sh row format (see driver_probe.c).
#include <cuda_runtime.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

__global__ void fill(unsigned* p, size_t n, unsigned v) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    p[i] = v ^ static_cast<unsigned>(i);
}

struct Result {
  int device = 0;
  std::string mode;
  size_t held = 0;
  size_t chunks = 0;
  unsigned long long framework = 0;
  std::string figure;
  std::string outcome = "no error (reached --max-mib)";
  bool oom = false;
  bool unexpected = false;
  size_t meminfo_total = 0;
  std::string extra;  // more JSON members, starting with ','
};

bool is_oom(cudaError_t e) { return e == cudaErrorMemoryAllocation; }

void stop(Result& r, cudaError_t e, const char* where) {
  r.outcome = cudaGetErrorName(e);
  if (where && *where) r.outcome += std::string(" (") + where + ")";
  r.oom = is_oom(e);
  r.unexpected = !r.oom;
  (void)cudaGetLastError();
}

void sleep_ms(size_t ms) {
  if (ms) usleep(static_cast<useconds_t>(ms * 1000));
}

void run_managed(Result& r, size_t chunk, size_t max_chunks, bool kernel, size_t hold_ms) {
  r.figure = "bytes cudaMallocManaged returned";
  std::vector<unsigned*> bufs;
  bool checked = true;
  while (bufs.size() < max_chunks) {
    unsigned* p = nullptr;
    cudaError_t e = cudaMallocManaged(&p, chunk, cudaMemAttachGlobal);
    if (e != cudaSuccess) {
      stop(r, e, "");
      break;
    }
    bufs.push_back(p);
    if (kernel) {
      const size_t n = chunk / sizeof(unsigned);
      const unsigned tag = static_cast<unsigned>(bufs.size()) * 2654435761u;
      fill<<<264, 256>>>(p, n, tag);
      if ((e = cudaDeviceSynchronize()) != cudaSuccess) {
        stop(r, e, "kernel");
        break;
      }
      if (p[n - 1] != (tag ^ static_cast<unsigned>(n - 1))) checked = false;
    }
  }
  r.chunks = bufs.size();
  r.held = r.chunks * chunk;
  r.framework = r.held;
  sleep_ms(hold_ms);
  for (unsigned* p : bufs) cudaFree(p);
  r.extra = std::string(",\"kernel_checked\":") + (kernel ? (checked ? "true" : "false") : "null");
  if (kernel) r.extra += std::string(",\"checks\":{\"kernels wrote every buffer\":") + (checked ? "true}" : "false}");
}

void run_mempool(Result& r, size_t chunk, size_t max_chunks, size_t hold_ms) {
  r.figure = "cudaMemPoolAttrReservedMemHigh";
  cudaMemPoolProps props;
  std::memset(&props, 0, sizeof props);
  props.allocType = cudaMemAllocationTypePinned;
  props.handleTypes = cudaMemHandleTypeNone;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = r.device;
  cudaMemPool_t pool = nullptr;
  cudaError_t e = cudaMemPoolCreate(&pool, &props);
  if (e != cudaSuccess) {
    stop(r, e, "cudaMemPoolCreate");
    r.unexpected = true;
    return;
  }
  uint64_t threshold = UINT64_MAX;  // RMM keeps what it reserved
  cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold);
  cudaStream_t s = nullptr;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  std::vector<void*> bufs;
  while (bufs.size() < max_chunks) {
    void* p = nullptr;
    e = cudaMallocFromPoolAsync(&p, chunk, pool, s);
    if (e != cudaSuccess) {
      stop(r, e, "");
      break;
    }
    bufs.push_back(p);
    if ((e = cudaMemsetAsync(p, 0x5a, chunk, s)) != cudaSuccess || (e = cudaStreamSynchronize(s)) != cudaSuccess) {
      stop(r, e, "memset");
      break;
    }
  }
  r.chunks = bufs.size();
  r.held = r.chunks * chunk;
  uint64_t reserved_high = 0, used_high = 0;
  cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &reserved_high);
  cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &used_high);
  r.framework = reserved_high;
  sleep_ms(hold_ms);
  for (void* p : bufs) cudaFreeAsync(p, s);
  cudaStreamSynchronize(s);
  cudaMemPoolTrimTo(pool, 0);
  cudaStreamDestroy(s);
  cudaMemPoolDestroy(pool);
  char buf[160];
  std::snprintf(buf, sizeof buf, ",\"pool_reserved_high\":%llu,\"pool_used_high\":%llu",
                static_cast<unsigned long long>(reserved_high), static_cast<unsigned long long>(used_high));
  r.extra = buf;
}

void run_graphmem(Result& r, size_t chunk, size_t max_chunks, size_t hold_ms) {
  r.figure = "cudaGraphMemAttrReservedMemHigh";
  cudaStream_t s = nullptr;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  std::vector<void*> bufs;
  std::vector<cudaGraphExec_t> execs;
  std::vector<cudaGraph_t> graphs;
  while (bufs.size() < max_chunks) {
    cudaError_t e = cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
    if (e != cudaSuccess) {
      stop(r, e, "cudaStreamBeginCapture");
      break;
    }
    void* p = nullptr;
    cudaError_t ea = cudaMallocAsync(&p, chunk, s);
    if (ea == cudaSuccess) ea = cudaMemsetAsync(p, 0x5a, chunk, s);
    cudaGraph_t g = nullptr;
    cudaError_t ee = cudaStreamEndCapture(s, &g);
    if (ea != cudaSuccess || ee != cudaSuccess) {
      stop(r, ea != cudaSuccess ? ea : ee, ea != cudaSuccess ? "in capture" : "cudaStreamEndCapture");
      if (g) cudaGraphDestroy(g);
      break;
    }
    cudaGraphExec_t x = nullptr;
    if ((e = cudaGraphInstantiateWithFlags(&x, g, cudaGraphInstantiateFlagAutoFreeOnLaunch)) != cudaSuccess) {
      stop(r, e, "cudaGraphInstantiate");
      cudaGraphDestroy(g);
      break;
    }
    graphs.push_back(g);
    execs.push_back(x);
    if ((e = cudaGraphLaunch(x, s)) != cudaSuccess) {
      stop(r, e, "cudaGraphLaunch");
      break;
    }
    if ((e = cudaStreamSynchronize(s)) != cudaSuccess) {
      stop(r, e, "cudaStreamSynchronize");
      break;
    }
    bufs.push_back(p);  // graph-allocated, not freed by the graph: stays ours
  }
  r.chunks = bufs.size();
  r.held = r.chunks * chunk;
  unsigned long long reserved_high = 0, used_high = 0;
  cudaDeviceGetGraphMemAttribute(r.device, cudaGraphMemAttrReservedMemHigh, &reserved_high);
  cudaDeviceGetGraphMemAttribute(r.device, cudaGraphMemAttrUsedMemHigh, &used_high);
  r.framework = reserved_high;
  sleep_ms(hold_ms);
  for (void* p : bufs) cudaFreeAsync(p, s);
  cudaStreamSynchronize(s);
  for (cudaGraphExec_t x : execs) cudaGraphExecDestroy(x);
  for (cudaGraph_t g : graphs) cudaGraphDestroy(g);
  cudaDeviceGraphMemTrim(r.device);
  cudaStreamDestroy(s);
  char buf[160];
  std::snprintf(buf, sizeof buf, ",\"graph_reserved_high\":%llu,\"graph_used_high\":%llu", reserved_high, used_high);
  r.extra = buf;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode;
  size_t chunk_mib = 256, max_mib = 16384, hold_ms = 0;
  int device = 0;
  bool kernel = true;
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    if (!std::strcmp(a, "--no-kernel")) {
      kernel = false;
      continue;
    }
    if (v == nullptr) {
      std::fprintf(stderr, "cuw_cuda_rows: %s needs a value\n", a);
      return 1;
    }
    ++i;
    if (!std::strcmp(a, "--mode")) mode = v;
    else if (!std::strcmp(a, "--chunk-mib")) chunk_mib = std::strtoull(v, nullptr, 10);
    else if (!std::strcmp(a, "--max-mib")) max_mib = std::strtoull(v, nullptr, 10);
    else if (!std::strcmp(a, "--hold-ms")) hold_ms = std::strtoull(v, nullptr, 10);
    else if (!std::strcmp(a, "--device")) device = std::atoi(v);
    else {
      std::fprintf(stderr, "cuw_cuda_rows: unknown option %s\n", a);
      return 1;
    }
  }
  if ((mode != "managed" && mode != "mempool" && mode != "graphmem") || chunk_mib == 0 || chunk_mib > max_mib) {
    std::fprintf(stderr,
                 "usage: cuw_cuda_rows --mode managed|mempool|graphmem [--chunk-mib N] [--max-mib N] "
                 "[--device N] [--hold-ms N] [--no-kernel]\n");
    return 1;
  }
  if (mode == "managed" && max_mib > 8192) max_mib = 8192;  // never more managed memory than is free

  Result r;
  r.device = device;
  r.mode = mode;
  cudaError_t e = cudaSetDevice(device);
  size_t free_b = 0;
  if (e == cudaSuccess) e = cudaMemGetInfo(&free_b, &r.meminfo_total);
  if (e != cudaSuccess) {
    stop(r, e, "setup");
    r.unexpected = true;
  } else {
    const size_t chunk = chunk_mib << 20, max_chunks = max_mib / chunk_mib;
    std::fprintf(stderr, "cuw_cuda_rows: pid %d mode %s device %d meminfo free %zu total %zu\n",
                 static_cast<int>(getpid()), mode.c_str(), device, free_b, r.meminfo_total);
    if (mode == "managed") run_managed(r, chunk, max_chunks, kernel, hold_ms);
    else if (mode == "mempool") run_mempool(r, chunk, max_chunks, hold_ms);
    else run_graphmem(r, chunk, max_chunks, hold_ms);
    std::fprintf(stderr, "cuw_cuda_rows: %zu chunks of %zu MiB, then %s\n", r.chunks, chunk_mib, r.outcome.c_str());
  }
  std::printf(
      "{\"compat\":1,\"pid\":%d,\"device\":%d,\"api\":\"runtime-%s\",\"held_bytes\":%zu,\"chunks\":%zu,"
      "\"framework_bytes\":%llu,\"framework_figure\":\"%s\",\"outcome\":\"%s\",\"oom\":%s,\"meminfo_total\":%zu%s}\n",
      static_cast<int>(getpid()), r.device, r.mode.c_str(), r.held, r.chunks, r.framework, r.figure.c_str(),
      r.outcome.c_str(), r.oom ? "true" : "false", r.meminfo_total, r.extra.c_str());
  std::fflush(stdout);
  return r.unexpected ? 2 : 0;
}

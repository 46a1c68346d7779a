// cuwarden test workload: allocate fixed-size chunks until refused or a maximum is reached.
//
// Built twice: cuw_alloc_probe (static cudart, nvcc's default) and cuw_alloc_probe_shared
// (libcudart.so.13 beside the binary). `--api driver` skips cudart and calls the driver
// API through dlopen("libcuda.so.1") + dlsym, the way XLA and other dlopen users do.
//
// Usage: cuw_alloc_probe --chunk SIZE --max SIZE [--api runtime|driver] [--hold-ms N]
//                        [--device N]
// stdout, one record a line (key=value, then a final JSON line):
//   probe pid=<pid> api=runtime cudart=static runtime_version=13000 driver_version=13000 cuwarden=1
//   device index=0 name=NVIDIA H200
//   meminfo free=<bytes> total=<bytes>
//   alloc index=<i> bytes=<chunk> result=<error name> allocated=<bytes held after it>
//   holding ms=<N>
//   {"api":"runtime","allocated_bytes":...,"chunks":...,"first_error":"cudaErrorMemoryAllocation"|null,
//    "first_error_is_oom":true|false,"meminfo_total":...,"meminfo_free":...,...}
// first_error is the error's name in the API used: cudaErrorMemoryAllocation for the
// runtime, CUDA_ERROR_OUT_OF_MEMORY for the driver.
// Exit status: 0 when allocation stopped at --max or at an out-of-memory refusal (the
// expected outcomes); 1 bad usage; 2 any other CUDA error (JSON line still printed).
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "workload_util.hpp"

#ifndef CUW_PROBE_CUDART_KIND
#define CUW_PROBE_CUDART_KIND "unknown"
#endif

namespace {

using cuw::workload::parse_size;
using cuw::workload::parse_uint;

struct Options {
  uint64_t chunk = 0;
  uint64_t max = 0;
  bool driver_api = false;
  uint64_t hold_ms = 0;
  int device = 0;
};

// Outcome of one call, in the API's own vocabulary.
struct Status {
  bool ok = false;
  bool oom = false;
  std::string name;  // "cudaSuccess", "cudaErrorMemoryAllocation", "CUDA_ERROR_OUT_OF_MEMORY"
};

// The two ways into the driver; each reports errors by their own names.
class Api {
 public:
  virtual ~Api() = default;
  virtual const char* name() const = 0;
  /// Creates the context on `device`; prints version/device lines. False (with a message
  /// on stderr) if the API cannot be used at all.
  virtual bool init(int device) = 0;
  virtual Status mem_info(size_t* free_bytes, size_t* total_bytes) = 0;
  virtual Status alloc(uint64_t bytes, uintptr_t* out) = 0;
  virtual Status release(uintptr_t ptr) = 0;
  virtual void shutdown() {}
};

// --- runtime API --------------------------------------------------------------------------

Status runtime_status(cudaError_t err) {
  Status s;
  s.ok = err == cudaSuccess;
  s.oom = err == cudaErrorMemoryAllocation;
  s.name = cudaGetErrorName(err);
  if (!s.ok) (void)cudaGetLastError();  // an OOM is not sticky; clear it for the next call
  return s;
}

class RuntimeApi final : public Api {
 public:
  const char* name() const override { return "runtime"; }

  bool init(int device) override {
    int runtime_version = 0, driver_version = 0;
    cudaRuntimeGetVersion(&runtime_version);
    cudaDriverGetVersion(&driver_version);
    std::printf("probe pid=%d api=runtime cudart=%s runtime_version=%d driver_version=%d cuwarden=%d\n",
                static_cast<int>(getpid()), CUW_PROBE_CUDART_KIND, runtime_version, driver_version,
                cuw::workload::cuwarden_loaded() ? 1 : 0);
    if (Status s = runtime_status(cudaSetDevice(device)); !s.ok) {
      std::fprintf(stderr, "cuw_alloc_probe: cudaSetDevice(%d) failed: %s\n", device, s.name.c_str());
      return false;
    }
    cudaDeviceProp prop{};
    if (Status s = runtime_status(cudaGetDeviceProperties(&prop, device)); !s.ok) {
      std::fprintf(stderr, "cuw_alloc_probe: cudaGetDeviceProperties failed: %s\n", s.name.c_str());
      return false;
    }
    // totalGlobalMem comes from cuDeviceTotalMem_v2 at runtime start-up: under a cap, the cap.
    std::printf("device index=%d name=%s total_global_mem=%zu\n", device, prop.name, prop.totalGlobalMem);
    return true;
  }

  Status mem_info(size_t* free_bytes, size_t* total_bytes) override {
    return runtime_status(cudaMemGetInfo(free_bytes, total_bytes));
  }

  Status alloc(uint64_t bytes, uintptr_t* out) override {
    void* p = nullptr;
    Status s = runtime_status(cudaMalloc(&p, bytes));
    *out = reinterpret_cast<uintptr_t>(p);
    return s;
  }

  Status release(uintptr_t ptr) override { return runtime_status(cudaFree(reinterpret_cast<void*>(ptr))); }
};

// --- driver API through dlopen ------------------------------------------------------------

class DriverApi final : public Api {
 public:
  const char* name() const override { return "driver"; }

  bool init(int device) override {
    lib_ = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib_ == nullptr) {
      std::fprintf(stderr, "cuw_alloc_probe: dlopen(libcuda.so.1) failed: %s\n", dlerror());
      return false;
    }
    bool all = resolve(init_, "cuInit") && resolve(driver_version_, "cuDriverGetVersion") &&
               resolve(device_get_, "cuDeviceGet") && resolve(device_name_, "cuDeviceGetName") &&
               resolve(retain_, "cuDevicePrimaryCtxRetain") &&
               resolve(release_ctx_, "cuDevicePrimaryCtxRelease_v2") &&
               resolve(set_current_, "cuCtxSetCurrent") && resolve(mem_info_, "cuMemGetInfo_v2") &&
               resolve(alloc_, "cuMemAlloc_v2") && resolve(free_, "cuMemFree_v2") &&
               resolve(error_name_, "cuGetErrorName");
    if (!all) return false;

    int version = 0;
    if (Status s = status(init_(0)); !s.ok) {
      std::fprintf(stderr, "cuw_alloc_probe: cuInit failed: %s\n", s.name.c_str());
      return false;
    }
    driver_version_(&version);
    std::printf("probe pid=%d api=driver cudart=none runtime_version=0 driver_version=%d cuwarden=%d\n",
                static_cast<int>(getpid()), version,
                cuw::workload::cuwarden_loaded() ? 1 : 0);
    if (Status s = status(device_get_(&device_, device)); !s.ok) {
      std::fprintf(stderr, "cuw_alloc_probe: cuDeviceGet(%d) failed: %s\n", device, s.name.c_str());
      return false;
    }
    char name[256] = {};
    device_name_(name, sizeof name - 1, device_);
    std::printf("device index=%d name=%s\n", device, name);
    if (Status s = status(retain_(&ctx_, device_)); !s.ok) {
      std::fprintf(stderr, "cuw_alloc_probe: cuDevicePrimaryCtxRetain failed: %s\n", s.name.c_str());
      return false;
    }
    if (Status s = status(set_current_(ctx_)); !s.ok) {
      std::fprintf(stderr, "cuw_alloc_probe: cuCtxSetCurrent failed: %s\n", s.name.c_str());
      return false;
    }
    return true;
  }

  Status mem_info(size_t* free_bytes, size_t* total_bytes) override {
    return status(mem_info_(free_bytes, total_bytes));
  }

  Status alloc(uint64_t bytes, uintptr_t* out) override {
    CUdeviceptr p = 0;
    Status s = status(alloc_(&p, bytes));
    *out = static_cast<uintptr_t>(p);
    return s;
  }

  Status release(uintptr_t ptr) override { return status(free_(static_cast<CUdeviceptr>(ptr))); }

  void shutdown() override {
    if (ctx_ != nullptr) release_ctx_(device_);
    ctx_ = nullptr;
    // lib_ stays open: the driver keeps threads running until exit.
  }

 private:
  template <typename Fn>
  bool resolve(Fn& fn, const char* symbol) {
    fn = reinterpret_cast<Fn>(dlsym(lib_, symbol));
    if (fn == nullptr) std::fprintf(stderr, "cuw_alloc_probe: libcuda.so.1 lacks %s\n", symbol);
    return fn != nullptr;
  }

  Status status(CUresult r) const {
    Status s;
    s.ok = r == CUDA_SUCCESS;
    s.oom = r == CUDA_ERROR_OUT_OF_MEMORY;
    const char* n = nullptr;
    if (error_name_ == nullptr || error_name_(r, &n) != CUDA_SUCCESS || n == nullptr) {
      s.name = "CUresult(" + std::to_string(static_cast<int>(r)) + ")";
    } else {
      s.name = n;
    }
    return s;
  }

  void* lib_ = nullptr;
  CUdevice device_ = 0;
  CUcontext ctx_ = nullptr;
  CUresult (*init_)(unsigned) = nullptr;
  CUresult (*driver_version_)(int*) = nullptr;
  CUresult (*device_get_)(CUdevice*, int) = nullptr;
  CUresult (*device_name_)(char*, int, CUdevice) = nullptr;
  CUresult (*retain_)(CUcontext*, CUdevice) = nullptr;
  CUresult (*release_ctx_)(CUdevice) = nullptr;
  CUresult (*set_current_)(CUcontext) = nullptr;
  CUresult (*mem_info_)(size_t*, size_t*) = nullptr;
  CUresult (*alloc_)(CUdeviceptr*, size_t) = nullptr;
  CUresult (*free_)(CUdeviceptr) = nullptr;
  CUresult (*error_name_)(CUresult, const char**) = nullptr;
};

// --- main ---------------------------------------------------------------------------------

void usage(FILE* to) {
  std::fprintf(to,
               "usage: cuw_alloc_probe --chunk SIZE --max SIZE [--api runtime|driver] [--hold-ms N] "
               "[--device N]\n"
               "  Allocates SIZE chunks until one is refused or --max bytes are held, prints one\n"
               "  line per allocation and a final JSON line, frees everything and exits 0.\n"
               "  SIZE: bytes, or K M G T (1024) / KiB..TiB / kB MB GB TB (1000), e.g. 256M.\n");
}

bool parse_args(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      usage(stdout);
      std::exit(0);
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "cuw_alloc_probe: %s needs a value\n", a.c_str());
      return false;
    }
    const std::string v = argv[++i];
    if (a == "--chunk" || a == "--max") {
      auto s = parse_size(v);
      if (!s || *s == 0) {
        std::fprintf(stderr, "cuw_alloc_probe: bad size '%s' for %s\n", v.c_str(), a.c_str());
        return false;
      }
      (a == "--chunk" ? o->chunk : o->max) = *s;
    } else if (a == "--api") {
      if (v != "runtime" && v != "driver") {
        std::fprintf(stderr, "cuw_alloc_probe: --api takes runtime or driver, not '%s'\n", v.c_str());
        return false;
      }
      o->driver_api = v == "driver";
    } else if (a == "--hold-ms" || a == "--device") {
      auto n = parse_uint(v);
      if (!n || (a == "--device" && *n > 1023)) {
        std::fprintf(stderr, "cuw_alloc_probe: bad number '%s' for %s\n", v.c_str(), a.c_str());
        return false;
      }
      if (a == "--hold-ms") o->hold_ms = *n;
      else o->device = static_cast<int>(*n);
    } else {
      std::fprintf(stderr, "cuw_alloc_probe: unknown option %s\n", a.c_str());
      return false;
    }
  }
  if (o->chunk == 0 || o->max == 0) {
    std::fprintf(stderr, "cuw_alloc_probe: --chunk and --max are required\n");
    return false;
  }
  return true;
}

std::string json_string_or_null(const std::string& s) {
  if (s.empty()) return "null";
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) >= 0x20) out += c;
  }
  return out + "\"";
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // line by line, so a watcher sees progress
  Options opt;
  if (!parse_args(argc, argv, &opt)) {
    usage(stderr);
    return 1;
  }

  RuntimeApi runtime;
  DriverApi driver;
  Api& api = opt.driver_api ? static_cast<Api&>(driver) : static_cast<Api&>(runtime);
  if (!api.init(opt.device)) return 2;

  bool unexpected = false;
  std::string unexpected_what;
  size_t info_free = 0, info_total = 0;
  if (Status s = api.mem_info(&info_free, &info_total); !s.ok) {
    unexpected = true;
    unexpected_what = "meminfo: " + s.name;
  }
  std::printf("meminfo free=%zu total=%zu\n", info_free, info_total);

  std::vector<uintptr_t> held;
  uint64_t allocated = 0;
  std::string first_error;
  bool first_error_oom = false;
  while (!unexpected && allocated + opt.chunk <= opt.max) {
    uintptr_t p = 0;
    Status s = api.alloc(opt.chunk, &p);
    if (s.ok) {
      held.push_back(p);
      allocated += opt.chunk;
    }
    std::printf("alloc index=%zu bytes=%" PRIu64 " result=%s allocated=%" PRIu64 "\n", held.size() - (s.ok ? 1 : 0),
                opt.chunk, s.name.c_str(), allocated);
    if (!s.ok) {
      first_error = s.name;
      first_error_oom = s.oom;
      if (!s.oom) {
        unexpected = true;
        unexpected_what = "alloc: " + s.name;
      }
      break;
    }
  }

  size_t peak_free = 0, peak_total = 0;
  (void)api.mem_info(&peak_free, &peak_total);
  if (opt.hold_ms > 0) {
    std::printf("holding ms=%" PRIu64 "\n", opt.hold_ms);
    cuw::workload::sleep_ms(opt.hold_ms);
  }

  for (uintptr_t p : held) {
    if (Status s = api.release(p); !s.ok && !unexpected) {
      unexpected = true;
      unexpected_what = "free: " + s.name;
    }
  }
  size_t after_free = 0, after_total = 0;
  (void)api.mem_info(&after_free, &after_total);
  api.shutdown();

  std::printf(
      "{\"pid\":%d,\"api\":\"%s\",\"cudart\":\"%s\",\"chunk\":%" PRIu64 ",\"max\":%" PRIu64 ",\"allocated_bytes\":%" PRIu64
      ",\"chunks\":%zu,\"first_error\":%s,\"first_error_is_oom\":%s,\"meminfo_total\":%zu,\"meminfo_free\":%zu,"
      "\"meminfo_free_at_peak\":%zu,\"meminfo_free_after_free\":%zu,\"cuwarden_loaded\":%s,\"unexpected_error\":%s}\n",
      static_cast<int>(getpid()), api.name(), opt.driver_api ? "none" : CUW_PROBE_CUDART_KIND, opt.chunk, opt.max, allocated, held.size(),
      json_string_or_null(first_error).c_str(), first_error_oom ? "true" : "false", info_total, info_free, peak_free,
      after_free, cuw::workload::cuwarden_loaded() ? "true" : "false", json_string_or_null(unexpected_what).c_str());
  if (unexpected) {
    std::fprintf(stderr, "cuw_alloc_probe: unexpected CUDA error (%s)\n", unexpected_what.c_str());
    return 2;
  }
  return 0;
}

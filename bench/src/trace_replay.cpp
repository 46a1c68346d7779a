// cuwarden bench: replays a recorded allocation trace (bench/traces/*.trace.gz) against the
// CUDA driver, the way a program without its own caching allocator would run it.
//
//   cuw_trace_replay TRACE [--api malloc|async] [--pass time|held] [--use none|memset]
//                    [--use-bytes N] [--json FILE]
//
// --api malloc: cuMemAlloc_v2 / cuMemFree_v2 in trace order (what cudaMalloc / cudaFree reach).
// --api async:  cuMemAllocAsync / cuMemFreeAsync on one non-blocking stream, the device's
//               default memory pool with its defaults, one cuStreamSynchronize at the end.
// --pass time:  wall time of the replay loop (CLOCK_MONOTONIC), nothing else in the loop.
// --use memset: each allocation is used by GPU work queued right after it: cuMemsetD8Async
//               of its first --use-bytes bytes (default: all of it) on the legacy stream (on
//               --api async: the replay's stream), so that frees find work still queued, as a
//               training step's do while the CPU runs ahead of the GPU. Not with --pass held.
// --pass held:  after every allocation, what the process holds on device 0: the simulated
//               driver's fakecuda_live_bytes(0), or on a GPU NVML's used bytes; both less the
//               same figure taken after context creation. The maximum is held_peak_bytes.
//
// Prints one JSON object (and writes it to --json FILE). A refused allocation is counted in
// `refusals` and the replay goes on without it (its free is skipped). Exit status: 0 when
// replayed (refusals or not: the caller judges), 2 on bad usage or a bad trace, 1 when the
// driver or its context cannot be brought up. On the simulated driver it also has the calls
// made (driver_calls) and the bytes cuMemMap mapped and cuMemUnmap unmapped (driver_bytes);
// both are null on a GPU.
//
// Under LD_PRELOAD=libcuwarden.so with a cap, set CUWARDEN_MEMINFO=physical for --pass held on
// a GPU: otherwise the interposer answers NVML with its own view of the cap.
//
// Linked to libcuda (the driver API) only. NVML is dlopen'ed at run time, so the program
// builds without it; under LD_PRELOAD=libcuwarden.so the driver calls go through the hooks.
#include <cuda.h>
#include <dlfcn.h>
#include <sys/wait.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iostream>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

namespace {

using json = nlohmann::ordered_json;

constexpr int kExitDriver = 1;
constexpr int kExitInput = 2;

/// One trace event: an allocation of `bytes` into `slot`, or the free of `slot`.
struct Event {
  uint64_t bytes;
  uint32_t slot;  ///< dense index of the allocation (its position among the trace's 'a' lines)
  bool alloc;
};

struct Trace {
  std::vector<Event> events;
  uint32_t allocations = 0;
  uint64_t peak_live = 0;  ///< max over time of the sum of live requested bytes
};

[[noreturn]] void fail_input(const std::string& msg) {
  std::fprintf(stderr, "cuw_trace_replay: %s\n", msg.c_str());
  std::exit(kExitInput);
}

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "cuw_trace_replay: %s\n"
               "usage: cuw_trace_replay TRACE [--api malloc|async] [--pass time|held] [--use none|memset]\n"
               "                        [--use-bytes N] [--json FILE]\n",
               why);
  std::exit(kExitInput);
}

/// True when the file starts with gzip's magic bytes.
bool is_gzip(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail_input("cannot open " + path + ": " + std::strerror(errno));
  unsigned char magic[2] = {0, 0};
  f.read(reinterpret_cast<char*>(magic), 2);
  return f.gcount() == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
}

/// The path in single quotes for sh: ' becomes '\''.
std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

bool parse_u64(std::string_view tok, uint64_t& out) {
  if (tok.empty()) return false;
  auto [p, ec] = std::from_chars(tok.data(), tok.data() + tok.size(), out);
  return ec == std::errc() && p == tok.data() + tok.size();
}

/// Splits on runs of spaces and tabs.
std::vector<std::string_view> split(std::string_view line) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
    size_t j = i;
    while (j < line.size() && line[j] != ' ' && line[j] != '\t') ++j;
    if (j > i) out.push_back(line.substr(i, j - i));
    i = j;
  }
  return out;
}

/// Reads and validates the whole trace (gzip or plain text). Exits 2 on any error, naming
/// the line.
Trace read_trace(const std::string& path) {
  const bool gz = is_gzip(path);
  FILE* in = gz ? popen(("gzip -dc -- " + shell_quote(path)).c_str(), "r") : std::fopen(path.c_str(), "r");
  if (!in) fail_input("cannot read " + path + ": " + std::strerror(errno));

  Trace t;
  std::unordered_map<uint64_t, uint32_t> slot_of;  // every id ever allocated
  std::vector<uint64_t> size_of;                   // by slot
  std::vector<uint8_t> live;                       // by slot
  uint64_t live_bytes = 0;
  char* buf = nullptr;
  size_t cap = 0;
  ssize_t n;
  uint64_t lineno = 0;
  auto bad = [&](const std::string& why) {
    std::free(buf);
    if (gz) pclose(in); else std::fclose(in);
    fail_input(path + ":" + std::to_string(lineno) + ": " + why);
  };
  while ((n = getline(&buf, &cap, in)) != -1) {
    ++lineno;
    std::string_view line(buf, static_cast<size_t>(n));
    while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.remove_suffix(1);
    if (line.empty() || line[0] == '#') continue;  // comments: source, counts, peak
    auto tok = split(line);
    if (tok.empty()) continue;  // blank
    uint64_t id = 0, bytes = 0;
    if (tok[0] == "a") {
      if (tok.size() != 3 || !parse_u64(tok[1], id) || !parse_u64(tok[2], bytes))
        bad("malformed line '" + std::string(line) + "' (expected 'a ID BYTES')");
      if (slot_of.count(id)) bad("id " + std::to_string(id) + " allocated a second time");
      const auto slot = static_cast<uint32_t>(size_of.size());
      slot_of.emplace(id, slot);
      size_of.push_back(bytes);
      live.push_back(1);
      live_bytes += bytes;
      t.peak_live = std::max(t.peak_live, live_bytes);
      t.events.push_back({bytes, slot, true});
    } else if (tok[0] == "f") {
      if (tok.size() != 2 || !parse_u64(tok[1], id)) bad("malformed line '" + std::string(line) + "' (expected 'f ID')");
      auto it = slot_of.find(id);
      if (it == slot_of.end()) bad("free of id " + std::to_string(id) + ", never allocated");
      if (!live[it->second]) bad("free of id " + std::to_string(id) + ", already freed");
      live[it->second] = 0;
      live_bytes -= size_of[it->second];
      t.events.push_back({0, it->second, false});
    } else {
      bad("malformed line '" + std::string(line) + "' (expected 'a ID BYTES', 'f ID' or '# ...')");
    }
  }
  const bool read_error = std::ferror(in) != 0;
  std::free(buf);
  if (gz) {
    const int st = pclose(in);
    if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) fail_input("gzip -dc failed on " + path);
  } else {
    std::fclose(in);
  }
  if (read_error) fail_input("read error on " + path);
  t.allocations = static_cast<uint32_t>(size_of.size());
  return t;
}

std::string err_name(CUresult r) {
  const char* s = nullptr;
  if (cuGetErrorName(r, &s) == CUDA_SUCCESS && s) return s;
  return std::to_string(static_cast<int>(r));
}

double now_s() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

/// What the process holds on device 0, in bytes: the simulated driver's own figure, or NVML's
/// used bytes of the device (the same device by PCI bus id). `name` says which.
class HeldProbe {
 public:
  bool open(CUdevice dev) {
    if (void* cuda = dlopen("libcuda.so.1", RTLD_NOLOAD | RTLD_LAZY)) {
      fake_ = reinterpret_cast<size_t (*)(int)>(dlsym(cuda, "fakecuda_live_bytes"));
      if (fake_) {
        name_ = "fakecuda";
        return true;
      }
    }
    return open_nvml(dev);
  }
  const char* name() const { return name_; }
  /// Bytes held now; false when the probe failed.
  bool sample(uint64_t& out) const {
    if (fake_) {
      out = fake_(0);
      return true;
    }
    NvmlMemory m{};
    if (get_memory_(nvml_dev_, &m) != 0) return false;
    out = m.used;
    return true;
  }

 private:
  struct NvmlMemory {
    unsigned long long total, free, used;
  };
  bool open_nvml(CUdevice dev) {
    void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      std::fprintf(stderr, "cuw_trace_replay: --pass held needs the simulated driver or NVML: %s\n", dlerror());
      return false;
    }
    auto init = reinterpret_cast<int (*)()>(dlsym(lib, "nvmlInit_v2"));
    auto by_bus = reinterpret_cast<int (*)(const char*, void**)>(dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2"));
    get_memory_ = reinterpret_cast<int (*)(void*, NvmlMemory*)>(dlsym(lib, "nvmlDeviceGetMemoryInfo"));
    char bus[64] = {0};
    if (!init || !by_bus || !get_memory_ || init() != 0 ||
        cuDeviceGetPCIBusId(bus, sizeof bus, dev) != CUDA_SUCCESS || by_bus(bus, &nvml_dev_) != 0) {
      std::fprintf(stderr, "cuw_trace_replay: NVML could not be initialised for device 0 (%s)\n", bus);
      return false;
    }
    name_ = "nvml";
    return true;
  }
  size_t (*fake_)(int) = nullptr;
  int (*get_memory_)(void*, NvmlMemory*) = nullptr;
  void* nvml_dev_ = nullptr;
  const char* name_ = "none";
};

/// The simulated driver's call counters (absent on a real driver).
struct CallCounters {
  void (*reset)() = nullptr;
  uint64_t (*count)(const char*) = nullptr;
  void open() {
    void* cuda = dlopen("libcuda.so.1", RTLD_NOLOAD | RTLD_LAZY);
    if (!cuda) return;
    reset = reinterpret_cast<void (*)()>(dlsym(cuda, "fakecuda_reset_counters"));
    count = reinterpret_cast<uint64_t (*)(const char*)>(dlsym(cuda, "fakecuda_call_count"));
    if (!reset || !count) reset = nullptr, count = nullptr;
  }
};

// Base names: each counts its ABI and per-thread-stream variants too.
constexpr const char* kCountedCalls[] = {
    "cuMemAlloc",      "cuMemFree",      "cuMemAllocAsync",     "cuMemFreeAsync",    "cuMemCreate",
    "cuMemMap",        "cuMemUnmap",     "cuMemSetAccess",      "cuMemRelease",      "cuMemAddressReserve",
    "cuMemAddressFree", "cuEventRecord", "cuEventQuery",        "cuEventSynchronize",
    "cuStreamSynchronize", "cuCtxSynchronize"};

}  // namespace

int main(int argc, char** argv) {
  std::string trace_path, api = "malloc", pass = "time", use = "none", json_path;
  uint64_t use_bytes = UINT64_MAX;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage((a + " needs a value").c_str());
      return argv[++i];
    };
    if (a == "--api") {
      api = value();
      if (api != "malloc" && api != "async") usage("--api is malloc or async");
    } else if (a == "--pass") {
      pass = value();
      if (pass != "time" && pass != "held") usage("--pass is time or held");
    } else if (a == "--use") {
      use = value();
      if (use != "none" && use != "memset") usage("--use is none or memset");
    } else if (a == "--use-bytes") {
      const std::string v = value();
      const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), use_bytes);
      if (ec != std::errc() || end != v.data() + v.size() || use_bytes == 0) usage("--use-bytes is a positive number");
    } else if (a == "--json") {
      json_path = value();
    } else if (a == "-h" || a == "--help") {
      usage("replays an allocation trace");
    } else if (!a.empty() && a[0] == '-') {
      usage(("unknown option " + a).c_str());
    } else if (trace_path.empty()) {
      trace_path = a;
    } else {
      usage("one TRACE only");
    }
  }
  if (trace_path.empty()) usage("no TRACE given");
  const bool held = pass == "held";
  const bool async = api == "async";
  const bool used = use == "memset";
  if (used && held) usage("--use memset is for --pass time");

  // Everything read and validated before the driver is touched.
  const Trace trace = read_trace(trace_path);

  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  CUresult r = cuInit(0);
  if (r == CUDA_SUCCESS) r = cuDeviceGet(&dev, 0);
  if (r == CUDA_SUCCESS) r = cuDevicePrimaryCtxRetain(&ctx, dev);
  if (r == CUDA_SUCCESS) r = cuCtxSetCurrent(ctx);
  if (r != CUDA_SUCCESS) {
    std::fprintf(stderr, "cuw_trace_replay: driver or context initialisation failed: %s\n", err_name(r).c_str());
    return kExitDriver;
  }
  char device_name[256] = {0};
  cuDeviceGetName(device_name, sizeof device_name, dev);
  CUstream stream = nullptr;
  if (async && (r = cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING)) != CUDA_SUCCESS) {
    std::fprintf(stderr, "cuw_trace_replay: cuStreamCreate failed: %s\n", err_name(r).c_str());
    return kExitDriver;
  }

  HeldProbe probe;
  uint64_t baseline = 0, held_peak = 0;
  bool probe_ok = true;
  if (held) {
    if (!probe.open(dev) || !probe.sample(baseline)) {
      std::fprintf(stderr, "cuw_trace_replay: no way to measure what the process holds\n");
      return kExitDriver;
    }
    const char* meminfo = std::getenv("CUWARDEN_MEMINFO");
    if (std::strcmp(probe.name(), "nvml") == 0 && std::getenv("LD_PRELOAD") && std::getenv("CUWARDEN_LIMIT") &&
        !(meminfo && std::strcmp(meminfo, "physical") == 0)) {
      std::fprintf(stderr, "cuw_trace_replay: warning: under a cuwarden cap NVML reports the cap's view; "
                           "set CUWARDEN_MEMINFO=physical for the device's figures\n");
    }
  }
  CallCounters counters;
  counters.open();

  std::vector<CUdeviceptr> ptr(trace.allocations, 0);
  uint64_t refusals = 0, free_errors = 0;
  json first_refusal = nullptr;
  auto refused = [&](size_t i, const Event& e, CUresult res) {
    if (refusals++ == 0) first_refusal = {{"event", i}, {"bytes", e.bytes}, {"error", err_name(res)}};
  };
  const size_t n_events = trace.events.size();
  const Event* ev = trace.events.data();

  if (counters.reset) counters.reset();
  const double t0 = now_s();
  uint64_t use_errors = 0;
  if (!held && !async) {
    // The timed loop: the driver calls and one branch each.
    for (size_t i = 0; i < n_events; ++i) {
      const Event& e = ev[i];
      if (e.alloc) {
        if (CUresult res = cuMemAlloc(&ptr[e.slot], e.bytes); res != CUDA_SUCCESS) {
          ptr[e.slot] = 0;
          refused(i, e, res);
        } else if (used && cuMemsetD8Async(ptr[e.slot], 0, std::min(e.bytes, use_bytes), nullptr) != CUDA_SUCCESS) {
          ++use_errors;
        }
      } else if (ptr[e.slot]) {
        if (cuMemFree(ptr[e.slot]) != CUDA_SUCCESS) ++free_errors;
        ptr[e.slot] = 0;
      }
    }
  } else if (!held) {
    for (size_t i = 0; i < n_events; ++i) {
      const Event& e = ev[i];
      if (e.alloc) {
        if (CUresult res = cuMemAllocAsync(&ptr[e.slot], e.bytes, stream); res != CUDA_SUCCESS) {
          ptr[e.slot] = 0;
          refused(i, e, res);
        } else if (used && cuMemsetD8Async(ptr[e.slot], 0, std::min(e.bytes, use_bytes), stream) != CUDA_SUCCESS) {
          ++use_errors;
        }
      } else if (ptr[e.slot]) {
        if (cuMemFreeAsync(ptr[e.slot], stream) != CUDA_SUCCESS) ++free_errors;
        ptr[e.slot] = 0;
      }
    }
    if (cuStreamSynchronize(stream) != CUDA_SUCCESS) ++free_errors;
  } else {
    // The held pass: the same calls, a sample after every allocation.
    for (size_t i = 0; i < n_events; ++i) {
      const Event& e = ev[i];
      if (e.alloc) {
        CUresult res = async ? cuMemAllocAsync(&ptr[e.slot], e.bytes, stream) : cuMemAlloc(&ptr[e.slot], e.bytes);
        if (res != CUDA_SUCCESS) {
          ptr[e.slot] = 0;
          refused(i, e, res);
        }
        uint64_t now = 0;
        if (probe.sample(now)) {
          const uint64_t held_now = now > baseline ? now - baseline : 0;
          held_peak = std::max(held_peak, held_now);
          // What the process held when the first refusal came: a pool that gave back first,
          // or fragmentation, shows near the live bytes; a pool that did not, near the device.
          if (res != CUDA_SUCCESS && refusals == 1) first_refusal["held_bytes"] = held_now;
        } else {
          probe_ok = false;
        }
      } else if (ptr[e.slot]) {
        CUresult res = async ? cuMemFreeAsync(ptr[e.slot], stream) : cuMemFree(ptr[e.slot]);
        if (res != CUDA_SUCCESS) ++free_errors;
        ptr[e.slot] = 0;
      }
    }
    if (async && cuStreamSynchronize(stream) != CUDA_SUCCESS) ++free_errors;
  }
  // The replay ends when its work has: a pool that waited less left more of it queued.
  if (used && !async && cuCtxSynchronize() != CUDA_SUCCESS) ++use_errors;
  const double seconds = now_s() - t0;

  // Counted over the replay only, before the blocks still live are freed.
  json calls = nullptr;
  if (counters.count) {
    calls = json::object();
    for (const char* name : kCountedCalls) calls[name] = counters.count(name);
  }
  json bytes = nullptr;  // what the VMM calls moved: their cost on the GPU is per byte
  if (counters.count) bytes = {{"cuMemMap", counters.count("cuMemMap bytes")}, {"cuMemUnmap", counters.count("cuMemUnmap bytes")}};

  uint64_t live_at_end = 0;
  for (CUdeviceptr& p : ptr) {
    if (!p) continue;
    ++live_at_end;
    CUresult res = async ? cuMemFreeAsync(p, stream) : cuMemFree(p);
    if (res != CUDA_SUCCESS) ++free_errors;
    p = 0;
  }
  if (async) {
    cuStreamSynchronize(stream);
    cuStreamDestroy(stream);
  }

  const char* pool = std::getenv("CUWARDEN_POOL");
  json out;
  out["trace"] = trace_path;
  out["events"] = n_events;
  out["allocations"] = trace.allocations;
  out["peak_live_bytes"] = trace.peak_live;
  out["api"] = api;
  out["pass"] = pass;
  out["use"] = used ? json(use) : json(nullptr);
  out["use_bytes"] = used ? json(use_bytes == UINT64_MAX ? json("all") : json(use_bytes)) : json(nullptr);
  out["use_errors"] = used ? json(use_errors) : json(nullptr);
  out["seconds"] = held ? json(nullptr) : json(seconds);
  out["held_peak_bytes"] = held ? json(held_peak) : json(nullptr);
  out["held_over_live"] =
      held && trace.peak_live ? json(static_cast<double>(held_peak) / static_cast<double>(trace.peak_live)) : json(nullptr);
  out["held_baseline_bytes"] = held ? json(baseline) : json(nullptr);
  out["held_source"] = held ? json(probe.name()) : json(nullptr);
  if (held && !probe_ok) out["held_probe_failed"] = true;
  out["refusals"] = refusals;
  out["first_refusal"] = first_refusal;
  out["free_errors"] = free_errors;
  out["live_at_end"] = live_at_end;
  out["driver_calls"] = calls;
  out["driver_bytes"] = bytes;
  out["pool"] = pool ? pool : "none";
  out["device"] = device_name;

  const std::string text = out.dump();
  std::printf("%s\n", text.c_str());
  std::fflush(stdout);
  if (!json_path.empty()) {
    std::ofstream f(json_path);
    f << text << '\n';
    if (!f) {
      std::fprintf(stderr, "cuw_trace_replay: cannot write %s\n", json_path.c_str());
      return kExitInput;
    }
  }
  if (refusals) {
    std::fprintf(stderr, "cuw_trace_replay: %llu allocation(s) refused, the first: %s\n",
                 static_cast<unsigned long long>(refusals), first_refusal.dump().c_str());
  }
  return 0;
}

// fakenvml: the simulated NVML (libnvidia-ml.so.1), backed by the simulated driver's state.
//
// nvmlInit dlopens libcuda.so.1 and resolves the fakecuda_physical_* test exports; every
// figure comes from there at the time of the call, so NVML and the driver never disagree.
// Devices are the physical ones, in physical order (CUDA_VISIBLE_DEVICES does not apply to
// NVML, as on a real machine). Handles are pointers into a static table and are checked on
// every call: a bad one is NVML_ERROR_INVALID_ARGUMENT, as NVML answers.
#include <dlfcn.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "../../fakecuda/fakecuda.h"
#include "../fakenvml.h"

#define FN_API extern "C" __attribute__((visibility("default")))

namespace {

// ------------------------------------------------------------------ call counting
std::mutex g_count_mu;
auto& g_counts = *new std::map<std::string, unsigned long long>;  // never destroyed

void count(const char* name) {
  std::lock_guard lock(g_count_mu);
  ++g_counts[name];
}
#define FN_ENTER() count(__func__)

// ------------------------------------------------------------------ driver link
using CountFn = int (*)();
using InfoFn = int (*)(int, fakecuda_physical_device*);
using UsedFn = size_t (*)(int);
using ProcessesFn = int (*)(int, fakecuda_process_usage*, int);

struct nvmlDevice_st_impl {
  int index;
};
constexpr int kMaxDevices = 64;
nvmlDevice_st_impl g_devices[kMaxDevices];

std::mutex g_mu;
int g_refs = 0;               // nvmlInit minus nvmlShutdown
CountFn g_count = nullptr;    // fakecuda_physical_count
InfoFn g_info = nullptr;      // fakecuda_physical_info
UsedFn g_used = nullptr;      // fakecuda_physical_used_bytes
ProcessesFn g_processes = nullptr;  // fakecuda_physical_processes

bool initialized() {
  std::lock_guard lock(g_mu);
  return g_refs > 0;
}

nvmlReturn_t init_locked() {
  if (!g_count) {
    void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);  // never closed
    if (!h) return NVML_ERROR_DRIVER_NOT_LOADED;
    auto c = reinterpret_cast<CountFn>(dlsym(h, "fakecuda_physical_count"));
    auto i = reinterpret_cast<InfoFn>(dlsym(h, "fakecuda_physical_info"));
    auto u = reinterpret_cast<UsedFn>(dlsym(h, "fakecuda_physical_used_bytes"));
    auto p = reinterpret_cast<ProcessesFn>(dlsym(h, "fakecuda_physical_processes"));
    if (!c || !i || !u || !p) return NVML_ERROR_DRIVER_NOT_LOADED;  // a real driver: not ours to simulate
    g_used = u;
    g_processes = p;
    for (int k = 0; k < kMaxDevices; ++k) g_devices[k].index = k;
    g_info = i;
    g_count = c;
  }
  ++g_refs;
  return NVML_SUCCESS;
}

int device_count() {
  int n = g_count ? g_count() : 0;
  return n < 0 ? 0 : (n > kMaxDevices ? kMaxDevices : n);
}

// Validates a handle (and that NVML is initialized); fills `*out`.
nvmlReturn_t lookup(nvmlDevice_t device, fakecuda_physical_device* out, int* index = nullptr) {
  if (!initialized()) return NVML_ERROR_UNINITIALIZED;
  auto* d = reinterpret_cast<nvmlDevice_st_impl*>(device);
  if (d < g_devices || d >= g_devices + kMaxDevices) return NVML_ERROR_INVALID_ARGUMENT;
  int i = static_cast<int>(d - g_devices);
  if (i >= device_count() || g_info(i, out) != 0) return NVML_ERROR_INVALID_ARGUMENT;
  if (index) *index = i;
  return NVML_SUCCESS;
}

// CUWARDEN_FAKE_NVML_PROCESSES="PID=BYTES[@PHYSICAL],...": other processes NVML lists as
// using compute on a device (default device 0), as a daemon sees the programs it watches.
struct OtherProcess {
  unsigned pid = 0;
  unsigned long long bytes = 0;
  int physical = 0;
};
const std::vector<OtherProcess>& other_processes() {
  static const std::vector<OtherProcess> list = [] {
    std::vector<OtherProcess> out;
    const char* v = std::getenv("CUWARDEN_FAKE_NVML_PROCESSES");
    for (const char* p = v; p && *p;) {
      OtherProcess o;
      char* end = nullptr;
      o.pid = static_cast<unsigned>(std::strtoul(p, &end, 10));
      if (*end == '=') o.bytes = std::strtoull(end + 1, &end, 10);
      if (*end == '@') o.physical = static_cast<int>(std::strtol(end + 1, &end, 10));
      out.push_back(o);
      p = *end == ',' ? end + 1 : end + std::strlen(end);
    }
    return out;
  }();
  return list;
}

nvmlDevice_t handle(int index) { return reinterpret_cast<nvmlDevice_t>(&g_devices[index]); }

nvmlReturn_t copy_string(const std::string& s, char* out, unsigned int length) {
  if (!out) return NVML_ERROR_INVALID_ARGUMENT;
  if (length < s.size() + 1) return NVML_ERROR_INSUFFICIENT_SIZE;
  std::memcpy(out, s.c_str(), s.size() + 1);
  return NVML_SUCCESS;
}

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

const char* driver_version() {
  const char* v = std::getenv("CUWARDEN_FAKE_DRIVER_VERSION");
  return v && *v ? v : "580.65.06";  // a CUDA 13.0 driver
}

constexpr unsigned kPciDeviceId = (0x2335u << 16) | 0x10deu;     // H200, as cuDeviceGetAttribute says
constexpr unsigned kPciSubSystemId = (0x18beu << 16) | 0x10deu;

void fill_pci(const fakecuda_physical_device& d, nvmlPciInfo_t* pci) {
  std::memset(pci, 0, sizeof *pci);
  pci->domain = static_cast<unsigned>(d.pci_domain);
  pci->bus = static_cast<unsigned>(d.pci_bus);
  pci->device = static_cast<unsigned>(d.pci_device);
  pci->pciDeviceId = kPciDeviceId;
  pci->pciSubSystemId = kPciSubSystemId;
  std::snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.0", pci->domain & 0xffff, pci->bus,
                pci->device);
  std::snprintf(pci->busId, sizeof pci->busId, "%08X:%02X:%02X.0", pci->domain, pci->bus, pci->device);
}

// The device's used bytes: every process's (CUWARDEN_FAKE_DIR) or this process's.
unsigned long long used_bytes(int index, const fakecuda_physical_device& d) {
  const unsigned long long used = g_used(index);
  return used < d.capacity ? used : d.capacity;
}

// The compute processes of a device: those with bytes there (this process only, without
// CUWARDEN_FAKE_DIR), then CUWARDEN_FAKE_NVML_PROCESSES.
template <typename Info>
nvmlReturn_t processes(nvmlDevice_t device, unsigned int* infoCount, Info* infos, bool compute) {
  fakecuda_physical_device d;
  int index = -1;
  if (nvmlReturn_t rc = lookup(device, &d, &index)) return rc;
  if (!infoCount) return NVML_ERROR_INVALID_ARGUMENT;
  std::vector<std::pair<unsigned, unsigned long long>> list;
  if (compute) {
    std::vector<fakecuda_process_usage> found(16);
    for (;;) {
      const int n = g_processes(index, found.data(), static_cast<int>(found.size()));
      if (n <= static_cast<int>(found.size())) {
        found.resize(static_cast<size_t>(n));
        break;
      }
      found.resize(static_cast<size_t>(n));
    }
    for (const auto& f : found) list.emplace_back(static_cast<unsigned>(f.pid), f.bytes);
  }
  if (compute)
    for (const auto& o : other_processes())
      if (o.physical == index) list.emplace_back(o.pid, o.bytes);
  const unsigned need = static_cast<unsigned>(list.size());
  if (*infoCount < need) {
    *infoCount = need;
    return NVML_ERROR_INSUFFICIENT_SIZE;
  }
  if (need && !infos) return NVML_ERROR_INVALID_ARGUMENT;
  *infoCount = need;
  for (unsigned i = 0; i < need; ++i) {
    Info info;
    std::memset(&info, 0, sizeof info);
    info.pid = list[i].first;
    info.usedGpuMemory = list[i].second;
    if constexpr (sizeof(Info) > sizeof(nvmlProcessInfo_v1_t)) {
      info.gpuInstanceId = 0xFFFFFFFFu;
      info.computeInstanceId = 0xFFFFFFFFu;
    }
    infos[i] = info;
  }
  return NVML_SUCCESS;
}

}  // namespace

// ------------------------------------------------------------------ init

FN_API nvmlReturn_t nvmlInit_v2(void) {
  FN_ENTER();
  std::lock_guard lock(g_mu);
  return init_locked();
}

FN_API nvmlReturn_t nvmlInit(void) {
  FN_ENTER();
  std::lock_guard lock(g_mu);
  return init_locked();
}

FN_API nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
  FN_ENTER();
  (void)flags;  // NO_GPUS / NO_ATTACH change nothing here
  std::lock_guard lock(g_mu);
  return init_locked();
}

FN_API nvmlReturn_t nvmlShutdown(void) {
  FN_ENTER();
  std::lock_guard lock(g_mu);
  if (g_refs == 0) return NVML_ERROR_UNINITIALIZED;
  --g_refs;
  return NVML_SUCCESS;
}

FN_API const char* nvmlErrorString(nvmlReturn_t result) {
  switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_INSUFFICIENT_POWER: return "Insufficient External Power";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_IRQ_ISSUE: return "Interrupt request issue";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM: return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
    case NVML_ERROR_OPERATING_SYSTEM: return "The operating system has blocked the request.";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_NO_DATA: return "No data";
    case NVML_ERROR_VGPU_ECC_NOT_ENABLED: return "The requested vgpu operation is not available on target device, because ECC is enabled";
    case NVML_ERROR_INSUFFICIENT_RESOURCES: return "Ran out of critical resources, other than memory";
    case NVML_ERROR_FREQ_NOT_SUPPORTED: return "The requested frequency is not supported";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    case NVML_ERROR_DEPRECATED: return "The requested functionality has been deprecated";
    case NVML_ERROR_NOT_READY: return "The system is not ready for the request";
    case NVML_ERROR_GPU_NOT_FOUND: return "No GPUs were found";
    case NVML_ERROR_INVALID_STATE: return "Resource is in invalid state";
    default: return "Unknown Error";
  }
}

// ------------------------------------------------------------------ system

FN_API nvmlReturn_t nvmlSystemGetDriverVersion(char* version, unsigned int length) {
  FN_ENTER();
  if (!initialized()) return NVML_ERROR_UNINITIALIZED;
  return copy_string(driver_version(), version, length);
}

FN_API nvmlReturn_t nvmlSystemGetNVMLVersion(char* version, unsigned int length) {
  FN_ENTER();
  if (!initialized()) return NVML_ERROR_UNINITIALIZED;
  return copy_string(std::string("13.") + driver_version(), version, length);
}

FN_API nvmlReturn_t nvmlSystemGetCudaDriverVersion(int* cudaDriverVersion) {
  FN_ENTER();
  if (!cudaDriverVersion) return NVML_ERROR_INVALID_ARGUMENT;
  *cudaDriverVersion = 13000;  // what the simulated cuDriverGetVersion says
  return NVML_SUCCESS;
}

FN_API nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int* cudaDriverVersion) {
  FN_ENTER();
  if (!cudaDriverVersion) return NVML_ERROR_INVALID_ARGUMENT;
  *cudaDriverVersion = 13000;
  return NVML_SUCCESS;
}

// ------------------------------------------------------------------ enumeration

namespace {
nvmlReturn_t get_count(unsigned int* n) {
  if (!initialized()) return NVML_ERROR_UNINITIALIZED;
  if (!n) return NVML_ERROR_INVALID_ARGUMENT;
  *n = static_cast<unsigned>(device_count());
  return NVML_SUCCESS;
}
nvmlReturn_t get_by_index(unsigned int index, nvmlDevice_t* device) {
  if (!initialized()) return NVML_ERROR_UNINITIALIZED;
  if (!device || index >= static_cast<unsigned>(device_count())) return NVML_ERROR_INVALID_ARGUMENT;
  *device = handle(static_cast<int>(index));
  return NVML_SUCCESS;
}
nvmlReturn_t get_by_pci(const char* bus_id, nvmlDevice_t* device) {
  if (!initialized()) return NVML_ERROR_UNINITIALIZED;
  if (!bus_id || !device) return NVML_ERROR_INVALID_ARGUMENT;
  unsigned domain = 0, bus = 0, dev = 0, fn = 0;
  if (std::sscanf(bus_id, "%x:%x:%x.%x", &domain, &bus, &dev, &fn) != 4) {
    domain = 0;
    if (std::sscanf(bus_id, "%x:%x.%x", &bus, &dev, &fn) != 3) return NVML_ERROR_INVALID_ARGUMENT;
  }
  for (int i = 0; i < device_count(); ++i) {
    fakecuda_physical_device d;
    if (g_info(i, &d) == 0 && static_cast<unsigned>(d.pci_domain) == domain &&
        static_cast<unsigned>(d.pci_bus) == bus && static_cast<unsigned>(d.pci_device) == dev && fn == 0) {
      *device = handle(i);
      return NVML_SUCCESS;
    }
  }
  return NVML_ERROR_NOT_FOUND;
}
}  // namespace

FN_API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int* deviceCount) {
  FN_ENTER();
  return get_count(deviceCount);
}

FN_API nvmlReturn_t nvmlDeviceGetCount(unsigned int* deviceCount) {
  FN_ENTER();
  return get_count(deviceCount);
}

FN_API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t* device) {
  FN_ENTER();
  return get_by_index(index, device);
}

FN_API nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t* device) {
  FN_ENTER();
  return get_by_index(index, device);
}

FN_API nvmlReturn_t nvmlDeviceGetHandleByUUID(const char* uuid, nvmlDevice_t* device) {
  FN_ENTER();
  if (!initialized()) return NVML_ERROR_UNINITIALIZED;
  if (!uuid || !device) return NVML_ERROR_INVALID_ARGUMENT;
  const std::string want = lower(uuid);
  for (int i = 0; i < device_count(); ++i) {
    fakecuda_physical_device d;
    if (g_info(i, &d) == 0 && lower(d.uuid) == want) {
      *device = handle(i);
      return NVML_SUCCESS;
    }
  }
  return NVML_ERROR_NOT_FOUND;
}

FN_API nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char* pciBusId, nvmlDevice_t* device) {
  FN_ENTER();
  return get_by_pci(pciBusId, device);
}

FN_API nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char* pciBusId, nvmlDevice_t* device) {
  FN_ENTER();
  return get_by_pci(pciBusId, device);
}

// ------------------------------------------------------------------ device queries

FN_API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char* uuid, unsigned int length) {
  FN_ENTER();
  fakecuda_physical_device d;
  if (nvmlReturn_t rc = lookup(device, &d)) return rc;
  return copy_string(d.uuid, uuid, length);
}

FN_API nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char* name, unsigned int length) {
  FN_ENTER();
  fakecuda_physical_device d;
  if (nvmlReturn_t rc = lookup(device, &d)) return rc;
  return copy_string(d.name, name, length);
}

FN_API nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int* index) {
  FN_ENTER();
  fakecuda_physical_device d;
  int i = 0;
  if (nvmlReturn_t rc = lookup(device, &d, &i)) return rc;
  if (!index) return NVML_ERROR_INVALID_ARGUMENT;
  *index = static_cast<unsigned>(i);
  return NVML_SUCCESS;
}

FN_API nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int* minorNumber) {
  FN_ENTER();
  fakecuda_physical_device d;
  int i = 0;
  if (nvmlReturn_t rc = lookup(device, &d, &i)) return rc;
  if (!minorNumber) return NVML_ERROR_INVALID_ARGUMENT;
  *minorNumber = static_cast<unsigned>(i);  // /dev/nvidiaN
  return NVML_SUCCESS;
}

FN_API nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int* major, int* minor) {
  FN_ENTER();
  fakecuda_physical_device d;
  if (nvmlReturn_t rc = lookup(device, &d)) return rc;
  if (!major || !minor) return NVML_ERROR_INVALID_ARGUMENT;
  *major = 9;
  *minor = 0;
  return NVML_SUCCESS;
}

FN_API nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t* pci) {
  FN_ENTER();
  fakecuda_physical_device d;
  if (nvmlReturn_t rc = lookup(device, &d)) return rc;
  if (!pci) return NVML_ERROR_INVALID_ARGUMENT;
  fill_pci(d, pci);
  return NVML_SUCCESS;
}

FN_API nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t* pci) {
  FN_ENTER();
  fakecuda_physical_device d;
  if (nvmlReturn_t rc = lookup(device, &d)) return rc;
  if (!pci) return NVML_ERROR_INVALID_ARGUMENT;
  fill_pci(d, pci);
  return NVML_SUCCESS;
}

FN_API nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t device, nvmlPciInfo_t* pci) {
  FN_ENTER();
  fakecuda_physical_device d;
  if (nvmlReturn_t rc = lookup(device, &d)) return rc;
  if (!pci) return NVML_ERROR_INVALID_ARGUMENT;
  // The pre-v2 layout: char busId[16]; domain, bus, device, pciDeviceId, pciSubSystemId;
  // reserved0..3 — 52 bytes, no more may be written.
  struct Legacy {
    char busId[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId, reserved[4];
  } legacy;
  static_assert(sizeof(Legacy) == 52);
  nvmlPciInfo_t full;
  fill_pci(d, &full);
  std::memset(&legacy, 0, sizeof legacy);
  std::memcpy(legacy.busId, full.busIdLegacy, sizeof legacy.busId);
  legacy.domain = full.domain;
  legacy.bus = full.bus;
  legacy.device = full.device;
  legacy.pciDeviceId = full.pciDeviceId;
  legacy.pciSubSystemId = full.pciSubSystemId;
  std::memcpy(static_cast<void*>(pci), &legacy, sizeof legacy);
  return NVML_SUCCESS;
}

FN_API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t* memory) {
  FN_ENTER();
  fakecuda_physical_device d;
  int index = 0;
  if (nvmlReturn_t rc = lookup(device, &d, &index)) return rc;
  if (!memory) return NVML_ERROR_INVALID_ARGUMENT;
  const unsigned long long used = used_bytes(index, d);
  memory->total = d.capacity;
  memory->used = used;
  memory->free = d.capacity - used;
  return NVML_SUCCESS;
}

FN_API nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t* memory) {
  FN_ENTER();
  fakecuda_physical_device d;
  int index = 0;
  if (nvmlReturn_t rc = lookup(device, &d, &index)) return rc;
  if (!memory) return NVML_ERROR_INVALID_ARGUMENT;
  if (memory->version != nvmlMemory_v2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
  const unsigned long long used = used_bytes(index, d);
  memory->total = d.capacity;
  memory->reserved = 0;  // the simulated driver reserves nothing for itself
  memory->used = used;
  memory->free = d.capacity - used;
  return NVML_SUCCESS;
}

FN_API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int* infoCount,
                                                            nvmlProcessInfo_t* infos) {
  FN_ENTER();
  return processes(device, infoCount, infos, true);
}

FN_API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int* infoCount,
                                                            nvmlProcessInfo_v2_t* infos) {
  FN_ENTER();
  return processes(device, infoCount, infos, true);
}

FN_API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int* infoCount,
                                                         nvmlProcessInfo_v1_t* infos) {
  FN_ENTER();
  return processes(device, infoCount, infos, true);
}

FN_API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device, unsigned int* infoCount,
                                                             nvmlProcessInfo_t* infos) {
  FN_ENTER();
  return processes(device, infoCount, infos, false);
}

FN_API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t device, unsigned int* infoCount,
                                                             nvmlProcessInfo_v2_t* infos) {
  FN_ENTER();
  return processes(device, infoCount, infos, false);
}

FN_API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses(nvmlDevice_t device, unsigned int* infoCount,
                                                          nvmlProcessInfo_v1_t* infos) {
  FN_ENTER();
  return processes(device, infoCount, infos, false);
}

// ------------------------------------------------------------------ test API

FN_API unsigned long long fakenvml_call_count(const char* name) {
  if (!name) return 0;
  std::lock_guard lock(g_count_mu);
  auto it = g_counts.find(name);
  return it == g_counts.end() ? 0 : it->second;
}

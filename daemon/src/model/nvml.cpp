// cuwarden daemon: NVML by dlopen (see nvml.hpp). Types are declared here, from NVML's
// public ABI, because the build machine has no nvml.h and needs none.
#include "model/nvml.hpp"

#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

namespace cuw::daemon {

namespace {
using nvmlReturn_t = int;
using nvmlDevice_t = void*;
struct nvmlMemory_t {
  unsigned long long total, free, used;
};
struct nvmlPciInfo_t {
  char busIdLegacy[16];
  unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
  char busId[32];
};
struct nvmlProcessInfo_t {  // nvmlProcessInfo_v2_t (and v3 where it has not grown)
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId, computeInstanceId;
};
constexpr unsigned long long kNvmlValueNotAvailable = ~0ULL;
constexpr nvmlReturn_t kNvmlSuccess = 0;
constexpr nvmlReturn_t kNvmlInsufficientSize = 7;
}  // namespace

struct Nvml::Api {
  nvmlReturn_t (*init)() = nullptr;
  nvmlReturn_t (*shutdown)() = nullptr;
  nvmlReturn_t (*count)(unsigned*) = nullptr;
  nvmlReturn_t (*by_index)(unsigned, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*uuid)(nvmlDevice_t, char*, unsigned) = nullptr;
  nvmlReturn_t (*name)(nvmlDevice_t, char*, unsigned) = nullptr;
  nvmlReturn_t (*memory)(nvmlDevice_t, nvmlMemory_t*) = nullptr;
  nvmlReturn_t (*pci)(nvmlDevice_t, nvmlPciInfo_t*) = nullptr;
  nvmlReturn_t (*procs)(nvmlDevice_t, unsigned*, nvmlProcessInfo_t*) = nullptr;
};

Nvml::Nvml(bool enabled, const std::string& path) {
  if (!enabled) return;
  handle_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle_) return;
  api_ = new Api();
  auto sym = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(handle_, name));
    return fn != nullptr;
  };
  bool all = sym(api_->init, "nvmlInit_v2") && sym(api_->shutdown, "nvmlShutdown") &&
             sym(api_->count, "nvmlDeviceGetCount_v2") && sym(api_->by_index, "nvmlDeviceGetHandleByIndex_v2") &&
             sym(api_->uuid, "nvmlDeviceGetUUID") && sym(api_->name, "nvmlDeviceGetName") &&
             sym(api_->memory, "nvmlDeviceGetMemoryInfo");
  if (!sym(api_->pci, "nvmlDeviceGetPciInfo_v3")) sym(api_->pci, "nvmlDeviceGetPciInfo_v2");
  // _v2 first: its entries are 24 bytes on every driver, where _v3's grew to 32 on some
  // (R535 adds usedGpuCcProtectedMemory), which this layout would misread.
  if (!sym(api_->procs, "nvmlDeviceGetComputeRunningProcesses_v2"))
    sym(api_->procs, "nvmlDeviceGetComputeRunningProcesses_v3");
  ok_ = all && api_->init() == kNvmlSuccess;
  nvmlReturn_t (*version)(char*, unsigned) = nullptr;
  char buf[96] = {};
  if (ok_ && sym(version, "nvmlSystemGetDriverVersion") && version(buf, sizeof buf - 1) == kNvmlSuccess)
    driver_version_ = buf;
}

Nvml::~Nvml() {
  if (ok_) api_->shutdown();
  delete api_;
  // The library stays mapped: unloading NVML at exit gains nothing, and a leak checker can
  // then still name the library that owns any memory it kept.
}

std::vector<NvmlGpu> Nvml::query() const {
  std::vector<NvmlGpu> out;
  if (!ok_) return out;
  unsigned n = 0;
  if (api_->count(&n) != kNvmlSuccess) return out;
  for (unsigned i = 0; i < n && i < 64; ++i) {
    nvmlDevice_t dev = nullptr;
    if (api_->by_index(i, &dev) != kNvmlSuccess) continue;
    NvmlGpu g;
    g.index = i;
    char buf[128] = {};
    if (api_->uuid(dev, buf, sizeof buf - 1) == kNvmlSuccess) g.uuid = buf;
    std::memset(buf, 0, sizeof buf);
    if (api_->name(dev, buf, sizeof buf - 1) == kNvmlSuccess) g.name = buf;
    nvmlMemory_t mem{};
    if (api_->memory(dev, &mem) == kNvmlSuccess) {
      g.memory_total = mem.total;
      g.memory_used = mem.used;
    }
    nvmlPciInfo_t pci{};
    if (api_->pci && api_->pci(dev, &pci) == kNvmlSuccess) g.bus_id.assign(pci.busId, strnlen(pci.busId, sizeof pci.busId));
    if (api_->procs) {
      std::vector<nvmlProcessInfo_t> infos(64);
      for (int attempt = 0; attempt < 3; ++attempt) {
        unsigned count = static_cast<unsigned>(infos.size());
        nvmlReturn_t r = api_->procs(dev, &count, infos.data());
        if (r == kNvmlInsufficientSize && count > infos.size() && count < 65536) {
          infos.resize(count + 16);
          continue;
        }
        if (r == kNvmlSuccess)
          for (unsigned k = 0; k < count && k < infos.size(); ++k)
            if (infos[k].usedGpuMemory != kNvmlValueNotAvailable) g.process_used[infos[k].pid] += infos[k].usedGpuMemory;
        break;
      }
      for (const auto& [pid, bytes] : g.process_used) {
        std::string comm;
        if (std::FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/comm").c_str(), "re")) {
          char c[64] = {};
          if (std::fgets(c, sizeof c, f)) comm.assign(c, strcspn(c, "\n"));
          std::fclose(f);
        }
        g.process_name[pid] = std::move(comm);
      }
    }
    out.push_back(std::move(g));
  }
  return out;
}

}  // namespace cuw::daemon

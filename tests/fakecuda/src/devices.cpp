// fakecuda: simulated devices (from CUWARDEN_FAKE_*), CUDA_VISIBLE_DEVICES, cuInit, device queries.
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "internal.hpp"  // before fakecuda.h: it sets up cuda.h for the driver side
#include "../fakecuda.h"

namespace fc {
namespace {

std::once_flag g_devices_once;
auto& g_visible = *new std::vector<Device*>;  // by visible ordinal; never destroyed
auto& g_physical = *new std::vector<Device*>;  // every simulated device, visible or not; never destroyed
std::atomic<bool> g_initialized{false};
CUresult g_init_result = CUDA_SUCCESS;
std::once_flag g_init_once;

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    size_t pos = s.find(sep, start);
    out.push_back(s.substr(start, pos == std::string::npos ? std::string::npos : pos - start));
    if (pos == std::string::npos) break;
    start = pos + 1;
  }
  return out;
}

std::string trim(const std::string& s) {
  size_t a = 0, b = s.size();
  while (a < b && std::isspace(static_cast<unsigned char>(s[a]))) ++a;
  while (b > a && std::isspace(static_cast<unsigned char>(s[b - 1]))) --b;
  return s.substr(a, b - a);
}

std::string uuid_to_string(const CUuuid& u) {
  char buf[64];
  const auto* b = reinterpret_cast<const unsigned char*>(u.bytes);
  std::snprintf(buf, sizeof buf,
                "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
                b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14],
                b[15]);
  return buf;
}

bool uuid_from_string(const std::string& text, CUuuid* out) {
  std::string hex;
  std::string s = text;
  if (s.rfind("GPU-", 0) == 0) s = s.substr(4);
  for (char c : s) {
    if (c == '-') continue;
    if (!std::isxdigit(static_cast<unsigned char>(c))) return false;
    hex.push_back(c);
  }
  if (hex.size() != 32) return false;
  for (int i = 0; i < 16; ++i) out->bytes[i] = static_cast<char>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  return true;
}

// Bus numbers of an 8-GPU HGX board, so bus ids look like the real thing.
constexpr int kBuses[] = {0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb};

void build_devices() {
  const char* count_env = std::getenv("CUWARDEN_FAKE_DEVICES");
  int count = count_env ? std::atoi(count_env) : 1;
  if (count < 0) count = 0;
  if (count > 64) count = 64;

  std::vector<size_t> sizes;
  if (const char* mem = std::getenv("CUWARDEN_FAKE_MEMORY")) {
    for (const auto& part : split(mem, ',')) {
      bool ok = false;
      size_t v = parse_size(trim(part).c_str(), &ok);
      if (!ok || v == 0) {
        std::fprintf(stderr, "[fakecuda] bad CUWARDEN_FAKE_MEMORY entry '%s'\n", part.c_str());
        std::abort();
      }
      sizes.push_back(v);
    }
  }
  if (sizes.empty()) sizes.push_back(size_t{16} << 30);

  std::vector<std::string> uuid_list;
  if (const char* u = std::getenv("CUWARDEN_FAKE_UUIDS")) {
    for (const auto& part : split(u, ',')) uuid_list.push_back(trim(part));
  }
  const char* name_env = std::getenv("CUWARDEN_FAKE_NAME");
  const std::string name = name_env ? name_env : "cuwarden simulated GPU";
  // CUWARDEN_FAKE_NAMES: a name per device ("" or a missing entry keeps CUWARDEN_FAKE_NAME), so
  // that a test can have GPUs of two chips (a restore onto another GPU needs the same chip).
  std::vector<std::string> names;
  if (const char* n = std::getenv("CUWARDEN_FAKE_NAMES")) {
    for (const auto& part : split(n, ',')) names.push_back(trim(part));
  }

  std::vector<Device*> physical;
  for (int i = 0; i < count; ++i) {
    auto* d = new Device;
    d->physical = i;
    d->name = static_cast<size_t>(i) < names.size() && !names[i].empty() ? names[i] : name;
    d->capacity = sizes[std::min<size_t>(i, sizes.size() - 1)];
    d->pci_bus = i < 8 ? kBuses[i] : 0x10 + i;
    bool have = false;
    if (static_cast<size_t>(i) < uuid_list.size() && !uuid_list[i].empty()) {  // "" keeps the default
      have = uuid_from_string(uuid_list[i], &d->uuid);
      if (!have) std::fprintf(stderr, "[fakecuda] bad UUID '%s', using default\n", uuid_list[i].c_str());
    }
    if (!have) {
      // Deterministic and distinct: c0dafa7e-5a1e-4000-8000-0000000000NN.
      const unsigned char b[16] = {0xc0, 0xda, 0xfa, 0x7e, 0x5a, 0x1e, 0x40, 0x00,
                                   0x80, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, static_cast<unsigned char>(i)};
      std::memcpy(d->uuid.bytes, b, 16);
    }
    d->uuid_string = uuid_to_string(d->uuid);
    d->ordinal = -1;  // until CUDA_VISIBLE_DEVICES makes it visible
    d->shared = shared_device_open(d->uuid_string, d->capacity);
    physical.push_back(d);
  }
  g_physical = physical;

  std::vector<std::string> uuid_strings;
  std::vector<const char*> uuid_ptrs;
  for (auto* d : physical) uuid_strings.push_back(d->uuid_string);
  for (auto& s : uuid_strings) uuid_ptrs.push_back(s.c_str());
  std::vector<int> order(physical.size() + 1);
  int n = fakecuda_parse_visible_devices(std::getenv("CUDA_VISIBLE_DEVICES"), count, uuid_ptrs.data(),
                                         order.data(), static_cast<int>(order.size()));
  for (int i = 0; i < n; ++i) {
    Device* d = physical[order[i]];
    d->ordinal = i;
    g_visible.push_back(d);
  }
}

}  // namespace

size_t parse_size(const char* text, bool* ok) {
  *ok = false;
  if (!text || !*text) return 0;
  char* end = nullptr;
  unsigned long long v = std::strtoull(text, &end, 10);
  if (end == text) return 0;
  std::string suffix = end;
  unsigned long long mult = 1;
  if (!suffix.empty()) {
    char c = static_cast<char>(std::toupper(static_cast<unsigned char>(suffix[0])));
    std::string rest = suffix.substr(1);
    if (c == 'K') mult = 1ull << 10;
    else if (c == 'M') mult = 1ull << 20;
    else if (c == 'G') mult = 1ull << 30;
    else if (c == 'T') mult = 1ull << 40;
    else return 0;
    if (!rest.empty() && rest != "B" && rest != "iB" && rest != "IB" && rest != "ib") return 0;
  }
  *ok = true;
  return static_cast<size_t>(v * mult);
}

void ensure_devices() { std::call_once(g_devices_once, build_devices); }
bool initialized() { return g_initialized.load(std::memory_order_acquire); }
bool mps_client() {
  static const bool mps = std::getenv("CUWARDEN_FAKE_MPS") != nullptr;
  return mps;
}
int device_count() {
  ensure_devices();
  return static_cast<int>(g_visible.size());
}
Device* device(int ordinal) {
  ensure_devices();
  if (ordinal < 0 || ordinal >= static_cast<int>(g_visible.size())) return nullptr;
  return g_visible[ordinal];
}
CUresult check_device(CUdevice dev) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  return device(dev) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

bool Device::reserve(size_t bytes) {
  if (shared) {
    if (!shared_device_add(shared, bytes, true)) return false;
    used.fetch_add(bytes);
    return true;
  }
  size_t cur = used.load();
  do {
    if (bytes > capacity || cur > capacity - bytes) return false;
  } while (!used.compare_exchange_weak(cur, cur + bytes));
  return true;
}
void Device::charge(size_t bytes) {
  if (shared) shared_device_add(shared, bytes, false);
  used.fetch_add(bytes);
}
void Device::unreserve(size_t bytes) {
  if (shared) shared_device_sub(shared, bytes);
  used.fetch_sub(bytes);
}
CUresult remap_devices(const CUcheckpointGpuPair* pairs, unsigned count) {
  ensure_devices();
  const int n = static_cast<int>(g_visible.size()), total = static_cast<int>(g_physical.size());
  auto physical_of = [&](const CUuuid& u) {
    for (int p = 0; p < total; ++p)
      if (std::memcmp(g_physical[p]->uuid.bytes, u.bytes, sizeof u.bytes) == 0) return p;
    return -1;
  };
  // Every device the process sees is a checkpointed GPU: each is named once as an old GPU,
  // and no new GPU twice.
  std::vector<int> target(static_cast<size_t>(n), -1);
  std::vector<bool> taken(static_cast<size_t>(total), false);
  for (unsigned k = 0; k < count; ++k) {
    const int from = physical_of(pairs[k].oldUuid), to = physical_of(pairs[k].newUuid);
    if (from < 0 || to < 0 || g_physical[from]->ordinal < 0 || target[g_physical[from]->ordinal] >= 0 || taken[to])
      return CUDA_ERROR_INVALID_VALUE;
    target[g_physical[from]->ordinal] = to;
    taken[to] = true;
  }
  for (int i = 0; i < n; ++i)
    if (target[i] < 0) return CUDA_ERROR_INVALID_VALUE;  // a checkpointed GPU left out
  for (int i = 0; i < n; ++i)
    if (g_physical[target[i]]->name != g_visible[i]->name) return CUDA_ERROR_NOT_SUPPORTED;  // another chip
  // The identities move; each Device object (the ordinal, its arena: the process's device
  // addresses) stays. A GPU no ordinal moves onto goes to an object the process does not see.
  struct Identity {
    int physical, pci_bus;
    std::string name, uuid_string;
    CUuuid uuid;
    size_t capacity;
    SharedDevice* shared;
  };
  std::vector<Identity> ids;
  for (Device* d : g_physical) ids.push_back({d->physical, d->pci_bus, d->name, d->uuid_string, d->uuid, d->capacity, d->shared});
  std::vector<Device*> objects(static_cast<size_t>(total), nullptr);
  for (int i = 0; i < n; ++i) objects[target[i]] = g_visible[i];
  size_t spare = 0;
  for (int p = 0; p < total; ++p) {
    if (objects[p]) continue;
    while (g_physical[spare]->ordinal >= 0) ++spare;  // the objects no ordinal names, in order
    objects[p] = g_physical[spare++];
  }
  for (int p = 0; p < total; ++p) {
    Device* d = objects[p];
    const Identity& id = ids[p];
    d->physical = id.physical;
    d->pci_bus = id.pci_bus;
    d->name = id.name;
    d->uuid_string = id.uuid_string;
    d->uuid = id.uuid;
    d->capacity = id.capacity;
    d->shared = id.shared;
  }
  g_physical = objects;
  return CUDA_SUCCESS;
}

size_t Device::device_used() const { return shared ? shared_device_used(shared) : used.load(); }

Arena& Device::arena() {
  std::call_once(arena_once, [this] { arena_ = std::make_unique<Arena>(capacity); });
  return *arena_;
}

}  // namespace fc

using namespace fc;

FC_API int fakecuda_parse_visible_devices(const char* spec, int physical_count, const char* const* uuids,
                                          int* out, int max) {
  int n = 0;
  if (!spec) {
    for (int i = 0; i < physical_count && n < max; ++i) out[n++] = i;
    return n;
  }
  std::vector<bool> taken(physical_count, false);
  for (const auto& raw : split(spec, ',')) {
    std::string tok = trim(raw);
    if (tok.empty()) break;
    int found = -1;
    if (std::isdigit(static_cast<unsigned char>(tok[0]))) {
      char* end = nullptr;
      long v = std::strtol(tok.c_str(), &end, 10);
      if (*end != 0 || v < 0 || v >= physical_count) break;
      found = static_cast<int>(v);
    } else {
      // A UUID or a unique prefix of one, "GPU-" included, compared case-insensitively.
      std::string want = tok;
      for (auto& c : want) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      if (want.rfind("gpu-", 0) != 0) break;
      int matches = 0;
      for (int i = 0; i < physical_count; ++i) {
        std::string have = uuids[i];
        for (auto& c : have) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        if (have.rfind(want, 0) == 0) {
          ++matches;
          found = i;
        }
      }
      if (matches != 1) break;
    }
    if (taken[found]) break;  // the driver stops at a repeated device as well
    taken[found] = true;
    if (n < max) out[n++] = found;
  }
  return n;
}

FC_API size_t fakecuda_live_bytes(int ordinal) {
  Device* d = device(ordinal);
  return d ? d->used.load() : 0;
}

FC_API int fakecuda_physical_count(void) {
  ensure_devices();
  return static_cast<int>(g_physical.size());
}

FC_API int fakecuda_physical_info(int physical_index, fakecuda_physical_device* out) {
  ensure_devices();
  if (!out || physical_index < 0 || physical_index >= static_cast<int>(g_physical.size())) return -1;
  const Device* d = g_physical[physical_index];
  std::memset(out, 0, sizeof *out);
  std::snprintf(out->uuid, sizeof out->uuid, "%s", d->uuid_string.c_str());
  std::snprintf(out->name, sizeof out->name, "%s", d->name.c_str());
  std::memcpy(out->uuid_bytes, d->uuid.bytes, 16);
  out->capacity = d->capacity;
  out->live_bytes = d->used.load();
  out->pci_domain = 0;
  out->pci_bus = d->pci_bus;
  out->pci_device = 0;
  out->ordinal = d->ordinal;
  return 0;
}

FC_API size_t fakecuda_physical_live_bytes(int physical_index) {
  ensure_devices();
  if (physical_index < 0 || physical_index >= static_cast<int>(g_physical.size())) return 0;
  return g_physical[physical_index]->used.load();
}

FC_API size_t fakecuda_physical_used_bytes(int physical_index) {
  ensure_devices();
  if (physical_index < 0 || physical_index >= static_cast<int>(g_physical.size())) return 0;
  return g_physical[physical_index]->device_used();
}

FC_API int fakecuda_physical_processes(int physical_index, fakecuda_process_usage* out, int max) {
  ensure_devices();
  if (physical_index < 0 || physical_index >= static_cast<int>(g_physical.size()) || max < 0) return 0;
  const Device* d = g_physical[physical_index];
  if (!d->shared) {
    const size_t bytes = d->used.load();
    if (bytes == 0) return 0;
    if (max > 0 && out) out[0] = fakecuda_process_usage{getpid(), bytes};
    return 1;
  }
  std::vector<int> pids(static_cast<size_t>(max));
  std::vector<size_t> bytes(static_cast<size_t>(max));
  const int n = shared_device_processes(d->shared, pids.data(), bytes.data(), max);
  for (int i = 0; i < std::min(n, max) && out; ++i) out[i] = fakecuda_process_usage{pids[i], bytes[i]};
  return n;
}

FC_API size_t fakecuda_free_block_count(int ordinal) {
  Device* d = device(ordinal);
  return d ? d->arena().free_block_count() : 0;
}

FC_API CUresult cuInit(unsigned int Flags) {
  FC_ENTER();
  if (Flags != 0) return CUDA_ERROR_INVALID_VALUE;
  std::call_once(g_init_once, [] {
    ensure_devices();
    g_init_result = g_visible.empty() ? CUDA_ERROR_NO_DEVICE : CUDA_SUCCESS;
    if (g_init_result == CUDA_SUCCESS) g_initialized.store(true, std::memory_order_release);
  });
  if (g_init_result == CUDA_SUCCESS) checkpoint_service_start();
  return g_init_result;
}

FC_API CUresult cuDriverGetVersion(int* driverVersion) {
  FC_ENTER();
  if (!driverVersion) return CUDA_ERROR_INVALID_VALUE;
  *driverVersion = 13000;
  return CUDA_SUCCESS;
}

FC_API CUresult cuDeviceGet(CUdevice* device_out, int ordinal) {
  FC_ENTER();
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!device_out) return CUDA_ERROR_INVALID_VALUE;
  if (!device(ordinal)) return CUDA_ERROR_INVALID_DEVICE;
  *device_out = ordinal;
  return CUDA_SUCCESS;
}

FC_API CUresult cuDeviceGetCount(int* count) {
  FC_ENTER();
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!count) return CUDA_ERROR_INVALID_VALUE;
  *count = device_count();
  return CUDA_SUCCESS;
}

FC_API CUresult cuDeviceGetName(char* name, int len, CUdevice dev) {
  FC_ENTER();
  if (CUresult rc = check_device(dev)) return rc;
  if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  std::snprintf(name, static_cast<size_t>(len), "%s", device(dev)->name.c_str());
  return CUDA_SUCCESS;
}

FC_API CUresult cuDeviceGetUuid(CUuuid* uuid, CUdevice dev) {
  FC_ENTER();
  if (CUresult rc = check_device(dev)) return rc;
  if (!uuid) return CUDA_ERROR_INVALID_VALUE;
  *uuid = device(dev)->uuid;
  return CUDA_SUCCESS;
}

FC_API CUresult cuDeviceGetUuid_v2(CUuuid* uuid, CUdevice dev) {
  FC_ENTER();
  if (CUresult rc = check_device(dev)) return rc;
  if (!uuid) return CUDA_ERROR_INVALID_VALUE;
  *uuid = device(dev)->uuid;
  return CUDA_SUCCESS;
}

FC_API CUresult cuDeviceGetLuid(char* luid, unsigned int* deviceNodeMask, CUdevice dev) {
  FC_ENTER();
  if (CUresult rc = check_device(dev)) return rc;
  (void)luid;
  (void)deviceNodeMask;
  return CUDA_ERROR_NOT_SUPPORTED;  // as on Linux
}

FC_API CUresult cuDeviceTotalMem(unsigned int* bytes, CUdevice dev) {
  FC_ENTER();
  if (CUresult rc = check_device(dev)) return rc;
  if (!bytes) return CUDA_ERROR_INVALID_VALUE;
  size_t cap = device(dev)->capacity;
  *bytes = cap > 0xffffffffu ? 0xffffffffu : static_cast<unsigned int>(cap);
  return CUDA_SUCCESS;
}

FC_API CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
  FC_ENTER();
  if (CUresult rc = check_device(dev)) return rc;
  if (!bytes) return CUDA_ERROR_INVALID_VALUE;
  *bytes = device(dev)->capacity;
  return CUDA_SUCCESS;
}

namespace {

// An H200-like device (compute capability 9.0, 132 SMs). 0 for attributes it does not have.
int attribute_value(CUdevice_attribute a, const Device* d) {
  switch (a) {
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: return 64;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: return 2147483647;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: return 65535;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: return 65535;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: return 49152;
    case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY: return 65536;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: return 32;
    case CU_DEVICE_ATTRIBUTE_MAX_PITCH: return 2147483647;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: return 65536;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: return 1980000;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT: return 512;
    case CU_DEVICE_ATTRIBUTE_GPU_OVERLAP: return 1;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: return 132;
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY: return 1;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_WIDTH: return 131072;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_WIDTH: return 131072;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_HEIGHT: return 65536;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_WIDTH: return 16384;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_HEIGHT: return 16384;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_DEPTH: return 16384;
    case CU_DEVICE_ATTRIBUTE_SURFACE_ALIGNMENT: return 512;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS: return 1;
    case CU_DEVICE_ATTRIBUTE_ECC_ENABLED: return 1;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: return d->pci_bus;
    case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: return 0;
    case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: return 0;
    case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: return 2619000;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: return 6144;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: return 52428800;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: return 2048;
    case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: return 3;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: return 1;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT: return 32;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: return 9;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: return 0;
    case CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: return 233472;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR: return 65536;
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY: return 1;
    case CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD_GROUP_ID: return d->physical;
    case CU_DEVICE_ATTRIBUTE_SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO: return 2;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS: return 1;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM: return 1;
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH: return 1;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: return 232448;
    case CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: {
      static const bool none = getenv("CUWARDEN_FAKE_NO_VMM") != nullptr;
      return none ? 0 : 1;
    }
    case CU_DEVICE_ATTRIBUTE_MPS_ENABLED: return mps_client() ? 1 : 0;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR: return 32;
    case CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE: return 32505856;
    case CU_DEVICE_ATTRIBUTE_MAX_ACCESS_POLICY_WINDOW_SIZE: return 134213632;
    case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK: return 1024;
    case CU_DEVICE_ATTRIBUTE_SPARSE_CUDA_ARRAY_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_TIMELINE_SEMAPHORE_INTEROP_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS: return 1;
    case CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES: return CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    case CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH: return 1;
    case CU_DEVICE_ATTRIBUTE_DEFERRED_MAPPING_CUDA_ARRAY_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS: return 1;
    case CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR: return 1;
    case CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_MEM_SYNC_DOMAIN_COUNT: return 4;
    case CU_DEVICE_ATTRIBUTE_TENSOR_MAP_ACCESS_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_FUNCTION_POINTERS: return 1;
    case CU_DEVICE_ATTRIBUTE_NUMA_ID: return -1;
    case CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID: return 0;
    case CU_DEVICE_ATTRIBUTE_GPU_PCI_DEVICE_ID: return static_cast<int>((0x2335u << 16) | 0x10deu);
    case CU_DEVICE_ATTRIBUTE_GPU_PCI_SUBSYSTEM_ID: return static_cast<int>((0x18beu << 16) | 0x10deu);
    case CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_HOST_NUMA_MEMORY_POOLS_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_HOST_MEMORY_POOLS_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: return 1;
    default: return 0;
  }
}

}  // namespace

FC_API CUresult cuDeviceGetAttribute(int* pi, CUdevice_attribute attrib, CUdevice dev) {
  FC_ENTER();
  if (CUresult rc = check_device(dev)) return rc;
  if (!pi) return CUDA_ERROR_INVALID_VALUE;
  if (static_cast<int>(attrib) < 1 || static_cast<int>(attrib) >= static_cast<int>(CU_DEVICE_ATTRIBUTE_MAX))
    return CUDA_ERROR_INVALID_VALUE;
  *pi = attribute_value(attrib, device(dev));
  return CUDA_SUCCESS;
}

FC_API CUresult cuDeviceComputeCapability(int* major, int* minor, CUdevice dev) {
  FC_ENTER();
  if (CUresult rc = check_device(dev)) return rc;
  if (!major || !minor) return CUDA_ERROR_INVALID_VALUE;
  *major = 9;
  *minor = 0;
  return CUDA_SUCCESS;
}

FC_API CUresult cuDeviceGetPCIBusId(char* pciBusId, int len, CUdevice dev) {
  FC_ENTER();
  if (CUresult rc = check_device(dev)) return rc;
  if (!pciBusId || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  std::snprintf(pciBusId, static_cast<size_t>(len), "00000000:%02X:00.0", device(dev)->pci_bus);
  return CUDA_SUCCESS;
}

FC_API CUresult cuDeviceGetByPCIBusId(CUdevice* dev, const char* pciBusId) {
  FC_ENTER();
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!dev || !pciBusId) return CUDA_ERROR_INVALID_VALUE;
  unsigned domain = 0, bus = 0, slot = 0, fn = 0;
  if (std::sscanf(pciBusId, "%x:%x:%x.%x", &domain, &bus, &slot, &fn) != 4) {
    domain = 0;
    if (std::sscanf(pciBusId, "%x:%x.%x", &bus, &slot, &fn) != 3) return CUDA_ERROR_INVALID_VALUE;
  }
  for (int i = 0; i < device_count(); ++i) {
    if (domain == 0 && static_cast<int>(bus) == device(i)->pci_bus && slot == 0) {
      *dev = i;
      return CUDA_SUCCESS;
    }
  }
  return CUDA_ERROR_INVALID_DEVICE;
}

FC_API CUresult cuDeviceGetProperties(CUdevprop* prop, CUdevice dev) {
  FC_ENTER();
  if (CUresult rc = check_device(dev)) return rc;
  if (!prop) return CUDA_ERROR_INVALID_VALUE;
  const Device* d = device(dev);
  prop->maxThreadsPerBlock = 1024;
  prop->maxThreadsDim[0] = 1024;
  prop->maxThreadsDim[1] = 1024;
  prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = 2147483647;
  prop->maxGridSize[1] = 65535;
  prop->maxGridSize[2] = 65535;
  prop->sharedMemPerBlock = 49152;
  prop->totalConstantMemory = 65536;
  prop->SIMDWidth = 32;
  prop->memPitch = 2147483647;
  prop->regsPerBlock = 65536;
  prop->clockRate = 1980000;
  prop->textureAlign = 512;
  (void)d;
  return CUDA_SUCCESS;
}

FC_API CUresult cuDeviceCanAccessPeer(int* canAccessPeer, CUdevice dev, CUdevice peerDev) {
  FC_ENTER();
  if (CUresult rc = check_device(dev)) return rc;
  if (CUresult rc = check_device(peerDev)) return rc;
  if (!canAccessPeer) return CUDA_ERROR_INVALID_VALUE;
  *canAccessPeer = dev != peerDev ? 1 : 0;
  return CUDA_SUCCESS;
}

FC_API CUresult cuDeviceGetP2PAttribute(int* value, CUdevice_P2PAttribute attrib, CUdevice srcDevice,
                                        CUdevice dstDevice) {
  FC_ENTER();
  if (CUresult rc = check_device(srcDevice)) return rc;
  if (CUresult rc = check_device(dstDevice)) return rc;
  if (!value || srcDevice == dstDevice) return CUDA_ERROR_INVALID_DEVICE;
  *value = attrib == CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK ? 0 : 1;
  return CUDA_SUCCESS;
}

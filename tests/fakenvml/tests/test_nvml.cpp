// fakenvml unit tests: enumeration, identity, memory and processes, errors, versioned entry points.
// Machine (test_main.cpp): physical 0/1/2 of 64/32/16 MiB; CUDA_VISIBLE_DEVICES=2,0.
#include <cuda.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include <catch2/catch.hpp>

#include "fakecuda.h"
#include "fakenvml.h"

namespace {

constexpr size_t kMiB = size_t{1} << 20;

struct Session {
  Session() { REQUIRE(nvmlInit_v2() == NVML_SUCCESS); }
  ~Session() { CHECK(nvmlShutdown() == NVML_SUCCESS); }
};

nvmlDevice_t dev(unsigned i) {
  nvmlDevice_t d = nullptr;
  REQUIRE(nvmlDeviceGetHandleByIndex_v2(i, &d) == NVML_SUCCESS);
  return d;
}

std::string uuid_of(nvmlDevice_t d) {
  char buf[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
  REQUIRE(nvmlDeviceGetUUID(d, buf, sizeof buf) == NVML_SUCCESS);
  return buf;
}

CUcontext use_cuda(int ordinal) {
  REQUIRE(cuInit(0) == CUDA_SUCCESS);
  CUcontext ctx = nullptr;
  REQUIRE(cuDevicePrimaryCtxRetain(&ctx, ordinal) == CUDA_SUCCESS);
  REQUIRE(cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
  return ctx;
}

}  // namespace

TEST_CASE("calls before nvmlInit are NVML_ERROR_UNINITIALIZED, init and shutdown nest", "[nvml]") {
  unsigned n = 0;
  CHECK(nvmlDeviceGetCount_v2(&n) == NVML_ERROR_UNINITIALIZED);
  CHECK(nvmlShutdown() == NVML_ERROR_UNINITIALIZED);
  nvmlDevice_t d = nullptr;
  CHECK(nvmlDeviceGetHandleByIndex_v2(0, &d) == NVML_ERROR_UNINITIALIZED);
  REQUIRE(nvmlInit_v2() == NVML_SUCCESS);
  REQUIRE(nvmlInitWithFlags(0) == NVML_SUCCESS);
  REQUIRE(nvmlDeviceGetHandleByIndex_v2(0, &d) == NVML_SUCCESS);
  CHECK(nvmlShutdown() == NVML_SUCCESS);
  CHECK(nvmlDeviceGetCount_v2(&n) == NVML_SUCCESS);  // still one reference
  CHECK(nvmlShutdown() == NVML_SUCCESS);
  CHECK(nvmlDeviceGetCount_v2(&n) == NVML_ERROR_UNINITIALIZED);
  nvmlMemory_t m{};
  CHECK(nvmlDeviceGetMemoryInfo(d, &m) == NVML_ERROR_UNINITIALIZED);
  REQUIRE(nvmlInit() == NVML_SUCCESS);  // the legacy name works too
  CHECK(nvmlShutdown() == NVML_SUCCESS);
}

TEST_CASE("NVML enumerates physical devices with the driver's UUIDs, ignoring CUDA_VISIBLE_DEVICES", "[nvml]") {
  Session s;
  unsigned n = 0;
  REQUIRE(nvmlDeviceGetCount_v2(&n) == NVML_SUCCESS);
  CHECK(n == 3);
  unsigned legacy = 0;
  REQUIRE(nvmlDeviceGetCount(&legacy) == NVML_SUCCESS);
  CHECK(legacy == 3);
  CHECK(fakecuda_physical_count() == 3);

  CHECK(uuid_of(dev(0)) == "GPU-c0dafa7e-5a1e-4000-8000-000000000000");
  CHECK(uuid_of(dev(1)) == "GPU-12345678-9abc-def0-1234-56789abcdef0");
  CHECK(uuid_of(dev(2)) == "GPU-c0dafa7e-5a1e-4000-8000-000000000002");

  // The same UUIDs as the driver reports for the CUDA ordinals it shows.
  use_cuda(0);
  CUuuid u{};
  REQUIRE(cuDeviceGetUuid(&u, 0) == CUDA_SUCCESS);  // CUDA 0 = physical 2
  fakecuda_physical_device p{};
  REQUIRE(fakecuda_physical_info(2, &p) == 0);
  CHECK(std::memcmp(u.bytes, p.uuid_bytes, 16) == 0);
  CHECK(p.ordinal == 0);
  REQUIRE(fakecuda_physical_info(1, &p) == 0);
  CHECK(p.ordinal == -1);  // hidden from CUDA
  CHECK(fakecuda_physical_info(3, &p) == -1);

  for (unsigned i = 0; i < n; ++i) {
    unsigned idx = 99;
    REQUIRE(nvmlDeviceGetIndex(dev(i), &idx) == NVML_SUCCESS);
    CHECK(idx == i);
    nvmlDevice_t by_uuid = nullptr;
    REQUIRE(nvmlDeviceGetHandleByUUID(uuid_of(dev(i)).c_str(), &by_uuid) == NVML_SUCCESS);
    CHECK(by_uuid == dev(i));
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    REQUIRE(nvmlDeviceGetName(dev(i), name, sizeof name) == NVML_SUCCESS);
    CHECK(std::string(name) == "NVIDIA H200");
  }
  nvmlDevice_t d = nullptr;
  CHECK(nvmlDeviceGetHandleByUUID("GPU-ffffffff-ffff-ffff-ffff-ffffffffffff", &d) == NVML_ERROR_NOT_FOUND);
  CHECK(nvmlDeviceGetHandleByUUID(nullptr, &d) == NVML_ERROR_INVALID_ARGUMENT);
  CHECK(nvmlDeviceGetHandleByIndex_v2(3, &d) == NVML_ERROR_INVALID_ARGUMENT);
  CHECK(nvmlDeviceGetHandleByIndex_v2(0, nullptr) == NVML_ERROR_INVALID_ARGUMENT);
  CHECK(nvmlDeviceGetHandleByIndex(2, &d) == NVML_SUCCESS);
  CHECK(d == dev(2));
}

TEST_CASE("PCI info matches the driver's bus ids in every layout", "[nvml]") {
  Session s;
  use_cuda(1);  // CUDA 1 = physical 0
  char cuda_bus[32];
  REQUIRE(cuDeviceGetPCIBusId(cuda_bus, sizeof cuda_bus, 1) == CUDA_SUCCESS);
  nvmlPciInfo_t pci{};
  REQUIRE(nvmlDeviceGetPciInfo_v3(dev(0), &pci) == NVML_SUCCESS);
  CHECK(std::string(pci.busId) == cuda_bus);
  CHECK(std::string(pci.busIdLegacy) == std::string(cuda_bus).substr(4));
  CHECK(pci.bus == 0x18);
  CHECK(pci.domain == 0);
  CHECK(pci.pciDeviceId == 0x233510deu);
  nvmlPciInfo_t v2{};
  REQUIRE(nvmlDeviceGetPciInfo_v2(dev(0), &v2) == NVML_SUCCESS);
  CHECK(std::memcmp(&v2, &pci, sizeof pci) == 0);
  nvmlDevice_t d = nullptr;
  REQUIRE(nvmlDeviceGetHandleByPciBusId_v2(pci.busId, &d) == NVML_SUCCESS);
  CHECK(d == dev(0));
  REQUIRE(nvmlDeviceGetHandleByPciBusId_v2("0000:2a:00.0", &d) == NVML_SUCCESS);
  CHECK(d == dev(1));
  CHECK(nvmlDeviceGetHandleByPciBusId_v2("0000:77:00.0", &d) == NVML_ERROR_NOT_FOUND);

  // The unversioned call writes the 52-byte pre-v2 layout and nothing past it.
  unsigned char raw[sizeof(nvmlPciInfo_t)];
  std::memset(raw, 0xab, sizeof raw);
  REQUIRE(nvmlDeviceGetPciInfo(dev(2), reinterpret_cast<nvmlPciInfo_t*>(raw)) == NVML_SUCCESS);
  CHECK(std::string(reinterpret_cast<const char*>(raw)) == "0000:3A:00.0");
  unsigned bus = 0;
  std::memcpy(&bus, raw + 20, 4);
  CHECK(bus == 0x3a);
  CHECK(raw[52] == 0xab);
}

TEST_CASE("memory info: total is the capacity, used is the driver's live bytes on that physical device", "[nvml]") {
  Session s;
  use_cuda(0);  // CUDA 0 = physical 2 (16 MiB)
  nvmlMemory_t before{};
  REQUIRE(nvmlDeviceGetMemoryInfo(dev(2), &before) == NVML_SUCCESS);
  CHECK(before.total == 16 * kMiB);
  CHECK(before.used == fakecuda_live_bytes(0));
  CHECK(before.free + before.used == before.total);

  CUdeviceptr p = 0;
  REQUIRE(cuMemAlloc(&p, 3 * kMiB) == CUDA_SUCCESS);
  nvmlMemory_t after{};
  REQUIRE(nvmlDeviceGetMemoryInfo(dev(2), &after) == NVML_SUCCESS);
  CHECK(after.used - before.used == 3 * kMiB);
  CHECK(after.used == fakecuda_physical_live_bytes(2));
  size_t cu_free = 0, cu_total = 0;
  REQUIRE(cuMemGetInfo(&cu_free, &cu_total) == CUDA_SUCCESS);
  CHECK(after.free == cu_free);
  CHECK(after.total == cu_total);

  nvmlMemory_v2_t v2{};
  v2.version = nvmlMemory_v2;
  REQUIRE(nvmlDeviceGetMemoryInfo_v2(dev(2), &v2) == NVML_SUCCESS);
  CHECK(v2.total == 16 * kMiB);
  CHECK(v2.used == after.used);
  CHECK(v2.free == after.free);
  CHECK(v2.reserved == 0);
  CHECK(v2.version == nvmlMemory_v2);
  nvmlMemory_v2_t wrong{};
  wrong.version = 1;
  CHECK(nvmlDeviceGetMemoryInfo_v2(dev(2), &wrong) == NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
  CHECK(nvmlDeviceGetMemoryInfo_v2(dev(2), nullptr) == NVML_ERROR_INVALID_ARGUMENT);
  CHECK(nvmlDeviceGetMemoryInfo(dev(2), nullptr) == NVML_ERROR_INVALID_ARGUMENT);

  // The other devices did not move: physical 0 is CUDA 1, physical 1 hidden.
  nvmlMemory_t m0{}, m1{};
  REQUIRE(nvmlDeviceGetMemoryInfo(dev(0), &m0) == NVML_SUCCESS);
  REQUIRE(nvmlDeviceGetMemoryInfo(dev(1), &m1) == NVML_SUCCESS);
  CHECK(m0.total == 64 * kMiB);
  CHECK(m0.used == fakecuda_live_bytes(1));
  CHECK(m1.total == 32 * kMiB);
  CHECK(m1.used == 0);

  REQUIRE(cuMemFree(p) == CUDA_SUCCESS);
  REQUIRE(nvmlDeviceGetMemoryInfo(dev(2), &after) == NVML_SUCCESS);
  CHECK(after.used == before.used);
  CHECK(fakenvml_call_count("nvmlDeviceGetMemoryInfo") >= 4);
  CHECK(fakenvml_call_count("nvmlDeviceGetMemoryInfo_v2") >= 3);
}

TEST_CASE("compute processes: this process while it has bytes on the device, else none", "[nvml]") {
  Session s;
  use_cuda(1);  // CUDA 1 = physical 0
  REQUIRE(fakecuda_live_bytes(1) == 0);
  unsigned count = 0;
  CHECK(nvmlDeviceGetComputeRunningProcesses_v3(dev(0), &count, nullptr) == NVML_SUCCESS);
  CHECK(count == 0);

  CUdeviceptr p = 0;
  REQUIRE(cuMemAlloc(&p, 5 * kMiB) == CUDA_SUCCESS);
  count = 0;
  CHECK(nvmlDeviceGetComputeRunningProcesses_v3(dev(0), &count, nullptr) == NVML_ERROR_INSUFFICIENT_SIZE);
  CHECK(count == 1);
  nvmlProcessInfo_t infos[4];
  count = 4;
  REQUIRE(nvmlDeviceGetComputeRunningProcesses_v3(dev(0), &count, infos) == NVML_SUCCESS);
  REQUIRE(count == 1);
  CHECK(infos[0].pid == static_cast<unsigned>(getpid()));
  CHECK(infos[0].usedGpuMemory == 5 * kMiB);
  CHECK(infos[0].gpuInstanceId == 0xFFFFFFFFu);
  CHECK(infos[0].computeInstanceId == 0xFFFFFFFFu);

  nvmlProcessInfo_v2_t v2[2];
  count = 2;
  REQUIRE(nvmlDeviceGetComputeRunningProcesses_v2(dev(0), &count, v2) == NVML_SUCCESS);
  CHECK(count == 1);
  CHECK(v2[0].usedGpuMemory == 5 * kMiB);
  nvmlProcessInfo_v1_t v1[2];
  count = 2;
  REQUIRE(nvmlDeviceGetComputeRunningProcesses(dev(0), &count, v1) == NVML_SUCCESS);
  CHECK(count == 1);
  CHECK(v1[0].pid == static_cast<unsigned>(getpid()));
  CHECK(v1[0].usedGpuMemory == 5 * kMiB);

  // Not on the other devices, and never among graphics processes.
  count = 4;
  REQUIRE(nvmlDeviceGetComputeRunningProcesses_v3(dev(1), &count, infos) == NVML_SUCCESS);
  CHECK(count == 0);
  count = 4;
  REQUIRE(nvmlDeviceGetGraphicsRunningProcesses_v3(dev(0), &count, infos) == NVML_SUCCESS);
  CHECK(count == 0);

  REQUIRE(cuMemFree(p) == CUDA_SUCCESS);
  count = 4;
  REQUIRE(nvmlDeviceGetComputeRunningProcesses_v3(dev(0), &count, infos) == NVML_SUCCESS);
  CHECK(count == 0);
  CHECK(nvmlDeviceGetComputeRunningProcesses_v3(dev(0), nullptr, infos) == NVML_ERROR_INVALID_ARGUMENT);
}

TEST_CASE("CUDA arrays show in NVML's used memory like any allocation", "[nvml]") {
  Session s;
  use_cuda(0);  // physical 2
  nvmlMemory_t before{};
  REQUIRE(nvmlDeviceGetMemoryInfo(dev(2), &before) == NVML_SUCCESS);
  CUDA_ARRAY_DESCRIPTOR d{};
  d.Width = 512;
  d.Height = 512;
  d.Format = CU_AD_FORMAT_FLOAT;
  d.NumChannels = 1;
  CUarray a = nullptr;
  REQUIRE(cuArrayCreate(&a, &d) == CUDA_SUCCESS);
  nvmlMemory_t after{};
  REQUIRE(nvmlDeviceGetMemoryInfo(dev(2), &after) == NVML_SUCCESS);
  CHECK(after.used - before.used == fakecuda_array_bytes(a));
  CHECK(fakecuda_array_bytes(a) == kMiB);
  REQUIRE(cuArrayDestroy(a) == CUDA_SUCCESS);
}

TEST_CASE("strings: sizes, errors, versions", "[nvml]") {
  Session s;
  char small[8];
  CHECK(nvmlDeviceGetUUID(dev(0), small, sizeof small) == NVML_ERROR_INSUFFICIENT_SIZE);
  CHECK(nvmlDeviceGetName(dev(0), small, 4) == NVML_ERROR_INSUFFICIENT_SIZE);
  CHECK(nvmlDeviceGetUUID(dev(0), nullptr, 80) == NVML_ERROR_INVALID_ARGUMENT);
  char buf[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE];
  REQUIRE(nvmlSystemGetDriverVersion(buf, sizeof buf) == NVML_SUCCESS);
  CHECK(std::string(buf) == "580.65.06");
  CHECK(nvmlSystemGetDriverVersion(small, 3) == NVML_ERROR_INSUFFICIENT_SIZE);
  int cuda = 0;
  REQUIRE(nvmlSystemGetCudaDriverVersion_v2(&cuda) == NVML_SUCCESS);
  CHECK(cuda == 13000);
  CHECK(std::string(nvmlErrorString(NVML_SUCCESS)) == "Success");
  CHECK(std::string(nvmlErrorString(NVML_ERROR_INSUFFICIENT_SIZE)) == "Insufficient Size");
  CHECK(std::string(nvmlErrorString(static_cast<nvmlReturn_t>(12345))) == "Unknown Error");

  // A handle that is not one of NVML's.
  int junk = 0;
  auto bad = reinterpret_cast<nvmlDevice_t>(&junk);
  nvmlMemory_t m{};
  CHECK(nvmlDeviceGetMemoryInfo(bad, &m) == NVML_ERROR_INVALID_ARGUMENT);
  CHECK(nvmlDeviceGetMemoryInfo(nullptr, &m) == NVML_ERROR_INVALID_ARGUMENT);
  char u[80];
  CHECK(nvmlDeviceGetUUID(bad, u, sizeof u) == NVML_ERROR_INVALID_ARGUMENT);
  int major = 0, minor = 0;
  REQUIRE(nvmlDeviceGetCudaComputeCapability(dev(0), &major, &minor) == NVML_SUCCESS);
  CHECK(major == 9);
  CHECK(minor == 0);
}

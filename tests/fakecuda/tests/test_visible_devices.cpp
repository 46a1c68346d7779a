// fakecuda unit tests: device list, CUDA_VISIBLE_DEVICES parsing like the driver.
#include <string>
#include <vector>

#include "helpers.hpp"

namespace {
const char* const kUuids[] = {"GPU-c0dafa7e-5a1e-4000-8000-000000000000", "GPU-c0dafa7e-5a1e-4000-8000-000000000001",
                              "GPU-11111111-2222-3333-4444-555555555555", "GPU-c0dafa7e-5a1e-4000-8000-000000000003"};

std::vector<int> parse(const char* spec) {
  int out[8];
  int n = fakecuda_parse_visible_devices(spec, 4, kUuids, out, 8);
  return std::vector<int>(out, out + n);
}
}  // namespace

TEST_CASE("CUDA_VISIBLE_DEVICES: indices, reordering, stopping at the first invalid entry", "[devices]") {
  CHECK(parse(nullptr) == std::vector<int>{0, 1, 2, 3});
  CHECK(parse("").empty());
  CHECK(parse("2,0") == std::vector<int>{2, 0});
  CHECK(parse("1, 3") == std::vector<int>{1, 3});
  CHECK(parse("0,7,1") == std::vector<int>{0});
  CHECK(parse("-1,0").empty());
  CHECK(parse("1abc,0").empty());
  CHECK(parse("1,1,2") == std::vector<int>{1});
  CHECK(parse("3,") == std::vector<int>{3});
}

TEST_CASE("CUDA_VISIBLE_DEVICES: UUIDs and unique prefixes", "[devices]") {
  CHECK(parse("GPU-11111111-2222-3333-4444-555555555555") == std::vector<int>{2});
  CHECK(parse("GPU-1111,0") == std::vector<int>{2, 0});
  CHECK(parse("gpu-c0dafa7e-5a1e-4000-8000-000000000003") == std::vector<int>{3});
  CHECK(parse("GPU-c0da").empty());  // ambiguous prefix
  CHECK(parse("1,GPU-ffff").size() == 1);
  CHECK(parse("11111111").empty());  // without GPU- it is a (bad) index
}

TEST_CASE("devices come from CUWARDEN_FAKE_DEVICES and CUWARDEN_FAKE_MEMORY", "[devices]") {
  REQUIRE(cuInit(0) == CUDA_SUCCESS);
  CHECK(cuInit(1) == CUDA_ERROR_INVALID_VALUE);
  int n = 0;
  REQUIRE(cuDeviceGetCount(&n) == CUDA_SUCCESS);
  CHECK(n == 2);
  size_t total = 0;
  REQUIRE(cuDeviceTotalMem(&total, 0) == CUDA_SUCCESS);
  CHECK(total == 64 * kMiB);
  REQUIRE(cuDeviceTotalMem(&total, 1) == CUDA_SUCCESS);
  CHECK(total == 32 * kMiB);
  CUuuid a, b;
  REQUIRE(cuDeviceGetUuid(&a, 0) == CUDA_SUCCESS);
  REQUIRE(cuDeviceGetUuid(&b, 1) == CUDA_SUCCESS);
  CHECK(std::string(a.bytes, 16) != std::string(b.bytes, 16));
  int v = 0;
  REQUIRE(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 0) == CUDA_SUCCESS);
  CHECK(v == 9);
  REQUIRE(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 0) == CUDA_SUCCESS);
  CHECK(v == 132);
  REQUIRE(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, 0) == CUDA_SUCCESS);
  CHECK(v == 1);
  int bus0 = 0, bus1 = 0;
  REQUIRE(cuDeviceGetAttribute(&bus0, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, 0) == CUDA_SUCCESS);
  REQUIRE(cuDeviceGetAttribute(&bus1, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, 1) == CUDA_SUCCESS);
  CHECK(bus0 != bus1);
  CHECK(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MAX, 0) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_WARP_SIZE, 2) == CUDA_ERROR_INVALID_DEVICE);
  char bus[32];
  REQUIRE(cuDeviceGetPCIBusId(bus, sizeof bus, 1) == CUDA_SUCCESS);
  CUdevice d = -1;
  REQUIRE(cuDeviceGetByPCIBusId(&d, bus) == CUDA_SUCCESS);
  CHECK(d == 1);
}

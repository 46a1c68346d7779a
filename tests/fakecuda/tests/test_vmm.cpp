// fakecuda unit tests: virtual memory management.
#include <cstring>

#include "helpers.hpp"

namespace {
CUmemAllocationProp device_prop(int ordinal) {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = ordinal;
  return prop;
}
}  // namespace

TEST_CASE("VMM granularity is 2 MiB and sizes must be multiples of it", "[vmm]") {
  use_device(0);
  CUmemAllocationProp prop = device_prop(0);
  size_t g = 0;
  REQUIRE(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) == CUDA_SUCCESS);
  CHECK(g == 2 * kMiB);
  REQUIRE(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) == CUDA_SUCCESS);
  CHECK(g == 2 * kMiB);
  CUmemGenericAllocationHandle h;
  CHECK(cuMemCreate(&h, kMiB, &prop, 0) == CUDA_ERROR_INVALID_VALUE);
  CUdeviceptr va;
  CHECK(cuMemAddressReserve(&va, 3 * kMiB, 0, 0, 0) == CUDA_ERROR_INVALID_VALUE);
}

TEST_CASE("two mappings of one handle share bytes, memory is freed after release and unmap", "[vmm]") {
  use_device(0);
  CUmemAllocationProp prop = device_prop(0);
  size_t live0 = fakecuda_live_bytes(0);
  CUmemGenericAllocationHandle h;
  REQUIRE(cuMemCreate(&h, 2 * kMiB, &prop, 0) == CUDA_SUCCESS);
  CHECK(fakecuda_live_bytes(0) == live0 + 2 * kMiB);
  CUdeviceptr va;
  REQUIRE(cuMemAddressReserve(&va, 8 * kMiB, 4 * kMiB, 0, 0) == CUDA_SUCCESS);
  CHECK(va % (4 * kMiB) == 0);
  REQUIRE(cuMemMap(va, 2 * kMiB, 0, h, 0) == CUDA_SUCCESS);
  REQUIRE(cuMemMap(va + 4 * kMiB, 2 * kMiB, 0, h, 0) == CUDA_SUCCESS);
  CHECK(cuMemMap(va, 2 * kMiB, 0, h, 0) == CUDA_ERROR_ALREADY_MAPPED);
  CUmemAccessDesc access = {};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  REQUIRE(cuMemSetAccess(va, 2 * kMiB, &access, 1) == CUDA_SUCCESS);
  REQUIRE(cuMemSetAccess(va + 4 * kMiB, 2 * kMiB, &access, 1) == CUDA_SUCCESS);
  CHECK(cuMemSetAccess(va + 2 * kMiB, 2 * kMiB, &access, 1) == CUDA_ERROR_INVALID_VALUE);  // not mapped
  std::memset(reinterpret_cast<void*>(va), 0x5a, 4096);
  CHECK(*reinterpret_cast<unsigned char*>(va + 4 * kMiB + 100) == 0x5a);

  CUdeviceptr base;
  size_t size;
  REQUIRE(cuMemGetAddressRange(&base, &size, va + 4 * kMiB + 7) == CUDA_SUCCESS);
  CHECK(base == va + 4 * kMiB);
  CHECK(size == 2 * kMiB);
  CUmemAllocationProp got = {};
  REQUIRE(cuMemGetAllocationPropertiesFromHandle(&got, h) == CUDA_SUCCESS);
  CHECK(got.location.id == 0);
  CUmemGenericAllocationHandle again;
  REQUIRE(cuMemRetainAllocationHandle(&again, reinterpret_cast<void*>(va + 5)) == CUDA_SUCCESS);
  CHECK(again == h);
  REQUIRE(cuMemRelease(again) == CUDA_SUCCESS);

  REQUIRE(cuMemRelease(h) == CUDA_SUCCESS);
  CHECK(fakecuda_live_bytes(0) == live0 + 2 * kMiB);  // still mapped
  REQUIRE(cuMemUnmap(va, 2 * kMiB) == CUDA_SUCCESS);
  CHECK(*reinterpret_cast<unsigned char*>(va + 4 * kMiB + 100) == 0x5a);
  REQUIRE(cuMemUnmap(va + 4 * kMiB, 2 * kMiB) == CUDA_SUCCESS);
  CHECK(fakecuda_live_bytes(0) == live0);
  REQUIRE(cuMemAddressFree(va, 8 * kMiB) == CUDA_SUCCESS);
}

TEST_CASE("VMM device memory counts against capacity, host memory does not", "[vmm]") {
  use_device(1);
  CUmemAllocationProp prop = device_prop(1);
  std::vector<CUmemGenericAllocationHandle> hs;
  CUmemGenericAllocationHandle h;
  while (cuMemCreate(&h, 2 * kMiB, &prop, 0) == CUDA_SUCCESS) hs.push_back(h);
  CHECK(hs.size() == 16);  // 32 MiB device
  CUdeviceptr p;
  CHECK(cuMemAlloc(&p, 512) == CUDA_ERROR_OUT_OF_MEMORY);
  CUmemAllocationProp host = {};
  host.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  host.location.type = CU_MEM_LOCATION_TYPE_HOST;
  REQUIRE(cuMemCreate(&h, 2 * kMiB, &host, 0) == CUDA_SUCCESS);
  REQUIRE(cuMemRelease(h) == CUDA_SUCCESS);
  for (auto x : hs) REQUIRE(cuMemRelease(x) == CUDA_SUCCESS);
  CHECK(fakecuda_live_bytes(1) == 0);
}

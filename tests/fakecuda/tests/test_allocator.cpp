// fakecuda unit tests: the device arena — first fit, coalescing, fragmentation, errors, threads.
// Devices (set by test_main.cpp): two, of 64 MiB and 32 MiB.
#include <thread>
#include <vector>

#include "helpers.hpp"

TEST_CASE("allocations are 512-byte aligned and accounted in 512-byte granules", "[allocator]") {
  use_device(1);
  size_t free0, total;
  REQUIRE(cuMemGetInfo(&free0, &total) == CUDA_SUCCESS);
  CHECK(total == 32 * kMiB);
  CUdeviceptr p;
  REQUIRE(cuMemAlloc(&p, 1) == CUDA_SUCCESS);
  CHECK(p % 512 == 0);
  size_t free1;
  REQUIRE(cuMemGetInfo(&free1, &total) == CUDA_SUCCESS);
  CHECK(free0 - free1 == 512);
  CHECK(fakecuda_live_bytes(1) == 32 * kMiB - free1);
  REQUIRE(cuMemFree(p) == CUDA_SUCCESS);
  REQUIRE(cuMemGetInfo(&free1, &total) == CUDA_SUCCESS);
  CHECK(free1 == free0);
}

TEST_CASE("first fit reuses the lowest hole that is large enough", "[allocator]") {
  use_device(1);
  CUdeviceptr a, b, c, d, e;
  REQUIRE(cuMemAlloc(&a, kMiB) == CUDA_SUCCESS);
  REQUIRE(cuMemAlloc(&b, kMiB) == CUDA_SUCCESS);
  REQUIRE(cuMemAlloc(&c, kMiB) == CUDA_SUCCESS);
  CHECK(b == a + kMiB);
  CHECK(c == b + kMiB);
  REQUIRE(cuMemFree(b) == CUDA_SUCCESS);
  REQUIRE(cuMemAlloc(&d, kMiB / 2) == CUDA_SUCCESS);
  CHECK(d == b);  // first hole
  REQUIRE(cuMemAlloc(&e, kMiB) == CUDA_SUCCESS);
  CHECK(e == c + kMiB);  // the rest of the hole is too small
  for (CUdeviceptr p : {a, c, d, e}) REQUIRE(cuMemFree(p) == CUDA_SUCCESS);
}

TEST_CASE("adjacent free blocks coalesce", "[allocator]") {
  use_device(1);
  size_t blocks0 = fakecuda_free_block_count(1);
  CUdeviceptr a, b, c, big;
  REQUIRE(cuMemAlloc(&a, kMiB) == CUDA_SUCCESS);
  REQUIRE(cuMemAlloc(&b, kMiB) == CUDA_SUCCESS);
  REQUIRE(cuMemAlloc(&c, kMiB) == CUDA_SUCCESS);
  REQUIRE(cuMemFree(a) == CUDA_SUCCESS);
  REQUIRE(cuMemFree(c) == CUDA_SUCCESS);  // merges with the free tail
  CHECK(fakecuda_free_block_count(1) == blocks0 + 1);
  REQUIRE(cuMemFree(b) == CUDA_SUCCESS);  // merges a, b and the tail into one block
  CHECK(fakecuda_free_block_count(1) == blocks0);
  REQUIRE(cuMemAlloc(&big, 3 * kMiB) == CUDA_SUCCESS);
  CHECK(big == a);
  REQUIRE(cuMemFree(big) == CUDA_SUCCESS);
}

TEST_CASE("fragmentation makes an allocation fail although enough bytes are free", "[allocator]") {
  use_device(1);
  std::vector<CUdeviceptr> blocks;
  CUdeviceptr p;
  while (cuMemAlloc(&p, kMiB) == CUDA_SUCCESS) blocks.push_back(p);
  REQUIRE(blocks.size() == 32);
  CHECK(cuMemAlloc(&p, 512) == CUDA_ERROR_OUT_OF_MEMORY);
  for (size_t i = 0; i < blocks.size(); i += 2) REQUIRE(cuMemFree(blocks[i]) == CUDA_SUCCESS);
  size_t free_mem, total;
  REQUIRE(cuMemGetInfo(&free_mem, &total) == CUDA_SUCCESS);
  CHECK(free_mem == 16 * kMiB);
  CHECK(cuMemAlloc(&p, 2 * kMiB) == CUDA_ERROR_OUT_OF_MEMORY);
  REQUIRE(cuMemAlloc(&p, kMiB) == CUDA_SUCCESS);  // a hole of exactly 1 MiB still fits
  REQUIRE(cuMemFree(p) == CUDA_SUCCESS);
  for (size_t i = 1; i < blocks.size(); i += 2) REQUIRE(cuMemFree(blocks[i]) == CUDA_SUCCESS);
  REQUIRE(cuMemAlloc(&p, 32 * kMiB) == CUDA_SUCCESS);  // everything coalesced again
  REQUIRE(cuMemFree(p) == CUDA_SUCCESS);
}

TEST_CASE("allocation errors match the driver", "[allocator]") {
  use_device(0);
  CUdeviceptr p;
  CHECK(cuMemAlloc(&p, 0) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemAlloc(nullptr, 16) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemAlloc(&p, 65 * kMiB) == CUDA_ERROR_OUT_OF_MEMORY);
  CHECK(cuMemFree(0x1234) == CUDA_ERROR_INVALID_VALUE);
  REQUIRE(cuMemAlloc(&p, 4096) == CUDA_SUCCESS);
  CHECK(cuMemFree(p + 512) == CUDA_ERROR_INVALID_VALUE);  // not the start
  REQUIRE(cuMemFree(p) == CUDA_SUCCESS);
  CHECK(cuMemFree(p) == CUDA_ERROR_INVALID_VALUE);  // double free
  CUdeviceptr base;
  size_t size;
  CHECK(cuMemGetAddressRange(&base, &size, p) == CUDA_ERROR_NOT_FOUND);
  std::thread([] {
    CUdeviceptr q;
    CHECK(cuMemAlloc(&q, 16) == CUDA_ERROR_INVALID_CONTEXT);  // no current context here
    size_t f, t;
    CHECK(cuMemGetInfo(&f, &t) == CUDA_ERROR_INVALID_CONTEXT);
  }).join();
  size_t f;
  CHECK(cuMemGetInfo(nullptr, nullptr) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemGetInfo(&f, nullptr) == CUDA_SUCCESS);
}

TEST_CASE("pitch is rounded up to 512 bytes", "[allocator]") {
  use_device(0);
  CUdeviceptr p;
  size_t pitch = 0;
  REQUIRE(cuMemAllocPitch(&p, &pitch, 1000, 10, 4) == CUDA_SUCCESS);
  CHECK(pitch == 1024);
  CUdeviceptr base;
  size_t size;
  REQUIRE(cuMemGetAddressRange(&base, &size, p + 5000) == CUDA_SUCCESS);
  CHECK(base == p);
  CHECK(size == 10240);
  REQUIRE(cuMemFree(p) == CUDA_SUCCESS);
}

TEST_CASE("pointer attributes describe device, managed and host memory", "[allocator]") {
  CUcontext ctx = use_device(0);
  CUdeviceptr d, m;
  void* h;
  REQUIRE(cuMemAlloc(&d, 1000) == CUDA_SUCCESS);
  REQUIRE(cuMemAllocManaged(&m, 1000, CU_MEM_ATTACH_GLOBAL) == CUDA_SUCCESS);
  REQUIRE(cuMemAllocHost(&h, 1000) == CUDA_SUCCESS);
  CUcontext got_ctx = nullptr;
  unsigned type = 0;
  int ordinal = -1, managed = -1, mapped = 0;
  CUdeviceptr start = 0;
  size_t range = 0;
  CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_CONTEXT,          CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                 CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,   CU_POINTER_ATTRIBUTE_IS_MANAGED,
                                 CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                                 CU_POINTER_ATTRIBUTE_MAPPED};
  void* data[] = {&got_ctx, &type, &ordinal, &managed, &start, &range, &mapped};
  REQUIRE(cuPointerGetAttributes(7, attrs, data, d + 100) == CUDA_SUCCESS);
  CHECK(got_ctx == ctx);
  CHECK(type == CU_MEMORYTYPE_DEVICE);
  CHECK(ordinal == 0);
  CHECK(managed == 0);
  CHECK(start == d);
  CHECK(range == 1000);
  CHECK(mapped == 1);
  REQUIRE(cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, m) == CUDA_SUCCESS);
  CHECK(managed == 1);
  REQUIRE(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, reinterpret_cast<CUdeviceptr>(h)) ==
          CUDA_SUCCESS);
  CHECK(type == CU_MEMORYTYPE_HOST);
  int local = 0;
  CHECK(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, reinterpret_cast<CUdeviceptr>(&local)) ==
        CUDA_ERROR_INVALID_VALUE);
  REQUIRE(cuPointerGetAttributes(7, attrs, data, reinterpret_cast<CUdeviceptr>(&local)) == CUDA_SUCCESS);
  CHECK(got_ctx == nullptr);
  CHECK(type == 0);
  // Registered host memory.
  std::vector<char> buf(8192);
  REQUIRE(cuMemHostRegister(buf.data(), buf.size(), 0) == CUDA_SUCCESS);
  CHECK(cuMemHostRegister(buf.data() + 100, 10, 0) == CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
  REQUIRE(cuMemHostUnregister(buf.data()) == CUDA_SUCCESS);
  CHECK(cuMemHostUnregister(buf.data()) == CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
  REQUIRE(cuMemFree(d) == CUDA_SUCCESS);
  REQUIRE(cuMemFree(m) == CUDA_SUCCESS);
  REQUIRE(cuMemFreeHost(h) == CUDA_SUCCESS);
  CHECK(cuMemFreeHost(h) == CUDA_ERROR_INVALID_VALUE);
}

TEST_CASE("16 threads allocate and free concurrently", "[allocator][threads]") {
  use_device(0);
  size_t free0, total;
  REQUIRE(cuMemGetInfo(&free0, &total) == CUDA_SUCCESS);
  CUcontext ctx;
  REQUIRE(cuCtxGetCurrent(&ctx) == CUDA_SUCCESS);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 16; ++t) {
    threads.emplace_back([ctx, t, &failures] {
      if (cuCtxSetCurrent(ctx) != CUDA_SUCCESS) ++failures;
      std::vector<CUdeviceptr> mine;
      for (int i = 0; i < 200; ++i) {
        CUdeviceptr p;
        size_t bytes = 512 * static_cast<size_t>(1 + (i * 7 + t) % 16);
        if (cuMemAlloc(&p, bytes) != CUDA_SUCCESS) {
          ++failures;
          continue;
        }
        *reinterpret_cast<volatile char*>(p) = static_cast<char>(t);  // real host memory
        mine.push_back(p);
        if (i % 3 == 0) {
          if (cuMemFree(mine.front()) != CUDA_SUCCESS) ++failures;
          mine.erase(mine.begin());
        }
      }
      for (CUdeviceptr p : mine)
        if (cuMemFree(p) != CUDA_SUCCESS) ++failures;
    });
  }
  for (auto& th : threads) th.join();
  CHECK(failures == 0);
  size_t free1;
  REQUIRE(cuMemGetInfo(&free1, &total) == CUDA_SUCCESS);
  CHECK(free1 == free0);
}

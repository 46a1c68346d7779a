// Interposer tests: the entry points beyond plain allocations (pinned host memory, graph
// memory nodes, CUDA arrays) and the lookup paths beyond dlsym (dlvsym, RTLD_NEXT chains).
// Runs with CUWARDEN_LIMIT=64MiB.
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "fakecuda.h"
#include "support.hpp"

using namespace cuwtest;

extern "C" void* cuwt_lookup_next(const char* name);
extern "C" void* cuwt_lookup_next_v(const char* name);

namespace {
using cuwtest::kMiB;

bool in_cuwarden(void* p) {
  Dl_info info{};
  return p && dladdr(p, &info) && std::string(info.dli_fname).find("libcuwarden") != std::string::npos;
}
}  // namespace

TEST_CASE("pinned host memory is tracked and shown, never capped", "[coverage][host]") {
  make_context();
  touch_interposer();
  auto& d = dev_counters();
  void* a = nullptr;
  void* b = nullptr;
  REQUIRE(cuMemHostAlloc(&a, 100 * kMiB, 0) == CUDA_SUCCESS);  // more than the 64 MiB cap
  CHECK(d.host_bytes.load() == 100 * kMiB);
  REQUIRE(cuMemAllocHost(&b, 3 * kMiB) == CUDA_SUCCESS);
  CHECK(d.host_bytes.load() == 103 * kMiB);
  CHECK(used() == 0);

  const size_t reg_bytes = 4 * kMiB;
  void* buf = std::aligned_alloc(4096, reg_bytes);
  REQUIRE(buf);
  REQUIRE(cuMemHostRegister(buf, reg_bytes, 0) == CUDA_SUCCESS);
  CHECK(d.host_bytes.load() == 107 * kMiB);
  REQUIRE(cuMemHostUnregister(buf) == CUDA_SUCCESS);
  std::free(buf);

  REQUIRE(cuMemFreeHost(a) == CUDA_SUCCESS);
  REQUIRE(cuMemFreeHost(b) == CUDA_SUCCESS);
  CHECK(d.host_bytes.load() == 0);
  CHECK(cuMemFreeHost(a) != CUDA_SUCCESS);  // double free: the driver's error, nothing counted
  CHECK(d.host_bytes.load() == 0);
}

TEST_CASE("graph memory nodes count against the cap while the graph holds them", "[coverage][graph]") {
  make_context();
  touch_interposer();
  CUgraph graph = nullptr;
  REQUIRE(cuGraphCreate(&graph, 0) == CUDA_SUCCESS);
  CUDA_MEM_ALLOC_NODE_PARAMS p{};
  p.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.poolProps.location.id = 0;
  p.bytesize = 8 * kMiB;
  CUgraphNode alloc_node = nullptr, free_node = nullptr;
  REQUIRE(cuGraphAddMemAllocNode(&alloc_node, graph, nullptr, 0, &p) == CUDA_SUCCESS);
  CHECK(p.dptr != 0);
  CHECK(used() == 8 * kMiB);

  CUDA_MEM_ALLOC_NODE_PARAMS big = p;
  big.dptr = 0;
  big.bytesize = 60 * kMiB;
  CUgraphNode refused = nullptr;
  CHECK(cuGraphAddMemAllocNode(&refused, graph, &alloc_node, 1, &big) == CUDA_ERROR_OUT_OF_MEMORY);
  CHECK(used() == 8 * kMiB);

  REQUIRE(cuGraphAddMemFreeNode(&free_node, graph, &alloc_node, 1, p.dptr) == CUDA_SUCCESS);
  CHECK(used() == 0);
  REQUIRE(cuGraphDestroy(graph) == CUDA_SUCCESS);
}

TEST_CASE("CUDA arrays count what the driver allocates for them", "[coverage][arrays]") {
  make_context();
  touch_interposer();
  CUDA_ARRAY_DESCRIPTOR d2{};
  d2.Width = 1024;
  d2.Height = 1024;
  d2.Format = CU_AD_FORMAT_FLOAT;
  d2.NumChannels = 2;
  CUarray a = nullptr;
  REQUIRE(cuArrayCreate(&a, &d2) == CUDA_SUCCESS);
  CHECK(used() == fakecuda_array_bytes(a));
  CHECK(used() == 8 * kMiB);

  CUDA_ARRAY3D_DESCRIPTOR d3{};
  d3.Width = 256;
  d3.Height = 256;
  d3.Depth = 64;
  d3.Format = CU_AD_FORMAT_UNSIGNED_INT8;
  d3.NumChannels = 4;
  CUarray b = nullptr;
  REQUIRE(cuArray3DCreate(&b, &d3) == CUDA_SUCCESS);
  CHECK(used() == fakecuda_array_bytes(a) + fakecuda_array_bytes(b));

  CUmipmappedArray m = nullptr;
  d3.Depth = 0;
  REQUIRE(cuMipmappedArrayCreate(&m, &d3, 5) == CUDA_SUCCESS);
  CHECK(used() == fakecuda_array_bytes(a) + fakecuda_array_bytes(b) + fakecuda_mipmapped_array_bytes(m));

  // An array past the cap is refused before the driver sees it.
  CUDA_ARRAY_DESCRIPTOR huge = d2;
  huge.Width = 8192;
  huge.Height = 8192;  // 512 MiB
  CUarray c = nullptr;
  fakecuda_reset_counters();
  CHECK(cuArrayCreate(&c, &huge) == CUDA_ERROR_OUT_OF_MEMORY);
  CHECK(fakecuda_call_count("cuArrayCreate") == 0);

  // Layered mipmaps keep their layer count at every level.
  CUDA_ARRAY3D_DESCRIPTOR layered = d3;
  layered.Depth = 6;
  layered.Flags = CUDA_ARRAY3D_LAYERED;
  CUmipmappedArray lm = nullptr;
  const uint64_t before_layered = used();
  REQUIRE(cuMipmappedArrayCreate(&lm, &layered, 4) == CUDA_SUCCESS);
  CHECK(used() - before_layered == fakecuda_mipmapped_array_bytes(lm));

  // Sparse arrays take no memory until memory is mapped into them.
  CUDA_ARRAY3D_DESCRIPTOR sparse = d3;
  sparse.Depth = 16;
  sparse.Flags = CUDA_ARRAY3D_SPARSE;
  CUarray sp = nullptr;
  const uint64_t before_sparse = used();
  REQUIRE(cuArray3DCreate(&sp, &sparse) == CUDA_SUCCESS);
  CHECK(used() == before_sparse);
  CHECK(fakecuda_array_bytes(sp) == 0);
  REQUIRE(cuArrayDestroy(sp) == CUDA_SUCCESS);

  REQUIRE(cuArrayDestroy(a) == CUDA_SUCCESS);
  REQUIRE(cuArrayDestroy(b) == CUDA_SUCCESS);
  REQUIRE(cuMipmappedArrayDestroy(m) == CUDA_SUCCESS);
  REQUIRE(cuMipmappedArrayDestroy(lm) == CUDA_SUCCESS);
  CHECK(used() == 0);
}

TEST_CASE("dlvsym redirects hooked names and finds our dlsym under both glibc versions", "[coverage][dlvsym]") {
  make_context();
  touch_interposer();
  void* h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  REQUIRE(h);
  // Whatever glibc answers for a versioned lookup of a hooked name, the real driver
  // function never leaks out: either nothing, or our wrapper.
  void* via_v = dlvsym(h, "cuMemAlloc_v2", "libcuda.so.1");
  CHECK((via_v == nullptr || via_v == dlsym(h, "cuMemAlloc_v2")));
  CHECK_FALSE(in_cuwarden(dlvsym(h, "cuCtxGetDevice", "libcuda.so.1")));
  // Our dlsym answers for both version nodes glibc has had on x86-64.
  CHECK(in_cuwarden(dlvsym(RTLD_DEFAULT, "dlsym", "GLIBC_2.34")));
  CHECK(in_cuwarden(dlvsym(RTLD_DEFAULT, "dlsym", "GLIBC_2.2.5")));
  CHECK(in_cuwarden(dlvsym(RTLD_DEFAULT, "dlvsym", "GLIBC_2.34")));
}

TEST_CASE("RTLD_NEXT from another library finds the next definition, not its own", "[coverage][dlsym]") {
  using fn = int (*)();
  for (const char* name : {"cuWtChainTarget", "xwt_chain_target"}) {
    INFO(name);
    auto f = reinterpret_cast<fn>(cuwt_lookup_next(name));
    REQUIRE(f);
    CHECK(f() == 2);
    auto fv = reinterpret_cast<fn>(cuwt_lookup_next_v(name));
    REQUIRE(fv);
    CHECK(fv() == 2);
  }
}

TEST_CASE("stream-ordered pools: reserved follows what the pools keep, trims and thresholds", "[coverage][pools]") {
  make_context();
  touch_interposer();
  auto& d = dev_counters();
  CUstream s = nullptr;
  REQUIRE(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  CUmemoryPool pool = nullptr;
  REQUIRE(cuDeviceGetDefaultMemPool(&pool, 0) == CUDA_SUCCESS);
  auto pool_reserved = [&] {
    cuuint64_t v = 0;
    REQUIRE(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &v) == CUDA_SUCCESS);
    return uint64_t{v};
  };
  const uint64_t base = d.reserved.load();  // non-pooled memory held by earlier cases: none
  CHECK(base == 0);

  CUdeviceptr p = 0;
  REQUIRE(cuMemAllocAsync(&p, 8 * kMiB, s) == CUDA_SUCCESS);
  CHECK(used() == 8 * kMiB);
  CHECK(pool_reserved() >= 8 * kMiB);
  CHECK(d.reserved.load() == pool_reserved());  // the pool grew: refreshed at once

  // Keep freed memory in the pool: the reserve outlives the allocation.
  cuuint64_t keep_all = ~0ULL;
  REQUIRE(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep_all) == CUDA_SUCCESS);
  REQUIRE(cuMemFreeAsync(p, s) == CUDA_SUCCESS);
  REQUIRE(cuStreamSynchronize(s) == CUDA_SUCCESS);
  CHECK(used() == 0);
  CHECK(pool_reserved() >= 8 * kMiB);
  size_t f = 0, t = 0;
  REQUIRE(cuMemGetInfo(&f, &t) == CUDA_SUCCESS);  // refreshes the figures for watchers
  CHECK(d.reserved.load() == pool_reserved());
  CHECK(d.reserved.load() >= 8 * kMiB);

  // Trimming gives the memory back; reserved follows.
  REQUIRE(cuMemPoolTrimTo(pool, 0) == CUDA_SUCCESS);
  CHECK(pool_reserved() == 0);
  CHECK(d.reserved.load() == 0);

  cuuint64_t release_all = 0;
  REQUIRE(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &release_all) == CUDA_SUCCESS);
  REQUIRE(cuStreamDestroy(s) == CUDA_SUCCESS);
}

TEST_CASE("NVML reports the cap too, through dlsym and both ABI versions", "[coverage][nvml]") {
  make_context();
  touch_interposer();
  // As pynvml and the CUDA-aware libraries do: dlopen NVML and look its functions up.
  void* nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
  REQUIRE(nvml);
  using init_fn = int (*)();
  using by_uuid_fn = int (*)(const char*, void**);
  using mem_fn = int (*)(void*, unsigned long long*);  // nvmlMemory_t: total, free, used
  struct MemV2 {
    unsigned int version;
    unsigned long long total, reserved, free, used;
  };
  using mem2_fn = int (*)(void*, MemV2*);
  auto init = reinterpret_cast<init_fn>(dlsym(nvml, "nvmlInit_v2"));
  auto by_uuid = reinterpret_cast<by_uuid_fn>(dlsym(nvml, "nvmlDeviceGetHandleByUUID"));
  auto mem = reinterpret_cast<mem_fn>(dlsym(nvml, "nvmlDeviceGetMemoryInfo"));
  auto mem2 = reinterpret_cast<mem2_fn>(dlsym(nvml, "nvmlDeviceGetMemoryInfo_v2"));
  REQUIRE((init && by_uuid && mem && mem2));
  CHECK(in_cuwarden(reinterpret_cast<void*>(mem)));
  CHECK(in_cuwarden(reinterpret_cast<void*>(mem2)));
  REQUIRE(init() == 0);
  // NVML's device for CUDA ordinal 0, by UUID.
  CUuuid u{};
  REQUIRE(cuDeviceGetUuid(&u, 0) == CUDA_SUCCESS);
  char uuid[64];
  const unsigned char* b = reinterpret_cast<const unsigned char*>(u.bytes);
  std::snprintf(uuid, sizeof uuid, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
                b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
  void* dev = nullptr;
  REQUIRE(by_uuid(uuid, &dev) == 0);

  CUdeviceptr p = 0;
  REQUIRE(cuMemAlloc(&p, 10 * kMiB) == CUDA_SUCCESS);
  unsigned long long m[3] = {};
  REQUIRE(mem(dev, m) == 0);
  CHECK(m[0] == 64 * kMiB);                   // total = the cap
  CHECK(m[1] == 54 * kMiB);                   // free = cap - used, as cuMemGetInfo says
  CHECK(m[2] == 10 * kMiB);                   // used
  size_t f = 0, t = 0;
  REQUIRE(cuMemGetInfo(&f, &t) == CUDA_SUCCESS);
  CHECK(m[0] == t);
  CHECK(m[1] == f);
  MemV2 v2{};
  v2.version = static_cast<unsigned>(sizeof(MemV2)) | (2u << 24);
  REQUIRE(mem2(dev, &v2) == 0);
  CHECK(v2.total == 64 * kMiB);
  CHECK(v2.free == 54 * kMiB);
  CHECK(v2.used + v2.free + v2.reserved == v2.total);
  REQUIRE(cuMemFree(p) == CUDA_SUCCESS);
}

TEST_CASE("stream-ordered allocation inside a stream capture leaves the capture intact", "[coverage][pools]") {
  make_context();
  touch_interposer();
  CUstream s = nullptr;
  REQUIRE(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  REQUIRE(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
  CUdeviceptr p = 0;
  REQUIRE(cuMemAllocAsync(&p, 2 * kMiB, s) == CUDA_SUCCESS);  // a graph allocation node
  CHECK(used() == 2 * kMiB);
  REQUIRE(cuMemFreeAsync(p, s) == CUDA_SUCCESS);
  CUgraph g = nullptr;
  CHECK(cuStreamEndCapture(s, &g) == CUDA_SUCCESS);  // not invalidated by anything we did
  CHECK(used() == 0);
  if (g) REQUIRE(cuGraphDestroy(g) == CUDA_SUCCESS);
  REQUIRE(cuStreamDestroy(s) == CUDA_SUCCESS);
}

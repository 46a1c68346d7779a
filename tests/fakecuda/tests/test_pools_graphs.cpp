// fakecuda unit tests: memory pools (stream-ordered allocator), stream capture, graph memory.
#include <cstring>

#include "helpers.hpp"

namespace {
cuuint64_t pool_attr(CUmemoryPool pool, CUmemPool_attribute a) {
  cuuint64_t v = 0;
  REQUIRE(cuMemPoolGetAttribute(pool, a, &v) == CUDA_SUCCESS);
  return v;
}
size_t free_bytes() {
  size_t f, t;
  REQUIRE(cuMemGetInfo(&f, &t) == CUDA_SUCCESS);
  return f;
}
}  // namespace

TEST_CASE("a pool keeps freed memory reserved until trimmed, frees follow stream order", "[pools]") {
  use_device(0);
  CUmemoryPool pool;
  REQUIRE(cuDeviceGetDefaultMemPool(&pool, 0) == CUDA_SUCCESS);
  cuuint64_t keep_all = ~cuuint64_t{0};
  REQUIRE(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep_all) == CUDA_SUCCESS);
  size_t free0 = free_bytes();
  CUstream s;
  REQUIRE(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  CUdeviceptr p;
  REQUIRE(cuMemAllocAsync(&p, 4 * kMiB, s) == CUDA_SUCCESS);
  CHECK(free0 - free_bytes() == 4 * kMiB);
  CHECK(pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT) == 4 * kMiB);
  REQUIRE(fakecuda_stream_delay(s, 150) == CUDA_SUCCESS);
  REQUIRE(cuMemFreeAsync(p, s) == CUDA_SUCCESS);
  CHECK(cuMemFreeAsync(p, s) == CUDA_ERROR_INVALID_VALUE);  // double free
  CHECK(pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT) == 4 * kMiB);  // free not reached yet
  REQUIRE(cuStreamSynchronize(s) == CUDA_SUCCESS);
  CHECK(pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT) == 0);
  CHECK(pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == 4 * kMiB);
  CHECK(free0 - free_bytes() == 4 * kMiB);  // still reserved
  CUdeviceptr q;
  REQUIRE(cuMemAllocAsync(&q, 4 * kMiB, s) == CUDA_SUCCESS);
  CHECK(q == p);  // reused
  REQUIRE(cuMemFreeAsync(q, s) == CUDA_SUCCESS);
  REQUIRE(cuStreamSynchronize(s) == CUDA_SUCCESS);
  REQUIRE(cuMemPoolTrimTo(pool, 0) == CUDA_SUCCESS);
  CHECK(free_bytes() == free0);
  CHECK(pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH) == 4 * kMiB);
  cuuint64_t zero = 0;
  REQUIRE(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &zero) == CUDA_SUCCESS);

  // With the default threshold 0, synchronizing gives the memory back.
  REQUIRE(cuMemAllocAsync(&p, kMiB, s) == CUDA_SUCCESS);
  REQUIRE(cuMemFreeAsync(p, s) == CUDA_SUCCESS);
  REQUIRE(cuStreamSynchronize(s) == CUDA_SUCCESS);
  CHECK(free_bytes() == free0);
  REQUIRE(cuStreamDestroy(s) == CUDA_SUCCESS);
}

TEST_CASE("explicit pools", "[pools]") {
  use_device(1);
  CUmemPoolProps props = {};
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.location.id = 1;
  CUmemoryPool pool;
  REQUIRE(cuMemPoolCreate(&pool, &props) == CUDA_SUCCESS);
  CUdeviceptr p;
  REQUIRE(cuMemAllocFromPoolAsync(&p, kMiB, pool, nullptr) == CUDA_SUCCESS);
  CUmemoryPool got = nullptr;
  REQUIRE(cuPointerGetAttribute(&got, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, p) == CUDA_SUCCESS);
  CHECK(got == pool);
  REQUIRE(cuDeviceSetMemPool(1, pool) == CUDA_SUCCESS);
  REQUIRE(cuDeviceGetMemPool(&got, 1) == CUDA_SUCCESS);
  CHECK(got == pool);
  REQUIRE(cuMemFreeAsync(p, nullptr) == CUDA_SUCCESS);
  REQUIRE(cuCtxSynchronize() == CUDA_SUCCESS);
  REQUIRE(cuMemPoolDestroy(pool) == CUDA_SUCCESS);
  REQUIRE(cuDeviceGetMemPool(&got, 1) == CUDA_SUCCESS);
  CUmemoryPool def;
  REQUIRE(cuDeviceGetDefaultMemPool(&def, 1) == CUDA_SUCCESS);
  CHECK(got == def);
  CHECK(fakecuda_live_bytes(1) == 0);
}

TEST_CASE("unsafe calls during a global capture fail and invalidate it", "[capture]") {
  use_device(0);
  CUstream s;
  REQUIRE(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  REQUIRE(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
  CUstreamCaptureStatus st;
  REQUIRE(cuStreamIsCapturing(s, &st) == CUDA_SUCCESS);
  CHECK(st == CU_STREAM_CAPTURE_STATUS_ACTIVE);
  fakecuda_reset_counters();
  CUdeviceptr p;
  CHECK(cuMemAlloc(&p, 512) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  CHECK(cuCtxSynchronize() == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  REQUIRE(cuStreamIsCapturing(s, &st) == CUDA_SUCCESS);
  CHECK(st == CU_STREAM_CAPTURE_STATUS_INVALIDATED);
  CUgraph g;
  CHECK(cuStreamEndCapture(s, &g) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  CHECK(g == nullptr);

  // Relaxed mode for this thread lifts the restriction.
  REQUIRE(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  REQUIRE(cuThreadExchangeStreamCaptureMode(&mode) == CUDA_SUCCESS);
  REQUIRE(cuMemAlloc(&p, 512) == CUDA_SUCCESS);
  REQUIRE(cuThreadExchangeStreamCaptureMode(&mode) == CUDA_SUCCESS);
  CHECK(mode == CU_STREAM_CAPTURE_MODE_RELAXED);
  CHECK(cuStreamSynchronize(s) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  CHECK(cuStreamEndCapture(s, &g) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  REQUIRE(cuMemFree(p) == CUDA_SUCCESS);
  REQUIRE(cuStreamDestroy(s) == CUDA_SUCCESS);
}

TEST_CASE("legacy-stream work while a blocking stream captures is an implicit dependency", "[capture]") {
  use_device(0);
  CUstream s;
  REQUIRE(cuStreamCreate(&s, 0) == CUDA_SUCCESS);
  REQUIRE(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED) == CUDA_SUCCESS);
  CUdeviceptr d = 0;
  CHECK(cuMemsetD8(d, 0, 0) == CUDA_SUCCESS);  // nothing to do, nothing queued
  CHECK(fakecuda_stream_delay(nullptr, 1) == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
  CUgraph g;
  CHECK(cuStreamEndCapture(s, &g) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  REQUIRE(cuStreamDestroy(s) == CUDA_SUCCESS);
}

TEST_CASE("captured allocations become graph memory mapped at launch", "[capture][graphs]") {
  use_device(0);
  CUstream s;
  REQUIRE(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  size_t free0 = free_bytes();
  REQUIRE(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
  CUdeviceptr p;
  REQUIRE(cuMemAllocAsync(&p, kMiB, s) == CUDA_SUCCESS);
  REQUIRE(cuMemsetD8Async(p, 0x7e, kMiB, s) == CUDA_SUCCESS);
  void* pinned;
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  REQUIRE(cuThreadExchangeStreamCaptureMode(&mode) == CUDA_SUCCESS);
  REQUIRE(cuMemAllocHost(&pinned, 16) == CUDA_SUCCESS);
  REQUIRE(cuThreadExchangeStreamCaptureMode(&mode) == CUDA_SUCCESS);
  std::memset(pinned, 0, 16);
  REQUIRE(cuMemcpyDtoHAsync(pinned, p + 100, 16, s) == CUDA_SUCCESS);
  REQUIRE(cuMemFreeAsync(p, s) == CUDA_SUCCESS);
  CUgraph g;
  REQUIRE(cuStreamEndCapture(s, &g) == CUDA_SUCCESS);
  CHECK(free_bytes() == free0);  // nothing mapped yet
  CHECK(static_cast<unsigned char*>(pinned)[0] == 0);  // captured, not executed

  CUgraphExec exec;
  REQUIRE(cuGraphInstantiateWithFlags(&exec, g, 0) == CUDA_SUCCESS);
  REQUIRE(cuGraphLaunch(exec, s) == CUDA_SUCCESS);
  REQUIRE(cuStreamSynchronize(s) == CUDA_SUCCESS);
  CHECK(static_cast<unsigned char*>(pinned)[15] == 0x7e);
  CHECK(free0 - free_bytes() == kMiB);  // graph memory stays reserved
  REQUIRE(cuGraphExecDestroy(exec) == CUDA_SUCCESS);
  REQUIRE(cuDeviceGraphMemTrim(0) == CUDA_SUCCESS);
  CHECK(free_bytes() == free0);
  REQUIRE(cuGraphDestroy(g) == CUDA_SUCCESS);
  REQUIRE(cuMemFreeHost(pinned) == CUDA_SUCCESS);
  REQUIRE(cuStreamDestroy(s) == CUDA_SUCCESS);
}

TEST_CASE("explicit memory alloc and free nodes", "[graphs]") {
  use_device(0);
  CUgraph g;
  REQUIRE(cuGraphCreate(&g, 0) == CUDA_SUCCESS);
  CUDA_MEM_ALLOC_NODE_PARAMS params = {};
  params.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  params.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  params.poolProps.location.id = 0;
  params.bytesize = 2 * kMiB;
  CUgraphNode alloc_node, free_node;
  REQUIRE(cuGraphAddMemAllocNode(&alloc_node, g, nullptr, 0, &params) == CUDA_SUCCESS);
  CHECK(params.dptr != 0);
  REQUIRE(cuGraphAddMemFreeNode(&free_node, g, &alloc_node, 1, params.dptr) == CUDA_SUCCESS);
  size_t free0 = free_bytes();
  CUgraphExec exec;
  REQUIRE(cuGraphInstantiateWithFlags(&exec, g, 0) == CUDA_SUCCESS);
  REQUIRE(cuGraphUpload(exec, nullptr) == CUDA_SUCCESS);
  CHECK(free0 - free_bytes() == 2 * kMiB);
  REQUIRE(cuGraphLaunch(exec, nullptr) == CUDA_SUCCESS);
  REQUIRE(cuCtxSynchronize() == CUDA_SUCCESS);
  REQUIRE(cuDeviceGraphMemTrim(0) == CUDA_SUCCESS);
  CHECK(free0 - free_bytes() == 2 * kMiB);  // an executable graph still owns it
  REQUIRE(cuGraphExecDestroy(exec) == CUDA_SUCCESS);
  REQUIRE(cuDeviceGraphMemTrim(0) == CUDA_SUCCESS);
  CHECK(free_bytes() == free0);
  REQUIRE(cuGraphDestroy(g) == CUDA_SUCCESS);
}

// fakecuda unit tests: stream ordering, events, the legacy stream, host functions, call counters.
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "helpers.hpp"

using namespace std::chrono;

TEST_CASE("work on a stream runs later and in order", "[streams]") {
  use_device(0);
  CUstream s;
  REQUIRE(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  CUdeviceptr d;
  REQUIRE(cuMemAlloc(&d, 4096) == CUDA_SUCCESS);
  void* pinned;
  REQUIRE(cuMemAllocHost(&pinned, 4096) == CUDA_SUCCESS);
  std::memset(pinned, 0, 4096);
  REQUIRE(fakecuda_stream_fill_async(s, d, 0x11, 4096, 150) == CUDA_SUCCESS);
  REQUIRE(cuMemcpyDtoHAsync(pinned, d, 4096, s) == CUDA_SUCCESS);
  CHECK(cuStreamQuery(s) == CUDA_ERROR_NOT_READY);
  CHECK(static_cast<unsigned char*>(pinned)[0] == 0);  // the copy has not happened yet
  REQUIRE(cuStreamSynchronize(s) == CUDA_SUCCESS);
  CHECK(cuStreamQuery(s) == CUDA_SUCCESS);
  CHECK(static_cast<unsigned char*>(pinned)[4095] == 0x11);
  REQUIRE(cuMemFreeHost(pinned) == CUDA_SUCCESS);
  REQUIRE(cuMemFree(d) == CUDA_SUCCESS);
  REQUIRE(cuStreamDestroy(s) == CUDA_SUCCESS);
  CHECK(cuStreamQuery(s) == CUDA_ERROR_INVALID_HANDLE);
}

TEST_CASE("synchronous copies wait for earlier work on the legacy stream", "[streams]") {
  use_device(0);
  CUdeviceptr d;
  REQUIRE(cuMemAlloc(&d, 256) == CUDA_SUCCESS);
  REQUIRE(fakecuda_stream_fill_async(nullptr, d, 0x22, 256, 100) == CUDA_SUCCESS);
  std::vector<unsigned char> host(256, 0);
  REQUIRE(cuMemcpyDtoH(host.data(), d, 256) == CUDA_SUCCESS);
  CHECK(host[255] == 0x22);
  REQUIRE(cuMemFree(d) == CUDA_SUCCESS);
}

TEST_CASE("the legacy stream waits for blocking streams but not for non-blocking ones", "[streams]") {
  use_device(0);
  CUstream blocking, nonblocking;
  REQUIRE(cuStreamCreate(&blocking, 0) == CUDA_SUCCESS);
  REQUIRE(cuStreamCreate(&nonblocking, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  CUdeviceptr d;
  REQUIRE(cuMemAlloc(&d, 512) == CUDA_SUCCESS);
  REQUIRE(fakecuda_stream_fill_async(blocking, d, 0x33, 512, 150) == CUDA_SUCCESS);
  std::vector<unsigned char> host(512, 0);
  REQUIRE(cuMemcpyDtoH(host.data(), d, 512) == CUDA_SUCCESS);  // legacy stream: waits
  CHECK(host[0] == 0x33);

  // The non-blocking stream's work cannot end before the test opens its gate (a host
  // function), so a copy on the legacy stream that returns at all did not wait for it (the
  // gate opens by itself after 30 s, so that a copy that waits fails the check below).
  static std::atomic<bool> gate{false};
  gate = false;
  REQUIRE(cuLaunchHostFunc(
              nonblocking,
              [](void*) {
                const auto until = steady_clock::now() + seconds(30);
                while (!gate.load() && steady_clock::now() < until) std::this_thread::sleep_for(milliseconds(1));
              },
              nullptr) == CUDA_SUCCESS);
  REQUIRE(cuMemcpyDtoH(host.data(), d, 512) == CUDA_SUCCESS);  // does not wait for it
  CHECK(cuStreamQuery(nonblocking) == CUDA_ERROR_NOT_READY);
  gate = true;
  REQUIRE(cuCtxSynchronize() == CUDA_SUCCESS);  // waits for every stream
  CHECK(cuStreamQuery(nonblocking) == CUDA_SUCCESS);
  REQUIRE(cuMemFree(d) == CUDA_SUCCESS);
  REQUIRE(cuStreamDestroy(blocking) == CUDA_SUCCESS);
  REQUIRE(cuStreamDestroy(nonblocking) == CUDA_SUCCESS);
}

TEST_CASE("an event its caller completes on an idle stream holds up no work queued meanwhile", "[streams]") {
  // Recorded on an idle stream, an event completes in its caller. Between taking its place
  // and completing (where its caller may be preempted), the legacy stream queues work that
  // waits for it, and its own stream queues work that waits for that: all of it must run.
  const CUcontext ctx = use_device(0);
  CUstream a;
  REQUIRE(cuStreamCreate(&a, 0) == CUDA_SUCCESS);  // blocking: ordered with the legacy stream
  CUevent e;
  REQUIRE(cuEventCreate(&e, 0) == CUDA_SUCCESS);
  CUdeviceptr d;
  REQUIRE(cuMemAlloc(&d, 256) == CUDA_SUCCESS);
  fakecuda_inline_gate(1);
  CUresult recorded = CUDA_ERROR_UNKNOWN;
  std::thread rec([&] {
    if (cuCtxSetCurrent(ctx) == CUDA_SUCCESS) recorded = cuEventRecord(e, a);
  });
  const int waiting = fakecuda_inline_gate_waiting(30000);
  if (waiting != 1) fakecuda_inline_gate(0);
  REQUIRE(waiting == 1);
  REQUIRE(fakecuda_stream_fill_async(CU_STREAM_LEGACY, d, 0x11, 256, 0) == CUDA_SUCCESS);
  REQUIRE(fakecuda_stream_fill_async(a, d, 0x22, 256, 0) == CUDA_SUCCESS);
  fakecuda_inline_gate(0);
  rec.join();
  CHECK(recorded == CUDA_SUCCESS);
  // A bound for a hang, not a pace: the work is two memsets.
  const auto until = steady_clock::now() + seconds(30);
  CUresult q = CUDA_ERROR_NOT_READY;
  while ((q = cuStreamQuery(a)) == CUDA_ERROR_NOT_READY && steady_clock::now() < until)
    std::this_thread::sleep_for(milliseconds(1));
  REQUIRE(q == CUDA_SUCCESS);
  CHECK(cuEventQuery(e) == CUDA_SUCCESS);
  unsigned char host[256] = {};
  REQUIRE(cuMemcpyDtoH(host, d, 256) == CUDA_SUCCESS);
  CHECK(host[0] == 0x22);  // in order: the legacy stream's write, then a's
  REQUIRE(cuMemFree(d) == CUDA_SUCCESS);
  REQUIRE(cuEventDestroy(e) == CUDA_SUCCESS);
  REQUIRE(cuStreamDestroy(a) == CUDA_SUCCESS);
}

TEST_CASE("events order streams and time work", "[streams]") {
  use_device(0);
  CUstream a, b;
  REQUIRE(cuStreamCreate(&a, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  REQUIRE(cuStreamCreate(&b, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  CUevent start, done;
  REQUIRE(cuEventCreate(&start, 0) == CUDA_SUCCESS);
  REQUIRE(cuEventCreate(&done, 0) == CUDA_SUCCESS);
  CHECK(cuEventQuery(done) == CUDA_SUCCESS);  // never recorded
  CUdeviceptr d;
  REQUIRE(cuMemAlloc(&d, 512) == CUDA_SUCCESS);
  REQUIRE(cuEventRecord(start, a) == CUDA_SUCCESS);
  REQUIRE(fakecuda_stream_fill_async(a, d, 0x44, 512, 100) == CUDA_SUCCESS);
  REQUIRE(cuEventRecord(done, a) == CUDA_SUCCESS);
  CHECK(cuEventQuery(done) == CUDA_ERROR_NOT_READY);
  REQUIRE(cuStreamWaitEvent(b, done, 0) == CUDA_SUCCESS);
  void* pinned;
  REQUIRE(cuMemAllocHost(&pinned, 512) == CUDA_SUCCESS);
  REQUIRE(cuMemcpyDtoHAsync(pinned, d, 512, b) == CUDA_SUCCESS);
  REQUIRE(cuStreamSynchronize(b) == CUDA_SUCCESS);
  CHECK(static_cast<unsigned char*>(pinned)[0] == 0x44);
  REQUIRE(cuEventSynchronize(done) == CUDA_SUCCESS);
  float ms = 0;
  REQUIRE(cuEventElapsedTime(&ms, start, done) == CUDA_SUCCESS);
  CHECK(ms >= 90.0f);
  REQUIRE(cuMemFreeHost(pinned) == CUDA_SUCCESS);
  REQUIRE(cuMemFree(d) == CUDA_SUCCESS);
  REQUIRE(cuEventDestroy(start) == CUDA_SUCCESS);
  REQUIRE(cuEventDestroy(done) == CUDA_SUCCESS);
  CHECK(cuEventDestroy(done) == CUDA_ERROR_INVALID_HANDLE);
  REQUIRE(cuStreamDestroy(a) == CUDA_SUCCESS);
  REQUIRE(cuStreamDestroy(b) == CUDA_SUCCESS);
}

TEST_CASE("host functions run in stream order on the per-thread stream too", "[streams]") {
  use_device(0);
  static std::vector<int> order;
  order.clear();
  auto push = [](void* v) { order.push_back(static_cast<int>(reinterpret_cast<intptr_t>(v))); };
  REQUIRE(fakecuda_stream_delay(CU_STREAM_PER_THREAD, 50) == CUDA_SUCCESS);
  REQUIRE(cuLaunchHostFunc(CU_STREAM_PER_THREAD, push, reinterpret_cast<void*>(1)) == CUDA_SUCCESS);
  REQUIRE(cuLaunchHostFunc(CU_STREAM_PER_THREAD, push, reinterpret_cast<void*>(2)) == CUDA_SUCCESS);
  CHECK(order.empty());
  REQUIRE(cuStreamSynchronize(CU_STREAM_PER_THREAD) == CUDA_SUCCESS);
  CHECK(order == std::vector<int>{1, 2});
}

TEST_CASE("call counters count exact names and variants", "[streams][counters]") {
  use_device(0);
  fakecuda_reset_counters();
  CUdeviceptr d;
  REQUIRE(cuMemAlloc(&d, 512) == CUDA_SUCCESS);  // cuMemAlloc_v2
  REQUIRE(cuMemFree(d) == CUDA_SUCCESS);
  CHECK(fakecuda_call_count("cuMemAlloc_v2") == 1);
  CHECK(fakecuda_call_count("cuMemAlloc") == 1);
  CHECK(fakecuda_call_count("cuMemAllocAsync") == 0);
  CHECK(fakecuda_call_count("cuCtxSynchronize") == 0);  // cuMemFree syncs internally: not counted
  CHECK(fakecuda_call_count("cuMemFree") == 1);
  fakecuda_reset_counters();
  CHECK(fakecuda_call_count("cuMemAlloc") == 0);
}

// Interposer tests: a process that sees one device (CUWARDEN_FAKE_DEVICES=1). There the
// allocation hooks count on ordinal 0 without asking the driver for the thread's device
// (Tracker::allocation_device); a thread without a context must still get the driver's own
// answer and count nothing, capped or not. Run four times by ctest: with CUWARDEN_LIMIT=64MiB
// (interposer.single_cap), without a cap (interposer.single), with CUWARDEN_CLOCK=fine
// (interposer.single_fine) and in a job without a job cap (interposer.single_job).
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cuw/job.hpp"
#include "cuw/paths.hpp"
#include "support.hpp"

using namespace cuwtest;

namespace {
using cuwtest::kMiB;

/// Every event published since the last call (drained as a daemon would).
std::vector<cuw::ring::Event> drain_single_events() {
  auto& h = own_ring();
  std::vector<cuw::ring::Event> buf(cuw::ring::kDefaultSlotCount);
  auto* slots = reinterpret_cast<cuw::ring::EventSlot*>(reinterpret_cast<char*>(&h) + cuw::ring::kHeaderBytes);
  const size_t n = cuw::ring::drain(h, slots, cuw::ring::kDefaultSlotCount, buf.data(), buf.size(), false, nullptr);
  buf.resize(n);
  return buf;
}

/// With CUWARDEN_JOB (interposer.single_job): what the job's members hold on its GPU 0
/// (bytes, from the job segment, as the daemon reads it); 0 outside a job.
uint64_t job_used() {
  const char* name = std::getenv("CUWARDEN_JOB");
  if (!name) return 0;
  std::string err;
  cuw::job::DirChoice where;
  REQUIRE(cuw::job::choose_dir(cuw::paths::run_dir(), static_cast<uint32_t>(geteuid()), name, &where, &err));
  std::unique_ptr<cuw::job::Segment> seg(
      cuw::job::Segment::open(where.path, static_cast<uint32_t>(geteuid()), name, false, &err));
  INFO("job segment: " << err);
  REQUIRE(seg);
  return seg->used(0);
}

/// `f` run on a fresh thread, which has no current context.
template <class F>
CUresult on_thread_without_context(F&& f) {
  CUresult r = CUDA_SUCCESS;
  std::thread([&] { r = f(); }).join();
  return r;
}
/// CUWARDEN_CLOCK=fine (interposer.single_fine): event times from the CPU counter.
bool fine_clock() {
  const char* v = std::getenv("CUWARDEN_CLOCK");
  return v && std::string(v) == "fine";
}

/// What event times read: CLOCK_REALTIME_COARSE in the default mode (CUWARDEN_CLOCK=coarse),
/// CLOCK_REALTIME with CUWARDEN_CLOCK=fine; ns.
uint64_t event_clock_now() {
  timespec t;
  clock_gettime(fine_clock() ? CLOCK_REALTIME : CLOCK_REALTIME_COARSE, &t);
  return static_cast<uint64_t>(t.tv_sec) * 1000000000ULL + static_cast<uint64_t>(t.tv_nsec);
}
}  // namespace

TEST_CASE("one device: allocations are counted on ordinal 0, exactly, with their events", "[single]") {
  make_context();
  touch_interposer();
  drain_single_events();
  const uint64_t clock_before = event_clock_now();
  auto& d = dev_counters();
  const bool capped = std::getenv("CUWARDEN_LIMIT") != nullptr;
  CHECK(d.limit.load() == (capped ? 64 * kMiB : cuw::ring::kNoLimit));
  const uint64_t allocs = d.alloc_count.load(), frees = d.free_count.load();

  CUdeviceptr p = 0, q = 0;
  REQUIRE(cuMemAlloc(&p, 3 * kMiB) == CUDA_SUCCESS);
  REQUIRE(cuMemAllocAsync(&q, 5 * kMiB, nullptr) == CUDA_SUCCESS);
  CHECK(used() == 8 * kMiB);
  CHECK(d.peak.load() >= 8 * kMiB);
  CHECK(d.live_allocations.load() == 2);
  REQUIRE(cuMemFreeAsync(q, nullptr) == CUDA_SUCCESS);
  REQUIRE(cuMemFree(p) == CUDA_SUCCESS);
  CHECK(used() == 0);
  CHECK(d.live_allocations.load() == 0);
  CHECK(d.alloc_count.load() == allocs + 2);
  CHECK(d.free_count.load() == frees + 2);

  const uint64_t clock_after = event_clock_now();
  const auto ev = drain_single_events();
  REQUIRE(ev.size() == 4);
  using K = cuw::ring::EventKind;
  CHECK(ev[0].kind == static_cast<uint8_t>(K::alloc));
  CHECK(ev[0].bytes == 3 * kMiB);
  CHECK(ev[1].kind == static_cast<uint8_t>(K::alloc));
  CHECK(ev[1].used_after == 8 * kMiB);
  CHECK(ev[2].kind == static_cast<uint8_t>(K::free));
  CHECK(ev[3].kind == static_cast<uint8_t>(K::free));
  CHECK(ev[3].used_after == 0);
  // The calling thread's id, kept in the thread's state (found from the thread pointer and
  // an offset, not the GOT: tracker.hpp's thread_state()).
  const auto self = static_cast<uint32_t>(syscall(SYS_gettid));
  for (const auto& e : ev) {
    CHECK(e.device == 0);
    CHECK(e.tid == self);
    CHECK(e.time_ns > 1'600'000'000'000'000'000ULL);
  }
  // Times are taken at each call (an allocation's after its driver call, a free's before),
  // in order on one thread; by default from the
  // kernel's coarse clock (a time from the CPU counter would be ahead of it, short of a tick
  // landing within the calls), with CUWARDEN_CLOCK=fine from the counter (within its anchor
  // error, < 1 us, of CLOCK_REALTIME; 50 us of slack).
  for (size_t i = 1; i < ev.size(); ++i) CHECK(ev[i].time_ns >= ev[i - 1].time_ns);
  const uint64_t slack = fine_clock() ? 50'000 : 0;
  for (const auto& e : ev) {
    CHECK(e.time_ns + slack >= clock_before);
    CHECK(e.time_ns <= clock_after + slack);
  }
}

TEST_CASE("one device: a thread without a context gets the driver's answer and counts nothing", "[single]") {
  make_context();
  touch_interposer();
  drain_single_events();
  auto& d = dev_counters();
  const uint64_t refusals = d.refusals.load(), errors = d.driver_errors.load();

  CUdeviceptr p = 0;
  CHECK(on_thread_without_context([&] { return cuMemAlloc(&p, kMiB); }) == CUDA_ERROR_INVALID_CONTEXT);
  CHECK(on_thread_without_context([&] { return cuMemAllocAsync(&p, kMiB, nullptr); }) ==
        CUDA_ERROR_INVALID_CONTEXT);
  CHECK(used() == 0);
  CHECK(d.driver_errors.load() == errors);
  CHECK(d.refusals.load() == refusals);
  CHECK(drain_single_events().empty());

  if (std::getenv("CUWARDEN_LIMIT")) {
    // At the cap: still the driver's answer (no context), not a refusal by the cap.
    CUdeviceptr full = 0;
    REQUIRE(cuMemAlloc(&full, 64 * kMiB) == CUDA_SUCCESS);
    drain_single_events();
    CHECK(on_thread_without_context([&] { return cuMemAlloc(&p, kMiB); }) == CUDA_ERROR_INVALID_CONTEXT);
    CHECK(d.refusals.load() == refusals);
    CHECK(drain_single_events().empty());
    CHECK(cuMemAlloc(&p, kMiB) == CUDA_ERROR_OUT_OF_MEMORY);  // with a context: refused
    CHECK(d.refusals.load() == refusals + 1);
    REQUIRE(cuMemFree(full) == CUDA_SUCCESS);
  }
  CHECK(used() == 0);
}

TEST_CASE("one device: a free the driver fails leaves the allocation live, counted, and says so", "[single]") {
  make_context();
  touch_interposer();
  drain_single_events();
  auto& d = dev_counters();
  // A cap or a job: a cuMemFree waits for the driver before it is counted.
  const bool capped = std::getenv("CUWARDEN_LIMIT") != nullptr || std::getenv("CUWARDEN_JOB") != nullptr;
  using K = cuw::ring::EventKind;
  using cuw::ring::Api;

  // `fail` frees `p` in a way the driver refuses; `early`: the free's own event was pushed
  // before the driver call (no cap, or a stream-ordered free).
  auto check = [&](CUdeviceptr p, Api api, CUresult expected, bool early, auto&& fail, auto&& free_ok) {
    INFO("api " << static_cast<int>(api) << (capped ? " with a cap" : " without a cap"));
    const uint64_t frees = d.free_count.load(), reserved = d.reserved.load(), live = d.live_allocations.load();
    const uint64_t before = used(), job_before = job_used();
    drain_single_events();
    CHECK(fail() == expected);
    CHECK(used() == before);
    CHECK(job_used() == job_before);  // in a job, its share is held again too
    CHECK(d.reserved.load() == reserved);
    CHECK(d.live_allocations.load() == live);
    CHECK(d.free_count.load() == frees);
    auto ev = drain_single_events();
    REQUIRE(ev.size() == (early ? 2u : 1u));
    if (early) {
      CHECK(ev[0].kind == static_cast<uint8_t>(K::free));
      CHECK(ev[0].address == p);
      CHECK(ev[0].used_after == before - 2 * kMiB);
    }
    const auto& err = ev.back();
    CHECK(err.kind == static_cast<uint8_t>(K::driver_error));
    CHECK(err.api == static_cast<uint16_t>(api));
    CHECK(err.address == p);
    CHECK(err.bytes == 2 * kMiB);
    CHECK(err.result == static_cast<uint32_t>(expected));
    CHECK(err.used_after == before);
    // Done right, the same free succeeds, once.
    REQUIRE(free_ok() == CUDA_SUCCESS);
    CHECK(used() == before - 2 * kMiB);
    if (std::getenv("CUWARDEN_JOB")) CHECK(job_used() == job_before - 2 * kMiB);
    CHECK(d.live_allocations.load() == live - 1);
    CHECK(d.free_count.load() == frees + 1);
    ev = drain_single_events();
    REQUIRE(ev.size() == 1);
    CHECK(ev[0].kind == static_cast<uint8_t>(K::free));
    CHECK(ev[0].address == p);
  };

  // cuMemFree is not allowed while this thread captures in global mode: the driver fails it
  // (and invalidates the capture) and still holds the memory.
  CUdeviceptr p = 0;
  REQUIRE(cuMemAlloc(&p, 2 * kMiB) == CUDA_SUCCESS);
  CUstream s = nullptr;
  REQUIRE(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  check(p, Api::cuMemFree, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, !capped,
        [&] {
          REQUIRE(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
          const CUresult r = cuMemFree(p);
          CUgraph g = nullptr;
          cuStreamEndCapture(s, &g);  // invalidated by the free: its answer is not this test's subject
          if (g) cuGraphDestroy(g);
          return r;
        },
        [&] { return cuMemFree(p); });

  // A stream-ordered free on a destroyed stream: an invalid handle, the memory still held.
  // Counted before the driver call with a cap too (the pool gets the bytes back only when
  // the stream reaches the free).
  CUdeviceptr q = 0;
  REQUIRE(cuMemAllocAsync(&q, 2 * kMiB, s) == CUDA_SUCCESS);
  REQUIRE(cuStreamSynchronize(s) == CUDA_SUCCESS);
  CUstream gone = nullptr;
  REQUIRE(cuStreamCreate(&gone, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  REQUIRE(cuStreamDestroy(gone) == CUDA_SUCCESS);
  check(q, Api::cuMemFreeAsync, CUDA_ERROR_INVALID_HANDLE, true, [&] { return cuMemFreeAsync(q, gone); },
        [&] { return cuMemFreeAsync(q, s); });
  REQUIRE(cuStreamSynchronize(s) == CUDA_SUCCESS);
  REQUIRE(cuStreamDestroy(s) == CUDA_SUCCESS);
  CHECK(used() == 0);
}

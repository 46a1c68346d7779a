// cuwarden bench: Google Benchmark micro-benchmarks of the event ring (common/ring).
//
//   BM_ring_push (threads 1, 8)          the producer's success path: a ring with room for
//                                        every push of the run (4 Mi slots, pre-faulted)
//   BM_ring_push_full                    the drop path: every push finds the ring full
//   BM_ring_push_drained (threads 1, 8)  producers pushing flat out while one consumer thread
//                                        drains, as the daemon would; counters: drop_pct
//                                        (events that found the ring full), drained
//   BM_ring_drain                        consumer cost: drain a full ring of published events
#include <benchmark/benchmark.h>
#include <sys/mman.h>

#include <atomic>
#include <cstdlib>
#include <thread>
#include <vector>

#include "cuw/ring.hpp"

namespace ring = cuw::ring;

namespace {

/// A private ring mapping (anonymous; no file, no daemon).
struct Mapping {
  ring::RingHeader* h = nullptr;
  ring::EventSlot* slots = nullptr;
  uint32_t count = 0;
  uint64_t bytes = 0;

  explicit Mapping(uint32_t slot_count) : count(slot_count), bytes(ring::file_size(slot_count)) {
    // Pre-faulted, so first-touch page faults are not timed as push cost.
    void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (base == MAP_FAILED) std::abort();
    h = static_cast<ring::RingHeader*>(base);
    slots = reinterpret_cast<ring::EventSlot*>(static_cast<char*>(base) + ring::kHeaderBytes);
    ring::init(*h, slots, count);
  }
  ~Mapping() { munmap(h, bytes); }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
};

ring::Event sample_event() {
  ring::Event e;
  e.time_ns = 1;
  e.address = 0x7f0000000000;
  e.bytes = 4096;
  e.tid = 1;
  e.api = static_cast<uint16_t>(ring::Api::cuMemAlloc);
  e.kind = static_cast<uint8_t>(ring::EventKind::alloc);
  e.device = 0;
  return e;
}

// Shared by the producer threads of one run; thread 0 owns it. Google Benchmark starts every
// thread's timed loop together after thread 0's setup, and ends them together.
Mapping* g_room_ring = nullptr;

void BM_ring_push(benchmark::State& state) {
  if (state.thread_index() == 0) g_room_ring = new Mapping(ring::kMaxSlotCount);
  const ring::Event e = sample_event();
  for (auto _ : state) {
    benchmark::DoNotOptimize(ring::push(*g_room_ring->h, g_room_ring->slots, g_room_ring->count, e));
  }
  state.SetItemsProcessed(state.iterations());
  if (state.thread_index() == 0) {
    if (g_room_ring->h->events_dropped.load() != 0) state.SkipWithError("the ring filled up: not the success path");
    delete g_room_ring;
    g_room_ring = nullptr;
  }
}
// Iterations fixed so that all threads together never fill the 4 Mi-slot ring.
BENCHMARK(BM_ring_push)->Threads(1)->Iterations(ring::kMaxSlotCount / 2)->UseRealTime();
BENCHMARK(BM_ring_push)->Threads(8)->Iterations(ring::kMaxSlotCount / 16)->UseRealTime();

void BM_ring_push_full(benchmark::State& state) {
  Mapping m(ring::kMinSlotCount);
  const ring::Event e = sample_event();
  for (uint32_t i = 0; i < m.count; ++i) ring::push(*m.h, m.slots, m.count, e);
  for (auto _ : state) benchmark::DoNotOptimize(ring::push(*m.h, m.slots, m.count, e));
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_ring_push_full);

Mapping* g_push_ring = nullptr;
std::atomic<bool> g_stop{false};
std::thread g_consumer;
std::atomic<uint64_t> g_drained{0};

void BM_ring_push_drained(benchmark::State& state) {
  if (state.thread_index() == 0) {
    g_push_ring = new Mapping(ring::kDefaultSlotCount);
    g_stop.store(false);
    g_drained.store(0);
    g_consumer = std::thread([] {
      std::vector<ring::Event> buf(1024);
      uint64_t lost = 0, n = 0;
      while (!g_stop.load(std::memory_order_relaxed))
        n += ring::drain(*g_push_ring->h, g_push_ring->slots, g_push_ring->count, buf.data(), buf.size(), false,
                         &lost);
      n += ring::drain(*g_push_ring->h, g_push_ring->slots, g_push_ring->count, buf.data(), buf.size(), false, &lost);
      g_drained.store(n);
    });
  }
  const ring::Event e = sample_event();
  for (auto _ : state) {
    benchmark::DoNotOptimize(ring::push(*g_push_ring->h, g_push_ring->slots, g_push_ring->count, e));
  }
  state.SetItemsProcessed(state.iterations());
  if (state.thread_index() == 0) {
    // Threads leave the loop together; thread 0 may still see others' last pushes land late,
    // which only moves a few events between `drained` and the ring.
    g_stop.store(true);
    g_consumer.join();
    const double pushed = static_cast<double>(g_push_ring->h->write_pos.load());
    const double dropped = static_cast<double>(g_push_ring->h->events_dropped.load());
    state.counters["drops"] = benchmark::Counter(dropped);
    state.counters["drop_pct"] = benchmark::Counter(pushed + dropped > 0 ? 100.0 * dropped / (pushed + dropped) : 0);
    state.counters["drained"] = benchmark::Counter(static_cast<double>(g_drained.load()));
    delete g_push_ring;
    g_push_ring = nullptr;
  }
}
BENCHMARK(BM_ring_push_drained)->Threads(1)->Threads(8)->UseRealTime();

void BM_ring_drain(benchmark::State& state) {
  Mapping m(ring::kDefaultSlotCount);
  std::vector<ring::Event> buf(1024);
  const ring::Event e = sample_event();
  uint64_t drained = 0;
  for (auto _ : state) {
    state.PauseTiming();
    for (uint32_t i = 0; i < m.count; ++i) ring::push(*m.h, m.slots, m.count, e);
    state.ResumeTiming();
    uint64_t lost = 0;
    size_t n;
    while ((n = ring::drain(*m.h, m.slots, m.count, buf.data(), buf.size(), false, &lost)) > 0) drained += n;
  }
  if (drained != static_cast<uint64_t>(state.iterations()) * m.count) state.SkipWithError("ring lost events");
  state.SetItemsProcessed(static_cast<int64_t>(drained));
}
BENCHMARK(BM_ring_drain);

}  // namespace

BENCHMARK_MAIN();

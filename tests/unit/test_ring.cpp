// Unit tests: the shared-memory event ring (producer, consumer, validation of hostile bytes).
#include <catch2/catch.hpp>
#include <atomic>
#include <cstring>
#include <memory>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "cuw/ring.hpp"

namespace ring = cuw::ring;

namespace {

struct TestRing {
  explicit TestRing(uint32_t slots) : bytes(ring::file_size(slots)), mem(new (std::align_val_t{64}) unsigned char[bytes]) {
    std::memset(mem.get(), 0, bytes);
    ring::init(*header(), this->slots(), slots);
    count = slots;
  }
  ring::RingHeader* header() { return reinterpret_cast<ring::RingHeader*>(mem.get()); }
  ring::EventSlot* slots() { return reinterpret_cast<ring::EventSlot*>(mem.get() + ring::kHeaderBytes); }
  uint64_t bytes;
  struct Del {
    void operator()(unsigned char* p) const { ::operator delete[](p, std::align_val_t{64}); }
  };
  std::unique_ptr<unsigned char[], Del> mem;
  uint32_t count = 0;
};

ring::Event ev(uint64_t n) {
  ring::Event e;
  e.time_ns = n;
  e.address = 0x7000'0000'0000ULL + n;
  e.bytes = n * 512;
  e.kind = static_cast<uint8_t>(ring::EventKind::alloc);
  e.api = static_cast<uint16_t>(ring::Api::cuMemAlloc);
  e.device = 0;
  return e;
}

}  // namespace

TEST_CASE("ring: a fresh ring validates and carries events in order", "[ring]") {
  TestRing r(64);
  REQUIRE(ring::validate(r.mem.get(), r.bytes) == ring::Invalid::none);
  for (uint64_t i = 1; i <= 10; ++i) REQUIRE(ring::push(*r.header(), r.slots(), r.count, ev(i)));
  ring::Event out[32];
  uint64_t lost = 0;
  REQUIRE(ring::drain(*r.header(), r.slots(), r.count, out, 32, false, &lost) == 10);
  for (uint64_t i = 0; i < 10; ++i) {
    CHECK(out[i].time_ns == i + 1);
    CHECK(out[i].bytes == (i + 1) * 512);
  }
  CHECK(lost == 0);
  CHECK(r.header()->write_pos.load() == 10);
  CHECK(ring::drain(*r.header(), r.slots(), r.count, out, 32, false, &lost) == 0);
}

TEST_CASE("ring: a full ring drops and counts instead of blocking", "[ring]") {
  TestRing r(64);
  int ok = 0;
  for (int i = 0; i < 100; ++i) ok += ring::push(*r.header(), r.slots(), r.count, ev(i)) ? 1 : 0;
  CHECK(ok == 64);
  CHECK(r.header()->events_dropped.load() == 36);
  ring::Event out[128];
  CHECK(ring::drain(*r.header(), r.slots(), r.count, out, 128, false, nullptr) == 64);
  // After draining there is room again.
  CHECK(ring::push(*r.header(), r.slots(), r.count, ev(1000)));
  CHECK(ring::drain(*r.header(), r.slots(), r.count, out, 128, false, nullptr) == 1);
  CHECK(out[0].time_ns == 1000);
}

TEST_CASE("ring: many producers and a concurrent consumer lose nothing uncounted", "[ring][concurrency]") {
  TestRing r(1024);
  constexpr int kThreads = 8;
  constexpr uint64_t kPerThread = 20000;
  std::atomic<bool> done{false};
  std::vector<uint64_t> seen;
  std::thread consumer([&] {
    std::vector<ring::Event> buf(256);
    while (true) {
      const bool finished = done.load();
      size_t n = ring::drain(*r.header(), r.slots(), r.count, buf.data(), buf.size(), false, nullptr);
      for (size_t i = 0; i < n; ++i) seen.push_back(buf[i].time_ns);
      if (finished && n == 0) break;
    }
  });
  std::vector<std::thread> producers;
  for (int t = 0; t < kThreads; ++t)
    producers.emplace_back([&, t] {
      for (uint64_t i = 0; i < kPerThread; ++i) ring::push(*r.header(), r.slots(), r.count, ev((uint64_t(t) << 32) | i));
    });
  for (auto& p : producers) p.join();
  done = true;
  consumer.join();
  const uint64_t written = r.header()->write_pos.load();
  const uint64_t dropped = r.header()->events_dropped.load();
  CHECK(written + dropped == kThreads * kPerThread);
  CHECK(seen.size() == written);
  std::set<uint64_t> unique(seen.begin(), seen.end());
  CHECK(unique.size() == seen.size());  // nothing delivered twice
  // Per producer, events arrive in the order they were pushed.
  std::vector<uint64_t> last(kThreads, 0);
  std::vector<bool> any(kThreads, false);
  bool ordered = true;
  for (uint64_t v : seen) {
    int t = static_cast<int>(v >> 32);
    uint64_t i = v & 0xffffffffu;
    if (any[t] && i <= last[t]) ordered = false;
    any[t] = true;
    last[t] = i;
  }
  CHECK(ordered);
}

TEST_CASE("ring: validate rejects corrupt or foreign files", "[ring][hostile]") {
  TestRing r(64);
  CHECK(ring::validate(nullptr, r.bytes) == ring::Invalid::too_small);
  CHECK(ring::validate(r.mem.get(), 100) == ring::Invalid::too_small);
  CHECK(ring::validate(r.mem.get(), r.bytes - 64) == ring::Invalid::size_mismatch);
  r.header()->slot_count = 63;
  CHECK(ring::validate(r.mem.get(), r.bytes) == ring::Invalid::bad_slot_count);
  r.header()->slot_count = 1u << 30;
  CHECK(ring::validate(r.mem.get(), r.bytes) == ring::Invalid::bad_slot_count);
  r.header()->slot_count = 64;
  r.header()->slot_size = 32;
  CHECK(ring::validate(r.mem.get(), r.bytes) == ring::Invalid::bad_slot_size);
  r.header()->slot_size = 64;
  r.header()->header_size = 1u << 20;
  CHECK(ring::validate(r.mem.get(), r.bytes) == ring::Invalid::bad_header_size);
  r.header()->header_size = sizeof(ring::RingHeader);
  r.header()->abi_version = 99;
  CHECK(ring::validate(r.mem.get(), r.bytes) == ring::Invalid::bad_abi);
  r.header()->abi_version = ring::kAbiVersion;
  r.header()->magic = 0x1234;
  CHECK(ring::validate(r.mem.get(), r.bytes) == ring::Invalid::bad_magic);
  CHECK(std::string(ring::invalid_reason(ring::Invalid::bad_magic)).find("magic") != std::string::npos);
}

TEST_CASE("ring: garbage positions and sequences never read out of bounds", "[ring][hostile]") {
  TestRing r(64);
  std::mt19937_64 rng(42);
  ring::Event out[64];
  for (int round = 0; round < 2000; ++round) {
    r.header()->read_pos.store(rng());
    r.header()->write_pos.store(rng());
    for (uint32_t i = 0; i < r.count; ++i) r.slots()[i].seq.store(rng() % 4 == 0 ? r.header()->read_pos.load() + i + 1 : rng());
    size_t n = ring::drain(*r.header(), r.slots(), r.count, out, 64, (round & 1) != 0, nullptr);
    CHECK(n <= 64);
    // The producer side also survives a scribbled ring: it either publishes or drops.
    ring::push(*r.header(), r.slots(), r.count, ev(round));
  }
}

TEST_CASE("ring: a slot claimed by a producer that died is skipped only when asked", "[ring]") {
  TestRing r(64);
  REQUIRE(ring::push(*r.header(), r.slots(), r.count, ev(1)));
  // Simulate a producer that claimed position 1 and died before publishing.
  r.header()->write_pos.fetch_add(1);
  REQUIRE(ring::push(*r.header(), r.slots(), r.count, ev(3)));
  ring::Event out[8];
  uint64_t lost = 0;
  CHECK(ring::drain(*r.header(), r.slots(), r.count, out, 8, false, &lost) == 1);
  CHECK(lost == 0);
  CHECK(ring::drain(*r.header(), r.slots(), r.count, out, 8, true, &lost) == 1);
  CHECK(out[0].time_ns == 3);
  CHECK(lost == 1);
}

TEST_CASE("ring: api and kind names", "[ring]") {
  CHECK(std::string(ring::api_name(static_cast<uint16_t>(ring::Api::cuMemAllocAsync))) == "cuMemAllocAsync");
  CHECK(std::string(ring::api_name(9999)) == "unknown");
  CHECK(std::string(ring::kind_name(static_cast<uint8_t>(ring::EventKind::refuse))) == "refuse");
  CHECK(std::string(ring::kind_name(200)) == "unknown");
}

// Unit tests: the interposer's live-allocation table (open addressing, one array).
#include <catch2/catch.hpp>
#include <random>
#include <thread>
#include <unordered_map>
#include <vector>

#include <mutex>

#include "core/live_table.hpp"
#include "base/spin_lock.hpp"

using cuw::core::LiveRecord;
using cuw::core::LiveTable;

TEST_CASE("live table: insert, take, overwrite, reserved keys", "[live_table]") {
  LiveTable t;
  CHECK(t.insert(0x7f0000001000, LiveRecord{4096, 0, 1}));
  CHECK(t.size() == 1);
  LiveRecord r;
  CHECK_FALSE(t.take(0x7f0000002000, &r));
  REQUIRE(t.take(0x7f0000001000, &r));
  CHECK(r.bytes == 4096);
  CHECK_FALSE(t.take(0x7f0000001000, &r));  // a double free finds nothing
  CHECK(t.insert(0x10, LiveRecord{1, 0, 0}));
  CHECK(t.insert(0x10, LiveRecord{2, 1, 0}));  // overwrite keeps one entry
  CHECK(t.size() == 1);
  REQUIRE(t.take(0x10, &r));
  CHECK(r.bytes == 2);
  CHECK(r.device == 1);
  CHECK(t.insert(0, LiveRecord{}));  // reserved keys are ignored, never stored
  CHECK(t.insert(~0ULL, LiveRecord{}));
  CHECK(t.size() == 0);
  CHECK_FALSE(t.take(0, &r));
}

TEST_CASE("live table: matches a reference map under random churn", "[live_table]") {
  LiveTable t;
  std::unordered_map<uint64_t, uint64_t> ref;
  std::mt19937_64 rng(7);
  std::vector<uint64_t> keys;
  for (int i = 0; i < 200000; ++i) {
    if (keys.empty() || rng() % 3 != 0) {
      // Device-pointer-like keys: 512-byte aligned, clustered, sometimes reused.
      const uint64_t k = 0x7f0000000000ULL + (rng() % 50000) * 512;
      const uint64_t bytes = 1 + rng() % 100000;
      REQUIRE(t.insert(k, LiveRecord{bytes, 0, 1}));
      if (!ref.count(k)) keys.push_back(k);
      ref[k] = bytes;
    } else {
      const size_t idx = rng() % keys.size();
      const uint64_t k = keys[idx];
      keys[idx] = keys.back();
      keys.pop_back();
      LiveRecord r;
      REQUIRE(t.take(k, &r));
      REQUIRE(r.bytes == ref[k]);
      ref.erase(k);
    }
  }
  CHECK(t.size() == ref.size());
  for (auto& [k, b] : ref) {
    LiveRecord r;
    REQUIRE(t.take(k, &r));
    CHECK(r.bytes == b);
  }
  CHECK(t.size() == 0);
  CHECK(t.footprint() > 0);
}

TEST_CASE("live table: threads never lose or duplicate entries (under one lock, as the interposer calls it)",
          "[live_table][concurrency]") {
  LiveTable t;
  cuw::spin_lock mu;
  constexpr int kThreads = 8, kPer = 20000;
  std::vector<std::thread> th;
  std::atomic<int> errors{0};
  for (int id = 0; id < kThreads; ++id)
    th.emplace_back([&, id] {
      for (int i = 0; i < kPer; ++i) {
        const uint64_t k = (uint64_t(id + 1) << 40) | (uint64_t(i) << 9);
        {
          std::lock_guard<cuw::spin_lock> lk(mu);
          if (!t.insert(k, LiveRecord{uint64_t(i), 0, 0})) ++errors;
        }
        if (i % 2 == 0) {
          LiveRecord r;
          std::lock_guard<cuw::spin_lock> lk(mu);
          if (!t.take(k, &r) || r.bytes != uint64_t(i)) ++errors;
        }
      }
    });
  for (auto& x : th) x.join();
  CHECK(errors.load() == 0);
  CHECK(t.size() == kThreads * kPer / 2);
}

TEST_CASE("live table: records keep every field at the edges of their packing, and one too large is refused",
          "[live_table]") {
  LiveTable t;
  const uint64_t max_bytes = (uint64_t{1} << 51) - 1;  // 2 PiB - 1
  REQUIRE(t.insert(0x1000, LiveRecord{max_bytes, 15, 255}));
  REQUIRE(t.insert(0x2000, LiveRecord{0, -1, 0}));
  REQUIRE(t.insert(0x3000, LiveRecord{141ULL << 30, 7, 4}));
  LiveRecord r;
  REQUIRE(t.take(0x1000, &r));
  CHECK(r.bytes == max_bytes);
  CHECK(r.device == 15);
  CHECK(r.api == 255);
  REQUIRE(t.take(0x2000, &r));
  CHECK(r.bytes == 0);
  CHECK(r.device == -1);
  CHECK(r.api == 0);
  REQUIRE(t.take(0x3000, &r));
  CHECK(r.bytes == 141ULL << 30);
  CHECK(r.device == 7);
  CHECK(r.api == 4);
  CHECK_FALSE(t.insert(0x4000, LiveRecord{uint64_t{1} << 51, 0, 1}));  // does not fit: not stored
  CHECK_FALSE(t.insert(0x4000, LiveRecord{1, 0, 256}));
  CHECK(t.size() == 0);
}

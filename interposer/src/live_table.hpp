// cuwarden interposer: the live-allocation table, device pointer (or handle) -> record.
// Sharded open addressing with linear probing and tombstones. No allocation per insert (the
// unordered_map it replaces allocated a node for every cudaMalloc); a shard's array doubles
// when three quarters full. Not synchronized itself: the interposer calls it under the
// tracker's lock (Tracker::lock()), which the same critical section uses for the counters
// and the event, so a hooked call takes one lock for all three.
#pragma once

#include <atomic>
#include <cstdint>

namespace cuw::ipc {

/// What the live table remembers about one allocation. 16 bytes.
struct LiveRecord {
  uint64_t bytes = 0;   ///< bytes counted against the cap
  int8_t device = -1;   ///< CUDA ordinal
  uint16_t api = 0;     ///< ring::Api of the allocating call
};

/// Map from a nonzero 64-bit key to a LiveRecord. Not thread-safe: callers serialize (the
/// interposer holds Tracker::lock()). Cost of insert or take: one hash, a probe of usually
/// one slot. Memory: 24 bytes a slot, 32 to 64 bytes per live entry.
class LiveTable {
 public:
  LiveTable() = default;
  LiveTable(const LiveTable&) = delete;
  LiveTable& operator=(const LiveTable&) = delete;
  ~LiveTable();

  /// Insert or overwrite. `key` must not be 0 or ~0 (reserved); such keys are ignored.
  /// Returns false only when memory for growth could not be had (the entry is then lost:
  /// its free will not be counted, and a warning is the caller's business).
  bool insert(uint64_t key, LiveRecord rec) noexcept;
  /// Remove and return the record; false if `key` is not live.
  bool take(uint64_t key, LiveRecord* out) noexcept;
  /// Number of live entries (sum over shards; a snapshot under concurrency).
  uint64_t size() const noexcept;
  /// Bytes of slot arrays held.
  uint64_t footprint() const noexcept;

 private:
  struct Slot {
    uint64_t key;  ///< 0 empty, ~0 tombstone
    LiveRecord rec;
  };
  struct Shard {
    Slot* slots = nullptr;
    uint32_t capacity = 0;  ///< power of two, or 0
    uint32_t occupied = 0;  ///< live + tombstones
    uint32_t live = 0;      ///< read by size() without the caller's lock (relaxed)
    bool grow() noexcept;
  };
  static constexpr int kShards = 64;
  static constexpr uint64_t kEmpty = 0, kTomb = ~0ULL;
  static uint64_t hash(uint64_t key) noexcept { return (key >> 8) * 0x9E3779B97F4A7C15ULL; }
  static int shard_of(uint64_t h) noexcept { return static_cast<int>(h >> 58); }
  Shard shards_[kShards];
};

}  // namespace cuw::ipc

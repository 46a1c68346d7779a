// cuwarden interposer: the live-allocation table (see live_table.hpp).
#include "live_table.hpp"

#include "cuw/attrs.hpp"

#include <cstdlib>
#include <cstring>

namespace cuw::ipc {

CUW_COLD bool LiveTable::Shard::grow() noexcept {
  // Double when live entries fill half; otherwise rebuild at the same size to drop tombstones.
  const uint32_t cap = capacity == 0 ? 64 : (live * 2 >= capacity ? capacity * 2 : capacity);
  auto* fresh = static_cast<Slot*>(std::calloc(cap, sizeof(Slot)));
  if (!fresh) return false;
  for (uint32_t i = 0; i < capacity; ++i) {
    const uint64_t k = slots[i].key;
    if (k == kEmpty || k == kTomb) continue;
    uint32_t j = static_cast<uint32_t>(hash(k)) & (cap - 1);
    while (fresh[j].key != kEmpty) j = (j + 1) & (cap - 1);
    fresh[j] = slots[i];
  }
  std::free(slots);
  slots = fresh;
  __atomic_store_n(&capacity, cap, __ATOMIC_RELAXED);  // footprint() reads it without the lock
  occupied = live;
  return true;
}

LiveTable::~LiveTable() {
  for (Shard& s : shards_) std::free(s.slots);
}

CUW_HOT bool LiveTable::insert(uint64_t key, LiveRecord rec) noexcept {
  if (key == kEmpty || key == kTomb) return true;
  const uint64_t h = hash(key);
  Shard& s = shards_[shard_of(h)];
  if ((s.occupied + 1) * 4 > s.capacity * 3 && !s.grow()) return false;
  const uint32_t mask = s.capacity - 1;
  uint32_t i = static_cast<uint32_t>(h) & mask;
  uint32_t tomb = UINT32_MAX;
  for (;; i = (i + 1) & mask) {
    const uint64_t k = s.slots[i].key;
    if (k == key) {  // overwrite (the driver handed out an address we thought live)
      s.slots[i].rec = rec;
      return true;
    }
    if (k == kTomb && tomb == UINT32_MAX) tomb = i;
    if (k == kEmpty) break;
  }
  if (tomb != UINT32_MAX) {
    i = tomb;  // reuse a tombstone: occupied does not change
  } else {
    ++s.occupied;
  }
  s.slots[i].key = key;
  s.slots[i].rec = rec;
  __atomic_store_n(&s.live, s.live + 1, __ATOMIC_RELAXED);
  return true;
}

CUW_HOT bool LiveTable::take(uint64_t key, LiveRecord* out) noexcept {
  if (key == kEmpty || key == kTomb) return false;
  const uint64_t h = hash(key);
  Shard& s = shards_[shard_of(h)];
  if (s.capacity == 0) return false;
  const uint32_t mask = s.capacity - 1;
  for (uint32_t i = static_cast<uint32_t>(h) & mask;; i = (i + 1) & mask) {
    const uint64_t k = s.slots[i].key;
    if (k == kEmpty) break;
    if (k == key) {
      if (out) *out = s.slots[i].rec;
      s.slots[i].key = kTomb;
      __atomic_store_n(&s.live, s.live - 1, __ATOMIC_RELAXED);
      return true;
    }
  }
  return false;
}

uint64_t LiveTable::size() const noexcept {
  uint64_t n = 0;
  for (const Shard& s : shards_) n += __atomic_load_n(&s.live, __ATOMIC_RELAXED);
  return n;
}

uint64_t LiveTable::footprint() const noexcept {
  uint64_t n = 0;
  for (const Shard& s : shards_) n += uint64_t{__atomic_load_n(&s.capacity, __ATOMIC_RELAXED)} * sizeof(Slot);
  return n;
}

}  // namespace cuw::ipc

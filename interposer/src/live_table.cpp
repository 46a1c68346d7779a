// cuwarden interposer: the live-allocation table (see live_table.hpp).
#include "live_table.hpp"

#include <sched.h>

#include <cstdlib>
#include <cstring>

namespace cuw::ipc {

namespace {
inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ volatile("yield");
#endif
}
}  // namespace

void LiveTable::Shard::lock() noexcept {
  for (int spins = 0;; ++spins) {
    if (!locked.exchange(true, std::memory_order_acquire)) return;
    while (locked.load(std::memory_order_relaxed)) {
      if (spins++ > 64) sched_yield();  // a holder that was descheduled: let it run
      else cpu_relax();
    }
  }
}

bool LiveTable::Shard::grow() noexcept {
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
  capacity = cap;
  occupied = live;
  return true;
}

LiveTable::~LiveTable() {
  for (Shard& s : shards_) std::free(s.slots);
}

bool LiveTable::insert(uint64_t key, LiveRecord rec) noexcept {
  if (key == kEmpty || key == kTomb) return true;
  const uint64_t h = hash(key);
  Shard& s = shards_[shard_of(h)];
  s.lock();
  if ((s.occupied + 1) * 4 > s.capacity * 3 && !s.grow()) {
    s.unlock();
    return false;
  }
  const uint32_t mask = s.capacity - 1;
  uint32_t i = static_cast<uint32_t>(h) & mask;
  uint32_t tomb = UINT32_MAX;
  for (;; i = (i + 1) & mask) {
    const uint64_t k = s.slots[i].key;
    if (k == key) {  // overwrite (the driver handed out an address we thought live)
      s.slots[i].rec = rec;
      s.unlock();
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
  ++s.live;
  s.unlock();
  return true;
}

bool LiveTable::take(uint64_t key, LiveRecord* out) noexcept {
  if (key == kEmpty || key == kTomb) return false;
  const uint64_t h = hash(key);
  Shard& s = shards_[shard_of(h)];
  s.lock();
  if (s.capacity == 0) {
    s.unlock();
    return false;
  }
  const uint32_t mask = s.capacity - 1;
  for (uint32_t i = static_cast<uint32_t>(h) & mask;; i = (i + 1) & mask) {
    const uint64_t k = s.slots[i].key;
    if (k == kEmpty) break;
    if (k == key) {
      if (out) *out = s.slots[i].rec;
      s.slots[i].key = kTomb;
      --s.live;
      s.unlock();
      return true;
    }
  }
  s.unlock();
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

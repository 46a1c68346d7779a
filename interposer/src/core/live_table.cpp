// cuwarden interposer: the live-allocation table (see live_table.hpp).
#include "core/live_table.hpp"

#include <cstdlib>

namespace cuw::core {

CUW_COLD bool LiveTable::grow() noexcept {
  // Double when live entries fill half; otherwise rebuild at the same size to drop tombstones.
  const uint32_t cap = capacity_ == 0 ? 1024 : (live_ * 2 >= capacity_ ? capacity_ * 2 : capacity_);
  if (cap == 0) return false;  // 2^32 slots: past any process
  auto* fresh = static_cast<Slot*>(std::aligned_alloc(alignof(Slot), uint64_t{cap} * sizeof(Slot)));
  if (!fresh) return false;
  for (uint32_t i = 0; i < cap; ++i) fresh[i].key = kEmpty;
  const uint32_t shift = 64 - static_cast<uint32_t>(__builtin_ctz(cap));
  for (uint32_t i = 0; i < capacity_; ++i) {
    const uint64_t k = slots_[i].key;
    if (k == kEmpty || k == kTomb) continue;
    uint32_t j = static_cast<uint32_t>((k * 0x9E3779B97F4A7C15ULL) >> shift);
    while (fresh[j].key != kEmpty) j = (j + 1) & (cap - 1);
    fresh[j] = slots_[i];
  }
  std::free(slots_);
  __atomic_store_n(&slots_, fresh, __ATOMIC_RELAXED);  // prefetch() reads it without the lock
  shift_ = shift;
  __atomic_store_n(&capacity_, cap, __ATOMIC_RELAXED);  // footprint() reads it without the lock
  occupied_ = live_;
  return true;
}

LiveTable::~LiveTable() { std::free(slots_); }

uint64_t LiveTable::footprint() const noexcept {
  return uint64_t{__atomic_load_n(&capacity_, __ATOMIC_RELAXED)} * sizeof(Slot);
}

}  // namespace cuw::core

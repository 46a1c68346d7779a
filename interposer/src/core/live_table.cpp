// cuwarden interposer: the live-allocation table (see live_table.hpp).
#include "core/live_table.hpp"

#include <cstdlib>

#include "core/live_segment.hpp"

namespace cuw::core {

CUW_COLD bool LiveTable::grow() noexcept {
  // Double when live entries fill half; otherwise rebuild at the same size to drop tombstones.
  const uint32_t cap = capacity_ == 0 ? 1024 : (live_ * 2 >= capacity_ ? capacity_ * 2 : capacity_);
  if (cap == 0) return false;  // 2^32 slots: past any process
  LiveSegment* seg = table_ == kNoTable ? nullptr : s_segment_;
  Slot* fresh = seg ? seg->new_table_region(cap) : nullptr;  // zero-filled: every key kEmpty
  bool left_segment = false;
  if (!fresh) {
    // No segment, or it cannot hold more (its file limit, a full tmpfs): the heap, so that
    // counting never depends on it; readers of the segment are told it is incomplete.
    fresh = static_cast<Slot*>(std::aligned_alloc(alignof(Slot), uint64_t{cap} * sizeof(Slot)));
    if (!fresh) return false;
    for (uint32_t i = 0; i < cap; ++i) fresh[i].key = kEmpty;
    left_segment = seg != nullptr;
  }
  const auto shift = static_cast<uint8_t>(64 - __builtin_ctz(cap));
  for (uint32_t i = 0; i < capacity_; ++i) {
    const uint64_t k = slots_[i].key;
    if (k == kEmpty || k == kTomb) continue;
    uint32_t j = static_cast<uint32_t>((k * 0x9E3779B97F4A7C15ULL) >> shift);
    while (fresh[j].key != kEmpty) j = (j + 1) & (cap - 1);
    fresh[j] = slots_[i];
  }
  if (left_segment) {
    seg->drop_table(table_);  // and gives back the old region
    table_ = kNoTable;
  } else if (seg) {
    seg->publish_table(table_, fresh, cap);  // and retires the old region
  } else {
    std::free(slots_);
  }
  __atomic_store_n(&slots_, fresh, __ATOMIC_RELAXED);  // prefetch() reads it without the lock
  shift_ = shift;
  __atomic_store_n(&capacity_, cap, __ATOMIC_RELAXED);  // footprint() reads it without the lock
  occupied_ = live_;
  return true;
}

LiveTable::~LiveTable() {
  if (table_ == kNoTable) std::free(slots_);  // a segment's regions go with the process
}

uint64_t LiveTable::footprint() const noexcept {
  return uint64_t{__atomic_load_n(&capacity_, __ATOMIC_RELAXED)} * sizeof(Slot);
}

}  // namespace cuw::core

// cuwarden interposer: a pool's block map, block start -> block, for the free's lookup.
// Open addressing with linear probing over a power-of-two table kept at most half full: a
// hit is one multiply, a shift and (almost always) one probe, and the map allocates only
// when it doubles. Generic over the pool's block type (anything with a `ptr` member).
#pragma once

#include <cuda.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "cuw/attrs.hpp"

namespace cuw::backends::pool {

/// Block start address -> Block*. Not thread-safe: the pool's lock guards it.
template <class Block>
class block_map {
 public:
  block_map() { map_.assign(1024, nullptr); }

  /// The block that starts at `p`, or nullptr.
  CUW_HOT Block* find(CUdeviceptr p) const noexcept {
    const uint64_t mask = map_.size() - 1;
    for (uint64_t i = home(p, mask);; i = (i + 1) & mask) {
      Block* b = map_[i];
      if (!b || b->ptr == p) return b;
    }
  }

  /// Adds `b` (not in the map). When the table doubles, it is rebuilt from `each`, which
  /// calls its argument with every block the pool has (b included: callers link it into
  /// its segment first). Throws std::bad_alloc when doubling runs out of memory.
  template <class Each>
  void insert(Block* b, Each&& each) {
    if ((used_ + 1) * 2 > map_.size()) {
      map_.assign(map_.size() * 2, nullptr);
      used_ = 0;
      rebuild(each);
      // The rebuild has inserted b: once only (a second entry would outlive its erase).
      if (find(b->ptr) == b) return;
    }
    place(b);
  }

  /// Removes the block that starts at `p`, if any. Linear probing's deletion: later entries
  /// of the same run move back into the gap.
  void erase(CUdeviceptr p) noexcept {
    const uint64_t mask = map_.size() - 1;
    uint64_t i = home(p, mask);
    while (map_[i] && map_[i]->ptr != p) i = (i + 1) & mask;
    if (!map_[i]) return;
    map_[i] = nullptr;
    --used_;
    for (uint64_t j = (i + 1) & mask; map_[j]; j = (j + 1) & mask) {
      const uint64_t h = home(map_[j]->ptr, mask);
      // Stays if its home lies cyclically in (i, j].
      const bool stays = i < j ? (h > i && h <= j) : (h > i || h <= j);
      if (stays) continue;
      map_[i] = map_[j];
      map_[j] = nullptr;
      i = j;
    }
  }

  /// Empties the map and adds every block `each` names (`each(f)` calls f(Block*) for each),
  /// growing the table to hold them at most half full.
  template <class Each>
  void rebuild(Each&& each) {
    std::fill(map_.begin(), map_.end(), nullptr);
    used_ = 0;
    uint64_t need = 0;
    each([&need](Block*) { ++need; });
    uint64_t cap = map_.size();
    while ((need + 1) * 2 > cap) cap *= 2;
    if (cap != map_.size()) map_.assign(cap, nullptr);
    each([this](Block* b) { place(b); });
  }

  /// Forgets every block and keeps the table small (a dropped pool stays allocated).
  void shrink() {
    map_.assign(2, nullptr);
    used_ = 0;
  }

 private:
  static uint64_t home(uint64_t p, uint64_t mask) noexcept { return (p >> 9) * 0x9E3779B97F4A7C15ULL >> 20 & mask; }
  void place(Block* b) noexcept {
    const uint64_t mask = map_.size() - 1;
    uint64_t i = home(b->ptr, mask);
    while (map_[i]) i = (i + 1) & mask;
    map_[i] = b;
    ++used_;
  }

  std::vector<Block*> map_;
  uint64_t used_ = 0;
};

}  // namespace cuw::backends::pool

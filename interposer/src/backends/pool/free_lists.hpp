// cuwarden interposer: a pool's free lists: one per small size class, the slab each class is
// carving, and the free large blocks by size (a list per size, for best fit), with the bytes
// they hold. Generic over the pool's block type (ptr, size, seg (with cls: the class, or -1
// for a large block; split: the block lies in a split segment), prev, next). Blocks are pushed and
// unlinked whole: merging neighbours and carving slabs are the pool's.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <iterator>
#include <map>
#include <type_traits>

#include "cuw/attrs.hpp"

namespace cuw::backends::pool {

/// The free blocks of one pool, `Classes` small classes. `unit`: what the layout backs at
/// once (the whole units inside a free block of a split segment are counted apart: the
/// layout can give them back and back them again where a request needs them). Not
/// thread-safe: the pool's lock guards it.
template <class Block, int Classes>
class free_lists {
 public:
  using Segment = std::remove_pointer_t<decltype(Block::seg)>;

  explicit free_lists(uint64_t unit) noexcept : gran_(unit) {}

  /// The bytes of the whole units inside `b` (what giving its memory back frees).
  uint64_t whole(const Block& b) const noexcept {
    const uint64_t lo = (b.ptr + gran_ - 1) / gran_ * gran_, hi = (b.ptr + b.size) / gran_ * gran_;
    return hi > lo ? hi - lo : 0;
  }

  /// Puts `b` at the head of its list (its state is the caller's). Returns whether it is a
  /// large block (the bytes changed).
  CUW_HOT bool push(Block* b) noexcept {
    const Segment* s = b->seg;
    const int cls = s->cls;
    Block** head = cls >= 0 ? &small_[cls] : &large_[b->size];
    b->prev = nullptr;
    b->next = *head;
    if (*head) (*head)->prev = b;
    *head = b;
    if (cls >= 0) return false;
    large_bytes_ += b->size;
    if (s->split) whole_bytes_ += whole(*b);
    if (b->size > largest_) largest_ = b->size;
    return true;
  }

  /// Takes `b` (on a list) off it.
  void unlink(Block* b) noexcept {
    if (b->prev) {
      b->prev->next = b->next;
    } else if (b->seg->cls < 0) {
      auto it = large_.find(b->size);
      if (it != large_.end() && it->second == b) {
        it->second = b->next;
        // A split segment's size whose list empties leaves the map (sizes are many: best fit walks them).
        if (!b->next && b->seg->split) large_.erase(it);
        else if (!b->next && b->size == largest_) largest_emptied(it);
      }
    } else {
      small_[b->seg->cls] = b->next;
    }
    if (b->next) b->next->prev = b->prev;
    b->prev = b->next = nullptr;
    if (b->seg->cls < 0) {
      large_bytes_ -= b->size;
      if (b->seg->split) whole_bytes_ -= whole(*b);
    }
  }

  /// The head of class `cls`'s list, taken off it; nullptr when empty.
  CUW_HOT Block* pop_small(int cls) noexcept {
    Block* b = small_[cls];
    if (b) {
      small_[cls] = b->next;
      if (b->next) b->next->prev = nullptr;
      b->next = nullptr;
    }
    return b;
  }
  /// The slab class `cls` carves from (nullptr: none with room).
  Segment*& carving(int cls) noexcept { return carving_[cls]; }
  /// Whether class `cls` has a free block or a slab with room.
  bool small_available(int cls) const noexcept { return small_[cls] || carving_[cls]; }

  /// Whole blocks: a free large block of at least `rounded` bytes and at most `slack` more,
  /// the smallest such, taken off its list; nullptr when none.
  Block* take_within(uint64_t rounded, uint64_t slack) noexcept {
    for (auto it = large_.lower_bound(rounded); it != large_.end() && it->first - rounded <= slack; ++it) {
      if (Block* b = it->second) {
        it->second = b->next;
        if (b->next) b->next->prev = nullptr;
        b->next = nullptr;
        if (!it->second && it->first == largest_) largest_emptied(it);
        large_bytes_ -= b->size;
        return b;
      }
    }
    return nullptr;
  }
  /// Split segments: the smallest free large block of at least `rounded` bytes, taken off its
  /// list; nullptr when none, or when it is larger and `can_split` is false (nothing taken).
  Block* take_best(uint64_t rounded, bool can_split) noexcept {
    auto it = large_.lower_bound(rounded);
    while (it != large_.end() && !it->second) it = large_.erase(it);
    if (it == large_.end()) return nullptr;
    Block* b = it->second;
    if (b->size > rounded && !can_split) return nullptr;
    it->second = b->next;
    if (b->next) b->next->prev = nullptr;
    b->next = nullptr;
    if (!it->second) large_.erase(it);
    large_bytes_ -= b->size;
    whole_bytes_ -= whole(*b);
    return b;
  }
  /// Split segments: a free large block holding at least one whole unit, from the smallest
  /// sizes up; nullptr when none. Stays on its list.
  Block* find_with_whole() noexcept {
    // (A block under a unit holds no whole one: the pieces packing leaves are many.)
    for (auto it = large_.lower_bound(gran_); it != large_.end();) {
      if (!it->second) {
        it = large_.erase(it);
        continue;
      }
      for (Block* c = it->second; c; c = c->next)
        if (whole(*c)) return c;
      ++it;
    }
    return nullptr;
  }
  /// The largest size with a free large block, or 0.
  uint64_t largest_size() const noexcept {
    for (auto it = large_.rbegin(); it != large_.rend(); ++it)
      if (it->second) return it->first;
    return 0;
  }

  uint64_t large_bytes() const noexcept { return large_bytes_; }  ///< bytes of the free large blocks
  uint64_t whole_bytes() const noexcept { return whole_bytes_; }  ///< the whole units in them (split segments)
  uint64_t largest() const noexcept { return largest_; }          ///< whole blocks: the largest free one

  /// Forgets every block (the context's memory is gone).
  void clear() noexcept {
    for (int c = 0; c < Classes; ++c) small_[c] = nullptr, carving_[c] = nullptr;
    large_.clear();
    large_bytes_ = 0;
    whole_bytes_ = 0;
    largest_ = 0;
  }

 private:
  // Whole blocks: the list of `it` (the largest size) emptied. The next largest is the first
  // non-empty list below; empty lists met on the way are of sizes not freed lately and leave
  // the map, so the walk is short when it happens again (the emptied size stays: it is the
  // one in use, and would come back at its next free).
  void largest_emptied(typename std::map<uint64_t, Block*>::iterator it) noexcept {
    while (it != large_.begin()) {
      auto below = std::prev(it);
      if (below->second) {
        largest_ = below->first;
        return;
      }
      large_.erase(below);
    }
    largest_ = 0;
  }

  const uint64_t gran_;
  Block* small_[Classes] = {};
  Segment* carving_[Classes] = {};  ///< a slab of the class with uncarved room
  std::map<uint64_t, Block*> large_;  ///< size -> list of free large blocks (split: no empty list)
  uint64_t large_bytes_ = 0;          ///< their bytes
  uint64_t whole_bytes_ = 0;          ///< split: the whole units inside them
  uint64_t largest_ = 0;              ///< whole blocks: the largest size with a free block
};

}  // namespace cuw::backends::pool

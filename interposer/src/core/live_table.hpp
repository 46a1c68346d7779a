// cuwarden interposer: the live-allocation table, device pointer (or handle) -> record.
// Open addressing with linear probing and tombstones, one array. No allocation per insert
// (the unordered_map it replaced allocated a node for every cudaMalloc); the array doubles
// when three quarters full. Not synchronized itself: the interposer calls it under the
// tracker's lock (Tracker::lock()), or for a device's pooled blocks its PoolBook's lock: the
// one lock a hooked call takes (its counters are atomics and its event a lock-free push,
// written in the same stretch).
//
// Built for the hooks' hot path, which runs with the CPU caches cold (the driver's own work
// evicted them): the table's header is 24 bytes that sit in the tracker's hot cache line,
// and a slot is 32 bytes (the record packed into one word, the stream, the time and call
// site in one more), two to a line, so an insert or a take usually touches one more line.
//
// The slot arrays live in the process's live segment (live_segment.hpp, cuw/live.hpp) when
// the table was given one (attach()): the daemon then reads every live record as it is,
// whatever events were dropped. A slot is written fields first and key last, and removed by
// storing the tombstone, which is what the segment's readers expect.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <vector>

#include "cuw/attrs.hpp"
#include "cuw/live.hpp"

namespace cuw::core {

class LiveSegment;

/// What the live table remembers about one allocation.
struct LiveRecord {
  uint64_t bytes = 0;   ///< bytes counted against the cap
  int8_t device = -1;   ///< CUDA ordinal
  uint16_t api = 0;     ///< ring::Api of the allocating call
  uint64_t stream = 0;  ///< stream of a stream-ordered allocation, else 0
  uint64_t tag = 0;     ///< live::make_tag(time, call site)
};

/// Map from a nonzero 64-bit key to a LiveRecord. Not thread-safe: callers serialize (the
/// interposer holds Tracker::lock(), or for a device's pooled blocks its PoolBook's lock). Cost of insert or take: one multiply, a probe of
/// usually one slot. Memory: 32 bytes a slot, 43 to 128 bytes per live entry. Growth
/// rehashes every entry once (under the caller's lock: about 10 ns an entry). A record's
/// bytes must be below 2^51 (2 PiB), its device in -1..30 and its api below 256.
class LiveTable {
 public:
  LiveTable() = default;
  LiveTable(const LiveTable&) = delete;
  LiveTable& operator=(const LiveTable&) = delete;
  ~LiveTable();

  /// Keep the slot arrays in `segment` as its table `t` from the next growth on (the
  /// segment then sees every record). Call before the first insert. Not thread-safe.
  /// One segment per process: a later attach (a forked child's tracker) replaces it for
  /// every table attached from then on.
  void attach(LiveSegment* segment, live::Table t) noexcept { attach_slot(segment, static_cast<uint32_t>(t)); }
  /// The same for a table slot (live::pooled_slot: a device's pooled blocks).
  void attach_slot(LiveSegment* segment, uint32_t slot) noexcept {
    s_segment_ = segment;
    table_ = segment && slot < live::kTableSlots ? static_cast<uint8_t>(slot) : kNoTable;
  }

  /// Insert or overwrite. `key` must not be 0 or ~0 (reserved); such keys are ignored.
  /// Returns false only when memory for growth could not be had, or the record does not
  /// fit (see above) (the entry is then lost: its free will not be counted, and a warning
  /// is the caller's business). `replaced`, if given, receives the record `key` held when
  /// the entry is overwritten (the driver handed out a key we thought live: that allocation
  /// was freed where the caller did not see it) and is left alone otherwise. Inline (the
  /// hooks' hot path); growth is out of line.
  bool insert(uint64_t key, LiveRecord rec, std::optional<LiveRecord>* replaced = nullptr) noexcept;
  /// Remove and return the record; false if `key` is not live. Inline.
  bool take(uint64_t key, LiveRecord* out) noexcept;
  /// Whether `key` is live (the caller's lock held).
  bool contains(uint64_t key) const noexcept;
  /// Ask the CPU for the line `key` probes first (no effect on the table; callable without
  /// the caller's lock: it reads two words, and a stale read only prefetches a wrong line).
  CUW_INLINE void prefetch(uint64_t key) const noexcept {
    const uint32_t cap = __atomic_load_n(&capacity_, __ATOMIC_RELAXED);
    Slot* const s = __atomic_load_n(&slots_, __ATOMIC_RELAXED);
    if (cap == 0 || s == nullptr) return;
    const auto i = static_cast<uint32_t>((key * 0x9E3779B97F4A7C15ULL) >> (64 - __builtin_ctz(cap)));
    __builtin_prefetch(&s[i & (cap - 1)], 1, 3);
  }
  /// Number of live entries (a snapshot under concurrency; relaxed load, no lock).
  uint64_t size() const noexcept { return __atomic_load_n(&live_, __ATOMIC_RELAXED); }
  /// Bytes of slot array held (relaxed load, no lock).
  uint64_t footprint() const noexcept;
  /// Every live key whose record `want(record)` accepts, appended to `out` (the caller's
  /// lock held; allocates, so never on a hot path: for context destruction). Returns false
  /// if memory ran out (the keys so far are kept).
  template <class Want>
  bool keys(std::vector<uint64_t>& out, Want&& want) const noexcept {
    try {
      for (uint32_t i = 0; i < capacity_; ++i)
        if (slots_[i].key != kEmpty && slots_[i].key != kTomb && want(unpack(slots_[i])))
          out.push_back(slots_[i].key);
    } catch (...) {
      return false;
    }
    return true;
  }

 private:
  using Slot = live::LiveSlot;  ///< key: 0 empty, ~0 tombstone; rec: pack()
  static constexpr uint64_t kEmpty = live::kEmpty, kTomb = live::kTomb;
  static constexpr int kBytesBits = live::kBytesBits;
  static bool fits(const LiveRecord& r) noexcept {
    return r.bytes >> kBytesBits == 0 && r.device >= -1 && r.device <= 30 && r.api < 256;
  }
  static uint64_t pack(const LiveRecord& r) noexcept {
    return r.bytes | uint64_t(static_cast<uint8_t>(r.device + 1)) << kBytesBits | uint64_t(r.api) << 56;
  }
  static LiveRecord unpack(const Slot& s) noexcept {
    const uint64_t v = s.rec;
    return LiveRecord{v & ((uint64_t{1} << kBytesBits) - 1), static_cast<int8_t>(int((v >> kBytesBits) & 31) - 1),
                      static_cast<uint16_t>(v >> 56), s.stream, s.tag};
  }
  /// Write `rec` into slot `s` and then its key (release): a reader of the segment that sees
  /// the key sees the fields.
  static CUW_INLINE void fill(Slot& s, uint64_t key, const LiveRecord& rec) noexcept {
    __atomic_store_n(&s.rec, pack(rec), __ATOMIC_RELAXED);
    __atomic_store_n(&s.stream, rec.stream, __ATOMIC_RELAXED);
    __atomic_store_n(&s.tag, rec.tag, __ATOMIC_RELAXED);
    __atomic_store_n(&s.key, key, __ATOMIC_RELEASE);
  }
  /// Fibonacci hashing: the product's top bits (the low bits of an aligned pointer are zero).
  uint32_t home(uint64_t key) const noexcept {
    return static_cast<uint32_t>((key * 0x9E3779B97F4A7C15ULL) >> shift_);
  }
  bool grow() noexcept;

  Slot* slots_ = nullptr;
  uint32_t capacity_ = 0;  ///< power of two, or 0
  uint8_t shift_ = 64;     ///< 64 - log2(capacity_)
  static constexpr uint8_t kNoTable = 0xff;
  uint8_t table_ = kNoTable;  ///< table slot in s_segment_ (live::kTableSlots), or kNoTable: slots on the heap
  uint32_t occupied_ = 0;  ///< live + tombstones
  uint32_t live_ = 0;      ///< read by size() without the caller's lock (relaxed)
  /// The process's live segment (one per process; static so that the header stays 24 bytes
  /// in the tracker's hot line). Only grow() reads it.
  static inline LiveSegment* s_segment_ = nullptr;
};

CUW_INLINE bool LiveTable::insert(uint64_t key, LiveRecord rec, std::optional<LiveRecord>* replaced) noexcept {
  if (__builtin_expect(key == kEmpty || key == kTomb, 0)) return true;
  if (__builtin_expect(!fits(rec), 0)) return false;
  if (__builtin_expect((occupied_ + 1) * 4 > capacity_ * 3, 0) && !grow()) return false;
  const uint32_t mask = capacity_ - 1;
  uint32_t i = home(key);
  uint32_t tomb = UINT32_MAX;
  for (;; i = (i + 1) & mask) {
    const uint64_t k = slots_[i].key;
    if (k == key) {  // overwrite (the driver handed out an address we thought live)
      if (replaced) *replaced = unpack(slots_[i]);
      __atomic_store_n(&slots_[i].key, kTomb, __ATOMIC_RELAXED);  // readers skip it while it changes
      fill(slots_[i], key, rec);
      return true;
    }
    if (k == kEmpty) break;
    if (k == kTomb && tomb == UINT32_MAX) tomb = i;
  }
  if (tomb != UINT32_MAX) {
    i = tomb;  // reuse a tombstone: occupied does not change
  } else {
    ++occupied_;
  }
  fill(slots_[i], key, rec);
  __atomic_store_n(&live_, live_ + 1, __ATOMIC_RELAXED);
  return true;
}

CUW_INLINE bool LiveTable::take(uint64_t key, LiveRecord* out) noexcept {
  if (__builtin_expect(key == kEmpty || key == kTomb || capacity_ == 0, 0)) return false;
  const uint32_t mask = capacity_ - 1;
  for (uint32_t i = home(key);; i = (i + 1) & mask) {
    const uint64_t k = slots_[i].key;
    if (k == key) {
      if (out) *out = unpack(slots_[i]);
      __atomic_store_n(&slots_[i].key, kTomb, __ATOMIC_RELAXED);
      __atomic_store_n(&live_, live_ - 1, __ATOMIC_RELAXED);
      return true;
    }
    if (k == kEmpty) return false;
  }
}

inline bool LiveTable::contains(uint64_t key) const noexcept {
  if (key == kEmpty || key == kTomb || capacity_ == 0) return false;
  const uint32_t mask = capacity_ - 1;
  for (uint32_t i = home(key);; i = (i + 1) & mask) {
    const uint64_t k = slots_[i].key;
    if (k == key) return true;
    if (k == kEmpty) return false;
  }
}

}  // namespace cuw::core

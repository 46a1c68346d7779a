// cuwarden interposer core: the writer of the process's live segment (cuw/live.hpp): the
// file the live tables' slot arrays and the call-site logs live in, so that the daemon
// reads them without asking the program anything.
//
// One reservation of address space maps the whole file (live::kMaxFileBytes, no memory
// committed); regions are handed out upwards, each allocated (fallocate) before it is
// written, so a region's address never changes and no table is ever remapped. A table that
// grows gets a new region; the old one is punched out, giving its pages back, and reused
// for a later region.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <mutex>
#include "cuw/live.hpp"

namespace cuw::core {

/// The live segment of this process. open() once (the tracker's constructor, at the first
/// CUDA call); then regions and log records from any thread, each caller serializing its own
/// table (the tracker's lock, or a device's pool book lock) or log (the call-site lock);
/// region allocation and the layout's sequence count are guarded here.
class LiveSegment {
 public:
  LiveSegment() = default;
  LiveSegment(const LiveSegment&) = delete;
  LiveSegment& operator=(const LiveSegment&) = delete;

  /// Create `dir`/live-<pid>-<start>.cwl (mode 0644, as the ring), or, when that cannot be,
  /// a private anonymous reservation (the program's own readers still work; the daemon
  /// sees no live records). `created_ns`: CLOCK_REALTIME now. Returns whether a file was made.
  bool open(const std::string& dir, uint32_t pid, uint32_t uid, uint64_t start_time, uint64_t created_ns,
            uint32_t callsite_frames, bool pyframes) noexcept;
  /// Whether open() made a mapping at all (false: nothing can be stored; tables use the heap).
  bool usable() const noexcept { return base_ != nullptr; }
  bool is_file() const noexcept { return fd_ >= 0; }
  const std::string& path() const noexcept { return path_; }
  live::LiveHeader& header() noexcept { return *reinterpret_cast<live::LiveHeader*>(base_); }
  /// The mapping's start and the bytes allocated so far (the file's size); for the
  /// process's own reader. Lock-free.
  const void* base() const noexcept { return base_; }
  uint64_t size() const noexcept { return end_.load(std::memory_order_acquire); }

  /// A zero-filled region of `capacity` slots for table `t`, not yet published; nullptr
  /// when the file limit or memory is reached (then the header says incomplete).
  /// Thread-safe. Cold: a system call.
  live::LiveSlot* new_table_region(uint64_t capacity) noexcept;
  /// Publish `slots` (from new_table_region, filled) as table slot `slot`'s (below
  /// live::kTableSlots: a live::Table, or live::pooled_slot), and punch out the region it
  /// replaces. The caller serializes per table. Cold.
  void publish_table(uint32_t slot, live::LiveSlot* slots, uint64_t capacity) noexcept;

  /// Append one record of `bytes` (a multiple of 8) to log `l`, growing the log's region
  /// when it is full. The caller serializes per log. Returns false (and marks the segment
  /// incomplete) when it cannot be stored.
  bool append(live::Log l, const void* record, std::size_t bytes) noexcept;

  /// A record could not be stored: readers are told the tables are no longer exact.
  void mark_incomplete() noexcept { if (base_) header().incomplete.store(1, std::memory_order_relaxed); }
  /// Table slot `slot` leaves the segment (it could not grow there: the file limit, a full
  /// tmpfs): readers see it empty and the segment incomplete; its region is given back. The
  /// caller keeps the records elsewhere (the heap). Cold.
  void drop_table(uint32_t slot) noexcept;
  /// Remove the file (the process exits with no daemon to read it). Keeps the mapping.
  void unlink() noexcept;
  /// The private reservation when no file can be made (see open()).
  static constexpr uint64_t kAnonBytes = 64ULL << 20;

 private:
  /// Bytes [offset, offset + bytes) of the file, allocated now; nullptr when it cannot be.
  void* new_region(uint64_t bytes, uint64_t* offset) noexcept;
  void retire(uint64_t offset, uint64_t bytes) noexcept;
  /// Publish a descriptor's new region (`new_offset`, `new_capacity` in units of `unit`
  /// bytes) under the layout's sequence count, then give back the old one. Cold.
  void move(uint64_t& offset, uint64_t& capacity, uint64_t unit, uint64_t new_offset, uint64_t new_capacity) noexcept;

  char* base_ = nullptr;
  int fd_ = -1;
  std::string path_;
  std::atomic<uint64_t> end_{0};  ///< bytes handed out (the file's size)
  uint64_t limit_ = 0;            ///< the most end_ may reach (file limit, RLIMIT_FSIZE, reservation)
  std::vector<std::pair<uint64_t, uint64_t>> free_;  ///< regions given back: offset, bytes (region_mu_)
  std::mutex region_mu_;  ///< serializes new_region, retire and the layout's sequence lock (cold)
};

}  // namespace cuw::core

// cuwarden interposer: a pool's budget (no hoarding). Before it takes more from its upstream,
// a pool whose memory would pass its budget gives back free memory first. The budget is the
// peak of live bytes (the largest seen within CUWARDEN_POOL_IDLE) plus CUWARDEN_POOL_KEEP:
// what the program needed lately, not what it holds this instant, so that memory freed
// between two steps is there for the next. Once CUWARDEN_POOL_IDLE has passed since the pool
// last grew, the next free trims: gives back what passes the budget of the live bytes of then
// (without waiting for the GPU: only memory already free).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "cuw/attrs.hpp"
#include "cuw/size.hpp"

namespace cuw::backends::pool {

/// The peak, the keep and the idle trim's deadline. Thread-safety: over() and the trim's
/// steps under the pool's slow-path mutex; trim_due() from any thread, without a lock.
class budget {
 public:
  static constexpr uint64_t kKeepFloor = 16ULL << 20;  ///< a pool may keep this much free whatever its size

  /// `keep`: CUWARDEN_POOL_KEEP (bytes, or a share of the peak); `idle_ns`: CUWARDEN_POOL_IDLE.
  budget(SizeSpec keep, uint64_t idle_ns) noexcept : keep_(keep), idle_ns_(idle_ns) {}

  /// What a pool may hold (bytes) for `peak` live bytes: peak plus the keep (at least kKeepFloor).
  uint64_t limit(uint64_t peak) const noexcept {
    const uint64_t keep = keep_.percent ? static_cast<uint64_t>(keep_.share * static_cast<double>(peak)) : keep_.bytes;
    return peak + std::max(keep, kKeepFloor);
  }

  /// Whether taking `more` bytes from the upstream, with `reserved` bytes held of which
  /// `cached` free, would pass the budget; raises the remembered peak (or starts a new one
  /// once the old is older than the idle time) and arms the idle trim (the pool grows).
  bool over(uint64_t reserved, uint64_t cached, uint64_t more, uint64_t now) noexcept {
    const uint64_t live = reserved > cached ? reserved - cached : 0;
    if (live + more >= peak_live_ || now - peak_ns_ > idle_ns_) {
      peak_live_ = live + more;
      peak_ns_ = now;
    }
    trim_at_.store(now + idle_ns_, std::memory_order_relaxed);  // it grows: trim once it has been idle
    return reserved + more > limit(peak_live_);
  }

  /// Whether a free at `now` should try the idle trim (one relaxed load).
  CUW_HOT bool trim_due(uint64_t now) const noexcept { return now >= trim_at_.load(std::memory_order_relaxed); }
  /// The trim begins: no other until the pool grows again (or retry()).
  void disarm() noexcept { trim_at_.store(~uint64_t{0}, std::memory_order_relaxed); }
  /// The trim forgets the old peak: the budget of `live` bytes now (bytes).
  uint64_t restart(uint64_t live, uint64_t now) noexcept {
    peak_live_ = live;
    peak_ns_ = now;
    return limit(live);
  }
  /// Pending frees still hold memory past the budget: trim again after another idle time.
  void retry(uint64_t now) noexcept { trim_at_.store(now + idle_ns_, std::memory_order_relaxed); }

 private:
  SizeSpec keep_;
  const uint64_t idle_ns_;
  uint64_t peak_live_ = 0;  ///< live bytes at the remembered peak
  uint64_t peak_ns_ = 0;    ///< when it was set (core::now_ns)
  std::atomic<uint64_t> trim_at_{~uint64_t{0}};  ///< when a free trims (set when the pool grows)
};

}  // namespace cuw::backends::pool

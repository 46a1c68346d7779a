// cuwarden daemon model: one process's recent events, kept in sealed chunks so that a
// published State shares them instead of copying up to `capacity` events at every publish.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "cuw/ring.hpp"

namespace cuw::daemon {

/// One event as the daemon keeps it: the ring's event, its global number, and for limit
/// changes the daemon made, who asked.
struct StoredEvent {
  static constexpr uint32_t kFromProcess = ~0u;    ///< written by the process itself
  static constexpr uint32_t kFromPolicy = ~0u - 1; ///< the daemon applying its policy file
  static constexpr uint32_t kFromTamper = ~0u - 2; ///< the daemon putting back a cap its process raised
  uint64_t seq = 0;
  ring::Event e;
  /// Who made a limit change the daemon recorded (Api::control events): the requester's
  /// uid, or one of the constants above. Such events carry the new cap in `bytes`, the
  /// old one in `aux` and the requester's pid in `tid`.
  uint32_t by_uid = kFromProcess;
};

/// The newest `capacity` events of one process, oldest first, ordered by seq.
/// Not thread-safe: the loop thread owns it. view() hands out an immutable copy that any
/// thread may read; it shares every full chunk and copies at most one partial one.
class EventHistory {
 public:
  static constexpr std::size_t kChunk = 256;  ///< events per chunk: the most a view copies
  using Chunk = std::vector<StoredEvent>;

  /// An immutable run of events: chunks[0] minus its first `skip` events, then the others.
  struct View {
    std::vector<std::shared_ptr<const Chunk>> chunks;
    std::size_t skip = 0;
    /// Call f(event) for each event with seq > `after`, oldest first. O(log n) to find the
    /// first one (seq is increasing), then one step per event.
    template <class F>
    void for_each_after(uint64_t after, F&& f) const {
      for (std::size_t c = 0; c < chunks.size(); ++c) {
        const Chunk& ch = *chunks[c];
        if (ch.empty() || ch.back().seq <= after) continue;
        std::size_t i = c == 0 ? skip : 0;
        std::size_t lo = i, hi = ch.size();
        while (lo < hi) {  // first index with seq > after
          const std::size_t mid = lo + (hi - lo) / 2;
          if (ch[mid].seq <= after) lo = mid + 1;
          else hi = mid;
        }
        for (i = lo; i < ch.size(); ++i) f(ch[i]);
      }
    }
  };

  /// `capacity`: events kept (at least 1).
  explicit EventHistory(std::size_t capacity) : capacity_(capacity ? capacity : 1) {}

  /// Append `ev` (its seq above every kept one) and drop the oldest beyond the capacity.
  void push(const StoredEvent& ev);
  std::size_t size() const noexcept { return size_; }
  /// An immutable copy of the events kept now; the same object while nothing was pushed.
  std::shared_ptr<const View> view();

 private:
  std::size_t capacity_;
  std::size_t size_ = 0;
  std::size_t skip_ = 0;  ///< events of the first chunk (sealed_.front(), else tail_) dropped
  std::deque<std::shared_ptr<const Chunk>> sealed_;
  Chunk tail_;
  std::shared_ptr<const View> view_;  ///< cached until the next push
};

}  // namespace cuw::daemon

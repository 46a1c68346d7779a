// cuwarden daemon commands: what the HTTP event stream (/api/v1/events, docs/http.md) sends a
// client: memory events as they come and state documents at most once a second.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "model/state.hpp"

namespace cuw::daemon {

/// What an event-stream client has been sent so far; EventFeed::next moves it on.
struct StreamCursor {
  std::optional<uint32_t> pid;   ///< only this process's events
  bool state = true;             ///< send state documents too
  uint64_t last_seq = 0;         ///< events up to this global seq were sent
  uint64_t state_generation = 0; ///< the StateStore generation last looked at
  uint64_t state_sent_ns = 0;    ///< monotonic ns the last state document went
};

/// The stream's content for all its clients.
class EventFeed {
 public:
  /// `store` must outlive the feed.
  explicit EventFeed(const StateStore* store) : store_(store) {}
  /// The next bytes for `c`: memory events after c.last_seq (one process's with c.pid), and
  /// a state document when a newer State was published and a second has passed since the
  /// last one (c.state). One thread only (it caches the document of the newest State for
  /// all clients).
  std::string next(StreamCursor& c, uint64_t mono_now);

 private:
  const StateStore* store_;
  uint64_t cached_generation_ = 0;
  std::shared_ptr<const State> cached_state_;
  std::string cached_state_doc_;
};

}  // namespace cuw::daemon

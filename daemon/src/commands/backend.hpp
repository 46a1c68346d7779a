// cuwarden daemon commands: what a command's handler reads and calls, whichever transport
// carried the request.
#pragma once

#include <functional>

#include "model/control.hpp"
#include "model/peer.hpp"
#include "model/room.hpp"
#include "model/series.hpp"
#include "model/state.hpp"
#include "model/suspend.hpp"
#include "model/symbolize_worker.hpp"

namespace cuw::daemon {

/// What the handlers need from the daemon.
struct Backend {
  /// The published States (read-only, any thread).
  const StateStore* store = nullptr;
  /// Called before a query: makes the store hold a State built after this call began (the
  /// socket promises counters as they are at the query). Empty: the last State will do.
  std::function<void()> refresh;
  /// Registry::set_limit run where the model lives (the loop thread); what it throws
  /// becomes an error reply. Empty: this transport carries no privileged command.
  std::function<LimitResult(const Peer&, const LimitRequest&)> set_limit;
  /// How snapshots' native frames are named (in a worker process). Null: frames keep their
  /// addresses.
  const SymbolizeOptions* symbolize = nullptr;
  /// The history (thread-safe). Null: get_history says there is none.
  const SeriesStore* series = nullptr;
  /// Suspend or resume as Suspender::run does it (model/suspender.hpp): may take seconds, so
  /// the transport runs it on its pool. Empty: this daemon cannot (the command says why).
  std::function<SuspendResult(const Peer&, const SuspendRequest&)> suspend;
  /// Make room for the asking process as RoomKeeper::ask does (model/room_keeper.hpp): may
  /// take seconds, on the transport's pool. Empty: this daemon cannot (the answer is no).
  std::function<RoomAnswer(const Peer&, const RoomRequest&)> room;
};

}  // namespace cuw::daemon

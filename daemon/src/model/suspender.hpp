// cuwarden daemon model: a suspend or resume carried out — the registry's checks on the loop
// thread, the driver's calls on the caller's thread (a worker, never the one that answers
// limits and state: a lock may wait its whole timeout), the registry's record on the loop
// thread again.
//
// A job goes as a whole: every member is locked (each with the request's timeout) before any
// is checkpointed; if a lock fails, those locked are unlocked and nothing is suspended.
#pragma once

#include <functional>

#include "model/checkpoint_driver.hpp"
#include "model/peer.hpp"
#include "model/suspend.hpp"

namespace cuw::daemon {

class Registry;

class Suspender {
 public:
  /// `on_loop` runs a function on the loop thread and returns when it has (LoopQueue::call).
  Suspender(CheckpointDriver& driver, Registry& registry, std::function<void(const std::function<void()>&)> on_loop)
      : driver_(driver), reg_(registry), on_loop_(std::move(on_loop)) {}

  /// Carry out `req` from `peer`. Blocks for as long as the driver takes (each lock at most
  /// req.timeout_ms). Thread-safe: a process being suspended or resumed is refused to a
  /// second request until the first is done.
  SuspendResult run(const Peer& peer, const SuspendRequest& req);

 private:
  CheckpointDriver& driver_;
  Registry& reg_;
  std::function<void(const std::function<void()>&)> on_loop_;
};

}  // namespace cuw::daemon

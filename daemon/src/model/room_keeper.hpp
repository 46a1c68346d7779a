// cuwarden daemon model: suspending and resuming by policy, carried out. ask() answers a
// process's room request: the registry's plan on the loop thread, the suspensions through the
// Suspender on the caller's thread (a worker: a lock may wait its timeout), bounded by the
// requester's room_wait. resume_due() resumes, highest priority first, the processes
// suspended by policy whose memory has stayed free for their resume_after, after holding
// back the allocations of lower-priority processes on their GPUs while they wait
// (Registry::hold_back_for_restores); the daemon calls it from a thread of its own every
// kResumeCheckMs.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <utility>

#include "model/peer.hpp"
#include "model/room.hpp"
#include "model/suspender.hpp"

namespace cuw::daemon {

class Registry;

class RoomKeeper {
 public:
  /// How often the daemon's resume thread calls resume_due(), in ms.
  static constexpr int kResumeCheckMs = 200;

  /// `on_loop` runs a function on the loop thread and returns when it has (LoopQueue::call).
  RoomKeeper(Suspender& suspender, Registry& registry, std::function<void(const std::function<void()>&)> on_loop)
      : suspender_(suspender), reg_(registry), on_loop_(std::move(on_loop)) {}

  /// Make room for `req` from `peer` (the asking process itself). Blocks while processes are
  /// suspended, at most the requester's room_wait. Thread-safe; any thread but the loop's.
  RoomAnswer ask(const Peer& peer, const RoomRequest& req);

  /// Resume the processes suspended by policy that are due (Registry::policy_resumes_due),
  /// one at a time, highest priority first. Returns how many were resumed. Any thread but
  /// the loop's.
  int resume_due();

  /// resume_due() every kResumeCheckMs until `stop_fd` is readable or the loop's queue is
  /// closed: the body of the daemon's resume thread.
  void resume_loop(int stop_fd);

 private:
  /// A resume that failed is not tried again before this long, ns (the resume thread's own).
  static constexpr uint64_t kResumeRetryNs = 30'000'000'000ULL;

  Suspender& suspender_;
  Registry& reg_;
  std::function<void(const std::function<void()>&)> on_loop_;
  /// (pid, start time) -> when a failed resume may be tried again (mono ns); resume thread only.
  std::map<std::pair<uint32_t, uint64_t>, uint64_t> retry_at_;
};

}  // namespace cuw::daemon

// cuwarden daemon model: making room on a full GPU by policy, as typed data — a process's
// request for room (RoomRequest), what the registry plans for it (RoomPlan), the choice of
// processes to suspend (choose_victims, pure), and a policy resume that is due (PolicyResume).
//
// The registry plans on the loop thread (room.cpp); the suspensions and resumes themselves
// go through the Suspender on a worker (model/suspender.hpp), as a suspension by hand does.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace cuw::daemon {

/// What a process's interposer asks when the driver refused it memory (protocol: room).
struct RoomRequest {
  uint32_t device = 0;  ///< CUDA ordinal, as the asking process sees it
  uint64_t bytes = 0;   ///< the allocation it could not make
};

/// A process that could be suspended to make room, as choose_victims sees it.
struct RoomCandidate {
  uint32_t pid = 0;
  uint64_t start_time = 0;  ///< clock ticks since boot: larger is more recently started
  int32_t priority = 0;
  uint64_t bytes = 0;  ///< its footprint on the GPU in question (NVML), bytes
};

/// The fewest of `candidates` whose bytes together reach `shortfall`; among sets of that
/// size, the one that takes the lowest priorities first, then the most recently started.
/// Empty when all of them together fall short (or none are given). Pure; allocates.
std::vector<RoomCandidate> choose_victims(std::vector<RoomCandidate> candidates, uint64_t shortfall);

/// What the registry decided for a RoomRequest (Registry::plan_room).
struct RoomPlan {
  enum class Outcome { no, free_now, suspend };
  Outcome outcome = Outcome::no;
  std::string reason;       ///< no: why; otherwise what is done, for the log
  uint32_t pid = 0;         ///< the requester, in the daemon's pid namespace
  uint64_t start_time = 0;
  int32_t priority = 0;
  std::string uuid;         ///< the GPU
  uint64_t shortfall = 0;   ///< bytes to free beyond what is free now (with the margin)
  uint64_t wait_ms = 0;     ///< the requester's room_wait
  std::vector<RoomCandidate> victims;
};

/// A process suspended by policy whose memory has stayed free long enough.
struct PolicyResume {
  uint32_t pid = 0;
  uint64_t start_time = 0;
  int32_t priority = 0;
};

/// What a room request is answered (protocol: room).
struct RoomAnswer {
  bool granted = false;     ///< processes were suspended, or the memory is free now: try once more
  std::string reason;       ///< what was done, or why not
  uint64_t shortfall = 0;   ///< bytes that were missing on the GPU (with the margin)
  std::vector<uint32_t> suspended;  ///< the processes suspended for it
};

}  // namespace cuw::daemon

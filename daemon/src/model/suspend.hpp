// cuwarden daemon model: suspending a process by hand, as typed data — what a client asks
// (SuspendRequest), the processes it comes to (SuspendTarget) and what came of it
// (SuspendResult). The registry checks and records (suspend.cpp, on the loop thread); the
// driver's calls run between those steps on a worker thread (suspender.hpp).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/checkpoint_driver.hpp"

namespace cuw::daemon {

/// What a resume waits for beyond a footprint of `bytes`, and what making room leaves free
/// beyond an allocation: 5 % of it, at least 16 MiB (another process that allocates meanwhile
/// must not make a restore fail). Bytes.
inline uint64_t resume_margin(uint64_t bytes) noexcept {
  constexpr uint64_t kMin = 16ULL << 20, kShare = 20;
  return bytes / kShare > kMin ? bytes / kShare : kMin;
}

/// One suspend or resume request, its types checked.
struct SuspendRequest {
  enum class Action { suspend, resume };
  Action action = Action::suspend;
  bool job = false;             ///< a job (every member, as a whole) rather than one process
  uint32_t pid = 0;             ///< !job: 1..2^31-1, as the requester numbers it
  std::string job_name;         ///< job: a valid job name
  std::optional<uint32_t> user_uid;       ///< job: its owner by uid, or
  std::optional<std::string> user_name;   ///< by login name; neither: the requester
  uint32_t timeout_ms = 10'000;  ///< suspend: each lock's timeout (1..600000)
  /// resume: the GPU to restore onto, as NVML numbers it ("1") or its UUID ("GPU-..."); empty:
  /// each process comes back on the GPUs it was suspended from (suspend_move.cpp).
  std::string gpu;
  /// The daemon's own, to make room (room.hpp) or resume what it suspended so: recorded as
  /// by "policy"; `start_time` (nonzero) names the very process meant.
  bool by_policy = false;
  uint64_t start_time = 0;
};

/// One process a request comes to.
struct SuspendTarget {
  uint32_t pid = 0;  ///< in the daemon's pid namespace: the one the driver is given
  uint64_t start_time = 0;
  uint32_t uid = 0;
  std::string user, process_name;
  /// Its device footprint: what the driver reports it holding (NVML), else its reserved and
  /// context bytes; per GPU UUID ("GPU-..." or cuwarden's hex form), bytes.
  std::vector<std::pair<std::string, uint64_t>> footprint;
  uint64_t device_bytes = 0;  ///< the footprint's sum
  uint64_t host_bytes = 0;    ///< resume: what the host held for it
  uint64_t since_ns = 0;      ///< resume: when it was suspended (CLOCK_REALTIME)
  double seconds = 0;         ///< how long the driver took (suspend: lock and checkpoint; resume: restore and unlock)
  double first_seconds = 0;   ///< of `seconds`, the first call's share (suspend: the lock; resume: the restore)
  bool done = false;          ///< the driver's work on it succeeded (finish_suspend records it)
  /// resume --gpu onto another GPU than its own: the driver's pairs (every GPU the process
  /// sees, each once: the driver wants them all), what each moved ordinal's UUID is after
  /// the restore, and the GPU it leaves and the one it comes to (NVML index, UUID). Empty
  /// pairs: restored in place.
  std::vector<CheckpointDriver::GpuPair> pairs;
  std::vector<std::pair<uint32_t, std::array<uint8_t, 16>>> moved;
  uint64_t job_share = 0;  ///< resume --gpu: what its job's file counts for it on the GPU it leaves, bytes
  unsigned from_index = 0, to_index = 0;
  std::string from_uuid, to_uuid;
};

/// What came of a request.
struct SuspendResult {
  enum class Outcome { done, refused, failed };
  Outcome outcome = Outcome::failed;
  std::string reason;  ///< refused, failed: why, as the client is told
  SuspendRequest::Action action = SuspendRequest::Action::suspend;
  bool job = false;
  bool by_policy = false;  ///< SuspendRequest::by_policy
  std::string job_name;
  std::vector<SuspendTarget> processes;
};

}  // namespace cuw::daemon

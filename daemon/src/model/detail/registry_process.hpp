// cuwarden daemon: what the registry keeps per interposed process. Private to the
// registry's files (registry.cpp: discovery and draining; control.cpp: limits and policy).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cuw/size.hpp"
#include "model/history.hpp"
#include "model/registry.hpp"
#include "model/ring_view.hpp"
#include "model/snapshots.hpp"

namespace cuw::daemon {

/// An array of ring::kNoLimit, for Process::ceiling.
inline std::array<uint64_t, ring::kMaxDevices> filled_no_limit() {
  std::array<uint64_t, ring::kMaxDevices> a;
  a.fill(ring::kNoLimit);
  return a;
}

struct Registry::Process {
  explicit Process(std::size_t history_capacity) : history(history_capacity) {}
  ~Process();
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;
  std::string file_name;
  std::unique_ptr<RingView> ring;
  uint32_t pid = 0;      ///< in the daemon's pid namespace
  uint32_t ns_pid = 0;   ///< in the process's own (its ring's and live segment's names)
  uint64_t start_time = 0;
  uint32_t uid = 0;
  std::string user;
  bool exited = false;
  uint64_t exited_ns = 0;     ///< header's clean-exit time, else when the daemon noticed
  uint64_t exited_mono = 0;   ///< for the linger timer
  uint64_t events_received = 0;
  uint64_t events_lost = 0;   ///< slots a dead producer claimed but never published
  EventHistory history;
  uint32_t present = 0;       ///< devices present when a drain last read them (bit per ordinal)
  uint32_t idle_drains = 0;   ///< drains in a row that found no event
  uint32_t visits = 0;        ///< drains that visited the ring
  uint64_t beat_ns = 0;       ///< when the heartbeat was last written (CLOCK_REALTIME)
  int pidfd = -1;             ///< pidfd_open() of the process, readable once it has exited; -1: none
  bool pidfd_watched = false; ///< pidfd is in the registry's epoll set (its exit comes from there)
  uint64_t sampled_events = 0;  ///< events_received + events_dropped at the last site sample
  uint32_t policy_done = 0;   ///< devices the current policy has been applied to (bit per ordinal)
  bool policy_warned = false; ///< "cannot apply: read-only ring" said once
  /// Per ordinal, the highest cap the daemon allows the process: the policy's maximum, or what
  /// root last set. A cap in the ring above it is a raise the daemon did not make (the ring is
  /// the process owner's own file): put back at each scan (caps_held.cpp). kNoLimit: none.
  std::array<uint64_t, ring::kMaxDevices> ceiling = filled_no_limit();
  /// The ceiling the site gave its Slurm job (cuw/site_cap.hpp), read once; held like
  /// `ceiling`, on each device until root sets a cap there (root's word replaces the site's).
  std::optional<LimitSpec> site_limit;
  std::string site_file;         ///< where site_limit came from
  bool site_read = false;        ///< read_site_ceiling() ran
  uint32_t site_lifted = 0;      ///< devices root has set a cap on since (bit per ordinal)
  uint64_t tampers = 0;          ///< raises put back, and scans the driver saw it over its ceiling
  uint32_t over_ceiling = 0;     ///< devices the driver last saw over their ceiling (bit per ordinal)
  uint32_t offending_scans = 0;  ///< scans in a row that found it over its ceiling (enforce = "kill")
  bool kill_tried = false;       ///< enforce = "kill" sent its SIGKILL (or failed to, said once)
  uint64_t oom_taken_mono = 0; ///< when its last out-of-memory snapshot was taken (0: never)
  uint64_t sampled_mono = 0;   ///< when its last site sample was taken (0: never)
  /// site_sample()s, oldest first, replaced whole by each new one: every State shares it.
  std::shared_ptr<const SiteSamples> samples = std::make_shared<const SiteSamples>();
  /// Suspended by hand (suspend.cpp): its device memory is on the host since `suspended_ns`.
  bool suspended = false;
  /// A suspend or resume of it is under way on a worker: no other may start.
  bool suspend_busy = false;
  uint64_t suspended_ns = 0;          ///< CLOCK_REALTIME
  uint64_t suspended_host_bytes = 0;
  std::string suspended_by;
  /// Its device footprint when suspended (GPU UUID, bytes): what a resume needs free.
  std::vector<std::pair<std::string, uint64_t>> suspended_footprint;
  /// Suspended by policy to make room for another (room.cpp): the daemon resumes it by itself.
  bool suspended_by_policy = false;
  /// Its priority for making room (room.cpp): the policy's for its user and what it asked,
  /// set once when it was found; never read from its ring again.
  int32_t priority = 0;
  bool waiting_for_room = false;  ///< its interposer is waiting for an answer to a room request
  uint64_t resumed_mono = 0;      ///< when it was last resumed (min_run counts from it); 0: never
  uint64_t room_since_mono = 0;   ///< suspended by policy: since when its footprint has been free (0: not now)
  bool suspended_overdue = false; ///< suspended by policy past its job's max_suspended, no room to resume
  /// The held_back mask last written into its ring (room.cpp: hold_back_for_restores): bit
  /// per ordinal whose GPU a higher-priority process suspended by policy waits to come back to.
  uint32_t held_back = 0;
  /// Suspended by policy: the process it was suspended for (pid, start time; 0: none known).
  uint32_t suspended_for = 0;
  uint64_t suspended_for_start = 0;
  /// Past its job's max_suspended with on_overdue = "end_claim": that process's claim has ended.
  bool claim_ended = false;
  /// In the last State published (retire() reads its header there when the ring faults).
  bool published = false;
};

}  // namespace cuw::daemon

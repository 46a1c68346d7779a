// cuwarden daemon model: a live cap change as typed data — what a client asks (LimitRequest)
// and what came of it (LimitResult). Registry::set_limit takes one and gives the other; the
// wire's JSON for both is views/limit_json's, so nothing here knows JSON.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace cuw::daemon {

/// The new cap a request asks for: a size in bytes, a share of each device, or none.
struct LimitAsk {
  bool remove = false;  ///< no cap (the request's "bytes": null or 2^64-1)
  bool share = false;   ///< `fraction` of each device's physical memory, rather than `bytes`
  double fraction = 0;  ///< in (0, 1] when `share`
  uint64_t bytes = 0;   ///< the cap in bytes, when neither `remove` nor `share`

  /// The cap in bytes on a device of `physical_total` bytes; ring::kNoLimit when `remove`.
  uint64_t resolve(uint64_t physical_total) const;
  /// As people read it, in the limit log's "asked": "none", "50%", "6.00 GiB".
  std::string str() const;
};

/// One set_limit request, checked for types and ranges (views/limit_json parses it).
struct LimitRequest {
  enum class Target { pid, job };
  Target target = Target::pid;
  uint32_t pid = 0;                   ///< Target::pid: 1..2^31-1
  std::optional<uint32_t> device;     ///< Target::pid: one CUDA ordinal; none: every device in use
  std::string job;                    ///< Target::job: a valid job name (cuw/job.hpp)
  /// Target::job: the job's owner, by uid or by login name (at most one is set); neither:
  /// the requester.
  std::optional<uint32_t> user_uid;
  std::optional<std::string> user_name;
  LimitAsk ask;  ///< Target::job: never a share (a job's cap is one size on every GPU)
};

/// What came of a LimitRequest. Every outcome but a request the model could not even
/// attribute (an unknown user name, a requester with no credentials) is also in the limit log.
struct LimitResult {
  enum class Outcome {
    changed,  ///< applied whole: every device (or the job) has the new cap
    refused,  ///< the rules say no: root may do anything, others may only lower their own caps
    failed,   ///< it cannot be done (no such process or job, a read-only or faulting ring...)
  };
  Outcome outcome = Outcome::failed;
  std::string reason;  ///< refused, failed: why, as the client is told
  LimitRequest::Target target = LimitRequest::Target::pid;

  // Set when changed.
  uint32_t uid = 0;   ///< the process's or the job's owner
  std::string user;   ///< uid's login name, or the number as text

  /// Target::pid, one entry per device changed (ordinal order).
  struct DeviceChange {
    uint32_t device = 0;   ///< CUDA ordinal as the process sees it
    uint8_t uuid[16] = {};
    uint64_t old_limit = 0, new_limit = 0;  ///< bytes; ring::kNoLimit: none
    uint64_t used_bytes = 0;                ///< what the process held when its cap changed
  };
  uint32_t pid = 0;          ///< Target::pid
  std::string process_name;  ///< Target::pid
  std::vector<DeviceChange> changes;

  /// Target::job, one entry per GPU the job uses.
  struct JobGpu {
    uint8_t uuid[16] = {};
    uint64_t used_bytes = 0;  ///< the job's bytes on it
  };
  std::string job;                ///< Target::job
  std::vector<uint32_t> members;  ///< Target::job: member pids, the job's slot order
  std::vector<JobGpu> gpus;
  uint64_t old_limit = 0, new_limit = 0;  ///< Target::job: bytes per GPU; job::kNoLimit: none
};

}  // namespace cuw::daemon

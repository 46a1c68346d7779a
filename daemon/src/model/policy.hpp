// cuwarden daemon: the policy file (cuwardend --config cuwarden.toml): default and maximum
// caps per user and per group, for processes and for jobs, and priorities for suspending by
// policy (docs/suspend.md).
//
//   [default]                 # everyone
//   limit = "40G"             # per-device cap given to a process that asks for none
//   max_limit = "80G"         # the most a process may have per device (its own request is lowered)
//   job_limit = "160G"        # per-GPU cap given to a job whose members ask for none
//   max_job_limit = "320G"    # the most a job may have per GPU
//   enforce = "report"        # or "kill": what the daemon does to a process over its max_limit
//   priority = 0              # a process's priority when it asks for none (CUWARDEN_PRIORITY)
//   max_priority = 0          # the most it may ask for (unset: `priority`, so it may only lower it)
//   room_wait = "30s"         # how long an allocation the GPU cannot serve waits for room
//   resume_after = "2s"       # how long free memory must last before a policy resume
//   min_run = "10s"           # how long a resumed process runs before it can be suspended again
//   [user.alice]              # by login name (or numeric uid: [user.1001])
//   max_limit = "20G"
//   [group.students]          # by group name (or numeric gid)
//   max_limit = "10G"
//   [job.nightly-eval]        # by job name (CUWARDEN_JOB; the Slurm plugin's slurm-JOBID)
//   suspend = "never"         # never suspended to make room for another (by hand still may be)
//   max_suspended = "2h"      # suspended by policy longer: resumed when memory allows, else reported
//   on_overdue = "end_claim"  # past max_suspended: the process it was suspended for loses its claim
//
// Every key is one row of CUW_POLICY_KEYS below, which makes the sections' fields, the
// parser's list of keys, the precedence and `empty()`.
//
// Sizes are as cuwarden spells them ("40G", "512MiB", "1.5GB", a number of bytes as
// an integer), "none" for explicitly uncapped, and for limit/max_limit also "N%" of the
// device's memory. No value is under 1 MiB (cuw::kMinCap): a bare `limit = 40` is an error,
// not a 40-byte cap for every process. Priorities are integers from -1000 to 1000 (higher
// goes first). Durations are "30s", "500ms", "2m" or an integer of seconds, up to 1 h.
// Precedence, key by key: the user's section, else the lowest value any of the user's groups
// sets (primary and supplementary groups, from NSS), else [default]. The default limit is
// then lowered to the max when above it. `enforce` is taken the same way, the strictest of
// the groups (a group's "kill" wins over another group's "report").
//
// Errors (bad TOML, unknown sections or keys, bad values, a default above the max in one
// section) are fatal and carry file:line:column; names that do not resolve to a user or
// group are warnings (the account may come later, or from a directory service).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cuw/size.hpp"

namespace cuw::daemon {

/// One value of the policy file: a size (bytes or percent) or "none" (no cap).
struct PolicyValue {
  bool unlimited = false;
  SizeSpec size;
  /// Bytes for a device with `physical_total` bytes; ~0 (kNoLimit) when unlimited.
  uint64_t resolve(uint64_t physical_total) const noexcept;
  std::string str() const;
};

/// What the daemon does to a process found over its ceiling (a cap raised in its own ring
/// past max_limit, or the driver counting more than max_limit plus the context allowance):
/// report it (log, State, counters, event), or report it and, when it is still over at the
/// next scan, end it with SIGKILL.
enum class Enforce { report, kill };

/// A priority: -1000..1000, higher first.
using PolicyPriority = int32_t;
inline constexpr PolicyPriority kMinPriority = -1000, kMaxPriority = 1000;

/// A duration of the policy file, in milliseconds (1 ms .. 1 h).
struct PolicyDuration {
  uint64_t ms = 0;
  bool operator<(const PolicyDuration& o) const noexcept { return ms < o.ms; }
};

// How to add a key: one row here (name, type), its parser for a new type in policy.cpp
// (Parser::parse and tighter(), one overload each), then the docs (docs/caps-and-jobs.md's
// table of keys). The sections' fields, the parser's list of keys, the precedence and
// empty() follow from the row.
// X(key, type)
#define CUW_POLICY_KEYS(X)       \
  X(limit, PolicyValue)          \
  X(max_limit, PolicyValue)      \
  X(job_limit, PolicyValue)      \
  X(max_job_limit, PolicyValue)  \
  X(enforce, Enforce)            \
  X(priority, PolicyPriority)    \
  X(max_priority, PolicyPriority) \
  X(room_wait, PolicyDuration)   \
  X(resume_after, PolicyDuration) \
  X(min_run, PolicyDuration)

#define CUW_POLICY_FIELD_(key, type) std::optional<type> key;
/// The keys of one section; unset keys fall through to the next level.
struct PolicyCaps {
  CUW_POLICY_KEYS(CUW_POLICY_FIELD_)
};

/// What applies to one user after precedence (each key resolved on its own); unset: no
/// section sets it (the *_or() helpers give the defaults).
struct EffectivePolicy {
  CUW_POLICY_KEYS(CUW_POLICY_FIELD_)
  std::string source;  ///< for logs: "user alice", "group students", "default", ...

  /// What the daemon does over the ceiling: report unless a section says kill.
  Enforce enforce_or() const noexcept { return enforce.value_or(Enforce::report); }
  /// The priority of a process that asks for `asked` (CUWARDEN_PRIORITY; nullopt: none):
  /// `priority` (0 unset) when it asks for none, else what it asks lowered to `max_priority`
  /// (unset: `priority`, so a process may only lower its own), within kMinPriority..kMaxPriority.
  PolicyPriority priority_for(std::optional<PolicyPriority> asked) const noexcept;
  /// room_wait (30 s unset), resume_after (2 s), min_run (10 s), in milliseconds.
  uint64_t room_wait_ms() const noexcept { return room_wait ? room_wait->ms : 30'000; }
  uint64_t resume_after_ms() const noexcept { return resume_after ? resume_after->ms : 2'000; }
  uint64_t min_run_ms() const noexcept { return min_run ? min_run->ms : 10'000; }
};
#undef CUW_POLICY_FIELD_

/// The keys of a [job.NAME] section.
struct JobRules {
  bool never_suspend = false;  ///< suspend = "never": never chosen to make room
  /// max_suspended, ms: suspended by policy longer, it is resumed as soon as its memory is
  /// free (without waiting for resume_after or for higher ones), else reported as overdue.
  std::optional<uint64_t> max_suspended_ms;
  /// on_overdue = "end_claim": past max_suspended with no room, the claim of the process it
  /// was suspended for ends (its room requests are answered no, and it is held back on the
  /// GPU until this one is resumed); "wait" (the default): it only waits.
  bool end_claim = false;
};

class Policy {
 public:
  std::string file;  ///< where it came from ("" = no policy file)
  PolicyCaps defaults;
  std::map<std::string, PolicyCaps> users;   ///< by name or numeric uid as written
  std::map<std::string, PolicyCaps> groups;  ///< by name or numeric gid as written
  std::map<std::string, JobRules> jobs;      ///< by job name, whoever's job it is

  /// Whether processes of job `job` ("" : none) are never suspended to make room.
  bool never_suspend(const std::string& job) const {
    const JobRules* r = job_rules(job);
    return r && r->never_suspend;
  }
  /// The [job.NAME] section of job `job` ("": none), or null.
  const JobRules* job_rules(const std::string& job) const {
    const auto it = job.empty() ? jobs.end() : jobs.find(job);
    return it == jobs.end() ? nullptr : &it->second;
  }

  bool empty() const noexcept;
  /// The policy for `uid` (NSS lookups cached per Policy object; the daemon makes a new
  /// object on each reload).
  const EffectivePolicy& for_user(uint32_t uid) const;

 private:
  mutable std::map<uint32_t, EffectivePolicy> cache_;
};

/// Parse policy text. `source` names it in messages ("cuwarden.toml"). Returns nullopt
/// when there are errors; every error is one line "source:line:column: message" appended
/// to *errors. Warnings (same format) go to *warnings and do not fail.
std::optional<Policy> parse_policy(std::string_view text, const std::string& source, std::vector<std::string>* errors,
                                   std::vector<std::string>* warnings);

/// Read and parse the file at `path` (a missing or unreadable file is an error).
std::optional<Policy> load_policy(const std::string& path, std::vector<std::string>* errors,
                                  std::vector<std::string>* warnings);

}  // namespace cuw::daemon

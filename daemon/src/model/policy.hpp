// cuwarden daemon: the policy file (cuwardend --config cuwarden.toml): default and maximum
// caps per user and per group, for processes and for jobs.
//
//   [default]                 # everyone
//   limit = "40G"             # per-device cap given to a process that asks for none
//   max_limit = "80G"         # the most a process may have per device (its own request is lowered)
//   job_limit = "160G"        # per-GPU cap given to a job whose members ask for none
//   max_job_limit = "320G"    # the most a job may have per GPU
//   enforce = "report"        # or "kill": what the daemon does to a process over its max_limit
//   [user.alice]              # by login name (or numeric uid: [user.1001])
//   max_limit = "20G"
//   [group.students]          # by group name (or numeric gid)
//   max_limit = "10G"
//
// Values are sizes as cuwarden spells them ("40G", "512MiB", "1.5GB", a number of bytes as
// an integer), "none" for explicitly uncapped, and for limit/max_limit also "N%" of the
// device's memory. No value is under 1 MiB (cuw::kMinCap): a bare `limit = 40` is an error,
// not a 40-byte cap for every process. Precedence, key by key: the user's section, else the lowest value any
// of the user's groups sets (primary and supplementary groups, from NSS), else [default].
// The default limit is then lowered to the max when above it. `enforce` is taken the same
// way (a group's "kill" wins over another group's "report").
//
// Errors (bad TOML, unknown sections or keys, bad sizes, a default above the max in one
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

/// The keys of one section; unset keys fall through to the next level.
struct PolicyCaps {
  std::optional<PolicyValue> limit, max_limit, job_limit, max_job_limit;
  std::optional<Enforce> enforce;
};

/// What applies to one user after precedence (each key resolved on its own).
struct EffectivePolicy {
  std::optional<PolicyValue> limit, max_limit, job_limit, max_job_limit;
  Enforce enforce = Enforce::report;
  std::string source;  ///< for logs: "user alice", "group students", "default", ...
};

class Policy {
 public:
  std::string file;  ///< where it came from ("" = no policy file)
  PolicyCaps defaults;
  std::map<std::string, PolicyCaps> users;   ///< by name or numeric uid as written
  std::map<std::string, PolicyCaps> groups;  ///< by name or numeric gid as written

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

// cuwarden: a site's ceiling on a Slurm job's caps. The SPANK plugin (cluster/slurm), as root
// in each task's privileged hook, writes the caps it gives the job to
// `<run dir>/ceilings/slurm-<jobid>` (root's, mode 0644, in root's 0755 `ceilings/`), as well
// as into the task's environment. A process of the job cannot change that file, so the
// interposer holds its environment's caps to it at start and the daemon puts back a cap
// raised past it in a ring. The file holds lines `CUWARDEN_LIMIT=value` and
// `CUWARDEN_JOB_LIMIT=value`, in the variables' own syntax.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "cuw/size.hpp"

namespace cuw::site_cap {

/// The directory of ceiling files inside a run directory.
inline constexpr const char* kDirName = "ceilings";

/// `<run_dir>/ceilings/slurm-<job_id>`. Pure; allocates.
std::string slurm_file(const std::string& run_dir, uint32_t job_id);

/// The Slurm job id of a job name the plugin gives ("slurm-123"), or 0 when `job` is not one.
/// Pure.
uint32_t slurm_job_of_name(std::string_view job) noexcept;

/// The Slurm job id of process `pid` (0: the caller) from its cgroup path's `job_<id>`
/// component (Slurm's cgroup plugins put every task there; the task cannot move itself out),
/// or 0 when none. Opens /proc/PID/cgroup: cold paths only. Thread-safe.
uint32_t slurm_job_of_cgroup(uint32_t pid);

/// A ceiling file's caps: each absent when the file does not give it.
struct Ceiling {
  std::optional<LimitSpec> limit;      ///< CUWARDEN_LIMIT's per-process cap
  std::optional<uint64_t> job_limit;   ///< CUWARDEN_JOB_LIMIT's bytes per GPU
  std::string limit_text;              ///< CUWARDEN_LIMIT's value as written ("" when absent)
  std::string job_limit_text;          ///< CUWARDEN_JOB_LIMIT's value as written
};

/// What read() found.
enum class Read {
  absent,   ///< no file (or no ceilings/ directory): no ceiling
  ok,       ///< *out holds the file's caps
  refused,  ///< a file that is not root's to give (or unreadable, or malformed): *why says which
};

/// Reads ceiling file `path`, trusting it only when root made it for root: the file (opened
/// without following a link, a regular file, at most 4 KiB) and its directory belong to uid
/// 0 and neither is writable by group or others. Anything else is refused with *why set, one
/// line naming the path and the owner ("... belongs to uid 1001 (alice), not root"). Opens a
/// file: cold paths only. Thread-safe.
Read read(const std::string& path, Ceiling* out, std::string* why);

}  // namespace cuw::site_cap

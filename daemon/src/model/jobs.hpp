// cuwarden daemon: the job segments (job-<uid>-<name>.cwj in each user's job directory,
// cuw/job.hpp, and in the run directory itself from the previous layout), opened as
// untrusted input, swept of dead members on every scan, shown in the state, given the
// policy, and changed by `cuwarden limit job:NAME`. A job whose last member has been gone
// for the linger time is logged with its peak per GPU and its file removed (job.hpp, "End
// of a job"), so that a node running thousands of jobs keeps no file per finished job.
//
// A job file is written by its user's processes, so every access to its mapping runs under
// the fault guard (the owner may truncate it) and nothing read from it is used as a length.
// Segment::members()/gpus() allocate inside the guard: a fault there leaks that vector and
// unmaps nothing, which is the price of reusing the common reader; no lock is ever held.
#pragma once

#include <sys/types.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "cuw/job.hpp"
#include "model/policy.hpp"

namespace cuw::daemon {

class JobTable {
 public:
  /// A copy of one job, taken under the fault guard.
  struct View {
    uint64_t cap = job::kNoLimit;
    std::vector<job::Segment::MemberInfo> members;  ///< claiming slots left out
    std::vector<job::Segment::GpuInfo> gpus;
    std::vector<uint64_t> used;                     ///< per entry of gpus
  };
  struct Job {
    std::string dir;  ///< its directory, relative to the run directory ("" for the run directory)
    std::string file, name, user;
    uint32_t uid = 0;
    std::unique_ptr<job::Segment> seg;
    dev_t dev = 0;
    ino_t ino = 0;
    std::set<uint64_t> policy_done;  ///< owner words that have had the policy applied
    uint64_t last_cap = job::kNoLimit;  ///< the cap while it last had members, bytes
    uint64_t empty_since_ns = 0;        ///< CLOCK_MONOTONIC when it was first seen empty; 0 = has members
    bool remove_warned = false;         ///< a failed removal said once
  };

  /// `max_jobs`: files opened at once. `linger_ns`: how long a job with no member is kept
  /// before its file is removed (the daemon's --exited-linger); `remove_ended`: false keeps
  /// every file (the daemon's --keep-exited).
  explicit JobTable(std::size_t max_jobs = 1024, uint64_t linger_ns = 0, bool remove_ended = true)
      : max_jobs_(max_jobs), linger_ns_(linger_ns), remove_ended_(remove_ended) {}

  /// A directory holding job files, opened by the caller (who closes `fd` after scan()).
  struct Dir {
    std::string rel;               ///< relative to the run directory; "" for the run directory itself
    int fd = -1;                   ///< O_DIRECTORY descriptor
    int64_t uid = -1;              ///< the user whose files only it may hold; -1: any (the run directory)
    std::set<std::string> names;   ///< the job file names it holds now
  };

  /// Open new job files among `dirs`' names, forget vanished or replaced ones (or ones whose
  /// directory is no longer among `dirs`), sweep dead members of each (their bytes are
  /// reclaimed at once), apply `policy` (may be null) to members that have not had it, and
  /// remove the files of jobs that have had no member for the linger time. `now_ns`:
  /// CLOCK_MONOTONIC. `running`: owner words of processes known to run now, ascending
  /// (Segment::sweep: no liveness check for them).
  void scan(const std::vector<Dir>& dirs, const Policy* policy, uint64_t now_ns,
            std::span<const uint64_t> running = {});
  /// Apply the policy to every member again (after a reload).
  void reset_policy() noexcept;

  Job* find(uint32_t uid, const std::string& name);
  /// Snapshot of a job; false if its mapping faulted (the job is then dropped at the next scan).
  bool view(Job& j, View* out) noexcept;
  /// Set every member's cap (Segment::set_limit; `lower_only` for non-root callers) under the guard. -1 on a fault.
  int64_t set_limit(Job& j, uint64_t bytes, bool lower_only) noexcept;

  /// By path relative to the run directory.
  std::map<std::string, Job>& jobs() noexcept { return jobs_; }
  /// Files refused (path relative to the run directory -> reason), for the state's "problems".
  const std::map<std::string, std::string>& problems() const noexcept { return problems_; }

 private:
  void try_open(const Dir& dir, const std::string& file, uint64_t now_ns);
  /// Remove an empty job's file when no member holds its lock; logs its peaks. True when removed.
  bool try_remove(int dirfd, Job& j);
  void apply_policy(Job& j, const View& v, const Policy& policy);

  std::size_t max_jobs_;
  uint64_t linger_ns_;
  bool remove_ended_;
  std::map<std::string, Job> jobs_;               ///< by path relative to the run directory
  std::map<std::string, std::string> problems_;   ///< by path relative to the run directory
  /// A file not taken, as it was when last probed: an unchanged one is not opened again (the
  /// daemon's open for writing raises IN_CLOSE_WRITE, which wakes the scan that would open it
  /// again, for ever), unless it failed in a way that may pass later, and then once a second.
  struct Refused {
    std::array<int64_t, 4> id{};  ///< device, inode, size, mtime (ns)
    uint64_t probed_ns = 0;       ///< monotonic
    bool lasting = false;         ///< decided by the file itself: probed again only once it changes
  };
  std::map<std::string, Refused> refused_;
  static constexpr uint64_t kRetryNs = 1'000'000'000;  ///< a refusal that may pass later: retried once a second
  static constexpr std::size_t kMaxRefused = 64;       ///< beyond max_jobs_ entries
  std::set<std::string> faulted_;                 ///< dropped on the next scan
};

}  // namespace cuw::daemon

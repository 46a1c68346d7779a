// cuwarden daemon model: the directories job files live in (cuw/job.hpp, choose_dir), as
// the registry finds, checks and, as root, makes them (see Registry::job_dirs).
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <spdlog/spdlog.h>

#include "base/util.hpp"
#include "model/detail/registry_process.hpp"
#include "model/registry.hpp"

namespace cuw::daemon {

namespace {

constexpr std::size_t kMaxJobDirs = 4096;

/// Names in `fd` that look like job files (at most `cap`).
std::set<std::string> job_names(int fd, std::size_t cap) {
  std::set<std::string> out;
  const int dup_fd = dup(fd);
  if (dup_fd < 0) return out;
  DIR* d = fdopendir(dup_fd);
  if (!d) {
    close(dup_fd);
    return out;
  }
  rewinddir(d);
  while (dirent* e = readdir(d)) {
    if (std::strncmp(e->d_name, job::kFilePrefix, std::strlen(job::kFilePrefix)) != 0) continue;
    out.insert(e->d_name);
    if (out.size() >= cap) break;
  }
  closedir(d);
  return out;
}

/// Move what occupies `name` in `parent` aside, out of the way of the user it is named for,
/// to a dot name that says whose it is. Root only (the run directory is sticky).
void rename_aside(int parent, const std::string& where, const std::string& name, uid_t owner, uint32_t for_uid) {
  const std::string aside = fmt::format(".squatted-{}-by-uid{}-{}", name, owner, static_cast<long long>(time(nullptr)));
  if (renameat(parent, name.c_str(), parent, aside.c_str()) == 0)
    spdlog::warn("{}{} belonged to uid {} ({}), not to uid {} ({}) whose job files it names: renamed to {}", where, name,
                 owner, user_name(owner), for_uid, user_name(for_uid), aside);
  else
    spdlog::warn("{}{} belongs to uid {}, not to uid {}: cannot rename it aside: {}", where, name, owner, for_uid,
                 std::strerror(errno));
}

/// `parent`/`name` as the job directory of `uid`: its fd when it is a real directory of
/// `uid` with mode 0700, else -1 (what another user put there renamed aside when we may).
int open_job_dir(int parent, const std::string& where, const std::string& name, uint32_t uid, bool root) {
  struct stat st{};
  if (fstatat(parent, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) return -1;
  if (st.st_uid != uid) {
    // Only a user's own processes (or root, making it for them) may hold its name.
    if (root && st.st_uid != 0) rename_aside(parent, where, name, st.st_uid, uid);
    return -1;
  }
  if (!S_ISDIR(st.st_mode) || (st.st_mode & 07777) != 0700) return -1;  // the user's own doing
  const int fd = openat(parent, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return -1;
  struct stat again{};
  if (fstat(fd, &again) != 0 || again.st_ino != st.st_ino || again.st_uid != uid || (again.st_mode & 07777) != 0700) {
    close(fd);
    return -1;
  }
  return fd;
}

/// Make `jobs`/<uid> for `uid`, 0700 and theirs, atomically: made under a temporary name,
/// given to the user, then renamed into place, so that no member ever sees it root's.
void make_user_dir(int jobs, uint32_t uid) {
  const std::string name = std::to_string(uid);
  const std::string tmp = fmt::format(".new-{}-{}", uid, getpid());
  unlinkat(jobs, tmp.c_str(), AT_REMOVEDIR);
  if (mkdirat(jobs, tmp.c_str(), 0700) != 0) return;
  if (fchownat(jobs, tmp.c_str(), uid, static_cast<gid_t>(-1), AT_SYMLINK_NOFOLLOW) != 0 ||
      fchmodat(jobs, tmp.c_str(), 0700, 0) != 0 ||
      renameat2(jobs, tmp.c_str(), jobs, name.c_str(), RENAME_NOREPLACE) != 0)
    unlinkat(jobs, tmp.c_str(), AT_REMOVEDIR);
  else
    spdlog::info("made jobs/{} for uid {} ({})", name, uid, user_name(uid));
}

/// The run directory's jobs/ folder, made (root, 01777, like the run directory) when absent;
/// what another user put under its name is renamed aside first. -1 when there is none.
int open_jobs_root(int dirfd, bool root) {
  struct stat st{};
  if (fstatat(dirfd, job::kJobsDir, &st, AT_SYMLINK_NOFOLLOW) == 0 && root &&
      (!S_ISDIR(st.st_mode) || st.st_uid != 0)) {
    const std::string aside = fmt::format(".squatted-{}-by-uid{}-{}", job::kJobsDir, st.st_uid,
                                          static_cast<long long>(time(nullptr)));
    if (renameat(dirfd, job::kJobsDir, dirfd, aside.c_str()) == 0)
      spdlog::warn("{} belonged to uid {} ({}): renamed to {}", job::kJobsDir, st.st_uid, user_name(st.st_uid), aside);
  }
  if (root && mkdirat(dirfd, job::kJobsDir, 01777) == 0) fchmodat(dirfd, job::kJobsDir, 01777, 0);
  const int fd = openat(dirfd, job::kJobsDir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return -1;
  // Another user's jobs/ could hold anything under any uid's name: members refuse it, and so
  // do we (a root daemon has moved it aside above).
  if (fstat(fd, &st) != 0 || (st.st_uid != 0 && st.st_uid != geteuid())) {
    close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

std::vector<JobTable::Dir> Registry::job_dirs() {
  const bool root = geteuid() == 0;
  const std::size_t cap = opt_.max_jobs + 1024;
  std::vector<JobTable::Dir> dirs;
  for (const auto& [label, r] : roots_) {
    const std::string prefix = label.empty() ? "" : label + "/";
    if (dirs.size() >= kMaxJobDirs) break;
    dirs.push_back({label, r.fd, -1, r.jobs});  // the previous layout's files

    if (const int jobs = open_jobs_root(r.fd, root); jobs >= 0) {
      if (root)
        for (const auto& [name, p] : procs_) {
          // A user's directory in the root its rings are in (a key's label is all before its last slash).
          const std::size_t slash = name.rfind('/');
          if (p->exited || (slash == std::string::npos ? "" : name.substr(0, slash)) != label ||
              job_dirs_made_.count({label, p->uid}) || job_dirs_made_.size() >= kMaxJobDirs)
            continue;
          // Made once it is there and the user's; tried again each scan until then (what
          // another user put under its name is renamed aside below).
          make_user_dir(jobs, p->uid);
          struct stat st{};
          if (fstatat(jobs, std::to_string(p->uid).c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode) &&
              st.st_uid == p->uid)
            job_dirs_made_.insert({label, p->uid});
        }
      const int list_fd = dup(jobs);
      if (DIR* d = list_fd >= 0 ? fdopendir(list_fd) : nullptr) {
        rewinddir(d);
        while (dirent* e = readdir(d)) {
          char* end = nullptr;
          const std::string name = e->d_name;
          if (name.empty() || name[0] < '0' || name[0] > '9' || name.size() > 10) continue;
          const unsigned long long uid = std::strtoull(name.c_str(), &end, 10);
          if (*end != '\0' || uid > 0xffffffffULL || std::to_string(uid) != name) continue;
          const std::string rel = prefix + job::kJobsDir + "/" + name;
          const int fd = open_job_dir(jobs, prefix + job::kJobsDir + "/", name, static_cast<uint32_t>(uid), root);
          if (fd < 0) continue;
          dirs.push_back({rel, fd, static_cast<int64_t>(uid), job_names(fd, cap)});
          if (dirs.size() >= kMaxJobDirs) break;
        }
        closedir(d);
      } else if (list_fd >= 0) {
        close(list_fd);
      }
      close(jobs);
    }
    for (const auto& name : r.fallbacks) {
      uint32_t uid = 0;
      if (dirs.size() >= kMaxJobDirs || !job::parse_fallback_dir_name(name, &uid, nullptr)) continue;
      const int fd = open_job_dir(r.fd, prefix, name, uid, root);
      if (fd >= 0) dirs.push_back({prefix + name, fd, static_cast<int64_t>(uid), job_names(fd, cap)});
    }
  }
  return dirs;
}

}  // namespace cuw::daemon

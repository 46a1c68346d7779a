// cuwarden: where a job's file lives (cuw/job.hpp, choose_dir): a directory only its user
// can write, so that no other user can take the file's name first.
#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "cuw/paths.hpp"
#include "cuw/job.hpp"

namespace cuw::job {

namespace {

using paths::owner_text;

enum class Dir { usable, absent, foreign };

/// What `path` is to a member of `uid`; `why` says why a foreign one is not used.
Dir examine(const std::string& path, uint32_t uid, std::string* why) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return Dir::absent;
    *why = path + ": " + std::strerror(errno);
    return Dir::foreign;
  }
  if (!S_ISDIR(st.st_mode)) {
    *why = path + " is not a directory (it belongs to " + owner_text(st.st_uid) + ")";
    return Dir::foreign;
  }
  if (st.st_uid != uid) {
    *why = path + " belongs to " + owner_text(st.st_uid);
    return Dir::foreign;
  }
  if ((st.st_mode & 07777) != 0700) {
    char mode[16];
    std::snprintf(mode, sizeof mode, "%o", static_cast<unsigned>(st.st_mode & 07777));
    *why = path + " has mode " + mode + ", not 0700";
    return Dir::foreign;
  }
  return Dir::usable;
}

/// Make `path` (0700, as the caller) unless it exists, then examine it again.
Dir make(const std::string& path, uint32_t uid, std::string* why) {
  if (::mkdir(path.c_str(), 0700) == 0) {
    // mkdir's mode went through the umask: only bits were removed, so 0700 needs no more
    // unless the umask took the owner's own; chmod of the name is safe (ours, a directory).
    ::chmod(path.c_str(), 0700);
  } else if (errno != EEXIST) {
    *why = path + ": cannot create it: " + std::strerror(errno);
    return Dir::foreign;
  }
  return examine(path, uid, why);
}

bool has_file(const std::string& dir, const std::string& file) {
  struct stat st {};
  return ::lstat((dir + "/" + file).c_str(), &st) == 0;
}

/// Whether `path` is a job file of `uid` (regular, mode 0600) that a live member holds.
bool held_by_a_member(const std::string& path, uint32_t uid) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st {};
  bool held = false;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == uid && (st.st_mode & 07777) == 0600) {
    // Members hold the shared lock from before they join until they exit. The exclusive
    // probe is dropped at once: a member opening meanwhile retries its shared lock for a
    // second, as it does while the daemon checks the file. Where flock is not supported
    // nobody can tell, and the job is taken to be running.
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0)
      ::flock(fd, LOCK_UN);
    else
      held = true;
  }
  ::close(fd);
  return held;
}

}  // namespace

std::string fallback_dir_name(uint32_t uid, uint32_t n) {
  return "jobs-" + std::to_string(uid) + "-" + std::to_string(n);
}

bool parse_fallback_dir_name(const std::string& name, uint32_t* uid, uint32_t* n) {
  if (name.rfind("jobs-", 0) != 0) return false;
  const std::string rest = name.substr(5);
  const size_t dash = rest.find('-');
  if (dash == std::string::npos || dash == 0 || dash > 10 || dash + 1 >= rest.size() || rest.size() - dash - 1 > 2)
    return false;
  uint64_t u = 0, k = 0;
  for (size_t i = 0; i < rest.size(); ++i) {
    if (i == dash) continue;
    const char c = rest[i];
    if (c < '0' || c > '9') return false;
    uint64_t& v = i < dash ? u : k;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  if (u > 0xffffffffULL || k >= kFallbackDirs || std::to_string(k) != rest.substr(dash + 1)) return false;
  if (uid) *uid = static_cast<uint32_t>(u);
  if (n) *n = static_cast<uint32_t>(k);
  return true;
}

bool choose_dir(const std::string& run_dir, uint32_t uid, const std::string& name, DirChoice* out,
                std::string* error) {
  *out = DirChoice{};
  const std::string file = file_name(uid, name);
  const std::string jobs = run_dir + "/" + kJobsDir;
  const std::string primary = jobs + "/" + std::to_string(uid);
  auto fallback = [&](uint32_t n) { return run_dir + "/" + fallback_dir_name(uid, n); };
  std::string why;

  // The previous release kept job files in the run directory itself. While a member of
  // that release still holds its file there, join it there, so that an upgrade in the
  // middle of a job does not split its cap. Only a file of `uid` qualifies, and nobody else
  // can make one (the run directory is sticky or the user's); a file nobody holds is left
  // for the daemon to remove, and new jobs never start there.
  if (held_by_a_member(run_dir + "/" + file, uid)) {
    out->path = run_dir;
    return true;
  }

  // The job already runs somewhere: join it there (a squat removed since it began, or a
  // directory made since by root, must not split it).
  const Dir first = examine(primary, uid, &why);
  if (first == Dir::usable && has_file(primary, file)) {
    out->path = primary;
    return true;
  }
  const std::string primary_why = first == Dir::foreign ? why : std::string();
  for (uint32_t n = 0; n < kFallbackDirs; ++n) {
    const std::string p = fallback(n);
    std::string ignored;
    if (examine(p, uid, &ignored) == Dir::usable && has_file(p, file)) {
      out->path = p;
      out->skipped = primary_why;
      return true;
    }
  }

  // A new job: the first usable candidate, made where absent.
  auto skip = [&](const std::string& reason) {
    if (!out->skipped.empty()) out->skipped += "; ";
    out->skipped += reason;
  };
  struct stat js {}, rs {};
  bool jobs_ok = ::lstat(jobs.c_str(), &js) == 0 && S_ISDIR(js.st_mode) && (js.st_uid == 0 || js.st_uid == uid);
  if (!jobs_ok && errno == ENOENT && ::lstat(run_dir.c_str(), &rs) == 0 && S_ISDIR(rs.st_mode) && rs.st_uid == uid) {
    // Our own run directory: its jobs folder is ours to make (shared like the run directory
    // when that is world-writable).
    const mode_t mode = (rs.st_mode & S_IWOTH) ? 01777 : 0755;
    if (::mkdir(jobs.c_str(), mode) == 0) ::chmod(jobs.c_str(), mode);
    jobs_ok = ::lstat(jobs.c_str(), &js) == 0 && S_ISDIR(js.st_mode) && (js.st_uid == 0 || js.st_uid == uid);
  } else if (!jobs_ok && ::lstat(jobs.c_str(), &js) == 0) {
    skip(jobs + (S_ISDIR(js.st_mode) ? " belongs to " : " is not a directory; it belongs to ") + owner_text(js.st_uid));
  }
  if (jobs_ok) {
    if (make(primary, uid, &why) == Dir::usable) {
      out->path = primary;
      return true;
    }
    skip(why);
  }
  for (uint32_t n = 0; n < kFallbackDirs; ++n) {
    const std::string p = fallback(n);
    if (make(p, uid, &why) == Dir::usable) {
      out->path = p;
      return true;
    }
    skip(why);
  }
  *error = "no usable job directory under " + run_dir + " (" + out->skipped + ")";
  out->skipped.clear();
  return false;
}

}  // namespace cuw::job

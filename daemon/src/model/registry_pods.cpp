// cuwarden daemon model: the directories the registry lists, the run directory and, with
// --pods-dir, every pod's (see Registry::Root). On Kubernetes each pod mounts only its own
// <pods dir>/<pod UID> as its run directory; one daemon follows them all, each through a
// descriptor of its own, so that nothing one pod writes names a file of another.
#include <dirent.h>
#include <fcntl.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <spdlog/spdlog.h>

#include "cuw/job.hpp"
#include "cuw/paths.hpp"
#include "model/registry.hpp"

namespace cuw::daemon {

namespace {

constexpr std::size_t kMaxPods = 4096;      // pods' directories followed at once (one fd each)
constexpr std::size_t kMaxListed = 1024;    // names beyond the limits kept (registry.cpp's kMaxProblems)
// What makes a directory's listing change: as the run directory's own watch (main.cpp).
constexpr uint32_t kWatchMask =
    IN_CREATE | IN_MOVED_TO | IN_CLOSE_WRITE | IN_DELETE | IN_MOVED_FROM | IN_ATTRIB | IN_ONLYDIR | IN_DONT_FOLLOW;

/// An inotify watch on the directory `fd` is open on (through /proc/self/fd: the directory
/// opened, whatever its name points at now); -1 when there is none.
int watch_fd_dir(int inotify_fd, int fd) {
  if (inotify_fd < 0) return -1;
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  // Not IN_DONT_FOLLOW here: the magic link is the one to follow.
  return inotify_add_watch(inotify_fd, path.c_str(), kWatchMask & ~IN_DONT_FOLLOW);
}

}  // namespace

void Registry::list_pods() {
  if (opt_.pods_dir.empty()) return;
  const bool root_user = geteuid() == 0;
  if (root_user && mkdirat(dirfd_, opt_.pods_dir.c_str(), 0755) == 0)
    spdlog::info("made the pods' directory {}/{}", opt_.run_dir, opt_.pods_dir);
  std::set<std::string> seen{""};
  const int pods = openat(dirfd_, opt_.pods_dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  struct stat st{};
  // Pods must not make entries here: only the daemon's user (or root) may write it, or one
  // pod could make a link named after another's directory, or a directory of its own.
  const bool safe = pods >= 0 && fstat(pods, &st) == 0 && (st.st_uid == 0 || st.st_uid == geteuid()) &&
                    (st.st_mode & 022) == 0;
  if (!safe && !pods_warned_) {
    spdlog::error("pods' directory {}/{}: {}; not followed", opt_.run_dir, opt_.pods_dir,
                  pods < 0 ? std::strerror(errno) : "writable by others than its owner, or not root's");
    pods_warned_ = true;
  }
  if (safe && !pods_watched_) pods_watched_ = watch_fd_dir(opt_.watch_fd, pods) >= 0;
  DIR* d = safe ? fdopendir(dup(pods)) : nullptr;
  const std::string prefix = opt_.pods_dir + "/";
  while (dirent* e = d ? readdir(d) : nullptr) {
    const std::string name = e->d_name;
    if (name.empty() || name[0] == '.') continue;
    const std::string label = prefix + name;
    struct stat sub{};
    // A link (or anything but a directory) is refused.
    if (fstatat(pods, name.c_str(), &sub, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(sub.st_mode)) continue;
    if (auto it = roots_.find(label);
        it != roots_.end() && it->second.dev == sub.st_dev && it->second.ino == sub.st_ino) {
      seen.insert(label);
      continue;
    }
    if (roots_.size() > kMaxPods) continue;
    const int fd = openat(pods, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    struct stat opened{};
    if (fd < 0) continue;
    if (fstat(fd, &opened) != 0 || opened.st_dev != sub.st_dev || opened.st_ino != sub.st_ino) {
      close(fd);  // replaced since the fstatat: looked at again at the next listing
      continue;
    }
    if (auto it = roots_.find(label); it != roots_.end()) {  // another directory under the same name
      if (it->second.watch >= 0) inotify_rm_watch(opt_.watch_fd, it->second.watch);
      close(it->second.fd);
      roots_.erase(it);
    }
    Root& r = roots_[label];
    r.fd = fd;
    r.dev = opened.st_dev;
    r.ino = opened.st_ino;
    r.watch = watch_fd_dir(opt_.watch_fd, fd);
    seen.insert(label);
    spdlog::info("pod directory {}/{}: followed", opt_.run_dir, label);
  }
  if (d) closedir(d);
  if (pods >= 0) close(pods);
  for (auto it = roots_.begin(); it != roots_.end();) {
    if (seen.count(it->first)) {
      ++it;
      continue;
    }
    // Its processes stay until they exit (their rings are mapped); their files are the
    // pod's directory's, gone with it.
    spdlog::info("pod directory {}/{}: gone", opt_.run_dir, it->first);
    if (it->second.watch >= 0) inotify_rm_watch(opt_.watch_fd, it->second.watch);
    close(it->second.fd);
    it = roots_.erase(it);
  }
}

void Registry::list_root(const std::string& label, Root& root, std::set<std::string>& rings) {
  const int fd = dup(root.fd);
  DIR* d = fd >= 0 ? fdopendir(fd) : nullptr;
  if (!d) {
    if (fd >= 0) close(fd);
    spdlog::warn("scan of {}/{}: {}", opt_.run_dir, label, std::strerror(errno));
    return;
  }
  rewinddir(d);
  std::set<std::string> jobs, fallbacks;
  const std::string prefix = label.empty() ? "" : label + "/";
  while (dirent* ent = readdir(d)) {
    const std::string name = ent->d_name;
    if (name.rfind(job::kFilePrefix, 0) == 0) {
      if (jobs.size() < opt_.max_jobs + kMaxListed) jobs.insert(name);
      continue;
    }
    if (job::parse_fallback_dir_name(name, nullptr, nullptr)) {
      if (fallbacks.size() < kMaxListed) fallbacks.insert(name);
      continue;
    }
    if (name.rfind(paths::kRingPrefix, 0) != 0) continue;  // socket, temporary files, ...
    if (rings.size() > opt_.max_rings + kMaxListed) break;
    rings.insert(prefix + name);
  }
  closedir(d);
  root.jobs.swap(jobs);
  root.fallbacks.swap(fallbacks);
}

std::pair<int, std::string> Registry::locate(const std::string& key) const {
  const std::size_t slash = key.rfind('/');
  if (slash == std::string::npos) return {dirfd_, key};
  const auto it = roots_.find(key.substr(0, slash));
  return {it == roots_.end() ? -1 : it->second.fd, key.substr(slash + 1)};
}

std::string Registry::dir_of(const std::string& key) const {
  const std::size_t slash = key.rfind('/');
  return slash == std::string::npos ? opt_.run_dir : opt_.run_dir + "/" + key.substr(0, slash);
}

}  // namespace cuw::daemon

// cuwarden: run-directory and ring-file naming.
#include "cuw/paths.hpp"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pwd.h>
#include <sys/socket.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "cuw/job.hpp"
#include "cuw/ring.hpp"

namespace cuw::paths {

std::string run_dir_from(const char* value) {
  if (!value || !*value) return kDefaultRunDir;
  std::string s(value);
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

std::string run_dir() { return run_dir_from(secure_getenv(options::get(options::Id::CUWARDEN_RUN_DIR).variable)); }

std::string socket_path_for(const char* socket, const char* run_dir) {
  if (socket && *socket) return socket;
  if (run_dir && *run_dir) {
    const std::string dir = run_dir_from(run_dir);
    if (dir != kDefaultRunDir) return dir + "/" + kRunDirSocketDir + "/" + kSocketName;
  }
  return std::string(kDefaultSocketDir) + "/" + kSocketName;
}

std::string socket_path() {
  return socket_path_for(secure_getenv(options::get(options::Id::CUWARDEN_SOCKET).variable),
                         secure_getenv(options::get(options::Id::CUWARDEN_RUN_DIR).variable));
}

bool trusted_socket_dir(const std::string& path, std::string* why) {
  const size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) {
    if (why) *why = dir + ": " + std::strerror(errno);
    return false;
  }
  if (!S_ISDIR(st.st_mode)) {
    if (why) *why = dir + " is not a directory";
    return false;
  }
  if (st.st_uid != 0 && st.st_uid != ::geteuid()) {
    if (why) *why = dir + " is owned by uid " + std::to_string(st.st_uid) + ", not root or you";
    return false;
  }
  return true;
}

bool trusted_peer(int fd, std::string* why) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    if (why) *why = std::string("cannot read the server's credentials: ") + std::strerror(errno);
    return false;
  }
  if (cred.uid != 0 && cred.uid != ::geteuid()) {
    if (why) *why = "it is served by uid " + std::to_string(cred.uid) + " (pid " + std::to_string(cred.pid) +
                    "), not root or you: not believed";
    return false;
  }
  return true;
}

std::string ring_file_name(uint32_t pid, uint64_t start_time) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "%s%u-%llu%s", kRingPrefix, pid, static_cast<unsigned long long>(start_time),
                kRingSuffix);
  return buf;
}

bool parse_ring_file_name(const std::string& name, uint32_t* pid, uint64_t* start_time) {
  const size_t plen = std::strlen(kRingPrefix), slen = std::strlen(kRingSuffix);
  if (name.size() <= plen + slen || name.compare(0, plen, kRingPrefix) != 0 ||
      name.compare(name.size() - slen, slen, kRingSuffix) != 0)
    return false;
  std::string mid = name.substr(plen, name.size() - plen - slen);
  size_t dash = mid.find('-');
  if (dash == std::string::npos || dash == 0 || dash + 1 >= mid.size()) return false;
  uint64_t p = 0, t = 0;
  for (size_t i = 0; i < dash; ++i) {
    if (mid[i] < '0' || mid[i] > '9' || p > 0xffffffffULL / 10) return false;
    p = p * 10 + static_cast<uint64_t>(mid[i] - '0');
  }
  for (size_t i = dash + 1; i < mid.size(); ++i) {
    if (mid[i] < '0' || mid[i] > '9' || t > (~0ULL) / 10 - 9) return false;
    t = t * 10 + static_cast<uint64_t>(mid[i] - '0');
  }
  if (p == 0 || p > 0xffffffffULL) return false;
  if (pid) *pid = static_cast<uint32_t>(p);
  if (start_time) *start_time = t;
  return true;
}

namespace {

/// State letter and starttime from a /proc/<pid>/stat file.
bool stat_file(const char* path, char* state, uint64_t* start_time) {
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[1024];
  ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return false;
  buf[n] = '\0';
  // comm may contain spaces and ')': fields resume after the last ')'.
  char* p = std::strrchr(buf, ')');
  if (!p || p[1] != ' ') return false;
  p += 2;
  const char st = *p;  // field 3
  int field = 3;       // starttime is field 22
  while (*p && field < 22) {
    while (*p && *p != ' ') ++p;
    while (*p == ' ') ++p;
    ++field;
  }
  if (field != 22 || *p < '0' || *p > '9') return false;
  if (state) *state = st;
  if (start_time) *start_time = std::strtoull(p, nullptr, 10);
  return true;
}

/// Whether /proc shows our own pid namespace: a process in a pid namespace of its own whose
/// /proc is still its parent's sees other processes under its pid numbers there.
bool proc_is_ours() {
  char buf[32];
  const ssize_t n = ::readlink("/proc/self", buf, sizeof buf - 1);
  if (n <= 0) return false;
  buf[n] = '\0';
  return std::strtoul(buf, nullptr, 10) == static_cast<unsigned long>(::getpid());
}

/// Whole small file into buf (NUL-terminated); false when unreadable.
bool read_text(const char* path, char* buf, size_t cap) {
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const ssize_t n = ::read(fd, buf, cap - 1);
  ::close(fd);
  if (n <= 0) return false;
  buf[n] = '\0';
  return true;
}

}  // namespace

bool process_stat(uint32_t pid, char* state, uint64_t* start_time) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%u/stat", pid);
  return stat_file(path, state, start_time);
}

uint64_t self_start_time() {
  uint64_t start = 0;
  return stat_file("/proc/self/stat", nullptr, &start) ? start : 0;
}

uint64_t process_start_time(uint32_t pid) {
  uint64_t start = 0;
  return process_stat(pid, nullptr, &start) ? start : 0;
}

bool process_gone(uint32_t pid, uint64_t start_time) {
  if (pid == 0 || pid > 0x3fffffffU) return false;
  // No process of that pid in our namespace: proof. pidfd_open needs no permission and
  // speaks of our own namespace whatever /proc shows.
  const long fd = ::syscall(SYS_pidfd_open, static_cast<pid_t>(pid), 0);
  if (fd >= 0) ::close(static_cast<int>(fd));
  else if (errno == ESRCH) return true;
  else if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return true;
  // It exists: only /proc of our own namespace can tell it is another process (a reused pid)
  // or a zombie; what cannot be read is presumed alive.
  if (!proc_is_ours()) return false;
  char state = 0;
  uint64_t start = 0;
  if (!process_stat(pid, &state, &start)) return false;
  return start != start_time || state == 'Z' || state == 'X';
}

uint64_t pid_namespace(uint32_t pid) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%u/ns/pid", pid);
  struct stat st {};
  return ::stat(path, &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
}

uint32_t innermost_pid(uint32_t pid) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%u/status", pid);
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char buf[4096];
  const ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return 0;
  buf[n] = '\0';
  const char* line = std::strstr(buf, "\nNSpid:");
  if (!line) return 0;
  uint32_t last = 0;
  for (const char* p = line + 7; *p && *p != '\n';) {
    char* end = nullptr;
    const unsigned long v = std::strtoul(p, &end, 10);
    if (end == p) {
      ++p;
      continue;
    }
    last = static_cast<uint32_t>(v);
    p = end;
  }
  return last;
}

int64_t host_pid(uint64_t pidns, uint32_t ns_pid) {
  if (ns_pid == 0) return -1;
  const uint64_t self = job::self_pidns();
  if (pidns == 0 || pidns == self) return ns_pid;
  if (!proc_is_ours()) return -1;
  DIR* d = ::opendir("/proc");
  if (!d) return -1;
  int64_t found = -1;
  char path[64], buf[4096];
  while (const dirent* e = ::readdir(d)) {
    if (e->d_name[0] < '1' || e->d_name[0] > '9') continue;
    const unsigned long p = std::strtoul(e->d_name, nullptr, 10);
    // Its namespace first (one stat, no read); then NSpid: the pid in each namespace from
    // ours inward, the last being the process's own.
    std::snprintf(path, sizeof path, "/proc/%lu/ns/pid", p);
    struct stat st {};
    if (::stat(path, &st) != 0 || static_cast<uint64_t>(st.st_ino) != pidns) continue;
    std::snprintf(path, sizeof path, "/proc/%lu/status", p);
    if (!read_text(path, buf, sizeof buf)) continue;
    const char* line = std::strstr(buf, "\nNSpid:");
    if (!line) continue;
    line += 7;
    const char* end = std::strchr(line, '\n');
    unsigned long last = 0;
    int fields = 0;
    for (const char* q = line; *q && (!end || q < end);) {
      while (*q == ' ' || *q == '\t') ++q;
      if (*q < '0' || *q > '9') break;
      char* after = nullptr;
      last = std::strtoul(q, &after, 10);
      ++fields;
      q = after;
    }
    if (fields < 2 || last != ns_pid) continue;
    found = static_cast<int64_t>(p);
    break;
  }
  ::closedir(d);
  return found;
}

namespace {

/// The pid namespace a ring file's writer recorded (RingHeader::pidns): 0 for a writer that
/// predates the field, or a file too short to hold it.
uint64_t ring_pidns(int dfd, const char* name) {
  const int fd = ::openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) return 0;
  uint64_t ns = 0;
  if (::pread(fd, &ns, sizeof ns, offsetof(ring::RingHeader, pidns)) != static_cast<ssize_t>(sizeof ns)) ns = 0;
  ::close(fd);
  return ns;
}

}  // namespace

int remove_dead_rings(const std::string& dir, uint32_t uid) {
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (dfd < 0) return 0;
  DIR* d = ::fdopendir(dfd);
  if (!d) {
    ::close(dfd);
    return 0;
  }
  const uint64_t self_ns = job::self_pidns();
  int removed = 0;
  while (const dirent* e = ::readdir(d)) {
    uint32_t pid = 0;
    uint64_t start = 0;
    if (!parse_ring_file_name(e->d_name, &pid, &start)) continue;
    struct stat st {};
    if (::fstatat(dfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) continue;
    if (st.st_uid != uid) continue;  // another user's: the daemon's to clean
    // Of our own namespace only, where its pid means what it meant to its writer.
    if (self_ns == 0 || ring_pidns(dfd, e->d_name) != self_ns) continue;
    if (process_gone(pid, start) && ::unlinkat(dfd, e->d_name, 0) == 0) {
      ++removed;
      // Its live segment (cuw/live.hpp) goes with it: same process, same owner.
      const std::string live = "live-" + std::to_string(pid) + "-" + std::to_string(start) + ".cwl";
      struct stat ls {};
      if (::fstatat(dfd, live.c_str(), &ls, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(ls.st_mode) && ls.st_uid == st.st_uid)
        ::unlinkat(dfd, live.c_str(), 0);
    }
  }
  ::closedir(d);
  return removed;
}

std::string owner_text(uint32_t uid) {
  std::string s = "uid " + std::to_string(uid);
  passwd pw{}, *found = nullptr;
  char buf[1024];
  if (::getpwuid_r(uid, &pw, buf, sizeof buf, &found) == 0 && found && found->pw_name)
    s += std::string(" (") + found->pw_name + ")";
  return s;
}

}  // namespace cuw::paths

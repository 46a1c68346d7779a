// cuwarden interposer core: which run directory this process may use (see run_dir.hpp).
#include "core/run_dir.hpp"

#include <errno.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <cstring>

namespace cuw::core {

namespace {

/// A directory this process may keep its files in: ours or root's, never a link, and
/// writable by nobody else unless sticky (then nobody else can remove what we put there).
bool trusted(const struct stat& st, unsigned uid) {
  if (!S_ISDIR(st.st_mode) || (st.st_uid != 0 && st.st_uid != uid)) return false;
  return (st.st_mode & (S_IWGRP | S_IWOTH)) == 0 || (st.st_mode & S_ISVTX) != 0;
}

/// `path`, made 0700 when absent; usable when it is ours and writable by nobody else.
bool own_dir(const std::string& path, unsigned uid) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno != ENOENT || ::mkdir(path.c_str(), 0700) != 0) return false;
    if (::lstat(path.c_str(), &st) != 0) return false;
  }
  return S_ISDIR(st.st_mode) && st.st_uid == uid && (st.st_mode & (S_IWGRP | S_IWOTH)) == 0;
}

}  // namespace

std::string choose_run_dir(const std::string& dir, unsigned uid, std::string* note, bool* suspicious) {
  note->clear();
  *suspicious = false;
  struct stat st {};
  const bool exists = ::lstat(dir.c_str(), &st) == 0;
  if (exists && trusted(st, uid)) return dir;
  std::string why;
  if (!exists) {
    why = "run directory " + dir + " does not exist (root or the daemon makes it)";
  } else if (S_ISLNK(st.st_mode)) {
    why = "run directory " + dir + " is a symbolic link";
    *suspicious = true;
  } else if (!S_ISDIR(st.st_mode)) {
    why = "run directory " + dir + " is not a directory";
    *suspicious = true;
  } else if (st.st_uid != 0 && st.st_uid != uid) {
    why = "run directory " + dir + " belongs to uid " + std::to_string(st.st_uid) +
          ", who could delete or replace this process's files";
    *suspicious = true;
  } else {
    why = "run directory " + dir + " is writable by other users and not sticky";
    *suspicious = true;
  }
  std::string candidates[2];
  if (dir != "/") candidates[0] = dir + "-" + std::to_string(uid);
  if (const char* xdg = ::secure_getenv("XDG_RUNTIME_DIR"); xdg && xdg[0] == '/') {
    struct stat xs {};
    if (::lstat(xdg, &xs) == 0 && S_ISDIR(xs.st_mode) && xs.st_uid == uid) candidates[1] = std::string(xdg) + "/cuwarden";
  }
  for (const std::string& c : candidates) {
    if (c.empty() || !own_dir(c, uid)) continue;
    *note = why + "; using " + c + " instead (a daemon watching " + dir + " does not see this process)";
    return c;
  }
  *note = why + "; no per-user directory is usable either, so the counters are private (no daemon sees them)";
  return std::string();
}

}  // namespace cuw::core

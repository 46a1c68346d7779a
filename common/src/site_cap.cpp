// cuwarden: a site's ceiling file for a Slurm job (cuw/site_cap.hpp). Trusted only as root's:
// the same rule the socket's directory follows for the CLI (cuw/paths.hpp), stricter in that
// the caller's own uid does not count, since the caller is the user the ceiling holds.
#include "cuw/site_cap.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "cuw/paths.hpp"

namespace cuw::site_cap {

namespace {

using paths::owner_text;

/// The largest ceiling file read: two short lines.
constexpr std::size_t kMaxFile = 4096;

/// Root's and writable by root alone; else false with *why naming `path`.
bool roots(const std::string& path, const struct stat& st, std::string* why) {
  if (st.st_uid != 0) {
    *why = path + " belongs to " + owner_text(st.st_uid) + ", not root";
    return false;
  }
  if (st.st_mode & (S_IWGRP | S_IWOTH)) {
    char mode[16];
    std::snprintf(mode, sizeof mode, "%o", static_cast<unsigned>(st.st_mode & 07777));
    *why = path + " has mode " + mode + ": others may write it";
    return false;
  }
  return true;
}

std::string_view trim(std::string_view s) {
  const std::size_t a = s.find_first_not_of(" \t\r");
  if (a == std::string_view::npos) return {};
  return s.substr(a, s.find_last_not_of(" \t\r") - a + 1);
}

}  // namespace

std::string slurm_file(const std::string& run_dir, uint32_t job_id) {
  return run_dir + "/" + kDirName + "/slurm-" + std::to_string(job_id);
}

uint32_t slurm_job_of_name(std::string_view job) noexcept {
  constexpr std::string_view kPrefix = "slurm-";
  if (job.substr(0, kPrefix.size()) != kPrefix || job.size() == kPrefix.size() || job.size() > kPrefix.size() + 10)
    return 0;
  uint64_t id = 0;
  for (char c : job.substr(kPrefix.size())) {
    if (c < '0' || c > '9') return 0;
    id = id * 10 + static_cast<uint64_t>(c - '0');
  }
  return id > UINT32_MAX ? 0 : static_cast<uint32_t>(id);
}

uint32_t slurm_job_of_cgroup(uint32_t pid) {
  const std::string path = pid ? "/proc/" + std::to_string(pid) + "/cgroup" : "/proc/self/cgroup";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char buf[8192];
  std::size_t n = 0;
  while (n < sizeof buf) {
    const ssize_t r = ::read(fd, buf + n, sizeof buf - n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    n += static_cast<std::size_t>(r);
  }
  ::close(fd);
  // Lines "ID:CONTROLLERS:PATH"; Slurm's path holds ".../job_<id>/step_<n>/...".
  const std::string_view text(buf, n);
  for (std::size_t at = text.find("/job_"); at != std::string_view::npos; at = text.find("/job_", at + 1)) {
    std::size_t end = at + 5;
    while (end < text.size() && text[end] >= '0' && text[end] <= '9') ++end;
    if (end == at + 5 || (end < text.size() && text[end] != '/' && text[end] != '\n')) continue;
    if (const uint32_t id = slurm_job_of_name("slurm-" + std::string(text.substr(at + 5, end - at - 5)))) return id;
  }
  return 0;
}

Read read(const std::string& path, Ceiling* out, std::string* why) {
  const std::size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  struct stat dst {};
  if (::lstat(dir.c_str(), &dst) != 0) return Read::absent;
  if (!S_ISDIR(dst.st_mode)) {
    *why = dir + " is not a directory";
    return Read::refused;
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    if (errno == ENOENT) return Read::absent;
    *why = path + ": cannot open: " + std::strerror(errno);
    return Read::refused;
  }
  struct stat st {};
  std::string text(kMaxFile + 1, '\0');
  std::size_t n = 0;
  bool ok = ::fstat(fd, &st) == 0;
  if (!ok) *why = path + ": cannot stat: " + std::strerror(errno);
  else if (!S_ISREG(st.st_mode)) {
    *why = path + " is not a regular file";
    ok = false;
  } else {
    ok = roots(dir, dst, why) && roots(path, st, why);
  }
  for (ssize_t r; ok && n < text.size(); n += static_cast<std::size_t>(r)) {
    r = ::read(fd, text.data() + n, text.size() - n);
    if (r < 0 && errno == EINTR) r = 0;
    else if (r <= 0) {
      if (r < 0) {
        *why = path + ": cannot read: " + std::strerror(errno);
        ok = false;
      }
      break;
    }
  }
  ::close(fd);
  if (!ok) return Read::refused;
  if (n > kMaxFile) {
    *why = path + " is larger than " + std::to_string(kMaxFile) + " bytes";
    return Read::refused;
  }
  text.resize(n);
  Ceiling c;
  std::string_view rest = text;
  for (int number = 1; !rest.empty(); ++number) {
    const std::size_t nl = rest.find('\n');
    const std::string_view line = trim(rest.substr(0, nl));
    rest = nl == std::string_view::npos ? std::string_view{} : rest.substr(nl + 1);
    if (line.empty() || line.front() == '#') continue;
    const std::size_t eq = line.find('=');
    const std::string_view name = eq == std::string_view::npos ? line : trim(line.substr(0, eq));
    const std::string_view value = eq == std::string_view::npos ? std::string_view{} : trim(line.substr(eq + 1));
    const std::string at = path + " line " + std::to_string(number) + ": ";
    std::string error;
    if (name == "CUWARDEN_LIMIT" && !c.limit) {
      c.limit = parse_limit(value, &error);
      c.limit_text = value;
    } else if (name == "CUWARDEN_JOB_LIMIT" && !c.job_limit) {
      if (auto spec = parse_cap(value, false, &error)) c.job_limit = spec->bytes;
      c.job_limit_text = value;
    } else {
      error = "expected CUWARDEN_LIMIT=value or CUWARDEN_JOB_LIMIT=value, once each";
    }
    if (!error.empty()) {
      *why = at + error;
      return Read::refused;
    }
  }
  *out = std::move(c);
  return Read::ok;
}

}  // namespace cuw::site_cap

// cuwarden daemon: job segments as untrusted input (see jobs.hpp).
#include "model/jobs.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "base/util.hpp"
#include "model/fault_guard.hpp"

namespace cuw::daemon {

namespace {

std::string cap_text(uint64_t v) { return v == job::kNoLimit ? "none" : format_bytes(v); }

constexpr uint64_t kProcRecheckNs = 5'000'000'000;

}  // namespace

void JobTable::scan(int dirfd, const std::set<std::string>& names, const Policy* policy, uint64_t now_ns,
                    std::span<const uint64_t> running) {
  // Forget jobs whose file went away, was replaced under its name, or faulted.
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    struct stat st{};
    const bool gone = !names.count(it->first) || fstatat(dirfd, it->first.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 ||
                      st.st_dev != it->second.dev || st.st_ino != it->second.ino;
    if (gone || faulted_.count(it->first)) {
      spdlog::info("job {}/{}: {}", it->second.user, it->second.name,
                   faulted_.count(it->first) ? "its file faulted (truncated?); dropped" : "file gone; forgotten");
      it = jobs_.erase(it);
    } else {
      ++it;
    }
  }
  faulted_.clear();
  for (auto it = problems_.begin(); it != problems_.end();) it = names.count(it->first) ? std::next(it) : problems_.erase(it);
  for (const auto& n : names)
    if (!jobs_.count(n)) try_open(dirfd, n);

  for (auto& kv : jobs_) {
    const std::string& file = kv.first;
    Job& j = kv.second;  // not a structured binding: lambdas capture it (clang 14)
    uint32_t freed = 0;
    // Every scan: a member gone is freed at once (its pid is gone); /proc, which tells a
    // zombie or a reused pid, is read for each member every few seconds only, and neither
    // is asked about a member whose pidfd says it runs.
    auto sweep = [&] { freed = j.seg->sweep(true, -1, kProcRecheckNs, running); };
    if (!guarded_call(sweep)) {
      faulted_.insert(file);
      continue;
    }
    if (freed) spdlog::info("job {}/{}: reclaimed the share of {} dead member(s)", j.user, j.name, freed);
    View v;
    if (!view(j, &v)) continue;
    if (!v.members.empty()) {
      j.last_cap = v.cap;
      j.empty_since_ns = 0;
    } else if (j.empty_since_ns == 0) {
      j.empty_since_ns = now_ns;
    }
    if (policy) apply_policy(j, v, *policy);
  }
  if (!remove_ended_) return;
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    Job& j = it->second;
    if (j.empty_since_ns != 0 && now_ns - j.empty_since_ns >= linger_ns_ && !faulted_.count(it->first) &&
        try_remove(dirfd, j))
      it = jobs_.erase(it);
    else
      ++it;
  }
}

bool JobTable::try_remove(int dirfd, Job& j) {
  const int fd = openat(dirfd, j.file.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) return false;
  struct stat st{};
  View v;
  bool removed = false;
  // Members hold the shared lock from before they join until they exit: with the exclusive
  // one held, none is alive and none can join until the file is gone.
  if (fstat(fd, &st) == 0 && st.st_dev == j.dev && st.st_ino == j.ino && flock(fd, LOCK_EX | LOCK_NB) == 0 &&
      view(j, &v) && v.members.empty()) {
    std::string peaks;
    for (const auto& g : v.gpus) {
      if (!peaks.empty()) peaks += ", ";
      peaks += fmt::format("{} peak {} ({} bytes)", format_uuid(g.uuid), format_bytes(g.peak), g.peak);
    }
    // The name still the file we locked (its user may have replaced it meanwhile).
    struct stat now{};
    const bool same = fstatat(dirfd, j.file.c_str(), &now, AT_SYMLINK_NOFOLLOW) == 0 && now.st_dev == j.dev &&
                      now.st_ino == j.ino;
    if (same && unlinkat(dirfd, j.file.c_str(), 0) == 0) {
      removed = true;
      spdlog::info("job {}/{} ended (no member left): {}; cap {}; file removed", j.user, j.name,
                   peaks.empty() ? "no GPU memory taken" : peaks, cap_text(j.last_cap));
    } else if (same && !j.remove_warned) {
      j.remove_warned = true;
      spdlog::warn("job {}/{}: removing {}: {}", j.user, j.name, j.file, std::strerror(errno));
    }
  }
  close(fd);
  return removed;
}

void JobTable::try_open(int dirfd, const std::string& file) {
  uint32_t uid = 0;
  std::string name;
  if (!job::parse_file_name(file, &uid, &name)) {
    if (file.size() > 4 && file.compare(file.size() - 4, 4, job::kFileSuffix) == 0) problems_[file] = "malformed job file name";
    return;
  }
  if (jobs_.size() >= max_jobs_) {
    problems_[file] = "too many jobs (limit " + std::to_string(max_jobs_) + ")";
    return;
  }
  auto problem = [&](const std::string& why) {
    auto& slot = problems_[file];
    if (slot != why) spdlog::warn("job file {}: {}", file, why);
    slot = why;
  };
  const int fd = openat(dirfd, file.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    if (errno == ENOENT) return;
    if (errno == ELOOP) return problem("is a symbolic link (refused)");
    if (errno == EACCES || errno == EPERM)
      return problem("not writable by the daemon (uid " + std::to_string(geteuid()) +
                     "): run cuwardend as root to see and sweep other users' jobs");
    return problem(std::string("open: ") + std::strerror(errno));
  }
  struct stat st{};
  std::string why;
  if (fstat(fd, &st) != 0) why = std::string("fstat: ") + std::strerror(errno);
  else if (!S_ISREG(st.st_mode)) why = "not a regular file";
  else if (st.st_uid != uid)
    why = "named for uid " + std::to_string(uid) + " but belongs to uid " + std::to_string(st.st_uid) + " (refused)";
  else if (st.st_nlink != 1)
    why = "has " + std::to_string(st.st_nlink) + " hard links (refused: it may be another file under a job's name)";
  else if (st.st_mode & 077) why = "readable or writable by other users (mode " + fmt::format("{:o}", st.st_mode & 0777) + "; refused)";
  else if (st.st_size == 0) {
    close(fd);  // being created: its first member truncates it to size in a moment
    return;
  } else if (static_cast<uint64_t>(st.st_size) != job::file_size())
    why = "size " + std::to_string(st.st_size) + " bytes, expected " + std::to_string(job::file_size());
  if (!why.empty()) {
    close(fd);
    return problem(why);
  }
  job::Segment* seg = nullptr;
  std::string err;
  auto map = [&] { seg = job::Segment::map_fd(fd, &err); };
  const bool ok = guarded_call(map);
  close(fd);
  if (!ok) return problem("file changed size while being mapped");
  if (!seg) return problem(err);
  problems_.erase(file);
  Job j;
  j.file = file;
  j.name = name;
  j.uid = uid;
  j.user = user_name(uid);
  j.seg.reset(seg);
  j.dev = st.st_dev;
  j.ino = st.st_ino;
  spdlog::info("job {}/{}: found ({})", j.user, j.name, file);
  jobs_.emplace(file, std::move(j));
}

void JobTable::reset_policy() noexcept {
  for (auto& [f, j] : jobs_) j.policy_done.clear();
}

JobTable::Job* JobTable::find(uint32_t uid, const std::string& name) {
  auto it = jobs_.find(job::file_name(uid, name));
  return it == jobs_.end() || faulted_.count(it->first) ? nullptr : &it->second;
}

bool JobTable::view(Job& j, View* out) noexcept {
  View& v = *out;
  auto body = [&] {
    v.cap = j.seg->cap();
    v.members = j.seg->members();
    v.gpus = j.seg->gpus();
    v.used.clear();
    for (const auto& g : v.gpus) v.used.push_back(j.seg->used(g.index));
  };
  if (!guarded_call(body)) {
    faulted_.insert(j.file);
    return false;
  }
  std::erase_if(v.members, [](const job::Segment::MemberInfo& m) { return m.claiming; });
  // Whichever view last saw members (a scan, a query's publish) keeps the cap for the line
  // that logs the job's end: a job whose members come and go between two scans had one too.
  if (!v.members.empty()) j.last_cap = v.cap;
  return true;
}

int64_t JobTable::set_limit(Job& j, uint64_t bytes, bool lower_only) noexcept {
  uint32_t n = 0;
  auto body = [&] { n = j.seg->set_limit(bytes, lower_only); };
  if (!guarded_call(body)) {
    faulted_.insert(j.file);
    return -1;
  }
  return n;
}

// A member gets the lower of its own job cap and the policy's max_job_limit; a member that
// asked for no job cap gets the default job_limit. Once per member (owner word), again
// after a reload.
void JobTable::apply_policy(Job& j, const View& v, const Policy& policy) {
  const EffectivePolicy& eff = policy.for_user(j.uid);
  if (!eff.job_limit && !eff.max_job_limit) return;
  for (const auto& m : v.members) {
    if (j.policy_done.count(m.owner) || m.slot >= job::kMaxMembers) continue;
    uint64_t target = m.limit;
    if (m.limit == job::kNoLimit && m.requested == job::kNoLimit && eff.job_limit) target = eff.job_limit->resolve(0);
    if (eff.max_job_limit) target = std::min(target, eff.max_job_limit->resolve(0));
    bool changed = true;
    if (target != m.limit) {
      auto body = [&] {
        job::Member& slot = j.seg->member(m.slot);
        // Only while the slot still belongs to the member we looked at.
        if (slot.owner.load(std::memory_order_acquire) != m.owner) {
          changed = false;
          return;
        }
        uint64_t cur = m.limit;
        changed = slot.limit.compare_exchange_strong(cur, target, std::memory_order_seq_cst);
      };
      if (!guarded_call(body)) {
        faulted_.insert(j.file);
        return;
      }
      if (!changed) continue;  // looked at again on the next scan
      spdlog::info("policy: job {}/{} member pid {}: cap {} -> {} ({})", j.user, j.name, m.pid, cap_text(m.limit),
                   cap_text(target), eff.source);
    }
    j.policy_done.insert(m.owner);
  }
  // Owners no longer present need no memory of having been seen.
  if (j.policy_done.size() > 2 * job::kMaxMembers) j.policy_done.clear();
}

}  // namespace cuw::daemon

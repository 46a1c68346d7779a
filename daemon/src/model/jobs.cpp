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

constexpr uint64_t kProcRecheckNs = 5'000'000'000;

}  // namespace

void JobTable::scan(const std::vector<Dir>& dirs, const Policy* policy, uint64_t now_ns,
                    std::span<const uint64_t> running) {
  std::map<std::string, const Dir*> by_rel;
  for (const Dir& d : dirs) by_rel[d.rel] = &d;
  auto key_of = [](const Dir& d, const std::string& file) { return d.rel.empty() ? file : d.rel + "/" + file; };
  // Forget jobs whose file went away, was replaced under its name, or faulted.
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    struct stat st{};
    const auto d = by_rel.find(it->second.dir);
    const bool gone = d == by_rel.end() || !d->second->names.count(it->second.file) ||
                      fstatat(d->second->fd, it->second.file.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 ||
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
  std::set<std::string> present;
  for (const Dir& d : dirs)
    for (const auto& n : d.names) present.insert(key_of(d, n));
  for (auto it = problems_.begin(); it != problems_.end();) it = present.count(it->first) ? std::next(it) : problems_.erase(it);
  for (auto it = refused_.begin(); it != refused_.end();) it = present.count(it->first) ? std::next(it) : refused_.erase(it);
  for (const Dir& d : dirs)
    for (const auto& n : d.names)
      if (!jobs_.count(key_of(d, n))) try_open(d, n, now_ns);

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
    const auto d = by_rel.find(j.dir);
    if (j.empty_since_ns != 0 && now_ns - j.empty_since_ns >= linger_ns_ && !faulted_.count(it->first) &&
        d != by_rel.end() && try_remove(d->second->fd, j))
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

namespace {

/// Why a job file named for `uid` is refused by what fstat says of it alone, or "".
std::string refusal_by_stat(const struct stat& st, uint32_t uid) {
  if (S_ISLNK(st.st_mode)) return "is a symbolic link (refused)";
  if (!S_ISREG(st.st_mode)) return "not a regular file";
  if (st.st_uid != uid)
    return "named for uid " + std::to_string(uid) + " but belongs to uid " + std::to_string(st.st_uid) + " (refused)";
  if (st.st_nlink != 1)
    return "has " + std::to_string(st.st_nlink) + " hard links (refused: it may be another file under a job's name)";
  if (st.st_mode & 077)
    return "readable or writable by other users (mode " + fmt::format("{:o}", st.st_mode & 0777) + "; refused)";
  if (st.st_size != 0 && static_cast<uint64_t>(st.st_size) != job::file_size())
    return "size " + std::to_string(st.st_size) + " bytes, expected " + std::to_string(job::file_size());
  return "";
}

}  // namespace

void JobTable::try_open(const Dir& dir, const std::string& file, uint64_t now_ns) {
  const std::string key = dir.rel.empty() ? file : dir.rel + "/" + file;
  const int dirfd = dir.fd;
  uint32_t uid = 0;
  std::string name;
  if (!job::parse_file_name(file, &uid, &name)) {
    if (file.size() > 4 && file.compare(file.size() - 4, 4, job::kFileSuffix) == 0) problems_[key] = "malformed job file name";
    return;
  }
  if (dir.uid >= 0 && uid != static_cast<uint64_t>(dir.uid)) {
    problems_[key] = "named for uid " + std::to_string(uid) + " in the job directory of uid " + std::to_string(dir.uid);
    return;
  }
  if (jobs_.size() >= max_jobs_) {
    problems_[key] = "too many jobs (limit " + std::to_string(max_jobs_) + ")";
    return;
  }
  auto problem = [&](const std::string& why) {
    auto& slot = problems_[key];
    if (slot != why) spdlog::warn("job file {}: {}", key, why);
    slot = why;
  };
  struct stat st{};
  if (fstatat(dirfd, file.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) return;  // vanished
  const std::array<int64_t, 4> id{static_cast<int64_t>(st.st_dev), static_cast<int64_t>(st.st_ino),
                                  static_cast<int64_t>(st.st_size),
                                  int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec};
  if (auto r = refused_.find(key);
      r != refused_.end() && r->second.id == id && (r->second.lasting || now_ns - r->second.probed_ns < kRetryNs))
    return;
  auto refuse = [&](bool lasting, const std::string& why) {
    if (refused_.size() < max_jobs_ + kMaxRefused) refused_[key] = {id, now_ns, lasting};
    if (!why.empty()) problem(why);
  };
  // The file's type, owner, links, mode and size decide before any open.
  if (const std::string why = refusal_by_stat(st, uid); !why.empty()) return refuse(true, why);
  if (st.st_size == 0) return refuse(false, "");  // being created: its first member sizes it
  const int fd = openat(dirfd, file.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    if (errno == ENOENT) return;
    if (errno == ELOOP) return refuse(true, "is a symbolic link (refused)");
    if (errno == EACCES || errno == EPERM)
      return refuse(true, "not writable by the daemon (uid " + std::to_string(geteuid()) +
                              "): run cuwardend as root to see and sweep other users' jobs");
    return refuse(false, std::string("open: ") + std::strerror(errno));
  }
  struct stat opened{};
  if (fstat(fd, &opened) != 0 || opened.st_dev != st.st_dev || opened.st_ino != st.st_ino) {
    close(fd);
    return;  // replaced since the fstatat: the new file is probed at the next scan
  }
  job::Segment* seg = nullptr;
  std::string err;
  auto map = [&] { seg = job::Segment::map_fd(fd, &err); };
  const bool ok = guarded_call(map);
  close(fd);
  if (!ok) return refuse(false, "file changed size while being mapped");
  if (!seg) return refuse(false, err);
  problems_.erase(key);
  refused_.erase(key);
  Job j;
  j.dir = dir.rel;
  j.file = file;
  j.name = name;
  j.uid = uid;
  j.user = user_name(uid);
  j.seg.reset(seg);
  j.dev = st.st_dev;
  j.ino = st.st_ino;
  spdlog::info("job {}/{}: found ({})", j.user, j.name, key);
  jobs_.emplace(key, std::move(j));
}

void JobTable::reset_policy() noexcept {
  for (auto& [f, j] : jobs_) j.policy_done.clear();
}

JobTable::Job* JobTable::find(uint32_t uid, const std::string& name) {
  // One job may be found in two places only across an upgrade (the previous layout's file
  // beside the run directory's): the one whose members are in the current layout wins.
  Job* found = nullptr;
  for (auto& [key, j] : jobs_)
    if (j.uid == uid && j.name == name && !faulted_.count(key) && (!found || found->dir.empty())) found = &j;
  return found;
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
    faulted_.insert(j.dir.empty() ? j.file : j.dir + "/" + j.file);
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
    faulted_.insert(j.dir.empty() ? j.file : j.dir + "/" + j.file);
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
        faulted_.insert(j.dir.empty() ? j.file : j.dir + "/" + j.file);
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

// cuwarden daemon model: the control plane — live limit changes (set_limit), who may make them,
// and the policy file applied to every process and job the daemon finds.
//
// Rules (the README's "Live limits and policy" says them to users):
//   - root (peer uid 0, from SO_PEERCRED) may set, raise or remove any cap;
//   - any other user may only lower caps, of their own processes (the ring file's owner,
//     checked at discovery to be the process's real uid) and jobs (the job file's owner),
//     and not above what the policy allows them;
//   - every change and every refusal is logged with who asked (uid, user name, pid), what,
//     and the cap before and after; changes to a process are also recorded in its event
//     history (Api::control), and the last kLimitLog outcomes are in the state JSON.
//
// The request arrives typed (control.hpp: views/limit_json checked its keys and ranges) and
// the outcome leaves typed; a refusal or failure found deep in a check is thrown as a
// private Stop and turned into the LimitResult by set_limit.
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "base/util.hpp"
#include "cuw/size.hpp"
#include "model/detail/registry_process.hpp"
#include "model/registry.hpp"

namespace cuw::daemon {

namespace {

constexpr std::size_t kLimitLog = 256;
constexpr std::size_t kRefusalLog = 64;

/// A refusal or failure, thrown out of the checks and caught by Registry::set_limit.
struct Stop {
  LimitResult::Outcome outcome;
  std::string why;
};

LimitResult stopped(const Stop& s) {
  LimitResult r;
  r.outcome = s.outcome;
  r.reason = s.why;
  return r;
}

/// A log record of a request from `peer` about `target`, before its outcome is known.
LimitChange requested_by(const Peer& peer, const std::string& target) {
  LimitChange c;
  c.time_ns = now_ns();
  if (peer.known) {
    c.by = user_name(peer.uid);
    c.by_uid = peer.uid;
    c.by_pid = peer.pid;
  }
  c.target = target;
  return c;
}

std::string who_text(const Peer& peer) {
  if (!peer.known) return "an unidentified client";
  return fmt::format("uid {} ({}) pid {}", peer.uid, user_name(peer.uid), peer.pid);
}

/// Why a cap under the floor (a typo, or a share of a small device) is not set: one rule for
/// every way a cap reaches a process (the CLI, the interposer and the policy file keep it too).
std::string under_floor(const LimitAsk& ask, uint64_t desired, int device) {
  return fmt::format("a cap of {} B{}{} is under the smallest cap, {}: no real allocation would fit", desired,
                     ask.share ? fmt::format(" ({})", ask.str()) : "",
                     device >= 0 ? fmt::format(" on device {}", device) : "", format_bytes(kMinCap));
}

}  // namespace

uint64_t LimitAsk::resolve(uint64_t physical_total) const {
  if (remove) return ring::kNoLimit;
  if (!share) return bytes;
  SizeSpec s;
  s.percent = true;
  s.share = fraction;
  return s.resolve(physical_total);
}

std::string LimitAsk::str() const {
  if (remove) return "none";
  if (share) return fmt::format("{:g}%", fraction * 100);
  return format_bytes(bytes);
}

void Registry::set_policy(std::shared_ptr<const Policy> policy) {
  policy_ = policy && !policy->empty() ? std::move(policy) : nullptr;
  for (auto& [name, p] : procs_) {
    p->policy_done = 0;
    p->policy_warned = false;
    p->ceiling = filled_no_limit();  // the new policy's, from apply_policy
  }
  jobs_.reset_policy();  // applied to job members at the next scan
  for (auto& [name, p] : procs_)
    if (policy_ && !p->exited) apply_policy(*p);
}

// A process gets the lower of its own cap and the policy's max; one with no cap gets the
// policy's default. Applied once per device when the device appears (the interposer
// writes its own cap before publishing the device), and again after a reload.
void Registry::apply_policy(Process& p) {
  if (!policy_ || p.exited) return;
  if (!p.ring->writable()) {
    if (!p.policy_warned)
      spdlog::warn("policy: cannot apply to pid {} (uid {}): its ring is read-only to the daemon (uid {})", p.pid, p.uid,
                   geteuid());
    p.policy_warned = true;
    return;
  }
  // Which devices are present comes from the last drain's pass over the header: no extra
  // guarded access (a signal-mask syscall) per process per tick.
  const uint32_t present = p.present;
  if ((present & ~p.policy_done) == 0) return;
  RingSnapshot s;
  if (!p.ring->snapshot(s)) return;
  const EffectivePolicy& eff = policy_->for_user(p.uid);
  for (uint32_t d = 0; d < ring::kMaxDevices; ++d) {
    if (!(present & (1u << d)) || (p.policy_done & (1u << d))) continue;
    const DeviceSnapshot& ds = s.devices[d];
    const uint64_t cur = ds.limit;
    uint64_t target = cur;
    if (cur == ring::kNoLimit && eff.limit) target = eff.limit->resolve(ds.physical_total);
    if (eff.max_limit) {
      target = std::min(target, eff.max_limit->resolve(ds.physical_total));
      p.ceiling[d] = eff.max_limit->resolve(ds.physical_total);
    }
    if (target != cur) {
      uint64_t actual = 0;
      const auto r = p.ring->set_limit(d, cur, target, &actual);
      if (r == RingView::SetLimit::changed) continue;  // re-read on the next tick
      if (r != RingView::SetLimit::ok) {
        p.policy_done |= 1u << d;
        continue;
      }
      spdlog::info("policy: pid {} ({}) device {}: cap {} -> {} ({})", p.pid, p.user, d, cap_text(cur),
                   cap_text(target), eff.source);
      record_change(&p, static_cast<int>(d), cur, target, ds.used, StoredEvent::kFromPolicy, 0);
      LimitChange c;
      c.time_ns = now_ns();
      c.by = "policy";
      c.target = fmt::format("pid {}", p.pid);
      c.pid = p.pid;
      c.device = d;
      c.has_limits = true;
      c.old_limit = cur;
      c.new_limit = target;
      c.outcome = "changed";
      c.reason = eff.source;
      log_limit(std::move(c));
    }
    p.policy_done |= 1u << d;
  }
}

Registry::Process* Registry::find_running(const Peer& peer, uint32_t pid) {
  for (auto& [name, p] : procs_)
    if (!p->exited && peer_means(peer, pid, p->pid)) {
      // A header that faults is dropped at the next scan; until then it is not running.
      if (check_exit(*p, mono_ns()) && !p->exited) return p.get();
    }
  return nullptr;
}

void Registry::record_change(Process* p, int device, uint64_t old_limit, uint64_t new_limit, uint64_t used,
                             uint32_t by_uid, int32_t by_pid) {
  if (!p) return;
  StoredEvent ev;
  ev.seq = ++seq_;
  ev.by_uid = by_uid;
  ev.e.time_ns = now_ns();
  ev.e.kind = static_cast<uint8_t>(ring::EventKind::limit_change);
  ev.e.api = static_cast<uint16_t>(ring::Api::control);
  ev.e.device = static_cast<int8_t>(device);
  ev.e.bytes = new_limit;
  ev.e.aux = old_limit;
  ev.e.used_after = used;
  ev.e.tid = static_cast<uint32_t>(by_pid);
  p->history.push(ev);
  if (journal_) journal_->append(p->pid, p->start_time, ev);
}

void Registry::log_limit(LimitChange entry) {
  // Refusals and failures of unprivileged requests go to a log of their own, so that a user
  // who sends thousands cannot push root's changes and the policy's out of the one kept.
  const bool noise = entry.outcome != "changed" && entry.by_uid.value_or(0) != 0;
  auto& log = noise ? refusal_log_ : limit_log_;
  log.push_back(std::move(entry));
  while (log.size() > (noise ? kRefusalLog : kLimitLog)) log.pop_front();
}

void Registry::warn_refusal(const Peer& peer, const std::string& line) {
  // At most one line a second per uid: the rest are counted and said with the next one.
  if (peer.root()) return spdlog::warn("{}", line);
  const uint32_t uid = peer.known ? peer.uid : Peer::kUnknownUid;
  const uint64_t mono = mono_ns();
  if (refusal_rate_.size() > 4096) refusal_rate_.clear();
  auto& [last, suppressed] = refusal_rate_[uid];
  if (last != 0 && mono - last < 1'000'000'000) {
    ++suppressed;
    return;
  }
  if (suppressed) spdlog::warn("{} ({} more from uid {} not logged)", line, suppressed, uid);
  else spdlog::warn("{}", line);
  last = mono;
  suppressed = 0;
}

bool Registry::rescan_for_request() {
  // A request for a process or job not yet seen rescans the run directory, at most ten times
  // a second: a client asking about missing pids in a loop must not keep the loop scanning.
  const uint64_t mono = mono_ns();
  if (request_scan_mono_ != 0 && mono - request_scan_mono_ < 100'000'000) return false;
  request_scan_mono_ = mono;
  scan();
  return true;
}

std::string Registry::log_outcome(LimitChange& entry, const char* outcome, const std::string& why) {
  entry.outcome = outcome;
  entry.reason = why;
  log_limit(entry);
  return why;
}

LimitResult Registry::set_limit(const Peer& peer, const LimitRequest& req) {
  const std::string who = who_text(peer);
  try {
    return req.target == LimitRequest::Target::pid ? set_process_limit(peer, who, req) : set_job_limit(peer, who, req);
  } catch (const Stop& s) {
    return stopped(s);
  }
}

LimitResult Registry::set_process_limit(const Peer& peer, const std::string& who, const LimitRequest& req) {
  const uint32_t pid = req.pid;
  const int device = req.device ? static_cast<int>(*req.device) : -1;
  const LimitAsk& ask = req.ask;
  const std::string target = fmt::format("pid {}", pid);
  LimitChange entry = requested_by(peer, target);
  entry.pid = pid;
  if (device >= 0) entry.device = static_cast<uint32_t>(device);
  entry.asked = ask.str();
  auto refuse = [&](const std::string& why) -> Stop {
    warn_refusal(peer, fmt::format("limit refused: {} asked {} {}-> {}: {}", who, target,
                                   device >= 0 ? fmt::format("device {} ", device) : "", ask.str(), why));
    return Stop{LimitResult::Outcome::refused, log_outcome(entry, "refused", why)};
  };
  auto fail = [&](const std::string& why) -> Stop {
    warn_refusal(peer, fmt::format("limit failed: {} asked {} -> {}: {}", who, target, ask.str(), why));
    return Stop{LimitResult::Outcome::failed, log_outcome(entry, "failed", why)};
  };

  Process* p = find_running(peer, pid);
  if (!p && rescan_for_request()) p = find_running(peer, pid);  // one that started a moment ago
  if (!p) throw fail(fmt::format("no running process with pid {} under cuwarden (it has no ring in {})", pid, opt_.run_dir));
  if (!peer_owns(peer, p->uid, p->pid))
    throw refuse(fmt::format("pid {} belongs to uid {} ({}){}; only root or its owner may change its cap", pid, p->uid,
                             p->user, peer.same_pidns ? "" : " or to another pid namespace than yours"));

  RingSnapshot s;
  if (!p->ring->snapshot(s)) throw fail(fmt::format("pid {}'s ring could not be read", pid));
  std::vector<uint32_t> devices;
  std::string present_list;
  for (uint32_t d = 0; d < ring::kMaxDevices; ++d)
    if (s.devices[d].present) {
      present_list += (present_list.empty() ? "" : ", ") + std::to_string(d);
      if (device < 0 || static_cast<uint32_t>(device) == d) devices.push_back(d);
    }
  if (devices.empty()) {
    if (device >= 0)
      throw fail(fmt::format("pid {} has not used device {} yet (devices in use: {})", pid, device,
                             present_list.empty() ? "none" : present_list));
    throw fail(fmt::format("pid {} has not used a GPU yet: there is no cap to change until it does", pid));
  }
  const EffectivePolicy* eff = policy_ ? &policy_->for_user(p->uid) : nullptr;

  // Check every device before changing any: a request is applied whole or not at all.
  auto check = [&](uint32_t d, uint64_t cur, uint64_t desired) {
    if (desired < kMinCap) throw fail(under_floor(ask, desired, static_cast<int>(d)));
    if (peer.root()) return;
    if (desired == ring::kNoLimit) throw refuse(fmt::format("only root may remove a cap (device {}: current {})", d, cap_text(cur)));
    if (desired > cur)
      throw refuse(fmt::format("only root may raise a cap (device {}: current {}, asked {})", d, cap_text(cur),
                               cap_text(desired)));
    if (eff && eff->max_limit) {
      const uint64_t m = eff->max_limit->resolve(s.devices[d].physical_total);
      if (desired > m)
        throw refuse(fmt::format("the policy allows uid {} at most {} on device {} ({})", p->uid, cap_text(m), d,
                                 eff->source));
    }
  };
  for (uint32_t d : devices) check(d, s.devices[d].limit, ask.resolve(s.devices[d].physical_total));
  if (!p->ring->writable())
    throw fail(fmt::format("the daemon (uid {}) can only read pid {}'s ring (uid {}): run cuwardend as root to change "
                           "other users' caps",
                           geteuid(), pid, p->uid));

  LimitResult out;
  out.outcome = LimitResult::Outcome::changed;
  out.target = LimitRequest::Target::pid;
  out.pid = pid;
  out.process_name = process_name(field_text(s.comm, sizeof s.comm), field_text(s.cmdline, sizeof s.cmdline));
  out.uid = p->uid;
  out.user = p->user;
  for (uint32_t d : devices) {
    const DeviceSnapshot& ds = s.devices[d];
    uint64_t cur = ds.limit;
    const uint64_t desired = ask.resolve(ds.physical_total);
    RingView::SetLimit r = RingView::SetLimit::changed;
    for (int attempt = 0; attempt < 4 && r == RingView::SetLimit::changed; ++attempt) {
      uint64_t actual = cur;
      r = p->ring->set_limit(d, cur, desired, &actual);
      if (r == RingView::SetLimit::changed) {
        cur = actual;
        check(d, cur, desired);  // someone else changed it meanwhile: judge against the new value
      }
    }
    if (r != RingView::SetLimit::ok)
      throw fail(fmt::format("could not write pid {}'s cap on device {} ({})", pid, d,
                             r == RingView::SetLimit::fault ? "its ring faulted" : "it kept changing"));
    // Root's word is the ceiling from now on; an owner's lowering leaves the ceiling where it
    // was (the owner may go back up to it, as the policy allows).
    if (peer.root()) {
      p->ceiling[d] = desired;
      p->site_lifted |= 1u << d;
    }
    spdlog::info("limit: {} set pid {} ({}, uid {}) device {}: {} -> {}{}", who, pid,
                 field_text(s.comm, sizeof s.comm), p->uid, d, cap_text(cur), cap_text(desired),
                 desired < ds.used ? fmt::format(" (below its use, {})", format_bytes(ds.used)) : "");
    record_change(p, static_cast<int>(d), cur, desired, ds.used, peer.known ? peer.uid : StoredEvent::kFromProcess,
                  peer.pid);
    LimitChange e = entry;
    e.device = d;
    e.has_limits = true;
    e.old_limit = cur;
    e.new_limit = desired;
    e.outcome = "changed";
    log_limit(std::move(e));
    LimitResult::DeviceChange c;
    c.device = d;
    std::memcpy(c.uuid, ds.uuid, sizeof c.uuid);
    c.old_limit = cur;
    c.new_limit = desired;
    c.used_bytes = ds.used;
    out.changes.push_back(c);
  }
  return out;
}

LimitResult Registry::set_job_limit(const Peer& peer, const std::string& who, const LimitRequest& req) {
  const std::string& name = req.job;
  const LimitAsk& ask = req.ask;
  if (ask.share)  // the parser never builds one; refused here too rather than read as bytes
    return stopped({LimitResult::Outcome::failed, "a job's cap is one size for all its GPUs: give \"bytes\""});
  // Whose job: the caller's own, unless the request names another (a login name or a uid).
  uint32_t uid = peer.uid;
  if (req.user_uid) {
    uid = *req.user_uid;
  } else if (req.user_name) {
    auto u = uid_of(*req.user_name);
    if (!u) return stopped({LimitResult::Outcome::failed, "no user named '" + *req.user_name + "'"});
    uid = *u;
  } else if (!peer.known) {
    return stopped({LimitResult::Outcome::refused,
                    "the daemon could not tell who you are (no peer credentials); name the job's user"});
  }
  const std::string target = fmt::format("job {}/{}", user_name(uid), name);
  LimitChange entry = requested_by(peer, target);
  entry.kind = LimitChange::Target::job;
  entry.job = name;
  entry.uid = uid;
  entry.asked = ask.str();
  auto refuse = [&](const std::string& why) -> Stop {
    warn_refusal(peer, fmt::format("limit refused: {} asked {} -> {}: {}", who, target, ask.str(), why));
    return Stop{LimitResult::Outcome::refused, log_outcome(entry, "refused", why)};
  };
  auto fail = [&](const std::string& why) -> Stop {
    warn_refusal(peer, fmt::format("limit failed: {} asked {} -> {}: {}", who, target, ask.str(), why));
    return Stop{LimitResult::Outcome::failed, log_outcome(entry, "failed", why)};
  };
  if (!peer.root() && (!peer.known || peer.uid != uid))
    throw refuse(fmt::format("job '{}' belongs to uid {} ({}); only root or its owner may change its cap", name, uid,
                             user_name(uid)));
  // A job's members may live in several pid namespaces, and a container's uid is shared by
  // every container that runs as it: from another namespace than the daemon's, only a
  // process's own cap may be changed.
  if (!peer.same_pidns)
    throw refuse("a job's cap can be changed from the host's pid namespace only (from a container, change a "
                 "process's cap: cuwarden limit PID SIZE)");
  JobTable::Job* j = jobs_.find(uid, name);
  if (!j && rescan_for_request()) j = jobs_.find(uid, name);  // a job that started a moment ago
  if (!j)
    throw fail(fmt::format("no job '{}' of user {} (no {} in {})", name, user_name(uid), job::file_name(uid, name),
                           opt_.run_dir));
  JobTable::View v;
  if (!jobs_.view(*j, &v)) throw fail("the job's file could not be read");
  if (v.members.empty())
    throw fail(fmt::format("job '{}' has no running members: a cap set now would not outlive them (the next process "
                           "to join sets the job's cap afresh from its CUWARDEN_JOB_LIMIT)",
                           name));
  const uint64_t cur = v.cap;
  const uint64_t desired = ask.remove ? job::kNoLimit : ask.bytes;
  if (desired < kMinCap) throw fail(under_floor(ask, desired, -1));
  if (!peer.root()) {
    if (desired == job::kNoLimit) throw refuse(fmt::format("only root may remove a cap (job '{}': current {})", name, cap_text(cur)));
    if (desired > cur)
      throw refuse(fmt::format("only root may raise a cap (job '{}': current {}, asked {})", name, cap_text(cur),
                               cap_text(desired)));
    const EffectivePolicy* eff = policy_ ? &policy_->for_user(uid) : nullptr;
    if (eff && eff->max_job_limit && desired > eff->max_job_limit->resolve(0))
      throw refuse(fmt::format("the policy allows uid {} at most {} per job ({})", uid,
                               cap_text(eff->max_job_limit->resolve(0)), eff->source));
  }
  // A user's change only ever lowers: a member joining meanwhile with a lower cap keeps it.
  const int64_t n = jobs_.set_limit(*j, desired, !peer.root());
  if (n < 0) throw fail("the job's file faulted while being written");
  spdlog::info("limit: {} set job {}/{} ({} member(s)): {} -> {}", who, j->user, name, n, cap_text(cur), cap_text(desired));
  LimitResult out;
  out.outcome = LimitResult::Outcome::changed;
  out.target = LimitRequest::Target::job;
  out.job = name;
  out.uid = uid;
  out.user = user_name(uid);
  for (const auto& m : v.members) {
    out.members.push_back(m.pid);
    for (auto& [rn, p] : procs_)
      if (p->pid == m.pid && !p->exited)
        record_change(p.get(), -1, cur, desired, 0, peer.known ? peer.uid : StoredEvent::kFromProcess, peer.pid);
  }
  entry.has_limits = true;
  entry.old_limit = cur;
  entry.new_limit = desired;
  entry.outcome = "changed";
  log_limit(std::move(entry));
  for (std::size_t i = 0; i < v.gpus.size(); ++i) {
    LimitResult::JobGpu g;
    std::memcpy(g.uuid, v.gpus[i].uuid, sizeof g.uuid);
    g.used_bytes = v.used[i];
    out.gpus.push_back(g);
  }
  out.old_limit = cur;
  out.new_limit = desired;
  return out;
}

}  // namespace cuw::daemon

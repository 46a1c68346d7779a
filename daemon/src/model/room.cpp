// cuwarden daemon model: making room on a full GPU by policy (see room.hpp).
//
// A process's priority is the policy's for its user and what its ring asked
// (CUWARDEN_PRIORITY), taken once when the daemon finds it: the ring is the process's own
// file, and what it writes there later changes nothing.
//
// When its interposer asks for room, the requester may only have lower-priority processes
// suspended, never one that it may be waiting on: one of its job (the same job name, which
// covers the Slurm plugin's slurm-JOBID and a pod's pod-NAME), its Slurm job or pod (by their
// cgroup), its pod directory, its session, or its process tree (an ancestor or a descendant);
// never one itself waiting for room (its interposer holds a thread in a hook: a lock would
// wait on it), nor one resumed less than its min_run ago, nor one of a job the policy says
// is never suspended ([job.NAME] suspend = "never").
#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>
#include <tuple>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "base/util.hpp"
#include "cuw/size.hpp"
#include "model/detail/registry_process.hpp"
#include "model/policy.hpp"
#include "model/registry.hpp"

namespace cuw::daemon {

std::vector<RoomCandidate> choose_victims(std::vector<RoomCandidate> c, uint64_t shortfall) {
  if (c.empty() || shortfall == 0) return {};
  // Preference: the lowest priority, then the most recently started.
  std::sort(c.begin(), c.end(), [](const RoomCandidate& a, const RoomCandidate& b) {
    if (a.priority != b.priority) return a.priority < b.priority;
    if (a.start_time != b.start_time) return a.start_time > b.start_time;
    return a.pid > b.pid;
  });
  // The fewest: how many of the largest it takes.
  std::vector<uint64_t> sizes;
  for (const RoomCandidate& x : c) sizes.push_back(x.bytes);
  std::sort(sizes.rbegin(), sizes.rend());
  std::size_t k = 0;
  uint64_t sum = 0;
  while (k < sizes.size() && sum < shortfall) sum += sizes[k++];
  if (sum < shortfall) return {};
  // Of the sets of k that reach it, the one that takes the most preferred first: each in
  // preference order is taken when the largest of those after it can still complete it.
  std::vector<RoomCandidate> chosen;
  uint64_t got = 0;
  for (std::size_t i = 0; i < c.size() && chosen.size() < k; ++i) {
    const std::size_t left = k - chosen.size() - 1;
    std::vector<uint64_t> rest;
    for (std::size_t j = i + 1; j < c.size(); ++j) rest.push_back(c[j].bytes);
    std::sort(rest.rbegin(), rest.rend());
    uint64_t best = got + c[i].bytes;
    for (std::size_t j = 0; j < left && j < rest.size(); ++j) best += rest[j];
    if (best < shortfall) continue;
    chosen.push_back(c[i]);
    got += c[i].bytes;
  }
  return got >= shortfall ? chosen : std::vector<RoomCandidate>{};
}

namespace {

/// Fields 4 (ppid) and 6 (session) of /proc/PID/stat; false when it cannot be read.
bool stat_ids(uint32_t pid, uint32_t* ppid, uint32_t* session) {
  std::ifstream f(fmt::format("/proc/{}/stat", pid));
  std::string text;
  std::getline(f, text);
  const auto close = text.rfind(')');
  if (close == std::string::npos) return false;
  std::istringstream rest(text.substr(close + 1));
  std::string state;
  long long pp = 0, pgrp = 0, sid = 0;
  if (!(rest >> state >> pp >> pgrp >> sid)) return false;
  *ppid = static_cast<uint32_t>(std::max(0LL, pp));
  *session = static_cast<uint32_t>(std::max(0LL, sid));
  return true;
}

/// Whether `ancestor` is `pid` or one of its ancestors (at most 64 steps up).
bool descends_from(uint32_t pid, uint32_t ancestor) {
  for (int i = 0; i < 64 && pid > 1; ++i) {
    if (pid == ancestor) return true;
    uint32_t ppid = 0, sid = 0;
    if (!stat_ids(pid, &ppid, &sid)) return false;
    pid = ppid;
  }
  return pid == ancestor;
}

/// The component of process `pid`'s cgroup path that names its Slurm job ("job_123") or its
/// Kubernetes pod ("pod<uid>" under cgroupfs, "kubepods-...-pod<uid>.slice" under systemd);
/// "" when none does.
std::string cgroup_owner(uint32_t pid) {
  std::ifstream f(fmt::format("/proc/{}/cgroup", pid));
  std::string line;
  while (std::getline(f, line)) {
    std::istringstream parts(line.substr(line.rfind(':') + 1));
    std::string part;
    while (std::getline(parts, part, '/'))
      if ((part.size() > 4 && part.rfind("job_", 0) == 0 &&
           part.find_first_not_of("0123456789", 4) == std::string::npos) ||
          part.rfind("pod", 0) == 0 || (part.rfind("kubepods", 0) == 0 && part.find("-pod") != std::string::npos))
        return part;
  }
  return "";
}

std::string pod_dir_of(const std::string& file_name) {
  const auto slash = file_name.rfind('/');
  return slash == std::string::npos ? "" : file_name.substr(0, slash);
}

}  // namespace

bool Registry::related(const Process& a, const RingSnapshot& as, const Process& b, const RingSnapshot& bs) const {
  const std::string ja = field_text(as.job, sizeof as.job), jb = field_text(bs.job, sizeof bs.job);
  if (!ja.empty() && ja == jb) return true;
  const std::string pod_dir = pod_dir_of(a.file_name);
  if (!pod_dir.empty() && pod_dir == pod_dir_of(b.file_name)) return true;
  if (const std::string o = cgroup_owner(a.pid); !o.empty() && o == cgroup_owner(b.pid)) return true;
  uint32_t pa = 0, sa = 0, pb = 0, sb = 0;
  if (stat_ids(a.pid, &pa, &sa) && stat_ids(b.pid, &pb, &sb) && sa != 0 && sa == sb) return true;
  return descends_from(a.pid, b.pid) || descends_from(b.pid, a.pid);
}

void Registry::set_priority(Process& p, const RingSnapshot& s) {
  const EffectivePolicy none;
  const EffectivePolicy& eff = policy_ ? policy_->for_user(p.uid) : none;
  std::optional<PolicyPriority> asked;
  if (s.priority_asked) asked = s.priority;
  p.priority = eff.priority_for(asked);
  if (asked && *asked != p.priority)
    spdlog::info("pid {} asked for priority {}; the policy ({}) gives it {}", p.pid, *asked, eff.source, p.priority);
  p.ring->set_room_wait(static_cast<uint32_t>(eff.room_wait_ms()));
  // A mark a previous daemon left (hold_back_for_restores writes it again where it holds).
  p.ring->set_held_back(0);
  p.held_back = 0;
}

RoomPlan Registry::plan_room(const Peer& peer, const RoomRequest& req) {
  RoomPlan out;
  auto no = [&](const std::string& why) {
    out.outcome = RoomPlan::Outcome::no;
    out.reason = why;
    spdlog::info("room: pid {} asked for {} on device {}: no: {}", peer.pid, format_bytes(req.bytes), req.device, why);
    return out;
  };
  if (!peer.known) return no("the daemon could not tell who asks (no peer credentials)");
  // The asker is its own process (SO_PEERCRED's pid is in the daemon's namespace).
  Process* p = nullptr;
  for (auto& [name, q] : procs_)
    if (!q->exited && q->pid == static_cast<uint32_t>(peer.pid) && q->uid == peer.uid) p = q.get();
  if (p && (!check_exit(*p, mono_ns()) || p->exited)) p = nullptr;
  if (!p) return no(fmt::format("pid {} is not a process under cuwarden", peer.pid));
  const EffectivePolicy none;
  const EffectivePolicy& eff = policy_ ? policy_->for_user(p->uid) : none;
  out.pid = p->pid;
  out.start_time = p->start_time;
  out.priority = p->priority;
  out.wait_ms = eff.room_wait_ms();
  if (p->suspended || p->suspend_busy) return no("it is being suspended");
  if (p->waiting_for_room) return no("it is waiting for room already");
  for (auto& [name, q] : procs_)
    if (q->claim_ended && q->suspended && q->suspended_for == p->pid && q->suspended_for_start == p->start_time)
      return no(fmt::format("its claim ended: pid {}, suspended for it, is past its job's max_suspended", q->pid));
  RingSnapshot s;
  if (!p->ring->snapshot(s)) return no("its ring could not be read");
  if (req.device >= ring::kMaxDevices || !s.devices[req.device].present)
    return no(fmt::format("it has no device {}", req.device));
  out.uuid = format_uuid(s.devices[req.device].uuid);
  if (!nvml_ || !nvml_->available()) return no("no NVML: the daemon cannot see the GPU's free memory");
  const std::vector<NvmlGpu> gpus = nvml_->query();
  const NvmlGpu* g = nullptr;
  for (const NvmlGpu& x : gpus)
    if (x.uuid == out.uuid) g = &x;
  if (!g) return no(fmt::format("NVML does not list its GPU {}", out.uuid));
  if (req.bytes > g->memory_total)
    return no(fmt::format("{} is more than GPU {} holds ({})", format_bytes(req.bytes), g->index,
                          format_bytes(g->memory_total)));
  const uint64_t free = g->memory_total > g->memory_used ? g->memory_total - g->memory_used : 0;
  const uint64_t need = req.bytes + resume_margin(req.bytes);
  if (free >= need) {
    out.outcome = RoomPlan::Outcome::free_now;
    out.reason = fmt::format("{} free on GPU {} now", format_bytes(free), g->index);
    return out;
  }
  out.shortfall = need - free;

  std::vector<RoomCandidate> cands;
  std::size_t lower = 0;
  const uint64_t mono = mono_ns();
  for (auto& [name, qp] : procs_) {
    Process& q = *qp;
    if (&q == p || q.exited || q.suspended || q.suspend_busy || q.priority >= p->priority) continue;
    ++lower;
    if (q.waiting_for_room) continue;  // its thread waits in a hook: a lock would wait on it
    const uint64_t min_run_ns = (policy_ ? policy_->for_user(q.uid) : none).min_run_ms() * 1'000'000ULL;
    if (q.resumed_mono && mono - q.resumed_mono < min_run_ns) continue;
    RingSnapshot qs;
    if (!q.ring->snapshot(qs) || !uncarried(q, qs).empty()) continue;
    if (policy_ && policy_->never_suspend(field_text(qs.job, sizeof qs.job))) continue;
    uint64_t bytes = 0;
    if (auto it = g->process_used.find(q.pid); it != g->process_used.end()) bytes = it->second;
    if (bytes == 0) continue;
    if (related(*p, s, q, qs)) continue;
    cands.push_back({q.pid, q.start_time, q.priority, bytes});
  }
  out.victims = choose_victims(cands, out.shortfall);
  if (out.victims.empty()) {
    uint64_t held = 0;
    for (const RoomCandidate& c : cands) held += c.bytes;
    return no(fmt::format("GPU {} lacks {}; {} lower-priority process(es), {} of them eligible, holding {}: not enough",
                          g->index, format_bytes(out.shortfall), lower, cands.size(), format_bytes(held)));
  }
  p->waiting_for_room = true;
  out.outcome = RoomPlan::Outcome::suspend;
  std::string pids;
  for (const RoomCandidate& v : out.victims) pids += fmt::format("{}{} ({})", pids.empty() ? "" : ", ", v.pid, format_bytes(v.bytes));
  out.reason = fmt::format("GPU {} lacks {}: suspending {}", g->index, format_bytes(out.shortfall), pids);
  spdlog::info("room: pid {} (priority {}) asked for {} on device {}: {}", p->pid, p->priority, format_bytes(req.bytes),
               req.device, out.reason);
  publish();
  return out;
}

void Registry::end_room(uint32_t pid, uint64_t start_time, const std::vector<RoomCandidate>& suspended) {
  for (auto& [name, q] : procs_) {
    if (q->pid == pid && q->start_time == start_time) q->waiting_for_room = false;
    for (const RoomCandidate& v : suspended)
      if (q->pid == v.pid && q->start_time == v.start_time && q->suspended) {
        q->suspended_for = pid;
        q->suspended_for_start = start_time;
      }
  }
  publish();
}

std::vector<PolicyResume> Registry::policy_resumes_due() {
  std::vector<Process*> waiting;
  for (auto& [name, q] : procs_)
    if (q->suspended && q->suspended_by_policy && !q->suspend_busy && !q->exited) waiting.push_back(q.get());
  if (waiting.empty() || !nvml_ || !nvml_->available()) return {};
  std::sort(waiting.begin(), waiting.end(), [](const Process* a, const Process* b) {
    if (a->priority != b->priority) return a->priority > b->priority;
    return a->suspended_ns < b->suspended_ns;
  });
  std::map<std::string, uint64_t> budget;  // free bytes per GPU not yet promised to a higher one
  for (const NvmlGpu& g : nvml_->query()) budget[g.uuid] = g.memory_total > g.memory_used ? g.memory_total - g.memory_used : 0;
  std::map<std::string, uint64_t> free_now = budget;  // what an overdue one may take
  const uint64_t mono = mono_ns();
  const EffectivePolicy none;
  std::vector<PolicyResume> due, overdue;
  for (Process* q : waiting) {
    // Past its job's max_suspended: resumed as soon as its memory is free, whatever a higher
    // one waits for; otherwise reported (once), and it keeps waiting. No restore is forced.
    RingSnapshot qs;
    const JobRules* jr = policy_ && q->ring->snapshot(qs) ? policy_->job_rules(field_text(qs.job, sizeof qs.job)) : nullptr;
    if (jr && jr->max_suspended_ms && now_ns() - q->suspended_ns >= *jr->max_suspended_ms * 1'000'000ULL) {
      bool fits_now = true;
      for (const auto& [uuid, bytes] : q->suspended_footprint) {
        auto it = free_now.find(uuid);
        if (it == free_now.end() || it->second < bytes + resume_margin(bytes)) fits_now = false;
      }
      if (fits_now) {
        for (const auto& [uuid, bytes] : q->suspended_footprint) {
          free_now[uuid] -= bytes + resume_margin(bytes);
          budget[uuid] -= std::min(budget[uuid], bytes + resume_margin(bytes));
        }
        overdue.push_back({q->pid, q->start_time, q->priority});
        continue;
      }
      if (!q->suspended_overdue) {
        spdlog::warn("suspend: pid {} (job '{}') has been suspended by policy past its max_suspended ({} s) and its "
                     "GPU has no room for it yet: it stays suspended until there is",
                     q->pid, field_text(qs.job, sizeof qs.job), *jr->max_suspended_ms / 1000);
        StoredEvent ev;
        ev.seq = ++seq_;
        ev.by_uid = StoredEvent::kFromPolicy;
        ev.e.time_ns = now_ns();
        ev.e.kind = static_cast<uint8_t>(ring::EventKind::suspend_overdue);
        ev.e.api = static_cast<uint16_t>(ring::Api::control);
        ev.e.device = -1;
        for (const auto& [uuid, bytes] : q->suspended_footprint) ev.e.bytes += bytes;
        ev.e.aux = ev.e.time_ns - q->suspended_ns;
        q->history.push(ev);
        if (journal_) journal_->append(q->pid, q->start_time, ev);
      }
      q->suspended_overdue = true;
      bool claimant = false;  // the process it was suspended for, still running
      for (auto& [name, r] : procs_)
        if (!r->exited && r->pid == q->suspended_for && r->start_time == q->suspended_for_start) claimant = true;
      if (jr->end_claim && !q->claim_ended && claimant) {
        q->claim_ended = true;
        spdlog::warn("suspend: pid {} is past its max_suspended (on_overdue = \"end_claim\"): pid {}, for which it was "
                     "suspended, loses its claim: its room requests are answered no and it is held back until pid {} "
                     "is resumed",
                     q->pid, q->suspended_for, q->pid);
      }
    }
    bool fits = true;
    for (const auto& [uuid, bytes] : q->suspended_footprint) {
      auto it = budget.find(uuid);
      if (it == budget.end() || it->second < bytes + resume_margin(bytes)) fits = false;
    }
    if (!fits) {
      // Highest first: what is free on its GPUs waits for it, not for a lower one.
      q->room_since_mono = 0;
      for (const auto& [uuid, bytes] : q->suspended_footprint) budget[uuid] = 0;
      continue;
    }
    for (const auto& [uuid, bytes] : q->suspended_footprint) budget[uuid] -= bytes + resume_margin(bytes);
    if (q->room_since_mono == 0) q->room_since_mono = mono;
    const uint64_t after_ns = (policy_ ? policy_->for_user(q->uid) : none).resume_after_ms() * 1'000'000ULL;
    if (mono - q->room_since_mono >= after_ns) due.push_back({q->pid, q->start_time, q->priority});
  }
  overdue.insert(overdue.end(), due.begin(), due.end());
  return overdue;
}

void Registry::hold_back_for_restores() {
  // Per GPU, the highest priority among the processes suspended by policy from it: each
  // waits to be resumed there (with its footprint and margin free), and what a lower one
  // took meanwhile would keep it waiting.
  std::map<std::string, std::pair<int32_t, uint32_t>> waiting;  // UUID -> (priority, pid)
  // A process whose claim ended (on_overdue = "end_claim") is held back there too, whatever
  // its priority: (its pid, start time, UUID) -> the overdue one's pid.
  std::map<std::tuple<uint32_t, uint64_t, std::string>, uint32_t> ended;
  for (auto& [name, q] : procs_)
    if (q->suspended && q->suspended_by_policy && !q->exited)
      for (const auto& [uuid, bytes] : q->suspended_footprint) {
        auto [it, fresh] = waiting.try_emplace(uuid, q->priority, q->pid);
        if (!fresh && q->priority > it->second.first) it->second = {q->priority, q->pid};
        if (q->claim_ended) ended[{q->suspended_for, q->suspended_for_start, uuid}] = q->pid;
      }
  for (auto& [name, qp] : procs_) {
    Process& q = *qp;
    if (q.exited) continue;
    uint32_t mask = 0;
    std::string why;
    RingSnapshot qs;
    if (!waiting.empty() && q.ring->snapshot(qs))
      for (uint32_t d = 0; d < ring::kMaxDevices; ++d) {
        if (!qs.devices[d].present) continue;
        const std::string uuid = format_uuid(qs.devices[d].uuid);
        const auto it = waiting.find(uuid);
        if (it == waiting.end()) continue;
        uint32_t waiter = it->second.second;
        if (q.priority >= it->second.first) {
          const auto e = ended.find({q.pid, q.start_time, uuid});
          if (e == ended.end()) continue;
          waiter = e->second;
        }
        mask |= 1u << d;
        why += fmt::format("{}device {} (pid {} waits to be resumed there)", why.empty() ? "" : ", ", d, waiter);
      }
    if (mask == q.held_back || !q.ring->set_held_back(mask)) continue;
    if (mask) spdlog::info("room: pid {} (priority {}) held back on {}", q.pid, q.priority, why);
    else spdlog::info("room: pid {} no longer held back", q.pid);
    q.held_back = mask;
  }
}

}  // namespace cuw::daemon

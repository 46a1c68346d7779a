// cuwarden daemon model: suspending processes by hand — the checks before the driver is
// called, the record of what it did, and the suspensions kept across restarts.
//
// The driver's checkpoint API does not roll back: a checkpoint or restore that fails leaves
// the process FAILED, its context dead. So everything cuwarden can know beforehand is
// checked here, and refused in cuwarden's own words, before any process is locked:
//   - what the API cannot carry, as the process's hooks counted it in its ring: managed
//     memory, CUDA IPC handles made or opened, cuMem allocations made exportable or imported,
//     an MPS client's contexts;
//   - room on the host: the driver copies the device memory into the process's own memory,
//     so its memory cgroup (limit less usage, and swap) and the node (MemAvailable) must
//     take its device footprint;
//   - a process the daemon does not manage (no ring), or that is not the requester's.
// A resume needs its footprint back: it is refused, with the figures, unless NVML shows
// that much free on each of its GPUs now, plus a margin; it never forces a restore. A resume
// onto another GPU (--gpu) has its own checks (suspend_move.cpp).
//
// Records: <suspend dir>/<pid>-<start time>.json, written when a process is suspended and
// removed when it is resumed or seen to exit (its host copy died with it); read back at start
// as untrusted input and matched to the processes found by pid and start time.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "base/util.hpp"
#include "cuw/size.hpp"
#include "model/detail/registry_process.hpp"
#include "model/registry.hpp"

namespace cuw::daemon {

namespace {

std::string read_line(const std::string& path) {
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  return line;
}

std::optional<uint64_t> read_u64(const std::string& path) {
  const std::string s = read_line(path);
  if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos || s.size() > 19) return std::nullopt;
  return std::stoull(s);
}

/// What the node can still give: MemAvailable, bytes (nullopt: unknown).
std::optional<uint64_t> node_available() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  uint64_t kb = 0;
  std::string unit;
  while (f >> key >> kb) {
    std::getline(f, unit);
    if (key == "MemAvailable:") return kb * 1024;
  }
  return std::nullopt;
}

/// What the memory cgroup of process `pid` can still take (limit less usage, plus swap room
/// on cgroup v2), and a description of it; nullopt: no limit, or none that can be read.
std::optional<std::pair<uint64_t, std::string>> cgroup_room(uint32_t pid) {
  std::ifstream f(fmt::format("/proc/{}/cgroup", pid));
  std::string line;
  while (std::getline(f, line)) {
    const auto a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    if (path.find("..") != std::string::npos) continue;
    if (line.rfind("0::", 0) == 0) {  // cgroup v2
      const std::string dir = "/sys/fs/cgroup" + path;
      const std::string max = read_line(dir + "/memory.max");
      const auto cur = read_u64(dir + "/memory.current");
      if (max.empty() || max == "max" || !cur) continue;
      const auto lim = read_u64(dir + "/memory.max");
      if (!lim) continue;
      uint64_t room = *lim > *cur ? *lim - *cur : 0;
      const std::string smax = read_line(dir + "/memory.swap.max");
      if (const auto scur = read_u64(dir + "/memory.swap.current"); scur && !smax.empty()) {
        if (smax == "max") return std::nullopt;  // swap without a limit takes the rest
        if (const auto sl = read_u64(dir + "/memory.swap.max"); sl && *sl > *scur) room += *sl - *scur;
      }
      return std::make_pair(room, fmt::format("memory cgroup {} (memory.max {}, memory.current {})", path,
                                              format_bytes(*lim), format_bytes(*cur)));
    }
    // cgroup v1: "N:memory[,...]:/path"
    std::stringstream cs(controllers);
    std::string c;
    bool memory = false;
    while (std::getline(cs, c, ',')) memory |= c == "memory";
    if (!memory) continue;
    const std::string dir = "/sys/fs/cgroup/memory" + path;
    const auto lim = read_u64(dir + "/memory.limit_in_bytes");
    const auto cur = read_u64(dir + "/memory.usage_in_bytes");
    if (!lim || !cur || *lim >= (1ULL << 62)) return std::nullopt;  // no limit
    return std::make_pair(*lim > *cur ? *lim - *cur : 0,
                          fmt::format("memory cgroup {} (limit {}, usage {})", path, format_bytes(*lim), format_bytes(*cur)));
  }
  return std::nullopt;
}

std::string record_name(uint32_t pid, uint64_t start_time) { return fmt::format("{}-{}.json", pid, start_time); }

}  // namespace

std::string Registry::uncarried(const Process& p, const RingSnapshot& s) const {
  uint64_t managed = 0, ipc = 0, shared = 0, mps = 0;
  for (const DeviceSnapshot& d : s.devices) {
    if (!d.present) continue;
    managed += d.managed_allocs;
    ipc += d.ipc_handles;
    shared += d.shared_handles;
    mps += d.mps_client != 0;
  }
  if (mps)
    return fmt::format("pid {} is an MPS client (its contexts live in the MPS server), which the driver's checkpoint "
                       "cannot carry: it would leave the process FAILED",
                       p.pid);
  if (managed)
    return fmt::format("pid {} has made {} managed-memory allocation(s) (cudaMallocManaged), which the driver's "
                       "checkpoint cannot carry: it would leave the process FAILED",
                       p.pid, managed);
  if (ipc)
    return fmt::format("pid {} has made or opened {} CUDA IPC handle(s), which the driver's checkpoint cannot carry (this "
                       "excludes most NCCL jobs): it would leave the process FAILED",
                       p.pid, ipc);
  if (shared)
    return fmt::format("pid {} has {} cuMem allocation(s) made exportable as shareable handles or imported from one, "
                       "which the driver's checkpoint cannot carry (recent NCCL makes its buffers so: this excludes most "
                       "NCCL jobs): it would leave the process FAILED",
                       p.pid, shared);
  return "";
}

SuspendResult Registry::prepare_suspend(const Peer& peer, const SuspendRequest& req) {
  const bool suspend = req.action == SuspendRequest::Action::suspend;
  const char* verb = suspend ? "suspend" : "resume";
  SuspendResult out;
  out.action = req.action;
  out.job = req.job;
  out.by_policy = req.by_policy;
  out.job_name = req.job_name;
  const std::string who = peer.known ? fmt::format("uid {} ({}) pid {}", peer.uid, user_name(peer.uid), peer.pid)
                                     : std::string("an unidentified client");
  auto stop = [&](SuspendResult::Outcome o, const std::string& why) {
    warn_refusal(peer, fmt::format("{} {}: {} asked for {}: {}", verb, o == SuspendResult::Outcome::refused ? "refused" : "failed",
                                   who, req.job ? "job " + req.job_name : fmt::format("pid {}", req.pid), why));
    out.outcome = o;
    out.reason = why;
    out.processes.clear();
    return out;
  };
  using O = SuspendResult::Outcome;

  // Which processes.
  std::vector<Process*> procs;
  if (!req.job) {
    Process* p = find_running(peer, req.pid);
    if (!p && rescan_for_request()) p = find_running(peer, req.pid);
    if (p && req.start_time && p->start_time != req.start_time) p = nullptr;  // the policy's: that very process
    if (!p)
      return stop(O::refused, fmt::format("no running process with pid {} under cuwarden (it has no ring in {}): the "
                                         "daemon suspends only the processes it manages",
                                         req.pid, opt_.run_dir));
    if (!peer_owns(peer, p->uid, p->pid))
      return stop(O::refused, fmt::format("pid {} belongs to uid {} ({}){}; only root or its owner may {} it", req.pid,
                                          p->uid, p->user, peer.same_pidns ? "" : " or to another pid namespace than yours",
                                          verb));
    procs.push_back(p);
  } else {
    uint32_t uid = peer.uid;
    if (req.user_uid) {
      uid = *req.user_uid;
    } else if (req.user_name) {
      auto u = uid_of(*req.user_name);
      if (!u) return stop(O::failed, "no user named '" + *req.user_name + "'");
      uid = *u;
    } else if (!peer.known) {
      return stop(O::refused, "the daemon could not tell who you are (no peer credentials); name the job's user");
    }
    if (!peer.root() && (!peer.known || peer.uid != uid))
      return stop(O::refused, fmt::format("job '{}' belongs to uid {} ({}); only root or its owner may {} it",
                                          req.job_name, uid, user_name(uid), verb));
    if (!peer.same_pidns)
      return stop(O::refused, fmt::format("a job can be {}ed from the host's pid namespace only", verb));
    JobTable::Job* j = jobs_.find(uid, req.job_name);
    if (!j && rescan_for_request()) j = jobs_.find(uid, req.job_name);
    if (!j) return stop(O::failed, fmt::format("no job '{}' of user {}", req.job_name, user_name(uid)));
    JobTable::View v;
    if (!jobs_.view(*j, &v)) return stop(O::failed, "the job's file could not be read");
    for (const auto& m : v.members)
      for (auto& [name, p] : procs_)
        if (p->ns_pid == m.pid && !p->exited && p->uid == uid && std::find(procs.begin(), procs.end(), p.get()) == procs.end())
          procs.push_back(p.get());
    if (procs.empty()) return stop(O::failed, fmt::format("job '{}' has no running members", req.job_name));
  }

  // Each one: its state, what the driver could not carry, its footprint and room for it.
  std::vector<NvmlGpu> gpus = nvml_ ? nvml_->query() : std::vector<NvmlGpu>{};
  uint64_t planned = 0, planned_job = 0;  // resume --gpu: what the request's processes take on that GPU
  for (Process* p : procs) {
    if (p->suspend_busy) return stop(O::failed, fmt::format("pid {} is being suspended or resumed already", p->pid));
    if (suspend && p->suspended)
      return stop(O::failed, fmt::format("pid {} is suspended already (since {} s)", p->pid,
                                         (now_ns() - p->suspended_ns) / 1'000'000'000ULL));
    if (!suspend && !p->suspended) return stop(O::failed, fmt::format("pid {} is not suspended", p->pid));
    RingSnapshot s;
    if (!p->ring->snapshot(s)) return stop(O::failed, fmt::format("pid {}'s ring could not be read", p->pid));
    SuspendTarget t;
    t.pid = p->pid;
    t.start_time = p->start_time;
    t.uid = p->uid;
    t.user = p->user;
    t.process_name = process_name(field_text(s.comm, sizeof s.comm), field_text(s.cmdline, sizeof s.cmdline));
    if (suspend) {
      if (const std::string why = uncarried(*p, s); !why.empty()) return stop(O::refused, why);
      for (const DeviceSnapshot& d : s.devices) {
        if (!d.present) continue;
        const std::string uuid = format_uuid(d.uuid);
        uint64_t bytes = d.reserved + d.context_bytes;  // without NVML: what cuwarden saw it take
        for (const NvmlGpu& g : gpus)
          if (g.uuid == uuid)
            if (auto it = g.process_used.find(p->pid); it != g.process_used.end()) bytes = it->second;
        t.footprint.emplace_back(uuid, bytes);
        t.device_bytes += bytes;
      }
      if (const auto room = cgroup_room(p->pid); room && room->first < t.device_bytes)
        return stop(O::refused, fmt::format("pid {}'s {} of device memory would not fit in its {}: {} free there; the "
                                            "driver copies it into the process's own memory",
                                            p->pid, format_bytes(t.device_bytes), room->second,
                                            format_bytes(room->first)));
      if (const auto avail = node_available(); avail && *avail < t.device_bytes)
        return stop(O::refused, fmt::format("pid {}'s {} of device memory would not fit in the node's available memory "
                                            "({} MemAvailable)",
                                            p->pid, format_bytes(t.device_bytes), format_bytes(*avail)));
    } else {
      t.host_bytes = p->suspended_host_bytes;
      t.since_ns = p->suspended_ns;
      // --gpu: onto that GPU, unless it is (one of) the process's own: then where it was.
      bool in_place = req.gpu.empty();
      if (!in_place) {
        bool refused = true;
        if (const std::string why = prepare_move(*p, s, gpus, req.gpu, planned, planned_job, t, &refused, &in_place); !why.empty())
          return stop(refused ? O::refused : O::failed, why);
      }
      if (!in_place) {
        for (const auto& f : t.footprint) t.device_bytes += f.second;
        planned += t.device_bytes;
        planned_job += t.job_share;
        out.processes.push_back(std::move(t));
        continue;
      }
      t.footprint = p->suspended_footprint;
      for (const auto& [uuid, bytes] : t.footprint) {
        t.device_bytes += bytes;
        const NvmlGpu* g = nullptr;
        for (const NvmlGpu& x : gpus)
          if (x.uuid == uuid) g = &x;
        if (!g) {
          if (nvml_ && nvml_->available())
            return stop(O::failed, fmt::format("pid {} was suspended from {}, which NVML no longer lists", p->pid, uuid));
          continue;  // no NVML: the driver's restore is the only judge
        }
        const uint64_t free = g->memory_total > g->memory_used ? g->memory_total - g->memory_used : 0;
        const uint64_t need = bytes + resume_margin(bytes);
        if (free < need)
          return stop(O::refused, fmt::format("GPU {} ({}) has {} free; pid {} needs {} back plus a margin of {} ({} in "
                                              "all): resume it once that much is free (no restore is forced: one "
                                              "without room would leave the process FAILED)",
                                              g->index, uuid, format_bytes(free), p->pid, format_bytes(bytes),
                                              format_bytes(need - bytes), format_bytes(need)));
      }
    }
    out.processes.push_back(std::move(t));
  }
  for (Process* p : procs) p->suspend_busy = true;
  out.outcome = O::done;
  return out;
}

namespace {

/// Who a suspend or resume is recorded as done by: "policy", or the asking user's name.
std::string done_by(const Peer& peer, const SuspendResult& r) {
  return r.by_policy ? std::string("policy") : peer.known ? user_name(peer.uid) : std::string("?");
}

}  // namespace

void Registry::tell_resumed(const Peer& peer, const SuspendResult& r, const SuspendTarget& t) {
  if (!t.pairs.empty()) note_moved(t);
  for (auto& [name, p] : procs_)
    if (p->pid == t.pid && p->start_time == t.start_time && p->suspended &&
        !p->ring->notify_resumed(now_ns() - p->suspended_ns, done_by(peer, r)))
      spdlog::warn("resume: pid {}'s ring could not be told", p->pid);
}

void Registry::finish_suspend(const Peer& peer, const SuspendResult& r) {
  const bool suspend = r.action == SuspendRequest::Action::suspend;
  const std::string by = done_by(peer, r);
  for (const SuspendTarget& t : r.processes) {
    Process* p = nullptr;
    for (auto& [name, q] : procs_)
      if (q->pid == t.pid && q->start_time == t.start_time) p = q.get();
    if (!p) continue;  // exited meanwhile: nothing to keep
    p->suspend_busy = false;
    if (!t.done) continue;
    StoredEvent ev;
    ev.seq = ++seq_;
    ev.by_uid = r.by_policy ? StoredEvent::kFromPolicy : peer.known ? peer.uid : StoredEvent::kFromProcess;
    ev.e.time_ns = now_ns();
    ev.e.kind = static_cast<uint8_t>(suspend ? ring::EventKind::suspend : ring::EventKind::resume);
    ev.e.api = static_cast<uint16_t>(ring::Api::control);
    ev.e.device = -1;
    ev.e.bytes = t.device_bytes;
    ev.e.tid = static_cast<uint32_t>(peer.pid);
    if (suspend) {
      p->suspended = true;
      p->suspended_ns = ev.e.time_ns;
      p->suspended_host_bytes = t.device_bytes;  // the driver copies the device bytes as they are
      p->suspended_by = by;
      p->suspended_by_policy = r.by_policy;
      p->room_since_mono = 0;
      p->suspended_footprint = t.footprint;
      spdlog::info("suspend: {} suspended pid {} ({}, uid {}): {} to the host in {:.2f} s", by, p->pid, t.process_name,
                   p->uid, format_bytes(t.device_bytes), t.seconds);
      if (!suspend_dir_.empty()) {
        nlohmann::json j = {{"pid", p->pid}, {"start_time", p->start_time}, {"since_ns", p->suspended_ns},
                            {"host_bytes", p->suspended_host_bytes}, {"by", by}, {"footprint", t.footprint},
                            {"by_policy", r.by_policy}};
        const std::string path = suspend_dir_ + "/" + record_name(p->pid, p->start_time);
        const std::string tmp = path + ".tmp";
        std::ofstream f(tmp, std::ios::trunc);
        f << j.dump() << '\n';
        f.close();
        if (!f || std::rename(tmp.c_str(), path.c_str()) != 0)
          spdlog::warn("suspend: could not record pid {} in {}: a daemon restarted now would not know it suspended",
                       p->pid, suspend_dir_);
      }
    } else {
      ev.e.aux = ev.e.time_ns - p->suspended_ns;
      spdlog::info("resume: {} resumed pid {} ({}, uid {}) after {} s: {} back on the device in {:.2f} s", by, p->pid,
                   t.process_name, p->uid, ev.e.aux / 1'000'000'000ULL, format_bytes(t.device_bytes), t.seconds);
      p->resumed_mono = mono_ns();
      forget_suspension(*p, nullptr);
    }
    p->history.push(ev);
    if (journal_) journal_->append(p->pid, p->start_time, ev);
  }
  // Those of lower priority held back at once (a suspension by policy), or released (a resume).
  hold_back_for_restores();
  publish();
}

void Registry::forget_suspension(Process& p, const char* why) {
  if (why) spdlog::info("suspend: pid {} {}: its host copy is gone with it; forgotten", p.pid, why);
  p.suspended = false;
  p.suspended_ns = 0;
  p.suspended_host_bytes = 0;
  p.suspended_by.clear();
  p.suspended_by_policy = false;
  p.suspended_overdue = false;
  p.suspended_for = 0;
  p.suspended_for_start = 0;
  p.claim_ended = false;
  p.room_since_mono = 0;
  p.suspended_footprint.clear();
  if (!suspend_dir_.empty()) ::unlink((suspend_dir_ + "/" + record_name(p.pid, p.start_time)).c_str());
}

void Registry::found_suspended(Process& p) {
  auto it = suspend_records_.find({p.pid, p.start_time});
  if (it == suspend_records_.end()) return;
  p.suspended = true;
  p.suspended_ns = it->second.since_ns;
  p.suspended_host_bytes = it->second.host_bytes;
  p.suspended_by = it->second.by;
  p.suspended_by_policy = it->second.by_policy;
  p.suspended_footprint = it->second.footprint;
  suspend_records_.erase(it);
  spdlog::info("suspend: pid {} is suspended since {} s ago (recorded before this start)", p.pid,
               (now_ns() - p.suspended_ns) / 1'000'000'000ULL);
}

void Registry::set_suspend_dir(const std::string& dir) {
  suspend_dir_ = dir;
  if (dir.empty()) return;
  ::mkdir(dir.c_str(), 0700);
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string path = e.path().string();
    if (!e.is_regular_file(ec) || e.path().extension() != ".json" || e.file_size(ec) > 65536) continue;
    std::ifstream f(path);
    std::stringstream buf;
    buf << f.rdbuf();
    const nlohmann::json j = nlohmann::json::parse(buf.str(), nullptr, false);
    SuspendRecord r;
    uint32_t pid = 0;
    uint64_t start = 0;
    try {
      pid = j.at("pid").get<uint32_t>();
      start = j.at("start_time").get<uint64_t>();
      r.since_ns = j.at("since_ns").get<uint64_t>();
      r.host_bytes = j.at("host_bytes").get<uint64_t>();
      r.by = j.at("by").get<std::string>().substr(0, 64);
      r.by_policy = j.value("by_policy", false);
      for (const auto& g : j.at("footprint")) r.footprint.emplace_back(g.at(0).get<std::string>().substr(0, 64), g.at(1).get<uint64_t>());
    } catch (const std::exception&) {
      spdlog::warn("suspend: {} is not a suspension record; removed", path);
      ::unlink(path.c_str());
      continue;
    }
    if (path != dir + "/" + record_name(pid, start) || paths::process_gone(pid, start)) {
      // Its process exited while no daemon ran (its host copy went with it), or a stray file.
      ::unlink(path.c_str());
      continue;
    }
    suspend_records_[{pid, start}] = std::move(r);
  }
}

}  // namespace cuw::daemon

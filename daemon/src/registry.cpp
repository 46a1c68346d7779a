// cuwarden daemon: discovery, draining, exit detection and the state JSON (see registry.hpp).
#include "registry.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>
#include <spdlog/spdlog.h>
#include <stdexcept>

#include "cuw/paths.hpp"
#include "detail/registry_process.hpp"
#include "util.hpp"

namespace cuw::daemon {

using json = nlohmann::ordered_json;  // fields in the documented order

namespace {

constexpr std::size_t kDrainBatch = 1024;
constexpr std::size_t kDrainRoundsPerTick = 64;  // at most 64 Ki events per ring per tick
constexpr std::size_t kMaxProblems = 1024;

json null_if_nolimit(uint64_t v) { return v == ring::kNoLimit ? json(nullptr) : json(v); }

}  // namespace

Registry::Registry(RegistryOptions options, int dirfd, const Nvml* nvml)
    : opt_(std::move(options)),
      dirfd_(dirfd),
      nvml_(nvml),
      buffer_(kDrainBatch),
      hostname_(host_name()),
      jobs_(opt_.max_jobs) {}

Registry::~Registry() {
  procs_.clear();
  if (dirfd_ >= 0) close(dirfd_);
}

void Registry::scan() {
  const uint64_t mono = mono_ns();
  std::set<std::string> present, job_files;
  const int fd = dup(dirfd_);
  if (fd < 0) {
    spdlog::warn("scan: dup: {}", std::strerror(errno));
    return;
  }
  DIR* d = fdopendir(fd);
  if (!d) {
    close(fd);
    return;
  }
  rewinddir(d);
  while (dirent* ent = readdir(d)) {
    const std::string name = ent->d_name;
    if (name.rfind(job::kFilePrefix, 0) == 0) {
      if (job_files.size() < opt_.max_jobs + kMaxProblems) job_files.insert(name);
      continue;
    }
    if (name.rfind(paths::kRingPrefix, 0) != 0) continue;  // socket, temporary files, ...
    present.insert(name);
    if (present.size() > opt_.max_rings + kMaxProblems) break;
  }
  closedir(d);

  // A name that now refers to another file than the one we mapped (replaced by a new
  // file, a symlink, a FIFO...) is examined afresh: the old mapping no longer speaks for
  // it. A ring merely unlinked keeps its mapping, which still holds the exact counters.
  std::vector<std::string> replaced;
  for (const auto& [name, p] : procs_) {
    struct stat st{};
    if (present.count(name) && fstatat(dirfd_, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 &&
        (st.st_dev != p->ring->dev() || st.st_ino != p->ring->ino()))
      replaced.push_back(name);
  }
  for (const auto& name : replaced) {
    spdlog::warn("ring {}: the file was replaced under its name; re-examining it", name);
    forget(name, false);
  }
  for (const auto& name : present)
    if (!procs_.count(name)) try_open(name, mono);
  // Problems whose file went away are solved.
  for (auto it = problems_.begin(); it != problems_.end();)
    it = present.count(it->first) ? std::next(it) : problems_.erase(it);

  std::vector<std::string> expired;
  for (auto& [name, p] : procs_) {
    if (!p->exited) check_exit(*p, mono);
    if (p->exited && mono - p->exited_mono >= opt_.exited_linger_ns) expired.push_back(name);
  }
  for (const auto& name : expired) forget(name, opt_.unlink_exited);
  // Every scan sweeps every job: a killed member's share is back within a scan interval
  // even when no other member allocates.
  jobs_.scan(dirfd_, job_files, policy_.get());
}

void Registry::try_open(const std::string& name, uint64_t mono) {
  struct stat st{};
  if (fstatat(dirfd_, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) return;  // vanished
  const int64_t mtime = int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
  auto pit = problems_.find(name);
  if (pit != problems_.end() && !pit->second.transient && pit->second.dev == st.st_dev &&
      pit->second.ino == st.st_ino && pit->second.size == st.st_size && pit->second.mtime_ns == mtime)
    return;  // same broken file as before

  auto record = [&](std::string reason, bool transient) {
    if (pit == problems_.end()) {
      if (problems_.size() >= kMaxProblems) return;
      pit = problems_.emplace(name, Problem{}).first;
      pit->second.first_seen_mono = mono;
    }
    Problem& pr = pit->second;
    const bool changed = pr.reason != reason;
    pr.reason = std::move(reason);
    pr.transient = transient;
    pr.dev = st.st_dev;
    pr.ino = st.st_ino;
    pr.size = st.st_size;
    pr.mtime_ns = mtime;
    if (changed && !transient) spdlog::warn("ring {}: {}", name, pr.reason);
  };

  uint32_t pid = 0;
  uint64_t start_time = 0;
  if (!paths::parse_ring_file_name(name, &pid, &start_time)) {
    if (name.size() > 4 && name.compare(name.size() - 4, 4, paths::kRingSuffix) == 0)
      record("malformed ring file name", false);
    return;  // a temporary file or something else that merely starts with "ring-"
  }
  if (procs_.size() >= opt_.max_rings) {
    record("too many rings (limit " + std::to_string(opt_.max_rings) + ")", true);
    return;
  }
  OpenResult r = open_ring(dirfd_, name, pid, start_time);
  if (!r.view) {
    record(r.error, r.transient);
    return;
  }
  if (pit != problems_.end()) problems_.erase(pit);

  auto p = std::make_unique<Process>();
  Snapshot snap;
  if (!r.view->snapshot(snap)) return;
  p->file_name = name;
  p->pid = pid;
  p->start_time = start_time;
  p->uid = snap.uid;
  p->user = user_name(snap.uid);
  p->ring = std::move(r.view);
  spdlog::info("ring {}: pid {} ({}) user {}{}", name, pid, field_text(snap.comm, sizeof snap.comm), p->user,
               p->ring->writable() ? "" : " [read-only: counters only, no events]");
  auto& ref = *p;
  procs_.emplace(name, std::move(p));
  check_exit(ref, mono);
}

void Registry::check_exit(Process& p, uint64_t mono) {
  Snapshot snap;
  if (!p.ring->snapshot(snap)) {
    drop_faulted(p.file_name, "faulted while reading its header");
    return;
  }
  if (snap.state == static_cast<uint32_t>(ring::ProcessState::exited)) {
    p.exited = true;
    p.exited_ns = snap.exited_ns ? snap.exited_ns : now_ns();
  } else if (paths::process_gone(p.pid, p.start_time)) {
    p.exited = true;
    p.exited_ns = now_ns();
  }
  if (p.exited) {
    p.exited_mono = mono;
    spdlog::info("pid {} exited ({})", p.pid, p.file_name);
  }
}

void Registry::drop_faulted(const std::string& name, const char* what) {
  spdlog::warn("ring {}: {}; dropped", name, what);
  Problem pr;
  pr.reason = std::string("ring ") + what + " (truncated or rewritten under the daemon); dropped";
  pr.first_seen_mono = mono_ns();
  struct stat st{};
  if (fstatat(dirfd_, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
    pr.dev = st.st_dev;
    pr.ino = st.st_ino;
    pr.size = st.st_size;
    pr.mtime_ns = int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
  }
  problems_[name] = pr;
  procs_.erase(name);
}

void Registry::forget(const std::string& name, bool unlink_file) {
  auto it = procs_.find(name);
  if (it == procs_.end()) return;
  Process& p = *it->second;
  drain_one(p, now_ns(), nullptr, nullptr);  // last events of this ring; a fault changes nothing here
  if (unlink_file && p.ring) {
    struct stat st{};
    // Only the file we mapped: not a new ring that reused the name.
    if (fstatat(dirfd_, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && st.st_dev == p.ring->dev() &&
        st.st_ino == p.ring->ino())
      unlinkat(dirfd_, name.c_str(), 0);  // failure is fine: not our file to insist on
  }
  spdlog::info("forgot pid {} ({})", p.pid, name);
  procs_.erase(name);
}

bool Registry::drain_one(Process& p, uint64_t now, bool* more, bool* busy) {
  if (!p.ring || !p.ring->writable()) return true;
  std::size_t drained = 0;
  for (std::size_t round = 0; round < kDrainRoundsPerTick; ++round) {
    // Skipping unpublished slots is safe only once no producer can publish any more: a
    // live producer that publishes into a slot we skipped would wedge the ring.
    DrainResult r = p.ring->drain(buffer_.data(), buffer_.size(), p.exited, now);
    if (!r.ok) return false;
    p.events_lost += r.lost;
    p.events_received += r.events;
    p.present = r.present;
    drained += r.events;
    for (std::size_t i = 0; i < r.events; ++i) {
      p.history.push_back(StoredEvent{++seq_, buffer_[i]});
      if (p.history.size() > opt_.history_per_process) p.history.pop_front();
    }
    if (r.events < buffer_.size()) {
      // A ring that filled an eighth of itself since the last tick is being written fast:
      // come back sooner than the idle interval, before it can fill up and drop.
      if (busy && drained * 8 >= p.ring->slot_count()) *busy = true;
      return true;
    }
  }
  if (more) *more = true;
  return true;
}

Registry::DrainPace Registry::drain_all() {
  bool more = false, busy = false;
  const uint64_t now = now_ns();
  std::vector<std::string> faulted;
  for (auto& [name, p] : procs_) {
    if (!drain_one(*p, now, &more, &busy)) faulted.push_back(name);
    else if (policy_ && !p->exited) apply_policy(*p);
  }
  for (const auto& name : faulted) drop_faulted(name, "faulted while draining events");
  return more ? DrainPace::again : busy ? DrainPace::soon : DrainPace::idle;
}

json Registry::state_json() {
  struct Gpu {
    std::string uuid, name, bus_id;
    int index = -1;
    int first_ordinal = 1 << 30;
    uint64_t total = 0, used = 0, reserved = 0, driver_used = 0;
    bool driver_used_known = false;
    unsigned processes = 0, capped = 0;
  };
  std::map<std::string, Gpu> gpus;
  std::map<std::string, const NvmlGpu*> nvml_by_uuid;
  const std::vector<NvmlGpu> nv = nvml_ ? nvml_->query() : std::vector<NvmlGpu>{};
  for (const auto& g : nv) {
    nvml_by_uuid[g.uuid] = &g;
    Gpu& out = gpus[g.uuid];
    out.uuid = g.uuid;
    out.name = g.name;
    out.bus_id = g.bus_id;
    out.index = static_cast<int>(g.index);
    out.total = g.memory_total;
    out.driver_used = g.memory_used;
    out.driver_used_known = true;
  }

  json processes = json::array();
  std::vector<std::string> faulted;
  for (auto& [name, p] : procs_) {
    Snapshot s;
    if (!p->ring->snapshot(s)) {
      faulted.push_back(name);
      continue;
    }
    json devices = json::array();
    for (uint32_t d = 0; d < ring::kMaxDevices; ++d) {
      const DeviceSnapshot& ds = s.devices[d];
      if (!ds.present) continue;
      const std::string uuid = format_uuid(ds.uuid);
      Gpu& g = gpus[uuid];
      if (g.uuid.empty()) {
        g.uuid = uuid;
        g.name = field_text(ds.name, sizeof ds.name);
        g.total = ds.physical_total;
      }
      g.first_ordinal = std::min(g.first_ordinal, static_cast<int>(d));
      if (!p->exited) {
        g.used += ds.used;
        g.reserved += ds.reserved;
        ++g.processes;
        if (ds.limit != ring::kNoLimit) ++g.capped;
      }
      json dev = {
          {"ordinal", d},
          {"uuid", uuid},
          {"name", field_text(ds.name, sizeof ds.name)},
          {"memory_total_bytes", ds.physical_total},
          // An exited process holds nothing: the driver freed its memory at its exit, whatever
          // the counters said last (a program that leaves its frees to the driver's teardown).
          {"used_bytes", p->exited ? 0 : ds.used},
          {"peak_bytes", ds.peak},
          {"limit_bytes", null_if_nolimit(ds.limit)},
          {"reserved_bytes", ds.reserved},
          {"allocations", ds.live_allocations},
          {"alloc_count", ds.alloc_count},
          {"free_count", ds.free_count},
          {"ooms", ds.refusals},
          {"driver_errors", ds.driver_errors},
          {"host_bytes", ds.host_bytes},
          // CUWARDEN_POOL=cache: of used_bytes (= reserved_bytes), what the pool keeps for
          // reuse and what the program's allocations hold. Hostile input: never underflow.
          {"cached_bytes", ds.cached},
          {"in_use_bytes", p->exited || ds.cached >= ds.used ? 0 : ds.used - ds.cached},
          {"pool_hits", ds.pool_hits},
          {"pool_waits", ds.pool_waits},
          // CUWARDEN_CAP_SCOPE=process: the driver's own memory for the process (context,
          // modules) as the interposer last measured it, inside used_bytes; 0 otherwise.
          {"context_bytes", ds.context_bytes},
      };
      if (p->exited) dev["used_at_exit_bytes"] = ds.used;
      if (auto it = nvml_by_uuid.find(uuid); it != nvml_by_uuid.end()) {
        auto pu = it->second->process_used.find(p->pid);
        const bool known = pu != it->second->process_used.end() && !p->exited;
        dev["driver_used_bytes"] = known ? json(pu->second) : json(nullptr);
        // What the driver holds for the process that no cap counts: with the default scope
        // its context and modules; with CUWARDEN_CAP_SCOPE=process, what grew since the
        // interposer last measured.
        const uint64_t counted = p->exited ? 0 : ds.used;
        dev["outside_cap_bytes"] = known ? json(pu->second > counted ? pu->second - counted : 0) : json(nullptr);
      }
      devices.push_back(std::move(dev));
    }
    const char* state = p->exited ? "exited" : "running";
    processes.push_back({
        {"pid", p->pid},
        {"user", p->user},
        {"uid", p->uid},
        {"process_name", process_name(field_text(s.comm, sizeof s.comm), field_text(s.cmdline, sizeof s.cmdline))},
        {"cmdline", field_text(s.cmdline, sizeof s.cmdline)},
        {"job", field_text(s.job, sizeof s.job)},
        {"pool", field_text(s.pool, sizeof s.pool)},
        {"cap_scope", s.cap_scope == static_cast<uint32_t>(ring::CapScope::process) ? "process" : "allocations"},
        {"state", state},
        {"start_time", p->start_time},
        {"created_ns", s.created_ns},
        {"exited_ns", p->exited ? json(p->exited_ns) : json(nullptr)},
        {"events_written", s.events_written},
        {"events_dropped", s.events_dropped},
        {"events_received", p->events_received},
        {"events_lost", p->events_lost},
        {"events_readable", p->ring->writable()},
        {"consumer_heartbeat_ns", s.heartbeat_ns},
        {"ring", opt_.run_dir + "/" + name},
        {"devices", std::move(devices)},
    });
  }
  for (const auto& name : faulted) drop_faulted(name, "faulted while reading its header");

  // GPU order: NVML's index when known, else the lowest CUDA ordinal any process sees it at.
  std::vector<Gpu*> order;
  for (auto& [uuid, g] : gpus) order.push_back(&g);
  std::sort(order.begin(), order.end(), [](const Gpu* a, const Gpu* b) {
    const bool ai = a->index >= 0, bi = b->index >= 0;
    if (ai != bi) return ai;
    if (ai) return a->index < b->index;
    if (a->first_ordinal != b->first_ordinal) return a->first_ordinal < b->first_ordinal;
    return a->uuid < b->uuid;
  });
  int next_index = 0;
  for (Gpu* g : order) next_index = std::max(next_index, g->index + 1);
  json gpu_list = json::array();
  std::map<std::string, int> index_of;
  for (Gpu* g : order) {
    if (g->index < 0) g->index = next_index++;
    index_of[g->uuid] = g->index;
    json j = {
        {"index", g->index},
        {"uuid", g->uuid},
        {"name", g->name},
        {"memory_total_bytes", g->total},
        {"used_bytes", g->used},
        {"reserved_bytes", g->reserved},
        {"limit_bytes", nullptr},  // no device-wide cap yet: per-process caps are below
        {"processes", g->processes},
        {"capped_processes", g->capped},
    };
    if (!g->bus_id.empty()) j["bus_id"] = g->bus_id;
    if (g->driver_used_known) j["driver_used_bytes"] = g->driver_used;
    gpu_list.push_back(std::move(j));
  }
  for (auto& proc : processes)
    for (auto& dev : proc["devices"]) dev["gpu_index"] = index_of[dev["uuid"].get<std::string>()];
  json jobs = jobs_json(index_of);

  json limit_changes = json::array();
  for (const auto& c : limit_log_) limit_changes.push_back(c);

  const uint64_t mono = mono_ns();
  json problems = json::array();
  for (const auto& [name, pr] : problems_) {
    if (pr.transient && mono - pr.first_seen_mono < opt_.problem_grace_ns) continue;
    problems.push_back({{"path", opt_.run_dir + "/" + name}, {"reason", pr.reason}});
  }
  for (const auto& [name, reason] : jobs_.problems())
    problems.push_back({{"path", opt_.run_dir + "/" + name}, {"reason", reason}});

  return {
      {"version", CUWARDEN_VERSION},
      {"hostname", hostname_},
      {"time_ns", now_ns()},
      {"run_dir", opt_.run_dir},
      {"nvml", nvml_ && nvml_->available()},
      {"events_seq", seq_},
      {"gpus", std::move(gpu_list)},
      {"processes", std::move(processes)},
      {"jobs", std::move(jobs)},
      {"problems", std::move(problems)},
      {"policy", policy_ ? json(policy_->file) : json(nullptr)},
      {"limit_changes", limit_changes},
  };
}

json Registry::events_json(const nlohmann::json& request) const {
  auto get_u64 = [&](const char* key, uint64_t fallback) -> uint64_t {
    auto it = request.find(key);
    if (it == request.end() || it->is_null()) return fallback;
    if (!it->is_number_unsigned() && !(it->is_number_integer() && it->get<int64_t>() >= 0))
      throw std::invalid_argument(std::string("\"") + key + "\" must be a non-negative integer");
    return it->get<uint64_t>();
  };
  if (!request.is_object()) throw std::invalid_argument("request body must be a JSON object");
  const bool has_pid = request.contains("pid") && !request["pid"].is_null();
  const uint64_t pid = get_u64("pid", 0);
  const bool has_after = request.contains("after") && !request["after"].is_null();
  uint64_t after = get_u64("after", 0);
  const uint64_t max = std::clamp<uint64_t>(get_u64("max", 1000), 1, 100000);
  if (after > seq_) after = seq_;  // a client that outlived a daemon restart resumes at "now"

  struct Ref {
    const StoredEvent* ev;
    uint32_t pid;
  };
  auto no_cap = [](uint64_t v) { return v == ring::kNoLimit ? json(nullptr) : json(v); };
  std::vector<Ref> refs;
  for (const auto& [name, p] : procs_) {
    if (has_pid && p->pid != pid) continue;
    // History is ordered by seq: binary search the first event after `after`.
    auto first = std::upper_bound(p->history.begin(), p->history.end(), after,
                                  [](uint64_t a, const StoredEvent& e) { return a < e.seq; });
    for (auto it = first; it != p->history.end(); ++it) refs.push_back({&*it, p->pid});
  }
  std::sort(refs.begin(), refs.end(), [](const Ref& a, const Ref& b) { return a.ev->seq < b.ev->seq; });
  std::size_t begin = 0, end = refs.size();
  if (refs.size() > max) {
    if (has_after) end = max;
    else begin = refs.size() - max;
  }
  json events = json::array();
  for (std::size_t i = begin; i < end; ++i) {
    const ring::Event& e = refs[i].ev->e;
    events.push_back({
        {"seq", refs[i].ev->seq},
        {"pid", refs[i].pid},
        {"time_ns", e.time_ns},
        {"api", ring::api_name(e.api)},
        {"kind", ring::kind_name(e.kind)},
        {"device", e.device},
        {"bytes", e.bytes},
        {"address", e.address},
        {"used_after", e.used_after},
        {"tid", e.tid},
        {"result", e.result},
        {"aux", e.aux},
    });
    if (e.api == static_cast<uint16_t>(ring::Api::control)) {
      // A change the daemon made: who asked, and the cap before and after (null = none).
      json& j = events.back();
      const uint32_t by = refs[i].ev->by_uid;
      j["new_limit"] = no_cap(e.bytes);
      j["old_limit"] = no_cap(e.aux);
      j["by"] = by == StoredEvent::kFromPolicy ? json("policy") : json(user_name(by));
      j["by_uid"] = by == StoredEvent::kFromPolicy ? json(nullptr) : json(by);
      j["by_pid"] = e.tid;
    }
  }
  const uint64_t next = end > begin ? refs[end - 1].ev->seq : (has_after ? after : seq_);
  return {{"events", std::move(events)}, {"next", next}, {"latest", seq_}};
}

}  // namespace cuw::daemon

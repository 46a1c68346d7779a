// cuwarden daemon model: discovery, draining, exit detection and publishing the State (see registry.hpp).
#include "model/registry.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>
#include <spdlog/spdlog.h>
#include <stdexcept>

#include "base/util.hpp"
#include "cuw/live.hpp"
#include "cuw/paths.hpp"
#include "model/detail/registry_process.hpp"
#include "model/gpus.hpp"

namespace cuw::daemon {

namespace {

constexpr std::size_t kDrainBatch = 1024;
constexpr std::size_t kDrainRoundsPerTick = 64;  // at most 64 Ki events per ring per tick
constexpr std::size_t kMaxProblems = 1024;
// A ring with no event for this many drains in a row (a second at the default 10 ms) is
// visited every kIdleStride-th drain only: with a thousand idle processes, visiting every
// ring every tick was most of the daemon's CPU. The first event after a pause then waits at
// most kIdleStride ticks (80 ms), which a ring of 16 Ki events absorbs at 200 K events/s
// (past that, events are dropped and counted; the counters stay exact).
constexpr uint32_t kIdleAfterDrains = 100;
// The heartbeat of a ring with no event is rewritten this often (the process reads it only
// at exit, and counts 5 s of silence as no daemon); device presence (for the policy) is read
// on every visit that drains events and every kPresentEvery-th visit besides.
constexpr uint64_t kIdleBeatNs = 250'000'000;
constexpr uint32_t kPresentEvery = 16;
constexpr std::size_t kGpuIndexKept = 64;  // GPUs whose index is kept (State::gpu_index_kept)
constexpr uint64_t kUnmappedRetryNs = 5'000'000'000;  // a ring of a pid namespace not seen

/// Whether the process behind `pidfd` has exited (the pidfd polls readable).
bool pidfd_exited(int pidfd) noexcept {
  pollfd pfd{pidfd, POLLIN, 0};
  return ::poll(&pfd, 1, 0) == 1 && (pfd.revents & POLLIN);
}

}  // namespace

Registry::Process::~Process() {
  if (pidfd >= 0) ::close(pidfd);
}

Registry::Registry(RegistryOptions options, int dirfd, const Nvml* nvml)
    : opt_(std::move(options)),
      dirfd_(dirfd),
      nvml_(nvml),
      buffer_(kDrainBatch),
      hostname_(host_name()),
      jobs_(opt_.max_jobs, opt_.exited_linger_ns, opt_.unlink_exited) {
  rlimit rl{};
  fd_limit_ = ::getrlimit(RLIMIT_NOFILE, &rl) == 0 ? rl.rlim_cur : 1024;
  exit_ep_ = epoll_create1(EPOLL_CLOEXEC);  // -1: each pidfd is polled alone
  roots_[""].fd = dirfd_;
}

Registry::~Registry() {
  procs_.clear();
  for (auto& [label, root] : roots_)
    if (root.fd != dirfd_) close(root.fd);
  if (exit_ep_ >= 0) close(exit_ep_);
  if (dirfd_ >= 0) close(dirfd_);
}

void Registry::scan(bool listing_changed, bool retry_unchanged) {
  const uint64_t mono = mono_ns();
  // A ring still being checked (problem_grace_ns) is found a scan or two late; after that,
  // what no process claimed is of processes gone while no daemon ran.
  if (!restored_.empty() && restore_scans_left_-- == 0) restored_.clear();
  if (listing_changed || listed_mono_ == 0 || mono - listed_mono_ >= kFullScanNs) {
    std::set<std::string> present;
    list_pods();
    for (auto& [label, root] : roots_) list_root(label, root, present);
    listed_rings_.swap(present);
    listed_mono_ = mono;
    listing_changed = true;
  }
  const std::set<std::string>& present = listed_rings_;

  // A name that now refers to another file than the one we mapped (replaced by a new
  // file, a symlink, a FIFO...) is examined afresh: the old mapping no longer speaks for
  // it. A ring merely unlinked keeps its mapping, which still holds the exact counters.
  std::vector<std::string> replaced;
  for (const auto& [name, p] : procs_) {
    struct stat st{};
    const auto [fd, base] = locate(name);
    if (listing_changed && present.count(name) && fd >= 0 && fstatat(fd, base.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 &&
        (st.st_dev != p->ring->dev() || st.st_ino != p->ring->ino()))
      replaced.push_back(name);
  }
  for (const auto& name : replaced) {
    spdlog::warn("ring {}: the file was replaced under its name; re-examining it", name);
    forget(name, false);
  }
  for (const auto& name : present)
    if (!procs_.count(name)) try_open(name, mono, retry_unchanged);
  // Problems whose file went away are solved.
  for (auto it = problems_.begin(); it != problems_.end();)
    it = present.count(it->first) ? std::next(it) : problems_.erase(it);

  // Exits of the pidfds watched: one call for all of them.
  std::set<int> ready;
  if (exit_ep_ >= 0) {
    epoll_event evs[256];
    for (;;) {
      const int n = epoll_wait(exit_ep_, evs, 256, 0);
      for (int i = 0; i < n; ++i) ready.insert(evs[i].data.fd);
      if (n < 256) break;
    }
  }
  std::vector<std::string> expired, faulted;
  for (auto& [name, p] : procs_) {
    if (!p->exited && !check_exit(*p, mono, &ready)) {
      faulted.push_back(name);
      continue;
    }
    if (p->exited && mono - p->exited_mono >= opt_.exited_linger_ns) expired.push_back(name);
  }
  for (const auto& name : faulted) drop_faulted(name, "faulted while reading its header");
  for (auto& [name, p] : procs_) check_caps_held(*p);
  for (const auto& name : expired) forget(name, opt_.unlink_exited);
  // Site samples for `snapshot --leaks`: the live records by call site, every 30 s.
  for (auto& [name, p] : procs_) {
    if (p->exited || (p->sampled_mono != 0 && mono - p->sampled_mono < opt_.sample_every_ns)) continue;
    p->sampled_mono = mono;
    // No event since the last sample (none drained, none dropped): no record can have
    // changed, so the last sample stands again with this time, without reading the process's
    // live table (the costliest thing an idle process asked of the daemon).
    RingStatus status;
    if (!p->ring->status(status)) continue;
    const uint64_t events = p->events_received + status.events_dropped;
    std::shared_ptr<const Snapshot> sample;
    if (!p->samples->empty() && events == p->sampled_events) {
      auto again = std::make_shared<Snapshot>(*p->samples->back());
      again->time_ns = now_ns();
      sample = std::move(again);
    } else {
      RingSnapshot header;
      if (!p->ring->snapshot(header)) continue;
      const ProcessIdentity who{dir_of(name), p->pid, p->uid, p->start_time, p->user, false, p->ns_pid};
      TakenSnapshot t = take_snapshot(who, header, nullptr);
      if (!t.snap.exact) continue;
      p->sampled_events = events;  // only once a sample holds what these events did
      sample = std::make_shared<const Snapshot>(site_sample(t.snap));
    }
    auto samples = std::make_shared<SiteSamples>();
    samples->reserve(kSamplesKept);
    const std::size_t keep = std::min(p->samples->size(), kSamplesKept - 1);
    samples->assign(p->samples->end() - static_cast<std::ptrdiff_t>(keep), p->samples->end());
    samples->push_back(std::move(sample));
    p->samples = std::move(samples);
  }
  // Every scan sweeps every job: a killed member's share is back within a scan interval
  // even when no other member allocates. A process whose pidfd was found silent just now
  // runs (a pidfd is this very process, not its pid number): the sweep neither signals it
  // nor reads its /proc files (with a thousand members, a tenth of an idle daemon's time).
  running_.clear();
  for (const auto& [name, p] : procs_)
    if (!p->exited && p->pidfd >= 0) running_.push_back(job::owner_word(p->pid, p->start_time));
  std::sort(running_.begin(), running_.end());
  std::vector<JobTable::Dir> dirs = job_dirs();
  jobs_.scan(dirs, policy_.get(), mono, running_);
  for (const auto& d : dirs)
    if (std::none_of(roots_.begin(), roots_.end(), [&](const auto& r) { return r.second.fd == d.fd; })) close(d.fd);
}

std::size_t Registry::remove_exited() {
  std::vector<std::string> exited;
  for (const auto& [name, p] : procs_)
    if (p->exited) exited.push_back(name);
  for (const auto& name : exited) forget(name, opt_.unlink_exited);
  return exited.size();
}

bool Registry::retry_soon() const {
  const uint64_t mono = mono_ns();
  for (const auto& [name, pr] : problems_)
    if (pr.transient && mono - pr.first_seen_mono < opt_.problem_grace_ns) return true;
  return false;
}

void Registry::try_open(const std::string& name, uint64_t mono, bool retry_unchanged) {
  struct stat st{};
  const auto [dirfd, base] = locate(name);
  if (dirfd < 0 || fstatat(dirfd, base.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) return;  // vanished
  const int64_t mtime = int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
  auto pit = problems_.find(name);
  if (pit != problems_.end() && pit->second.dev == st.st_dev && pit->second.ino == st.st_ino &&
      pit->second.size == st.st_size && pit->second.mtime_ns == mtime &&
      (pit->second.transient ? !retry_unchanged : pit->second.retry_mono == 0 || mono < pit->second.retry_mono))
    return;  // same broken file as before

  auto record = [&](std::string reason, bool transient, uint64_t retry_mono = 0) {
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
    pr.retry_mono = retry_mono;
    if (changed && !transient) spdlog::warn("ring {}: {}", name, pr.reason);
    else spdlog::debug("ring {}: {} (for now)", name, pr.reason);
  };

  uint32_t pid = 0;
  uint64_t start_time = 0;
  if (!paths::parse_ring_file_name(base, &pid, &start_time)) {
    if (base.size() > 4 && base.compare(base.size() - 4, 4, paths::kRingSuffix) == 0)
      record("malformed ring file name", false);
    return;  // a temporary file or something else that merely starts with "ring-"
  }
  if (procs_.size() >= opt_.max_rings) {
    record("too many rings (limit " + std::to_string(opt_.max_rings) + ")", true);
    return;
  }
  // One user's rings (the file's owner is the ring's uid: open_ring checks it) take at most
  // max_rings_per_uid of the whole, so that no user crowds out the others.
  if (std::count_if(procs_.begin(), procs_.end(), [&](const auto& kv) { return kv.second->uid == st.st_uid; }) >=
      static_cast<std::ptrdiff_t>(opt_.max_rings_per_uid))
  {
    if (ring_limit_logged_.insert(st.st_uid).second)
      spdlog::warn("uid {} has {} rings, its limit: further ones are not tracked until some are forgotten",
                   st.st_uid, opt_.max_rings_per_uid);
    record("too many rings of uid " + std::to_string(st.st_uid) + " (limit " +
               std::to_string(opt_.max_rings_per_uid) + ")",
           true);
    return;
  }
  OpenResult r = open_ring(dirfd, base, pid, start_time);
  if (!r.view) {
    // A process this daemon cannot see is presumed alive: its ring stays, looked at again
    // every few seconds (its namespace may become visible), never every scan.
    record(r.error, r.transient, r.unmapped ? mono + kUnmappedRetryNs : 0);
    return;
  }
  if (pit != problems_.end()) problems_.erase(pit);

  auto p = std::make_unique<Process>(opt_.history_per_process);
  RingSnapshot snap;
  if (!r.view->snapshot(snap)) return;
  p->file_name = name;
  p->pid = r.host_pid;
  p->ns_pid = pid;
  p->start_time = start_time;
  p->uid = snap.uid;
  p->user = user_name(snap.uid);
  p->ring = std::move(r.view);
  if (auto it = restored_.find({pid, start_time}); it != restored_.end()) {
    for (const StoredEvent& ev : it->second) p->history.push(ev);  // numbered before any new one
    restored_.erase(it);
  }
  found_suspended(*p);
  set_priority(*p, snap);
  // The process's pidfd shows its exit without a read of /proc and without mistaking a
  // reused pid: checked against the start time after it is opened, so it is this process's.
  // Without one (an old kernel, no descriptor left, another pid namespace) /proc is read.
  // Descriptors are left for clients: pidfds take at most the soft limit less 512.
  if (procs_.size() + 512 < fd_limit_) p->pidfd = static_cast<int>(::syscall(SYS_pidfd_open, p->pid, 0));
  if (p->pidfd >= 0 && paths::process_gone(p->pid, start_time)) {
    ::close(p->pidfd);
    p->pidfd = -1;
  }
  if (p->pidfd >= 0 && exit_ep_ >= 0) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = p->pidfd;
    p->pidfd_watched = epoll_ctl(exit_ep_, EPOLL_CTL_ADD, p->pidfd, &ev) == 0;
  }
  spdlog::info("ring {}: pid {}{} ({}) user {}{}", name, p->pid,
               p->pid == pid ? std::string() : fmt::format(" (pid {} in its own namespace)", pid),
               field_text(snap.comm, sizeof snap.comm), p->user,
               p->ring->writable() ? "" : " [read-only: counters only, no events]");
  auto& ref = *p;
  procs_.emplace(name, std::move(p));
  drain_order_.clear();
  if (!check_exit(ref, mono)) {
    drop_faulted(name, "faulted while reading its header");
    return;
  }
  // What the ring holds already is drained before the scan takes the first site sample: a
  // sample counts the events drained before it, and one taken with events still waiting
  // would be taken again at the next, the live table read twice (with a thousand processes
  // found at start, a tenth of the daemon's first minute).
  if (!drain_one(ref, now_ns(), nullptr, nullptr)) drop_faulted(name, "faulted while draining events");
}

bool Registry::check_exit(Process& p, uint64_t mono, const std::set<int>* ready) {
  RingStatus st;
  if (!p.ring->status(st)) return false;
  const auto pidfd_says = [&] {
    if (ready && p.pidfd_watched) return ready->count(p.pidfd) != 0;
    return pidfd_exited(p.pidfd);
  };
  if (st.state == static_cast<uint32_t>(ring::ProcessState::exited)) {
    p.exited = true;
    p.exited_ns = st.exited_ns ? st.exited_ns : now_ns();
  } else if (p.pidfd >= 0 ? pidfd_says() : paths::process_gone(p.pid, p.start_time)) {
    p.exited = true;
    p.exited_ns = now_ns();
  }
  if (p.exited) {
    p.exited_mono = mono;
    spdlog::info("pid {} exited ({})", p.pid, p.file_name);
    if (p.pidfd >= 0) {
      ::close(p.pidfd);  // (which takes it out of the epoll set)
      p.pidfd = -1;
      p.pidfd_watched = false;
    }
  }
  return true;
}

void Registry::drop_faulted(const std::string& name, const char* what) {
  spdlog::warn("ring {}: {}; dropped", name, what);
  Problem pr;
  pr.reason = std::string("ring ") + what + " (truncated or rewritten under the daemon); dropped";
  pr.first_seen_mono = mono_ns();
  struct stat st{};
  if (const auto [fd, base] = locate(name); fd >= 0 && fstatat(fd, base.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
    pr.dev = st.st_dev;
    pr.ino = st.st_ino;
    pr.size = st.st_size;
    pr.mtime_ns = int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
  }
  problems_[name] = pr;
  if (auto it = procs_.find(name); it != procs_.end()) retire(*it->second);
  procs_.erase(name);
  drain_order_.clear();
}

void Registry::retire(const Process& p) {
  // Its header as it is now (a refusal just before it exited may never have been
  // published), else as last published (the ring faulted).
  const auto last = store_.load();
  RingSnapshot fresh;
  const RingSnapshot* found = nullptr;
  if (p.ring && p.ring->snapshot(fresh)) {
    found = &fresh;
  } else if (p.published) {
    // A State lists its processes by ring file name, as procs_ does.
    const auto it = std::lower_bound(last->processes.begin(), last->processes.end(), p.file_name,
                                     [](const ProcessState& ps, const std::string& n) { return ps.file_name < n; });
    if (it != last->processes.end() && it->file_name == p.file_name) found = &it->header;
  }
  if (!found) return;
  const RingSnapshot& h = *found;
  const std::string job = field_text(h.job, sizeof h.job);
  const auto index_of = gpu_index_of(gpu_rows(*last));
  // Rings are any user's to write: counters count only on GPUs that are real (NVML's, or
  // without NVML one a running process used), and one user's keys are bounded (state.hpp).
  const bool nvml = nvml_ && nvml_->available();
  const auto real = [&](const std::string& uuid) {
    if (!nvml) return gpu_index_kept_.count(uuid) != 0;
    return std::any_of(nvml_gpus_.begin(), nvml_gpus_.end(), [&](const NvmlGpu& g) { return g.uuid == uuid; });
  };
  std::size_t& keys = retired_keys_[p.user];
  const auto fold = [&](const std::string& key_job, bool is_new, std::string& job_out, std::string& user_out) {
    job_out = key_job;
    user_out = p.user;
    if (!is_new) return;
    const std::size_t total = retired_.by_gpu.size() + retired_.events_dropped.size();
    if (keys >= RetiredCounters::kPerUser || total >= RetiredCounters::kTotal) {
      job_out = RetiredCounters::kOthers;
      if (total >= RetiredCounters::kTotal) user_out = RetiredCounters::kOthers;
      if (retired_limit_logged_.insert(user_out).second)
        spdlog::warn("retired counters: {} reached the limit of {} keys; further jobs count as job \"{}\"",
                     user_out == p.user ? "user " + p.user : std::string("all users"),
                     user_out == p.user ? RetiredCounters::kPerUser : RetiredCounters::kTotal, RetiredCounters::kOthers);
    } else {
      ++keys;
    }
  };
  for (uint32_t d = 0; d < ring::kMaxDevices; ++d) {
    const DeviceSnapshot& ds = h.devices[d];
    if (!ds.present) continue;
    const std::string uuid = format_uuid(ds.uuid);
    if (!real(uuid)) continue;
    std::string kj, ku;
    fold(job, !retired_.by_gpu.count({uuid, job, p.user}), kj, ku);
    RetiredCounters::Row& row = retired_.by_gpu[{uuid, kj, ku}];
    if (auto it = index_of.find(uuid); it != index_of.end()) row.gpu_index = it->second;
    const auto values = ds.values();
    for (std::size_t i = 0; i < counters::kDeviceCount; ++i)
      if (counters::kDevice[i].type == counters::Type::counter) row.values[i] += values[i];
    retired_changed_ = true;
  }
  std::string kj, ku;
  fold(job, !retired_.events_dropped.count({job, p.user}), kj, ku);
  retired_.events_dropped[{kj, ku}] += h.events_dropped;
  retired_changed_ = true;
}

void Registry::forget(const std::string& name, bool unlink_file) {
  auto it = procs_.find(name);
  if (it == procs_.end()) return;
  Process& p = *it->second;
  drain_one(p, now_ns(), nullptr, nullptr);  // last events of this ring; a fault changes nothing here
  const auto [dirfd, base] = locate(name);
  if (unlink_file && p.ring && dirfd >= 0) {
    struct stat st{};
    // Only the file we mapped: not a new ring that reused the name.
    if (fstatat(dirfd, base.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && st.st_dev == p.ring->dev() &&
        st.st_ino == p.ring->ino())
    {
      unlinkat(dirfd, base.c_str(), 0);  // failure is fine: not our file to insist on
      // The live segment beside it, if it is the same owner's.
      const std::string live_name = live::file_name(p.ns_pid, p.start_time);
      struct stat ls{};
      if (fstatat(dirfd, live_name.c_str(), &ls, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(ls.st_mode) &&
          ls.st_uid == st.st_uid)
        unlinkat(dirfd, live_name.c_str(), 0);
    }
  }
  // A suspended process that exited took its host copy with it; one whose ring is dropped
  // while it lives is still suspended when its ring is found again.
  if (p.suspended && p.exited) forget_suspension(p, "exited while suspended");
  else if (p.suspended)
    suspend_records_[{p.pid, p.start_time}] = {p.suspended_ns, p.suspended_host_bytes, p.suspended_by,
                                               p.suspended_footprint, p.suspended_by_policy};
  spdlog::info("forgot pid {} ({})", p.pid, name);
  retire(p);
  procs_.erase(name);
  drain_order_.clear();
}

bool Registry::drain_one(Process& p, uint64_t now, bool* more, bool* busy) {
  if (!p.ring || !p.ring->writable()) return true;
  const bool beat = now - p.beat_ns >= kIdleBeatNs;
  const bool read_present = p.idle_drains == 0 || p.visits % kPresentEvery == 0;
  ++p.visits;
  std::size_t drained = 0;
  for (std::size_t round = 0; round < kDrainRoundsPerTick; ++round) {
    // Skipping unpublished slots is safe only once no producer can publish any more: a
    // live producer that publishes into a slot we skipped would wedge the ring.
    DrainResult r = p.ring->drain(buffer_.data(), buffer_.size(), p.exited, now, round == 0 && beat,
                                  round == 0 && read_present);
    if (!r.ok) return false;
    if ((round == 0 && read_present) || r.events) p.present = r.present;
    if (r.events || (round == 0 && beat)) p.beat_ns = now;
    p.events_lost += r.lost;
    p.events_received += r.events;
    drained += r.events;
    for (std::size_t i = 0; i < r.events; ++i) {
      const StoredEvent ev{++seq_, buffer_[i], StoredEvent::kFromProcess};
      p.history.push(ev);
      if (journal_) journal_->append(p.pid, p.start_time, ev);
      const auto kind = static_cast<ring::EventKind>(ev.e.kind);
      if (kind == ring::EventKind::refuse || kind == ring::EventKind::job_refuse ||
          (kind == ring::EventKind::driver_error && ev.e.result == 2 /* CUDA_ERROR_OUT_OF_MEMORY */))
        take_oom_report(p, ev);
    }
    if (r.events < buffer_.size()) {
      p.idle_drains = drained ? 0 : p.idle_drains + 1;
      // A ring that filled an eighth of itself since the last tick is being written fast:
      // come back sooner than the idle interval, before it can fill up and drop.
      if (busy && drained * 8 >= p.ring->slot_count()) *busy = true;
      return true;
    }
  }
  p.idle_drains = 0;
  if (more) *more = true;
  return true;
}

void Registry::take_oom_report(Process& p, const StoredEvent& ev) {
  // A framework that frees its cache and retries refuses again in a burst: one report a
  // second per process says it.
  const uint64_t mono = mono_ns();
  if (p.oom_taken_mono != 0 && mono - p.oom_taken_mono < 1'000'000'000ULL) return;
  p.oom_taken_mono = mono;
  RingSnapshot header;
  if (!p.ring->snapshot(header)) return;
  auto rep = std::make_shared<OomReport>();
  rep->pid = p.pid;
  rep->uid = p.uid;
  rep->start_time = p.start_time;
  rep->process_name = field_text(header.comm, sizeof header.comm);
  rep->user = p.user;
  rep->event = ev;
  const ProcessIdentity who{dir_of(p.file_name), p.pid, p.uid, p.start_time, p.user, p.exited, p.ns_pid};
  const auto history = p.history.view();
  rep->snapshot = take_snapshot(who, header, history.get(), 2000);
  spdlog::info("pid {}: out of memory ({} bytes asked on device {}); report kept{}", p.pid, ev.e.bytes,
               static_cast<int>(ev.e.device), rep->snapshot.snap.exact ? "" : " without live records");
  std::shared_ptr<const OomReport> kept = std::move(rep);
  oom_log_.push_back(kept);
  while (oom_log_.size() > kOomLog) oom_log_.pop_front();
  if (oom_listener_) oom_listener_(kept);
}

void Registry::restore_history(RestoredHistory restored, uint64_t max_seq) {
  restored_ = std::move(restored);
  seq_ = std::max(seq_, max_seq);
}

void Registry::restore_oom_reports(const std::vector<std::shared_ptr<const OomReport>>& older) {
  for (auto it = older.rbegin(); it != older.rend() && oom_log_.size() < kOomLog; ++it) oom_log_.push_front(*it);
}

void Registry::replace_oom_report(const OomReport* taken, std::shared_ptr<const OomReport> named) {
  for (auto& r : oom_log_)
    if (r.get() == taken) {
      r = std::move(named);
      return;
    }
}

Registry::DrainPace Registry::drain_all() {
  bool more = false, busy = false;
  const uint64_t now = now_ns();
  std::vector<std::string> faulted;
  ++drain_tick_;
  // A flat list, rebuilt when a process comes or goes: walking the map's nodes every tick
  // was a quarter of an idle daemon's time with a thousand processes.
  if (drain_order_.size() != procs_.size()) {
    drain_order_.clear();
    for (auto& [name, p] : procs_) drain_order_.push_back({p.get(), p->idle_drains, p->pid});
  }
  // Every ring idle: all are visited now and the next drain is kIdleStride ticks away
  // (the same wait for each ring, an eighth of the wake-ups).
  bool all_idle = !drain_order_.empty();
  for (const DrainSlot& s : drain_order_) all_idle = all_idle && s.idle_drains >= kIdleAfterDrains;
  for (DrainSlot& s : drain_order_) {
    // Idle rings in kIdleStride groups (by pid), one group a tick; decided from the list
    // alone, without touching the process's own memory.
    if (!all_idle && s.idle_drains >= kIdleAfterDrains && (drain_tick_ + s.pid) % kIdleStride != 0) continue;
    Process& p = *s.process;
    if (!drain_one(p, now, &more, &busy)) faulted.push_back(p.file_name);
    else if (policy_ && !p.exited) apply_policy(p);
    s.idle_drains = p.idle_drains;
    all_idle = all_idle && s.idle_drains >= kIdleAfterDrains;  // each was visited: still idle after it
  }
  for (const auto& name : faulted) drop_faulted(name, "faulted while draining events");
  if (more) return DrainPace::again;
  if (busy) return DrainPace::soon;
  return all_idle ? DrainPace::all_idle : DrainPace::idle;
}

void Registry::publish() {
  auto st = std::make_shared<State>();
  const uint64_t mono = mono_ns();
  st->hostname = hostname_;
  st->run_dir = opt_.run_dir;
  st->nvml = nvml_ && nvml_->available();
  if (st->nvml) st->driver_version = nvml_->driver_version();
  // NVML walks every device and its process list: asked at most every nvml_refresh_ns, not
  // at every publish.
  if (!nvml_read_mono_ || mono - *nvml_read_mono_ >= opt_.nvml_refresh_ns) {
    nvml_gpus_ = nvml_ ? nvml_->query() : std::vector<NvmlGpu>{};
    nvml_read_mono_ = mono;
  }
  st->gpus = nvml_gpus_;

  std::vector<std::string> faulted;
  st->processes.reserve(procs_.size());
  for (auto& [name, p] : procs_) {
    // The header is read where the State keeps it: a copy of its 4 KiB fewer per process.
    ProcessState& ps = st->processes.emplace_back();
    if (!p->ring->snapshot(ps.header)) {
      st->processes.pop_back();
      faulted.push_back(name);  // retired as the last State has it
      continue;
    }
    p->published = true;
    ps.file_name = name;
    ps.pid = p->pid;
    ps.ns_pid = p->ns_pid;
    ps.uid = p->uid;
    ps.user = p->user;
    ps.start_time = p->start_time;
    ps.exited = p->exited;
    ps.exited_ns = p->exited_ns;
    ps.events_received = p->events_received;
    ps.events_lost = p->events_lost;
    ps.events_readable = p->ring->writable();
    ps.tampers = p->tampers;
    if (p->suspended && p->exited) forget_suspension(*p, "exited while suspended");
    ps.suspended = p->suspended;
    ps.suspended_since_ns = p->suspended_ns;
    ps.suspended_host_bytes = p->suspended_host_bytes;
    ps.suspended_by = p->suspended_by;
    ps.priority = p->priority;
    ps.waiting_for_room = p->waiting_for_room;
    ps.suspended_overdue = p->suspended_overdue;
    ps.history = p->history.view();
    ps.samples = p->samples;
  }
  for (const auto& name : faulted) drop_faulted(name, "faulted while reading its header");

  for (auto& [file, j] : jobs_.jobs()) {
    JobState js;
    if (!jobs_.view(j, &js.view)) continue;  // dropped at the next scan
    js.file = file;
    js.name = j.name;
    js.user = j.user;
    js.uid = j.uid;
    st->jobs.push_back(std::move(js));
  }

  for (const auto& [name, pr] : problems_) {
    if (pr.transient && mono - pr.first_seen_mono < opt_.problem_grace_ns) continue;
    st->problems.push_back({name, pr.reason});
  }
  for (const auto& [name, reason] : jobs_.problems()) st->problems.push_back({name, reason});

  if (policy_) st->policy_file = policy_->file;
  st->limit_changes.assign(limit_log_.begin(), limit_log_.end());
  st->limit_changes.insert(st->limit_changes.end(), refusal_log_.begin(), refusal_log_.end());
  std::stable_sort(st->limit_changes.begin(), st->limit_changes.end(),
                   [](const LimitChange& a, const LimitChange& b) { return a.time_ns < b.time_ns; });
  st->ooms.assign(oom_log_.begin(), oom_log_.end());
  // Shared by every State until a process is retired: copying the whole map into each
  // State kept the loop busy once it was large.
  if (retired_changed_ || !retired_shared_) {
    retired_shared_ = std::make_shared<const RetiredCounters>(retired_);
    retired_changed_ = false;
  }
  st->retired = retired_shared_;
  st->events_seq = seq_;
  st->time_ns = now_ns();
  st->gpu_index_kept = gpu_index_kept_;
  // Rings are any user's to write: UUIDs of GPUs NVML does not know count only while a
  // process that still runs reports them, and the kept list is bounded, for each uid's
  // rings as well (one user's made-up GPUs, kept for good, left no room for another's).
  std::set<std::string> running;
  for (const ProcessState& ps : st->processes)
    if (!ps.exited)
      for (const DeviceSnapshot& ds : ps.header.devices)
        if (ds.present) running.insert(format_uuid(ds.uuid));
  std::set<uint32_t> over;
  for (const GpuRow& row : gpu_rows(*st, &over)) {
    if (gpu_index_kept_.size() >= kGpuIndexKept || !running.count(row.uuid) || gpu_index_kept_.count(row.uuid)) continue;
    if (row.uids.empty()) gpu_index_kept_.emplace(row.uuid, row.index);  // NVML's
    for (const uint32_t uid : row.uids) {  // charged to the first of its uids with room left
      if (std::size_t& n = gpus_kept_by_uid_[uid]; n < kMaxRingGpusPerUid) {
        ++n;
        gpu_index_kept_.emplace(row.uuid, row.index);
        break;
      }
      over.insert(uid);
    }
  }
  for (const uint32_t uid : over)
    if (gpu_limit_logged_.insert(uid).second)
      spdlog::warn("uid {} reached its limit of {} GPUs that only its rings name (no NVML): further ones are left out",
                   uid, kMaxRingGpusPerUid);
  st->gpu_index_kept = gpu_index_kept_;
  store_.publish(std::move(st));
}

}  // namespace cuw::daemon

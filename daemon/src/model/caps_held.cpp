// cuwarden daemon model: caps that hold against their owner. A process's ring is its owner's
// own file, so the owner can write a higher cap into it than the daemon allowed; the daemon
// puts such a raise back at every scan, and compares what the driver (NVML) says the process
// holds with the same ceiling, which the owner cannot write. The ceiling is the lower of the
// policy's (or root's) and the one the site gave the process's Slurm job (cuw/site_cap.hpp).
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "base/util.hpp"
#include "cuw/paths.hpp"
#include "cuw/site_cap.hpp"
#include "model/detail/registry_process.hpp"
#include "model/registry.hpp"

namespace cuw::daemon {

namespace {

/// What a process may hold beyond its cap by the driver's count before the daemon calls it
/// over: the CUDA context and loaded modules, which no allocation call makes (hundreds of
/// MiB on an H100 with PyTorch's kernels loaded), outside a cap of the default scope.
constexpr uint64_t kContextAllowance = 1ull << 30;

/// SIGKILL to the process the daemon knows as (pid, start_time): through its pidfd, which
/// cannot name a reused pid, else by pid once its start time still matches. 0 or an errno.
int end_process(int pidfd, uint32_t pid, uint64_t start_time) {
  if (pidfd >= 0) return ::syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, nullptr, 0) == 0 ? 0 : errno;
  if (paths::process_start_time(pid) != start_time) return ESRCH;
  return ::kill(static_cast<pid_t>(pid), SIGKILL) == 0 ? 0 : errno;
}

/// A limit change the daemon made on its own (not at anyone's request) to process `pid`.
LimitChange daemon_change(uint32_t pid, std::string outcome, std::string reason) {
  LimitChange c;
  c.time_ns = now_ns();
  c.by = "daemon";
  c.target = "pid " + std::to_string(pid);
  c.pid = pid;
  c.outcome = std::move(outcome);
  c.reason = std::move(reason);
  return c;
}

}  // namespace

void Registry::read_site_ceiling(Process& p) {
  p.site_read = true;
  // The job from the process's cgroup, which it cannot leave; else the job name its ring
  // gives (a name it chose can only bring another job's ceiling on itself).
  uint32_t job = site_cap::slurm_job_of_cgroup(p.pid);
  RingSnapshot s;
  if (!job && p.ring->snapshot(s)) job = site_cap::slurm_job_of_name(field_text(s.job, sizeof s.job));
  if (!job) return;
  const std::string path = site_cap::slurm_file(opt_.run_dir, job);
  site_cap::Ceiling ceiling;
  std::string why;
  switch (site_cap::read(path, &ceiling, &why)) {
    case site_cap::Read::absent: return;
    case site_cap::Read::refused:
      if (site_refused_logged_.insert(path).second) spdlog::warn("{}; not a ceiling, ignored", why);
      return;
    case site_cap::Read::ok: break;
  }
  p.site_limit = std::move(ceiling.limit);
  p.site_file = path;
}

void Registry::check_caps_held(Process& p) {
  if (p.exited) return;
  if (!p.site_read) read_site_ceiling(p);
  bool any = p.site_limit.has_value();
  for (uint64_t c : p.ceiling) any = any || c != ring::kNoLimit;
  if (!any) return;
  RingSnapshot s;
  if (!p.ring->snapshot(s)) return;
  const uint64_t tampers_before = p.tampers;
  uint32_t over = 0;
  for (uint32_t d = 0; d < ring::kMaxDevices; ++d) {
    const DeviceSnapshot& ds = s.devices[d];
    if (!ds.present) continue;
    // The site's ceiling for its Slurm job holds as the policy's does, the lower of the two.
    uint64_t site = ring::kNoLimit;
    if (p.site_limit && !(p.site_lifted & (1u << d)))
      if (const auto spec = p.site_limit->for_device(static_cast<int>(d)); spec && (!spec->percent || ds.physical_total))
        site = spec->resolve(ds.physical_total);
    const uint64_t ceiling = std::min(p.ceiling[d], site);
    if (ceiling == ring::kNoLimit) continue;
    if (ds.limit > ceiling && p.ring->writable()) {  // kNoLimit (no cap at all) is above any ceiling
      uint64_t actual = 0;
      if (p.ring->set_limit(d, ds.limit, ceiling, &actual) == RingView::SetLimit::ok) {
        ++p.tampers;
        const std::string allows =
            site < p.ceiling[d] ? "its Slurm job allows (" + p.site_file + ")" : std::string("the daemon allows");
        spdlog::warn("pid {} ({}) device {}: its cap was raised to {} in its own ring, past the {} {}; put back", p.pid,
                     p.user, d, cap_text(ds.limit), cap_text(ceiling), allows);
        record_change(&p, static_cast<int>(d), ds.limit, ceiling, ds.used, StoredEvent::kFromTamper, 0);
        LimitChange c = daemon_change(p.pid, "restored",
                                      "the process raised its own cap past what " +
                                          (site < p.ceiling[d] ? "its Slurm job" : std::string("the daemon")) +
                                          " allows (tamper)");
        c.device = d;
        c.has_limits = true;
        c.old_limit = ds.limit;
        c.new_limit = ceiling;
        log_limit(std::move(c));
      }
    }
    // The driver's figure: what the process holds however it got it, hooks bypassed included.
    const std::string uuid = format_uuid(ds.uuid);
    for (const NvmlGpu& g : nvml_gpus_) {
      if (g.uuid != uuid) continue;
      const auto it = g.process_used.find(p.pid);
      if (it != g.process_used.end() && it->second > ceiling + kContextAllowance) over |= 1u << d;
    }
  }
  // Counted once per stretch over the ceiling, said once.
  if (const uint32_t fresh = over & ~p.over_ceiling) {
    ++p.tampers;
    spdlog::warn("pid {} ({}): the driver reports it holds more than its cap allows (devices {:#x}, beyond a {} "
                 "allowance for its context): memory taken past cuwarden's hooks",
                 p.pid, p.user, fresh, format_bytes(kContextAllowance));
  }
  p.over_ceiling = over;

  // Two scans in a row found it over (a raise put back each time, or the driver's figure):
  // under `enforce = "kill"` the first was its warning.
  const bool offending = p.tampers != tampers_before || over != 0;
  p.offending_scans = offending ? p.offending_scans + 1 : 0;
  if (!offending || !policy_ || policy_->for_user(p.uid).enforce_or() != Enforce::kill) return;
  if (p.offending_scans == 1) {
    spdlog::warn("pid {} ({}): over its cap's ceiling; the policy ends it (enforce = \"kill\") if it still is at the "
                 "next scan",
                 p.pid, p.user);
    return;
  }
  if (p.kill_tried) return;
  p.kill_tried = true;
  const int err = end_process(p.pidfd, p.pid, p.start_time);
  if (err == 0)
    spdlog::warn("pid {} ({}): still over its cap's ceiling; ended with SIGKILL (enforce = \"kill\")", p.pid, p.user);
  else
    spdlog::error("pid {} ({}): over its cap's ceiling; enforce = \"kill\" could not end it: {}", p.pid, p.user,
                  std::strerror(err));
  log_limit(daemon_change(p.pid, err == 0 ? "killed" : "failed",
                          err == 0 ? "over its cap's ceiling at two scans in a row; the policy says enforce = \"kill\""
                                   : std::string("could not end it: ") + std::strerror(err)));
}

}  // namespace cuw::daemon

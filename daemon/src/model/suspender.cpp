// cuwarden daemon model: a suspend or resume carried out (see suspender.hpp).
#include "model/suspender.hpp"

#include <chrono>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "model/registry.hpp"

namespace cuw::daemon {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

SuspendResult Suspender::run(const Peer& peer, const SuspendRequest& req) {
  using O = SuspendResult::Outcome;
  if (!driver_.available()) {
    SuspendResult r;
    r.action = req.action;
    r.outcome = O::failed;
    r.reason = driver_.why_not();
    return r;
  }
  SuspendResult r;
  on_loop_([&] { r = reg_.prepare_suspend(peer, req); });
  if (r.outcome != O::done) return r;

  const std::string what = r.job ? fmt::format("job '{}'", r.job_name) : fmt::format("pid {}", r.processes[0].pid);
  std::string failure;
  if (req.action == SuspendRequest::Action::suspend) {
    // Every lock before any checkpoint: a job whose member cannot be locked is left running whole.
    std::vector<std::chrono::steady_clock::time_point> began(r.processes.size());
    std::size_t locked = 0;
    for (; locked < r.processes.size(); ++locked) {
      began[locked] = std::chrono::steady_clock::now();
      const uint32_t pid = r.processes[locked].pid;
      const int rc = driver_.lock(pid, req.timeout_ms);
      r.processes[locked].first_seconds = seconds_since(began[locked]);
      if (rc != 0) {
        // CUDA_ERROR_NOT_READY (600): the lock's timeout passed; anything else failed at once.
        failure = rc == 600 ? fmt::format("{} was not suspended: pid {} could not be locked within {} ms ({}): its "
                                          "submitted work did not finish in time",
                                          what, pid, req.timeout_ms, driver_.error_text(rc))
                            : fmt::format("{} was not suspended: the driver could not lock pid {} ({})", what, pid,
                                          driver_.error_text(rc));
        break;
      }
    }
    if (!failure.empty()) {
      for (std::size_t i = 0; i < locked; ++i)
        if (const int rc = driver_.unlock(r.processes[i].pid); rc != 0)
          spdlog::error("suspend: pid {} could not be unlocked after a failed lock of its job ({})", r.processes[i].pid,
                        driver_.error_text(rc));
    } else {
      for (std::size_t i = 0; i < r.processes.size(); ++i) {
        SuspendTarget& t = r.processes[i];
        if (const int rc = driver_.checkpoint(t.pid); rc != 0) {
          failure += fmt::format("{}pid {}'s checkpoint failed ({}): the driver leaves it FAILED", failure.empty() ? "" : "; ",
                                 t.pid, driver_.error_text(rc));
          continue;
        }
        t.done = true;
        t.seconds = seconds_since(began[i]);
        spdlog::info("suspend: pid {} ({} bytes on the GPU): lock {:.3f} s, checkpoint {:.3f} s", t.pid,
                     t.device_bytes, t.first_seconds, t.seconds - t.first_seconds);
      }
    }
  } else {
    for (SuspendTarget& t : r.processes) {
      const auto t0 = std::chrono::steady_clock::now();
      const int restored = driver_.restore(t.pid, t.pairs);
      t.first_seconds = seconds_since(t0);
      if (const int rc = restored; rc != 0) {
        failure += fmt::format("{}pid {}'s restore failed ({})", failure.empty() ? "" : "; ", t.pid, driver_.error_text(rc));
        continue;
      }
      // Before the unlock: the process's first call after it prints the resume line.
      on_loop_([&] { reg_.tell_resumed(peer, r, t); });
      if (const int rc = driver_.unlock(t.pid); rc != 0) {
        failure += fmt::format("{}pid {} was restored but not unlocked ({})", failure.empty() ? "" : "; ", t.pid,
                               driver_.error_text(rc));
        continue;
      }
      t.done = true;
      t.seconds = seconds_since(t0);
      spdlog::info("resume: pid {}: restore {:.3f} s, unlock {:.3f} s", t.pid, t.first_seconds,
                   t.seconds - t.first_seconds);
    }
  }
  on_loop_([&] { reg_.finish_suspend(peer, r); });
  if (!failure.empty()) {
    spdlog::warn("{}", failure);
    r.outcome = O::failed;
    r.reason = failure;
  }
  return r;
}

}  // namespace cuw::daemon

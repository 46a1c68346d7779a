// cuwarden daemon model: suspending and resuming by policy, carried out (see room_keeper.hpp).
#include "model/room_keeper.hpp"

#include <poll.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "base/util.hpp"
#include "model/registry.hpp"

namespace cuw::daemon {

namespace {

/// The daemon acting on its own: root of its own namespace, recorded as "policy".
Peer policy_peer() {
  Peer p;
  p.known = true;
  p.uid = 0;
  p.gid = 0;
  p.pid = static_cast<int32_t>(::getpid());
  p.same_pidns = true;
  return p;
}

}  // namespace

RoomAnswer RoomKeeper::ask(const Peer& peer, const RoomRequest& req) {
  const uint64_t t0 = mono_ns();
  RoomPlan plan;
  on_loop_([&] { plan = reg_.plan_room(peer, req); });
  RoomAnswer a;
  a.reason = plan.reason;
  a.shortfall = plan.shortfall;
  if (plan.outcome == RoomPlan::Outcome::free_now) a.granted = true;
  if (plan.outcome != RoomPlan::Outcome::suspend) return a;

  const uint64_t deadline = t0 + plan.wait_ms * 1'000'000ULL;
  uint64_t freed = 0;
  std::string failures;
  std::vector<RoomCandidate> done;
  for (const RoomCandidate& v : plan.victims) {
    const uint64_t now = mono_ns();
    if (now + 1'000'000ULL >= deadline) {
      failures += fmt::format("; out of time (room_wait {} ms) before pid {}", plan.wait_ms, v.pid);
      break;
    }
    SuspendRequest sr;
    sr.action = SuspendRequest::Action::suspend;
    sr.pid = v.pid;
    sr.start_time = v.start_time;
    sr.by_policy = true;
    sr.timeout_ms = static_cast<uint32_t>(std::min<uint64_t>(10'000, (deadline - now) / 1'000'000ULL));
    const SuspendResult r = suspender_.run(policy_peer(), sr);
    if (r.outcome == SuspendResult::Outcome::done && !r.processes.empty() && r.processes[0].done) {
      a.suspended.push_back(v.pid);
      done.push_back(v);
      freed += v.bytes;
    } else {
      failures += fmt::format("; pid {} not suspended: {}", v.pid, r.reason);
    }
  }
  on_loop_([&] { reg_.end_room(plan.pid, plan.start_time, done); });
  a.granted = freed >= plan.shortfall;
  a.reason = plan.reason + failures;
  spdlog::info("room: pid {}: {} ({})", plan.pid, a.granted ? "granted" : "not granted", a.reason);
  return a;
}

void RoomKeeper::resume_loop(int stop_fd) {
  ::pthread_setname_np(::pthread_self(), "cuwardend-room");
  pollfd stop{stop_fd, POLLIN, 0};
  try {
    while (::poll(&stop, 1, kResumeCheckMs) <= 0 || (stop.revents & POLLIN) == 0) resume_due();
  } catch (const std::exception& e) {  // the loop's queue closed: the daemon is stopping
    spdlog::debug("resume thread: {}", e.what());
  }
}

int RoomKeeper::resume_due() {
  int resumed = 0;
  const uint64_t now = mono_ns();
  std::erase_if(retry_at_, [&](const auto& kv) { return kv.second <= now; });
  on_loop_([&] { reg_.hold_back_for_restores(); });
  // One at a time: each restore takes memory the next one's check must see. One that failed
  // waits kResumeRetryNs before it is tried again (and said again in the log).
  for (int round = 0; round < 64; ++round) {
    std::vector<PolicyResume> due;
    on_loop_([&] { due = reg_.policy_resumes_due(); });
    std::erase_if(due, [&](const PolicyResume& d) { return retry_at_.count({d.pid, d.start_time}) != 0; });
    if (due.empty()) break;
    SuspendRequest sr;
    sr.action = SuspendRequest::Action::resume;
    sr.pid = due.front().pid;
    sr.start_time = due.front().start_time;
    sr.by_policy = true;
    const SuspendResult r = suspender_.run(policy_peer(), sr);
    if (r.outcome != SuspendResult::Outcome::done) {
      spdlog::warn("policy resume of pid {} failed: {}; tried again in {} s", sr.pid, r.reason,
                   kResumeRetryNs / 1'000'000'000ULL);
      retry_at_[{sr.pid, sr.start_time}] = mono_ns() + kResumeRetryNs;
      continue;
    }
    ++resumed;
  }
  return resumed;
}

}  // namespace cuw::daemon

// cuwarden integration tests: suspending by policy on the simulated driver
// (suspend_test_support.hpp). A process whose allocation the shared simulated device cannot
// serve asks the daemon for room on its second failure (the victim program's reserve_retry,
// as a framework retries after giving back its cache); the daemon suspends lower-priority
// processes and resumes them once the memory has stayed free.
#include <chrono>
#include <csignal>
#include <memory>

#include "suspend_test_support.hpp"

using namespace cuwt;

namespace {

/// A policy file in the setup's directory; returns the daemon's arguments for it.
std::vector<std::string> policy(const Setup& s, const std::string& text) {
  const std::string path = s / "policy.toml";
  std::ofstream(path) << text;
  return {"--config", path};
}

/// Kills a process the test did not spawn itself (a victim's child) when the test ends.
struct KillAtEnd {
  pid_t pid = 0;
  ~KillAtEnd() {
    if (pid > 0) ::kill(pid, SIGKILL);
  }
};

}  // namespace

TEST_CASE("room.a_higher_priority_allocation_suspends_a_lower_one_which_resumes_after") {
  Setup s;
  ScopedEnv env(s.env);
  SuspendDaemon d(s);
  Victim low(s, {"CUWARDEN_PRIORITY=-10"});
  REQUIRE(contains(low.ask("alloc " + std::to_string(160 * kMiB)), "ptr 0x"));
  Victim high(s);
  wait_process(d, low.pid());
  REQUIRE(contains(high.ask("reserve " + std::to_string(kMiB)), "ptr 0x"));
  wait_process(d, high.pid());
  CHECK(d.process(low.pid())["priority"] == -10);
  CHECK(d.process(high.pid())["priority"] == 0);

  // 160 MiB of 256 held: 128 MiB cannot be had without the lower one's.
  const std::string r = high.ask("reserve_retry " + std::to_string(128 * kMiB));
  INFO(r << "\n" << slurp(d.log) << high.err());
  REQUIRE(contains(r, "ptr 0x"));
  json p = d.process(low.pid());
  CHECK(p["state"] == "suspended");
  CHECK(p["suspended_by"] == "policy");
  CHECK(d.process(high.pid())["waiting_for_room"] == false);
  // Its calls wait while it is suspended.
  low.send("check");
  REQUIRE(low.line() == "calling");
  REQUIRE(wait_until([&] { return low.blocked_calls(s) == 1; }));
  // Nothing resumes it while the room is taken.
  CHECK(d.process(low.pid())["state"] == "suspended");

  // The higher one frees: the lower one resumes by itself, its data intact.
  REQUIRE(high.ask("free_reserved") == "rc 0");
  CHECK(contains(low.line(), "ok 0x"));
  REQUIRE(wait_until([&] { return d.process(low.pid())["state"] == "running"; }));
  CHECK(contains(low.err(), " s by policy; resumed"));
  const auto kinds = event_kinds(d, low.pid());
  CHECK(std::count(kinds.begin(), kinds.end(), "suspend") == 1);
  CHECK(std::count(kinds.begin(), kinds.end(), "resume") == 1);
  CHECK(std::filesystem::is_empty(s.state + "/suspended"));
}

TEST_CASE("room.a_process_may_only_lower_its_priority_unless_the_policy_allows") {
  Setup s;
  ScopedEnv env(s.env);
  SuspendDaemon d(s, policy(s, "[default]\npriority = 5\nmax_priority = 20\n"));
  Victim asks_more(s, {"CUWARDEN_PRIORITY=50"});
  Victim asks_less(s, {"CUWARDEN_PRIORITY=-3"});
  Victim asks_none(s);
  for (Victim* v : {&asks_more, &asks_less, &asks_none}) REQUIRE(contains(v->ask("reserve 1048576"), "ptr 0x"));
  CHECK(wait_process(d, asks_more.pid())["priority"] == 20);
  CHECK(wait_process(d, asks_less.pid())["priority"] == -3);
  CHECK(wait_process(d, asks_none.pid())["priority"] == 5);
}

TEST_CASE("room.a_related_process_is_never_chosen") {
  Setup s;
  ScopedEnv env(s.env);
  SuspendDaemon d(s);
  // The same job, lower priority, holding what the requester lacks.
  Victim mate(s, {"CUWARDEN_PRIORITY=-10", "CUWARDEN_JOB=train"});
  REQUIRE(contains(mate.ask("reserve " + std::to_string(100 * kMiB)), "ptr 0x"));
  Victim high(s, {"CUWARDEN_JOB=train"});
  REQUIRE(contains(high.ask("reserve " + std::to_string(kMiB)), "ptr 0x"));
  // Its own child, in a session of its own, lower priority, holding more.
  high.send("spawn_holder " + std::to_string(60 * kMiB) + " 10");
  const std::string held = high.line();
  REQUIRE(held.rfind("held ", 0) == 0);
  KillAtEnd child{static_cast<pid_t>(std::stoi(held.substr(5)))};
  wait_process(d, mate.pid());
  wait_process(d, high.pid());
  CHECK(wait_process(d, static_cast<uint32_t>(child.pid))["priority"] == -10);

  const std::string r = high.ask("reserve_retry " + std::to_string(150 * kMiB));
  INFO(slurp(d.log));
  CHECK(r == "rc 2");  // CUDA_ERROR_OUT_OF_MEMORY: told no, at once
  CHECK(contains(slurp(d.log), "room: pid " + std::to_string(high.pid())));
  CHECK(contains(slurp(d.log), "0 of them eligible"));
  CHECK(d.process(mate.pid())["state"] == "running");
  CHECK(d.process(static_cast<uint32_t>(child.pid))["state"] == "running");
  CHECK(mate.ask("call") == "rc 0");
}

TEST_CASE("room.an_equal_priority_process_is_never_chosen") {
  Setup s;
  ScopedEnv env(s.env);
  SuspendDaemon d(s);
  Victim peer(s);
  REQUIRE(contains(peer.ask("reserve " + std::to_string(160 * kMiB)), "ptr 0x"));
  Victim asker(s);
  REQUIRE(contains(asker.ask("reserve " + std::to_string(kMiB)), "ptr 0x"));
  wait_process(d, peer.pid());
  wait_process(d, asker.pid());
  const std::string r = asker.ask("reserve_retry " + std::to_string(128 * kMiB));
  INFO(slurp(d.log));
  CHECK(r == "rc 2");
  CHECK(contains(slurp(d.log), "0 lower-priority process(es)"));
  CHECK(d.process(peer.pid())["state"] == "running");
  CHECK(peer.ask("call") == "rc 0");
}

TEST_CASE("room.two_askers_neither_is_suspended_for_the_other") {
  Setup s;
  ScopedEnv env(s.env);
  SuspendDaemon d(s, policy(s, "[default]\nmax_priority = 100\n"));
  // low holds 100 MiB with work queued that its lock must wait for (3 s).
  Victim low(s, {"CUWARDEN_PRIORITY=-10"});
  REQUIRE(contains(low.ask("alloc " + std::to_string(100 * kMiB)), "ptr 0x"));
  Victim mid(s, {"CUWARDEN_PRIORITY=-5"});
  REQUIRE(contains(mid.ask("reserve " + std::to_string(60 * kMiB)), "ptr 0x"));
  Victim top(s, {"CUWARDEN_PRIORITY=10"});
  REQUIRE(contains(top.ask("reserve " + std::to_string(kMiB)), "ptr 0x"));
  wait_process(d, low.pid());
  wait_process(d, mid.pid());
  wait_process(d, top.pid());
  REQUIRE(low.ask("busy 3000") == "queued");

  // mid asks: low is chosen, and mid waits while low's lock waits for its work.
  mid.send("reserve_retry " + std::to_string(120 * kMiB));
  REQUIRE(wait_until([&] { return d.process(mid.pid())["waiting_for_room"] == true; }));
  // top asks meanwhile: mid waits for room and low is being suspended, so neither is chosen:
  // top is told no at once (it would otherwise take mid, which holds what it lacks).
  const std::string r = top.ask("reserve_retry " + std::to_string(140 * kMiB));
  INFO(slurp(d.log));
  CHECK(r == "rc 2");
  CHECK(d.process(mid.pid())["state"] == "running");
  // mid gets its room once low is suspended.
  CHECK(contains(mid.line(), "ptr 0x"));
  CHECK(d.process(low.pid())["state"] == "suspended");
  CHECK(d.process(mid.pid())["state"] == "running");
  CHECK(top.ask("call") == "rc 0");
}

TEST_CASE("room.no_daemon_no_wait") {
  // Without a daemon the second failure is the program's at once.
  Setup s;
  ScopedEnv env(s.env);
  Victim a(s);
  REQUIRE(contains(a.ask("reserve " + std::to_string(200 * kMiB)), "ptr 0x"));
  Victim b(s);
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(b.ask("reserve_retry " + std::to_string(200 * kMiB)) == "rc 2");
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20));
}

TEST_CASE("room.an_allocation_of_cuwardens_pool_asks_too") {
  Setup s;
  ScopedEnv env(s.env);
  SuspendDaemon d(s, policy(s, "[default]\nmin_run = \"1ms\"\n"));
  Victim low(s, {"CUWARDEN_PRIORITY=-10"});
  REQUIRE(contains(low.ask("alloc " + std::to_string(160 * kMiB)), "ptr 0x"));
  for (const char* pool : {"cache", "vmm"}) {
    INFO(pool);
    Victim high(s, {std::string("CUWARDEN_POOL=") + pool});
    REQUIRE(contains(high.ask("reserve " + std::to_string(kMiB)), "ptr 0x"));
    wait_process(d, low.pid());
    wait_process(d, high.pid());
    // The pool gave back what it kept before its last try: the first failure asks.
    const std::string r = high.ask("reserve " + std::to_string(128 * kMiB));
    INFO(r << "\n" << slurp(d.log));
    REQUIRE(contains(r, "ptr 0x"));
    CHECK(d.process(low.pid())["state"] == "suspended");
    CHECK(d.process(low.pid())["suspended_by"] == "policy");
    high.kill();
    REQUIRE(wait_until([&] { return d.process(low.pid())["state"] == "running"; }));
  }
  low.send("check");
  CHECK(low.line() == "calling");
  CHECK(contains(low.line(), "ok 0x"));
}

TEST_CASE("room.a_resumed_process_runs_min_run_before_it_can_be_chosen_again") {
  Setup s;
  ScopedEnv env(s.env);
  SuspendDaemon d(s, policy(s, "[default]\nmin_run = \"3s\"\nresume_after = \"100ms\"\n"));
  Victim low(s, {"CUWARDEN_PRIORITY=-10"});
  REQUIRE(contains(low.ask("alloc " + std::to_string(160 * kMiB)), "ptr 0x"));
  Victim high(s);
  REQUIRE(contains(high.ask("reserve " + std::to_string(kMiB)), "ptr 0x"));
  wait_process(d, low.pid());
  wait_process(d, high.pid());
  REQUIRE(contains(high.ask("reserve_retry " + std::to_string(128 * kMiB)), "ptr 0x"));
  REQUIRE(high.ask("free_reserved") == "rc 0");
  REQUIRE(wait_until([&] { return d.process(low.pid())["state"] == "running"; }));
  const auto resumed = std::chrono::steady_clock::now();
  // At once: not chosen (it has run less than min_run).
  CHECK(high.ask("reserve_retry " + std::to_string(128 * kMiB)) == "rc 2");
  CHECK(d.process(low.pid())["state"] == "running");
  // Later it is again; never before min_run has passed.
  REQUIRE(wait_until([&] { return contains(high.ask("reserve_retry " + std::to_string(128 * kMiB)), "ptr 0x"); }));
  CHECK(std::chrono::steady_clock::now() - resumed >= std::chrono::seconds(3));
  CHECK(d.process(low.pid())["state"] == "suspended");
}

TEST_CASE("room.a_job_the_policy_never_suspends_is_never_chosen") {
  Setup s;
  ScopedEnv env(s.env);
  SuspendDaemon d(s, policy(s, "[job.keep]\nsuspend = \"never\"\n"));
  Victim kept(s, {"CUWARDEN_PRIORITY=-10", "CUWARDEN_JOB=keep"});
  REQUIRE(contains(kept.ask("reserve " + std::to_string(160 * kMiB)), "ptr 0x"));
  Victim high(s);
  REQUIRE(contains(high.ask("reserve " + std::to_string(kMiB)), "ptr 0x"));
  wait_process(d, kept.pid());
  wait_process(d, high.pid());
  CHECK(high.ask("reserve_retry " + std::to_string(128 * kMiB)) == "rc 2");
  CHECK(contains(slurp(d.log), "1 lower-priority process(es), 0 of them eligible"));
  CHECK(d.process(kept.pid())["state"] == "running");
  // Another job of the same priority is.
  Victim other(s, {"CUWARDEN_PRIORITY=-10", "CUWARDEN_JOB=batch"});
  REQUIRE(contains(other.ask("reserve " + std::to_string(64 * kMiB)), "ptr 0x"));
  wait_process(d, other.pid());
  CHECK(contains(high.ask("reserve_retry " + std::to_string(64 * kMiB)), "ptr 0x"));
  CHECK(d.process(other.pid())["state"] == "suspended");
  CHECK(d.process(kept.pid())["state"] == "running");
}

TEST_CASE("room.past_max_suspended_it_is_reported_and_resumed_once_memory_allows") {
  Setup s;
  ScopedEnv env(s.env);
  SuspendDaemon d(s, policy(s, "[job.short]\nmax_suspended = \"1s\"\n[default]\nresume_after = \"1h\"\n"));
  Victim low(s, {"CUWARDEN_PRIORITY=-10", "CUWARDEN_JOB=short"});
  REQUIRE(contains(low.ask("alloc " + std::to_string(160 * kMiB)), "ptr 0x"));
  Victim high(s);
  REQUIRE(contains(high.ask("reserve " + std::to_string(kMiB)), "ptr 0x"));
  wait_process(d, low.pid());
  wait_process(d, high.pid());
  REQUIRE(contains(high.ask("reserve_retry " + std::to_string(128 * kMiB)), "ptr 0x"));
  REQUIRE(d.process(low.pid())["state"] == "suspended");
  // Past its 1 s with the room still taken: reported, and it stays suspended.
  REQUIRE(wait_until([&] { return d.process(low.pid())["suspended_overdue"] == true; }));
  CHECK(contains(slurp(d.log), "past its max_suspended"));
  const auto kinds = event_kinds(d, low.pid());
  CHECK(std::count(kinds.begin(), kinds.end(), "suspend_overdue") == 1);
  CHECK(d.process(low.pid())["state"] == "suspended");
  // Once the room is back it resumes at once (resume_after, an hour here, is not waited for).
  REQUIRE(high.ask("free_reserved") == "rc 0");
  REQUIRE(wait_until([&] { return d.process(low.pid())["state"] == "running"; }));
  CHECK(d.process(low.pid())["suspended_overdue"].is_null());
  low.send("check");
  CHECK(low.line() == "calling");
  CHECK(contains(low.line(), "ok 0x"));
}

TEST_CASE("room.every_allocation_call_asks") {
  // Pitched, managed and cuMem allocations and the program's own pool's, each refused by the
  // full device: the second failure asks, a lower-priority process is suspended, the retry
  // succeeds.
  Setup s;
  ScopedEnv env(s.env);
  SuspendDaemon d(s, policy(s, "[default]\nmin_run = \"1ms\"\nresume_after = \"100ms\"\n"));
  Victim low(s, {"CUWARDEN_PRIORITY=-10"});
  REQUIRE(contains(low.ask("alloc " + std::to_string(160 * kMiB)), "ptr 0x"));
  wait_process(d, low.pid());
  for (const char* kind : {"pitch", "managed", "vmm", "pool"}) {
    INFO(kind);
    Victim high(s);
    REQUIRE(contains(high.ask("reserve " + std::to_string(kMiB)), "ptr 0x"));
    wait_process(d, high.pid());
    REQUIRE(d.process(low.pid())["state"] == "running");
    // 160 MiB of 256 held: 128 MiB cannot be had without the lower one's.
    const std::string r = high.ask(std::string("retry_as ") + kind + " " + std::to_string(128 * kMiB));
    INFO(r << "\n" << slurp(d.log) << high.err());
    CHECK(r == "ok");  // each kind said on its own
    if (r != "ok") continue;
    CHECK(d.process(low.pid())["state"] == "suspended");
    CHECK(d.process(low.pid())["suspended_by"] == "policy");
    REQUIRE(high.ask("free_kept") == "rc 0");
    REQUIRE(wait_until([&] { return d.process(low.pid())["state"] == "running"; }));
  }
  low.send("check");
  CHECK(low.line() == "calling");
  CHECK(contains(low.line(), "ok 0x"));
}

TEST_CASE("room.a_lower_process_is_held_back_while_a_higher_one_waits_to_resume") {
  Setup s;
  ScopedEnv env(s.env);
  SuspendDaemon d(s, policy(s, "[default]\nresume_after = \"5s\"\n"));
  Victim low(s, {"CUWARDEN_PRIORITY=-10"});
  REQUIRE(contains(low.ask("alloc " + std::to_string(160 * kMiB)), "ptr 0x"));
  // Lower still, too small to make the room: never chosen, so it keeps running.
  Victim lowest(s, {"CUWARDEN_PRIORITY=-20"});
  REQUIRE(contains(lowest.ask("reserve " + std::to_string(kMiB)), "ptr 0x"));
  Victim high(s);
  REQUIRE(contains(high.ask("reserve " + std::to_string(kMiB)), "ptr 0x"));
  wait_process(d, low.pid());
  wait_process(d, lowest.pid());
  wait_process(d, high.pid());
  REQUIRE(contains(high.ask("reserve_retry " + std::to_string(128 * kMiB)), "ptr 0x"));
  REQUIRE(d.process(low.pid())["state"] == "suspended");
  REQUIRE(d.process(lowest.pid())["state"] == "running");

  // About 126 MiB free, which the driver would give: held back for the suspended one.
  INFO(slurp(d.log));
  CHECK(lowest.ask("reserve " + std::to_string(64 * kMiB)) == "rc 2");
  // The higher one frees: low waits its resume_after with the memory free, and the lower
  // one still cannot take it.
  REQUIRE(high.ask("free_reserved") == "rc 0");
  CHECK(lowest.ask("reserve " + std::to_string(128 * kMiB)) == "rc 2");
  CHECK(d.process(low.pid())["state"] == "suspended");
  CHECK(contains(lowest.err(), "held back by the daemon"));
  CHECK(contains(slurp(d.log), "room: pid " + std::to_string(lowest.pid()) + " (priority -20) held back on device 0"));
  // The higher one is not held back.
  CHECK(contains(high.ask("reserve " + std::to_string(kMiB)), "ptr 0x"));

  // Once low is resumed, the lower one allocates again.
  REQUIRE(wait_until([&] { return d.process(low.pid())["state"] == "running"; }));
  CHECK(contains(lowest.ask("reserve " + std::to_string(64 * kMiB)), "ptr 0x"));
  low.send("check");
  CHECK(low.line() == "calling");
  CHECK(contains(low.line(), "ok 0x"));
  const auto kinds = event_kinds(d, lowest.pid());
  CHECK(std::count(kinds.begin(), kinds.end(), "refuse") == 2);
}

namespace {

/// What the on_overdue = "end_claim" cases share: a daemon whose policy ends the claim of the
/// process one of job "short" was suspended for once that one is past `max_suspended`, and
/// resumes it otherwise only after an hour (resume_after); `low` of that job (priority -10)
/// holds 160 MiB of device 0's 256 and `high` (priority 0) 1 MiB, both seen by the daemon.
/// `devices`: the simulated GPUs (256 MiB each); `more`: policy lines for [default].
struct EndClaim {
  Setup s;
  ScopedEnv env{s.env};
  std::unique_ptr<SuspendDaemon> d;
  Victim low{s, {"CUWARDEN_PRIORITY=-10", "CUWARDEN_JOB=short"}};
  Victim high{s};

  explicit EndClaim(const std::string& max_suspended, int devices = 1, const std::string& more = "")
      : s("256M", devices) {
    d = std::make_unique<SuspendDaemon>(s, policy(s, "[job.short]\nmax_suspended = \"" + max_suspended +
                                                         "\"\non_overdue = \"end_claim\"\n"
                                                         "[default]\nresume_after = \"1h\"\n" + more));
    REQUIRE(contains(low.ask("alloc " + std::to_string(160 * kMiB)), "ptr 0x"));
    REQUIRE(contains(high.ask("reserve " + std::to_string(kMiB)), "ptr 0x"));
    wait_process(*d, low.pid());
    wait_process(*d, high.pid());
  }
  /// high asks for 128 MiB on device 0, which only low's suspension makes room for.
  void suspend_low_for_high() {
    const std::string r = high.ask("reserve_retry " + std::to_string(128 * kMiB));
    INFO(r << "\n" << slurp(d->log));
    REQUIRE(contains(r, "ptr 0x"));
    REQUIRE(d->process(low.pid())["state"] == "suspended");
  }
  /// Once low is past max_suspended: whether the daemon has held high back for it.
  bool high_held_back() const {
    return contains(slurp(d->log), "room: pid " + std::to_string(high.pid()) + " (priority 0) held back");
  }
  /// low reads its data back, intact.
  void low_intact() {
    low.send("check");
    CHECK(low.line() == "calling");
    CHECK(contains(low.line(), "ok 0x"));
  }
};

}  // namespace

TEST_CASE("room.past_max_suspended_the_claim_ends_where_the_policy_says_so") {
  EndClaim c("1s");
  c.suspend_low_for_high();
  // Before the limit the higher one may still grow (about 126 MiB are free).
  CHECK(contains(c.high.ask("reserve " + std::to_string(kMiB)), "ptr 0x"));
  // Past its 1 s: the claim of the one it was suspended for ends. That one is held back.
  REQUIRE(wait_until([&] { return c.d->process(c.low.pid())["suspended_overdue"] == true; }));
  INFO(slurp(c.d->log));
  REQUIRE(wait_until([&] { return c.high_held_back(); }));
  CHECK(contains(slurp(c.d->log), "loses its claim"));
  CHECK(c.high.ask("reserve " + std::to_string(kMiB)) == "rc 2");
  // Once it frees, the overdue one resumes at once (resume_after, an hour here, is not waited
  // for), and the higher one allocates again.
  REQUIRE(c.high.ask("free_reserved") == "rc 0");
  REQUIRE(wait_until([&] { return c.d->process(c.low.pid())["state"] == "running"; }));
  CHECK(contains(c.high.ask("reserve " + std::to_string(kMiB)), "ptr 0x"));
  c.low_intact();
}

TEST_CASE("room.after_its_claim_ended_a_process_is_told_no_until_the_overdue_one_resumes") {
  // Two GPUs: high is held back on device 0, where low waits to be resumed; on device 1,
  // where a process it could otherwise have suspended holds what it lacks, it asks for room.
  EndClaim c("1s", 2, "room_wait = \"100s\"\n");
  Victim other(c.s, {"CUWARDEN_PRIORITY=-10"});
  REQUIRE(other.ask("device 1") == "rc 0");
  REQUIRE(contains(other.ask("alloc " + std::to_string(160 * kMiB)), "ptr 0x"));
  wait_process(*c.d, other.pid());
  c.suspend_low_for_high();
  REQUIRE(wait_until([&] { return c.high_held_back(); }));
  REQUIRE(c.high.ask("device 1") == "rc 0");

  // Told no at once: the allocation fails well before the policy's 100 s wait.
  const auto t0 = std::chrono::steady_clock::now();
  const std::string r = c.high.ask("reserve_retry " + std::to_string(128 * kMiB));
  const auto took = std::chrono::steady_clock::now() - t0;
  INFO(slurp(c.d->log) << c.high.err());
  CHECK(r == "rc 2");
  CHECK(took < std::chrono::seconds(50));
  CHECK(contains(slurp(c.d->log), "room: pid " + std::to_string(c.high.pid()) + " asked for 128.00 MiB on device 1: "
                                  "no: its claim ended: pid " + std::to_string(c.low.pid())));
  CHECK(c.d->process(other.pid())["state"] == "running");

  // The claim is over once low is resumed: the same request is served as any other.
  REQUIRE(c.high.ask("device 0") == "rc 0");
  REQUIRE(c.high.ask("free_reserved") == "rc 0");
  REQUIRE(wait_until([&] { return c.d->process(c.low.pid())["state"] == "running"; }));
  REQUIRE(c.high.ask("device 1") == "rc 0");
  CHECK(contains(c.high.ask("reserve_retry " + std::to_string(128 * kMiB)), "ptr 0x"));
  CHECK(c.d->process(other.pid())["state"] == "suspended");
  CHECK(c.d->process(other.pid())["suspended_by"] == "policy");
  c.low_intact();
}

TEST_CASE("room.a_claimant_that_exited_has_no_claim_to_end") {
  EndClaim c("1s");
  // 90 MiB more held: once high is gone, low's 160 MiB and margin still do not fit.
  Victim other(c.s);
  REQUIRE(contains(other.ask("reserve " + std::to_string(90 * kMiB)), "ptr 0x"));
  wait_process(*c.d, other.pid());
  // high exits while low is being suspended for it (low's lock waits 3 s for its queued
  // work): low is suspended for a process already gone, well before its max_suspended.
  REQUIRE(c.low.ask("busy 3000") == "queued");
  const uint32_t gone = c.high.pid();
  c.high.send("reserve_retry " + std::to_string(128 * kMiB));
  REQUIRE(wait_until([&] { return c.d->process(gone)["waiting_for_room"] == true; }));
  c.high.kill();
  REQUIRE(wait_until([&] { return c.d->process(c.low.pid())["suspended_overdue"] == true; }));
  const std::string log = slurp(c.d->log);
  INFO(log);
  CHECK(contains(log, "pid " + std::to_string(gone) + " exited"));
  CHECK(contains(log, "past its max_suspended"));
  CHECK(!contains(log, "loses its claim"));
  CHECK(!contains(log, ") held back on"));
  CHECK(c.d->process(c.low.pid())["state"] == "suspended");
  // What frees goes to no one in particular: low resumes once it fits.
  REQUIRE(other.ask("free_reserved") == "rc 0");
  REQUIRE(wait_until([&] { return c.d->process(c.low.pid())["state"] == "running"; }));
  c.low_intact();
}

TEST_CASE("room.a_daemon_restarted_since_the_suspension_ends_no_claim") {
  EndClaim c("2s");
  c.suspend_low_for_high();
  const std::size_t before = slurp(c.d->log).size();
  c.d.reset();
  c.d = std::make_unique<SuspendDaemon>(c.s, std::vector<std::string>{"--config", c.s / "policy.toml"});
  // Found again as suspended by policy, it goes overdue under the new daemon, which never
  // linked it to high: no claim ends.
  json p = wait_process(*c.d, c.low.pid());
  CHECK(p["state"] == "suspended");
  CHECK(p["suspended_by"] == "policy");
  REQUIRE(wait_until([&] { return c.d->process(c.low.pid())["suspended_overdue"] == true; }));
  const std::string log = slurp(c.d->log).substr(before);
  INFO(log);
  CHECK(contains(log, "recorded before this start"));
  CHECK(contains(log, "past its max_suspended"));
  CHECK(!contains(log, "loses its claim"));
  // The new daemon resumes it by itself once high frees.
  REQUIRE(c.high.ask("free_reserved") == "rc 0");
  REQUIRE(wait_until([&] { return c.d->process(c.low.pid())["state"] == "running"; }));
  c.low_intact();
}

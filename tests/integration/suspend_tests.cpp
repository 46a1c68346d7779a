// cuwarden integration tests: `cuwarden suspend` and `cuwarden resume` by hand on the
// simulated driver (suspend_test_support.hpp).
#include "suspend_test_support.hpp"

using namespace cuwt;

TEST_CASE("suspend.by_hand") {
  Setup s;
  ScopedEnv env(s.env);
  SuspendDaemon d(s);
  Victim v(s);
  REQUIRE(contains(v.ask("alloc 67108864"), "ptr 0x"));
  wait_process(d, v.pid());
  REQUIRE(wait_until([&] { return driver_used(d) >= 64 * kMiB; }));
  const uint64_t used_before = driver_used(d);

  const CmdResult r = cli(s, {"suspend", std::to_string(v.pid())});
  INFO(r.out << r.err << slurp(d.log));
  REQUIRE(r.status == 0);
  CHECK(contains(r.out, "suspended, 64.00 MiB"));
  json p = d.process(v.pid());
  CHECK(p["state"] == "suspended");
  CHECK(p["suspended_host_bytes"].get<uint64_t>() >= 64 * kMiB);
  CHECK(p["suspended_since_ns"].get<uint64_t>() > 0);
  CHECK(p["devices"][0]["used_bytes"] == 0);
  // The GPU's used memory falls by what the process held (NVML, the shared simulated device).
  REQUIRE(wait_until([&] { return driver_used(d) <= used_before - 64 * kMiB; }));
  // The table says so.
  const CmdResult t = cli(s, {});
  INFO(t.out);
  CHECK(contains(t.out, "suspended 64MiB host"));
  // nvidia-smi's query lists it too: nothing on the device, its state and host bytes beside.
  const CmdResult q = cli(s, {"--query-compute-apps=pid,used_memory,state,suspended_host_memory,suspended_since",
                              "--format=csv,noheader,nounits"});
  INFO(q.out << q.err);
  CHECK(q.status == 0);
  CHECK(contains(q.out, std::to_string(v.pid()) + ", 0, suspended, 64, 20"));

  // Its calls stop: one waits at the closed gate until the resume.
  v.send("check");
  REQUIRE(v.line() == "calling");
  REQUIRE(wait_until([&] { return v.blocked_calls(s) == 1; }));

  const CmdResult back = cli(s, {"resume", std::to_string(v.pid())});
  INFO(back.out << back.err);
  REQUIRE(back.status == 0);
  CHECK(contains(back.out, "resumed"));
  // The call goes on and finds its data intact; the process says it was suspended.
  CHECK(contains(v.line(), "ok 0x"));
  CHECK(contains(v.err(), "cuwarden: suspended "));
  CHECK(contains(v.err(), " s by root; resumed"));
  p = d.process(v.pid());
  CHECK(p["state"] == "running");
  CHECK(p["suspended_host_bytes"].is_null());
  CHECK(p["devices"][0]["used_bytes"].get<uint64_t>() == 64 * kMiB);
  const CmdResult q2 = cli(s, {"--query-compute-apps=pid,used_memory,state,suspended_host_memory,suspended_since",
                               "--format=csv,noheader,nounits"});
  CHECK(contains(q2.out, std::to_string(v.pid()) + ", 64, running, [N/A], [N/A]"));
  REQUIRE(wait_until([&] { return driver_used(d) >= used_before; }));
  const auto kinds = event_kinds(d, v.pid());
  CHECK(std::count(kinds.begin(), kinds.end(), "suspend") == 1);
  CHECK(std::count(kinds.begin(), kinds.end(), "resume") == 1);
  // Nothing is left recorded once it runs again.
  CHECK(std::filesystem::is_empty(s.state + "/suspended"));
}

TEST_CASE("suspend.refuses_what_the_driver_cannot_carry") {
  Setup s;
  ScopedEnv env(s.env);
  SuspendDaemon d(s);
  Victim managed(s);
  REQUIRE(managed.ask("managed 1048576") == "rc 0");
  Victim ipc(s);
  REQUIRE(contains(ipc.ask("alloc 1048576"), "ptr 0x"));
  REQUIRE(ipc.ask("ipc") == "rc 0");
  Victim shared(s);
  REQUIRE(contains(shared.ask("alloc 1048576"), "ptr 0x"));
  REQUIRE(shared.ask("vmm_export") == "rc 0");
  // Another process's cuMem handle imported, with nothing made exportable here.
  Victim imported(s);
  REQUIRE(contains(imported.ask("alloc 1048576"), "ptr 0x"));
  REQUIRE(imported.ask("vmm_import") == "rc 0");
  // An MPS client: its contexts live in the MPS server.
  Victim mps(s, {"CUWARDEN_FAKE_MPS=1"});
  REQUIRE(contains(mps.ask("alloc 1048576"), "ptr 0x"));
  wait_process(d, managed.pid());
  wait_process(d, ipc.pid());
  wait_process(d, shared.pid());
  wait_process(d, imported.pid());
  wait_process(d, mps.pid());

  const CmdResult m = cli(s, {"suspend", std::to_string(managed.pid())});
  CHECK(m.status == 3);
  CHECK(contains(m.err, "managed-memory"));
  const CmdResult i = cli(s, {"suspend", std::to_string(ipc.pid())});
  CHECK(i.status == 3);
  CHECK(contains(i.err, "CUDA IPC"));
  const CmdResult e = cli(s, {"suspend", std::to_string(shared.pid())});
  CHECK(e.status == 3);
  CHECK(contains(e.err, "shareable handles"));
  const CmdResult im = cli(s, {"suspend", std::to_string(imported.pid())});
  INFO(im.out << im.err);
  CHECK(im.status == 3);
  CHECK(contains(im.err, "imported"));
  const CmdResult mp = cli(s, {"suspend", std::to_string(mps.pid())});
  INFO(mp.out << mp.err);
  CHECK(mp.status == 3);
  CHECK(contains(mp.err, "MPS client"));
  // Refused before any lock: all run on, not FAILED.
  CHECK(managed.ask("call") == "rc 0");
  CHECK(ipc.ask("call") == "rc 0");
  CHECK(shared.ask("call") == "rc 0");
  CHECK(imported.ask("call") == "rc 0");
  CHECK(mps.ask("call") == "rc 0");
  CHECK(d.process(managed.pid())["state"] == "running");
}

TEST_CASE("suspend.refuses_a_process_it_does_not_manage") {
  Setup s;
  ScopedEnv env(s.env);
  SuspendDaemon d(s);
  Victim v(s, {}, /*preload=*/false);
  REQUIRE(contains(v.ask("alloc 1048576"), "ptr 0x"));
  const CmdResult r = cli(s, {"suspend", std::to_string(v.pid())});
  CHECK(r.status == 3);
  CHECK(contains(r.err, "under cuwarden"));
  CHECK(v.ask("call") == "rc 0");
}

TEST_CASE("suspend.refuses_without_room_on_the_host") {
  // A device larger than any test machine's memory (the simulated device's pages are never
  // touched): 3 TiB on it cannot go to the node's MemAvailable.
  Setup s("4T");
  ScopedEnv env(s.env);
  SuspendDaemon d(s);
  Victim v(s);
  REQUIRE(contains(v.ask("reserve " + std::to_string(3 * 1024 * kGiB)), "ptr 0x"));
  wait_process(d, v.pid());
  const CmdResult r = cli(s, {"suspend", std::to_string(v.pid())});
  INFO(r.err);
  CHECK(r.status == 3);
  CHECK(contains(r.err, "MemAvailable"));
  CHECK(v.ask("call") == "rc 0");
  CHECK(d.process(v.pid())["state"] == "running");
}

TEST_CASE("suspend.refuses_what_its_memory_cgroup_cannot_hold") {
  if (geteuid() != 0) {
    SUCCEED("SKIPPED: needs root (a memory cgroup of its own)");
    return;
  }
  // A child of this process's memory cgroup (v1 or v2), limited to 32 MiB.
  std::ifstream f("/proc/self/cgroup");
  std::string line, dir;
  while (std::getline(f, line)) {
    if (line.rfind("0::", 0) == 0 && std::filesystem::exists("/sys/fs/cgroup" + line.substr(3) + "/memory.max"))
      dir = "/sys/fs/cgroup" + line.substr(3);
    else if (line.find(":memory:") != std::string::npos)
      dir = "/sys/fs/cgroup/memory" + line.substr(line.find(":memory:") + 8);
  }
  const std::string cg = dir + "/cuwt-suspend-" + std::to_string(getpid());
  if (dir.empty() || ::mkdir(cg.c_str(), 0755) != 0) {
    SUCCEED("SKIPPED: no memory cgroup can be made here");
    return;
  }
  struct Remove {
    std::string p;
    ~Remove() { ::rmdir(p.c_str()); }
  } remove{cg};
  const bool v2 = std::filesystem::exists(cg + "/memory.max");
  std::ofstream(cg + (v2 ? "/memory.max" : "/memory.limit_in_bytes")) << (32 * kMiB);
  Setup s;
  ScopedEnv env(s.env);
  SuspendDaemon d(s);
  Victim v(s);
  std::ofstream(cg + "/cgroup.procs") << v.pid();
  REQUIRE(contains(v.ask("reserve " + std::to_string(128 * kMiB)), "ptr 0x"));
  wait_process(d, v.pid());
  const CmdResult r = cli(s, {"suspend", std::to_string(v.pid())});
  INFO(r.err);
  CHECK(r.status == 3);
  CHECK(contains(r.err, "memory cgroup"));
  CHECK(v.ask("call") == "rc 0");
  v.kill();  // out of the cgroup before it is removed
}

TEST_CASE("suspend.resume_refused_without_room") {
  Setup s;
  ScopedEnv env(s.env);
  SuspendDaemon d(s);
  Victim a(s);
  holds(d, a, 100 * kMiB);
  REQUIRE(cli(s, {"suspend", std::to_string(a.pid())}).status == 0);
  // Another process takes the room it left.
  Victim b(s, {}, /*preload=*/false);
  REQUIRE(contains(b.ask("reserve " + std::to_string(200 * kMiB)), "ptr 0x"));
  REQUIRE(wait_until([&] { return driver_used(d) >= 200 * kMiB; }));
  const CmdResult r = cli(s, {"resume", std::to_string(a.pid())});
  INFO(r.err);
  CHECK(r.status == 3);
  CHECK(contains(r.err, "free"));
  CHECK(contains(r.err, "100.00 MiB"));
  CHECK(d.process(a.pid())["state"] == "suspended");
  // Once the room is back, it resumes with its data.
  b.kill();
  REQUIRE(wait_until([&] { return driver_used(d) < 100 * kMiB; }));
  const CmdResult ok = cli(s, {"resume", std::to_string(a.pid())});
  INFO(ok.err);
  CHECK(ok.status == 0);
  a.send("check");
  CHECK(a.line() == "calling");
  CHECK(contains(a.line(), "ok 0x"));
}

TEST_CASE("suspend.a_job_as_a_whole") {
  Setup s;
  ScopedEnv env(s.env);
  SuspendDaemon d(s);
  Victim a(s, {"CUWARDEN_JOB=train"});
  Victim b(s, {"CUWARDEN_JOB=train"});
  holds(d, a, 32 * kMiB);
  holds(d, b, 16 * kMiB);
  const CmdResult r = cli(s, {"suspend", "job:train"});
  INFO(r.out << r.err << slurp(d.log));
  REQUIRE(r.status == 0);
  CHECK(contains(r.out, "job train: suspended"));
  CHECK(d.process(a.pid())["state"] == "suspended");
  CHECK(d.process(b.pid())["state"] == "suspended");
  REQUIRE(cli(s, {"resume", "job:train"}).status == 0);
  CHECK(d.process(a.pid())["state"] == "running");
  CHECK(d.process(b.pid())["state"] == "running");
  a.send("check");
  CHECK(a.line() == "calling");
  CHECK(contains(a.line(), "ok 0x"));
}

TEST_CASE("suspend.a_job_whose_lock_fails_is_not_suspended") {
  Setup s;
  ScopedEnv env(s.env);
  SuspendDaemon d(s);
  Victim a(s, {"CUWARDEN_JOB=etl"});
  holds(d, a, 8 * kMiB);
  Victim b(s, {"CUWARDEN_JOB=etl"});
  holds(d, b, 8 * kMiB);
  // b's stream is busy far longer than the lock may wait.
  REQUIRE(b.ask("busy 20000") == "queued");
  const CmdResult r = cli(s, {"suspend", "job:etl", "--timeout", "300ms"});
  INFO(r.out << r.err << slurp(d.log));
  CHECK(r.status == 1);
  CHECK(contains(r.err, "was not suspended"));
  // Both run: a was locked first, then unlocked when b's lock failed.
  CHECK(a.ask("call") == "rc 0");
  CHECK(b.ask("call") == "rc 0");
  CHECK(d.process(a.pid())["state"] == "running");
  CHECK(d.process(b.pid())["state"] == "running");
}

TEST_CASE("suspend.found_again_after_a_daemon_restart") {
  Setup s;
  ScopedEnv env(s.env);
  auto d = std::make_unique<SuspendDaemon>(s);
  Victim v(s);
  holds(*d, v, 16 * kMiB);
  REQUIRE(cli(s, {"suspend", std::to_string(v.pid())}).status == 0);
  const uint64_t since = d->process(v.pid())["suspended_since_ns"].get<uint64_t>();
  d.reset();
  d = std::make_unique<SuspendDaemon>(s);
  json p = wait_process(*d, v.pid());
  CHECK(p["state"] == "suspended");
  CHECK(p["suspended_since_ns"] == since);
  const CmdResult r = cli(s, {"resume", std::to_string(v.pid())});
  INFO(r.err);
  CHECK(r.status == 0);
  v.send("check");
  CHECK(v.line() == "calling");
  CHECK(contains(v.line(), "ok 0x"));
}

TEST_CASE("suspend.a_process_killed_while_suspended_is_forgotten") {
  Setup s;
  ScopedEnv env(s.env);
  SuspendDaemon d(s);
  Victim v(s);
  holds(d, v, 16 * kMiB);
  REQUIRE(cli(s, {"suspend", std::to_string(v.pid())}).status == 0);
  REQUIRE(!std::filesystem::is_empty(s.state + "/suspended"));
  const uint32_t pid = v.pid();
  v.kill();
  REQUIRE(wait_until([&] {
    const json p = d.process(pid);
    return p.is_null() || p["state"] == "exited";
  }));
  REQUIRE(wait_until([&] { return std::filesystem::is_empty(s.state + "/suspended"); }));
  CHECK(contains(slurp(d.log), "exited while suspended"));
}

TEST_CASE("suspend.only_the_owner_or_root", "[root]") {
  if (geteuid() != 0) {
    SUCCEED("SKIPPED: needs root (a second and third user)");
    return;
  }
  const TwoUsers users;
  const passwd& victim_user = users.victim;
  const uid_t att_uid = users.attacker_uid, att_gid = users.attacker_gid;
  Setup s;
  ScopedEnv env(s.env);
  SuspendDaemon d(s);
  Victim v(s, {}, true, &victim_user);
  holds(d, v, 8 * kMiB);
  auto as = [&](uid_t uid, gid_t gid, const std::string& cmd) {
    return run_cmd({"/usr/bin/setpriv", "--reuid=" + std::to_string(uid), "--regid=" + std::to_string(gid),
                    "--clear-groups", CUWT_CLI, cmd, std::to_string(v.pid()), "--socket", s / "d.sock"},
                   {}, 60000);
  };
  const CmdResult other = as(att_uid, att_gid, "suspend");
  INFO(other.err);
  CHECK(other.status == 3);
  CHECK(contains(other.err, "only root or its owner"));
  CHECK(d.process(v.pid())["state"] == "running");
  const CmdResult own = as(victim_user.pw_uid, victim_user.pw_gid, "suspend");
  INFO(own.err << slurp(d.log));
  CHECK(own.status == 0);
  CHECK(as(att_uid, att_gid, "resume").status == 3);
  CHECK(as(victim_user.pw_uid, victim_user.pw_gid, "resume").status == 0);
  v.send("check");
  CHECK(v.line() == "calling");
  CHECK(contains(v.line(), "ok 0x"));
  CHECK(contains(v.err(), "by cuwarden-test-victim; resumed"));
}

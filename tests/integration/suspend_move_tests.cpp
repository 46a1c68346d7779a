// cuwarden integration tests: `cuwarden resume PID|job:NAME --gpu N`, a restore onto another
// GPU, on the simulated driver with several devices sharing one CUWARDEN_FAKE_DIR
// (suspend_test_support.hpp); and the simulated driver's own checks of a restore's GPU pairs.
#include <netinet/in.h>
#include <sys/socket.h>

#include "suspend_test_support.hpp"

using namespace cuwt;

namespace {

/// A setup with `devices` simulated GPUs of `memory` each; `names` (CUWARDEN_FAKE_NAMES) may
/// make some another chip.
Setup multi_gpu(int devices, const std::string& memory = "256M", const std::string& names = "") {
  Setup s(memory);
  for (std::string& e : s.env)
    if (e.rfind("CUWARDEN_FAKE_DEVICES=", 0) == 0) e = "CUWARDEN_FAKE_DEVICES=" + std::to_string(devices);
  if (!names.empty()) s.env.push_back("CUWARDEN_FAKE_NAMES=" + names);
  return s;
}

/// The simulated driver's UUID of physical device `i` (fakecuda.h: its default UUIDs).
std::string uuid_of(int i) { return "GPU-c0dafa7e-5a1e-4000-8000-0000000000" + std::string(i < 10 ? "0" : "") + std::to_string(i); }

/// What NVML says GPU `uuid` has in use (the shared simulated device: every process's bytes).
uint64_t gpu_used(const Daemon& d, const std::string& uuid) {
  const json st = d.state();
  for (const auto& g : st["gpus"])
    if (g["uuid"] == uuid && g.contains("driver_used_bytes")) return g["driver_used_bytes"].get<uint64_t>();
  return ~0ULL;
}

/// The job `name`'s bytes per GPU UUID (cuwarden --json's jobs[].gpus[].used_bytes).
std::map<std::string, uint64_t> job_used(const Daemon& d, const std::string& name) {
  std::map<std::string, uint64_t> out;
  const json st = d.state();
  for (const auto& j : st["jobs"])
    if (j["name"] == name)
      for (const auto& g : j["gpus"]) out[g["uuid"].get<std::string>()] = g["used_bytes"].get<uint64_t>();
  return out;
}

/// `ckpt_victim move PID PAIRS`: another controller asks the simulated driver for a restore
/// with these GPU pairs ("OLD=NEW,..."); its CUresult.
int driver_move(const Setup& s, uint32_t pid, const std::string& pairs) {
  const CmdResult r = run_cmd({CUWT_CKPT_VICTIM, "move", std::to_string(pid), pairs}, s.env, 30000);
  INFO(r.out << r.err);
  REQUIRE(r.out.rfind("rc ", 0) == 0);
  return std::stoi(r.out.substr(3));
}

/// The simulated driver's state of `pid` (CUprocessState: the channel file's `state` word,
/// at byte 32; tests/fakecuda/src/checkpoint.hpp), or -1.
int channel_state(const Setup& s, uint32_t pid) {
  const int fd = ::open((s.fake + "/proc-" + std::to_string(pid)).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  uint32_t v = 0;
  const bool ok = ::pread(fd, &v, sizeof v, 32) == sizeof v;
  ::close(fd);
  return ok ? static_cast<int>(v) : -1;
}

/// The `cuwarden_process_memory_used_bytes` line of `pid` in /metrics ("" if none).
std::string used_metric(int port, uint32_t pid) {
  const std::string text = http_body(port, "/metrics");
  std::size_t at = 0;
  for (std::size_t end; (end = text.find('\n', at)) != std::string::npos; at = end + 1) {
    const std::string line = text.substr(at, end - at);
    if (line.rfind("cuwarden_process_memory_used_bytes{", 0) == 0 && contains(line, "pid=\"" + std::to_string(pid) + "\""))
      return line;
  }
  return "";
}

}  // namespace

TEST_CASE("suspend.move.onto_another_gpu") {
  Setup s = multi_gpu(2);
  ScopedEnv env(s.env);
  auto d = std::make_unique<SuspendDaemon>(s, std::vector<std::string>{"--http", "127.0.0.1:0"});
  int port = 0;
  REQUIRE(wait_until([&] {
    const std::string log = slurp(d->log);
    const std::size_t at = log.find("(port ");
    if (at != std::string::npos) port = std::atoi(log.c_str() + at + 6);
    return port > 0;
  }));
  Victim v(s);
  REQUIRE(v.ask("uuid 0") == uuid_of(0));
  holds(*d, v, 64 * kMiB);
  REQUIRE(wait_until([&] { return gpu_used(*d, uuid_of(0)) >= 64 * kMiB; }));
  const uint64_t used0 = gpu_used(*d, uuid_of(0)), used1 = gpu_used(*d, uuid_of(1));

  REQUIRE(cli(s, {"suspend", std::to_string(v.pid())}).status == 0);
  v.send("check");
  REQUIRE(v.line() == "calling");
  REQUIRE(wait_until([&] { return v.blocked_calls(s) == 1; }));

  const CmdResult r = cli(s, {"resume", std::to_string(v.pid()), "--gpu", "1"});
  INFO(r.out << r.err << slurp(d->log));
  REQUIRE(r.status == 0);
  CHECK(contains(r.out, "resumed onto GPU 1 (" + uuid_of(1) + ") from GPU 0 (" + uuid_of(0) + ")"));
  CHECK(contains(slurp(d->log), "resumed onto GPU 1 (" + uuid_of(1) + ") from GPU 0 (" + uuid_of(0) + ")"));
  // It runs on, its data intact at the same addresses, and its call comes back.
  CHECK(contains(v.line(), "ok 0x"));
  CHECK(contains(v.err(), " s by root; resumed"));
  // Its bytes left GPU 0 for GPU 1.
  REQUIRE(wait_until([&] { return gpu_used(*d, uuid_of(1)) >= used1 + 64 * kMiB; }));
  CHECK(gpu_used(*d, uuid_of(0)) <= used0 - 64 * kMiB);
  // The daemon shows it on GPU 1's UUID, running, with its bytes.
  json p = d->process(v.pid());
  CHECK(p["state"] == "running");
  REQUIRE(p["devices"].size() == 1);
  CHECK(p["devices"][0]["uuid"] == uuid_of(1));
  CHECK(p["devices"][0]["used_bytes"].get<uint64_t>() == 64 * kMiB);
  // /metrics too: its series carry GPU 1's index and UUID.
  const std::string metric = used_metric(port, v.pid());
  INFO(metric);
  CHECK(contains(metric, "gpu=\"1\",uuid=\"" + uuid_of(1) + "\""));
  CHECK(contains(metric, "} 67108864"));
  // The driver answers the new UUID for its old ordinal.
  CHECK(v.ask("uuid 0") == uuid_of(1));
  // Its next allocation rewrites the ring: a daemon started afresh (no record of the move)
  // reads GPU 1's UUID from the ring itself.
  REQUIRE(contains(v.ask("reserve " + std::to_string(8 * kMiB)), "ptr 0x"));
  d.reset();
  d = std::make_unique<SuspendDaemon>(s);
  p = wait_process(*d, v.pid());
  CHECK(p["devices"][0]["uuid"] == uuid_of(1));
  CHECK(p["devices"][0]["used_bytes"].get<uint64_t>() == 72 * kMiB);
  // It can be suspended and resumed again where it is now.
  REQUIRE(cli(s, {"suspend", std::to_string(v.pid())}).status == 0);
  REQUIRE(wait_until([&] { return gpu_used(*d, uuid_of(1)) <= used1; }));
  const CmdResult back = cli(s, {"resume", std::to_string(v.pid())});
  INFO(back.err);
  CHECK(back.status == 0);
  CHECK(wait_until([&] { return gpu_used(*d, uuid_of(1)) >= used1 + 72 * kMiB; }));
  v.send("check");
  CHECK(v.line() == "calling");
  CHECK(contains(v.line(), "ok 0x"));
}

TEST_CASE("suspend.move.the_job_share_moves_and_its_cap_holds") {
  Setup s = multi_gpu(2);
  ScopedEnv env(s.env);
  SuspendDaemon d(s);
  // One job with a cap of 100 MiB per GPU: a holds 40 MiB on GPU 0, b 30 MiB on GPU 1.
  Victim a(s, {"CUWARDEN_JOB=train", "CUWARDEN_JOB_LIMIT=100M"});
  Victim b(s, {"CUWARDEN_JOB=train", "CUWARDEN_JOB_LIMIT=100M"});
  REQUIRE(contains(a.ask("alloc " + std::to_string(40 * kMiB)), "ptr 0x"));
  REQUIRE(contains(b.ask("alloc_on 1 " + std::to_string(30 * kMiB)), "ptr 0x"));
  wait_process(d, a.pid());
  REQUIRE(wait_until([&] {
    const auto u = job_used(d, "train");
    return u.count(uuid_of(0)) && u.at(uuid_of(0)) == 40 * kMiB && u.count(uuid_of(1)) && u.at(uuid_of(1)) == 30 * kMiB;
  }));
  REQUIRE(cli(s, {"suspend", std::to_string(a.pid())}).status == 0);
  {
    // While the job holds 70 MiB on GPU 1, a's 40 MiB there would pass the cap: refused.
    Victim c(s, {"CUWARDEN_JOB=train", "CUWARDEN_JOB_LIMIT=100M"});
    REQUIRE(contains(c.ask("alloc_on 1 " + std::to_string(40 * kMiB)), "ptr 0x"));
    REQUIRE(wait_until([&] { return job_used(d, "train")[uuid_of(1)] == 70 * kMiB; }));
    const CmdResult over = cli(s, {"resume", std::to_string(a.pid()), "--gpu", "1"});
    INFO(over.err);
    CHECK(over.status == 3);
    CHECK(contains(over.err, "job 'train' has a cap of 100.00 MiB per GPU and holds 70.00 MiB on GPU 1"));
    CHECK(d.process(a.pid())["state"] == "suspended");
  }
  // c is gone: its share goes with it (the daemon's sweep).
  REQUIRE(wait_until([&] { return job_used(d, "train")[uuid_of(1)] == 30 * kMiB; }));
  const CmdResult r = cli(s, {"resume", std::to_string(a.pid()), "--gpu", uuid_of(1)});
  INFO(r.out << r.err << slurp(d.log));
  REQUIRE(r.status == 0);
  // On GPU 1 the job holds 70 MiB now: 40 MiB more would pass its cap there, 20 MiB does not.
  const std::string refused = a.ask("reserve " + std::to_string(40 * kMiB));
  INFO(a.err());
  CHECK(refused == "rc 2");
  CHECK(contains(a.err(), "job 'train'"));
  REQUIRE(contains(a.ask("reserve " + std::to_string(20 * kMiB)), "ptr 0x"));
  // Counted once, on the new GPU.
  REQUIRE(wait_until([&] {
    const auto u = job_used(d, "train");
    return u.count(uuid_of(1)) && u.at(uuid_of(1)) == 90 * kMiB;
  }));
  const auto u = job_used(d, "train");
  CHECK((u.count(uuid_of(0)) ? u.at(uuid_of(0)) : 0) == 0);
  // b, on GPU 1 too, meets the same cap.
  CHECK(b.ask("alloc_on 1 " + std::to_string(20 * kMiB)) == "rc 2");
}

TEST_CASE("suspend.move.a_job_moves_whole") {
  Setup s = multi_gpu(2);
  ScopedEnv env(s.env);
  SuspendDaemon d(s);
  Victim a(s, {"CUWARDEN_JOB=train"});
  Victim b(s, {"CUWARDEN_JOB=train"});
  holds(d, a, 32 * kMiB);
  holds(d, b, 16 * kMiB);
  REQUIRE(cli(s, {"suspend", "job:train"}).status == 0);
  // GPU 1 has room for one of them but not both: nothing is restored.
  Victim filler(s);
  REQUIRE(contains(filler.ask("alloc_on 1 " + std::to_string(200 * kMiB)), "ptr 0x"));
  REQUIRE(wait_until([&] { return gpu_used(d, uuid_of(1)) >= 200 * kMiB; }));
  const CmdResult no = cli(s, {"resume", "job:train", "--gpu", "1"});
  INFO(no.out << no.err);
  CHECK(no.status == 3);
  CHECK(contains(no.err, "has 56.00 MiB free"));
  CHECK(d.process(a.pid())["state"] == "suspended");
  CHECK(d.process(b.pid())["state"] == "suspended");
  filler.kill();
  REQUIRE(wait_until([&] { return gpu_used(d, uuid_of(1)) < 200 * kMiB; }));
  const CmdResult r = cli(s, {"resume", "job:train", "--gpu", "1"});
  INFO(r.out << r.err << slurp(d.log));
  REQUIRE(r.status == 0);
  CHECK(d.process(a.pid())["devices"][0]["uuid"] == uuid_of(1));
  CHECK(d.process(b.pid())["devices"][0]["uuid"] == uuid_of(1));
  for (Victim* v : {&a, &b}) {
    v->send("check");
    CHECK(v->line() == "calling");
    CHECK(contains(v->line(), "ok 0x"));
  }
}

TEST_CASE("suspend.move.refusals_leave_it_suspended_and_restorable") {
  // GPUs 0 and 1 are one chip, GPU 2 another.
  Setup s = multi_gpu(3, "256M", ",,cuwarden simulated GPU (other chip)");
  ScopedEnv env(s.env);
  SuspendDaemon d(s);
  Victim v(s);
  REQUIRE(contains(v.ask("alloc " + std::to_string(64 * kMiB)), "ptr 0x"));
  Victim two(s);  // memory on GPUs 0 and 1
  REQUIRE(contains(two.ask("alloc " + std::to_string(8 * kMiB)), "ptr 0x"));
  REQUIRE(contains(two.ask("alloc_on 1 " + std::to_string(8 * kMiB)), "ptr 0x"));
  Victim filler(s);  // GPU 1 without room for v
  REQUIRE(contains(filler.ask("alloc_on 1 " + std::to_string(200 * kMiB)), "ptr 0x"));
  wait_process(d, v.pid());
  wait_process(d, two.pid());
  REQUIRE(wait_until([&] { return d.process(two.pid())["devices"].size() == 2; }));
  REQUIRE(cli(s, {"suspend", std::to_string(v.pid())}).status == 0);
  REQUIRE(cli(s, {"suspend", std::to_string(two.pid())}).status == 0);
  const std::string pid = std::to_string(v.pid());

  const CmdResult chip = cli(s, {"resume", pid, "--gpu", "2"});
  INFO(chip.err);
  CHECK(chip.status == 3);
  CHECK(contains(chip.err, "GPU 2 (" + uuid_of(2) + ") is a cuwarden simulated GPU (other chip)"));
  CHECK(contains(chip.err, "GPU 0 (" + uuid_of(0) + "), a cuwarden simulated GPU:"));
  const CmdResult room = cli(s, {"resume", pid, "--gpu", "1"});
  INFO(room.err);
  CHECK(room.status == 3);
  CHECK(contains(room.err, "GPU 1 (" + uuid_of(1) + ") has "));
  CHECK(contains(room.err, "needs 64.00 MiB"));
  const CmdResult unknown = cli(s, {"resume", pid, "--gpu", "7"});
  INFO(unknown.err);
  CHECK(unknown.status == 1);
  CHECK(contains(unknown.err, "no GPU 7"));
  const CmdResult bad_uuid = cli(s, {"resume", pid, "--gpu", "GPU-00000000-0000-0000-0000-000000000000"});
  CHECK(bad_uuid.status == 1);
  const CmdResult several = cli(s, {"resume", std::to_string(two.pid()), "--gpu", "2"});
  INFO(several.err);
  CHECK(several.status == 3);
  CHECK(contains(several.err, "several GPUs (GPU 0 (" + uuid_of(0) + ")"));
  CHECK(contains(several.err, "GPU 1 (" + uuid_of(1) + ")"));
  // The simulated driver refuses too, as the real one would, and changes nothing: pairs that
  // leave out a GPU the process sees, and another chip.
  CHECK(driver_move(s, v.pid(), uuid_of(0) + "=" + uuid_of(1)) == 1);  // CUDA_ERROR_INVALID_VALUE
  CHECK(driver_move(s, v.pid(), uuid_of(0) + "=" + uuid_of(2) + "," + uuid_of(1) + "=" + uuid_of(1) + "," + uuid_of(2) +
                                    "=" + uuid_of(0)) == 801);  // CUDA_ERROR_NOT_SUPPORTED
  // Still suspended, and a plain resume brings each back with its data.
  CHECK(d.process(v.pid())["state"] == "suspended");
  CHECK(d.process(two.pid())["state"] == "suspended");
  const CmdResult back = cli(s, {"resume", pid});
  INFO(back.err);
  CHECK(back.status == 0);
  // --gpu naming a GPU it is on already: a plain resume, there (for the one on two GPUs, on both).
  const CmdResult in_place = cli(s, {"resume", std::to_string(two.pid()), "--gpu", "0"});
  INFO(in_place.out << in_place.err);
  CHECK(in_place.status == 0);
  CHECK(contains(in_place.out, "resumed, 16.00 MiB back on the device"));
  const json two_now = d.process(two.pid());
  CHECK(two_now["state"] == "running");
  CHECK(two_now["devices"][0]["uuid"] == uuid_of(0));
  CHECK(two_now["devices"][1]["uuid"] == uuid_of(1));
  for (Victim* x : {&v, &two}) {
    x->send("check");
    CHECK(x->line() == "calling");
    CHECK(contains(x->line(), "ok 0x"));
  }
  // Where the daemon would have refused for want of room, the driver's restore fails and
  // leaves the process FAILED (the daemon never asks for it).
  REQUIRE(cli(s, {"suspend", pid}).status == 0);
  CHECK(driver_move(s, v.pid(), uuid_of(0) + "=" + uuid_of(1) + "," + uuid_of(1) + "=" + uuid_of(0) + "," + uuid_of(2) +
                                    "=" + uuid_of(2)) == 2);  // CUDA_ERROR_OUT_OF_MEMORY
  CHECK(channel_state(s, v.pid()) == 3);                           // CU_PROCESS_STATE_FAILED
}

TEST_CASE("suspend.move.only_the_owner_or_root", "[root]") {
  if (geteuid() != 0) {
    SUCCEED("SKIPPED: needs root (a second and third user)");
    return;
  }
  const TwoUsers users;
  const passwd& victim_user = users.victim;
  const uid_t att_uid = users.attacker_uid, att_gid = users.attacker_gid;
  Setup s = multi_gpu(2);
  ScopedEnv env(s.env);
  SuspendDaemon d(s);
  Victim v(s, {}, true, &victim_user);
  holds(d, v, 8 * kMiB);
  auto as = [&](uid_t uid, gid_t gid, const std::vector<std::string>& args) {
    std::vector<std::string> argv = {"/usr/bin/setpriv", "--reuid=" + std::to_string(uid),
                                     "--regid=" + std::to_string(gid), "--clear-groups", CUWT_CLI};
    argv.insert(argv.end(), args.begin(), args.end());
    argv.push_back("--socket");
    argv.push_back(s / "d.sock");
    return run_cmd(argv, {}, 60000);
  };
  const std::string pid = std::to_string(v.pid());
  REQUIRE(as(victim_user.pw_uid, victim_user.pw_gid, {"suspend", pid}).status == 0);
  const CmdResult other = as(att_uid, att_gid, {"resume", pid, "--gpu", "1"});
  INFO(other.err);
  CHECK(other.status == 3);
  CHECK(contains(other.err, "only root or its owner"));
  CHECK(d.process(v.pid())["state"] == "suspended");
  const CmdResult own = as(victim_user.pw_uid, victim_user.pw_gid, {"resume", pid, "--gpu", "1"});
  INFO(own.out << own.err << slurp(d.log));
  CHECK(own.status == 0);
  CHECK(d.process(v.pid())["devices"][0]["uuid"] == uuid_of(1));
  v.send("check");
  CHECK(v.line() == "calling");
  CHECK(contains(v.line(), "ok 0x"));
}

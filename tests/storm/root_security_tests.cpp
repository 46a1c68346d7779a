// cuwarden security checks that need root: one unprivileged user against another (job files,
// the run directory), a full tmpfs mounted for the test, pid namespaces, and pods' own run
// directories followed by one daemon (--pods-dir). Each test skips, saying why, when not
// run as root; as root it creates the two test users if missing.
#include <pwd.h>
#include <sys/mount.h>
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>

#include "cuw/job.hpp"
#include "cuw/live.hpp"
#include "storm_support.hpp"

using namespace cuws;

namespace {

struct User {
  uid_t uid = 0;
  gid_t gid = 0;
  std::string name;
  /// `argv` run as this user (setpriv), environment kept.
  std::vector<std::string> as(std::vector<std::string> argv) const {
    std::vector<std::string> out = {"/usr/bin/setpriv", "--reuid=" + std::to_string(uid),
                                    "--regid=" + std::to_string(gid), "--clear-groups"};
    out.insert(out.end(), argv.begin(), argv.end());
    return out;
  }
};

/// The test user `name`, made (a system user without a home) when missing.
User test_user(const std::string& name) {
  if (!getpwnam(name.c_str()))
    run_cmd({"/usr/sbin/useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name}, {}, 30000);
  const passwd* pw = getpwnam(name.c_str());
  if (!pw) throw std::runtime_error("cannot create the test user " + name);
  return User{pw->pw_uid, pw->pw_gid, name};
}

// A test that cannot run here says why and ends: "SKIPPED:" on stdout is what ctest counts
// as skipped (SKIP_REGULAR_EXPRESSION), rather than as passed.
#define SKIP_TEST(why)                                        \
  do {                                                        \
    std::printf("SKIPPED: %s\n", std::string(why).c_str());   \
    std::fflush(stdout);                                      \
    return;                                                   \
  } while (0)

#define NEED_ROOT()                                                                        \
  do {                                                                                     \
    if (geteuid() != 0) SKIP_TEST("needs root (a second user, mounts or pid namespaces)"); \
  } while (0)

/// A temporary directory every user can reach, with a run directory made as root makes it
/// (the daemon, tmpfiles): root's, world-writable and sticky, with its jobs/ folder.
struct SharedRun {
  TempDir dir;
  std::string run;
  SharedRun() : run(dir / "run") {
    ::chmod(dir.path.c_str(), 0755);
    ::mkdir(run.c_str(), 01777);
    ::chmod(run.c_str(), 01777);
    const std::string jobs = run + "/" + cuw::job::kJobsDir;
    ::mkdir(jobs.c_str(), 01777);
    ::chmod(jobs.c_str(), 01777);
  }
};

std::vector<std::string> job_env(const std::string& run, const std::string& job, const std::string& job_limit) {
  return {std::string("LD_PRELOAD=") + CUWS_LIB, "CUWARDEN_RUN_DIR=" + run, "CUWARDEN_JOB=" + job,
          "CUWARDEN_JOB_LIMIT=" + job_limit, "CUWARDEN_FAKE_MEMORY=4G"};
}

/// The pid of the only child of `pid` (unshare --fork's), or -1 until it has one.
pid_t only_child(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/task/" + std::to_string(pid) + "/children");
  pid_t c = -1;
  return f >> c ? c : -1;
}

}  // namespace

TEST_CASE("security.a_squatted_job_name_neither_stops_nor_splits_the_job") {
  NEED_ROOT();
  const User victim = test_user("cuwarden-test-victim"), squatter = test_user("cuwarden-test-attacker");
  SharedRun s;
  const std::string job = "slurm-77", v = std::to_string(victim.uid);
  // Every name the victim's members could use, taken first by another unprivileged user:
  // the previous layout's file, the per-user directory, the first fallbacks (a file, an open
  // directory with a file of the job's name planted in it).
  const std::string fb0 = s.run + "/" + cuw::job::fallback_dir_name(victim.uid, 0);
  const std::string fb1 = s.run + "/" + cuw::job::fallback_dir_name(victim.uid, 1);
  const std::string squat = "touch " + s.run + "/" + cuw::job::file_name(victim.uid, job) + " && mkdir " + s.run +
                            "/jobs/" + v + " && chmod 777 " + s.run + "/jobs/" + v + " && touch " + fb0 + " && mkdir " +
                            fb1 + " && chmod 777 " + fb1 + " && touch " + fb1 + "/" + cuw::job::file_name(victim.uid, job);
  const CmdResult r = run_cmd(squatter.as({"/bin/sh", "-c", squat}));
  INFO(r.err);
  REQUIRE(r.status == 0);

  // Two members of the victim's job under a 512 MiB job cap: the first holds 300 MiB, so
  // the second's 300 MiB must be refused, by the job's cap (one cap), and neither stops.
  App first(victim.as({CUWJ_APP, "hold", std::to_string(300ULL << 20)}), job_env(s.run, job, "512MiB"),
            s.dir / "first.err", true);
  CHECK(first.line(20000) == "held");
  App second(victim.as({CUWJ_APP, "hold", std::to_string(300ULL << 20)}), job_env(s.run, job, "512MiB"),
             s.dir / "second.err", true);
  CHECK(second.line(20000) == "refused");
  App third(victim.as({CUWJ_APP, "hold", std::to_string(200ULL << 20)}), job_env(s.run, job, "512MiB"),
            s.dir / "third.err", true);
  CHECK(third.line(20000) == "held");
  CHECK(first.wait_exit(0) == -1);  // still running: not stopped with status 78
  const std::string err = slurp(s.dir / "first.err");
  INFO(err);
  CHECK(err.find("exiting with status 78") == std::string::npos);
  // Said once, naming the owner of what was skipped.
  CHECK(err.find("cuwarden-test-attacker") != std::string::npos);
  // The job's file lives in the victim's own directory, the first fallback not taken.
  const std::string fb2 = s.run + "/" + cuw::job::fallback_dir_name(victim.uid, 2);
  struct stat st{};
  REQUIRE(::lstat((fb2 + "/" + cuw::job::file_name(victim.uid, job)).c_str(), &st) == 0);
  CHECK(st.st_uid == victim.uid);
}

TEST_CASE("security.a_root_daemon_renames_squatted_job_names_aside_and_the_job_stays_whole") {
  NEED_ROOT();
  const User victim = test_user("cuwarden-test-victim"), squatter = test_user("cuwarden-test-attacker");
  SharedRun s;
  const std::string v = std::to_string(victim.uid);
  REQUIRE(run_cmd(squatter.as({"/bin/sh", "-c", "mkdir " + s.run + "/jobs/" + v})).status == 0);
  // A member starts while the name is taken (the job goes to a fallback)...
  App first(victim.as({CUWJ_APP, "hold", std::to_string(300ULL << 20)}), job_env(s.run, "train", "512MiB"),
            s.dir / "first.err", true);
  REQUIRE(first.line(20000) == "held");
  // ...then a root daemon comes, moves the squat aside and makes the user's directory.
  Daemon d(s.dir);
  REQUIRE(wait_until([&] {
    struct stat st{};
    return ::lstat((s.run + "/jobs/" + v).c_str(), &st) == 0 && st.st_uid == victim.uid;
  }, 10000));
  CHECK(slurp(d.log).find("renamed to") != std::string::npos);
  // A member that starts now still joins the running job (one cap), not a new one.
  App second(victim.as({CUWJ_APP, "hold", std::to_string(300ULL << 20)}), job_env(s.run, "train", "512MiB"),
             s.dir / "second.err", true);
  CHECK(second.line(20000) == "refused");
}

TEST_CASE("security.a_full_run_directory_is_no_sigbus_and_the_cap_still_holds") {
  NEED_ROOT();
  TempDir dir;
  const std::string run = dir / "run";
  REQUIRE(::mkdir(run.c_str(), 0755) == 0);
  if (::mount("tmpfs", run.c_str(), "tmpfs", 0, "size=512k") != 0)
    SKIP_TEST(std::string("cannot mount a tmpfs here: ") + std::strerror(errno));
  struct Unmount {
    std::string path;
    ~Unmount() { ::umount2(path.c_str(), MNT_DETACH); }
  } unmount{run};
  ::chmod(run.c_str(), 01777);
  // Most of it taken: neither a ring (1 MiB) nor a job file (about 200 KiB) fits.
  {
    std::ofstream filler(run + "/filler", std::ios::binary);
    const std::string block(4096, 'x');
    while (filler.write(block.data(), block.size())) {
    }
  }
  const std::vector<std::string> base = {std::string("LD_PRELOAD=") + CUWS_LIB, "CUWARDEN_RUN_DIR=" + run,
                                         "CUWARDEN_FAKE_MEMORY=1G", "CUWARDEN_LIMIT=64MiB"};
  {
    App under(std::vector<std::string>{CUWJ_APP, "hold", std::to_string(32ULL << 20)}, base, dir / "under.err", true);
    CHECK(under.line(20000) == "held");  // no SIGBUS, the allocation made
    App over(std::vector<std::string>{CUWJ_APP, "hold", std::to_string(96ULL << 20)}, base, dir / "over.err", true);
    CHECK(over.line(20000) == "refused");  // the cap holds on the private ring
  }
  const std::string err = slurp(dir / "under.err");
  INFO(err);
  CHECK(err.find("private ring") != std::string::npos);
  // A job file that cannot be allocated is the configuration error CUWARDEN_ON_ERROR governs.
  std::vector<std::string> job = base;
  job.push_back("CUWARDEN_JOB=j1");
  job.push_back("CUWARDEN_ON_ERROR=fail");
  App failing(std::vector<std::string>{CUWJ_APP, "hold", std::to_string(32ULL << 20)}, job, dir / "fail.err", true);
  CHECK(failing.wait_exit(20000) == 78);
  job.back() = "CUWARDEN_ON_ERROR=open";
  App open(std::vector<std::string>{CUWJ_APP, "hold", std::to_string(32ULL << 20)}, job, dir / "open.err", true);
  CHECK(open.line(20000) == "held");
}

TEST_CASE("security.a_root_program_in_another_pid_namespace_leaves_running_rings_alone") {
  NEED_ROOT();
  const User victim = test_user("cuwarden-test-victim");
  SharedRun s;
  const std::vector<std::string> env = {std::string("LD_PRELOAD=") + CUWS_LIB, "CUWARDEN_RUN_DIR=" + s.run,
                                        "CUWARDEN_FAKE_MEMORY=1G", "CUWARDEN_LIMIT=64MiB"};
  // Two running programs with their rings: one of another user, one of root itself.
  App theirs(victim.as({CUWJ_APP, "hold", std::to_string(1ULL << 20)}), env, s.dir / "theirs.err", true);
  App roots(std::vector<std::string>{CUWJ_APP, "hold", std::to_string(1ULL << 20)}, env, s.dir / "roots.err", true);
  REQUIRE(theirs.line(20000) == "held");
  REQUIRE(roots.line(20000) == "held");
  const auto rings = [&] {
    int n = 0;
    for (const auto& e : dir_entries(s.run)) n += e.rfind("ring-", 0) == 0;
    return n;
  };
  REQUIRE(rings() == 2);
  // A root program in a pid namespace of its own, where neither is visible, with no daemon.
  std::vector<std::string> argv = {"/usr/bin/unshare", "--pid", "--fork", "--mount-proc", "env"};
  for (const auto& e : env) argv.push_back(e);
  argv.insert(argv.end(), {CUWJ_APP, "retry", "1048576", "5"});
  const CmdResult r = run_cmd(argv, {}, 30000);
  INFO(r.err);
  REQUIRE(r.status == 0);
  CHECK(r.out.rfind("ok", 0) == 0);
  CHECK(rings() == 2);
  CHECK(theirs.wait_exit(0) == -1);
  CHECK(roots.wait_exit(0) == -1);
}

TEST_CASE("security.the_daemon_sees_a_process_of_another_pid_namespace_under_its_host_pid") {
  NEED_ROOT();
  SharedRun s;
  Daemon d(s.dir);
  App app(std::vector<std::string>{"/usr/bin/unshare", "--pid", "--fork", "--mount-proc", CUWJ_APP, "hold",
                                   std::to_string(16ULL << 20)},
          {std::string("LD_PRELOAD=") + CUWS_LIB, "CUWARDEN_RUN_DIR=" + s.run, "CUWARDEN_FAKE_MEMORY=1G",
           "CUWARDEN_LIMIT=64MiB"},
          s.dir / "app.err", true);
  REQUIRE(app.line(20000) == "held");
  pid_t host = -1;
  REQUIRE(wait_until([&] { return (host = only_child(app.pid)) > 0; }));
  // Its ring is named by its pid in its own namespace (1); the daemon shows it by ours.
  json p;
  REQUIRE(wait_until([&] { return !(p = d.process(static_cast<uint32_t>(host))).is_null(); }, 10000));
  CHECK(p["state"] != "exited");
  CHECK(p["devices"][0]["used_bytes"] == 16ULL << 20);
  CHECK(d.process(1).is_null());
  // Its exit is seen through its host pid, and its files removed after the linger.
  ::kill(host, SIGKILL);
  REQUIRE(wait_until([&] { return d.process(static_cast<uint32_t>(host))["state"] == "exited"; }, 10000));
}

TEST_CASE("security.the_interposer_never_uses_a_run_dir_of_another_user") {
  NEED_ROOT();
  const User victim = test_user("cuwarden-test-victim"), squatter = test_user("cuwarden-test-attacker");
  TempDir dir;
  ::chmod(dir.path.c_str(), 0777 | S_ISVTX);
  const std::string run = dir / "run";
  // Made by another user, world-writable and sticky: its owner could still delete anything.
  REQUIRE(run_cmd(squatter.as({"/bin/sh", "-c", "mkdir " + run + " && chmod 1777 " + run})).status == 0);
  App app(victim.as({CUWJ_APP, "hold", std::to_string(1ULL << 20)}),
          {std::string("LD_PRELOAD=") + CUWS_LIB, "CUWARDEN_RUN_DIR=" + run, "CUWARDEN_FAKE_MEMORY=1G"},
          dir / "app.err", true);
  REQUIRE(app.line(20000) == "held");
  CHECK(dir_entries(run).empty());
  const std::string own = run + "-" + std::to_string(victim.uid);
  struct stat st{};
  REQUIRE(::lstat(own.c_str(), &st) == 0);
  CHECK(st.st_uid == victim.uid);
  CHECK((st.st_mode & 0777) == 0700);
  bool ring = false;
  for (const auto& e : dir_entries(own)) ring = ring || e.rfind("ring-", 0) == 0;
  CHECK(ring);
  const std::string err = slurp(dir / "app.err");
  INFO(err);
  CHECK(err.find("belongs to uid " + std::to_string(squatter.uid)) != std::string::npos);

  // The daemon refuses such a directory too, rather than serve from it.
  const CmdResult r = run_cmd({CUWT_DAEMON, "--run-dir", run, "--socket", dir / "d.sock", "--no-nvml"}, {}, 10000);
  CHECK(r.status == 1);
  CHECK(r.err.find("belongs to uid") != std::string::npos);
}

TEST_CASE("security.one_daemon_follows_each_pods_own_run_directory_and_keeps_them_apart") {
  NEED_ROOT();
  // The node's layout on Kubernetes (cluster/kubernetes/): pods/ root's and 0755, each pod's
  // directory made for it (sticky, 1777, by the pod's init step), a pid namespace per pod.
  SharedRun s;
  const std::string pods = s.run + "/pods", a_dir = pods + "/pod-a", b_dir = pods + "/pod-b";
  REQUIRE(::mkdir(pods.c_str(), 0755) == 0);
  for (const auto& d : {a_dir, b_dir}) {
    REQUIRE(::mkdir(d.c_str(), 01777) == 0);
    ::chmod(d.c_str(), 01777);
  }
  Daemon d(s.dir, {"--pods-dir", "pods", "--exited-linger", "0.2"});
  // A pod's directory made after the daemon started is found through inotify on pods/, well
  // before the periodic full listing (every 30 s): no query (each may scan) and no other
  // program (whose files would wake a scan) until then.
  const std::string d_dir = pods + "/pod-d";
  REQUIRE(::mkdir(d_dir.c_str(), 01777) == 0);
  ::chmod(d_dir.c_str(), 01777);
  REQUIRE(wait_until([&] { return slurp(d.log).find("pods/pod-d: followed") != std::string::npos; }, 10000));
  const auto pod_app = [&](const std::string& dir, const std::string& limit, const std::string& name) {
    return std::make_unique<App>(
        std::vector<std::string>{"/usr/bin/unshare", "--pid", "--fork", "--mount-proc", CUWJ_APP, "hold",
                                 std::to_string(8ULL << 20)},
        std::vector<std::string>{std::string("LD_PRELOAD=") + CUWS_LIB, "CUWARDEN_RUN_DIR=" + dir,
                                 "CUWARDEN_FAKE_MEMORY=1G", "CUWARDEN_LIMIT=" + limit, "CUWARDEN_JOB=train",
                                 "CUWARDEN_JOB_LIMIT=512MiB"},
        s.dir / (name + ".err"), true);
  };
  auto a = pod_app(a_dir, "64MiB", "a");
  auto b = pod_app(b_dir, "32MiB", "b");
  REQUIRE(a->line(20000) == "held");
  REQUIRE(b->line(20000) == "held");
  pid_t ha = -1, hb = -1;
  REQUIRE(wait_until([&] { return (ha = only_child(a->pid)) > 0 && (hb = only_child(b->pid)) > 0; }));
  // Both pods' programs are pid 1 in their namespaces; the daemon shows each by its host pid
  // with its own cap, its ring in its own pod's directory.
  json pa, pb;
  REQUIRE(wait_until([&] {
    pa = d.process(static_cast<uint32_t>(ha));
    pb = d.process(static_cast<uint32_t>(hb));
    return !pa.is_null() && !pb.is_null();
  }, 10000));
  CHECK(pa["devices"][0]["limit_bytes"] == 64ULL << 20);
  CHECK(pb["devices"][0]["limit_bytes"] == 32ULL << 20);
  CHECK(pa["ring"].get<std::string>().rfind(a_dir + "/ring-", 0) == 0);
  CHECK(pb["ring"].get<std::string>().rfind(b_dir + "/ring-", 0) == 0);
  // A snapshot reads the live segment from the process's own pod's directory: exact.
  std::string why;
  const auto snap = cuw::proto::request(d.socket, cuw::proto::Command::get_snapshot,
                                        json{{"pid", hb}, {"format", "json"}}.dump(), 60000, &why);
  REQUIRE(snap.has_value());
  INFO(snap->body);
  CHECK(json::parse(json::parse(snap->body)["body"].get<std::string>())["exact"] == true);
  // The same job name in two pods is two jobs, each with its own member.
  json jobs;
  REQUIRE(wait_until([&] { return (jobs = d.state()["jobs"]).size() == 2; }, 10000));
  for (const auto& j : jobs) {
    CHECK(j["name"] == "train");
    CHECK(j["members"].size() == 1);
  }
  // What pod a writes cannot reach pod b: a link named like b's ring, a link in pods/ to b's
  // directory (only root could make one there) and a junk ring; none becomes a process.
  const std::string b_ring = pb["ring"].get<std::string>();
  const std::string b_name = b_ring.substr(b_ring.rfind('/') + 1);  // ring-1-<start>: a's may be the same
  REQUIRE(::symlink(b_ring.c_str(), (a_dir + "/ring-7" + b_name.substr(b_name.find('-', 5))).c_str()) == 0);
  REQUIRE(::symlink(b_dir.c_str(), (pods + "/pod-c").c_str()) == 0);
  { std::ofstream(a_dir + "/ring-12345-1.cwr") << "not a ring"; }
  // A scan after these is seen through a ring made later in pod a's directory.
  auto a2 = pod_app(a_dir, "16MiB", "a2");
  REQUIRE(a2->line(20000) == "held");
  pid_t ha2 = -1;
  REQUIRE(wait_until([&] { return (ha2 = only_child(a2->pid)) > 0; }));
  REQUIRE(wait_until([&] { return !d.process(static_cast<uint32_t>(ha2)).is_null(); }, 10000));
  const json st = d.state();
  CHECK(st["processes"].size() == 3);
  for (const auto& p : st["processes"]) CHECK(p["ring"].get<std::string>().find("/pod-c/") == std::string::npos);
  CHECK(d.process(static_cast<uint32_t>(hb))["devices"][0]["limit_bytes"] == 32ULL << 20);
  // A pod that came after the daemon (pod-d, above): its program is seen too.
  auto dd = pod_app(d_dir, "8MiB", "d");
  REQUIRE(dd->line(20000) == "held");
  pid_t hd = -1;
  REQUIRE(wait_until([&] { return (hd = only_child(dd->pid)) > 0; }));
  json pd;
  REQUIRE(wait_until([&] { return !(pd = d.process(static_cast<uint32_t>(hd))).is_null(); }, 10000));
  CHECK(pd["ring"].get<std::string>().rfind(d_dir + "/ring-", 0) == 0);
  CHECK(pd["devices"][0]["limit_bytes"] == 8ULL << 20);
  ::kill(hd, SIGKILL);
  // Pod a's program exits: its ring is removed from its own directory, b's stays.
  const std::string a_ring = pa["ring"].get<std::string>();
  ::kill(ha, SIGKILL);
  REQUIRE(wait_until([&] { return ::access(a_ring.c_str(), F_OK) != 0; }, 10000));
  CHECK(::access(b_ring.c_str(), F_OK) == 0);
  CHECK(d.process(static_cast<uint32_t>(hb))["state"] == "running");
  ::kill(hb, SIGKILL);
  ::kill(ha2, SIGKILL);
}

TEST_CASE("security.root_in_another_pid_namespace_is_not_root_to_the_daemon") {
  // A container's root (a pod without hostPID that reaches the socket) is uid 0 too: by uid
  // alone it could lift any cap on the node.
  NEED_ROOT();
  if (run_cmd({"/usr/bin/unshare", "--pid", "--fork", "--mount-proc", "/bin/true"}).status != 0)
    SKIP_TEST("unshare --pid --fork --mount-proc is not allowed here");
  TempDir dir;
  Daemon d(dir);
  Child victim;
  FakeRing ring(d.run_dir, static_cast<uint32_t>(victim.pid), victim.start_time());
  ring.device(0, 0x40).limit.store(1ull << 30);
  REQUIRE(wait_until([&] { return !d.process(static_cast<uint32_t>(victim.pid)).is_null(); }));
  const std::string pid = std::to_string(victim.pid);
  auto inside = run_cmd({"/usr/bin/unshare", "--pid", "--fork", "--mount-proc", CUWT_CLI, "--socket", d.socket, "limit",
                         pid, "none"});
  INFO(inside.err);
  CHECK(inside.status != 0);  // pid N of its own namespace is no process of ours: refused or not found
  CHECK(ring.h->devices[0].limit.load() == 1ull << 30);
  // The same request from the daemon's own namespace is root's, and is carried out.
  auto host = run_cmd({CUWT_CLI, "--socket", d.socket, "limit", pid, "none"});
  INFO(host.err);
  CHECK(host.status == 0);
  CHECK(ring.h->devices[0].limit.load() == cuw::ring::kNoLimit);
}

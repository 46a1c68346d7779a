// cuwarden integration tests for the control plane: `cuwarden limit` on processes, who may
// change what (peer credentials), the policy file, and live changes seen by a running
// process on the simulated driver.
//
// CI runs as root: the unprivileged side is a forked client that setuid()s to 65534
// (nobody) before running the CLI. Run as another user, the test process itself is the
// unprivileged client; each test asserts what it can in both cases.
#include <grp.h>
#include <pwd.h>
#include <sys/types.h>

#include <catch2/catch.hpp>
#include <fstream>

#include "cuw/job.hpp"
#include "cuw/size.hpp"
#include "daemon_test_support.hpp"

using namespace cuwt;

namespace {

constexpr uint64_t kGiB = 1ULL << 30;
constexpr uid_t kNobody = 65534;

bool is_root() { return geteuid() == 0; }
bool contains(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

CmdResult cli(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {CUWT_CLI};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_cmd(argv, {}, 10000);
}

/// Drop to `uid` in a forked child (root only): no supplementary groups, gid = uid.
void become(uid_t uid) {
  if (setgroups(0, nullptr) != 0 || setgid(uid) != 0 || setuid(uid) != 0) _exit(120);
}

/// Run argv as `uid` (root only), capturing stdout and stderr.
CmdResult run_as(uid_t uid, const std::vector<std::string>& argv, int timeout_ms = 10000) {
  int out[2], err[2];
  REQUIRE(pipe2(out, O_CLOEXEC) == 0);
  REQUIRE(pipe2(err, O_CLOEXEC) == 0);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    dup2(out[1], 1);
    dup2(err[1], 2);
    become(uid);
    std::vector<char*> a;
    std::vector<std::string> copy = argv;
    for (auto& s : copy) a.push_back(s.data());
    a.push_back(nullptr);
    execv(a[0], a.data());
    _exit(127);
  }
  ::close(out[1]);
  ::close(err[1]);
  CmdResult r;
  pollfd fds[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  int open_fds = 2;
  while (open_fds > 0 && std::chrono::steady_clock::now() < until) {
    if (::poll(fds, 2, 100) <= 0) continue;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP))) continue;
      char buf[4096];
      const ssize_t n = ::read(fds[i].fd, buf, sizeof buf);
      if (n > 0) (i == 0 ? r.out : r.err).append(buf, static_cast<size_t>(n));
      else {
        ::close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  for (auto& f : fds)
    if (f.fd >= 0) ::close(f.fd);
  int st = 0;
  if (open_fds > 0) ::kill(pid, SIGKILL);
  waitpid(pid, &st, 0);
  r.status = open_fds > 0 ? -1 : WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return r;
}

/// A process (sleep) running as `uid` (root only), for rings that belong to another user.
struct UserChild {
  pid_t pid = -1;
  explicit UserChild(uid_t uid) {
    pid = fork();
    if (pid == 0) {
      become(uid);
      execlp("sleep", "sleep", "300", static_cast<char*>(nullptr));
      _exit(127);
    }
    // Wait until the exec happened: before it, /proc shows the parent's uid and image.
    wait_until([&] {
      std::ifstream f("/proc/" + std::to_string(pid) + "/comm");
      std::string comm;
      return std::getline(f, comm) && comm == "sleep";
    });
  }
  uint64_t start_time() const { return cuw::paths::process_start_time(static_cast<uint32_t>(pid)); }
  ~UserChild() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
};

/// A temporary directory every user can reach (the socket is inside it).
struct SharedDir : TempDir {
  SharedDir() {
    ::chmod(path.c_str(), 0755);
    ::mkdir((path + "/run").c_str(), 01777);
    ::chmod((path + "/run").c_str(), 01777);
  }
};

uint64_t limit_of(FakeRing& r, int d) { return r.h->devices[d].limit.load(); }

std::string who_am_i() {
  passwd* pw = getpwuid(geteuid());
  return pw ? pw->pw_name : std::to_string(geteuid());
}

json raw_set_limit(const Daemon& d, const json& body, bool* error) {
  std::string why;
  auto m = cuw::proto::request(d.socket, cuw::proto::Command::set_limit, body.dump(), 10000, &why);
  REQUIRE(m.has_value());
  *error = m->header.command == static_cast<uint16_t>(cuw::proto::Command::error);
  return json::parse(m->body);
}

/// Waits (30 s at most) for `what` in the daemon's log: for a line that must come. A line
/// that must not come is read once (contains(slurp(d.log), ...)), or this waits it out.
bool log_has(const Daemon& d, const std::string& what) {
  return wait_until([&] { return contains(slurp(d.log), what); }, 30000);
}

}  // namespace

TEST_CASE("control.owner_lowers_and_only_root_raises_or_removes") {
  SharedDir dir;
  Child a;
  FakeRing ra(dir / "run", a.pid, a.start_time());
  auto& d0 = ra.device(0, 0xa0);
  d0.limit.store(8 * kGiB);
  d0.used.store(1 * kGiB);
  ra.device(1, 0xb0).limit.store(8 * kGiB);
  Daemon d(dir);
  REQUIRE(wait_until([&] { return !d.process(a.pid).is_null(); }));
  const std::string pid = std::to_string(a.pid);

  // Lowering one's own process is allowed for everyone; one device or all of them.
  CmdResult r = cli({"limit", pid, "6G", "--device", "0", "--socket", d.socket});
  INFO(r.out << r.err);
  REQUIRE(r.status == 0);
  CHECK(contains(r.out, "pid " + pid + " (fakeproc) GPU 0: cap 8.00 GiB -> 6.00 GiB"));
  CHECK(limit_of(ra, 0) == 6 * kGiB);
  CHECK(limit_of(ra, 1) == 8 * kGiB);
  CHECK(log_has(d, "limit: uid " + std::to_string(geteuid()) + " (" + who_am_i() + ")"));
  CHECK(log_has(d, "device 0: 8.00 GiB -> 6.00 GiB"));

  // Below current use is allowed: the CLI says new allocations are refused until use drops.
  r = cli({"limit", pid, "512M", "--socket", d.socket});
  REQUIRE(r.status == 0);
  CHECK(limit_of(ra, 0) == 512ULL << 20);
  CHECK(limit_of(ra, 1) == 512ULL << 20);
  CHECK(contains(r.out, "1.00 GiB in use, above the new cap"));
  CHECK(d0.used.load() == 1 * kGiB);  // nothing allocated is touched

  // The change is in the process's events, with who made it.
  json ev = d.events({{"pid", a.pid}});
  int changes = 0;
  for (const auto& e : ev["events"])
    if (e["kind"] == "limit_change" && e["api"] == "control") {
      ++changes;
      CHECK(e["by_uid"] == geteuid());
      CHECK(e.contains("old_limit"));
    }
  CHECK(changes == 3);
  CHECK(d.state()["limit_changes"].size() == 3);

  if (is_root()) {
    // Root raises and removes.
    r = cli({"limit", pid, "16G", "--socket", d.socket});
    REQUIRE(r.status == 0);
    CHECK(limit_of(ra, 0) == 16 * kGiB);
    r = cli({"limit", pid, "none", "--device", "1", "--socket", d.socket});
    REQUIRE(r.status == 0);
    CHECK(contains(r.out, "GPU 1: cap 16.00 GiB -> none"));
    CHECK(limit_of(ra, 1) == cuw::ring::kNoLimit);
    CHECK(d.process(a.pid)["devices"][1]["limit_bytes"].is_null());
    // A percentage resolves against each device's memory.
    r = cli({"limit", pid, "50%", "--device", "0", "--socket", d.socket});
    REQUIRE(r.status == 0);
    CHECK(limit_of(ra, 0) == d0.physical_total / 2);
  } else {
    // Not root: raising and removing are refused, with the reason, exit status 3.
    r = cli({"limit", pid, "16G", "--socket", d.socket});
    CHECK(r.status == 3);
    CHECK(contains(r.err, "cuwarden: refused: only root may raise a cap (device 0: current 512.00 MiB, asked 16.00 GiB)"));
    r = cli({"limit", pid, "none", "--socket", d.socket});
    CHECK(r.status == 3);
    CHECK(contains(r.err, "cuwarden: refused: only root may remove a cap"));
    CHECK(limit_of(ra, 0) == 512ULL << 20);
    CHECK(limit_of(ra, 1) == 512ULL << 20);
  }
}

TEST_CASE("control.limit_device_is_the_gpu_number_the_table_shows") {
  SharedDir dir;
  Child a, b;
  FakeRing ra(dir / "run", a.pid, a.start_time());
  ra.device(0, 0xa0).limit.store(8 * kGiB);  // GPU 0
  ra.device(1, 0xb0).limit.store(8 * kGiB);  // GPU 1
  // b runs with CUDA_VISIBLE_DEVICES=1: its ordinal 0 is GPU 1.
  FakeRing rb(dir / "run", b.pid, b.start_time());
  rb.device(0, 0xb0).limit.store(8 * kGiB);
  Daemon d(dir);
  REQUIRE(wait_until([&] { return !d.process(a.pid).is_null() && !d.process(b.pid).is_null(); }));
  const std::string pid = std::to_string(b.pid);
  CmdResult r = cli({"limit", pid, "4G", "--device", "1", "--socket", d.socket});
  INFO(r.out << r.err);
  REQUIRE(r.status == 0);
  CHECK(contains(r.out, "pid " + pid + " (fakeproc) GPU 1: cap 8.00 GiB -> 4.00 GiB"));
  CHECK(limit_of(rb, 0) == 4 * kGiB);
  r = cli({"limit", pid, "4G", "--device", "0", "--socket", d.socket});
  CHECK(r.status == 1);
  CHECK(contains(r.err, "pid " + pid + " does not use GPU 0 (it uses GPU 1)"));
  CHECK(limit_of(ra, 0) == 8 * kGiB);
}

TEST_CASE("control.unprivileged_user_may_not_touch_others_or_raise") {
  SharedDir dir;
  Child mine;  // runs as the test's user (root in CI)
  FakeRing rm(dir / "run", mine.pid, mine.start_time());
  rm.device(0, 0xa0).limit.store(8 * kGiB);
  std::unique_ptr<UserChild> theirs;
  std::unique_ptr<FakeRing> rt;
  if (is_root()) {
    // A process of uid 65534 with its ring, owned by that uid as the interposer would make it.
    theirs = std::make_unique<UserChild>(kNobody);
    rt = std::make_unique<FakeRing>(dir / "run", theirs->pid, theirs->start_time(), FakeRing::Owner{kNobody, kNobody});
    rt->device(0, 0xa0).limit.store(8 * kGiB);
    rt->device(0, 0xa0).used.store(1 * kGiB);
  }
  Daemon d(dir);
  REQUIRE(wait_until([&] { return d.state()["processes"].size() == (is_root() ? 2u : 1u); }));

  if (!is_root()) {
    // The test process is the unprivileged client; another user's process cannot be
    // staged without root, so the refusal for one is checked on a pid the daemon does
    // not know, and the rules on our own process.
    CmdResult r = cli({"limit", "1", "1G", "--socket", d.socket});
    CHECK(r.status == 1);
    CHECK(contains(r.err, "no running process with pid 1 under cuwarden"));
    r = cli({"limit", std::to_string(mine.pid), "9G", "--socket", d.socket});
    CHECK(r.status == 3);
    CHECK(contains(r.err, "cuwarden: refused: only root may raise a cap"));
    CHECK(limit_of(rm, 0) == 8 * kGiB);
    return;
  }

  const std::string cli_path = CUWT_CLI;
  // nobody on root's process: refused, nothing changed, the refusal logged with who asked.
  CmdResult r = run_as(kNobody, {cli_path, "limit", std::to_string(mine.pid), "1G", "--socket", d.socket});
  INFO(r.out << r.err);
  CHECK(r.status == 3);
  CHECK(contains(r.err, "cuwarden: refused: pid " + std::to_string(mine.pid) +
                            " belongs to uid 0 (root); only root or its owner may change its cap"));
  CHECK(limit_of(rm, 0) == 8 * kGiB);
  CHECK(log_has(d, "limit refused: uid 65534"));

  // nobody on its own process: lowering works, raising and removing do not.
  const std::string tp = std::to_string(theirs->pid);
  r = run_as(kNobody, {cli_path, "limit", tp, "2G", "--socket", d.socket});
  CHECK(r.status == 0);
  CHECK(limit_of(*rt, 0) == 2 * kGiB);
  r = run_as(kNobody, {cli_path, "limit", tp, "4G", "--socket", d.socket});
  CHECK(r.status == 3);
  CHECK(contains(r.err, "cuwarden: refused: only root may raise a cap (device 0: current 2.00 GiB, asked 4.00 GiB)"));
  r = run_as(kNobody, {cli_path, "limit", tp, "none", "--socket", d.socket});
  CHECK(r.status == 3);
  CHECK(contains(r.err, "cuwarden: refused: only root may remove a cap"));
  r = run_as(kNobody, {cli_path, "limit", tp, "unlimited", "--socket", d.socket});
  CHECK(r.status == 3);
  CHECK(limit_of(*rt, 0) == 2 * kGiB);

  // Root may raise nobody's cap again.
  r = cli({"limit", tp, "4G", "--socket", d.socket});
  CHECK(r.status == 0);
  CHECK(limit_of(*rt, 0) == 4 * kGiB);

  // The state records changes and refusals with who asked.
  int refused = 0, changed = 0;
  const json st = d.state();
  for (const auto& c : st["limit_changes"]) {
    if (c["outcome"] == "refused") {
      ++refused;
      CHECK(c["by_uid"] == kNobody);
    }
    if (c["outcome"] == "changed") ++changed;
  }
  CHECK(refused == 4);
  CHECK(changed == 2);
}

TEST_CASE("control.bad_requests_and_targets") {
  SharedDir dir;
  Child a;
  FakeRing ra(dir / "run", a.pid, a.start_time());
  Daemon d(dir);
  REQUIRE(wait_until([&] { return !d.process(a.pid).is_null(); }));
  bool err = false;
  json j = raw_set_limit(d, {{"pid", a.pid}}, &err);
  CHECK(err);
  CHECK(contains(j["error"].get<std::string>(), "bad request: give exactly one of \"bytes\""));
  j = raw_set_limit(d, {{"pid", a.pid}, {"job", "x"}, {"bytes", 1}}, &err);
  CHECK(err);
  CHECK(contains(j["error"].get<std::string>(), "exactly one of \"pid\" and \"job\""));
  j = raw_set_limit(d, {{"pid", "12"}, {"bytes", 1}}, &err);
  CHECK(err);
  j = raw_set_limit(d, {{"pid", a.pid}, {"share", 1.5}}, &err);
  CHECK(err);
  CHECK(contains(j["error"].get<std::string>(), "\"share\" must be a number in (0, 1]"));
  // A process that has not used a GPU has no cap to change.
  j = raw_set_limit(d, {{"pid", a.pid}, {"bytes", 1}}, &err);
  CHECK(err);
  CHECK(contains(j["error"].get<std::string>(), "has not used a GPU yet"));
  ra.device(0, 0xa0);
  j = raw_set_limit(d, {{"pid", a.pid}, {"bytes", 1}, {"device", 3}}, &err);
  CHECK(err);
  CHECK(contains(j["error"].get<std::string>(), "has not used device 3 yet (devices in use: 0)"));

  // The CLI checks what it can before asking.
  CmdResult r = cli({"limit", "abc", "1G", "--socket", d.socket});
  CHECK(r.status == 2);
  CHECK(contains(r.err, "'abc' is neither a PID nor job:NAME"));
  r = cli({"limit", std::to_string(a.pid), "8X", "--socket", d.socket});
  CHECK(r.status == 2);
  CHECK(contains(r.err, "bad size '8X'"));
  r = cli({"limit", "job:train", "50%", "--socket", d.socket});
  CHECK(r.status == 2);
  r = cli({"limit", "job:train", "1G", "--device", "0", "--socket", d.socket});
  CHECK(r.status == 2);
}

namespace {

/// cuwt_alloc_loop (alloc_loop.cpp) under the interposer on the simulated driver, driven
/// line by line: `extra` is added to this process's environment (it wins).
class AllocLoop {
 public:
  explicit AllocLoop(const std::vector<std::string>& extra) {
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e) env.emplace_back(*e);
    for (const std::string& x : {std::string("LD_PRELOAD=") + CUWT_LIB, std::string("LD_LIBRARY_PATH=") + CUWT_FAKECUDA_DIR,
                                 std::string("CUWARDEN_FAKE_MEMORY=1G")})
      env.push_back(x);
    for (const std::string& x : extra) {  // replaces a variable set above (getenv takes the first)
      const std::string name = x.substr(0, x.find('=') + 1);
      std::erase_if(env, [&](const std::string& e) { return e.compare(0, name.size(), name) == 0; });
      env.push_back(x);
    }
    std::vector<char*> envp;
    for (auto& v : env) envp.push_back(v.data());
    envp.push_back(nullptr);
    int in[2], out[2];
    REQUIRE(pipe2(in, O_CLOEXEC) == 0);
    REQUIRE(pipe2(out, O_CLOEXEC) == 0);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    std::string prog = CUWT_ALLOC_LOOP;
    char* argv[] = {prog.data(), nullptr};
    REQUIRE(posix_spawn(&pid, argv[0], &fa, nullptr, argv, envp.data()) == 0);
    posix_spawn_file_actions_destroy(&fa);
    ::close(in[0]);
    ::close(out[1]);
    to_ = fdopen(in[1], "w");
    from_ = fdopen(out[0], "r");
    char first[256] = {};
    REQUIRE(std::fgets(first, sizeof first, from_));
    REQUIRE(std::string(first) == "ready " + std::to_string(pid) + "\n");
  }
  /// Sends one command, returns its one-line answer ("(eof)" when the program ended).
  std::string say(const std::string& cmd) {
    std::fprintf(to_, "%s\n", cmd.c_str());
    std::fflush(to_);
    char line[256] = {};
    if (!std::fgets(line, sizeof line, from_)) return "(eof)";
    std::string s = line;
    if (!s.empty() && s.back() == '\n') s.pop_back();
    return s;
  }
  /// Ends its input and waits: its exit status (-1 when it did not exit normally).
  int finish() {
    if (to_) std::fclose(to_), to_ = nullptr;
    if (from_) std::fclose(from_), from_ = nullptr;
    int st = 0;
    if (pid > 0) waitpid(pid, &st, 0);
    pid = -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  }
  ~AllocLoop() { finish(); }
  pid_t pid = -1;

 private:
  FILE* to_ = nullptr;
  FILE* from_ = nullptr;
};

}  // namespace

TEST_CASE("control.live_limit_refuses_then_allows_the_next_allocation") {
  SharedDir dir;
  Daemon d(dir);
  // The simulated driver's process under the interposer, capped at 64 MiB by itself.
  AllocLoop loop({"CUWARDEN_RUN_DIR=" + d.run_dir, "CUWARDEN_LIMIT=64M"});
  const pid_t pid = loop.pid;
  auto say = [&](const std::string& cmd) { return loop.say(cmd); };
  REQUIRE(say("alloc 16") == "ok");
  REQUIRE(wait_until([&] {
    json p = d.process(static_cast<uint32_t>(pid));
    return !p.is_null() && p["devices"].size() == 1 && p["devices"][0]["used_bytes"] == 16 * kMiB;
  }));
  const std::string ps = std::to_string(pid);

  // Lowered live to 20 MiB: 16 + 8 no longer fits; the process is not restarted.
  CmdResult r = cli({"limit", ps, "20M", "--socket", d.socket});
  INFO(r.out << r.err);
  REQUIRE(r.status == 0);
  CHECK(contains(r.out, "cap 64.00 MiB -> 20.00 MiB"));
  CHECK(say("alloc 8") == "refused");
  CHECK(say("alloc 4") == "ok");  // 20 MiB exactly

  // Below current use: every new allocation is refused, nothing held is taken away.
  r = cli({"limit", ps, "8M", "--socket", d.socket});
  REQUIRE(r.status == 0);
  CHECK(say("alloc 1") == "refused");
  CHECK(d.process(static_cast<uint32_t>(pid))["devices"][0]["used_bytes"] == 20 * kMiB);

  if (is_root()) {
    // Raised back: the next allocation succeeds.
    r = cli({"limit", ps, "64M", "--socket", d.socket});
    REQUIRE(r.status == 0);
    CHECK(say("alloc 8") == "ok");
  } else {
    r = cli({"limit", ps, "64M", "--socket", d.socket});
    CHECK(r.status == 3);
    CHECK(say("alloc 8") == "refused");
  }
  CHECK(say("free") == "freed " + std::string(is_root() ? "3" : "2"));
  CHECK(say("alloc 4") == "ok");  // use dropped below the 8 MiB (or raised) cap
  CHECK(loop.finish() == 0);
}

TEST_CASE("control.policy_applies_defaults_and_maxima_to_discovered_processes") {
  SharedDir dir;
  const std::string cfg = dir / "cuwarden.toml";
  const std::string me = who_am_i();
  {
    std::ofstream f(cfg);
    f << "# test policy\n[default]\nlimit = \"1G\"\nmax_limit = \"2G\"\n";
  }
  Child a;
  FakeRing ra(dir / "run", a.pid, a.start_time());
  ra.device(0, 0xa0);                       // no cap of its own -> the default
  ra.device(1, 0xb0).limit.store(4 * kGiB); // above the max -> the max
  ra.device(2, 0xc0).limit.store(kGiB / 2); // below -> kept
  Daemon d(dir, {"--config", cfg});
  CHECK(wait_until([&] { return limit_of(ra, 0) == kGiB && limit_of(ra, 1) == 2 * kGiB; }));
  CHECK(limit_of(ra, 2) == kGiB / 2);
  CHECK(log_has(d, "policy: pid " + std::to_string(a.pid)));

  // A device the process starts using later gets the policy too.
  ra.device(3, 0xd0).limit.store(8 * kGiB);
  CHECK(wait_until([&] { return limit_of(ra, 3) == 2 * kGiB; }));
  // The policy's changes are in the events, made by "policy".
  json ev = d.events({{"pid", a.pid}});
  int by_policy = 0;
  for (const auto& e : ev["events"])
    if (e["kind"] == "limit_change" && e["by"] == "policy") ++by_policy;
  CHECK(by_policy == 3);

  // The user's own section wins over [default]; SIGHUP reloads and applies again.
  {
    std::ofstream f(cfg);
    f << "[default]\nmax_limit = \"2G\"\n[user." << me << "]\nmax_limit = \"1536M\"\n";
  }
  ::kill(d.pid, SIGHUP);
  CHECK(wait_until([&] { return limit_of(ra, 1) == 1536 * kMiB && limit_of(ra, 3) == 1536 * kMiB; }));
  CHECK(limit_of(ra, 0) == kGiB);

  // A non-root user could not set more than the policy allows; root is not bound by it.
  // A broken file on SIGHUP keeps the policy loaded before.
  {
    std::ofstream f(cfg);
    f << "[default]\nmax_limit = \"1X\"\n";
  }
  ::kill(d.pid, SIGHUP);
  CHECK(log_has(d, cfg + ":2:13: max_limit = \"1X\""));
  CHECK(log_has(d, "keeping the policy loaded before"));
  CHECK(d.alive());
  ra.device(4, 0xe0).limit.store(8 * kGiB);
  CHECK(wait_until([&] { return limit_of(ra, 4) == 1536 * kMiB; }));
}

TEST_CASE("control.policy_errors_stop_the_daemon_with_line_numbers") {
  SharedDir dir;
  const std::string cfg = dir / "bad.toml";
  {
    std::ofstream f(cfg);
    f << "[default]\nlimit = \"40G\"\nmaxlimit = \"80G\"\n";
  }
  Daemon d(dir, {"--config", cfg}, false);
  int st = 0;
  REQUIRE(wait_until([&] { return waitpid(d.pid, &st, WNOHANG) == d.pid; }));
  d.pid = -1;
  CHECK(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == 78);
  const std::string log = slurp(d.log);
  INFO(log);
  CHECK(contains(log, cfg + ":3:1: unknown key 'maxlimit' in [default]"));
  CHECK(contains(log, "has errors; not starting"));
}

TEST_CASE("control.caps_under_1_MiB_are_refused_by_the_policy_check_and_set_limit") {
  SharedDir dir;
  const std::string cfg = dir / "cuwarden.toml";
  {
    std::ofstream f(cfg);
    f << "[default]\nlimit = 5\n";
  }
  // --check-config says what the daemon would say, and exits as it would (78).
  CmdResult r = run_cmd({CUWT_DAEMON, "--check-config", "--config", cfg});
  CHECK(r.status == 78);
  CHECK(contains(r.err, cfg + ":2:9: limit = 5 is 5 bytes, under the smallest cap"));
  CHECK(contains(r.err, "limit = \"5G\""));
  // The daemon itself refuses to start with it.
  {
    Daemon bad(dir, {"--config", cfg}, false);
    int st = 0;
    REQUIRE(wait_until([&] { return waitpid(bad.pid, &st, WNOHANG) == bad.pid; }));
    bad.pid = -1;
    CHECK(WIFEXITED(st));
    CHECK(WEXITSTATUS(st) == 78);
    CHECK(contains(slurp(bad.log), cfg + ":2:9: limit = 5 is 5 bytes"));
  }
  {
    std::ofstream f(cfg);
    f << "[default]\nlimit = \"1G\"\n";
  }
  r = run_cmd({CUWT_DAEMON, "--check-config", "--config", cfg});
  CHECK(r.status == 0);
  CHECK(contains(r.out, "the policy is valid"));
  CHECK(run_cmd({CUWT_DAEMON, "--check-config"}).status == 2);  // no file to check

  Child a;
  FakeRing ra(dir / "run", a.pid, a.start_time());
  ra.device(0, 0xa0);
  Daemon d(dir, {"--config", cfg});
  REQUIRE(wait_until([&] { return limit_of(ra, 0) == kGiB; }));
  // On SIGHUP, the same mistake keeps the policy loaded before.
  {
    std::ofstream f(cfg);
    f << "[default]\nlimit = 5\n";
  }
  ::kill(d.pid, SIGHUP);
  CHECK(log_has(d, "keeping the policy loaded before"));
  ra.device(1, 0xb0);
  CHECK(wait_until([&] { return limit_of(ra, 1) == kGiB; }));

  // set_limit: neither 5 bytes nor a share that comes to under 1 MiB (here 0 bytes).
  bool err = false;
  json j = raw_set_limit(d, {{"pid", a.pid}, {"bytes", 5}}, &err);
  CHECK(err);
  CHECK(contains(j.value("error", ""), "a cap of 5 B on device 0 is under the smallest cap, 1.00 MiB"));
  j = raw_set_limit(d, {{"pid", a.pid}, {"share", 1e-12}}, &err);
  CHECK(err);
  CHECK(contains(j.value("error", ""), "a cap of 0 B (1e-10%) on device 0 is under the smallest cap"));
  CHECK(limit_of(ra, 0) == kGiB);
  CHECK(limit_of(ra, 1) == kGiB);
  j = raw_set_limit(d, {{"pid", a.pid}, {"bytes", cuw::kMinCap}}, &err);
  CHECK_FALSE(err);
  CHECK(limit_of(ra, 0) == cuw::kMinCap);
}

namespace {

/// The job directory of `uid` in run directory `run` (cuw/job.hpp), made 0700 and theirs, as
/// a root daemon or the user's first member makes it.
std::string job_dir(const std::string& run, uid_t uid) {
  const std::string jobs = run + "/" + cuw::job::kJobsDir, own = jobs + "/" + std::to_string(uid);
  ::mkdir(run.c_str(), 01777);
  ::mkdir(jobs.c_str(), 01777);
  ::mkdir(own.c_str(), 0700);
  REQUIRE(::chown(own.c_str(), uid, static_cast<gid_t>(-1)) == 0);
  return own;
}

/// A job segment made with the common API, as the interposer's members would make it, in
/// `uid`'s job directory of run directory `run`. For another uid (root only) the file is
/// created and handed to that user first.
std::unique_ptr<cuw::job::Segment> make_job(const std::string& run, uid_t uid, const std::string& name) {
  std::string err;
  const std::string dir = job_dir(run, uid);
  if (uid != geteuid()) {
    const std::string path = dir + "/" + cuw::job::file_name(uid, name);
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    REQUIRE(fd >= 0);
    REQUIRE(::fchown(fd, uid, uid) == 0);
    REQUIRE(::ftruncate(fd, static_cast<off_t>(cuw::job::file_size())) == 0);
    ::close(fd);
  }
  std::unique_ptr<cuw::job::Segment> seg(cuw::job::Segment::open(dir, uid, name, uid == geteuid(), &err));
  INFO(err);
  REQUIRE(seg);
  return seg;
}

int join(cuw::job::Segment& seg, pid_t pid, uint64_t start_time, uint64_t limit) {
  const int slot = seg.join(static_cast<uint32_t>(pid), start_time, limit, now_ns());
  REQUIRE(slot >= 0);
  return slot;
}

/// The job's GPU of UUID 0xa0..0xaf (uuid_for(0xa0)), an H200's memory; its index in the job.
int add_h200(cuw::job::Segment& seg) {
  uint8_t uuid[16];
  for (int i = 0; i < 16; ++i) uuid[i] = static_cast<uint8_t>(0xa0 + i);
  const int g = seg.gpu_index(uuid, 143771ULL * kMiB);
  REQUIRE(g >= 0);
  return g;
}

std::vector<uint64_t> member_limits(cuw::job::Segment& seg) {
  std::vector<uint64_t> out;
  for (const auto& m : seg.members()) out.push_back(m.limit);
  return out;
}

}  // namespace

TEST_CASE("control.job_rows_live_job_limit_and_sweep") {
  SharedDir dir;
  const std::string run = dir / "run";
  Child a, b, c, e;
  // A member's name is whole where the kernel cut it to 15 characters, as in the process box.
  FakeRing ra(run, a.pid, a.start_time(), 1024, "train_resnet50_");
  std::snprintf(ra.h->cmdline, sizeof ra.h->cmdline, "/opt/train_resnet50_ddp --epochs 3");
  ra.device(0, 0xa0);
  auto seg = make_job(run, geteuid(), "train");
  const int sa = join(*seg, a.pid, a.start_time(), 16 * kGiB);
  const int sb = join(*seg, b.pid, b.start_time(), 16 * kGiB);
  const int sc = join(*seg, c.pid, c.start_time(), 16 * kGiB);
  join(*seg, e.pid, e.start_time(), 8 * kGiB);
  const int g = add_h200(*seg);
  REQUIRE(seg->charge(sa, g, 4 * kGiB));
  REQUIRE(seg->charge(sb, g, 2 * kGiB));
  Daemon d(dir);
  REQUIRE(wait_until([&] { return d.state()["jobs"].size() == 1; }));

  // The state: cap, disagreement, per-GPU use, members.
  json st = d.state();
  const json& job = st["jobs"][0];
  CHECK(job["name"] == "train");
  CHECK(job["user"] == who_am_i());
  CHECK(job["uid"] == geteuid());
  CHECK(job["limit_bytes"] == 8 * kGiB);
  CHECK(job["caps_disagree"] == true);
  CHECK(job["caps_requested"] == json::parse(R"([{"bytes":17179869184,"members":3},{"bytes":8589934592,"members":1}])"));
  REQUIRE(job["gpus"].size() == 1);
  CHECK(job["gpus"][0]["uuid"] == uuid_for(0xa0));
  CHECK(job["gpus"][0]["gpu_index"] == 0);
  CHECK(job["gpus"][0]["used_bytes"] == 6 * kGiB);
  REQUIRE(job["members"].size() == 4);
  bool saw_a = false;
  for (const auto& m : job["members"])
    if (m["pid"] == a.pid) {
      saw_a = true;
      CHECK(m["process_name"] == "train_resnet50_ddp");  // from its ring
      CHECK(m["used_bytes"] == 4 * kGiB);
      CHECK(m["requested_bytes"] == 16 * kGiB);
    }
  CHECK(saw_a);

  // The table: a job row with the disagreement, each member under it.
  CmdResult r = cli({"--socket", d.socket});
  INFO(r.out);
  REQUIRE(r.status == 0);
  CHECK(contains(r.out, "Jobs (shared caps per GPU):"));
  CHECK(contains(r.out, "train (4 members)"));
  CHECK(contains(r.out, "16 GiB ×3, 8 GiB ×1 → 8 GiB"));
  CHECK(contains(r.out, "6144MiB"));
  CHECK(contains(r.out, "  pid " + std::to_string(a.pid) + " train_resnet50_ddp"));
  CHECK(contains(r.out, "  pid " + std::to_string(e.pid)));
  std::size_t width = 0;
  for (std::size_t pos = 0; pos < r.out.size();) {
    const std::size_t nl = r.out.find('\n', pos);
    const std::string line = r.out.substr(pos, nl - pos);
    pos = nl + 1;
    if (line.empty() || (line[0] != '|' && line[0] != '+')) continue;
    std::size_t w = 0;
    for (unsigned char ch : line) w += (ch & 0xc0) != 0x80;
    if (!width) width = w;
    CHECK(w == width);  // every box line equally wide, "×" and "→" counted as one column
  }
  r = cli({"--socket", d.socket, "--json"});
  REQUIRE(r.status == 0);
  CHECK(json::parse(r.out)["jobs"][0]["name"] == "train");

  // Lowered live below the job's use: members' caps change, the next reservation is refused.
  r = cli({"limit", "job:train", "4G", "--socket", d.socket});
  INFO(r.err);
  REQUIRE(r.status == 0);
  CHECK(contains(r.out, "job train (user " + who_am_i() + ", 4 members): cap 8.00 GiB -> 4.00 GiB"));
  CHECK(contains(r.out, "above the new cap"));
  CHECK(member_limits(*seg) == std::vector<uint64_t>(4, 4 * kGiB));
  CHECK(seg->cap() == 4 * kGiB);
  CHECK_FALSE(seg->charge(sc, g, 1 * kMiB));
  CHECK(log_has(d, "set job " + who_am_i() + "/train (4 member(s)): 8.00 GiB -> 4.00 GiB"));

  if (is_root()) {
    r = cli({"limit", "job:" + who_am_i() + "/train", "32G", "--socket", d.socket});
    CHECK(r.status == 0);
    CHECK(seg->cap() == 32 * kGiB);
    // Removed: the reply's GPUs have no cap to compare their use with.
    r = cli({"limit", "job:train", "none", "--socket", d.socket});
    INFO(r.out << r.err);
    CHECK(r.status == 0);
    CHECK(contains(r.out, "cap 32.00 GiB -> none"));
    CHECK_FALSE(contains(r.out, "above the new cap"));
    CHECK(seg->cap() == cuw::job::kNoLimit);
    r = cli({"limit", "job:train", "4G", "--socket", d.socket});
    CHECK(r.status == 0);
  } else {
    r = cli({"limit", "job:train", "32G", "--socket", d.socket});
    CHECK(r.status == 3);
    CHECK(contains(r.err, "cuwarden: refused: only root may raise a cap (job 'train': current 4.00 GiB, asked 32.00 GiB)"));
    CHECK(seg->cap() == 4 * kGiB);
  }
  // A job that does not exist, and one the CLI cannot name.
  r = cli({"limit", "job:nosuch", "1G", "--socket", d.socket});
  CHECK(r.status == 1);
  CHECK(contains(r.err, "no job 'nosuch'"));

  // A killed member's share comes back by the daemon's sweep, though no member allocates.
  b.kill_and_reap();
  CHECK(wait_until([&] { return seg->used(g) == 4 * kGiB; }, 30000));
  CHECK(wait_until([&] { return d.state()["jobs"][0]["members"].size() == 3; }, 30000));
  CHECK(log_has(d, "reclaimed the share of 1 dead member(s)"));
}

TEST_CASE("control.job_end_is_logged_with_its_peak_and_its_file_removed") {
  SharedDir dir;
  const std::string run = dir / "run";
  const std::string file = run + "/jobs/" + std::to_string(geteuid()) + "/" + cuw::job::file_name(geteuid(), "slurm-42");
  Child a, b;
  auto seg = make_job(run, geteuid(), "slurm-42");
  const int sa = join(*seg, a.pid, a.start_time(), 100 * kMiB);
  const int sb = join(*seg, b.pid, b.start_time(), 100 * kMiB);
  const int g = add_h200(*seg);
  // 40 + 20 MiB held together is the peak; a release and a smaller charge leave it.
  REQUIRE(seg->charge(sa, g, 40 * kMiB));
  REQUIRE(seg->charge(sb, g, 20 * kMiB));
  seg->uncharge(sa, g, 40 * kMiB);
  REQUIRE(seg->charge(sa, g, 10 * kMiB));
  Daemon d(dir, {"--exited-linger", "0", "--scan-interval-ms", "50"});
  REQUIRE(wait_until([&] { return d.state()["jobs"].size() == 1; }));
  const json st = d.state();
  CHECK(st["jobs"][0]["gpus"][0]["peak_bytes"] == 60 * kMiB);
  CHECK(st["jobs"][0]["gpus"][0]["used_bytes"] == 30 * kMiB);

  // Its members gone, the job is empty, but this process still holds the file's shared lock
  // (as a member does from before it joins): the file stays.
  a.kill_and_reap();
  b.kill_and_reap();
  REQUIRE(wait_until([&] { return d.state()["jobs"].empty(); }, 30000));
  ::usleep(300'000);  // several scans
  CHECK(::access(file.c_str(), F_OK) == 0);
  CHECK_FALSE(contains(slurp(d.log), "ended (no member left)"));

  // The lock released, the next scan logs the job's peak and removes its file.
  seg.reset();
  CHECK(wait_until([&] { return ::access(file.c_str(), F_OK) != 0; }, 30000));
  CHECK(log_has(d, "job " + who_am_i() + "/slurm-42 ended (no member left): " + uuid_for(0xa0) +
                       " peak 60.00 MiB (62914560 bytes); cap 100.00 MiB; file removed"));

  // A new member of the same name starts a new, empty job.
  Child c;
  auto again = make_job(run, geteuid(), "slurm-42");
  join(*again, c.pid, c.start_time(), 100 * kMiB);
  CHECK(again->gpus().empty());
}

TEST_CASE("control.job_members_the_daemon_watches_are_kept_while_they_run_and_swept_when_they_exit") {
  SharedDir dir;
  const std::string run = dir / "run";
  // Members with rings: the daemon holds a pidfd of each, which its sweep trusts while it is
  // silent instead of asking the kernel and /proc about the member.
  Child a, b, c;
  FakeRing ra(run, a.pid, a.start_time());
  FakeRing rb(run, b.pid, b.start_time());
  FakeRing rc(run, c.pid, c.start_time());
  auto seg = make_job(run, geteuid(), "watched");
  const int sa = join(*seg, a.pid, a.start_time(), 16 * kGiB);
  const int sb = join(*seg, b.pid, b.start_time(), 16 * kGiB);
  const int sc = join(*seg, c.pid, c.start_time(), 16 * kGiB);
  const int g = add_h200(*seg);
  REQUIRE(seg->charge(sa, g, 1 * kGiB));
  REQUIRE(seg->charge(sb, g, 2 * kGiB));
  REQUIRE(seg->charge(sc, g, 4 * kGiB));
  Daemon d(dir, {"--scan-interval-ms", "100"});
  REQUIRE(wait_until([&] {
    const json st = d.state();
    return st["processes"].size() == 3 && st["jobs"].size() == 1 && st["jobs"][0]["members"].size() == 3;
  }));
  ::usleep(500'000);  // several sweeps: running members keep their shares
  CHECK(seg->used(g) == 7 * kGiB);
  CHECK(d.state()["jobs"][0]["members"].size() == 3);

  // Killed and reaped: its share is back at the next scan.
  b.kill_and_reap();
  CHECK(wait_until([&] { return seg->used(g) == 5 * kGiB; }, 30000));
  // Killed and not reaped, a zombie whose pid still takes a signal: back once /proc has been
  // read again (every 5 s at most).
  REQUIRE(::kill(c.pid, SIGKILL) == 0);
  CHECK(wait_until([&] { return seg->used(g) == 1 * kGiB; }, 30000));
  CHECK(wait_until([&] { return d.state()["jobs"][0]["members"].size() == 1; }, 30000));
  CHECK(log_has(d, "reclaimed the share of 1 dead member(s)"));
}

TEST_CASE("control.job_limit_rules_for_other_users") {
  SharedDir dir;
  const std::string run = dir / "run";
  Child a;
  auto mine = make_job(run, geteuid(), "train");
  join(*mine, a.pid, a.start_time(), 8 * kGiB);
  if (!is_root()) {
    Daemon d(dir);
    REQUIRE(wait_until([&] { return d.state()["jobs"].size() == 1; }));
    CmdResult r = cli({"limit", "job:root/train", "1G", "--socket", d.socket});
    CHECK(r.status == 3);
    CHECK(contains(r.err, "cuwarden: refused: job 'train' belongs to uid 0 (root); only root or its owner may change its cap"));
    r = cli({"limit", "job:train", "none", "--socket", d.socket});
    CHECK(r.status == 3);
    CHECK(contains(r.err, "only root may remove a cap"));
    CHECK(mine->cap() == 8 * kGiB);
    return;
  }
  UserChild n(kNobody);
  auto theirs = make_job(run, kNobody, "etl");
  join(*theirs, n.pid, n.start_time(), 8 * kGiB);
  Daemon d(dir);
  REQUIRE(wait_until([&] { return d.state()["jobs"].size() == 2; }));
  const std::string cli_path = CUWT_CLI;

  // nobody: root's job is not theirs; their own job they may lower, not raise or uncap.
  CmdResult r = run_as(kNobody, {cli_path, "limit", "job:root/train", "1G", "--socket", d.socket});
  INFO(r.out << r.err);
  CHECK(r.status == 3);
  CHECK(contains(r.err, "cuwarden: refused: job 'train' belongs to uid 0 (root); only root or its owner may change its cap"));
  r = run_as(kNobody, {cli_path, "limit", "job:train", "1G", "--socket", d.socket});
  CHECK(r.status == 1);  // "train" of nobody does not exist
  CHECK(mine->cap() == 8 * kGiB);
  r = run_as(kNobody, {cli_path, "limit", "job:etl", "4G", "--socket", d.socket});
  CHECK(r.status == 0);
  CHECK(theirs->cap() == 4 * kGiB);
  r = run_as(kNobody, {cli_path, "limit", "job:etl", "6G", "--socket", d.socket});
  CHECK(r.status == 3);
  CHECK(contains(r.err, "cuwarden: refused: only root may raise a cap (job 'etl': current 4.00 GiB, asked 6.00 GiB)"));
  r = run_as(kNobody, {cli_path, "limit", "job:etl", "none", "--socket", d.socket});
  CHECK(r.status == 3);
  CHECK(theirs->cap() == 4 * kGiB);
  CHECK(log_has(d, "limit refused: uid 65534"));

  // root names another user's job either way.
  r = cli({"limit", "job:etl", "16G", "--user", "65534", "--socket", d.socket});
  CHECK(r.status == 0);
  CHECK(theirs->cap() == 16 * kGiB);
  r = cli({"limit", "job:65534/etl", "none", "--socket", d.socket});
  CHECK(r.status == 0);
  CHECK(theirs->cap() == cuw::job::kNoLimit);
}

TEST_CASE("control.policy_applies_to_job_members") {
  SharedDir dir;
  const std::string run = dir / "run";
  const std::string cfg = dir / "cuwarden.toml";
  {
    std::ofstream f(cfg);
    f << "[default]\njob_limit = \"6G\"\nmax_job_limit = \"10G\"\n";
  }
  Child a, b, c;
  auto seg = make_job(run, geteuid(), "train");
  join(*seg, a.pid, a.start_time(), 16 * kGiB);         // above the max -> the max
  join(*seg, b.pid, b.start_time(), cuw::job::kNoLimit); // asked for none -> the default
  Daemon d(dir, {"--config", cfg});
  CHECK(wait_until([&] {
    auto l = member_limits(*seg);
    std::sort(l.begin(), l.end());
    return l == std::vector<uint64_t>{6 * kGiB, 10 * kGiB};
  }));
  CHECK(seg->cap() == 6 * kGiB);
  // A member joining later gets it too (by the next scan).
  join(*seg, c.pid, c.start_time(), 12 * kGiB);
  CHECK(wait_until([&] {
    auto l = member_limits(*seg);
    std::sort(l.begin(), l.end());
    return l == std::vector<uint64_t>{6 * kGiB, 10 * kGiB, 10 * kGiB};
  }, 3000));
  CHECK(log_has(d, "policy: job " + who_am_i() + "/train member pid " + std::to_string(a.pid) + ": cap 16.00 GiB -> 10.00 GiB"));
}

TEST_CASE("control.cap_scope_process_counts_the_context_and_modules") {
  SharedDir dir;
  Daemon d(dir);
  const std::vector<std::string> base = {"CUWARDEN_RUN_DIR=" + d.run_dir, "CUWARDEN_LIMIT=1G",
                                         "CUWARDEN_FAKE_MEMORY=4G", "CUWARDEN_FAKE_CONTEXT_MEMORY=300M"};
  // The process's first device; an empty object until the daemon has seen it use one.
  auto device_of = [&](pid_t pid) {
    json p = d.process(static_cast<uint32_t>(pid));
    return p.is_null() || p["devices"].empty() ? json::object() : p["devices"][0];
  };

  // The default scope: the cap counts allocations; the driver's 300 MiB for the context lie
  // outside it.
  {
    AllocLoop a(base);
    CHECK(a.say("alloc 600") == "ok");
    CHECK(a.say("alloc 400") == "ok");  // 1000 MiB of allocations, 1300 MiB held
    REQUIRE(wait_until([&] { return device_of(a.pid).value("used_bytes", uint64_t{0}) == 1000 * kMiB; }));
    CHECK(d.process(static_cast<uint32_t>(a.pid))["cap_scope"] == "allocations");
    CHECK(device_of(a.pid)["context_bytes"] == 0);
    CHECK(a.finish() == 0);
  }

  // CUWARDEN_CAP_SCOPE=process: the context is counted from the start (NVML's figure for
  // the process minus its allocations).
  std::vector<std::string> env = base;
  env.push_back("CUWARDEN_CAP_SCOPE=process");
  AllocLoop b(env);
  CHECK(b.say("alloc 600") == "ok");
  CHECK(b.say("alloc 400") == "refused");  // 300 + 600 + 400 > 1024
  CHECK(b.say("alloc 124") == "ok");       // 300 + 724 = 1024: the cap exactly
  REQUIRE(wait_until([&] { return device_of(b.pid).value("used_bytes", uint64_t{0}) == 1024 * kMiB; }));
  CHECK(d.process(static_cast<uint32_t>(b.pid))["cap_scope"] == "process");
  CHECK(device_of(b.pid)["context_bytes"] == 300 * kMiB);

  // The driver's memory grows (a module loaded at a kernel's first launch): an allocation
  // that comes near the cap has it measured again first, and counted from then on.
  CHECK(b.say("free") == "freed 2");
  CHECK(b.say("grow 100") == "grown");
  usleep(20000);  // near the cap the context is measured at most every 10 ms
  CHECK(b.say("alloc 200") == "ok");      // 300 (as measured) + 200: far from the cap
  CHECK(b.say("alloc 500") == "refused");  // near it: measured, 400 + 200 + 500 > 1024
  REQUIRE(wait_until([&] { return device_of(b.pid).value("context_bytes", uint64_t{0}) == 400 * kMiB; }));
  CHECK(device_of(b.pid)["used_bytes"] == 600 * kMiB);
  CHECK(b.say("alloc 424") == "ok");  // 400 + 624 = 1024
  CHECK(b.say("alloc 1") == "refused");

  // The context goes (its last reference released), and its memory with it: nothing is
  // counted any more, the context's share included.
  CHECK(b.say("release") == "released");
  REQUIRE(wait_until([&] {
    const json dev = device_of(b.pid);
    return dev.value("used_bytes", uint64_t{1}) == 0 && dev.value("context_bytes", uint64_t{1}) == 0;
  }));
  CHECK(b.finish() == 0);

  // A bad value is a configuration error (exit 78), as for every variable.
  CmdResult r = run_cmd({CUWT_ALLOC_LOOP},
                        {"LD_PRELOAD=" + std::string(CUWT_LIB), "LD_LIBRARY_PATH=" + std::string(CUWT_FAKECUDA_DIR),
                         "CUWARDEN_RUN_DIR=" + d.run_dir, "CUWARDEN_CAP_SCOPE=context"},
                        5000);
  CHECK(r.status == 78);
  CHECK(contains(r.err, "CUWARDEN_CAP_SCOPE='context': expected 'allocations' or 'process'"));
}

TEST_CASE("control.table_shows_what_of_the_drivers_figure_lies_outside_the_cap") {
  SharedDir dir;
  ::mkdir((dir / "run").c_str(), 0755);
  Child a, b;
  FakeRing ra(dir / "run", a.pid, a.start_time());
  ring::DeviceSlot& da = ra.device(0, 0xa0);
  da.used.store(4096 * kMiB);
  da.limit.store(6144 * kMiB);
  // b counts its context (CUWARDEN_CAP_SCOPE=process): little of the driver's figure is left.
  FakeRing rb(dir / "run", b.pid, b.start_time());
  rb.h->cap_scope = static_cast<uint32_t>(ring::CapScope::process);
  ring::DeviceSlot& db = rb.device(0, 0xa0);
  db.used.store(4608 * kMiB);
  db.context_bytes.store(512 * kMiB);
  db.limit.store(6144 * kMiB);
  // The simulated NVML lists both as the driver would: allocations plus 512 MiB of context.
  const std::string nvml_env = std::to_string(a.pid) + "=" + std::to_string(4608 * kMiB) + "," +
                               std::to_string(b.pid) + "=" + std::to_string(4616 * kMiB);
  setenv("CUWARDEN_FAKE_NVML_PROCESSES", nvml_env.c_str(), 1);
  setenv("CUWARDEN_FAKE_UUIDS", uuid_for(0xa0).c_str(), 1);
  const std::string ld = std::string(CUWT_FAKECUDA_DIR) + (getenv("LD_LIBRARY_PATH") ? std::string(":") + getenv("LD_LIBRARY_PATH") : "");
  const std::string saved_ld = getenv("LD_LIBRARY_PATH") ? getenv("LD_LIBRARY_PATH") : "";
  setenv("LD_LIBRARY_PATH", ld.c_str(), 1);
  Daemon d(dir, {}, true, /*nvml=*/true);
  unsetenv("CUWARDEN_FAKE_NVML_PROCESSES");
  unsetenv("CUWARDEN_FAKE_UUIDS");
  if (saved_ld.empty()) unsetenv("LD_LIBRARY_PATH");
  else setenv("LD_LIBRARY_PATH", saved_ld.c_str(), 1);

  REQUIRE(wait_until([&] {
    json p = d.process(a.pid);
    return !p.is_null() && p["devices"][0].value("driver_used_bytes", json()).is_number();
  }));
  json pa = d.process(a.pid), pb = d.process(b.pid);
  CHECK(pa["cap_scope"] == "allocations");
  CHECK(pa["devices"][0]["outside_cap_bytes"] == 512 * kMiB);
  CHECK(pb["cap_scope"] == "process");
  CHECK(pb["devices"][0]["context_bytes"] == 512 * kMiB);
  CHECK(pb["devices"][0]["outside_cap_bytes"] == 8 * kMiB);

  CmdResult r = cli({"--socket", d.socket});
  INFO(r.out << r.err);
  REQUIRE(r.status == 0);
  CHECK(contains(r.out, "Driver  Outside"));
  CHECK(contains(r.out, "4096MiB  4608MiB   512MiB"));
  CHECK(contains(r.out, "4608MiB  4616MiB     8MiB"));
  for (std::size_t pos = 0, nl; (nl = r.out.find('\n', pos)) != std::string::npos; pos = nl + 1)
    CHECK(nl - pos <= 100);  // still beside nvidia-smi's width
  r = cli({"--query-compute-apps=pid,used_memory,driver_used_memory,outside_cap_memory,context_memory,cap_scope",
           "--format=csv,noheader", "--socket", d.socket});
  CHECK(contains(r.out, std::to_string(a.pid) + ", 4096 MiB, 4608 MiB, 512 MiB, 0 MiB, allocations"));
  CHECK(contains(r.out, std::to_string(b.pid) + ", 4608 MiB, 4616 MiB, 8 MiB, 512 MiB, process"));
}

TEST_CASE("control.cap_scope_process_counts_the_context_in_the_job") {
  SharedDir dir;
  Daemon d(dir);
  AllocLoop a({"CUWARDEN_RUN_DIR=" + d.run_dir, "CUWARDEN_FAKE_MEMORY=4G", "CUWARDEN_FAKE_CONTEXT_MEMORY=300M",
               "CUWARDEN_CAP_SCOPE=process", "CUWARDEN_JOB=cs", "CUWARDEN_JOB_LIMIT=1G"});
  auto job_used = [&] {
    json st = d.state();
    return st["jobs"].empty() || st["jobs"][0]["gpus"].empty() ? json() : st["jobs"][0]["gpus"][0]["used_bytes"];
  };
  // The job's share holds the context too: 300 + 600, then 200 more would pass the job's cap.
  CHECK(a.say("alloc 600") == "ok");
  CHECK(a.say("alloc 200") == "refused");
  REQUIRE(wait_until([&] { return job_used() == json(900 * kMiB); }));

  // A module loaded since: measured as the allocation comes near the job's cap.
  CHECK(a.say("grow 100") == "grown");
  usleep(20000);  // near a cap the context is measured at most every 10 ms
  CHECK(a.say("alloc 100") == "refused");  // 400 + 600 + 100 > 1024
  REQUIRE(wait_until([&] { return job_used() == json(1000 * kMiB); }));
  CHECK(a.say("alloc 24") == "ok");  // 1024 exactly

  // What was freed leaves the job's share as it leaves the process's: no drift either way.
  CHECK(a.say("free") == "freed 2");
  REQUIRE(wait_until([&] { return job_used() == json(400 * kMiB); }));
  CHECK(d.process(static_cast<uint32_t>(a.pid))["devices"][0]["used_bytes"] == 400 * kMiB);
  CHECK(a.finish() == 0);
}

TEST_CASE("control.a_flood_of_refused_requests_neither_floods_the_log_nor_hides_roots_changes") {
  if (!is_root()) {
    WARN("needs root (an unprivileged client beside root); skipped");
    return;
  }
  SharedDir dir;
  Child mine;
  FakeRing rm(dir / "run", mine.pid, mine.start_time());
  rm.device(0, 0xa0).limit.store(8 * kGiB);
  Daemon d(dir);
  REQUIRE(wait_until([&] { return d.state()["processes"].size() == 1u; }));
  // Root's change first: the flood that follows must not push it out of the state's log.
  REQUIRE(cli({"limit", std::to_string(mine.pid), "4G", "--socket", d.socket}).status == 0);
  const auto t0 = std::chrono::steady_clock::now();
  const std::string loop = "for i in $(seq 300); do " + std::string(CUWT_CLI) + " limit 999999 1G --socket " + d.socket +
                           " 2>/dev/null; done";
  CmdResult flood = run_as(kNobody, {"/bin/sh", "-c", loop}, 120000);
  REQUIRE(flood.status != -1);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string log = slurp(d.log);
  int lines = 0;
  for (std::size_t at = 0; (at = log.find("limit failed: uid 65534", at)) != std::string::npos; ++at) ++lines;
  INFO(lines << " lines for 300 refused requests in " << seconds << " s");
  CHECK(lines >= 1);
  CHECK(lines <= static_cast<int>(seconds) + 2);  // one a second per uid
  if (seconds > 1.5) CHECK(contains(log, "more from uid 65534 not logged"));
  const json st = d.state();
  bool roots = false;
  for (const auto& c : st["limit_changes"])
    roots = roots || (c["outcome"] == "changed" && c["by_uid"] == 0);
  CHECK(roots);
}

TEST_CASE("control.a_cap_raised_in_the_processs_own_ring_past_the_policy_is_put_back") {
  // The ring is its owner's own file: writing a higher cap into it is one store away.
  SharedDir dir;
  const std::string cfg = dir / "cuwarden.toml";
  {
    std::ofstream f(cfg);
    f << "[default]\nmax_limit = \"2G\"\n";
  }
  Child a;
  FakeRing ra(dir / "run", a.pid, a.start_time());
  ra.device(0, 0xa0).limit.store(kGiB);
  Daemon d(dir, {"--config", cfg});
  REQUIRE(wait_until([&] { return !d.process(a.pid).is_null(); }));
  CHECK(limit_of(ra, 0) == kGiB);  // under the maximum: kept
  ra.h->devices[0].limit.store(cuw::ring::kNoLimit);  // the owner removes its cap
  CHECK(wait_until([&] { return limit_of(ra, 0) == 2 * kGiB; }));
  ra.h->devices[0].limit.store(3 * kGiB);  // and raises it past the maximum
  CHECK(wait_until([&] { return limit_of(ra, 0) == 2 * kGiB; }));
  CHECK(wait_until([&] { return d.process(a.pid).value("tampers", 0) == 2; }));
  CHECK(log_has(d, "past the 2.00 GiB the daemon allows; put back"));
  json ev = d.events({{"pid", a.pid}});
  int by_tamper = 0;
  for (const auto& e : ev["events"]) by_tamper += e["kind"] == "limit_change" && e["by"] == "tamper";
  CHECK(by_tamper == 2);
  CHECK(contains(cli({"--socket", d.socket}).out, "tampered"));
}

TEST_CASE("control.enforce_kill_ends_a_process_still_over_its_ceiling_at_the_next_scan") {
  // Both hold 4 GiB by the driver's count (memory taken past the hooks) under a 2 GiB
  // maximum: more than the 1 GiB context allowance over. One user's policy reports, the
  // other's kills; the test runs as one user, so two daemons with two policies stand in.
  for (const bool kill : {false, true}) {
    SharedDir dir;
    ::mkdir((dir / "run").c_str(), 0755);
    const std::string cfg = dir / "cuwarden.toml";
    {
      std::ofstream f(cfg);
      f << "[default]\nmax_limit = \"2G\"\n" << (kill ? "enforce = \"kill\"\n" : "");
    }
    Child a;
    FakeRing ra(dir / "run", a.pid, a.start_time());
    ra.device(0, 0xa0).used.store(512 * kMiB);
    const std::string nvml_env = std::to_string(a.pid) + "=" + std::to_string(4 * kGiB);
    setenv("CUWARDEN_FAKE_NVML_PROCESSES", nvml_env.c_str(), 1);
    setenv("CUWARDEN_FAKE_UUIDS", uuid_for(0xa0).c_str(), 1);
    const std::string saved_ld = getenv("LD_LIBRARY_PATH") ? getenv("LD_LIBRARY_PATH") : "";
    setenv("LD_LIBRARY_PATH", (std::string(CUWT_FAKECUDA_DIR) + (saved_ld.empty() ? "" : ":" + saved_ld)).c_str(), 1);
    Daemon d(dir, {"--config", cfg}, true, /*nvml=*/true);
    unsetenv("CUWARDEN_FAKE_NVML_PROCESSES");
    unsetenv("CUWARDEN_FAKE_UUIDS");
    if (saved_ld.empty()) unsetenv("LD_LIBRARY_PATH");
    else setenv("LD_LIBRARY_PATH", saved_ld.c_str(), 1);

    REQUIRE(wait_until([&] { return d.process(a.pid).value("tampers", 0) >= 1; }));
    CHECK(log_has(d, "the driver reports it holds more than its cap allows"));
    if (!kill) {
      // Reported, never ended: each raise in its ring is put back by a later scan, so three
      // of them prove three more scans found it over, and it is still alive.
      REQUIRE(wait_until([&] { return limit_of(ra, 0) == 2 * kGiB; }));
      for (int i = 0; i < 3; ++i) {
        ra.h->devices[0].limit.store(3 * kGiB);
        REQUIRE(wait_until([&] { return limit_of(ra, 0) == 2 * kGiB; }));
      }
      CHECK(waitpid(a.pid, nullptr, WNOHANG) == 0);
      // Read now, not waited for: three scans since the first report would have killed it.
      CHECK_FALSE(contains(slurp(d.log), "SIGKILL"));
      continue;
    }
    // Warned at the first scan, ended at the next.
    CHECK(wait_until([&] { return log_has(d, "if it still is at the next scan"); }));
    int status = 0;
    CHECK(wait_until([&] { return waitpid(a.pid, &status, WNOHANG) == a.pid; }));
    CHECK(WIFSIGNALED(status));
    CHECK(WTERMSIG(status) == SIGKILL);
    const int a_pid = a.pid;
    a.pid = -1;
    CHECK(wait_until([&] { return log_has(d, "ended with SIGKILL (enforce = \"kill\")"); }));
    // Recorded with the limit changes, by the daemon.
    CHECK(wait_until([&] {
      const json st = d.state();
      for (const auto& c : st["limit_changes"])
        if (c["outcome"] == "killed" && c["by"] == "daemon" && c["pid"] == a_pid) return true;
      return false;
    }));
  }
}

TEST_CASE("control.gpu_processes_outside_cuwarden_show_as_unmanaged_with_the_drivers_figure") {
  SharedDir dir;
  ::mkdir((dir / "run").c_str(), 0755);
  Child a, outsider;
  FakeRing ra(dir / "run", a.pid, a.start_time());
  ring::DeviceSlot& da = ra.device(0, 0xa0);
  da.used.store(1024 * kMiB);
  // The simulated NVML lists both; only `a` has a ring.
  const std::string nvml_env = std::to_string(a.pid) + "=" + std::to_string(1536 * kMiB) + "," +
                               std::to_string(outsider.pid) + "=" + std::to_string(700 * kMiB);
  setenv("CUWARDEN_FAKE_NVML_PROCESSES", nvml_env.c_str(), 1);
  setenv("CUWARDEN_FAKE_UUIDS", uuid_for(0xa0).c_str(), 1);
  const std::string saved_ld = getenv("LD_LIBRARY_PATH") ? getenv("LD_LIBRARY_PATH") : "";
  setenv("LD_LIBRARY_PATH", (std::string(CUWT_FAKECUDA_DIR) + (saved_ld.empty() ? "" : ":" + saved_ld)).c_str(), 1);
  Daemon d(dir, {}, true, /*nvml=*/true);
  unsetenv("CUWARDEN_FAKE_NVML_PROCESSES");
  unsetenv("CUWARDEN_FAKE_UUIDS");
  if (saved_ld.empty()) unsetenv("LD_LIBRARY_PATH");
  else setenv("LD_LIBRARY_PATH", saved_ld.c_str(), 1);

  json st;
  REQUIRE(wait_until([&] {
    st = d.state();
    return st["unmanaged_processes"].size() == 1;
  }));
  const json u = st["unmanaged_processes"][0];
  CHECK(u["pid"] == outsider.pid);
  CHECK(u["process_name"] == "sleep");
  CHECK(u["driver_used_bytes"] == 700 * kMiB);
  CHECK(u["uuid"] == uuid_for(0xa0));
  CHECK(u["gpu_index"] == 0);

  CmdResult r = cli({"--socket", d.socket});
  INFO(r.out << r.err);
  REQUIRE(r.status == 0);
  bool row = false;
  for (std::size_t pos = 0, nl; (nl = r.out.find('\n', pos)) != std::string::npos; pos = nl + 1) {
    const std::string l = r.out.substr(pos, nl - pos);
    if (contains(l, " " + std::to_string(outsider.pid) + " ")) {
      row = true;
      CHECK(contains(l, "sleep"));
      CHECK(contains(l, "700MiB"));
      CHECK(contains(l, "unmanaged"));
    }
  }
  CHECK(row);

  // With NVML, --query-gpu has the driver's version and its figure of memory in use.
  CHECK(st["driver_version"] == "580.65.06");
  r = cli({"--socket", d.socket, "--query-gpu=index,driver_version,memory.used", "--format=csv,noheader"});
  CHECK(r.out == "0, 580.65.06, " + std::to_string(st["gpus"][0]["driver_used_bytes"].get<uint64_t>() >> 20) + " MiB\n");
}

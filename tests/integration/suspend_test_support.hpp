// cuwarden integration tests: what the suspend tests share (suspend_tests.cpp, by hand;
// room_tests.cpp, by policy). The daemon and the processes share one CUWARDEN_FAKE_DIR: the
// simulated driver's checkpoint channel and its shared device, whose use the simulated NVML
// reports. The processes are fakecuda_ckpt_victim programs under the interposer, spoken to
// line by line, each in a session of its own (as separate jobs are).
#pragma once

#include <fcntl.h>
#include <pwd.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "daemon_test_support.hpp"

extern char** environ;

namespace cuwt {

inline constexpr uint64_t kGiB = 1ULL << 30;

inline bool contains(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

/// A run directory, a fake driver directory and a state directory every user can reach, and
/// the environment the daemon and the processes share: `devices` simulated GPUs of `memory`
/// each.
struct Setup : TempDir {
  std::string run, fake, state;
  std::vector<std::string> env;
  explicit Setup(const std::string& memory = "256M", int devices = 1) {
    ::chmod(path.c_str(), 0755);
    run = *this / "run";
    fake = *this / "fake";
    state = *this / "state";
    ::mkdir(run.c_str(), 01777);
    ::chmod(run.c_str(), 01777);
    ::mkdir(fake.c_str(), 01777);
    ::chmod(fake.c_str(), 01777);
    env = {"LD_LIBRARY_PATH=" + std::string(CUWT_FAKECUDA_DIR), "CUWARDEN_FAKE_DIR=" + fake,
           "CUWARDEN_FAKE_DEVICES=" + std::to_string(devices), "CUWARDEN_FAKE_MEMORY=" + memory,
           "CUWARDEN_RUN_DIR=" + run,
           "CUWARDEN_SOCKET=" + (*this / "d.sock")};
  }
};

/// Set `vars` ("K=V") in this process for the lifetime of the object (the daemon inherits them).
struct ScopedEnv {
  std::vector<std::pair<std::string, std::optional<std::string>>> saved;
  explicit ScopedEnv(const std::vector<std::string>& vars) {
    for (const std::string& kv : vars) {
      const auto eq = kv.find('=');
      const std::string k = kv.substr(0, eq);
      const char* old = getenv(k.c_str());
      saved.emplace_back(k, old ? std::optional<std::string>(old) : std::nullopt);
      setenv(k.c_str(), kv.substr(eq + 1).c_str(), 1);
    }
  }
  ~ScopedEnv() {
    for (auto& [k, v] : saved)
      if (v) setenv(k.c_str(), v->c_str(), 1);
      else unsetenv(k.c_str());
  }
};

/// cuwardend on the setup's directories, with the simulated NVML and driver.
struct SuspendDaemon : Daemon {
  explicit SuspendDaemon(const Setup& s, std::vector<std::string> extra = {})
      : Daemon(s, with(s, std::move(extra)), true, /*nvml=*/true) {}
  static std::vector<std::string> with(const Setup& s, std::vector<std::string> extra) {
    std::vector<std::string> args = {"--state-dir", s.state, "--exited-linger", "0"};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }
};

/// A fakecuda_ckpt_victim under the interposer (unless `preload` is false), as `as` (root only).
class Victim {
 public:
  Victim(const Setup& s, std::vector<std::string> extra_env = {}, bool preload = true, const passwd* as = nullptr)
      : err_path_(s / ("victim-" + std::to_string(counter_++) + ".err")) {
    int to[2], from[2];
    REQUIRE(pipe2(to, O_CLOEXEC) == 0);
    REQUIRE(pipe2(from, O_CLOEXEC) == 0);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, to[0], 0);
    posix_spawn_file_actions_adddup2(&fa, from[1], 1);
    posix_spawn_file_actions_addopen(&fa, 2, err_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    std::vector<std::string> words;
    if (as)
      words = {"/usr/bin/setpriv", "--reuid=" + std::to_string(as->pw_uid), "--regid=" + std::to_string(as->pw_gid),
               "--clear-groups"};
    words.push_back(CUWT_CKPT_VICTIM);
    std::vector<std::string> envs;
    for (char** e = environ; *e; ++e) envs.emplace_back(*e);
    for (const auto& x : s.env) envs.push_back(x);
    if (preload) envs.push_back("LD_PRELOAD=" + std::string(CUWT_LIB));
    for (const auto& x : extra_env) envs.push_back(x);
    std::vector<char*> argv, envp;
    for (auto& w : words) argv.push_back(w.data());
    argv.push_back(nullptr);
    for (auto& w : envs) envp.push_back(w.data());
    envp.push_back(nullptr);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSID);  // not this test's session
    REQUIRE(posix_spawn(&pid_, argv[0], &fa, &attr, argv.data(), envp.data()) == 0);
    posix_spawnattr_destroy(&attr);
    posix_spawn_file_actions_destroy(&fa);
    close(to[0]);
    close(from[1]);
    in_ = fdopen(to[1], "w");
    out_ = fdopen(from[0], "r");
    const std::string first = line();
    INFO(slurp(err_path_));
    REQUIRE(first == "ready " + std::to_string(pid_));
  }
  ~Victim() {
    kill();
    if (in_) std::fclose(in_);
    if (out_) std::fclose(out_);
  }
  Victim(const Victim&) = delete;
  Victim& operator=(const Victim&) = delete;

  uint32_t pid() const { return static_cast<uint32_t>(pid_); }
  void send(const std::string& cmd) {
    std::fprintf(in_, "%s\n", cmd.c_str());
    std::fflush(in_);
  }
  /// The next line it says (blocking; "" at EOF).
  std::string line() {
    char buf[512];
    if (!std::fgets(buf, sizeof buf, out_)) return "";
    std::string s = buf;
    if (!s.empty() && s.back() == '\n') s.pop_back();
    return s;
  }
  std::string ask(const std::string& cmd) {
    send(cmd);
    return line();
  }
  std::string err() const { return slurp(err_path_); }
  void kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

  /// Its calls waiting at the simulated driver's closed gate (tests/fakecuda/src/checkpoint.hpp:
  /// the channel file's blocked_calls word, at byte 44).
  uint32_t blocked_calls(const Setup& s) const {
    const int fd = ::open((s.fake + "/proc-" + std::to_string(pid_)).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    uint32_t v = 0;
    const bool ok = ::pread(fd, &v, sizeof v, 44) == sizeof v;
    ::close(fd);
    return ok ? v : 0;
  }

 private:
  static inline int counter_ = 0;
  std::string err_path_;
  pid_t pid_ = -1;
  FILE* in_ = nullptr;
  FILE* out_ = nullptr;
};

inline CmdResult cli(const Setup& s, std::vector<std::string> args, int timeout_ms = 60000) {
  std::vector<std::string> argv = {CUWT_CLI};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.push_back("--socket");
  argv.push_back(s / "d.sock");
  return run_cmd(argv, {}, timeout_ms);
}

/// The daemon's entry for `pid` once it sees its device in use (the ring is read at a scan).
inline json wait_process(const Daemon& d, uint32_t pid) {
  json p;
  REQUIRE(wait_until([&] {
    p = d.process(pid);
    return !p.is_null() && !p["devices"].empty();
  }));
  return p;
}

/// `v` allocates `bytes` on its current device (the victim's "alloc") and `d` lists it.
inline void holds(const Daemon& d, Victim& v, uint64_t bytes) {
  REQUIRE(contains(v.ask("alloc " + std::to_string(bytes)), "ptr 0x"));
  wait_process(d, v.pid());
}

inline uint64_t driver_used(const Daemon& d) {
  const json st = d.state();
  for (const auto& g : st["gpus"])
    if (g.contains("driver_used_bytes")) return g["driver_used_bytes"].get<uint64_t>();
  return ~0ULL;
}

inline std::vector<std::string> event_kinds(const Daemon& d, uint32_t pid) {
  std::vector<std::string> kinds;
  const json events = d.events({{"pid", pid}});  // kept: a range over a temporary's member dangles
  for (const auto& e : events["events"]) kinds.push_back(e["kind"].get<std::string>());
  return kinds;
}

/// The tests' victim and attacker users (cuwarden-test-victim, cuwarden-test-attacker), made
/// when missing; root only. `victim` stays valid while this object lives.
struct TwoUsers {
  passwd victim{};
  std::string victim_name;
  uid_t attacker_uid = 0, attacker_gid = 0;
  TwoUsers() {
    for (const char* u : {"cuwarden-test-victim", "cuwarden-test-attacker"})
      if (!getpwnam(u))
        REQUIRE(run_cmd({"/usr/sbin/useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", u}).status == 0);
    victim = *getpwnam("cuwarden-test-victim");
    victim_name = victim.pw_name;
    victim.pw_name = victim_name.data();
    const passwd* attacker = getpwnam("cuwarden-test-attacker");
    attacker_uid = attacker->pw_uid;
    attacker_gid = attacker->pw_gid;
  }
  TwoUsers(const TwoUsers&) = delete;
  TwoUsers& operator=(const TwoUsers&) = delete;
};

}  // namespace cuwt

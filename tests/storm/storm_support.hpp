// cuwarden storm tests: spawning storm apps with pipes, reading their reports, and the
// storm's length (CUW_STORM_SECONDS scales every storm; default keeps each under 30 s).
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "daemon_test_support.hpp"

namespace cuws {

using namespace cuwt;

/// Seconds a storm runs: `dflt`, or CUW_STORM_SECONDS when set (longer runs on demand).
inline double storm_seconds(double dflt) {
  const char* v = std::getenv("CUW_STORM_SECONDS");
  return v && *v ? std::atof(v) : dflt;
}

/// One storm app under LD_PRELOAD=libcuwarden.so, stdin/stdout piped.
struct App {
  pid_t pid = -1;
  int in = -1, out = -1;
  std::string buffered;

  App(const std::string& run_dir, int threads, unsigned seed, const std::string& err_path)
      : App({CUWS_APP, std::to_string(threads), std::to_string(seed)},
            {std::string("LD_PRELOAD=") + CUWS_LIB, "CUWARDEN_RUN_DIR=" + run_dir, "CUWARDEN_LIMIT=900MiB",
             "CUWARDEN_FAKE_MEMORY=1G"},
            err_path) {}

  /// Any program, with this environment plus `extra` (NAME=VALUE, overriding). With
  /// `clean` the inherited CUWARDEN_* and LD_PRELOAD are dropped first, so that only `extra`
  /// configures cuwarden. stderr is appended to `err_path`.
  App(std::vector<std::string> argv, const std::vector<std::string>& extra, const std::string& err_path,
      bool clean = false) {
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e) {
      std::string kv = *e;
      bool overridden = clean && (kv.rfind("CUWARDEN_", 0) == 0 || kv.rfind("LD_PRELOAD=", 0) == 0);
      for (const auto& x : extra)
        if (kv.substr(0, kv.find('=') + 1) == x.substr(0, x.find('=') + 1)) overridden = true;
      if (!overridden) env.push_back(kv);
    }
    for (const auto& x : extra) env.push_back(x);
    std::vector<char*> a, ev;
    for (auto& s : argv) a.push_back(s.data());
    a.push_back(nullptr);
    for (auto& s : env) ev.push_back(s.data());
    ev.push_back(nullptr);
    int ip[2], op[2];
    if (pipe2(ip, O_CLOEXEC) != 0 || pipe2(op, O_CLOEXEC) != 0) throw std::runtime_error("pipe");
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, ip[0], 0);
    posix_spawn_file_actions_adddup2(&fa, op[1], 1);
    posix_spawn_file_actions_addopen(&fa, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (posix_spawn(&pid, a[0], &fa, nullptr, a.data(), ev.data()) != 0) throw std::runtime_error("spawn app");
    posix_spawn_file_actions_destroy(&fa);
    ::close(ip[0]);
    ::close(op[1]);
    in = ip[1];
    out = op[0];
  }
  ~App() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
    if (in >= 0) ::close(in);
    if (out >= 0) ::close(out);
  }
  App(const App&) = delete;
  App& operator=(const App&) = delete;

  /// The next line of stdout, or "" after timeout_ms / EOF.
  std::string line(int timeout_ms = 10000) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
      if (auto nl = buffered.find('\n'); nl != std::string::npos) {
        std::string l = buffered.substr(0, nl);
        buffered.erase(0, nl + 1);
        return l;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
      if (left.count() <= 0) return "";
      pollfd p{out, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) return "";
      char buf[512];
      const ssize_t n = ::read(out, buf, sizeof buf);
      if (n <= 0) return "";
      buffered.append(buf, static_cast<size_t>(n));
    }
  }
  bool send(char c) { return ::write(in, &c, 1) == 1; }

  /// Exit status after a clean exit within `timeout_ms` (128 + signal if killed), or -1
  /// (then the destructor kills it).
  int wait_exit(int timeout_ms) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    int status = 0;
    while (std::chrono::steady_clock::now() < until) {
      if (waitpid(pid, &status, WNOHANG) == pid) {
        pid = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return -1;
  }

  /// "paused used=.. live=.." -> {"used": .., ...}
  static std::map<std::string, uint64_t> fields(const std::string& l) {
    std::map<std::string, uint64_t> m;
    std::istringstream is(l);
    std::string tok;
    while (is >> tok)
      if (auto eq = tok.find('='); eq != std::string::npos) m[tok.substr(0, eq)] = std::stoull(tok.substr(eq + 1));
    return m;
  }
  std::map<std::string, uint64_t> pause() {
    send('p');
    const std::string l = line();
    if (l.rfind("paused", 0) != 0) throw std::runtime_error("app did not pause: '" + l + "'");
    return fields(l);
  }
  void resume() {
    send('r');
    if (line() != "resumed") throw std::runtime_error("app did not resume");
  }
  /// Close stdin, read "done ...", reap. Returns the fields plus "status".
  std::map<std::string, uint64_t> finish() {
    ::close(in);
    in = -1;
    std::string l;
    do l = line(20000);
    while (!l.empty() && l.rfind("done", 0) != 0);
    auto m = fields(l);
    int st = 0;
    waitpid(pid, &st, 0);
    pid = -1;
    m["status"] = WIFEXITED(st) ? static_cast<uint64_t>(WEXITSTATUS(st)) : 128 + static_cast<uint64_t>(WTERMSIG(st));
    m["done"] = l.empty() ? 0 : 1;
    return m;
  }
};

/// Entries of `dir` other than "." and "..".
inline std::vector<std::string> dir_entries(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d))
      if (std::string(e->d_name) != "." && std::string(e->d_name) != "..") out.emplace_back(e->d_name);
    ::closedir(d);
  }
  return out;
}

/// Entries of a run directory that a process or job left: all but the jobs/ folder of
/// per-user job directories, which stays (a root daemon makes it).
inline std::vector<std::string> leftovers(const std::string& run_dir) {
  std::vector<std::string> out;
  for (auto& e : dir_entries(run_dir))
    if (e != "jobs") out.push_back(std::move(e));
  return out;
}

/// cuwardend's argv as the Daemon fixture builds it, for restarts by hand.
inline std::vector<std::string> daemon_argv(const Daemon& d, const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {CUWT_DAEMON, "--run-dir", d.run_dir, "--socket", d.socket,
                                   "--no-nvml", "--log-level", "debug"};
  for (const auto& x : extra) argv.push_back(x);
  return argv;
}

}  // namespace cuws

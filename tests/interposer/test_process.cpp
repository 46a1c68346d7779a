// Interposer tests at the level of a whole process: bad configuration, harmlessness in
// programs that never use CUDA, the ring's life cycle, the daemon started after the
// process, and `cuwarden --json`.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cuw/ring.hpp"
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace {

struct Child {
  pid_t pid = -1;
  int in = -1;   // write end of the child's stdin
  int out = -1;  // read end of the child's stdout+stderr
};

/// Start argv with the current environment plus `extra` (NAME=VALUE, overriding).
Child spawn(const std::vector<std::string>& argv, const std::vector<std::string>& extra) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    std::string kv(*e);
    bool overridden = false;
    for (const auto& x : extra)
      if (kv.substr(0, kv.find('=') + 1) == x.substr(0, x.find('=') + 1)) overridden = true;
    if (!overridden) env.push_back(kv);
  }
  for (const auto& x : extra) env.push_back(x);
  std::vector<char*> envp, args;
  for (auto& s : env) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> a = argv;
  for (auto& s : a) args.push_back(s.data());
  args.push_back(nullptr);
  int inp[2], outp[2];
  REQUIRE(::pipe2(inp, O_CLOEXEC) == 0);
  REQUIRE(::pipe2(outp, O_CLOEXEC) == 0);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, inp[0], 0);
  posix_spawn_file_actions_adddup2(&fa, outp[1], 1);
  posix_spawn_file_actions_adddup2(&fa, outp[1], 2);
  Child c;
  REQUIRE(posix_spawn(&c.pid, args[0], &fa, nullptr, args.data(), envp.data()) == 0);
  posix_spawn_file_actions_destroy(&fa);
  ::close(inp[0]);
  ::close(outp[1]);
  c.in = inp[1];
  c.out = outp[0];
  return c;
}

std::string read_line(int fd) {
  std::string s;
  char ch;
  while (::read(fd, &ch, 1) == 1 && ch != '\n') s += ch;
  return s;
}

/// Wait for the child, returning its exit status (or 128+signal) and all its output.
int finish(Child& c, std::string* output) {
  if (c.in >= 0) ::close(c.in);
  c.in = -1;
  std::string all;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(c.out, buf, sizeof buf)) > 0) all.append(buf, static_cast<size_t>(n));
  ::close(c.out);
  int st = 0;
  ::waitpid(c.pid, &st, 0);
  if (output) *output = all;
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

int run(const std::vector<std::string>& argv, const std::vector<std::string>& extra, std::string* output) {
  Child c = spawn(argv, extra);
  return finish(c, output);
}

std::string make_run_dir() {
  char tmpl[] = "/tmp/cuw-itest-XXXXXX";
  REQUIRE(::mkdtemp(tmpl));
  return tmpl;
}

std::vector<std::string> ring_files(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d))
      if (std::strncmp(e->d_name, "ring-", 5) == 0) out.emplace_back(e->d_name);
    ::closedir(d);
  }
  return out;
}

const std::string kProbe = CUW_PROBE;
const std::string kLib = "LD_PRELOAD=" CUW_LIB;

}  // namespace

TEST_CASE("a malformed CUWARDEN_LIMIT is one clear line and exit status 78", "[process][config]") {
  const std::string dir = make_run_dir();
  for (const char* bad : {"8X", "-1G", "0=1G,0=2G", "lots"}) {
    std::string out;
    const int st = run({kProbe, "alloc", "1"}, {kLib, "CUWARDEN_RUN_DIR=" + dir, std::string("CUWARDEN_LIMIT=") + bad}, &out);
    INFO("CUWARDEN_LIMIT=" << bad << " -> " << out);
    CHECK(st == 78);
    CHECK_THAT(out, Catch::Contains("CUWARDEN_LIMIT='" + std::string(bad) + "'"));
    CHECK(std::count(out.begin(), out.end(), '\n') == 1);
  }
  std::string out;
  CHECK(run({kProbe, "alloc", "1"}, {kLib, "CUWARDEN_RUN_DIR=" + dir, "CUWARDEN_POOL=fast"}, &out) == 78);
  CHECK_THAT(out, Catch::Contains("CUWARDEN_POOL"));
  CHECK(run({kProbe, "alloc", "1"}, {kLib, "CUWARDEN_RUN_DIR=" + dir, "CUWARDEN_CLOCK=tsc"}, &out) == 78);
  CHECK_THAT(out, Catch::Contains("CUWARDEN_CLOCK='tsc': expected 'coarse', 'fine' or 'syscall'"));
  for (const char* mode : {"coarse", "fine", "auto", "syscall"}) {
    INFO("CUWARDEN_CLOCK=" << mode);
    CHECK(run({kProbe, "alloc", "1"}, {kLib, "CUWARDEN_RUN_DIR=" + dir, std::string("CUWARDEN_CLOCK=") + mode}, &out) ==
          0);
  }
}

TEST_CASE("bad job settings are one clear line and exit status 78", "[process][config][job]") {
  const std::string dir = make_run_dir();
  struct Case {
    std::vector<std::string> env;
    std::string says;
  };
  const std::vector<Case> cases = {
      {{"CUWARDEN_JOB=train", "CUWARDEN_JOB_LIMIT=50%"}, "not a share of a device"},
      {{"CUWARDEN_JOB=train", "CUWARDEN_JOB_LIMIT=8X"}, "CUWARDEN_JOB_LIMIT='8X'"},
      {{"CUWARDEN_JOB_LIMIT=1G"}, "needs CUWARDEN_JOB"},
      {{"CUWARDEN_JOB=a/b"}, "CUWARDEN_JOB='a/b'"},
  };
  for (const auto& c : cases) {
    std::vector<std::string> env = {kLib, "CUWARDEN_RUN_DIR=" + dir};
    env.insert(env.end(), c.env.begin(), c.env.end());
    std::string out;
    const int st = run({kProbe, "alloc", "1"}, env, &out);
    INFO(out);
    CHECK(st == 78);
    CHECK_THAT(out, Catch::Contains(c.says));
    CHECK(std::count(out.begin(), out.end(), '\n') == 1);
  }
  // A job file someone else could read or write is not used, even in the user's own job
  // directory.
  const std::string jobs = dir + "/jobs", own = jobs + "/" + std::to_string(geteuid());
  ::mkdir(jobs.c_str(), 0755);
  REQUIRE(::mkdir(own.c_str(), 0700) == 0);
  const std::string file = own + "/job-" + std::to_string(geteuid()) + "-shared.cwj";
  const int fd = ::open(file.c_str(), O_CREAT | O_RDWR, 0666);
  ::fchmod(fd, 0666);
  ::close(fd);
  std::string out;
  CHECK(run({kProbe, "alloc", "1"}, {kLib, "CUWARDEN_RUN_DIR=" + dir, "CUWARDEN_JOB=shared"}, &out) == 78);
  CHECK_THAT(out, Catch::Contains("refusing to use it"));
}

TEST_CASE("in a job, cuMemGetInfo reports the job's cap and what its members left free", "[process][job]") {
  const std::string dir = make_run_dir();
  const std::vector<std::string> job = {kLib, "CUWARDEN_RUN_DIR=" + dir, "CUWARDEN_JOB=mi", "CUWARDEN_JOB_LIMIT=100M"};
  Child holder = spawn({kProbe, "hold", "60"}, job);
  REQUIRE(read_line(holder.out) == "ready");
  std::string out;
  CHECK(run({kProbe, "meminfo", "10"}, job, &out) == 0);
  CHECK(out == "free " + std::to_string(30 << 20) + " total " + std::to_string(100 << 20) + "\n");
  // Its own lower cap wins where it is lower.
  auto own = job;
  own.push_back("CUWARDEN_LIMIT=20M");
  CHECK(run({kProbe, "meminfo", "10"}, own, &out) == 0);
  CHECK(out == "free " + std::to_string(10 << 20) + " total " + std::to_string(20 << 20) + "\n");
  // Over the job's cap: refused although the process has no cap of its own.
  CHECK(run({kProbe, "alloc", "41"}, job, &out) == 2);
  CHECK(finish(holder, nullptr) == 0);
}

TEST_CASE("CUWARDEN_ON_ERROR=open warns and runs uncapped", "[process][config]") {
  const std::string dir = make_run_dir();
  std::string out;
  const int st = run({kProbe, "alloc", "64"},
                     {kLib, "CUWARDEN_RUN_DIR=" + dir, "CUWARDEN_LIMIT=1Q", "CUWARDEN_ON_ERROR=open"}, &out);
  INFO(out);
  CHECK(st == 0);
  CHECK_THAT(out, Catch::Contains("warning") && Catch::Contains("CUWARDEN_LIMIT") && Catch::Contains("ok"));
}

TEST_CASE("the cap refuses a whole process's allocation; without the library it succeeds", "[process]") {
  const std::string dir = make_run_dir();
  std::string out;
  CHECK(run({kProbe, "alloc", "64"}, {kLib, "CUWARDEN_RUN_DIR=" + dir, "CUWARDEN_LIMIT=32M"}, &out) == 2);
  CHECK_THAT(out, Catch::Contains("refused"));
  CHECK(run({kProbe, "alloc", "64"}, {"CUWARDEN_RUN_DIR=" + dir, "CUWARDEN_LIMIT=32M"}, &out) == 0);
}

/// A file holding `text` in `dir`; its path.
std::string write_file(const std::string& dir, const std::string& name, const std::string& text) {
  const std::string path = dir + "/" + name;
  std::ofstream(path) << text;
  return path;
}

TEST_CASE("a cap from the config file alone is enforced to the byte; the environment may only lower it",
          "[process][config]") {
  const std::string dir = make_run_dir();
  const std::string conf = write_file(dir, "process.conf", "# per-container caps\nCUWARDEN_LIMIT=64M\n");
  const std::vector<std::string> env = {kLib, "CUWARDEN_RUN_DIR=" + dir, "CUWARDEN_CONFIG=" + conf};
  std::string out;
  CHECK(run({kProbe, "bytes", std::to_string(64ULL << 20)}, env, &out) == 0);
  INFO(out);
  CHECK(run({kProbe, "bytes", std::to_string((64ULL << 20) + 1)}, env, &out) == 2);
  CHECK_THAT(out, Catch::Contains("refused"));
  // The file's cap is the site's ceiling: a raise in the environment is refused, said once
  // with the site's value, and the file's cap holds.
  auto with = env;
  with.push_back("CUWARDEN_LIMIT=128M");
  CHECK(run({kProbe, "bytes", std::to_string((64ULL << 20) + 1)}, with, &out) == 2);
  const std::string note = "cuwarden: CUWARDEN_LIMIT='128M' is refused: " + conf +
                           " line 2 sets '64M', a ceiling the environment may only lower; the lower applies\n";
  CHECK_THAT(out, Catch::Contains(note));
  CHECK(out.find(note) == out.rfind(note));
  CHECK(run({kProbe, "bytes", std::to_string(64ULL << 20)}, with, &out) == 0);
  // A lower one is the environment's to give, without a word.
  with.back() = "CUWARDEN_LIMIT=32M";
  CHECK(run({kProbe, "bytes", std::to_string(32ULL << 20)}, with, &out) == 0);
  CHECK_THAT(out, !Catch::Contains("refused:"));
  CHECK(run({kProbe, "bytes", std::to_string((32ULL << 20) + 1)}, with, &out) == 2);
  // `off` ignores the file.
  CHECK(run({kProbe, "alloc", "256"}, {kLib, "CUWARDEN_RUN_DIR=" + dir, "CUWARDEN_CONFIG=off"}, &out) == 0);
}

/// `run`/ceilings/slurm-<job> holding `text`, the directory 0755 and the file 0644 (the
/// Slurm plugin's, when the caller is root); the file's path.
std::string write_ceiling(const std::string& run, uint32_t job, const std::string& text) {
  REQUIRE(::chmod(run.c_str(), 0755) == 0);
  const std::string dir = run + "/ceilings";
  REQUIRE(::mkdir(dir.c_str(), 0755) == 0);
  REQUIRE(::chmod(dir.c_str(), 0755) == 0);
  const std::string path = write_file(dir, "slurm-" + std::to_string(job), text);
  REQUIRE(::chmod(path.c_str(), 0644) == 0);
  return path;
}

TEST_CASE("a Slurm job's ceiling file, root's, holds the environment's cap", "[process][config][root]") {
  if (::geteuid() != 0) {
    SUCCEED("SKIPPED: needs root (a ceiling file owned by root)");
    std::puts("SKIPPED: needs root (a ceiling file owned by root)");
    return;
  }
  const std::string dir = make_run_dir();
  const std::string file = write_ceiling(dir, 4242, "CUWARDEN_LIMIT=64M\n");
  const std::vector<std::string> env = {kLib, "CUWARDEN_RUN_DIR=" + dir, "CUWARDEN_CONFIG=off",
                                        "CUWARDEN_JOB=slurm-4242"};
  std::string out;
  // A child that raises the cap the plugin set: refused, said once, the ceiling holds.
  auto raised = env;
  raised.push_back("CUWARDEN_LIMIT=128M");
  CHECK(run({kProbe, "bytes", std::to_string((64ULL << 20) + 1)}, raised, &out) == 2);
  INFO(out);
  const std::string note = "cuwarden: CUWARDEN_LIMIT='128M' is refused: this Slurm job's ceiling " + file +
                           " sets '64M', a ceiling the environment may only lower; the lower applies\n";
  CHECK_THAT(out, Catch::Contains(note));
  CHECK(out.find(note) == out.rfind(note));
  CHECK(run({kProbe, "bytes", std::to_string(64ULL << 20)}, raised, &out) == 0);
  // One that drops it altogether: the ceiling still holds.
  CHECK(run({kProbe, "bytes", std::to_string((64ULL << 20) + 1)}, env, &out) == 2);
  CHECK_THAT(out, Catch::Contains("CUWARDEN_LIMIT is unset: this Slurm job's ceiling " + file + " sets '64M'"));
  // Lower is the task's own choice.
  auto lowered = env;
  lowered.push_back("CUWARDEN_LIMIT=32M");
  CHECK(run({kProbe, "bytes", std::to_string((32ULL << 20) + 1)}, lowered, &out) == 2);
  CHECK_THAT(out, !Catch::Contains("refused:"));
}

TEST_CASE("a Slurm ceiling file that is not root's is ignored and said once", "[process][config]") {
  const std::string dir = make_run_dir();
  const std::string file = write_ceiling(dir, 4243, "CUWARDEN_LIMIT=64M\n");
  // As root, the file is given to nobody; otherwise it (and its directory) is the caller's.
  if (::geteuid() == 0) REQUIRE(::chown(file.c_str(), 65534, 65534) == 0);
  const std::vector<std::string> env = {kLib, "CUWARDEN_RUN_DIR=" + dir, "CUWARDEN_CONFIG=off",
                                        "CUWARDEN_JOB=slurm-4243", "CUWARDEN_LIMIT=128M"};
  std::string out;
  CHECK(run({kProbe, "bytes", std::to_string(128ULL << 20)}, env, &out) == 0);
  INFO(out);
  const std::string owner = ::geteuid() == 0 ? file + " belongs to uid 65534" : dir + "/ceilings belongs to uid ";
  CHECK_THAT(out, Catch::Contains("cuwarden: " + owner));
  CHECK_THAT(out, Catch::Contains(", not root; not a ceiling, ignored\n"));
  const std::string tail = "not a ceiling, ignored";
  CHECK(out.find(tail) == out.rfind(tail));
  CHECK(run({kProbe, "bytes", std::to_string((128ULL << 20) + 1)}, env, &out) == 2);
}

TEST_CASE("a bad config file is one clear line and exit status 78", "[process][config]") {
  const std::string dir = make_run_dir();
  const std::string conf = write_file(dir, "bad.conf", "CUWARDEN_LIMIT=lots\n");
  std::string out;
  CHECK(run({kProbe, "alloc", "1"}, {kLib, "CUWARDEN_RUN_DIR=" + dir, "CUWARDEN_CONFIG=" + conf}, &out) == 78);
  INFO(out);
  CHECK_THAT(out, Catch::Contains("CUWARDEN_LIMIT='lots' (" + conf + " line 1): "));
  CHECK(std::count(out.begin(), out.end(), '\n') == 1);
  CHECK(run({kProbe, "alloc", "1"}, {kLib, "CUWARDEN_RUN_DIR=" + dir, "CUWARDEN_CONFIG=" + dir + "/none"}, &out) ==
        78);
  CHECK_THAT(out, Catch::Contains("CUWARDEN_CONFIG='" + dir + "/none': cannot open: No such file or directory"));
  // A program that never touches CUDA never reads it.
  CHECK(run({kProbe, "nocuda"}, {kLib, "CUWARDEN_RUN_DIR=" + dir, "CUWARDEN_CONFIG=" + dir + "/none"}, &out) == 0);
}

TEST_CASE("preloaded into a process that never uses CUDA: no thread, no file", "[process][harmless]") {
  const std::string dir = make_run_dir() + "/run";  // does not exist yet
  std::string out;
  REQUIRE(run({kProbe, "nocuda"}, {kLib, "CUWARDEN_RUN_DIR=" + dir, "CUWARDEN_LIMIT=1G"}, &out) == 0);
  CHECK(out == "threads 1\n");
  CHECK(::access(dir.c_str(), F_OK) != 0);  // not even the run directory was created
  // A bad cap does not break programs that never touch CUDA.
  REQUIRE(run({kProbe, "nocuda"}, {kLib, "CUWARDEN_RUN_DIR=" + dir, "CUWARDEN_LIMIT=bad"}, &out) == 0);
  // And a shell works under it.
  REQUIRE(run({"/bin/sh", "-c", "echo hi"}, {kLib, "CUWARDEN_RUN_DIR=" + dir}, &out) == 0);
  CHECK(out == "hi\n");
}

TEST_CASE("with no daemon the ring is removed at exit; while running it is there", "[process]") {
  const std::string dir = make_run_dir();
  Child c = spawn({kProbe, "hold", "8"}, {kLib, "CUWARDEN_RUN_DIR=" + dir, "CUWARDEN_LIMIT=1G"});
  REQUIRE(read_line(c.out) == "ready");
  auto files = ring_files(dir);
  REQUIRE(files.size() == 1);
  CHECK_THAT(files[0], Catch::StartsWith("ring-" + std::to_string(c.pid) + "-"));
  struct stat st {};
  REQUIRE(::stat((dir + "/" + files[0]).c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);  // its header holds the command line: the owner's alone
  REQUIRE(::stat(dir.c_str(), &st) == 0);
  REQUIRE(finish(c, nullptr) == 0);
  CHECK(ring_files(dir).empty());
}

TEST_CASE("a ring left by a killed process, with no daemon, is removed by the next process", "[process]") {
  const std::string dir = make_run_dir();
  const std::vector<std::string> env = {kLib, "CUWARDEN_RUN_DIR=" + dir, "CUWARDEN_LIMIT=1G"};
  Child killed = spawn({kProbe, "hold", "8"}, env);
  REQUIRE(read_line(killed.out) == "ready");
  Child alive = spawn({kProbe, "hold", "8"}, env);
  REQUIRE(read_line(alive.out) == "ready");
  ::kill(killed.pid, SIGKILL);
  CHECK(finish(killed, nullptr) == 128 + SIGKILL);
  REQUIRE(ring_files(dir).size() == 2);  // nothing removes the killed one's ring by itself
  std::string out;
  REQUIRE(run({kProbe, "alloc", "8"}, env, &out) == 0);
  const auto left = ring_files(dir);
  REQUIRE(left.size() == 1);  // the killed process's ring is gone, the live one's is there
  CHECK_THAT(left[0], Catch::StartsWith("ring-" + std::to_string(alive.pid) + "-"));
  REQUIRE(finish(alive, nullptr) == 0);
  CHECK(ring_files(dir).empty());
}

TEST_CASE("a program refused in a tight loop gets one paragraph and then a count at most once a second", "[process]") {
  const std::string dir = make_run_dir();
  std::string out;
  const auto t0 = std::chrono::steady_clock::now();
  // 2 ms apart: at least 2 s of refusals, so that the count is told during the loop too.
  REQUIRE(run({kProbe, "refuse", "64", "1000", "2000"}, {kLib, "CUWARDEN_RUN_DIR=" + dir, "CUWARDEN_LIMIT=16M"}, &out) ==
          0);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO(out.size() << " bytes of output in " << seconds << " s:\n" << out.substr(0, 4000));
  CHECK(out.find("refused 1000\n") != std::string::npos);
  std::size_t paragraphs = 0, counts = 0, told = 0;
  for (std::size_t at = out.find("out of memory on GPU"); at != std::string::npos;
       at = out.find("out of memory on GPU", at + 1))
    ++paragraphs;
  const std::string more = "cuwarden: ";
  for (std::size_t at = out.find(" refused since the last report"); at != std::string::npos;
       at = out.find(" refused since the last report", at + 1)) {
    ++counts;
    const std::size_t line = out.rfind('\n', at);
    told += std::strtoull(out.c_str() + (line == std::string::npos ? 0 : line + 1) + more.size(), nullptr, 10);
  }
  CHECK(paragraphs == 1);
  // One line a second at most, and one at exit; together they count every other refusal.
  CHECK(counts >= 2);
  CHECK(counts <= static_cast<std::size_t>(seconds) + 2);
  CHECK(told == 999);
}

TEST_CASE("the refusal's paragraph says PyTorch will not retry when its cache is off", "[process]") {
  const std::string dir = make_run_dir();
  // Empty: not the "1" that turns PyTorch's cache off, whatever the test's own environment has.
  const std::vector<std::string> env = {kLib, "CUWARDEN_RUN_DIR=" + dir, "CUWARDEN_LIMIT=16M",
                                        "PYTORCH_NO_CUDA_MEMORY_CACHING="};
  std::string cached, uncached;
  REQUIRE(run({kProbe, "refuse", "64", "1", "0"}, env, &cached) == 0);
  std::vector<std::string> off = env;
  off.back() = "PYTORCH_NO_CUDA_MEMORY_CACHING=1";
  REQUIRE(run({kProbe, "refuse", "64", "1", "0"}, off, &uncached) == 0);
  INFO("cache on:\n" << cached << "\ncache off:\n" << uncached);
  CHECK(cached.find("The program may recover (frameworks free their caches and retry)") != std::string::npos);
  CHECK(uncached.find("PyTorch's cache is off (PYTORCH_NO_CUDA_MEMORY_CACHING=1): it raises this as a CUDA error and "
                      "does not retry") != std::string::npos);
  CHECK(uncached.find("may recover") == std::string::npos);
}

TEST_CASE("CUWARDEN_LOG_FILE gets every line, each with its time and process", "[process][log]") {
  const std::string dir = make_run_dir();
  const std::string file = dir + "/interposer.log";
  std::string out;
  // Lookups before the first allocation log before the configuration is read: they too
  // belong in the file.
  REQUIRE(run({kProbe, "lookup", "8"}, {kLib, "CUWARDEN_RUN_DIR=" + dir, "CUWARDEN_LOG=debug", "CUWARDEN_LOG_FILE=" + file},
              &out) == 0);
  CHECK(out == "ok\n");  // nothing of cuwarden's on stdout or stderr
  std::ifstream f(file);
  std::string line;
  int lines = 0, lookups = 0;
  while (std::getline(f, line)) {
    ++lines;
    INFO(line);
    // 2026-12-01T15:36:38.512Z [3729] cuwarden: ...
    CHECK(line.size() > 32);
    CHECK(line[4] == '-');
    CHECK(line[10] == 'T');
    CHECK(line[23] == 'Z');
    CHECK(line.find("] cuwarden: ") != std::string::npos);
    CHECK(line.find(" [") == 24);
    if (line.find("cuGetProcAddress(") != std::string::npos) ++lookups;
  }
  CHECK(lookups == 3);  // the three hooked ones (cuCtxGetDevice passes through unlogged)
  CHECK(lines > lookups);  // and what came after the configuration was read
}

TEST_CASE("a forked child gets its own ring; an exec'd child is interposed too", "[process][fork]") {
  const std::string dir = make_run_dir();
  Child c = spawn({kProbe, "fork", "8"}, {kLib, "CUWARDEN_RUN_DIR=" + dir, "CUWARDEN_LIMIT=1G"});
  std::string a = read_line(c.out), b = read_line(c.out);
  REQUIRE_THAT(a, Catch::StartsWith("ready "));
  REQUIRE_THAT(b, Catch::StartsWith("ready "));
  auto files = ring_files(dir);
  REQUIRE(files.size() == 2);  // parent and child, each its own
  // Each ring holds only its own process's bytes: 8 MiB in the parent, 4 MiB in the child.
  std::vector<uint64_t> used;
  for (const auto& f : files) {
    const int fd = ::open((dir + "/" + f).c_str(), O_RDONLY | O_CLOEXEC);
    REQUIRE(fd >= 0);
    alignas(cuw::ring::RingHeader) uint64_t buf[2048];  // read as a RingHeader below
    // DeviceSlot 0's `used` is at a fixed offset; read it through the shared layout.
    REQUIRE(::pread(fd, buf, sizeof buf, 0) == static_cast<ssize_t>(sizeof buf));
    ::close(fd);
    const auto* h = reinterpret_cast<const cuw::ring::RingHeader*>(buf);
    used.push_back(h->devices[0].used.load());
  }
  std::sort(used.begin(), used.end());
  CHECK(used == std::vector<uint64_t>{4ULL << 20, 8ULL << 20});
  CHECK(finish(c, nullptr) == 0);

  // exec: a shell started under the library runs the probe, which is interposed (refused).
  std::string out;
  CHECK(run({"/bin/sh", "-c", kProbe + " alloc 64"}, {kLib, "CUWARDEN_RUN_DIR=" + dir, "CUWARDEN_LIMIT=32M"}, &out) == 2);
  CHECK_THAT(out, Catch::Contains("refused"));
}

TEST_CASE("a daemon started after the process shows it exactly; cuwarden --json", "[process][daemon]") {
  const std::string dir = make_run_dir();
  const std::string sock = dir + "/cuwardend.sock";
  Child app = spawn({kProbe, "hold", "48"}, {kLib, "CUWARDEN_RUN_DIR=" + dir, "CUWARDEN_LIMIT=1G"});
  REQUIRE(read_line(app.out) == "ready");

  Child daemon = spawn({CUW_DAEMON, "--run-dir", dir, "--socket", sock}, {});
  nlohmann::json state;
  bool seen = false;
  for (int i = 0; i < 100 && !seen; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::string out;
    if (run({CUW_CLI, "--socket", sock, "--json"}, {}, &out) != 0) continue;
    state = nlohmann::json::parse(out, nullptr, false);
    if (state.is_discarded()) continue;
    for (auto& p : state["processes"])
      if (p["pid"] == app.pid) seen = true;
  }
  REQUIRE(seen);
  nlohmann::json proc;
  for (auto& p : state["processes"])
    if (p["pid"] == app.pid) proc = p;
  CHECK(proc["state"] == "running");
  CHECK(proc["process_name"] == "cuw_itest_probe");
  REQUIRE(proc["devices"].size() >= 1);
  auto dev0 = proc["devices"][0];
  CHECK(dev0["ordinal"] == 0);
  CHECK(dev0["used_bytes"] == 48ULL << 20);
  CHECK(dev0["peak_bytes"] == 48ULL << 20);
  CHECK(dev0["limit_bytes"] == 1ULL << 30);
  CHECK(dev0["allocations"] == 1);
  CHECK_THAT(dev0["uuid"].get<std::string>(), Catch::StartsWith("GPU-"));

  // The table for people shows the process with its used and cap.
  std::string table;
  REQUIRE(run({CUW_CLI, "--socket", sock}, {}, &table) == 0);
  CHECK_THAT(table, Catch::Contains(std::to_string(app.pid)) && Catch::Contains("48MiB") && Catch::Contains("1024MiB"));

  REQUIRE(finish(app, nullptr) == 0);
  ::kill(daemon.pid, SIGTERM);
  CHECK(finish(daemon, nullptr) == 0);
}

TEST_CASE("CUWARDEN_POOL=cache: the daemon and the CLI show in use vs reserved", "[process][daemon][cache]") {
  const std::string dir = make_run_dir();
  const std::string sock = dir + "/cuwardend.sock";
  // 47 MiB: a whole block of 48 MiB (2 MiB rounding) held from the driver.
  Child app = spawn({kProbe, "hold", "47"},
                    {kLib, "CUWARDEN_RUN_DIR=" + dir, "CUWARDEN_LIMIT=1G", "CUWARDEN_POOL=cache"});
  REQUIRE(read_line(app.out) == "ready");
  Child daemon = spawn({CUW_DAEMON, "--run-dir", dir, "--socket", sock}, {});
  nlohmann::json proc;
  for (int i = 0; i < 100 && proc.is_null(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::string out;
    if (run({CUW_CLI, "--socket", sock, "--json"}, {}, &out) != 0) continue;
    auto state = nlohmann::json::parse(out, nullptr, false);
    if (state.is_discarded()) continue;
    for (auto& p : state["processes"])
      if (p["pid"] == app.pid) proc = p;
  }
  REQUIRE(!proc.is_null());
  CHECK(proc["pool"] == "cache");
  auto dev0 = proc["devices"][0];
  CHECK(dev0["used_bytes"] == 48ULL << 20);      // counted against the cap: what the cache holds
  CHECK(dev0["reserved_bytes"] == 48ULL << 20);
  CHECK(dev0["in_use_bytes"] == 48ULL << 20);    // all of it is the program's block
  CHECK(dev0["cached_bytes"] == 0);
  CHECK(dev0["allocations"] == 1);
  std::string table;
  REQUIRE(run({CUW_CLI, "--socket", sock}, {}, &table) == 0);
  CHECK_THAT(table, Catch::Contains("In use") && Catch::Contains("48MiB"));
  // A pooling process adds one column (In use), and the table stays as wide as its GPU box
  // (it was 114 columns with In use, Reserved and Allocs).
  std::size_t widest = 0;
  for (std::size_t pos = 0; pos < table.size();) {
    const std::size_t nl = table.find('\n', pos);
    widest = std::max(widest, (nl == std::string::npos ? table.size() : nl) - pos);
    pos = nl == std::string::npos ? table.size() : nl + 1;
  }
  INFO(table);
  CHECK(widest <= 100);
  std::string csv;
  REQUIRE(run({CUW_CLI, "--socket", sock, "--query-compute-apps=pid,in_use_memory,cached_memory,reserved_memory",
               "--format=csv,noheader,nounits"},
              {}, &csv) == 0);
  CHECK_THAT(csv, Catch::Contains(std::to_string(app.pid) + ", 48, 0, 48"));
  REQUIRE(finish(app, nullptr) == 0);
  ::kill(daemon.pid, SIGTERM);
  CHECK(finish(daemon, nullptr) == 0);
}

TEST_CASE("cuwarden says plainly when no daemon runs", "[process][daemon]") {
  const std::string dir = make_run_dir();
  std::string out;
  CHECK(run({CUW_CLI, "--socket", dir + "/cuwardend.sock"}, {}, &out) == 1);
  CHECK_THAT(out, Catch::Contains("no daemon"));
}

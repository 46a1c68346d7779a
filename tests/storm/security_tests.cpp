// cuwarden security checks on the daemon: the run directory's mode and type, the socket's
// mode and no symlink followed, and rings that claim another user's process.
#include <grp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <memory>
#include <string>

#include "storm_support.hpp"

using namespace cuws;

namespace {
bool find_proc_none(const json& st, pid_t pid) {
  for (const auto& p : st["processes"])
    if (p["pid"] == static_cast<uint32_t>(pid)) return false;
  return true;
}
}  // namespace

TEST_CASE("security.run_dir_is_created_sticky_and_world_writable_socket_0666") {
  TempDir dir;
  const mode_t old = umask(077);  // a strict umask must not leak into what the daemon creates
  Daemon d(dir);
  umask(old);
  struct stat st{};
  REQUIRE(::lstat(d.run_dir.c_str(), &st) == 0);
  CHECK(S_ISDIR(st.st_mode));
  CHECK((st.st_mode & 07777) == 01777);
  REQUIRE(::lstat(d.socket.c_str(), &st) == 0);
  CHECK(S_ISSOCK(st.st_mode));
  CHECK((st.st_mode & 0777) == 0666);
}

TEST_CASE("security.run_dir_that_is_a_symlink_or_unsticky_world_writable_is_refused") {
  TempDir dir;
  const std::string real = dir / "real", link = dir / "run";
  REQUIRE(::mkdir(real.c_str(), 0755) == 0);
  REQUIRE(::symlink(real.c_str(), link.c_str()) == 0);
  auto r = run_cmd({CUWT_DAEMON, "--run-dir", link, "--socket", dir / "s.sock", "--no-nvml"}, {}, 5000);
  CHECK(r.status == 1);
  CHECK(r.err.find("symbolic link") != std::string::npos);

  const std::string open_dir = dir / "open";
  REQUIRE(::mkdir(open_dir.c_str(), 0755) == 0);
  REQUIRE(::chmod(open_dir.c_str(), 0777) == 0);
  r = run_cmd({CUWT_DAEMON, "--run-dir", open_dir, "--socket", dir / "s.sock", "--no-nvml"}, {}, 5000);
  CHECK(r.status == 1);
  CHECK(r.err.find("not sticky") != std::string::npos);
}

TEST_CASE("security.socket_path_that_is_a_symlink_is_not_followed_or_replaced") {
  TempDir dir;
  const std::string target = dir / "target";
  { std::ofstream(target) << "precious"; }
  REQUIRE(::chmod(target.c_str(), 0600) == 0);
  const std::string sock = dir / "d.sock";
  REQUIRE(::symlink(target.c_str(), sock.c_str()) == 0);
  auto r = run_cmd({CUWT_DAEMON, "--run-dir", dir / "run", "--socket", sock, "--no-nvml"}, {}, 5000);
  CHECK(r.status == 1);
  CHECK(r.err.find("not a socket") != std::string::npos);
  struct stat st{};
  REQUIRE(::lstat(target.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);  // not chmod'ed through the link
  CHECK(slurp(target) == "precious");
}

TEST_CASE("security.a_ring_named_after_another_users_process_is_never_trusted") {
  TempDir dir;
  Daemon d(dir);
  // A process that runs as another user than the ring file's owner (us): pid 1 when we are
  // not root; as root, a child that drops to nobody.
  pid_t target = 1;
  std::unique_ptr<Child> nobody;
  if (getuid() == 0) {
    nobody = std::make_unique<Child>(std::vector<std::string>{"setpriv", "--reuid=65534", "--regid=65534",
                                                              "--clear-groups", "sleep", "300"});
    REQUIRE(wait_until([&] {
      struct stat st{};
      return ::stat(("/proc/" + std::to_string(nobody->pid)).c_str(), &st) == 0 && st.st_uid == 65534;
    }));
    target = nobody->pid;
  }
  struct stat pst{};
  REQUIRE(::stat(("/proc/" + std::to_string(target)).c_str(), &pst) == 0);
  if (pst.st_uid == getuid()) {
    WARN("pid " << target << " runs as our own uid: no other user's process to spoof; skipped");
    return;
  }
  const uint64_t start = cuw::paths::process_start_time(static_cast<uint32_t>(target));
  REQUIRE(start != 0);
  FakeRing spoof(d.run_dir, static_cast<uint32_t>(target), start);
  spoof.device(0, 0x90).used.store(1ull << 40);
  json st;
  REQUIRE(wait_until([&] {
    st = d.state();
    for (const auto& p : st["problems"])
      if (p["path"] == spoof.path) return true;
    return false;
  }));
  CHECK(find_proc_none(st, target));
  for (const auto& p : st["problems"])
    if (p["path"] == spoof.path) CHECK(p["reason"].get<std::string>().find("runs as uid") != std::string::npos);
  // Our own process, same kind of file: trusted.
  Child mine;
  FakeRing ok(d.run_dir, static_cast<uint32_t>(mine.pid), mine.start_time());
  REQUIRE(wait_until([&] { return !d.process(static_cast<uint32_t>(mine.pid)).is_null(); }));
}

namespace {
/// A process of uid `uid` that listens on `path` and answers every connection with garbage:
/// another user's impostor on the daemon's socket name. Killed and reaped on destruction.
struct Squatter {
  pid_t pid = -1;
  Squatter(const std::string& path, uid_t uid) {
    int ready[2];
    if (::pipe2(ready, O_CLOEXEC) != 0) throw std::runtime_error("pipe2");
    pid = ::fork();
    if (pid == 0) {
      // Only system calls from here on: the test process has threads.
      ::signal(SIGPIPE, SIG_IGN);  // a client that closes first must not end it
      if (::setresgid(uid, uid, uid) != 0 || ::setresuid(uid, uid, uid) != 0) ::_exit(2);
      const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
      sockaddr_un addr{};
      addr.sun_family = AF_UNIX;
      std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
      if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(fd, 8) != 0) ::_exit(3);
      (void)!::write(ready[1], "r", 1);
      for (;;) {
        const int c = ::accept(fd, nullptr, nullptr);
        if (c < 0) continue;
        char junk[64] = "forged";
        (void)!::read(c, junk, sizeof junk);
        (void)!::write(c, junk, sizeof junk);
        ::close(c);
      }
    }
    ::close(ready[1]);
    char r = 0;
    const bool ok = ::read(ready[0], &r, 1) == 1;
    ::close(ready[0]);
    if (!ok) throw std::runtime_error("the squatter could not bind " + path);
  }
  ~Squatter() {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
  }
};
}  // namespace

TEST_CASE("security.a_squatter_on_the_socket_name_neither_answers_root_nor_blocks_the_daemon") {
  if (getuid() != 0) {
    WARN("needs root (a second user's impostor, a root daemon); skipped");
    return;
  }
  TempDir dir;
  REQUIRE(::chmod(dir.path.c_str(), 0755) == 0);
  // A sticky world-writable directory such as the run directory: anyone may bind a name there.
  const std::string shared = dir / "shared", sock = shared + "/cuwardend.sock";
  REQUIRE(::mkdir(shared.c_str(), 01777) == 0);
  REQUIRE(::chmod(shared.c_str(), 01777) == 0);
  Squatter bob(sock, 65534);
  // Root's CLI sends nothing to it and says why.
  auto r = run_cmd({CUWT_CLI, "--socket", sock, "--json"});
  CHECK(r.status == 1);
  CHECK(r.err.find("served by uid 65534") != std::string::npos);
  CHECK(r.err.find("not believed") != std::string::npos);
  // A root daemon takes the name back and serves.
  const std::string log = dir / "daemon.log";
  Child daemon({"/bin/sh", "-c",
                std::string("exec ") + CUWT_DAEMON + " --run-dir " + (dir / "run") + " --socket " + sock +
                    " --no-nvml --log-level debug 2>" + log});
  REQUIRE(wait_until([&] {
    std::string why;
    return cuw::proto::request(sock, cuw::proto::Command::get_state, "{}", 1000, &why).has_value();
  }, 20000));
  CHECK(slurp(log).find("served by uid 65534") != std::string::npos);
  CHECK(run_cmd({CUWT_CLI, "--socket", sock, "--json"}).status == 0);
}

TEST_CASE("security.the_default_socket_lives_in_a_directory_only_the_daemon_writes") {
  TempDir dir;
  REQUIRE(::chmod(dir.path.c_str(), 0755) == 0);
  const std::string run = dir / "run";
  const std::string sockdir = run + "/daemon";
  const bool root = getuid() == 0;
  if (root) {
    // Another user got there first: their directory is renamed aside, not used.
    REQUIRE(::mkdir(run.c_str(), 01777) == 0);
    REQUIRE(::chmod(run.c_str(), 01777) == 0);
    REQUIRE(::mkdir(sockdir.c_str(), 0777) == 0);
    REQUIRE(::chown(sockdir.c_str(), 65534, 65534) == 0);
  }
  const std::string log = dir / "daemon.log";
  Child daemon({"/bin/sh", "-c",
                std::string("exec env -u CUWARDEN_SOCKET CUWARDEN_RUN_DIR=") + run + " " + CUWT_DAEMON +
                    " --no-nvml --log-level debug 2>" + log});
  const std::string sock = sockdir + "/cuwardend.sock";
  REQUIRE(wait_until([&] {
    std::string why;
    return cuw::proto::request(sock, cuw::proto::Command::get_state, "{}", 1000, &why).has_value();
  }, 20000));
  struct stat st{};
  REQUIRE(::lstat(sockdir.c_str(), &st) == 0);
  CHECK(S_ISDIR(st.st_mode));
  CHECK(st.st_uid == getuid());
  CHECK((st.st_mode & 0777) == 0755);
  if (root) CHECK(slurp(log).find("renamed it to") != std::string::npos);
  // The CLI finds it by the same rule, from CUWARDEN_RUN_DIR alone.
  auto r = run_cmd({"/usr/bin/env", "-u", "CUWARDEN_SOCKET", CUWT_CLI, "--json"}, {"CUWARDEN_RUN_DIR=" + run});
  CHECK(r.status == 0);
  ::kill(daemon.pid, SIGTERM);
}

TEST_CASE("upgrade.a_client_of_the_previous_release_is_told_where_the_daemon_is_now") {
  // The previous release's CLI and interposer look for <run dir>/cuwardend.sock; the daemon
  // now serves <run dir>/daemon/cuwardend.sock. Asked at the old name, it says where it is
  // (the previous CLI prints "the daemon refused the request: " and this text).
  TempDir dir;
  REQUIRE(::chmod(dir.path.c_str(), 0755) == 0);
  const std::string run = dir / "run", old_sock = run + "/cuwardend.sock", sock = run + "/daemon/cuwardend.sock";
  const std::string log = dir / "daemon.log";
  {
    Child daemon({"/bin/sh", "-c",
                  std::string("exec env -u CUWARDEN_SOCKET CUWARDEN_RUN_DIR=") + run + " " + CUWT_DAEMON +
                      " --no-nvml --log-level debug 2>" + log});
    std::optional<cuw::proto::Message> reply;
    REQUIRE(wait_until([&] {
      std::string why;
      reply = cuw::proto::request(old_sock, cuw::proto::Command::get_state, "{}", 1000, &why);
      return reply.has_value();
    }, 20000));
    CHECK(reply->header.command == static_cast<uint16_t>(cuw::proto::Command::error));
    CHECK_THAT(reply->body, Catch::Contains("earlier release") && Catch::Contains(sock));
    // Any command, privileged or not, gets the same answer and changes nothing.
    std::string why;
    reply = cuw::proto::request(old_sock, cuw::proto::Command::set_limit, R"({"pid":1,"limit":"1G"})", 5000, &why);
    REQUIRE(reply);
    CHECK_THAT(reply->body, Catch::Contains("earlier release"));
    auto r = run_cmd({CUWT_CLI, "--socket", old_sock, "--json"});
    CHECK(r.status != 0);
    CHECK_THAT(r.err, Catch::Contains("the daemon refused the request: this cuwarden client is from an earlier release") &&
                          Catch::Contains("--socket " + sock));
    // The daemon itself answers at its own name.
    CHECK(run_cmd({"/usr/bin/env", "-u", "CUWARDEN_SOCKET", CUWT_CLI, "--json"}, {"CUWARDEN_RUN_DIR=" + run}).status == 0);
    ::kill(daemon.pid, SIGTERM);
    CHECK(wait_until([&] { return ::waitpid(daemon.pid, nullptr, WNOHANG) == daemon.pid; }, 20000));
    daemon.pid = -1;
  }
  // Both names are gone with the daemon.
  struct stat st{};
  CHECK(::lstat(old_sock.c_str(), &st) != 0);
  CHECK(::lstat(sock.c_str(), &st) != 0);
  // Something else in the old name's place (not a socket): left alone, and the daemon serves.
  { std::ofstream(old_sock) << "x"; }
  Child daemon({"/bin/sh", "-c",
                std::string("exec env -u CUWARDEN_SOCKET CUWARDEN_RUN_DIR=") + run + " " + CUWT_DAEMON +
                    " --no-nvml --log-level debug 2>" + log});
  CHECK(wait_until([&] {
    std::string why;
    return cuw::proto::request(sock, cuw::proto::Command::get_state, "{}", 1000, &why).has_value();
  }, 20000));
  CHECK(wait_until([&] { return slurp(log).find("not answering the previous release's clients") != std::string::npos; }));
  CHECK(slurp(old_sock) == "x");
}

TEST_CASE("security.the_interposer_never_creates_the_shared_run_dir") {
  TempDir dir;
  const std::string run = dir / "run";
  App app(std::vector<std::string>{CUWJ_APP, "hold", std::to_string(1ULL << 20)},
          {std::string("LD_PRELOAD=") + CUWS_LIB, "CUWARDEN_RUN_DIR=" + run, "CUWARDEN_FAKE_MEMORY=1G",
           "CUWARDEN_LOG=info"},
          dir / "app.err", true);
  REQUIRE(app.line(20000) == "held");
  struct stat st{};
  CHECK(::lstat(run.c_str(), &st) != 0);  // left to root (or the daemon) to make
  // A directory of its own beside it, which no other user can write, holds its ring.
  const std::string own = run + "-" + std::to_string(geteuid());
  REQUIRE(::lstat(own.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0700);
  bool ring = false;
  for (const auto& e : dir_entries(own)) ring = ring || e.rfind("ring-", 0) == 0;
  CHECK(ring);
  const std::string err = slurp(dir / "app.err");
  INFO(err);
  CHECK(err.find("using " + own) != std::string::npos);
}

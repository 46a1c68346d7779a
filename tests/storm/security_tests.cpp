// cuwarden security checks on the daemon: the run directory's mode and type, the socket's
// mode and no symlink followed, and rings that claim another user's process.
#include <grp.h>
#include <sys/stat.h>

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

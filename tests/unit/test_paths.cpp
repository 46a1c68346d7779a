// Unit tests: ring file names and process start times.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>

#include "cuw/job.hpp"
#include "cuw/paths.hpp"

TEST_CASE("ring file names round-trip and reject look-alikes", "[paths]") {
  using namespace cuw::paths;
  const std::string n = ring_file_name(1234, 987654321);
  CHECK(n == "ring-1234-987654321.cwr");
  uint32_t pid = 0;
  uint64_t st = 0;
  REQUIRE(parse_ring_file_name(n, &pid, &st));
  CHECK(pid == 1234);
  CHECK(st == 987654321);
  for (const char* bad : {"ring-.cwr", "ring-12.cwr", "ring-12-.cwr", "ring--5.cwr", "ring-1x-5.cwr", "ring-0-5.cwr",
                          "ring-99999999999-5.cwr", "ring-1-2.txt", "xring-1-2.cwr", "cuwardend.sock"})
    CHECK_FALSE(parse_ring_file_name(bad, &pid, &st));
}

TEST_CASE("process start time is read from /proc and changes with the process", "[paths]") {
  using namespace cuw::paths;
  const uint64_t self = process_start_time(static_cast<uint32_t>(getpid()));
  CHECK(self > 0);
  CHECK(process_start_time(static_cast<uint32_t>(getpid())) == self);
  CHECK(process_start_time(0x7ffffff0u) == 0);  // no such pid
}

TEST_CASE("run dir honours CUWARDEN_RUN_DIR", "[paths]") {
  ::setenv("CUWARDEN_RUN_DIR", "/tmp/cuw-test-dir//", 1);
  CHECK(cuw::paths::run_dir() == "/tmp/cuw-test-dir");
  CHECK(cuw::paths::socket_path() == "/tmp/cuw-test-dir/daemon/cuwardend.sock");
  ::setenv("CUWARDEN_SOCKET", "/tmp/elsewhere.sock", 1);
  CHECK(cuw::paths::socket_path() == "/tmp/elsewhere.sock");
  ::unsetenv("CUWARDEN_SOCKET");
  ::unsetenv("CUWARDEN_RUN_DIR");
  CHECK(cuw::paths::run_dir() == cuw::paths::kDefaultRunDir);
  CHECK(cuw::paths::socket_path() == "/run/cuwarden/cuwardend.sock");
}

TEST_CASE("the socket's place: one rule for daemon, CLI and interposer", "[paths]") {
  using cuw::paths::socket_path_for;
  CHECK(socket_path_for("/x/s.sock", "/r") == "/x/s.sock");
  CHECK(socket_path_for("", "/r/") == "/r/daemon/cuwardend.sock");
  CHECK(socket_path_for(nullptr, "/r") == "/r/daemon/cuwardend.sock");
  // No run directory, or the default one (world-writable): the root-only directory.
  CHECK(socket_path_for(nullptr, nullptr) == "/run/cuwarden/cuwardend.sock");
  CHECK(socket_path_for("", "") == "/run/cuwarden/cuwardend.sock");
  CHECK(socket_path_for(nullptr, cuw::paths::kDefaultRunDir) == "/run/cuwarden/cuwardend.sock");
}

TEST_CASE("a socket's directory is believed when root or the caller owns it", "[paths]") {
  std::string why;
  CHECK(cuw::paths::trusted_socket_dir("/proc/x.sock", &why));  // root's
  CHECK_FALSE(cuw::paths::trusted_socket_dir("/nonexistent-cuw-dir/x.sock", &why));
  CHECK(why.find("/nonexistent-cuw-dir") != std::string::npos);
}

TEST_CASE("a process is gone only when proven so in our own namespace", "[paths]") {
  using namespace cuw::paths;
  const auto me = static_cast<uint32_t>(getpid());
  const uint64_t start = self_start_time();
  CHECK(start == process_start_time(me));
  CHECK_FALSE(process_gone(me, start));
  CHECK(process_gone(me, start + 1));       // another process under the pid: proven by /proc
  CHECK(process_gone(0x3ffffff0u, start));  // no process has that pid: proven by pidfd_open
  // Ours and the previous library's (no namespace recorded) map to the pid itself.
  CHECK(host_pid(0, me) == me);
  CHECK(host_pid(cuw::job::self_pidns(), me) == me);
  // A namespace nobody here is in: not mapped, so never judged.
  CHECK(host_pid(1, me) == -1);
}

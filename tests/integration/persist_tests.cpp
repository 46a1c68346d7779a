// cuwarden integration tests: what the daemon keeps across a restart, kill -9 included, in its
// state directory (--state-dir): out-of-memory reports (model/oom_store.hpp) and the event
// history (model/event_journal.hpp).
#include "daemon_test_support.hpp"

#include <catch2/catch.hpp>
#include <optional>

using namespace cuwt;

namespace {

/// Kill the daemon with SIGKILL and start another on the same directories.
void kill_9_and_restart(std::optional<Daemon>& d, const TempDir& dir, const std::string& state) {
  ::kill(d->pid, SIGKILL);
  waitpid(d->pid, nullptr, 0);
  d->pid = -1;
  d.reset();
  d.emplace(dir, std::vector<std::string>{"--state-dir", state});
}

}  // namespace

TEST_CASE("oom.report_survives_kill_9_of_the_daemon") {
  TempDir dir;
  const std::string state = dir / "state";
  Child proc;
  std::optional<Daemon> d;
  d.emplace(dir, std::vector<std::string>{"--state-dir", state});
  const auto pid = static_cast<uint32_t>(proc.pid);
  FakeRing r(d->run_dir, pid, proc.start_time(), 1024, "oomproc");
  r.device(0, 0x20).limit.store(256 * kMiB);
  REQUIRE(wait_until([&] { return !d->process(pid).is_null(); }, 10000));
  REQUIRE(r.push(ring::EventKind::refuse, ring::Api::cuMemAlloc, 0, 300 * kMiB, 0, 0));
  auto oom = [&] { return run_cmd({CUWT_CLI, "oom", std::to_string(pid), "--socket", d->socket}); };
  // Written when taken: the file is in the state directory before the daemon dies.
  REQUIRE(wait_until([&] { return oom().out.find("300.00 MiB") != std::string::npos; }, 10000));
  REQUIRE(wait_until(
      [&] {
        DIR* s = opendir((state + "/oom").c_str());
        if (s == nullptr) return false;
        bool any = false;
        // A finished report (oom-*.json), not one being written (oom-*.json.tmp): killed
        // before its rename, the daemon would rightly have lost it.
        while (dirent* e = readdir(s)) {
          const std::string n = e->d_name;
          any = any || (n.rfind("oom-", 0) == 0 && n.size() > 5 && n.compare(n.size() - 5, 5, ".json") == 0);
        }
        closedir(s);
        return any;
      },
      10000));
  struct stat st{};
  REQUIRE(::stat(state.c_str(), &st) == 0);
  CHECK((st.st_mode & 07777) == 0700);

  kill_9_and_restart(d, dir, state);
  const CmdResult after = oom();
  std::printf("after the restart:\n%s", after.out.c_str());
  CHECK(after.status == 0);
  CHECK(after.out.find("pid " + std::to_string(pid)) != std::string::npos);
  CHECK(after.out.find("300.00 MiB") != std::string::npos);
}

TEST_CASE("events.history_survives_kill_9_of_the_daemon") {
  TempDir dir;
  const std::string state = dir / "state";
  Child proc;
  std::optional<Daemon> d;
  d.emplace(dir, std::vector<std::string>{"--state-dir", state});
  const auto pid = static_cast<uint32_t>(proc.pid);
  FakeRing r(d->run_dir, pid, proc.start_time());
  r.device(0, 0x20);
  REQUIRE(wait_until([&] { return !d->process(pid).is_null(); }, 10000));
  for (uint64_t i = 0; i < 5; ++i)
    REQUIRE(r.push(ring::EventKind::alloc, ring::Api::cuMemAlloc, 0, (i + 1) * kMiB, 0x7f0000000000 + (i << 20),
                   (i + 1) * kMiB));
  // (seq, address) of the process's events, oldest first.
  auto events = [&] {
    std::vector<std::pair<uint64_t, uint64_t>> v;
    const json all = d->events(json{{"pid", pid}});  // not in the for: the temporary would die first
    for (const auto& e : all["events"])
      if (e["kind"] == "alloc") v.emplace_back(e["seq"].get<uint64_t>(), e["address"].get<uint64_t>());
    return v;
  };
  REQUIRE(wait_until([&] { return events().size() == 5; }, 10000));
  const auto before = events();

  kill_9_and_restart(d, dir, state);
  CHECK(events() == before);
  // New events are numbered after the old ones.
  REQUIRE(r.push(ring::EventKind::alloc, ring::Api::cuMemAlloc, 0, kMiB, 0x7f1000000000, 6 * kMiB));
  REQUIRE(wait_until([&] { return events().size() == 6; }, 10000));
  const auto after = events();
  CHECK(after.back().first > before.back().first);
  CHECK(after.back().second == 0x7f1000000000ULL);
}

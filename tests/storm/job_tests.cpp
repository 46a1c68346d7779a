// cuwarden job caps under stress: many member processes of one job (cuw_job_app under
// LD_PRELOAD=libcuwarden.so on the simulated driver), hammering, killed at random, joining
// by the hundred. The witness (job_witness.hpp) checks the cap from outside cuwarden.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cuw/job.hpp"
#include "daemon_test_support.hpp"
#include "job_witness.hpp"
#include "storm_support.hpp"

using namespace cuwt;
using cuws::storm_seconds;

namespace {

constexpr const char* kJob = "train";

/// A job member: cuw_job_app under the interposer in job kJob, configured by `extra` alone.
struct Member : cuws::App {
  Member(const std::string& run_dir, const std::string& job_limit, std::vector<std::string> args,
         const std::string& err_path)
      : App(with_app(std::move(args)), member_env(run_dir, job_limit), err_path, /*clean=*/true) {}

  static std::vector<std::string> with_app(std::vector<std::string> args) {
    args.insert(args.begin(), CUWJ_APP);
    return args;
  }
  static std::vector<std::string> member_env(const std::string& run_dir, const std::string& job_limit) {
    std::vector<std::string> extra = {std::string("LD_PRELOAD=") + CUWS_LIB, "CUWARDEN_RUN_DIR=" + run_dir,
                                      std::string("CUWARDEN_JOB=") + kJob, "CUWARDEN_FAKE_MEMORY=4G"};
    if (!job_limit.empty()) extra.push_back("CUWARDEN_JOB_LIMIT=" + job_limit);
    return extra;
  }
  std::string line(int timeout_ms = 20000) { return App::line(timeout_ms); }
};

/// The witness file and its mapping.
struct Witness {
  std::string path;
  cuwj::JobWitness* w = nullptr;
  explicit Witness(const TempDir& dir) : path(dir / "witness") {
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    REQUIRE(fd >= 0);
    REQUIRE(::ftruncate(fd, sizeof(cuwj::JobWitness)) == 0);
    void* p = ::mmap(nullptr, sizeof(cuwj::JobWitness), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    REQUIRE(p != MAP_FAILED);
    w = static_cast<cuwj::JobWitness*>(p);
  }
  ~Witness() { ::munmap(w, sizeof(cuwj::JobWitness)); }
};

std::unique_ptr<cuw::job::Segment> open_job(const TempDir& dir) {
  const std::string run_dir = dir.path;
  // The first member creates the job file; a test may ask for it while members still start.
  std::string err;
  std::unique_ptr<cuw::job::Segment> s;
  wait_until(
      [&] {
        cuw::job::DirChoice where;
        if (!cuw::job::choose_dir(run_dir, static_cast<uint32_t>(geteuid()), kJob, &where, &err)) return false;
        s.reset(cuw::job::Segment::open(where.path, static_cast<uint32_t>(geteuid()), kJob, false, &err));
        return s != nullptr;
      },
      60000);
  INFO(err << "; the members said: " << slurp(dir / "apps.err"));
  REQUIRE(s);
  return s;
}

uint64_t total_ops(const cuwj::JobWitness& w) {
  uint64_t n = 0;
  for (const auto& a : w.apps) n += a.ops.load();
  return n;
}

}  // namespace

TEST_CASE("job.hammer_8_processes_8_threads_never_exceed_the_cap") {
  // Rounds, not seconds: a busy machine makes the storm slower, never weaker. Each round
  // every thread churns, then allocates until refused and waits; at that barrier nobody
  // allocates or frees, so the job's sum is exact and the check below is made on it.
  constexpr int kProcs = 8, kThreads = 8, kAllThreads = kProcs * kThreads;
  const int rounds = std::max(8, static_cast<int>(storm_seconds(3) * 3));
  constexpr int kChurn = 1000;  // random operations per thread per round
  constexpr uint64_t kCap = 1024 * kMiB;
  // A refusal means: what the job held, plus the request (at most kLargestRequest), plus the
  // reservations other threads had added and not yet taken back (at most one each, see
  // cuw/job.hpp), passed the cap. Nothing was freed since, so at the barrier the sum held is
  // above cap - kAllThreads x kLargestRequest (768 MiB here), and never above the cap.
  constexpr uint64_t kFloor = kCap - kAllThreads * cuwj::kLargestRequest;
  static_assert(kFloor >= kCap / 2, "the floor must say the storm filled the cap");
  TempDir dir;
  Witness wit(dir);
  std::vector<std::unique_ptr<Member>> apps;
  for (int i = 0; i < kProcs; ++i)
    apps.push_back(std::make_unique<Member>(
        dir.path, "1GiB",
        std::vector<std::string>{"rounds", wit.path, std::to_string(i), std::to_string(kThreads),
                                 std::to_string(1000 + i), std::to_string(kCap), std::to_string(rounds),
                                 std::to_string(kChurn), std::to_string(kAllThreads)},
        dir / "apps.err"));
  auto job = open_job(dir);
  uint64_t lowest_full = kCap;
  for (int r = 1; r <= rounds; ++r) {
    // Generous: a member that never reaches the barrier is a hang, not a slow machine.
    const bool all_full = wait_until([&] { return wit.w->full.load() >= static_cast<uint64_t>(kAllThreads) * r; },
                                     90000);
    INFO("round " << r << ": " << wit.w->full.load() << " threads at the barrier; " << slurp(dir / "apps.err"));
    REQUIRE(all_full);
    const auto held = static_cast<uint64_t>(wit.w->global.load());
    INFO("held " << held << " of " << kCap << ", the job counts " << job->used(0));
    CHECK(held <= kCap);
    CHECK(held > kFloor);
    CHECK(job->used(0) == held);  // the job's own sum, exact while nobody moves
    lowest_full = std::min(lowest_full, held);
    wit.w->released.store(static_cast<uint64_t>(r));
  }
  // No deadlock: every member frees everything.
  CHECK(wait_until([&] { return wit.w->drained.load() == kProcs; }, 90000));
  // Every member freed exactly what it took: all 8 slots read zero while they still live.
  const auto members = job->members();
  CHECK(members.size() == kProcs);
  for (const auto& m : members)
    for (uint64_t c : m.charged) CHECK(c == 0);
  CHECK(job->used(0) == 0);
  wit.w->exit.store(1);
  for (auto& a : apps) CHECK(a->wait_exit(30000) == 0);  // no error

  uint64_t allocs = 0, refusals = 0, errors = 0;
  for (int i = 0; i < kProcs; ++i) {
    allocs += wit.w->apps[i].allocs.load();
    refusals += wit.w->apps[i].refusals.load();
    errors += wit.w->apps[i].errors.load();
  }
  INFO(slurp(dir / "apps.err"));
  CHECK(errors == 0);
  CHECK(wit.w->violations.load() == 0);
  CHECK(wit.w->max_global.load() <= static_cast<int64_t>(kCap));
  CHECK(refusals >= static_cast<uint64_t>(kAllThreads) * rounds);  // one per thread per round at least
  CHECK(wit.w->global.load() == 0);
  // Exited members' slots are freed by the next sweep; the job holds nothing.
  job->sweep(true);
  CHECK(job->members().empty());
  std::printf("job hammer: rounds=%d processes=%d threads=%d cap=%llu allocs=%llu refusals=%llu max_held=%llu "
              "lowest_held_when_full=%llu floor=%llu violations=%llu\n",
              rounds, kProcs, kThreads, static_cast<unsigned long long>(kCap),
              static_cast<unsigned long long>(allocs), static_cast<unsigned long long>(refusals),
              static_cast<unsigned long long>(wit.w->max_global.load()), static_cast<unsigned long long>(lowest_full),
              static_cast<unsigned long long>(kFloor), static_cast<unsigned long long>(wit.w->violations.load()));
}

TEST_CASE("job.kill_storm_never_leaks_or_deadlocks") {
  const double seconds = storm_seconds(10);
  constexpr uint64_t kCap = 192 * kMiB;
  constexpr int kLive = 6;
  TempDir dir;
  Witness wit(dir);
  std::mt19937 rng(7);
  std::vector<std::unique_ptr<Member>> apps(kLive);
  std::vector<int> index_of(kLive);
  int next_index = 0;
  auto spawn_at = [&](int k) {
    const int idx = next_index++ % static_cast<int>(cuwj::kMaxApps);
    wit.w->apps[idx].held.store(0);
    index_of[k] = idx;
    apps[k] = std::make_unique<Member>(dir.path, "192MiB",
                                       std::vector<std::string>{"hammer", wit.path, std::to_string(idx), "3",
                                                                std::to_string(5000 + next_index), std::to_string(kCap)},
                                       dir / "apps.err");
  };
  for (int k = 0; k < kLive; ++k) spawn_at(k);
  int kills = 0;
  uint64_t stalled_checks = 0, progress_checks = 0;
  // At least 250 kills, and at least `seconds` (longer storms on demand): a busy machine
  // makes the storm slower, never shorter.
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int>(seconds * 1000));
  while (std::chrono::steady_clock::now() < until || kills < 250) {
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 20000));
    const int k = static_cast<int>(rng() % kLive);
    // Freeze it wherever it is (alive, so its share stays counted), take its bytes out of
    // the witness, then kill it at that instruction.
    ::kill(apps[k]->pid, SIGSTOP);
    int st = 0;
    waitpid(apps[k]->pid, &st, WUNTRACED);
    wit.w->global.fetch_sub(static_cast<int64_t>(wit.w->apps[index_of[k]].held.load()));
    ::kill(apps[k]->pid, SIGKILL);
    waitpid(apps[k]->pid, nullptr, 0);
    apps[k]->pid = -1;
    ++kills;
    spawn_at(k);
    // Nobody is stuck: after a kill the members still make progress (the bound is for a
    // hang, not for speed: members that progress do so within milliseconds).
    if (kills % 25 == 0) {
      const uint64_t before = total_ops(*wit.w);
      const bool moved = wait_until([&] { return total_ops(*wit.w) > before + 100; }, 30000);
      ++progress_checks;
      if (!moved) ++stalled_checks;
    }
  }
  wit.w->stop.store(1);
  wit.w->exit.store(1);
  for (auto& a : apps) CHECK(a->wait_exit(30000) == 0);
  INFO(slurp(dir / "apps.err"));
  CHECK(stalled_checks == 0);
  CHECK(wit.w->violations.load() == 0);
  uint64_t errors = 0, refusals = 0;
  for (const auto& a : wit.w->apps) {
    errors += a.errors.load();
    refusals += a.refusals.load();
  }
  CHECK(errors == 0);
  CHECK(refusals > 0);

  // The survivors exited cleanly; everyone else was killed. One sweep frees every slot and
  // the job holds exactly nothing.
  auto job = open_job(dir);
  job->sweep(true);
  CHECK(job->members().empty());
  for (int g = 0; g < static_cast<int>(cuw::job::kMaxGpus); ++g) CHECK(job->used(g) == 0);
  // A new member finds the whole cap free.
  Member fresh(dir.path, "192MiB", {"hold", std::to_string(kCap)}, dir / "apps.err");
  CHECK(fresh.line() == "held");
  std::printf("job kill storm: seconds=%.1f kills=%d progress_checks=%llu violations=0 refusals=%llu\n", seconds,
              kills, static_cast<unsigned long long>(progress_checks), static_cast<unsigned long long>(refusals));
}

TEST_CASE("job.killed_member_share_is_reclaimed_by_the_next_allocation") {
  TempDir dir;
  Member holder(dir.path, "1GiB", {"hold", std::to_string(768 * kMiB)}, dir / "apps.err");
  REQUIRE(holder.line() == "held");
  Member waiter(dir.path, "1GiB", {"retry", std::to_string(512 * kMiB), "60"}, dir / "apps.err");
  REQUIRE(waiter.line() == "refused");  // the job is full while the holder lives
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  const uint64_t kill_ns = static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
  ::kill(holder.pid, SIGKILL);
  waitpid(holder.pid, nullptr, 0);
  holder.pid = -1;
  // The next allocation finds the dead member and frees its share: a new member's first
  // allocation already fits, with no sweep or daemon to wait for (no daemon runs here).
  Member fresh(dir.path, "1GiB", {"hold", std::to_string(256 * kMiB)}, dir / "apps.err");
  CHECK(fresh.line(60000) == "held");
  // And the member that kept retrying got its 512 MiB too (timed, for the record only).
  const std::string got = waiter.line(60000);
  REQUIRE(got.rfind("ok ", 0) == 0);
  const uint64_t ok_ns = std::stoull(got.substr(3));
  std::printf("job reclaim: share of a SIGKILLed member usable by a retrying member after %.1f ms\n",
              static_cast<double>(ok_ns - kill_ns) / 1e6);
}

TEST_CASE("job.members_asking_different_caps_get_the_lowest_and_a_new_run_starts_afresh") {
  TempDir dir;
  {
    Member big(dir.path, "1GiB", {"hold", std::to_string(300 * kMiB)}, dir / "apps.err");
    REQUIRE(big.line() == "held");
    Member small(dir.path, "512MiB", {"hold", std::to_string(300 * kMiB)}, dir / "apps.err");
    CHECK(small.line() == "refused");  // 300 + 300 > min(1 GiB, 512 MiB)
    Member fits(dir.path, "512MiB", {"hold", std::to_string(200 * kMiB)}, dir / "apps.err");
    CHECK(fits.line() == "held");
    auto job = open_job(dir);
    CHECK(job->cap() == 512 * kMiB);
    CHECK(job->used(0) == 500 * kMiB);
  }
  // Everyone is gone (killed). A later run of the job with a larger cap is not held to the
  // old one, nor charged for the old members' bytes.
  Member later(dir.path, "1GiB", {"hold", std::to_string(900 * kMiB)}, dir / "apps.err");
  CHECK(later.line() == "held");
  auto job = open_job(dir);
  CHECK(job->cap() == 1024 * kMiB);
  CHECK(job->used(0) == 900 * kMiB);
  CHECK(job->members().size() == 1);
}

TEST_CASE("job.live_limit_change_applies_on_the_next_allocation") {
  TempDir dir;
  Member holder(dir.path, "1GiB", {"hold", std::to_string(400 * kMiB)}, dir / "apps.err");
  REQUIRE(holder.line() == "held");
  auto job = open_job(dir);
  // Lowered below what is held: nothing is taken away, new allocations are refused.
  CHECK(job->set_limit(256 * kMiB) == 1);
  Member second(dir.path, "1GiB", {"hold", std::to_string(16 * kMiB)}, dir / "apps.err");
  CHECK(second.line() == "refused");
  CHECK(job->used(0) == 400 * kMiB);
  // Raised: room again.
  CHECK(job->set_limit(2048 * kMiB) >= 1);
  Member third(dir.path, "", {"hold", std::to_string(1024 * kMiB)}, dir / "apps.err");
  CHECK(third.line() == "held");
  CHECK(job->used(0) == 1424 * kMiB);
}

TEST_CASE("job.two_hundred_processes_join_at_once") {
  constexpr int kProcs = 200;
  TempDir dir;
  Witness wit(dir);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::unique_ptr<Member>> apps;
  for (int i = 0; i < kProcs; ++i)
    apps.push_back(std::make_unique<Member>(dir.path, "64GiB",
                                            std::vector<std::string>{"join", wit.path, std::to_string(i)},
                                            dir / "apps.err"));
  const bool all = wait_until(
      [&] {
        for (int i = 0; i < kProcs; ++i)
          if (wit.w->apps[i].join_ns.load() == 0) return false;
        return true;
      },
      60000);
  const double wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO(slurp(dir / "apps.err"));
  REQUIRE(all);
  // All 200 are members at once and the job counts each one's MiB.
  auto job = open_job(dir);
  CHECK(job->members().size() == kProcs);
  CHECK(job->used(0) == kProcs * kMiB);
  std::vector<double> ms;
  for (int i = 0; i < kProcs; ++i) ms.push_back(static_cast<double>(wit.w->apps[i].join_ns.load()) / 1e6);
  std::sort(ms.begin(), ms.end());
  std::printf("job join: %d processes, start to first allocation (ms): median %.1f p90 %.1f max %.1f; "
              "all joined within %.2f s of the first spawn\n",
              kProcs, ms[kProcs / 2], ms[kProcs * 9 / 10], ms.back(), wall_s);
  wit.w->stop.store(1);
  for (auto& a : apps) CHECK(a->wait_exit(30000) == 0);
  job->sweep(true);
  CHECK(job->members().empty());
}

// Unit tests for the job segment (common/job): names, files refused as unsafe, slots,
// caps, liveness (dead, zombie, pid reused, exec'd) with real child processes.
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <pthread.h>
#include <sys/syscall.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ftw.h>
#include <memory>
#include <string>
#include <thread>

#include "cuw/job.hpp"
#include "cuw/paths.hpp"

using namespace cuw;

namespace {

constexpr uint64_t kMiB = 1ULL << 20;

struct Dir {
  std::string path;
  Dir() {
    char t[] = "/tmp/cuwjob-XXXXXX";
    REQUIRE(mkdtemp(t));
    path = t;
  }
  ~Dir() {
    nftw(path.c_str(), [](const char* p, const struct stat*, int, FTW*) { return ::remove(p); }, 8,
         FTW_DEPTH | FTW_PHYS);
  }
  std::string file(const std::string& job) const {
    return path + "/" + job::file_name(static_cast<uint32_t>(geteuid()), job);
  }
};

std::unique_ptr<job::Segment> open_job(const Dir& d, const std::string& name = "j", bool create = true) {
  std::string err;
  std::unique_ptr<job::Segment> s(job::Segment::open(d.path, static_cast<uint32_t>(geteuid()), name, create, &err));
  INFO(err);
  REQUIRE(s);
  return s;
}

/// A child that sleeps until killed.
struct Sleeper {
  pid_t pid;
  Sleeper() {
    pid = fork();
    if (pid == 0) {
      for (;;) pause();
    }
    REQUIRE(pid > 0);
  }
  uint64_t start() const {
    uint64_t s = 0;
    for (int i = 0; i < 100 && s == 0; ++i) s = paths::process_start_time(static_cast<uint32_t>(pid));
    return s;
  }
  void kill_only() { ::kill(pid, SIGKILL); }
  void reap() {
    if (pid > 0) waitpid(pid, nullptr, 0);
    pid = -1;
  }
  ~Sleeper() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
};

const uint8_t kUuidA[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
const uint8_t kUuidB[16] = {16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1};

}  // namespace

TEST_CASE("job names and file names", "[job]") {
  std::string why;
  CHECK(job::valid_job_name("train-7.b_x", &why));
  CHECK_FALSE(job::valid_job_name("", &why));
  CHECK_FALSE(job::valid_job_name(".hidden", &why));
  CHECK_FALSE(job::valid_job_name("a/b", &why));
  CHECK(why.find("letters") != std::string::npos);
  CHECK_FALSE(job::valid_job_name(std::string(64, 'a'), &why));
  CHECK(job::valid_job_name(std::string(63, 'a'), &why));
  uint32_t uid = 0;
  std::string name;
  CHECK(job::file_name(1000, "train") == "job-1000-train.cwj");
  CHECK(job::parse_file_name("job-1000-train-2.cwj", &uid, &name));
  CHECK(uid == 1000);
  CHECK(name == "train-2");
  CHECK_FALSE(job::parse_file_name("job--x.cwj", &uid, &name));
  CHECK_FALSE(job::parse_file_name("job-12-.cwj", &uid, &name));
  CHECK_FALSE(job::parse_file_name("job-99999999999-x.cwj", &uid, &name));
  CHECK_FALSE(job::parse_file_name("ring-1-2.cwr", &uid, &name));
  CHECK(job::uuid_key(kUuidA) != job::uuid_key(kUuidB));
  const uint8_t zero[16] = {};
  CHECK(job::uuid_key(zero) != 0);
}

TEST_CASE("job files that are not safe to use are refused with a reason", "[job]") {
  Dir d;
  std::string err;
  const uint32_t me = static_cast<uint32_t>(geteuid());
  SECTION("world-readable") {
    const int fd = ::open(d.file("j").c_str(), O_CREAT | O_RDWR, 0644);
    ::fchmod(fd, 0644);
    ::close(fd);
    CHECK(job::Segment::open(d.path, me, "j", true, &err) == nullptr);
    CHECK(err.find("mode 0600") != std::string::npos);
  }
  SECTION("symlink") {
    REQUIRE(::symlink("/etc/passwd", d.file("j").c_str()) == 0);
    CHECK(job::Segment::open(d.path, me, "j", true, &err) == nullptr);
    CHECK(err.find(d.file("j")) != std::string::npos);
  }
  SECTION("wrong size") {
    const int fd = ::open(d.file("j").c_str(), O_CREAT | O_RDWR, 0600);
    REQUIRE(::ftruncate(fd, 12345) == 0);
    ::close(fd);
    CHECK(job::Segment::open(d.path, me, "j", true, &err) == nullptr);
    CHECK(err.find("size 12345") != std::string::npos);
  }
  SECTION("another layout") {
    const int fd = ::open(d.file("j").c_str(), O_CREAT | O_RDWR, 0600);
    REQUIRE(::ftruncate(fd, static_cast<off_t>(job::file_size())) == 0);
    const uint64_t junk = 0x1234;
    REQUIRE(::pwrite(fd, &junk, sizeof junk, 0) == sizeof junk);
    ::close(fd);
    CHECK(job::Segment::open(d.path, me, "j", true, &err) == nullptr);
    CHECK(err.find("magic") != std::string::npos);
  }
  SECTION("bad name") {
    CHECK(job::Segment::open(d.path, me, "a/x", true, &err) == nullptr);
    CHECK(err.find("letters") != std::string::npos);
  }
  SECTION("missing without create") {
    CHECK(job::Segment::open(d.path, me, "nope", false, &err) == nullptr);
    CHECK(err.find("No such file") != std::string::npos);
  }
}

TEST_CASE("a new job file is created 0600 and an all-zero file is an empty job", "[job]") {
  Dir d;
  auto s = open_job(d);
  struct stat st {};
  REQUIRE(::stat(d.file("j").c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  CHECK(static_cast<uint64_t>(st.st_size) == job::file_size());
  CHECK(s->members().empty());
  CHECK(s->cap() == job::kNoLimit);
  CHECK(s->used(0) == 0);
  // A second opener maps the same job.
  auto s2 = open_job(d);
  const int g = s->gpu_index(kUuidA, 80 * 1024 * kMiB);
  CHECK(g == 0);
  CHECK(s2->gpu_index(kUuidA, 0) == 0);
  CHECK(s2->gpu_index(kUuidB, 0) == 1);
  const auto gpus = s->gpus();
  REQUIRE(gpus.size() == 2);
  CHECK(std::memcmp(gpus[0].uuid, kUuidA, 16) == 0);
  CHECK(gpus[0].physical_total == 80 * 1024 * kMiB);
}

TEST_CASE("charges are per GPU and bounded by the lowest cap of the members", "[job]") {
  Dir d;
  auto s = open_job(d);
  Sleeper a, b;  // two live member identities
  const int sa = s->join(static_cast<uint32_t>(a.pid), a.start(), 100 * kMiB, 1);
  const int sb = s->join(static_cast<uint32_t>(b.pid), b.start(), 60 * kMiB, 1);
  REQUIRE(sa >= 0);
  REQUIRE(sb >= 0);
  CHECK(sa != sb);
  CHECK(s->cap() == 60 * kMiB);
  CHECK(s->charge(sa, 0, 40 * kMiB));
  CHECK(s->charge(sb, 0, 20 * kMiB));
  uint64_t cap = 0, used = 0;
  CHECK_FALSE(s->charge(sb, 0, 1, &cap, &used));  // exactly full
  CHECK(cap == 60 * kMiB);
  CHECK(used == 60 * kMiB);
  CHECK(s->charge(sb, 1, 60 * kMiB));  // another GPU has its own room
  CHECK(s->used(0) == 60 * kMiB);
  CHECK(s->used(1) == 60 * kMiB);
  s->uncharge(sa, 0, 40 * kMiB);
  CHECK(s->charge(sb, 0, 40 * kMiB));
  const auto ms = s->members();
  REQUIRE(ms.size() == 2);
  for (const auto& m : ms) {
    if (m.slot == static_cast<uint32_t>(sb)) {
      CHECK(m.charged[0] == 60 * kMiB);
      CHECK(m.refusals == 1);
      CHECK(m.requested == 60 * kMiB);
    }
  }
  // A live change lowers everyone's cap, below what is held: nothing is taken back.
  CHECK(s->set_limit(10 * kMiB) == 2);
  CHECK(s->cap() == 10 * kMiB);
  CHECK_FALSE(s->charge(sa, 0, 1));
  CHECK(s->used(0) == 60 * kMiB);
  // force_charge counts what is already allocated, cap or not.
  s->force_charge(sa, 0, 5 * kMiB);
  CHECK(s->used(0) == 65 * kMiB);
}

TEST_CASE("dead, zombie and reused-pid members are swept, live ones kept", "[job]") {
  Dir d;
  auto s = open_job(d);
  Sleeper live, dead, zombie, reused;
  const int s_live = s->join(static_cast<uint32_t>(live.pid), live.start(), job::kNoLimit, 1);
  const int s_dead = s->join(static_cast<uint32_t>(dead.pid), dead.start(), 8 * kMiB, 1);
  const int s_zombie = s->join(static_cast<uint32_t>(zombie.pid), zombie.start(), job::kNoLimit, 1);
  // The pid of a live process, but another start time: a pid the OS reused after the
  // member died.
  const int s_reused = s->join(static_cast<uint32_t>(reused.pid), reused.start() + 1, job::kNoLimit, 1);
  REQUIRE(s_live >= 0);
  REQUIRE(s_reused >= 0);
  CHECK(s->charge(s_dead, 0, 4 * kMiB));
  CHECK(s->charge(s_zombie, 0, 2 * kMiB));
  CHECK(s->charge(s_reused, 0, 1 * kMiB));
  CHECK(s->charge(s_live, 0, 1 * kMiB));
  CHECK(s->cap() == 8 * kMiB);  // the dead member's cap applies while it is counted
  dead.kill_only();
  dead.reap();
  zombie.kill_only();  // not reaped: a zombie holds no GPU memory
  for (int i = 0; i < 200 && job::owner_alive(job::owner_word(static_cast<uint32_t>(zombie.pid), zombie.start())); ++i)
    usleep(1000);
  CHECK(job::owner_alive(job::owner_word(static_cast<uint32_t>(live.pid), live.start())));
  CHECK_FALSE(job::owner_alive(job::owner_word(static_cast<uint32_t>(reused.pid), reused.start() + 1)));
  s->sweep(true);  // (the reused-pid slot may already have gone in a sweep run by charge())
  const auto ms = s->members();
  REQUIRE(ms.size() == 1);
  CHECK(ms[0].pid == static_cast<uint32_t>(live.pid));
  CHECK(s->used(0) == 1 * kMiB);
  CHECK(s->cap() == job::kNoLimit);  // the dead member's cap went with it
  // A freed slot is reused with clean counters.
  Sleeper next;
  const int s_next = s->join(static_cast<uint32_t>(next.pid), next.start(), job::kNoLimit, 1);
  REQUIRE(s_next >= 0);
  for (const auto& m : s->members())
    if (m.slot == static_cast<uint32_t>(s_next))
      for (uint64_t c : m.charged) CHECK(c == 0);
  CHECK(s->used(0) == 1 * kMiB);
}

TEST_CASE("a sweep takes the members its caller lists as running for alive, unchecked", "[job]") {
  Dir d;
  auto s = open_job(d);
  Sleeper live, listed, dead;
  const auto listed_pid = static_cast<uint32_t>(listed.pid);
  const uint64_t listed_owner = job::owner_word(listed_pid, listed.start());
  REQUIRE(s->join(static_cast<uint32_t>(live.pid), live.start(), job::kNoLimit, 1) >= 0);
  REQUIRE(s->join(listed_pid, listed.start(), job::kNoLimit, 1) >= 0);
  REQUIRE(s->join(static_cast<uint32_t>(dead.pid), dead.start(), job::kNoLimit, 1) >= 0);
  listed.kill_only();
  listed.reap();
  dead.kill_only();
  dead.reap();
  // The listed member is gone too, but the list is the caller's word: it is neither
  // signalled nor read from /proc; the others are checked as without a list.
  const uint64_t running[] = {listed_owner};
  CHECK(s->sweep(true, -1, 0, running) == 1);
  auto ms = s->members();
  REQUIRE(ms.size() == 2);
  CHECK(ms[0].pid == static_cast<uint32_t>(live.pid));
  CHECK(ms[1].pid == listed_pid);
  // Once no longer listed, it is checked and freed.
  CHECK(s->sweep(true, -1, 0, {}) == 1);
  ms = s->members();
  REQUIRE(ms.size() == 1);
  CHECK(ms[0].pid == static_cast<uint32_t>(live.pid));
}

TEST_CASE("a process that execs rejoins under the same identity and its old slot is freed", "[job]") {
  Dir d;
  auto s = open_job(d);
  const uint32_t pid = static_cast<uint32_t>(getpid());
  const uint64_t start = paths::process_start_time(pid);
  const int first = s->join(pid, start, 32 * kMiB, 1);
  REQUIRE(first >= 0);
  CHECK(s->charge(first, 0, 16 * kMiB));
  // The image after exec joins again (same pid, same start time): the old image's bytes
  // went with its CUDA context.
  const int second = s->join(pid, start, 64 * kMiB, 2);
  REQUIRE(second >= 0);
  const auto ms = s->members();
  REQUIRE(ms.size() == 1);
  CHECK(ms[0].slot == static_cast<uint32_t>(second));
  CHECK(s->used(0) == 0);
  CHECK(s->cap() == 64 * kMiB);
}

TEST_CASE("a claiming slot is skipped by sums and freed when its claimer died", "[job]") {
  Dir d;
  auto s = open_job(d);
  Sleeper a, gone;
  const int sa = s->join(static_cast<uint32_t>(a.pid), a.start(), 10 * kMiB, 1);
  REQUIRE(sa >= 0);
  // A process killed in the middle of join(): owner word with the claiming bit, stale
  // counters from the slot's previous owner.
  const uint64_t gone_start = gone.start();
  gone.kill_only();
  gone.reap();
  job::Member& m = s->member(5);
  m.charged[0].store(999 * kMiB);
  m.limit.store(1);
  m.owner.store(job::owner_word(12345, gone_start) | job::kClaiming);
  s->header().high_water.store(6);
  CHECK(s->used(0) == 0);
  CHECK(s->cap() == 10 * kMiB);
  CHECK(s->charge(sa, 0, 10 * kMiB));
  s->sweep(true);
  CHECK(s->member(5).owner.load() == 0);
}

TEST_CASE("a member whose main thread exited while others run is alive", "[job]") {
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  const pid_t pid = fork();
  if (pid == 0) {
    pthread_t t;
    pthread_create(
        &t, nullptr, [](void*) -> void* {
          for (;;) pause();
        },
        nullptr);
    (void)::write(ready[1], "x", 1);
    syscall(SYS_exit, 0);  // only this thread (no unwinding): the leader is a zombie, the process runs on
  }
  REQUIRE(pid > 0);
  char c;
  REQUIRE(::read(ready[0], &c, 1) == 1);
  uint64_t start = 0;
  for (int i = 0; i < 100 && start == 0; ++i) start = paths::process_start_time(static_cast<uint32_t>(pid));
  const uint64_t owner = job::owner_word(static_cast<uint32_t>(pid), start);
  // Wait until the leader shows as a zombie, then it must still count as alive.
  bool zombie_leader = false;
  for (int i = 0; i < 200 && !zombie_leader; ++i) {
    std::FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r");
    char buf[512] = {};
    if (f) {
      (void)!std::fgets(buf, sizeof buf, f);
      std::fclose(f);
    }
    const char* p = std::strrchr(buf, ')');
    zombie_leader = p && p[2] == 'Z';
    if (!zombie_leader) usleep(1000);
  }
  CHECK(zombie_leader);
  CHECK(job::owner_alive(owner));
  ::kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  CHECK_FALSE(job::owner_alive(owner));
  ::close(ready[0]);
  ::close(ready[1]);
}

TEST_CASE("members of another pid namespace are not judged, users only lower caps", "[job]") {
  Dir d;
  auto s = open_job(d);
  Sleeper a, gone;
  const int sa = s->join(static_cast<uint32_t>(a.pid), a.start(), 100 * kMiB, 1);
  const int sg = s->join(static_cast<uint32_t>(gone.pid), gone.start(), 50 * kMiB, 1);
  REQUIRE(sa >= 0);
  REQUIRE(sg >= 0);
  gone.kill_only();
  gone.reap();
  // Its pid means nothing here when it lives in another namespace: kept.
  s->member(static_cast<uint32_t>(sg)).pidns.store(job::self_pidns() + 1);
  s->sweep(true);
  CHECK(s->members().size() == 2);
  // In ours, it is dead and freed.
  s->member(static_cast<uint32_t>(sg)).pidns.store(job::self_pidns());
  s->sweep(true);
  CHECK(s->members().size() == 1);
  // lower_only never raises a member whose cap is already lower.
  Sleeper b;
  const int sb = s->join(static_cast<uint32_t>(b.pid), b.start(), 10 * kMiB, 1);
  REQUIRE(sb >= 0);
  CHECK(s->set_limit(40 * kMiB, true) == 2);
  CHECK(s->member(static_cast<uint32_t>(sa)).limit.load() == 40 * kMiB);
  CHECK(s->member(static_cast<uint32_t>(sb)).limit.load() == 10 * kMiB);
  CHECK(s->cap() == 10 * kMiB);
}

TEST_CASE("the peak per GPU is the most the members held together and a release does not lower it", "[job]") {
  Dir d;
  auto s = open_job(d);
  Sleeper a, b;
  const int sa = s->join(static_cast<uint32_t>(a.pid), a.start(), 100 * kMiB, 1);
  const int sb = s->join(static_cast<uint32_t>(b.pid), b.start(), 100 * kMiB, 1);
  const int g0 = s->gpu_index(kUuidA, 0), g1 = s->gpu_index(kUuidB, 0);
  REQUIRE(s->charge(sa, g0, 30 * kMiB));
  REQUIRE(s->charge(sb, g0, 50 * kMiB));
  s->uncharge(sa, g0, 30 * kMiB);
  REQUIRE(s->charge(sa, g0, 10 * kMiB));
  CHECK_FALSE(s->charge(sa, g0, 60 * kMiB));  // refused: not a peak
  REQUIRE(s->charge(sb, g1, 5 * kMiB));
  s->force_charge(sb, g1, 7 * kMiB);  // counted, cap or not
  const auto gpus = s->gpus();
  REQUIRE(gpus.size() == 2);
  CHECK(gpus[0].peak == 80 * kMiB);
  CHECK(gpus[1].peak == 12 * kMiB);
  CHECK(s->used(g0) == 60 * kMiB);
}

TEST_CASE("a member holds its job file's shared lock, and an opener of a removed file opens the name again",
          "[job]") {
  Dir d;
  const std::string path = d.file("j");
  Sleeper member;
  {
    auto s = open_job(d);
    REQUIRE(s->join(static_cast<uint32_t>(member.pid), member.start(), job::kNoLimit, 1) >= 0);
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    REQUIRE(fd >= 0);
    CHECK(::flock(fd, LOCK_EX | LOCK_NB) != 0);  // a member is there: the file may not go
    s.reset();
    CHECK(::flock(fd, LOCK_EX | LOCK_NB) == 0);  // its segment gone, the lock is free
    ::close(fd);
  }
  // Someone holds the exclusive lock and removes the file while an opener waits for it.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  REQUIRE(fd >= 0);
  REQUIRE(::flock(fd, LOCK_EX | LOCK_NB) == 0);
  std::unique_ptr<job::Segment> opened;
  std::string err;
  std::thread opener([&] { opened.reset(job::Segment::open(d.path, static_cast<uint32_t>(geteuid()), "j", true, &err)); });
  ::usleep(20'000);
  REQUIRE(::unlink(path.c_str()) == 0);
  ::close(fd);
  opener.join();
  INFO(err);
  REQUIRE(opened);
  struct stat now {};
  REQUIRE(::stat(path.c_str(), &now) == 0);
  CHECK(static_cast<uint64_t>(now.st_size) == job::file_size());
  CHECK(opened->members().empty());  // a new file under the name: the old one had a member
}

TEST_CASE("a job the previous release's members hold in the run directory is joined there, not split",
          "[job]") {
  Dir d;
  const auto me = static_cast<uint32_t>(geteuid());
  const std::string legacy = d.path + "/" + job::file_name(me, "a");
  job::DirChoice c;
  std::string err;
  {
    // A member of the previous release: its file in the run directory itself, held.
    std::unique_ptr<job::Segment> old(job::Segment::open(d.path, me, "a", true, &err));
    REQUIRE(old);
    const int slot = old->join(4000000, 1, 1 << 30, 1);
    REQUIRE(slot >= 0);
    REQUIRE(job::choose_dir(d.path, me, "a", &c, &err));
    CHECK(c.path == d.path);
    // So a new member opens the same file and sees the old member's charge.
    std::unique_ptr<job::Segment> now(job::Segment::open(c.path, me, "a", true, &err));
    REQUIRE(now);
    const uint8_t uuid[16] = {1};
    const int g = old->gpu_index(uuid, 1ull << 34);
    REQUIRE(g >= 0);
    REQUIRE(old->charge(slot, g, 512 << 20));
    CHECK(now->used(now->gpu_index(uuid, 1ull << 34)) == 512u << 20);
    // Another job name is not affected.
    REQUIRE(job::choose_dir(d.path, me, "b", &c, &err));
    CHECK(c.path == d.path + "/jobs/" + std::to_string(me));
  }
  // Nobody holds it any more: a new job starts in the new place, and the file is left.
  REQUIRE(job::choose_dir(d.path, me, "a", &c, &err));
  CHECK(c.path == d.path + "/jobs/" + std::to_string(me));
  struct stat st {};
  CHECK(::lstat(legacy.c_str(), &st) == 0);
  // A file that is not a job file of the user's (mode 0644 here) is never joined, held or not.
  REQUIRE(::chmod(legacy.c_str(), 0644) == 0);
  const int fd = ::open(legacy.c_str(), O_RDONLY | O_CLOEXEC);
  REQUIRE(fd >= 0);
  REQUIRE(::flock(fd, LOCK_SH) == 0);
  REQUIRE(job::choose_dir(d.path, me, "a", &c, &err));
  CHECK(c.path == d.path + "/jobs/" + std::to_string(me));
  if (geteuid() == 0) {
    // Nor one of another uid.
    REQUIRE(::chmod(legacy.c_str(), 0600) == 0);
    REQUIRE(::chown(legacy.c_str(), 65534, 65534) == 0);
    REQUIRE(job::choose_dir(d.path, me, "a", &c, &err));
    CHECK(c.path == d.path + "/jobs/" + std::to_string(me));
  }
  ::close(fd);
}

TEST_CASE("job directories: names of another user's are skipped, and a job is joined where it began", "[job]") {
  if (geteuid() != 0) {
    WARN("skipped: needs root (a directory of another uid)");
    return;
  }
  Dir d;
  const uint32_t me = 0, other = 65534;
  const std::string jobs = d.path + "/jobs", primary = jobs + "/0";
  REQUIRE(::mkdir(jobs.c_str(), 01777) == 0);
  job::DirChoice c;
  std::string err;
  // Nothing taken: the user's own directory, made 0700.
  REQUIRE(job::choose_dir(d.path, me, "a", &c, &err));
  CHECK(c.path == primary);
  CHECK(c.skipped.empty());
  struct stat st {};
  REQUIRE(::lstat(primary.c_str(), &st) == 0);
  CHECK((st.st_mode & 07777) == 0700);
  // Taken by another user: the first fallback that is absent or ours with mode 0700.
  REQUIRE(::rmdir(primary.c_str()) == 0);
  REQUIRE(::mkdir(primary.c_str(), 0700) == 0);
  REQUIRE(::chown(primary.c_str(), other, other) == 0);
  const std::string fb0 = d.path + "/" + job::fallback_dir_name(me, 0);
  const std::string fb1 = d.path + "/" + job::fallback_dir_name(me, 1);
  REQUIRE(::mkdir(fb0.c_str(), 0700) == 0);
  REQUIRE(::chown(fb0.c_str(), other, other) == 0);
  REQUIRE(job::choose_dir(d.path, me, "a", &c, &err));
  CHECK(c.path == fb1);
  CHECK_THAT(c.skipped, Catch::Contains("uid 65534"));
  // The job began in fb1; the squats gone and the primary ours again, a member still joins it there.
  {
    std::unique_ptr<job::Segment> s(job::Segment::open(c.path, me, "a", true, &err));
    REQUIRE(s);
  }
  REQUIRE(::rmdir(primary.c_str()) == 0);
  REQUIRE(::rmdir(fb0.c_str()) == 0);
  REQUIRE(job::choose_dir(d.path, me, "a", &c, &err));
  CHECK(c.path == fb1);
  // A new job goes to the primary directory.
  REQUIRE(job::choose_dir(d.path, me, "b", &c, &err));
  CHECK(c.path == primary);
  // Fallback names parse back, and only those.
  uint32_t uid = 0, n = 0;
  CHECK(job::parse_fallback_dir_name("jobs-1001-63", &uid, &n));
  CHECK((uid == 1001 && n == 63));
  for (const char* bad : {"jobs-1001-64", "jobs-1001-07", "jobs--1", "jobs-1001-", "jobs-x-1", "jobs-1001-1-2"})
    CHECK_FALSE(job::parse_fallback_dir_name(bad, nullptr, nullptr));
}

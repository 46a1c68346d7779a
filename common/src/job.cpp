// cuwarden: the job segment (see cuw/job.hpp for the protocol and why it is safe).
#include "cuw/job.hpp"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sched.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "cuw/paths.hpp"

namespace cuw::job {

namespace {

uint64_t mono_coarse_ns() noexcept {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ULL + static_cast<uint64_t>(ts.tv_nsec);
}

constexpr int kChargeAttempts = 8;
constexpr uint64_t kForcedSweepGapNs = 10'000'000;
/// A slot found alive this recently is not re-read from /proc by a join (kill(pid, 0)
/// still runs, so a member that has exited is always seen).
constexpr uint64_t kRecheckNs = 100'000'000;
// Opening a job file waits this many times for its shared lock (job.hpp, "End of a job").
constexpr int kLockAttempts = 150;

}  // namespace

uint64_t uuid_key(const uint8_t uuid[16]) noexcept {
  uint64_t a, b;
  std::memcpy(&a, uuid, 8);
  std::memcpy(&b, uuid + 8, 8);
  uint64_t k = a * 0x9E3779B97F4A7C15ULL ^ (b + 0x632BE59BD9B4E019ULL + (a << 6) + (a >> 2));
  k ^= k >> 31;
  return k == 0 ? 1 : k;
}

bool valid_job_name(const std::string& name, std::string* why) {
  auto fail = [&](const char* w) {
    if (why) *why = w;
    return false;
  };
  if (name.empty()) return fail("empty job name");
  if (name.size() > 63) return fail("job name longer than 63 bytes");
  if (name[0] == '.') return fail("job name starts with '.'");
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                    c == '_' || c == '-';
    if (!ok) return fail("job names may only hold letters, digits, '.', '_' and '-'");
  }
  return true;
}

std::string file_name(uint32_t uid, const std::string& name) {
  return std::string(kFilePrefix) + std::to_string(uid) + "-" + name + kFileSuffix;
}

bool parse_file_name(const std::string& file, uint32_t* uid, std::string* name) {
  const size_t plen = std::strlen(kFilePrefix), slen = std::strlen(kFileSuffix);
  if (file.size() <= plen + slen || file.compare(0, plen, kFilePrefix) != 0 ||
      file.compare(file.size() - slen, slen, kFileSuffix) != 0)
    return false;
  const std::string mid = file.substr(plen, file.size() - plen - slen);
  const size_t dash = mid.find('-');
  if (dash == std::string::npos || dash == 0 || dash > 10) return false;
  uint64_t u = 0;
  for (size_t i = 0; i < dash; ++i) {
    if (mid[i] < '0' || mid[i] > '9') return false;
    u = u * 10 + static_cast<uint64_t>(mid[i] - '0');
  }
  if (u > 0xffffffffULL) return false;
  const std::string n = mid.substr(dash + 1);
  if (!valid_job_name(n, nullptr)) return false;
  if (uid) *uid = static_cast<uint32_t>(u);
  if (name) *name = n;
  return true;
}

uint64_t self_pidns() noexcept {
  static const uint64_t ns = [] {
    struct stat st {};
    return ::stat("/proc/self/ns/pid", &st) == 0 ? static_cast<uint64_t>(st.st_ino) : uint64_t{0};
  }();
  return ns;
}

namespace {
/// Live threads of a process whose leader is a zombie ("Threads:" of /proc/<pid>/status).
/// A main thread that called pthread_exit leaves a zombie leader while the rest runs.
int live_threads(uint32_t pid) noexcept {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%u/status", pid);
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char buf[4096];
  const ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return 0;
  buf[n] = '\0';
  const char* t = std::strstr(buf, "\nThreads:");
  return t ? std::atoi(t + 9) : 0;
}
}  // namespace

bool owner_alive(uint64_t owner) noexcept {
  const uint32_t pid = owner_pid(owner);
  if (pid == 0) return false;
  if (::kill(static_cast<pid_t>(pid), 0) != 0) {
    if (errno == ESRCH) return false;
    // EPERM: the pid belongs to another user now; a member runs as the job's user, and
    // the only other caller, a root daemon, never gets EPERM.
    if (errno == EPERM && geteuid() != 0) return false;
  }
  char state = 0;
  uint64_t start = 0;
  // The process exists: unless /proc proves it is another one (or a zombie), it is the
  // member. Never free a live member's slot on a guess (an unreadable /proc, a race with
  // its exit that the next sweep settles).
  if (!paths::process_stat(pid, &state, &start)) return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH;
  if (state == 'X' || state == 'x') return false;
  if (state == 'Z' && live_threads(pid) < 2) return false;
  return (start & 0x7fffffffULL) == owner_start_low(owner & ~kClaiming);
}

// ---- Segment -----------------------------------------------------------------------------

Segment::Segment(void* base) noexcept
    : header_(static_cast<Header*>(base)),
      members_(reinterpret_cast<Member*>(static_cast<char*>(base) + kHeaderBytes)) {}

Segment::~Segment() {
  ::munmap(header_, file_size());
  if (fd_ >= 0) ::close(fd_);
}

Segment* Segment::map_fd(int fd, std::string* error) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    *error = std::string("fstat: ") + std::strerror(errno);
    return nullptr;
  }
  if (!S_ISREG(st.st_mode)) {
    *error = "not a regular file";
    return nullptr;
  }
  if (static_cast<uint64_t>(st.st_size) != file_size()) {
    *error = "size " + std::to_string(st.st_size) + " bytes, expected " + std::to_string(file_size()) +
             " (a job file of another cuwarden version?)";
    return nullptr;
  }
  void* base = ::mmap(nullptr, file_size(), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    *error = std::string("mmap: ") + std::strerror(errno);
    return nullptr;
  }
  auto* h = static_cast<Header*>(base);
  uint64_t magic = h->magic.load(std::memory_order_acquire);
  if (magic == 0) {
    h->magic.compare_exchange_strong(magic, kMagic, std::memory_order_acq_rel);
    magic = h->magic.load(std::memory_order_acquire);
  }
  if (magic != kMagic) {
    ::munmap(base, file_size());
    *error = "not a job file of this cuwarden version (bad magic)";
    return nullptr;
  }
  return new Segment(base);
}

Segment* Segment::open(const std::string& dir, uint32_t uid, const std::string& name, bool create,
                       std::string* error) {
  std::string why;
  if (!valid_job_name(name, &why)) {
    *error = "job \"" + name + "\": " + why;
    return nullptr;
  }
  const std::string path = dir + "/" + file_name(uid, name);
  int flags = O_RDWR | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK;
  if (create) flags |= O_CREAT;
  // The file may be removed between our open and our lock (its last member gone, see the
  // top of job.hpp): then the name is opened again. Someone holds the exclusive lock only
  // while checking and removing, so the wait is short; it is bounded all the same.
  for (int attempt = 0;; ++attempt) {
    const int fd = ::open(path.c_str(), flags, 0600);
    if (fd < 0) {
      *error = path + ": " + std::strerror(errno);
      return nullptr;
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != uid || (st.st_mode & 077) != 0) {
      ::close(fd);
      *error = path + ": not a regular file of uid " + std::to_string(uid) + " with mode 0600; refusing to use it";
      return nullptr;
    }
    if (::flock(fd, LOCK_SH | LOCK_NB) != 0) {
      const int err = errno;
      if (err == EWOULDBLOCK) {
        ::close(fd);
        if (attempt < kLockAttempts) {
          const timespec pause{0, attempt < 50 ? 1'000'000 : 10'000'000};  // 1 ms, then 10 ms: about 1 s in all
          ::nanosleep(&pause, nullptr);
          continue;
        }
        *error = path + ": held locked (being removed?) for a second; try again";
        return nullptr;
      }
      // A file system without flock (some network and FUSE ones): nobody can lock the file,
      // so the daemon never removes it either, and the job works as without the lock.
      if (err != ENOLCK && err != ENOSYS && err != EINVAL && err != EOPNOTSUPP) {
        ::close(fd);
        *error = path + ": flock: " + std::strerror(err);
        return nullptr;
      }
    }
    if (::fstat(fd, &st) != 0) {
      *error = path + ": fstat: " + std::strerror(errno);
      ::close(fd);
      return nullptr;
    }
    if (st.st_nlink == 0) {  // removed before we locked it: the name is a new file now
      ::close(fd);
      if (attempt < kLockAttempts) continue;
      *error = path + ": removed as often as it was opened; try again";
      return nullptr;
    }
    // Every member grows a new file to the same size: the race between them is harmless,
    // and all-zero content is an empty job. Every page is allocated before it is mapped:
    // on a full tmpfs the first write to one that is not would be SIGBUS in the program.
    if (create && (st.st_size == 0 || static_cast<uint64_t>(st.st_size) == file_size())) {
      if (const int err = ::posix_fallocate(fd, 0, static_cast<off_t>(file_size())); err != 0) {
        *error = path + ": cannot allocate " + std::to_string(file_size()) + " bytes: " + std::strerror(err);
        ::close(fd);
        return nullptr;
      }
    }
    Segment* s = map_fd(fd, &why);
    if (!s) {
      ::close(fd);
      *error = path + ": " + why;
      return nullptr;
    }
    s->fd_ = fd;
    return s;
  }
}

int Segment::gpu_index(const uint8_t uuid[16], uint64_t physical_total) noexcept {
  const uint64_t key = uuid_key(uuid);
  for (uint32_t i = 0; i < kMaxGpus; ++i) {
    GpuEntry& e = header_->gpus[i];
    uint64_t k = e.key.load(std::memory_order_acquire);
    if (k == 0 && e.key.compare_exchange_strong(k, key, std::memory_order_acq_rel)) {
      std::memcpy(e.uuid, uuid, sizeof e.uuid);
      if (physical_total) e.physical_total.store(physical_total, std::memory_order_relaxed);
      return static_cast<int>(i);
    }
    if (k == key) {
      if (physical_total && e.physical_total.load(std::memory_order_relaxed) == 0)
        e.physical_total.store(physical_total, std::memory_order_relaxed);
      return static_cast<int>(i);
    }
  }
  return -1;
}

int Segment::join(uint32_t pid, uint64_t start_time, uint64_t limit, uint64_t now_realtime_ns) noexcept {
  const uint64_t me = owner_word(pid, start_time);
  // Free what the process image before an exec left under this same identity (this image
  // joins once), and dead members, whose limits must not outlive them.
  const uint32_t hw = std::min(header_->high_water.load(std::memory_order_acquire), kMaxMembers);
  const uint64_t now = mono_coarse_ns();
  for (uint32_t i = 0; i < hw; ++i) {
    Member& m = members_[i];
    uint64_t o = m.owner.load(std::memory_order_acquire);
    if (o == 0) continue;
    bool dead;
    const uint64_t ns = m.pidns.load(std::memory_order_relaxed);
    if ((o & ~kClaiming) == me) dead = true;
    else if (ns != 0 && ns != self_pidns()) dead = false;  // not ours to judge
    else if (::kill(static_cast<pid_t>(owner_pid(o)), 0) != 0 && errno == ESRCH) dead = true;
    else if (now - m.checked_ns.load(std::memory_order_relaxed) < kRecheckNs) dead = false;
    else if (!(dead = !owner_alive(o))) m.checked_ns.store(now, std::memory_order_relaxed);  // checked: alive
    if (dead) m.owner.compare_exchange_strong(o, 0, std::memory_order_acq_rel);
  }
  for (uint32_t i = 0; i < kMaxMembers; ++i) {
    Member& m = members_[i];
    uint64_t o = 0;
    if (m.owner.load(std::memory_order_relaxed) != 0) continue;
    if (!m.owner.compare_exchange_strong(o, me | kClaiming, std::memory_order_acq_rel)) continue;
    // The slot is ours but skipped by every sum until the claiming bit goes: clear what a
    // dead predecessor left, then publish.
    for (auto& c : m.charged) c.store(0, std::memory_order_relaxed);
    m.limit.store(limit, std::memory_order_relaxed);
    m.requested.store(limit, std::memory_order_relaxed);
    m.refusals.store(0, std::memory_order_relaxed);
    m.pidns.store(self_pidns(), std::memory_order_relaxed);
    m.joined_ns.store(now_realtime_ns, std::memory_order_relaxed);
    m.checked_ns.store(now, std::memory_order_relaxed);
    uint32_t h = header_->high_water.load(std::memory_order_relaxed);
    while (h < i + 1 && !header_->high_water.compare_exchange_weak(h, i + 1, std::memory_order_seq_cst)) {
    }
    m.owner.store(me, std::memory_order_seq_cst);
    return static_cast<int>(i);
  }
  return -1;
}

uint64_t Segment::cap() const noexcept {
  const uint32_t hw = std::min(header_->high_water.load(std::memory_order_acquire), kMaxMembers);
  uint64_t cap = kNoLimit;
  for (uint32_t i = 0; i < hw; ++i) {
    const Member& m = members_[i];
    const uint64_t o = m.owner.load(std::memory_order_seq_cst);
    if (o == 0 || (o & kClaiming)) continue;
    const uint64_t l = m.limit.load(std::memory_order_relaxed);
    if (l < cap) cap = l;
  }
  return cap;
}

uint64_t Segment::used(int g) const noexcept {
  if (g < 0 || static_cast<uint32_t>(g) >= kMaxGpus) return 0;
  const uint32_t hw = std::min(header_->high_water.load(std::memory_order_acquire), kMaxMembers);
  uint64_t sum = 0;
  for (uint32_t i = 0; i < hw; ++i) {
    const Member& m = members_[i];
    const uint64_t o = m.owner.load(std::memory_order_seq_cst);
    if (o == 0 || (o & kClaiming)) continue;
    sum += m.charged[g].load(std::memory_order_seq_cst);
  }
  return sum;
}

bool Segment::charge(int slot, int g, uint64_t bytes, uint64_t* cap_out, uint64_t* used_out) noexcept {
  if (slot < 0 || static_cast<uint32_t>(slot) >= kMaxMembers || g < 0 || static_cast<uint32_t>(g) >= kMaxGpus)
    return true;
  Member& me = members_[slot];
  // Cost with n members: one locked add, then n slots read (owner, limit, one counter:
  // two cache lines each). Paid only by processes in a job.
  bool swept = false;
  for (int attempt = 0;; ++attempt) {
    me.charged[g].fetch_add(bytes, std::memory_order_seq_cst);
    const uint32_t hw = std::min(header_->high_water.load(std::memory_order_seq_cst), kMaxMembers);
    uint64_t sum = 0, cap = kNoLimit;
    for (uint32_t i = 0; i < hw; ++i) {
      const Member& m = members_[i];
      const uint64_t o = m.owner.load(std::memory_order_seq_cst);
      if (o == 0 || (o & kClaiming)) continue;
      sum += m.charged[g].load(std::memory_order_seq_cst);
      const uint64_t l = m.limit.load(std::memory_order_relaxed);
      if (l < cap) cap = l;
    }
    if (sum <= cap) {
      raise_peak(g, sum);
      // Liveness of the others, at most every kSweepIntervalNs across the whole job.
      sweep(false, slot);
      return true;
    }
    me.charged[g].fetch_sub(bytes, std::memory_order_seq_cst);
    // Our own bytes, counted in `sum`, are taken back; what others hold is the rest.
    const uint64_t others = sum - bytes;
    if (cap_out) *cap_out = cap;
    if (used_out) *used_out = others;
    if (attempt + 1 >= kChargeAttempts) break;
    if (others > cap || cap - others < bytes) {
      // Full without us. Dead members may be what fills it: check them once.
      if (swept) break;
      swept = true;
      const uint64_t now = mono_coarse_ns();
      const uint64_t last = last_forced_sweep_ns_.load(std::memory_order_relaxed);
      if (now - last < kForcedSweepGapNs) break;
      last_forced_sweep_ns_.store(now, std::memory_order_relaxed);
      if (sweep(true, slot) == 0) break;
      continue;
    }
    // It would fit but for other members' attempts in flight: let them settle.
    sched_yield();
  }
  me.refusals.fetch_add(1, std::memory_order_relaxed);
  return false;
}

void Segment::force_charge(int slot, int g, uint64_t bytes) noexcept {
  if (slot < 0 || static_cast<uint32_t>(slot) >= kMaxMembers || g < 0 || static_cast<uint32_t>(g) >= kMaxGpus)
    return;
  members_[slot].charged[g].fetch_add(bytes, std::memory_order_seq_cst);
  raise_peak(g, used(g));
}

void Segment::raise_peak(int g, uint64_t sum) noexcept {
  std::atomic<uint64_t>& peak = header_->gpus[g].peak;
  uint64_t cur = peak.load(std::memory_order_relaxed);
  while (sum > cur && !peak.compare_exchange_weak(cur, sum, std::memory_order_relaxed)) {
  }
}

void Segment::uncharge(int slot, int g, uint64_t bytes) noexcept {
  if (slot < 0 || static_cast<uint32_t>(slot) >= kMaxMembers || g < 0 || static_cast<uint32_t>(g) >= kMaxGpus)
    return;
  members_[slot].charged[g].fetch_sub(bytes, std::memory_order_seq_cst);
}

uint32_t Segment::sweep(bool force, int skip_slot, uint64_t recheck_ns, std::span<const uint64_t> running) noexcept {
  const uint64_t now = mono_coarse_ns();
  if (!force) {
    uint64_t last = header_->last_sweep_ns.load(std::memory_order_relaxed);
    if (now - last < kSweepIntervalNs && now >= last) return 0;
    if (!header_->last_sweep_ns.compare_exchange_strong(last, now, std::memory_order_relaxed)) return 0;
  } else {
    header_->last_sweep_ns.store(now, std::memory_order_relaxed);
  }
  const uint32_t hw = std::min(header_->high_water.load(std::memory_order_acquire), kMaxMembers);
  uint32_t freed = 0;
  for (uint32_t i = 0; i < hw; ++i) {
    if (static_cast<int>(i) == skip_slot) continue;
    Member& m = members_[i];
    uint64_t o = m.owner.load(std::memory_order_acquire);
    if (o == 0) continue;
    const uint64_t ns = m.pidns.load(std::memory_order_relaxed);
    if (ns != 0 && ns != self_pidns()) {  // not ours to judge
      m.checked_ns.store(now, std::memory_order_relaxed);
      continue;
    }
    if (std::binary_search(running.begin(), running.end(), o & ~kClaiming)) continue;
    if (recheck_ns && now - m.checked_ns.load(std::memory_order_relaxed) < recheck_ns &&
        (::kill(static_cast<pid_t>(owner_pid(o)), 0) == 0 || errno != ESRCH))
      continue;  // found alive lately, and its pid is still there
    if (owner_alive(o)) {
      m.checked_ns.store(now, std::memory_order_relaxed);
      continue;
    }
    // One CAS: if the slot changed hands meanwhile (a new owner), it is left alone.
    if (m.owner.compare_exchange_strong(o, 0, std::memory_order_acq_rel)) ++freed;
  }
  return freed;
}

uint32_t Segment::set_limit(uint64_t bytes, bool lower_only) noexcept {
  const uint32_t hw = std::min(header_->high_water.load(std::memory_order_acquire), kMaxMembers);
  uint32_t changed = 0;
  for (uint32_t i = 0; i < hw; ++i) {
    Member& m = members_[i];
    if (m.owner.load(std::memory_order_acquire) == 0) continue;
    if (!lower_only) {
      m.limit.store(bytes, std::memory_order_seq_cst);
    } else {
      uint64_t cur = m.limit.load(std::memory_order_seq_cst);
      while (cur > bytes && !m.limit.compare_exchange_weak(cur, bytes, std::memory_order_seq_cst)) {
      }
    }
    ++changed;
  }
  return changed;
}

std::vector<Segment::MemberInfo> Segment::members() const {
  std::vector<MemberInfo> out;
  const uint32_t hw = std::min(header_->high_water.load(std::memory_order_acquire), kMaxMembers);
  for (uint32_t i = 0; i < hw; ++i) {
    const Member& m = members_[i];
    const uint64_t o = m.owner.load(std::memory_order_acquire);
    if (o == 0) continue;
    MemberInfo mi;
    mi.slot = i;
    mi.owner = o & ~kClaiming;
    mi.pid = owner_pid(o);
    mi.claiming = (o & kClaiming) != 0;
    mi.limit = m.limit.load(std::memory_order_relaxed);
    mi.requested = m.requested.load(std::memory_order_relaxed);
    mi.joined_ns = m.joined_ns.load(std::memory_order_relaxed);
    mi.refusals = m.refusals.load(std::memory_order_relaxed);
    for (uint32_t g = 0; g < kMaxGpus; ++g) mi.charged[g] = m.charged[g].load(std::memory_order_relaxed);
    out.push_back(mi);
  }
  return out;
}

std::vector<Segment::GpuInfo> Segment::gpus() const {
  std::vector<GpuInfo> out;
  for (uint32_t i = 0; i < kMaxGpus; ++i) {
    const GpuEntry& e = header_->gpus[i];
    const uint64_t k = e.key.load(std::memory_order_acquire);
    if (k == 0) continue;
    GpuInfo gi;
    gi.index = static_cast<int>(i);
    std::memcpy(gi.uuid, e.uuid, sizeof gi.uuid);
    if (uuid_key(gi.uuid) != k) std::memset(gi.uuid, 0, sizeof gi.uuid);  // not written yet, or garbage
    gi.physical_total = e.physical_total.load(std::memory_order_relaxed);
    gi.peak = e.peak.load(std::memory_order_relaxed);
    out.push_back(gi);
  }
  return out;
}

}  // namespace cuw::job

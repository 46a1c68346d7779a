// cuwarden: the job segment, a shared-memory file through which the processes of one job
// (one user, one CUWARDEN_JOB name) share a cap per physical GPU.
//
// File: <job dir>/job-<uid>-<name>.cwj, mode 0600, owned by the job's user, fixed size
// file_size(). The job dir is <run dir>/jobs/<uid>/, a 0700 directory of that user (made by
// a root daemon for every uid it sees, by the Slurm plugin or a pod's init step, else by the
// user's first member), or, where that name belongs to someone else, the first of
// <run dir>/jobs-<uid>-<n>/ (choose_dir() below): nobody else can create, hold or replace a
// name in it, so no other user can block or split a job by taking its file's name first.
//
// An all-zero file is a valid empty job, so creating one needs no lock and no initialiser:
// every member opens it with O_CREAT, allocates it to file_size() (the same size from every
// member, so the race is harmless) and maps it.
//
// Accounting without a lock (reserve, then validate):
//   Each member owns one Member slot and is the only writer of its `charged[]` counters.
//   To take `bytes` on GPU g a member adds them to its own counter first, then sums every
//   occupied slot's counter for g and reads the job's cap (the lowest `limit` of the
//   occupied slots). Over the cap: it takes the bytes back and refuses. Why the sum of what
//   members hold never passes the cap: of the reservations held at any moment, take the
//   one whose add came last. Its sum was read after every other held reservation had been
//   added (and none of them has been taken back, since they are held), so it saw at least
//   all of them and found them within the cap. Concurrent attempts can only over-count
//   each other, which may refuse an allocation spuriously near the cap (bounded retries
//   make that rare) but never lets one through wrongly.
//
// Death at any instruction: a member's bytes are exactly its own slot's counters, changed
// by single atomic instructions. A member killed anywhere leaves its slot occupied by its
// identity (pid + start time). Whoever finds that identity dead (another member on its
// next allocation, at most a sweep interval later, at once when it would otherwise refuse;
// a member joining; the daemon) frees the slot with one CAS on its owner word; from then on
// the sums skip it. A pid reused by the OS has a different start time and is not mistaken
// for the member. There is no lock, so nothing can be left locked.
//
// Stale caps: the job's cap is the lowest `limit` among occupied slots, so it lives and
// dies with the members; a process joining an empty job sets it afresh.
//
// End of a job: every member holds a shared flock(2) on the file from before it joins until
// it exits or execs (the kernel drops it, whatever killed the process). Whoever gets an
// exclusive lock without waiting and then finds no member left (the daemon, on its scans)
// may remove the file: nothing can join meanwhile, since joining needs the shared lock, and
// an opener that locks a file already removed (st_nlink 0) opens the name again. So a job's
// file goes with its last member and one name never means two segments.
//
// Trust: the file is writable by its user only. The daemon (which may run as root) treats
// every byte as hostile: bounded loops, no lengths taken from the file.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace cuw::job {

inline constexpr uint64_t kMagic = 0x31304a4f42575543ULL;  // "CUWBOJ01" little-endian: layout version 1
inline constexpr uint32_t kMaxMembers = 1024;  ///< processes in one job at once
inline constexpr uint32_t kMaxGpus = 16;       ///< physical GPUs one job can use
inline constexpr uint32_t kHeaderBytes = 4096;
inline constexpr uint64_t kNoLimit = ~0ULL;
/// Set in Member::owner while a process is taking the slot over: sums skip such slots.
inline constexpr uint64_t kClaiming = 1ULL << 63;
inline constexpr const char* kFilePrefix = "job-";
inline constexpr const char* kFileSuffix = ".cwj";
/// How often members check each other's liveness on their allocation path (ns).
inline constexpr uint64_t kSweepIntervalNs = 250'000'000;

static_assert(std::atomic<uint64_t>::is_always_lock_free);

/// A physical GPU of the job, found by UUID. 64 bytes.
struct GpuEntry {
  std::atomic<uint64_t> key;  ///< 0: free; else uuid_key(uuid), never 0. Claimed by CAS.
  uint8_t uuid[16];           ///< CUuuid bytes, written right after key is claimed
  std::atomic<uint64_t> physical_total;  ///< device memory in bytes, 0 until known
  /// Highest sum held on this GPU by the job's members seen by a successful charge (bytes);
  /// raised by CAS, never lowered. Another member's attempt in flight (refused a moment
  /// later) can count in it: it may be a little high, never above the cap then in force.
  std::atomic<uint64_t> peak;
  uint64_t reserved_words[3];
};
static_assert(sizeof(GpuEntry) == 64);

/// One member process. Cache-line aligned, 256 bytes.
struct alignas(64) Member {
  /// 0: free. Else owner_word(pid, start_time), with kClaiming while being taken over.
  std::atomic<uint64_t> owner;
  /// The cap (bytes per GPU) this member applies to the job; kNoLimit = none. Starts as
  /// `requested` (or what policy allows); `cuwarden limit job:NAME` rewrites it live.
  std::atomic<uint64_t> limit;
  std::atomic<uint64_t> requested;  ///< the member's own CUWARDEN_JOB_LIMIT, bytes (kNoLimit: none)
  std::atomic<uint64_t> joined_ns;  ///< CLOCK_REALTIME when it joined
  std::atomic<uint64_t> checked_ns; ///< CLOCK_MONOTONIC_COARSE of the last liveness check that found it alive
  std::atomic<uint64_t> refusals;   ///< allocations refused because the job was full
  /// Inode of the member's pid namespace (/proc/self/ns/pid); 0 if unknown. Liveness is
  /// judged only by a process in the same namespace: another one would see other pids.
  std::atomic<uint64_t> pidns;
  uint64_t reserved_word;
  std::atomic<uint64_t> charged[kMaxGpus];  ///< bytes held per GPU index, written by the owner only
};
static_assert(sizeof(Member) == 192);

/// The file header (kHeaderBytes); Member[kMaxMembers] follows.
struct Header {
  std::atomic<uint64_t> magic;        ///< 0 (fresh file) or kMagic
  std::atomic<uint32_t> high_water;   ///< slots [0, high_water) may be occupied
  uint32_t pad;
  std::atomic<uint64_t> last_sweep_ns;  ///< CLOCK_MONOTONIC_COARSE of the last liveness sweep
  uint64_t reserved_words[13];
  GpuEntry gpus[kMaxGpus];
};
static_assert(sizeof(Header) <= kHeaderBytes);

constexpr uint64_t file_size() noexcept { return uint64_t{kHeaderBytes} + uint64_t{kMaxMembers} * sizeof(Member); }

/// Owner word of a process: start time's low 31 bits above the pid. Never 0 (pid > 0).
constexpr uint64_t owner_word(uint32_t pid, uint64_t start_time) noexcept {
  return ((start_time & 0x7fffffffULL) << 32) | pid;
}
constexpr uint32_t owner_pid(uint64_t owner) noexcept { return static_cast<uint32_t>(owner); }
constexpr uint64_t owner_start_low(uint64_t owner) noexcept { return (owner >> 32) & 0x7fffffffULL; }

/// Key of a UUID in the GPU table: a 64-bit mix of its bytes, never 0.
uint64_t uuid_key(const uint8_t uuid[16]) noexcept;

/// Job names: 1..63 bytes of [A-Za-z0-9._-], not starting with '.'. False with *why set.
bool valid_job_name(const std::string& name, std::string* why);

/// "job-<uid>-<name>.cwj"
std::string file_name(uint32_t uid, const std::string& name);

/// The run directory's folder of per-user job directories: <run dir>/jobs/<uid>/.
inline constexpr const char* kJobsDir = "jobs";
/// Fallback job directories <run dir>/jobs-<uid>-<n>/ tried, n = 0 .. kFallbackDirs - 1.
inline constexpr uint32_t kFallbackDirs = 64;
/// "jobs-<uid>-<n>"
std::string fallback_dir_name(uint32_t uid, uint32_t n);
/// Parse a fallback directory's name; false if `name` is not one (n out of range included).
bool parse_fallback_dir_name(const std::string& name, uint32_t* uid, uint32_t* n);

/// Where the members of `uid`'s job `name` keep its file under `run_dir`, and what the
/// choice had to skip.
struct DirChoice {
  std::string path;  ///< the job directory (no trailing slash); empty when none is usable
  /// Names skipped because they belong to someone else (or are not directories), one
  /// sentence naming each owner; empty when the primary directory was used.
  std::string skipped;
};

/// Choose (creating where needed) the job directory of `uid`'s job `name` under `run_dir`.
/// `run_dir` itself when the previous release's file of the job is there, `uid`'s (regular,
/// mode 0600) and held by a live member (its members still run: the job is joined, not
/// split). Otherwise a directory is usable when it is a real directory (never a link) owned by `uid` with
/// mode 0700. The first usable candidate that already holds the job's file wins (so a
/// member joins its job wherever the job began); else the first usable one, in the order
/// <run dir>/jobs/<uid> (made 0700 when <run dir>/jobs is a directory of root or `uid`;
/// <run dir>/jobs itself is made only in a run directory that `uid` owns), then
/// <run dir>/jobs-<uid>-<n> for n = 0, 1, ... (made 0700 when absent). Every member of a job
/// sees the same names, so every member chooses the same directory. Call it as `uid` (it
/// makes directories that must be `uid`'s). Opens and makes files: cold paths only. Never
/// follows a symlink. False (error set) when no candidate is usable.
bool choose_dir(const std::string& run_dir, uint32_t uid, const std::string& name, DirChoice* out,
                std::string* error);
/// Parse a job file name; false if `file` is not one (or the name is not valid).
bool parse_file_name(const std::string& file, uint32_t* uid, std::string* name);

/// Liveness of a member's owner word: false when the process is gone, a zombie (all its
/// threads exited), its pid now belongs to a process with another start time, or to another
/// user (a member runs as the job's user). Reads /proc; never call it before the first
/// CUDA call in the interposer.
bool owner_alive(uint64_t owner) noexcept;

/// Inode of the calling process's pid namespace (cached), or 0 when unknown.
uint64_t self_pidns() noexcept;

/// A mapped job segment. Not copyable; unmaps on destruction unless leaked.
class Segment {
 public:
  /// Open (and with `create`, create) the job file `dir`/file_name(uid, name) and map it
  /// read-write, as a member: takes the shared lock that keeps the file from being removed
  /// and keeps its descriptor (close-on-exec) for the Segment's life. Refuses (nullptr,
  /// *error set) when: the name is invalid, the file is not a regular file owned by `uid`
  /// with no group/other access, its size is neither 0 nor file_size(), its magic is another
  /// layout version, mmap fails, or the shared lock stays held exclusively (someone removing
  /// the file) past about a second. Never follows a symlink.
  static Segment* open(const std::string& dir, uint32_t uid, const std::string& name, bool create,
                       std::string* error);
  /// Map an already open descriptor (the daemon opens files relative to its dirfd). Same
  /// checks as open() except ownership, which the caller checks. Does not take `fd` and
  /// takes no lock.
  static Segment* map_fd(int fd, std::string* error);
  ~Segment();
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  Header& header() noexcept { return *header_; }
  Member& member(uint32_t i) noexcept { return members_[i]; }

  /// Index of the GPU with `uuid` in the job's table, adding it when new; -1 when the table
  /// is full. `physical_total` (bytes) is recorded for display. Lock-free.
  int gpu_index(const uint8_t uuid[16], uint64_t physical_total) noexcept;

  /// Take a slot for (pid, start_time) with the given cap (bytes per GPU, kNoLimit for
  /// none). A member keeps its slot until it dies; it does not give it back at exit, since
  /// frees made by other threads or destructors after that could land in the slot's next
  /// owner's counters. The next sweep frees it. Slots still held by this same identity (left by the process image before an
  /// exec) and slots of dead members are freed first. Returns the slot index, or -1 when
  /// every slot is held by a live process. Lock-free.
  int join(uint32_t pid, uint64_t start_time, uint64_t limit, uint64_t now_realtime_ns) noexcept;


  /// Reserve `bytes` on GPU `g` for `slot` (see the top of this file). True when reserved.
  /// On refusal *cap and *used (bytes, the job's cap and the sum held on g) say why.
  /// Retries a few times when concurrent attempts may have caused the refusal; sweeps dead
  /// members first when that could make room (at most once per 10 ms per caller unless
  /// `force_sweep`). Lock-free: bounded loops, no waiting on other processes.
  bool charge(int slot, int g, uint64_t bytes, uint64_t* cap = nullptr, uint64_t* used = nullptr) noexcept;
  /// Add bytes already allocated, cap or not (a pitch larger than estimated).
  void force_charge(int slot, int g, uint64_t bytes) noexcept;
  /// Give back bytes taken by charge()/force_charge(). Wait-free.
  void uncharge(int slot, int g, uint64_t bytes) noexcept;

  /// The job's cap (lowest limit of occupied slots; kNoLimit if none) and the bytes held on
  /// GPU g by occupied slots. Lock-free snapshot (each word read once).
  uint64_t cap() const noexcept;
  uint64_t used(int g) const noexcept;

  /// Free the slots of dead members. `force` = false does it at most every
  /// kSweepIntervalNs across all members (one CAS on header.last_sweep_ns decides who).
  /// `skip_slot` is the caller's own slot (never checked). With `recheck_ns`, a member whose
  /// pid still exists (kill 0) and that /proc found alive less than `recheck_ns` ago is taken
  /// as alive without reading /proc again (the daemon's sweep of every job every second):
  /// an exited and reaped member is still freed at once; a zombie, or a pid reused by
  /// another process, within `recheck_ns`. `running`: owner words (without kClaiming, in
  /// ascending order) of processes the caller knows to run now (the daemon: those whose
  /// pidfd has not signalled their exit); their members are taken as alive without a signal
  /// or a read of /proc. Returns how many were freed.
  uint32_t sweep(bool force, int skip_slot = -1, uint64_t recheck_ns = 0,
                 std::span<const uint64_t> running = {}) noexcept;

  /// Set every occupied slot's `limit` to `bytes` (live limit changes). With `lower_only`
  /// a slot whose limit is already below `bytes` keeps it (a CAS loop: a member joining
  /// meanwhile with a lower request is never raised). Returns how many members were changed.
  uint32_t set_limit(uint64_t bytes, bool lower_only = false) noexcept;

  /// For display and tests: occupied slots, each word read once.
  struct MemberInfo {
    uint32_t slot = 0, pid = 0;
    uint64_t owner = 0, limit = kNoLimit, requested = kNoLimit, joined_ns = 0, refusals = 0;
    bool claiming = false;
    uint64_t charged[kMaxGpus] = {};
  };
  struct GpuInfo {
    int index = 0;
    uint8_t uuid[16] = {};
    uint64_t physical_total = 0;
    uint64_t peak = 0;  ///< GpuEntry::peak, bytes
  };
  std::vector<MemberInfo> members() const;
  std::vector<GpuInfo> gpus() const;

 private:
  Segment(void* base) noexcept;
  void raise_peak(int g, uint64_t sum) noexcept;
  Header* header_;
  Member* members_;
  int fd_ = -1;  ///< a member's descriptor, holding the shared lock; -1 in the daemon
  std::atomic<uint64_t> last_forced_sweep_ns_{0};  ///< CLOCK_MONOTONIC, this process's forced sweeps
};

}  // namespace cuw::job

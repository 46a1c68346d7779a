// cuwarden daemon model: the set of interposed processes it knows, discovered from ring files.
//
// scan() lists the run directory (on inotify events, and every second unless the caller
// knows the listing did not change), opens new rings, notices exits (pidfds in one epoll set)
// and forgets exited processes after a linger time. drain_all() copies events
// out of every ring into a bounded per-process history, numbered by one global sequence.
// publish() reads every ring header afresh (they, not the event stream, are authoritative)
// and swaps a new State into store(), which views on any thread read.
//
// Thread-safety: every member but store() belongs to the loop thread; store() may be read
// from any thread.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "model/control.hpp"
#include "model/event_journal.hpp"
#include "model/jobs.hpp"
#include "model/nvml.hpp"
#include "model/peer.hpp"
#include "model/policy.hpp"
#include "model/ring_view.hpp"
#include "model/state.hpp"
#include "model/room.hpp"
#include "model/suspend.hpp"

namespace cuw::daemon {

struct RegistryOptions {
  std::string run_dir;
  /// A directory in run_dir (one name) each of whose subdirectories is a pod's run directory
  /// of its own, followed as run_dir is (Kubernetes: each pod mounts only its own); "": none.
  std::string pods_dir;
  /// An inotify descriptor to which the pods' directories are added as they are found (-1: none).
  int watch_fd = -1;
  std::size_t history_per_process = 10000;      ///< events kept per process
  uint64_t exited_linger_ns = 60'000'000'000;   ///< how long exited processes stay visible
  uint64_t problem_grace_ns = 1'000'000'000;    ///< a ring being created may look broken this long
  std::size_t max_rings = 4096;                 ///< processes tracked at once
  std::size_t max_rings_per_uid = 1024;         ///< processes of one uid tracked at once
  std::size_t max_jobs = 1024;                  ///< job segments tracked at once
  bool unlink_exited = true;                    ///< remove ring files of processes forgotten
  uint64_t nvml_refresh_ns = 500'000'000;       ///< NVML is asked at most this often by publish()
  uint64_t sample_every_ns = kSampleEveryNs;    ///< live memory by call site, per process (--leaks)
};

class Registry {
 public:
  /// `dirfd` is an open O_DIRECTORY descriptor of options.run_dir (the registry owns it).
  Registry(RegistryOptions options, int dirfd, const Nvml* nvml);
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  /// List the run directory: open new rings, retry broken ones, detect exits, forget old ones.
  /// `listing_changed` false (inotify saw nothing since the last scan): the names of the last
  /// listing stand, and neither the directory is read nor each name stat'ed (a thousand idle
  /// processes made that a quarter of an idle daemon's time); still listed afresh at least
  /// every kFullScanNs. `retry_unchanged` false (a scan woken by inotify rather than the
  /// periodic one): a file that failed before and has not changed since (device, inode, size,
  /// mtime) is not probed again. A file that failed for good is probed again only once it
  /// changes; one that failed for a moment (a ring being created) also at each periodic scan.
  void scan(bool listing_changed = true, bool retry_unchanged = true);
  /// Whether a ring failed for a moment within problem_grace_ns (one being created, whose
  /// producer writes its header through a mapping, which raises no inotify event): the loop
  /// then scans again within milliseconds rather than at the next periodic scan.
  bool retry_soon() const;
  static constexpr uint64_t kFullScanNs = 30'000'000'000ULL;
  /// Drain every ring once. Returns true if some ring had more events than one round takes
  /// (the caller should drain again soon).
  /// How soon the next drain should come: at once (a ring still had events after this
  /// tick's budget), soon (a ring filled an eighth of itself since the last tick), after the
  /// idle interval, or, when every ring has been idle a while (each was visited this time),
  /// after kIdleStride idle intervals.
  enum class DrainPace { again, soon, idle, all_idle };
  /// A ring with no event for a second is visited every kIdleStride-th drain (registry.cpp).
  static constexpr uint32_t kIdleStride = 8;
  DrainPace drain_all();

  /// Build a State from every ring header, job segment and the histories, and publish it
  /// to store(). Rings that fault while being read are dropped. Loop thread only.
  void publish();
  /// The published States: any thread may load() from it.
  const StateStore& store() const noexcept { return store_; }

  /// Live limit change requested by `peer` (protocol.hpp, set_limit). Checks the rules
  /// (root: anything; others: only lower caps of their own processes and jobs, within the
  /// policy), applies it whole or not at all, and logs and records it. The outcome, a
  /// refusal or failure with its reason included, is the result; it throws only what
  /// allocation throws. Loop thread only (it may scan()); publish() afterwards to show it.
  LimitResult set_limit(const Peer& peer, const LimitRequest& request);
  /// set_limit(), then publish() whatever the outcome (a refusal is in the limit log too),
  /// so that the requester's next query sees it. Loop thread only.
  LimitResult set_limit_and_publish(const Peer& peer, const LimitRequest& request) {
    try {
      LimitResult r = set_limit(peer, request);
      publish();
      return r;
    } catch (...) {
      publish();
      throw;
    }
  }

  /// Suspend or resume by hand, in three steps (suspend.cpp; the driver's calls run in
  /// between on a worker, model/suspender.hpp). prepare_suspend() checks `req` from `peer`:
  /// who may (the owner or root, as for caps), which processes (one, or every member of a
  /// job), and whether each can be suspended (nothing the driver cannot carry, room on the
  /// host for its device footprint) or resumed (its footprint and a margin free on its GPUs
  /// now). Done: the targets, each held busy until finish_suspend(); otherwise the refusal
  /// or failure, nothing held. Loop thread only; throws only what allocation throws.
  SuspendResult prepare_suspend(const Peer& peer, const SuspendRequest& req);
  /// Record what the driver did to prepare_suspend()'s targets (each SuspendTarget::done):
  /// the processes' state, an event each, the log, the record in the suspend directory; the
  /// busy marks cleared; then publish(). Loop thread only.
  void finish_suspend(const Peer& peer, const SuspendResult& r);
  /// Tell a restored target's ring it was resumed (its "suspended N s by USER; resumed" line),
  /// before the driver unlocks it: its first call after the unlock finds the notice. Loop
  /// thread only.
  void tell_resumed(const Peer& peer, const SuspendResult& r, const SuspendTarget& t);
  /// Making room by policy (room.cpp). plan_room(): the requester (the peer's own process,
  /// which must be under cuwarden), the shortfall on the GPU (NVML), and the processes to
  /// suspend (room.hpp: choose_victims; never one related to the requester, of its priority
  /// or above, waiting for room itself, or resumed less than min_run ago); on `suspend` the
  /// requester is marked waiting until end_room(), which also records it as what each of
  /// `suspended` (those suspended for it) was suspended for. Loop thread only.
  RoomPlan plan_room(const Peer& peer, const RoomRequest& req);
  void end_room(uint32_t pid, uint64_t start_time, const std::vector<RoomCandidate>& suspended);
  /// The processes suspended by policy to resume now, highest priority first: each one's
  /// footprint and margin have stayed free on its GPUs (NVML) for its resume_after, after
  /// what any higher one still waiting needs. Loop thread only.
  std::vector<PolicyResume> policy_resumes_due();
  /// Hold back the allocations of every process of lower priority than one suspended by
  /// policy from the same GPU, which waits to be resumed there (ring.hpp: held_back), and
  /// release them once none such waits (resumed, exited, or resumed by hand). Writes a ring
  /// only when its mask changes. Loop thread only.
  void hold_back_for_restores();

  /// Keep a record of each suspended process in `dir` (created if missing), so that a
  /// process suspended while the daemon restarts is found again as suspended; read those
  /// there now. "": none. Before the first scan.
  void set_suspend_dir(const std::string& dir);

  /// Forget every process seen to exit, removing its ring and live segment as the linger's
  /// end would (unless the options keep them): the daemon stops, and none is left to remove
  /// them later. Returns how many were forgotten. Loop thread only.
  std::size_t remove_exited();

  /// Replace the policy (startup and SIGHUP); it is applied to every ring and job again.
  void set_policy(std::shared_ptr<const Policy> policy);
  const Policy* policy() const noexcept { return policy_.get(); }

  std::size_t process_count() const noexcept { return procs_.size(); }
  uint64_t last_seq() const noexcept { return seq_; }

  /// Out-of-memory reports: `listener` hears each one as it is taken (the loop thread; it
  /// must not block: OomKeeper queues it). Empty: none.
  void set_oom_listener(std::function<void(const std::shared_ptr<const OomReport>&)> listener) {
    oom_listener_ = std::move(listener);
  }
  /// Reports kept from before this daemon started (OomStore::load, oldest first): they come
  /// before any taken since; the newest kOomLog in all are kept.
  void restore_oom_reports(const std::vector<std::shared_ptr<const OomReport>>& older);
  /// Put `named` in the place of `taken` (its frames named since); nothing if `taken` is no
  /// longer kept. Published at the next publish().
  void replace_oom_report(const OomReport* taken, std::shared_ptr<const OomReport> named);
  /// Events from before this start (EventJournal::read_back): a process found again (same
  /// pid and start time) at the next scan gets them back, and new events are numbered after
  /// `max_seq`. Those of processes not found within three scans are forgotten. Before the first scan.
  void restore_history(RestoredHistory restored, uint64_t max_seq);
  /// Copy every event a history gets into `journal` (null: none). Loop thread.
  void set_journal(EventJournal* journal) noexcept { journal_ = journal; }

 private:
  struct Process;
  struct Problem {
    std::string reason;
    uint64_t first_seen_mono = 0;
    bool transient = false;
    // What the file looked like when it failed: unchanged files are not reopened.
    dev_t dev = 0;
    ino_t ino = 0;
    off_t size = 0;
    int64_t mtime_ns = 0;
    /// CLOCK_MONOTONIC after which an unchanged file is looked at again (0: only once it changes).
    uint64_t retry_mono = 0;
  };

  void try_open(const std::string& name, uint64_t mono, bool retry_unchanged);
  /// Notice whether `p` exited (its header's mark, else its pidfd or /proc) and mark it so.
  /// A pidfd in the epoll set counts as exited when `ready` holds it (the scan's one
  /// epoll_wait); nullptr: the pidfd is polled alone. False when its header faulted: the
  /// caller drops it, outside any walk of procs_.
  bool check_exit(Process& p, uint64_t mono, const std::set<int>* ready = nullptr);
  bool drain_one(Process& p, uint64_t now, bool* more, bool* busy);
  void drop_faulted(const std::string& name, const char* what);
  void forget(const std::string& name, bool unlink_file);
  /// Add the counters `p` last published to retired_ (before it is erased).
  void retire(const Process& p);
  void apply_policy(Process& p);
  /// Puts back a cap the process raised in its own ring past its ceiling, and counts a
  /// process the driver (NVML) sees holding more than its ceiling allows (caps_held.cpp).
  void check_caps_held(Process& p);
  /// Reads the site's ceiling for `p`'s Slurm job into it, once (caps_held.cpp).
  void read_site_ceiling(Process& p);
  /// The running process `peer` means by `pid` (peer_means: numbered in the peer's namespace).
  Process* find_running(const Peer& peer, uint32_t pid);
  /// Logs a refused or failed request: every one of root's, another user's once a second.
  void warn_refusal(const Peer& peer, const std::string& line);
  /// scan(), unless a request made one in the last 100 ms; whether it did.
  bool rescan_for_request();
  void record_change(Process* p, int device, uint64_t old_limit, uint64_t new_limit, uint64_t used, uint32_t by_uid,
                     int32_t by_pid);
  /// Mark a control request's record refused / failed with `why`, keep it (log_limit), return `why`.
  std::string log_outcome(LimitChange& entry, const char* outcome, const std::string& why);
  LimitResult set_process_limit(const Peer& peer, const std::string& who, const LimitRequest& req);
  LimitResult set_job_limit(const Peer& peer, const std::string& who, const LimitRequest& req);
  void log_limit(LimitChange entry);

  RegistryOptions opt_;
  int dirfd_;
  /// A directory that holds rings and job files: the run directory (label "") and, with
  /// pods_dir, each pod's (label "<pods_dir>/<name>"). A ring's key in procs_ and problems_
  /// is its label, a slash and its name (the name alone in the run directory): the path
  /// relative to the run directory (registry_pods.cpp).
  struct Root {
    int fd = -1;                    ///< dirfd_ for the run directory, else owned
    int watch = -1;                 ///< its inotify watch (-1: none)
    dev_t dev = 0;
    ino_t ino = 0;
    std::set<std::string> jobs, fallbacks;  ///< the last listing's names there
  };
  std::map<std::string, Root> roots_;  ///< by label
  /// Opens the pods' directories that appeared (a symlink refused) and closes those gone.
  void list_pods();
  /// Lists `root`: its rings' keys into `rings`, its job files and fallback directories.
  void list_root(const std::string& label, Root& root, std::set<std::string>& rings);
  /// The directory descriptor and file name of a ring's key; fd -1 when its directory is gone.
  std::pair<int, std::string> locate(const std::string& key) const;
  /// The path of the directory holding the ring of `key`.
  std::string dir_of(const std::string& key) const;
  bool pods_warned_ = false;  ///< an unsafe pods directory was reported
  bool pods_watched_ = false;  ///< the pods directory is in watch_fd (a new pod wakes a scan)
  int exit_ep_ = -1;  ///< epoll set of the processes' pidfds (readable at exit)
  std::set<std::string> listed_rings_;  ///< the last listing's ring keys (every root's)
  /// (root label, uid) whose jobs/<uid> this daemon has made or seen
  std::set<std::pair<std::string, uint32_t>> job_dirs_made_;
  /// The directories holding job files now (registry_jobs.cpp): the run directory (the
  /// previous layout), each user's jobs/<uid> and each jobs-<uid>-<n>, each opened without
  /// following a link and used only when it is its user's and mode 0700. A root daemon
  /// renames aside what occupies one of those names for another user (and logs it), and
  /// makes jobs/ and jobs/<uid> for every user whose ring it has seen; in every root. The
  /// caller closes every fd but the roots'.
  std::vector<JobTable::Dir> job_dirs();
  uint64_t listed_mono_ = 0;                          ///< when it was read (0: never)
  const Nvml* nvml_;
  std::map<std::string, std::unique_ptr<Process>> procs_;  ///< by ring file name
  std::map<std::string, Problem> problems_;                 ///< by file name
  std::vector<ring::Event> buffer_;
  uint64_t seq_ = 0;  ///< last global event number handed out
  uint64_t drain_tick_ = 0;  ///< drain_all() calls, for visiting idle rings in turn
  /// procs_' values as drain_all() walks them, with what it needs to skip an idle ring;
  /// emptied whenever procs_ changes.
  struct DrainSlot {
    Process* process;
    uint32_t idle_drains;  ///< Process::idle_drains after its last visit
    uint32_t pid;
  };
  std::vector<DrainSlot> drain_order_;
  uint64_t fd_limit_ = 1024;  ///< RLIMIT_NOFILE's soft limit when constructed
  std::map<std::string, int> gpu_index_kept_;  ///< State::gpu_index_kept
  std::map<uint32_t, std::size_t> gpus_kept_by_uid_;  ///< entries of gpu_index_kept_ each uid's rings made
  std::set<uint32_t> gpu_limit_logged_;               ///< uids told of kMaxRingGpusPerUid
  std::string hostname_;
  std::shared_ptr<const Policy> policy_;
  JobTable jobs_;
  std::vector<uint64_t> running_;  ///< job owner words of processes running at the last scan
  std::deque<LimitChange> limit_log_;    ///< recent changes, and root's refusals and failures
  std::deque<LimitChange> refusal_log_;  ///< recent refusals and failures of other users' requests
  std::map<uint32_t, std::pair<uint64_t, uint64_t>> refusal_rate_;  ///< by uid: last line logged (mono ns), lines not
  uint64_t request_scan_mono_ = 0;  ///< when a request last rescanned (rescan_for_request)
  /// Out-of-memory reports kept (across processes: they outlive the process).
  static constexpr std::size_t kOomLog = 64;  ///< as many as OomStore keeps on disk
  std::deque<std::shared_ptr<const OomReport>> oom_log_;
  std::function<void(const std::shared_ptr<const OomReport>&)> oom_listener_;
  EventJournal* journal_ = nullptr;
  RestoredHistory restored_;  ///< until the first scans have matched them to processes
  unsigned restore_scans_left_ = 3;
  void take_oom_report(Process& p, const StoredEvent& ev);
  /// A process just found that a record says is suspended: mark it so (suspend.cpp).
  void found_suspended(Process& p);
  /// `p` is no longer suspended (it exited, or was resumed): its record removed.
  void forget_suspension(Process& p, const char* why);
  /// `p`'s priority from the policy and what its ring asked, when it is found (room.cpp).
  void set_priority(Process& p, const RingSnapshot& s);
  /// Whether `a` and `b` share a job, a Slurm job, a pod, a session or a process tree: one
  /// may be waiting on the other, so neither is suspended for the other (room.cpp).
  bool related(const Process& a, const RingSnapshot& as, const Process& b, const RingSnapshot& bs) const;
  /// Whether `p` could go to the host now, and why not (suspend.cpp).
  std::string uncarried(const Process& p, const RingSnapshot& s) const;
  /// resume --gpu (suspend_move.cpp): whether suspended `p` (ring `s`) can be restored onto
  /// `gpu` (an NVML index or UUID) with `planned` bytes of the same request's footprints, and
  /// `planned_job` of its job shares, going there before it; "" and `t`'s GPUs, footprint,
  /// job share and driver pairs filled, or *in_place set
  /// (`gpu` is one it held memory on: a plain resume), or why not, *refused false where it
  /// is a failure (an unknown GPU).
  std::string prepare_move(const Process& p, const RingSnapshot& s, const std::vector<NvmlGpu>& gpus,
                           const std::string& gpu, uint64_t planned, uint64_t planned_job, SuspendTarget& t,
                           bool* refused, bool* in_place);
  /// After a restore onto another GPU, before the unlock: its ring view shows the new
  /// UUIDs, its interposer is told to read them, its footprint names the new GPU, logged.
  void note_moved(const SuspendTarget& t);
  std::string suspend_dir_;  ///< "": suspensions are not recorded
  struct SuspendRecord {
    uint64_t since_ns = 0, host_bytes = 0;
    std::string by;
    std::vector<std::pair<std::string, uint64_t>> footprint;
    bool by_policy = false;
  };
  std::map<std::pair<uint32_t, uint64_t>, SuspendRecord> suspend_records_;  ///< read at start: (pid, start time)
  RetiredCounters retired_;
  std::shared_ptr<const RetiredCounters> retired_shared_;  ///< what States share: retired_ when last copied
  bool retired_changed_ = false;                           ///< retired_ changed since
  std::map<std::string, std::size_t> retired_keys_;        ///< by user: keys of their own in retired_
  std::set<std::string> retired_limit_logged_;             ///< users (or "(others)") told of the limit
  std::set<uint32_t> ring_limit_logged_;                   ///< uids told of max_rings_per_uid
  std::set<std::string> site_refused_logged_;              ///< ceiling files not root's, said once each
  StateStore store_;
  std::vector<NvmlGpu> nvml_gpus_;     ///< last NVML reading
  std::optional<uint64_t> nvml_read_mono_;  ///< when it was taken
};

}  // namespace cuw::daemon

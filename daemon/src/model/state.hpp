// cuwarden daemon model: the State, everything the daemon knows at one instant, as plain
// data. The loop thread builds one after each scan and write, and when a query asks
// (Registry::publish), and swaps it into a StateStore; views and transports on any thread
// read it without touching a ring.
//
// Nothing here knows JSON or sockets: views/ turn a State into replies.
#pragma once

#include <array>
#include <atomic>
#include <map>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "cuw/counters.hpp"
#include "model/history.hpp"
#include "model/jobs.hpp"
#include "model/nvml.hpp"
#include "model/ring_view.hpp"
#include "model/snapshots.hpp"

namespace cuw::daemon {

/// A process's site samples, oldest first: the newest kSamplesKept of them.
using SiteSamples = std::vector<std::shared_ptr<const Snapshot>>;

/// One interposed process: what the daemon tracks and a copy of its ring header.
struct ProcessState {
  /// The ring's path relative to the run directory: its file name, or in a pod's directory
  /// (--pods-dir) "<pods dir>/<pod>/<file name>".
  std::string file_name;
  uint32_t pid = 0;       ///< in the daemon's pid namespace
  uint32_t ns_pid = 0;    ///< in the process's own (its files' names; header.pid)
  uint32_t uid = 0;       ///< the ring file's owner (checked against the header at discovery)
  std::string user;       ///< uid's login name, or the number as text
  uint64_t start_time = 0;
  bool exited = false;
  uint64_t exited_ns = 0;        ///< CLOCK_REALTIME ns; meaningful when exited
  uint64_t events_received = 0;  ///< events the daemon drained from the ring
  uint64_t events_lost = 0;      ///< slots a dead producer claimed but never published
  bool events_readable = false;  ///< the daemon may drain the ring (false: counters only)
  uint64_t tampers = 0;          ///< caps raised past the daemon's ceiling and put back, and stretches over it by NVML
  /// Suspended through the driver's checkpoint API (model/suspend.hpp): its device memory is
  /// on the host. The ring's counters still count it (caps and job shares hold); the views
  /// show its devices' used bytes as 0.
  bool suspended = false;
  uint64_t suspended_since_ns = 0;    ///< CLOCK_REALTIME ns
  uint64_t suspended_host_bytes = 0;  ///< what the host holds for it
  std::string suspended_by;           ///< who suspended it (a user name, or "policy")
  int32_t priority = 0;               ///< for making room on a full GPU (higher first)
  bool waiting_for_room = false;      ///< its allocation waits for the daemon to make room
  bool suspended_overdue = false;     ///< suspended by policy past its job's max_suspended
  RingSnapshot header;               ///< the ring header as read when the State was built
  std::shared_ptr<const EventHistory::View> history;  ///< never null
  /// Per-call-site samples of its live memory, every kSampleEveryNs (snapshot --leaks);
  /// shared with the daemon until its next sample. Null: none.
  std::shared_ptr<const SiteSamples> samples;
};

/// One job segment with at least one view taken of it.
struct JobState {
  std::string file;  ///< file name in the run directory
  std::string name, user;
  uint32_t uid = 0;
  JobTable::View view;
};

/// A file in the run directory the daemon could not use.
struct ProblemState {
  std::string file;  ///< file name in the run directory
  std::string reason;
};

/// One limit change or refusal (the newest kLimitLog are kept).
struct LimitChange {
  enum class Target { pid, job };
  uint64_t time_ns = 0;                ///< CLOCK_REALTIME ns
  std::optional<std::string> by;       ///< requester's user name, "policy"; none: unidentified
  std::optional<uint32_t> by_uid;      ///< none for the policy or an unidentified peer
  std::optional<int32_t> by_pid;
  std::string target;                  ///< "pid 123", "job alice/etl"
  Target kind = Target::pid;
  uint32_t pid = 0;                    ///< kind == pid
  std::optional<uint32_t> device;      ///< kind == pid; none: every device
  std::string job;                     ///< kind == job
  uint32_t uid = 0;                    ///< kind == job: the job's owner
  std::optional<std::string> asked;    ///< what the request asked, as typed ("6 GiB", "50%"); none for the policy
  bool has_limits = false;             ///< old_limit/new_limit are set (the change happened)
  uint64_t old_limit = 0, new_limit = 0;  ///< bytes; ring::kNoLimit = no cap
  std::string outcome;                 ///< "changed", "refused", "failed", "restored" (tamper), "killed"
  std::optional<std::string> reason;
};

/// An allocation refused (by a cap, a job's cap or the driver), with the process's snapshot
/// taken when the daemon saw it: a process that died of its out-of-memory error still has
/// its report. Immutable once published.
struct OomReport {
  uint32_t pid = 0, uid = 0;
  uint64_t start_time = 0;
  std::string process_name, user;
  StoredEvent event;          ///< the refusal (kind refuse, job_refuse, or driver_error)
  TakenSnapshot snapshot;     ///< not symbolized: named when asked for
};

/// Counter rows of counters.hpp summed over the processes the daemon has forgotten, per GPU,
/// job and user: a Prometheus counter must not fall when the process that counted goes (an
/// OOM-rate alert has to see the process that died of its OOM between two scrapes).
/// Bounded (registry.cpp, retire): a user's keys past kPerUser, and anyone's past kTotal,
/// fold into one row per GPU with job "(others)" (and, past kTotal, user "(others)").
struct RetiredCounters {
  static constexpr std::size_t kPerUser = 256;
  static constexpr std::size_t kTotal = 4096;
  static constexpr const char* kOthers = "(others)";
  struct Key {
    std::string uuid, job, user;
    auto operator<=>(const Key&) const = default;
  };
  struct Row {
    int gpu_index = -1;  ///< the GPU's index when its last process went
    std::array<uint64_t, counters::kDeviceCount> values{};  ///< only Type::counter rows are summed
  };
  std::map<Key, Row> by_gpu;
  /// Events the rings dropped, per (job, user): a ring's count is per process, not per GPU.
  std::map<std::pair<std::string, std::string>, uint64_t> events_dropped;
};

/// Everything the daemon knows at one instant. Immutable once published.
struct State {
  std::string hostname;
  std::string run_dir;
  uint64_t time_ns = 0;        ///< CLOCK_REALTIME ns when it was built
  bool nvml = false;           ///< NVML loaded
  std::string driver_version;  ///< the driver's, from NVML ("" without it)
  std::vector<NvmlGpu> gpus;   ///< NVML's devices (empty without NVML)
  /// The index each GPU NVML does not number was given when first seen (by UUID): kept for
  /// the daemon's life, so that a counter's `gpu` label does not change as processes come
  /// and go (model/gpus.cpp).
  std::map<std::string, int> gpu_index_kept;
  uint64_t events_seq = 0;     ///< last global event number handed out
  std::vector<ProcessState> processes;  ///< by ring file name
  std::vector<JobState> jobs;           ///< by job file name
  std::vector<ProblemState> problems;   ///< rings (past their grace time), then job files
  std::optional<std::string> policy_file;  ///< none: no policy
  std::vector<LimitChange> limit_changes;  ///< oldest first
  std::vector<std::shared_ptr<const OomReport>> ooms;  ///< the newest kOomLog, oldest first
  /// What forgotten processes counted (not those in `processes`); shared between States and
  /// copied only when a process is retired (null: none yet).
  std::shared_ptr<const RetiredCounters> retired;
};

/// The latest published State. publish() and load() may be called from any thread; a
/// reader keeps the State it loaded alive for as long as it holds the pointer, whatever is
/// published meanwhile. A mutex rather than std::atomic<std::shared_ptr>: the critical
/// sections are a pointer copy, and sanitizers understand a mutex.
class StateStore {
 public:
  void publish(std::shared_ptr<const State> s) {
    std::lock_guard<std::mutex> g(mu_);
    state_.swap(s);  // the previous State is freed with `s`, after the lock is released
    generation_.fetch_add(1, std::memory_order_release);
  }
  /// How many States have been published: a reader that saw N and later sees more knows a
  /// State built after that moment is there. Any thread.
  uint64_t generation() const noexcept { return generation_.load(std::memory_order_acquire); }
  /// The last published State; an empty State before the first publish (never null).
  std::shared_ptr<const State> load() const {
    std::lock_guard<std::mutex> g(mu_);
    return state_;
  }

 private:
  mutable std::mutex mu_;
  std::shared_ptr<const State> state_ = std::make_shared<const State>();
  std::atomic<uint64_t> generation_{0};
};

/// The directory holding `p`'s ring and live segment: `run_dir`, or the pod's directory in
/// it (everything in p.file_name before its last slash).
inline std::string ring_dir(const std::string& run_dir, const ProcessState& p) {
  const std::size_t slash = p.file_name.rfind('/');
  return slash == std::string::npos ? run_dir : run_dir + "/" + p.file_name.substr(0, slash);
}

}  // namespace cuw::daemon

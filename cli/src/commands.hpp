// cuwarden CLI: the commands, one file each; main.cpp parses arguments and calls these.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace cuw::cli {

struct StatusOptions {
  std::string socket;
  bool json = false;
  std::string query_compute_apps;  ///< comma-separated fields; empty = the table
  std::string query_gpu;           ///< --query-gpu: comma-separated fields, one row per GPU
  bool list_gpus = false;          ///< -L: "GPU 0: NAME (UUID: GPU-...)" per GPU
  std::string format;              ///< "csv[,noheader][,nounits]"
  std::string gpu_filter;          ///< -i: GPU index or UUID (prefix)
  double loop_seconds = 0;         ///< -l: repeat every N seconds
};
int cmd_status(const StatusOptions& o);

struct EventsOptions {
  std::string socket;
  long long pid = -1;
  bool follow = false;
  bool json = false;
  unsigned max = 100;
};
int cmd_events(const EventsOptions& o);

struct TopOptions {
  std::string socket;
  bool once = false;      ///< one frame as plain text on standard output, then exit
  double interval_s = 1;  ///< -d: seconds between refreshes (each one sample of every sparkline)
  long long pid = -1;     ///< with once: the detail view of this process instead of the list
};
/// `cuwarden top`: the live terminal view (GPUs' bars, processes with a sparkline of their
/// used bytes, a detail view of one process's counters, call sites and events), until `q`.
/// Returns kExitOk, or kExitFailure when no daemon answers at the start (the message
/// `cuwarden` prints) or the terminal cannot be used.
int cmd_top(const TopOptions& o);

struct LimitOptions {
  std::string socket;
  std::string target;  ///< "PID", "job:NAME" or "job:USER/NAME"
  std::string size;    ///< "8G", "75%" (PID only), "none"/"unlimited"
  std::string user;    ///< --user: the job's owner (root only, for other users' jobs)
  int device = -1;     ///< --device: CUDA ordinal as the process sees it; -1 = every device in use
  bool json = false;
};
int cmd_limit(const LimitOptions& o);

struct SuspendOptions {
  std::string socket;
  bool resume = false;  ///< `cuwarden resume` rather than `cuwarden suspend`
  std::string target;   ///< "PID", "job:NAME" or "job:USER/NAME"
  std::string timeout;  ///< --timeout: each lock's, "10s", "500ms" (suspend only; empty: the daemon's 10 s)
  std::string gpu;      ///< --gpu: resume onto this GPU (NVML index or UUID; empty: its own)
  bool json = false;
};
/// `cuwarden suspend|resume PID|job:NAME`: the daemon moves the process's device memory to
/// the host and back (the driver's checkpoint API). Prints what was done; exit status 3 when
/// refused (another user's process, or one that cannot be suspended or resumed now, with the
/// reason), 1 when it failed (a lock that timed out: nothing suspended), 2 for bad arguments.
int cmd_suspend(const SuspendOptions& o);

struct RunOptions {
  std::string limit, job, job_limit, pool, lib;
  std::string cap_scope;  ///< empty: CUWARDEN_CAP_SCOPE as set (default allocations)
  std::string callsites;  ///< as typed; empty: not given
  bool tensors = false;   ///< --tensors: the per-tensor mode (tensors_mode.hpp); else CUWARDEN_TENSORS decides
  std::vector<std::string> command;
};
/// Returns only on failure (exec replaces the process): kExitUsage for bad arguments or a bad
/// CUWARDEN_TENSORS (nothing runs), kExitFailure when the library is not found, 126/127 when
/// the command cannot be run.
int cmd_run(const RunOptions& o);

/// `cuwarden fit`'s exit status when not even the lowest value fits.
inline constexpr int kExitNothingFits = 4;

struct FitOptions {
  std::string limit;      ///< --limit, as `cuwarden run` takes it (required)
  std::string try_spec;   ///< --try NAME=LO..HI
  std::string plot;       ///< --plot FILE.svg; empty: no plot
  std::string pool, cap_scope, lib;  ///< passed on to `cuwarden run` when given
  bool json = false;         ///< one JSON document instead of the lines for people
  bool show_output = false;  ///< the command's output passes through (to standard error)
  std::vector<std::string> command;  ///< `{NAME}` in any argument is replaced by the value tried
};
/// Bisects NAME's range for the largest value with which the command, run as `cuwarden run
/// --limit` would, exits 0: an exit after a refusal by the cap (or the driver) means it does
/// not fit; any other failure stops the search and shows the end of its standard error.
/// Assumes that whatever fits, every smaller value fits too. Prints each try (peak memory
/// per GPU, outcome) and the answer, or JSON; writes the plot. Returns kExitOk when a value
/// fits, kExitNothingFits when not even LO does, kExitFailure when a try failed,
/// kExitUsage for bad arguments, 128 + N after signal N.
int cmd_fit(const FitOptions& o);

struct SnapshotOptions {
  std::string socket;
  long long pid = -1;
  std::string format = "text";  ///< text, json, pytorch, perfetto, folded, summary (`cuwarden summary`)
  std::string output;           ///< -o: a file; empty or "-": standard output
  unsigned top = 10;            ///< call sites and allocations a text report lists
  long long oom = -1;           ///< --oom N: the snapshot of the Nth newest out-of-memory report
  bool leaks = false;           ///< --leaks: the call sites whose live bytes only grew lately
  bool full = false;            ///< --full: every frame of a call site, not only its printed form
  std::string since;            ///< --since 10m: what changed since the daemon's sample of then
  std::string leak_warmup;      ///< --leak-warmup: with --leaks, the samples this long after the first allocation left out
  std::string by;               ///< --by native: one call site per native stack; empty or "user": merged by user frames
};
/// A duration as `snapshot --since` and `--leak-warmup` take it: seconds, bare or with s, m
/// (or min) or h ("90", "30s", "10m", "1h"); nullopt when malformed or past 2^64 ns. Pure.
std::optional<uint64_t> parse_seconds(const std::string& text);
/// `cuwarden snapshot PID` (and `cuwarden summary PID`): the daemon's snapshot of the process.
int cmd_snapshot(const SnapshotOptions& o);

struct OomOptions {
  std::string socket;
  long long pid = -1;  ///< -1: every process's
  bool json = false;
};
/// `cuwarden oom [PID]`: the out-of-memory reports the daemon kept, oldest first.
int cmd_oom(const OomOptions& o);

}  // namespace cuw::cli

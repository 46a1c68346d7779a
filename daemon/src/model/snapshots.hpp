// cuwarden daemon model: taking a process's Snapshot (snapshot.hpp) from what it left in the
// run directory: its ring header (counters, identity), its live segment (cuw/live.hpp: every
// live record, exact whatever events were dropped; call sites, modules, Python code names)
// and the events the daemon kept. Taking one is a copy; naming its native frames
// (symbolize) is separate, so that the loop thread can take one at a refusal cheaply and
// the frames are named when someone asks.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/history.hpp"
#include "model/ring_view.hpp"
#include "model/snapshot.hpp"
#include "model/symbolizer.hpp"

namespace cuw::daemon {

/// A Snapshot as taken: native frames carry their pcs only until symbolize() names them
/// from `modules`.
struct TakenSnapshot {
  Snapshot snap;
  std::vector<ModuleInfo> modules;
  bool symbolized = false;
  std::string symbols_note;  ///< why some native frames were left unnamed ("" when none was)
  std::string live_error;  ///< why the live records could not be read ("" when exact)
  uint32_t uid = 0;          ///< the process's owner
  uint64_t start_time = 0;   ///< the process's start time (the pid-reuse guard)
};

/// Who the process is, besides its ring header.
struct ProcessIdentity {
  std::string run_dir;     ///< where its ring and live segment are
  uint32_t pid = 0, uid = 0;
  uint64_t start_time = 0;
  std::string user;
  bool exited = false;
  /// The pid its files are named by (its own pid namespace's); 0: `pid`.
  uint32_t file_pid = 0;
};

/// Take the process's snapshot now: `header` its ring header as read, `history` the events
/// kept (the newest `max_trace` go into the trace; null: none). The live segment is read
/// from the run directory (refused when another user than `who.uid` owns it); without one,
/// the snapshot has the counters and trace only (exact = false, live_error says why).
/// Allocates; thread-safe (reads files and its arguments).
TakenSnapshot take_snapshot(const ProcessIdentity& who, const RingSnapshot& header, const EventHistory::View* history,
                            std::size_t max_trace = 100000);

/// `s` with its allocations folded into one record per call site and device kind (bytes
/// summed, SnapAlloc::count the allocations), no trace, no segments: what the daemon keeps
/// every kSampleEveryNs per process (cuwardend --leak-sample) for `snapshot --leaks`. Pure.
Snapshot site_sample(const Snapshot& s);
inline constexpr uint64_t kSampleEveryNs = 30'000'000'000ULL;
inline constexpr std::size_t kSamplesKept = 20;  ///< 10 minutes of samples

/// Naming the native frames (symbolize()) is in symbolize_worker.hpp: never in the daemon
/// process itself.

}  // namespace cuw::daemon

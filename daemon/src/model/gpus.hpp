// cuwarden daemon model: the GPUs of a State in the order every view shows them, with the
// index each is known by (the state JSON's "gpu_index", Prometheus's `gpu` label).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "model/state.hpp"

namespace cuw::daemon {

/// One GPU as the views show it: NVML's figures when NVML knows it, else what the rings say.
struct GpuRow {
  int index = -1;        ///< NVML's index, else numbered after NVML's by lowest CUDA ordinal
  std::string uuid, name, bus_id;
  uint64_t total = 0;     ///< bytes
  uint64_t used = 0;      ///< bytes, sum over running processes
  uint64_t reserved = 0;  ///< bytes, sum over running processes
  bool driver_used_known = false;
  uint64_t driver_used = 0;  ///< bytes, NVML's figure for the whole device
  unsigned processes = 0, capped = 0;  ///< running processes using it, and those with a cap (theirs or their job's)
  /// A row from rings alone (no NVML): the uids whose rings made it a row, ascending (each
  /// counts it among its kMaxRingGpusPerUid). Empty for NVML's rows.
  std::vector<uint32_t> uids;
};

/// At most this many GPUs come from rings alone (without NVML), all users together...
constexpr std::size_t kMaxRingGpus = 64;
/// ...and at most this many from one uid's rings (as many as one process may use), so that
/// one user's rings naming made-up GPUs cannot crowd another user's GPUs out.
constexpr std::size_t kMaxRingGpusPerUid = ring::kMaxDevices;

/// The GPUs of `st`: NVML's devices when NVML is loaded; without it, the devices that the
/// rings of running processes name, and those of exited ones that a running process named
/// before (State::gpu_index_kept): at most kMaxRingGpusPerUid distinct ones from each uid's
/// rings and kMaxRingGpus in all, the kept ones first. Ordered by NVML's index when known,
/// else by the lowest CUDA ordinal a process sees them at, then UUID. A ring's device that
/// is not a row has no index (views leave it out of per-GPU figures). `over_limit`, when
/// given, receives the uids whose rings named more GPUs than their limit. Pure; any thread.
std::vector<GpuRow> gpu_rows(const State& st, std::set<uint32_t>* over_limit = nullptr);

/// uuid -> index, for rows from gpu_rows().
std::map<std::string, int> gpu_index_of(const std::vector<GpuRow>& rows);

}  // namespace cuw::daemon

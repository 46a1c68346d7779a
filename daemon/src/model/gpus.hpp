// cuwarden daemon model: the GPUs of a State in the order every view shows them, with the
// index each is known by (the state JSON's "gpu_index", Prometheus's `gpu` label).
#pragma once

#include <cstdint>
#include <map>
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
};

/// The GPUs of `st`: NVML's devices and every device a process's ring names, ordered by
/// NVML's index when known, else by the lowest CUDA ordinal a process sees them at, then
/// UUID. Pure; any thread.
std::vector<GpuRow> gpu_rows(const State& st);

/// uuid -> index, for rows from gpu_rows().
std::map<std::string, int> gpu_index_of(const std::vector<GpuRow>& rows);

}  // namespace cuw::daemon

// cuwarden daemon view: the state document (get_state, `cuwarden --json`) from a State.
#pragma once

#include <nlohmann/json.hpp>

#include "model/state.hpp"

namespace cuw::daemon {

/// The state JSON of `st`: version, host, GPUs (NVML's order, else the lowest CUDA ordinal
/// a process sees them at), processes with their devices, jobs, problems, policy and the
/// recent limit changes. Pure: reads only `st`; any thread.
nlohmann::ordered_json state_json(const State& st);

}  // namespace cuw::daemon

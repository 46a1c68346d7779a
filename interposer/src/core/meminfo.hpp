// cuwarden interposer core: what a process is told of a device's memory (cuMemGetInfo,
// cuDeviceTotalMem, NVML) when a cap or a job bounds it.
#pragma once

#include <cstdint>

#include "core/tracker.hpp"
#include "cuw/ring.hpp"

namespace cuw::core {

/// Cap-adjusted (total, free) of a device, as cuMemGetInfo and NVML report them: total is
/// the cap (or the physical size, if smaller), free is what the cap leaves and never more
/// than the driver's own free figure, and never underflows when use is over a cap lowered
/// live. In a job with a cap, the job's cap and what its members hold bound both as well.
/// Returns false when neither the process nor its job has a cap (report the driver's
/// figures as they are).
bool capped_view(const Tracker& t, ring::DeviceSlot& d, uint64_t real_total, uint64_t real_free, uint64_t* total,
                 uint64_t* free_b);

}  // namespace cuw::core

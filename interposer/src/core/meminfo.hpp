// cuwarden interposer core: what a process is told of a device's memory (cuMemGetInfo,
// cuDeviceTotalMem, NVML) when a cap or a job bounds it.
#pragma once

#include <cstddef>
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

/// cuMemGetInfo after the driver answered (free_bytes, total_bytes; either may be null): on
/// the calling thread's current device, the capped view when a cap or a job bounds it, else
/// the driver's figures with what a pool keeps for reuse counted free. Also refreshes the
/// device's `reserved` from the stream-ordered pools already seen. Nothing with
/// CUWARDEN_MEMINFO=physical.
void report_meminfo(Tracker& t, size_t* free_bytes, size_t* total_bytes);

/// cuDeviceTotalMem after the driver answered `*bytes` for device `dev`: at most the
/// process's cap and the job's cap on it (unless CUWARDEN_MEMINFO=physical).
void report_total_mem(Tracker& t, int dev, size_t* bytes);

/// NVML's memory figures after NVML answered them for the GPU whose UUID NVML gives as
/// `uuid` ("GPU-xxxxxxxx-xxxx-..."): the capped view of the CUDA device with that UUID, when a
/// cap or a job bounds it; *used becomes total - free. False (nothing changed) when no
/// device of the process has that UUID, nothing bounds it, or CUWARDEN_MEMINFO=physical.
bool report_nvml(Tracker& t, const char* uuid, unsigned long long* total, unsigned long long* free_b,
                 unsigned long long* used);

}  // namespace cuw::core

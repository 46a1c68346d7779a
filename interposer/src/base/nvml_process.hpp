// cuwarden interposer base: what NVML says the driver holds for one process on one GPU (the
// figure nvidia-smi shows), for CUWARDEN_CAP_SCOPE=process.
#pragma once

#include <cstdint>

namespace cuw::hook {

enum class NvmlProcess {
  found,        ///< *bytes holds the process's figure
  not_listed,   ///< the GPU lists no compute process with that pid (no context there, or a
                ///< PID namespace: NVML reports host pids)
  unavailable,  ///< no libnvidia-ml.so.1, its initialization failed, or it does not know the GPU
};

/// Loads libnvidia-ml.so.1 (a local handle of our own) and initializes it (nvmlInit_v2, never
/// shut down), once; whether it can answer nvml_process_bytes. Call it from the program's
/// first CUDA call, without any lock held (it takes the dynamic loader's). Thread-safe.
bool nvml_prepare() noexcept;

/// NVML's usedGpuMemory (bytes) of process `pid` on the GPU whose CUuuid is `uuid`, in
/// `*bytes` (nvml_prepare() first, or this call loads NVML). Thread-safe; cold: one NVML
/// query of the GPU's compute processes (about 0.1 to 1 ms).
NvmlProcess nvml_process_bytes(const uint8_t (&uuid)[16], uint32_t pid, uint64_t* bytes) noexcept;

}  // namespace cuw::hook

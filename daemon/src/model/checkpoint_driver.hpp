// cuwarden daemon model: the driver's checkpoint API (cuCheckpointProcess*, driver 570 and
// later), reached through the daemon's own libcuda: dlopen'ed at run time and resolved with
// cuGetProcAddress, as a CUDA 12.8 runtime would. The daemon calls cuInit once at start,
// which the driver requires before it restores a process.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace cuw::daemon {

class CheckpointDriver {
 public:
  /// CUprocessState, as the driver numbers it.
  enum class ProcState : int { running = 0, locked = 1, checkpointed = 2, failed = 3, unknown = -1 };

  /// Load `path` and resolve the API; `enabled` false: nothing is loaded (available() false).
  explicit CheckpointDriver(bool enabled, const std::string& path = "libcuda.so.1");
  ~CheckpointDriver();
  CheckpointDriver(const CheckpointDriver&) = delete;
  CheckpointDriver& operator=(const CheckpointDriver&) = delete;

  /// Whether every entry point was found and cuInit succeeded; why_not() says otherwise.
  bool available() const noexcept { return ok_; }
  const std::string& why_not() const noexcept { return why_; }

  /// The driver's calls on process `pid` (in the daemon's pid namespace). Each returns the
  /// CUresult (0: success). lock() waits at most `timeout_ms` (> 0) for the process's work.
  /// Thread-safe: one call at a time (the driver serializes them per process anyway); they
  /// may take seconds, so never call them on the loop thread.
  int lock(uint32_t pid, uint32_t timeout_ms);
  int checkpoint(uint32_t pid);
  /// One GPU of a restore onto others (CUcheckpointGpuPair): the UUID it was checkpointed
  /// on and the one to restore onto (CUuuid bytes).
  struct GpuPair {
    uint8_t old_uuid[16];
    uint8_t new_uuid[16];
  };
  /// `pairs` empty: back onto its own GPUs. Else they must name every GPU the process has,
  /// each onto one of the same chip with room for it (cuda.h); the driver checks that too.
  int restore(uint32_t pid, const std::vector<GpuPair>& pairs = {});
  int unlock(uint32_t pid);
  ProcState state(uint32_t pid);

  /// "CUDA_ERROR_NOT_READY (600)" for a CUresult, from the driver's cuGetErrorName.
  std::string error_text(int result);

 private:
  struct Api;
  void* handle_ = nullptr;
  Api* api_ = nullptr;
  bool ok_ = false;
  std::string why_;
  std::mutex mu_;
};

}  // namespace cuw::daemon

// cuwarden daemon: optional NVML, dlopen'ed at run time (no link dependency).
//
// When libnvidia-ml.so.1 loads, the state uses NVML's GPU index, name and memory, lists
// GPUs no interposed process uses, and reports the driver's own per-process memory figure
// next to cuwarden's tracked one. Any failure leaves NVML off, silently.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace cuw::daemon {

struct NvmlGpu {
  unsigned index = 0;
  std::string uuid;       ///< "GPU-..." as NVML spells it
  std::string name;
  std::string bus_id;     ///< "00000000:19:00.0"
  uint64_t memory_total = 0;
  uint64_t memory_used = 0;
  std::map<uint32_t, uint64_t> process_used;  ///< pid -> bytes, compute processes
  /// pid -> its name (/proc/PID/comm, read with the figures; "" if gone): processes that are
  /// not under cuwarden have no ring to name them.
  std::map<uint32_t, std::string> process_name;
};

class Nvml {
 public:
  /// Try to load and initialise NVML; `path` overrides the library name.
  explicit Nvml(bool enabled, const std::string& path = "libnvidia-ml.so.1");
  ~Nvml();
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  bool available() const noexcept { return ok_; }
  /// Current devices; empty when NVML is off or fails.
  std::vector<NvmlGpu> query() const;
  /// The driver's version ("580.65.06"), read when NVML loaded; empty when off or unknown.
  const std::string& driver_version() const noexcept { return driver_version_; }

 private:
  struct Api;
  void* handle_ = nullptr;
  Api* api_ = nullptr;
  bool ok_ = false;
  std::string driver_version_;
};

}  // namespace cuw::daemon

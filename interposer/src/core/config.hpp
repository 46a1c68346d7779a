// cuwarden interposer: configuration from CUWARDEN_* variables, read once at the first
// CUDA call. One table ties each variable to its default and doc line (after mimalloc).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cuw/size.hpp"
#include "base/fast_clock.hpp"

namespace cuw::core {

// X(variable, default, doc)
#define CUW_OPTIONS(X)                                                                                  \
  X(CUWARDEN_LIMIT, "", "per-process cap per device: 8G, 512MiB, 75%, 0=8G,1=4G")                       \
  X(CUWARDEN_JOB, "", "job name: processes of one user with one job name share a cap per GPU")         \
  X(CUWARDEN_JOB_LIMIT, "", "the job's cap per GPU")                                                    \
  X(CUWARDEN_POOL, "off", "allocation backend: off, cache, vmm")                                        \
  X(CUWARDEN_CALLSITES, "0", "frames captured per allocation, 0..64")                                   \
  X(CUWARDEN_CAP_SCOPE, "allocations", "what a cap counts: allocations, or process (also the context and modules)") \
  X(CUWARDEN_MEMINFO, "limit", "what cuMemGetInfo / cuDeviceTotalMem report: limit or physical")        \
  X(CUWARDEN_ON_ERROR, "fail", "bad configuration: fail (message, exit 78) or open (warn, run uncapped)") \
  X(CUWARDEN_CLOCK, "coarse", "event timestamps: coarse (kernel tick), fine (CPU counter) or syscall") \
  X(CUWARDEN_LOG, "warn", "interposer log level: trace, debug, info, warn, error, off")                 \
  X(CUWARDEN_LOG_FILE, "", "interposer log file (default: stderr)")                                     \
  X(CUWARDEN_RUN_DIR, "/dev/shm/cuwarden", "where rings, job segments and the socket live")

/// Exit status for bad configuration (EX_CONFIG from sysexits.h).
inline constexpr int kExitConfig = 78;

/// The parsed configuration. Immutable once built.
struct Config {
  LimitSpec limit;               ///< empty = uncapped
  std::string job;               ///< CUWARDEN_JOB, validated (empty = no job)
  uint64_t job_limit = ~0ULL;    ///< CUWARDEN_JOB_LIMIT in bytes per GPU; ~0 = none asked
  bool meminfo_physical = false; ///< CUWARDEN_MEMINFO=physical
  bool cap_scope_process = false;///< CUWARDEN_CAP_SCOPE=process
  bool fail_open = false;        ///< CUWARDEN_ON_ERROR=open
  int log_level = 3;             ///< 0 trace .. 5 error, 6 off
  std::string log_file;
  std::string pool = "off";
  int callsites = 0;
  fast_clock::Mode clock = fast_clock::Mode::coarse;  ///< CUWARDEN_CLOCK (fast_clock.hpp)
  std::vector<std::string> errors;  ///< one line each, naming the variable
};

/// Read every CUWARDEN_* variable (secure_getenv). Never exits; errors are collected.
Config load_config();

}  // namespace cuw::core

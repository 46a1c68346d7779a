// cuwarden interposer: configuration from CUWARDEN_* variables, read once at the first
// CUDA call. The variables, their defaults and doc lines are one table (cuw/options.hpp);
// config.cpp binds each row to the parser that fills its field here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cuw/size.hpp"
#include "base/fast_clock.hpp"

namespace cuw::core {

/// Exit status for bad configuration (EX_CONFIG from sysexits.h).
inline constexpr int kExitConfig = 78;

/// The parsed configuration. Immutable once built. Only load_config() makes one: it applies
/// every option's default from the table; the initialisers here are only "nothing parsed".
struct Config {
  LimitSpec limit;                ///< CUWARDEN_LIMIT; empty = uncapped
  std::string job;                ///< CUWARDEN_JOB, validated (empty = no job)
  uint64_t job_limit = ~0ULL;     ///< CUWARDEN_JOB_LIMIT in bytes per GPU; ~0 = none asked
  bool meminfo_physical{};        ///< CUWARDEN_MEMINFO=physical
  bool cap_scope_process{};       ///< CUWARDEN_CAP_SCOPE=process
  bool fail_open{};               ///< CUWARDEN_ON_ERROR=open
  int log_level = -1;             ///< CUWARDEN_LOG: log::parse_level's number
  std::string log_file;           ///< CUWARDEN_LOG_FILE; empty = stderr
  const char* pool = "";          ///< CUWARDEN_POOL: "off", "cache" or "vmm" (a literal of config.cpp)
  SizeSpec pool_keep;             ///< CUWARDEN_POOL_KEEP: share of live bytes, or bytes
  uint32_t pool_idle_ms{};        ///< CUWARDEN_POOL_IDLE, milliseconds
  int callsites{};                ///< CUWARDEN_CALLSITES, 0..64
  bool pyframes{};                ///< CUWARDEN_PYFRAMES=1 (counts only with callsites > 0)
  bool leaks_report{};            ///< CUWARDEN_LEAKS=report
  fast_clock::Mode clock{};       ///< CUWARDEN_CLOCK (fast_clock.hpp)
  std::string run_dir;            ///< CUWARDEN_RUN_DIR, as paths::run_dir_from() gives it
  std::vector<std::string> errors;  ///< one line each, naming the variable, in table order

  friend bool operator==(const Config&, const Config&) = default;
};

/// Read every CUWARDEN_* variable of the options table (secure_getenv; one that is unset,
/// empty or refused leaves the table's default). Never exits or throws on a bad value: each
/// adds one line to `errors` ("CUWARDEN_X='value': why"), in table order. Allocates: call at
/// the first CUDA call, never on a hook's hot path. Not safe against a concurrent setenv.
Config load_config();

}  // namespace cuw::core

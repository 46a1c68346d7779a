// cuwarden interposer: configuration from CUWARDEN_* variables and the per-container file
// (CUWARDEN_CONFIG), read once at the first CUDA call. The variables, their defaults and doc
// lines are one table (cuw/options.hpp); config.cpp binds each row to the parser that fills
// its field here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "cuw/options.hpp"
#include "cuw/size.hpp"
#include "base/fast_clock.hpp"

namespace cuw::core {

/// CUWARDEN_POOL's values, one per literal of its options row (cuw/options.hpp), in its order:
/// the backend backends/start.cpp builds, as a type per kind.
enum class PoolKind : uint8_t { off, cache, vmm };

/// The options row's word for `k` (what the ring's header carries). Thread-safe.
constexpr const char* pool_name(PoolKind k) noexcept {
  switch (k) {
    case PoolKind::cache: return "cache";
    case PoolKind::vmm: return "vmm";
    default: return "off";
  }
}

namespace detail {
constexpr bool pool_kinds_are_the_row() {
  std::size_t n = 0;
  options::for_each_literal(options::Id::CUWARDEN_POOL, [&](std::string_view) { ++n; });
  for (PoolKind k : {PoolKind::off, PoolKind::cache, PoolKind::vmm})
    if (!options::is_literal(options::Id::CUWARDEN_POOL, pool_name(k))) return false;
  return n == 3;
}
}  // namespace detail
static_assert(detail::pool_kinds_are_the_row(), "PoolKind names every CUWARDEN_POOL literal, and only those");

/// Exit status for bad configuration (EX_CONFIG from sysexits.h).
inline constexpr int kExitConfig = 78;

/// The parsed configuration (CUWARDEN_CONFIG, the file, is read into the other fields and has
/// none of its own: the tracker holding this must fit in one page). Immutable once built.
/// Only load_config() makes one: it applies every option's default from the table; the
/// initialisers here are only "nothing parsed".
struct Config {
  /// CUWARDEN_LIMIT's cap, then each of CUWARDEN_OUTER_LIMIT's: every one applies, the lowest
  /// on each device (cuw::lowest_cap); empty = uncapped. One vector, not two fields: the
  /// tracker holding this must fit in one page.
  std::vector<LimitSpec> limits;
  std::string job;                ///< CUWARDEN_JOB, validated (empty = no job)
  uint64_t job_limit = ~0ULL;     ///< CUWARDEN_JOB_LIMIT in bytes per GPU; ~0 = none asked
  bool meminfo_physical{};        ///< CUWARDEN_MEMINFO=physical
  bool cap_scope_process{};       ///< CUWARDEN_CAP_SCOPE=process
  bool fail_open{};               ///< CUWARDEN_ON_ERROR=open
  int log_level = -1;             ///< CUWARDEN_LOG: log::parse_level's number
  std::string log_file;           ///< CUWARDEN_LOG_FILE; empty = stderr
  PoolKind pool{};                ///< CUWARDEN_POOL
  SizeSpec pool_keep;             ///< CUWARDEN_POOL_KEEP: share of live bytes, or bytes
  uint32_t pool_idle_ms{};        ///< CUWARDEN_POOL_IDLE, milliseconds
  int callsites{};                ///< CUWARDEN_CALLSITES, 0..64
  bool pyframes{};                ///< CUWARDEN_PYFRAMES=1 (counts only with callsites > 0)
  bool leaks_report{};            ///< CUWARDEN_LEAKS=report
  fast_clock::Mode clock{};       ///< CUWARDEN_CLOCK (fast_clock.hpp)
  std::string run_dir;            ///< CUWARDEN_RUN_DIR, as paths::run_dir_from() gives it
  std::string socket;             ///< CUWARDEN_SOCKET; empty = paths::socket_path_for's rule
  int priority{};                 ///< CUWARDEN_PRIORITY, -1000..1000 (when priority_asked)
  bool priority_asked{};          ///< CUWARDEN_PRIORITY was given
  std::vector<std::string> errors;  ///< one line each, naming the variable, in table order

  friend bool operator==(const Config&, const Config&) = default;
};

/// Read every CUWARDEN_* variable of the options table (secure_getenv; one that is unset,
/// empty or refused leaves the table's default). A variable the environment leaves unset or
/// empty is taken from the file CUWARDEN_CONFIG names, when that file gives it; else the
/// environment wins, except over the site's ceilings: where the file sets a cap
/// (CUWARDEN_LIMIT, CUWARDEN_JOB_LIMIT), what a cap counts (CUWARDEN_CAP_SCOPE=process) or
/// CUWARDEN_ON_ERROR=fail, the environment may only make it stricter, and the Slurm job's
/// ceiling file (cuw/site_cap.hpp; the job from /proc/self/cgroup, else CUWARDEN_JOB
/// slurm-<id>) holds CUWARDEN_LIMIT and CUWARDEN_JOB_LIMIT the same way. The stricter
/// applies; each refused raise, and a ceiling file not root's (ignored), adds one line to
/// `*notes` when given (said, not fatal; kept apart from Config, whose tracker fits one page).
/// Never exits or throws on a bad value: each adds one line to `errors`
/// ("CUWARDEN_X='value': why"; from the file "CUWARDEN_X='value' (FILE line N): why"), the
/// file's own errors first ("CUWARDEN_CONFIG='FILE': ..."), then in table order. Opens and
/// reads the file (at most kMaxConfigFile bytes, a regular file only; a missing file at the
/// default path is no error). Allocates: call at the first CUDA call, never on a hook's hot
/// path. Not safe against a concurrent setenv.
Config load_config(std::vector<std::string>* notes = nullptr);

/// The largest config file read, in bytes; a larger one is an error.
inline constexpr std::size_t kMaxConfigFile = 64 * 1024;

/// The values of a config file's text, by options::Id index ("" = not given), and the line
/// each came from (1-based; 0 = not given).
struct FileValues {
  std::vector<std::string> value;
  std::vector<int> line;
};

/// Parse a config file's text: lines `CUWARDEN_NAME=value`, blank lines and `#` comments;
/// blanks around the name and the value are dropped, and one pair of matching quotes ('' or
/// "") around the value. Each malformed line (no `=`, a name not in the options table,
/// CUWARDEN_CONFIG itself, a name given twice, a NUL byte) adds one error ("line N: why").
/// Allocates; thread-safe (no global state).
FileValues parse_config_text(std::string_view text, std::vector<std::string>* errors);

}  // namespace cuw::core

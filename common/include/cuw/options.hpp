// cuwarden: the CUWARDEN_* variables the interposer reads, declared once. One row each ties
// a variable to its default, its values and its doc line (after mimalloc's options table);
// the interposer's parsers (interposer/src/core/config.cpp), `cuwarden run --help`, the
// `cuwarden run` flags and the README's table of variables are all made from these rows.
//
// How to add an option:
//   1. Add a row below. The build then fails until step 2 is done.
//   2. In interposer/src/core/config.cpp, add the Config field it fills and its binding in
//      kBindings (the same position as here), naming one of the typed parsers there.
//   3. Regenerate the README's table: python3 tests/scripts/check_options.py . --write
//      (ctest scripts.options fails until it is current). `cuwarden run --help` lists the
//      variable by itself; a `cuwarden run` flag also needs its field in cli/src/main.cpp.
//      Where packaging/completion/cuwarden offers a flag's values, it offers the row's
//      `literal` values (scripts.options fails when they differ).
//
// Header-only and allocation-free: the interposer reads the rows at its first CUDA call.
#pragma once

#include <cstddef>
#include <string_view>

namespace cuw::options {

// X(variable, default, values, doc, flag)
//   variable  the environment variable
//   default   what an unset or empty variable means, as a user would type it, parsed by the
//             same parser as a value that is set; "" = nothing (the doc says what that means)
//   values    what may be given: `literal` values (each one is accepted: tests check it) or
//             words ("a path"); Markdown, as the README shows it (--help drops the backticks)
//   doc       one line for users (Markdown likewise)
//   flag      the `cuwarden run` flag that sets it, "" if none
// Order: the order of the error lines when several values are bad. CUWARDEN_ON_ERROR comes
// first: it decides what every other error does.
// No field may hold '|' (a Markdown table cell), a backslash, a double quote, a newline or an
// unclosed `literal`.
#define CUW_OPTIONS(X)                                                                                                 \
  X(CUWARDEN_ON_ERROR, "fail", "`fail`, `open`",                                                                       \
    "bad configuration: exit with status 78 and one line naming the variable, or warn and run uncapped", "")           \
  X(CUWARDEN_CONFIG, "/etc/cuwarden/process.conf", "a path, `off`",                                                  \
    "NAME=value lines: defaults for unset variables; its caps are ceilings", "")        \
  X(CUWARDEN_LIMIT, "", "`8G`, `512MiB`, `75%`, `0=8G,1=4G`",                                                          \
    "per-process cap per device, by CUDA ordinal as the process sees it", "--limit")                                   \
  X(CUWARDEN_OUTER_LIMIT, "", "`1G`, `1G;0=75%`",                                                                      \
    "caps of enclosing `cuwarden run`s: each applies too, the lowest per device", "")                                 \
  X(CUWARDEN_JOB, "", "a name", "job name: processes of one user with one job name share a cap per GPU", "--job")      \
  X(CUWARDEN_JOB_LIMIT, "", "`64G`, `512GiB`", "cap per physical GPU for the job (`CUWARDEN_JOB`) as a whole",         \
    "--job-limit")                                                                                                     \
  X(CUWARDEN_POOL, "off", "`off`, `cache`, `vmm`",                                                                   \
    "allocation backend: the driver's calls, a cache of freed blocks, or granules mapped and stitched", "--pool")      \
  X(CUWARDEN_POOL_KEEP, "5%", "`5%`, `256M`",                                                                          \
    "free memory a pool keeps beyond its peak of live blocks: a share of it, or a size; past it, it gives back first", \
    "")                                                                                                                \
  X(CUWARDEN_POOL_IDLE, "10s", "`10s`, `500ms`, `0`",                                                                  \
    "how long a pool remembers its peak: after that, free memory past CUWARDEN_POOL_KEEP goes back", "")               \
  X(CUWARDEN_CALLSITES, "0", "`0` .. `64`",                                                                           \
    "native frames captured per allocation (its call site, shown by snapshots and out-of-memory reports); 0: off",    \
    "--callsites")                                                                                                     \
  X(CUWARDEN_PYFRAMES, "1", "`1`, `0`",                                                                                \
    "with call sites on, also the Python frames of the allocating thread (read without taking the GIL)", "")           \
  X(CUWARDEN_LEAKS, "off", "`off`, `report`", "at exit, print to standard error what was never freed, by call site",  \
    "")                                                                                                                \
  X(CUWARDEN_CAP_SCOPE, "allocations", "`allocations`, `process`",                                                     \
    "what a cap counts: allocation calls only, or also the CUDA context and modules", "--cap-scope")                   \
  X(CUWARDEN_MEMINFO, "limit", "`limit`, `physical`",                                                                  \
    "what `cuMemGetInfo`, `cuDeviceTotalMem` and NVML report: the cap, or the device's memory", "")                    \
  X(CUWARDEN_CLOCK, "coarse", "`coarse`, `fine`, `syscall`",                                                           \
    "event timestamps: kernel tick, CPU counter, or a system call each", "")                                           \
  X(CUWARDEN_LOG, "warn", "`trace`, `debug`, `info`, `warn`, `error`, `off`", "the library's log level", "")           \
  X(CUWARDEN_LOG_FILE, "", "a path", "the library's log file, appended to (unset: standard error)", "")                \
  X(CUWARDEN_RUN_DIR, "/dev/shm/cuwarden", "a path", "where rings, job files and live segments live", "")           \
  X(CUWARDEN_SOCKET, "", "a path",                                                                                     \
    "the daemon's socket (unset: `/run/cuwarden/cuwardend.sock`, or `daemon/cuwardend.sock` in a run directory set)",  \
    "")                                                                                                                \
  X(CUWARDEN_PRIORITY, "", "an integer, `-1000` .. `1000`",                                                           \
    "priority when the daemon makes room on a full GPU (higher first); the policy's unless lower, never above its max", \
    "")

/// One row of CUW_OPTIONS. Every field is a NUL-terminated literal with static storage.
struct Option {
  const char* variable;       ///< "CUWARDEN_LIMIT"
  const char* default_value;  ///< "" when unset means nothing (no cap, no job, stderr)
  const char* values;         ///< Markdown: `literal` values, or words
  const char* doc;            ///< Markdown, one line
  const char* flag;           ///< "--limit", or "" when `cuwarden run` has none
};

/// Names a row: Id::CUWARDEN_LIMIT is the index of CUWARDEN_LIMIT in kOptions.
enum class Id : std::size_t {
#define CUW_OPTION_ID(var, def, values, doc, flag) var,
  CUW_OPTIONS(CUW_OPTION_ID)
#undef CUW_OPTION_ID
};

/// Every row, in table order (kOptions[static_cast<size_t>(Id::X)] is X's).
inline constexpr Option kOptions[] = {
#define CUW_OPTION_ROW(var, def, values, doc, flag) {#var, def, values, doc, flag},
    CUW_OPTIONS(CUW_OPTION_ROW)
#undef CUW_OPTION_ROW
};
inline constexpr std::size_t kCount = sizeof kOptions / sizeof kOptions[0];

/// The row of `id`. constexpr; thread-safe.
constexpr const Option& get(Id id) noexcept { return kOptions[static_cast<std::size_t>(id)]; }

/// Calls f(word) for each `literal` of `id`'s values, in order (for an option whose values
/// are a list of words, CUWARDEN_POOL say, the words it accepts). constexpr; thread-safe.
template <class F>
constexpr void for_each_literal(Id id, F&& f) {
  std::string_view v = get(id).values;
  for (std::size_t a = v.find('`'); a != std::string_view::npos; a = v.find('`')) {
    const std::size_t b = v.find('`', a + 1);
    f(v.substr(a + 1, b - a - 1));
    v = v.substr(b + 1);
  }
}

/// Whether `value` is one of `id`'s `literal` values. constexpr; thread-safe.
constexpr bool is_literal(Id id, std::string_view value) {
  bool found = false;
  for_each_literal(id, [&](std::string_view w) { found = found || w == value; });
  return found;
}
static_assert(is_literal(Id::CUWARDEN_POOL, "vmm") && !is_literal(Id::CUWARDEN_POOL, "vm"));

namespace detail {
/// Nothing that would break a Markdown table cell or the README's generator, and every
/// `literal` closed.
constexpr bool plain_field(std::string_view s) noexcept {
  std::size_t ticks = 0;
  for (char c : s) ticks += c == '`';
  return s.find_first_of("|\\\"\n") == std::string_view::npos && ticks % 2 == 0;
}
constexpr bool rows_well_formed() noexcept {
  for (const Option& o : kOptions) {
    const std::string_view var = o.variable, flag = o.flag;
    if (var.substr(0, 9) != "CUWARDEN_" || *o.doc == '\0' || *o.values == '\0') return false;
    if (!plain_field(o.default_value) || !plain_field(o.values) || !plain_field(o.doc)) return false;
    if (!flag.empty() && flag.substr(0, 2) != "--") return false;
  }
  return true;
}
}  // namespace detail
static_assert(detail::rows_well_formed(),
              "CUW_OPTIONS: a variable without the CUWARDEN_ prefix, an empty doc or values, a flag without --, "
              "or a field holding | \\ \" a newline or an unclosed `");

}  // namespace cuw::options

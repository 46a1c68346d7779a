// cuwarden interposer: parsing of CUWARDEN_* variables (see config.hpp). The variables, their
// defaults and doc lines are the options table (cuw/options.hpp); here each row is bound to
// one of a few typed parsers and the Config field it fills, and load_config() is one loop
// over the bindings. A row without a binding does not compile (the static_asserts below).
// The per-container file (CUWARDEN_CONFIG) holds the same variables as lines, so that a cap
// survives what resets the environment (su, sudo, ssh); it is read once, before the loop.
#include "core/config.hpp"

#include "base/log.hpp"
#include "cuw/job.hpp"
#include "cuw/options.hpp"
#include "cuw/paths.hpp"
#include "cuw/site_cap.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <string_view>

namespace cuw::core {

namespace {

using options::Id;

const char* env(const char* name) {
  const char* v = secure_getenv(name);
  return (v && *v) ? v : nullptr;
}
std::string quoted(const char* name, const char* value) {
  return std::string(name) + "='" + value + "'";
}

/// Fills its field of `c` from `value` (never null or empty) and returns true, or returns
/// false with *why set: the error line is then "VARIABLE='value': why".
using Parser = bool (*)(const char* value, Config& c, std::string* why);

// The typed parsers, each a template over the Config field it fills.

/// Caps that all apply, added to the field: one per device ("8G", "75%", "0=8G,1=4G";
/// cuw/size.hpp: parse_limit), or, with `Several`, a list of them ("1G;0=75%": parse_limits).
template <std::vector<LimitSpec> Config::*Field, bool Several>
bool limit_specs(const char* v, Config& c, std::string* why) {
  std::optional<std::vector<LimitSpec>> specs;
  if constexpr (Several) specs = parse_limits(v, why);
  else if (auto one = parse_limit(v, why)) specs = std::vector<LimitSpec>{std::move(*one)};
  if (!specs) return false;
  (c.*Field).insert((c.*Field).end(), specs->begin(), specs->end());
  return true;
}

/// A job name (cuw/job.hpp: valid_job_name).
template <std::string Config::*Field>
bool job_name(const char* v, Config& c, std::string* why) {
  if (!job::valid_job_name(v, why)) return false;
  c.*Field = v;
  return true;
}

/// A job's cap in bytes: a size, never a share (the job's GPUs may differ in size), and only
/// with a job to cap. The bytes are kept when the job is missing: the error stops the process
/// or, with CUWARDEN_ON_ERROR=open, no job is joined.
template <uint64_t Config::*Field>
bool job_cap(const char* v, Config& c, std::string* why) {
  auto spec = parse_cap(v, false, why);
  if (!spec) {
    if (std::strchr(v, '%')) *why = "job caps take a size (bytes, K/M/G/T), not a share of a device";
    return false;
  }
  c.*Field = spec->bytes;
  // CUWARDEN_JOB comes earlier in the table: it either filled c.job or added its own error.
  const std::string job_error = std::string(options::get(Id::CUWARDEN_JOB).variable) + "='";
  bool job_refused = false;
  for (const std::string& e : c.errors) job_refused = job_refused || e.rfind(job_error, 0) == 0;
  if (c.job.empty() && !job_refused) {
    *why = "needs CUWARDEN_JOB (the job it caps)";
    return false;
  }
  return true;
}

/// A size or a share ("5%": of the pool's live bytes, not of the device).
template <SizeSpec Config::*Field>
bool pool_keep(const char* v, Config& c, std::string* why) {
  auto spec = parse_size(v, true, why);
  if (!spec) return false;
  c.*Field = *spec;
  return true;
}

/// A duration: a whole number with a unit, ms, s or m ("10s", "500ms"), or 0; at most a day.
template <uint32_t Config::*Field>
bool duration_ms(const char* v, Config& c, std::string* why) {
  char* end = nullptr;
  const unsigned long long n = std::strtoull(v, &end, 10);
  const std::string_view unit = end ? end : "";
  uint64_t ms = 0;
  if (end == v || *v == '-' || *v == '+' || *v == ' ') {
    *why = "expected a duration such as 10s, 500ms or 0";
    return false;
  }
  if (unit == "ms") ms = n;
  else if (unit == "s") ms = n * 1000;
  else if (unit == "m") ms = n * 60000;
  else if (unit.empty() && n == 0) ms = 0;
  else {
    *why = "expected a duration such as 10s, 500ms or 0 (units ms, s, m)";
    return false;
  }
  if (n > 86400000ULL || ms > 86400000ULL) {
    *why = "at most a day (24h = 1440m)";
    return false;
  }
  c.*Field = static_cast<uint32_t>(ms);
  return true;
}

/// One word of a fixed list, mapped to a value; `refused`: a word known but not accepted, and
/// why not.
template <typename T>
struct Choice {
  const char* word;
  T value;
  const char* refused = nullptr;
};
template <typename T, std::size_t N>
struct Choices {
  Choice<T> items[N];
  const char* expected;  ///< the error for any other word
};

template <auto Field, const auto& Set>
bool choice(const char* v, Config& c, std::string* why) {
  for (const auto& ch : Set.items) {
    if (std::strcmp(v, ch.word) != 0) continue;
    if (ch.refused) {
      *why = ch.refused;
      return false;
    }
    c.*Field = ch.value;
    return true;
  }
  *why = Set.expected;
  return false;
}

/// A whole decimal number in [Lo, Hi] (strtol: leading blanks and a sign are allowed).
template <int Config::*Field, long Lo, long Hi>
bool int_range(const char* v, Config& c, std::string* why) {
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  if (!end || *end || n < Lo || n > Hi) {
    *why = "expected " + std::to_string(Lo) + ".." + std::to_string(Hi);
    return false;
  }
  c.*Field = static_cast<int>(n);
  return true;
}

/// CUWARDEN_PRIORITY: a whole number in -1000..1000, and that it was given.
bool priority_value(const char* v, Config& c, std::string* why) {
  if (!int_range<&Config::priority, -1000, 1000>(v, c, why)) return false;
  c.priority_asked = true;
  return true;
}

/// A log level name (base/log.hpp: parse_level; "critical" is accepted but not advertised).
template <int Config::*Field>
bool log_level(const char* v, Config& c, std::string* why) {
  const int lvl = log::parse_level(v);
  if (lvl < 0) {
    *why = "expected trace, debug, info, warn, error or off";
    return false;
  }
  c.*Field = lvl;
  return true;
}

/// Any text, kept as given (a path the library opens when it needs it).
template <std::string Config::*Field>
bool text(const char* v, Config& c, std::string*) {
  c.*Field = v;
  return true;
}

/// Any value: load_config() reads the option itself, before the loop (see there).
bool read_before(const char*, Config&, std::string*) { return true; }

/// A directory, without trailing slashes (cuw/paths.hpp: run_dir_from, as the daemon reads it).
template <std::string Config::*Field>
bool directory(const char* v, Config& c, std::string*) {
  c.*Field = paths::run_dir_from(v);
  return true;
}

constexpr Choices<bool, 2> kOnError{{{"fail", false}, {"open", true}}, "expected 'fail' or 'open'"};
constexpr Choices<PoolKind, 3> kPools{
    {{pool_name(PoolKind::off), PoolKind::off},
     {pool_name(PoolKind::cache), PoolKind::cache},
     {pool_name(PoolKind::vmm), PoolKind::vmm}},
    "expected off, cache or vmm"};
constexpr Choices<bool, 2> kCapScopes{{{"allocations", false}, {"process", true}},
                                      "expected 'allocations' or 'process'"};
constexpr Choices<bool, 2> kPyframes{{{"1", true}, {"0", false}}, "expected 1 or 0"};
constexpr Choices<bool, 2> kLeaks{{{"off", false}, {"report", true}}, "expected 'off' or 'report'"};
constexpr Choices<bool, 2> kMeminfo{{{"limit", false}, {"physical", true}}, "expected 'limit' or 'physical'"};
constexpr Choices<fast_clock::Mode, 4> kClocks{{{"coarse", fast_clock::Mode::coarse},
                                                {"fine", fast_clock::Mode::fine},
                                                {"auto", fast_clock::Mode::fine},  // fine's former name
                                                {"syscall", fast_clock::Mode::syscall}},
                                               "expected 'coarse', 'fine' or 'syscall'"};

/// A row of the options table and the parser that fills its field.
struct Binding {
  Id id;
  Parser parse;
};

// One binding per row of CUW_OPTIONS, in its order.
constexpr Binding kBindings[] = {
    {Id::CUWARDEN_ON_ERROR, choice<&Config::fail_open, kOnError>},
    {Id::CUWARDEN_CONFIG, read_before},
    {Id::CUWARDEN_LIMIT, limit_specs<&Config::limits, false>},
    {Id::CUWARDEN_OUTER_LIMIT, limit_specs<&Config::limits, true>},
    {Id::CUWARDEN_JOB, job_name<&Config::job>},
    {Id::CUWARDEN_JOB_LIMIT, job_cap<&Config::job_limit>},
    {Id::CUWARDEN_POOL, choice<&Config::pool, kPools>},
    {Id::CUWARDEN_POOL_KEEP, pool_keep<&Config::pool_keep>},
    {Id::CUWARDEN_POOL_IDLE, duration_ms<&Config::pool_idle_ms>},
    {Id::CUWARDEN_CALLSITES, int_range<&Config::callsites, 0, 64>},
    {Id::CUWARDEN_PYFRAMES, choice<&Config::pyframes, kPyframes>},
    {Id::CUWARDEN_LEAKS, choice<&Config::leaks_report, kLeaks>},
    {Id::CUWARDEN_CAP_SCOPE, choice<&Config::cap_scope_process, kCapScopes>},
    {Id::CUWARDEN_MEMINFO, choice<&Config::meminfo_physical, kMeminfo>},
    {Id::CUWARDEN_CLOCK, choice<&Config::clock, kClocks>},
    {Id::CUWARDEN_LOG, log_level<&Config::log_level>},
    {Id::CUWARDEN_LOG_FILE, text<&Config::log_file>},
    {Id::CUWARDEN_RUN_DIR, directory<&Config::run_dir>},
    {Id::CUWARDEN_SOCKET, text<&Config::socket>},
    {Id::CUWARDEN_PRIORITY, priority_value},
};

// Each binding names its parser, so none is null; comparing the pointer here would not be a
// constant expression under GCC's -fsanitize=undefined.
constexpr bool bindings_in_table_order() {
  for (std::size_t i = 0; i < std::size(kBindings); ++i)
    if (static_cast<std::size_t>(kBindings[i].id) != i) return false;
  return true;
}
static_assert(std::size(kBindings) == options::kCount,
              "every row of CUW_OPTIONS (cuw/options.hpp) needs a binding in kBindings, and only those");
static_assert(bindings_in_table_order(), "kBindings must list the rows of CUW_OPTIONS in the table's order");

constexpr std::string_view kBlanks = " \t\r";

std::string_view trim(std::string_view s) {
  const std::size_t a = s.find_first_not_of(kBlanks);
  if (a == std::string_view::npos) return {};
  return s.substr(a, s.find_last_not_of(kBlanks) - a + 1);
}

/// The file's text, or false with *why set. Never blocks on a FIFO or a device: only a
/// regular file is read.
bool read_small_file(const char* path, bool missing_ok, std::string* text, std::string* why) {
  // The default path is read by every CUDA program on the machine: that it cannot be read
  // (absent, not a file, another user's mode 0600) leaves the environment alone in charge,
  // rather than stopping them all. A path the user named must be readable.
  struct stat pre {};
  if (missing_ok && (::stat(path, &pre) != 0 || !S_ISREG(pre.st_mode) || ::access(path, R_OK) != 0)) return true;
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    if (errno == ENOENT && missing_ok) return true;
    *why = std::string("cannot open: ") + std::strerror(errno);
    return false;
  }
  struct stat st {};
  bool ok = false;
  if (::fstat(fd, &st) != 0) *why = std::string("cannot stat: ") + std::strerror(errno);
  else if (!S_ISREG(st.st_mode)) *why = "not a regular file";
  else if (static_cast<std::size_t>(st.st_size) > kMaxConfigFile)
    *why = "larger than " + std::to_string(kMaxConfigFile / 1024) + " KiB";
  else {
    text->resize(kMaxConfigFile + 1);
    std::size_t n = 0;
    for (ssize_t r; n < text->size(); n += static_cast<std::size_t>(r)) {
      r = ::read(fd, text->data() + n, text->size() - n);
      if (r < 0 && errno == EINTR) r = 0;
      else if (r <= 0) {
        if (r < 0) *why = std::string("cannot read: ") + std::strerror(errno);
        ok = r == 0;
        break;
      }
    }
    text->resize(n);
    if (ok && n > kMaxConfigFile) {  // grew since fstat
      *why = "larger than " + std::to_string(kMaxConfigFile / 1024) + " KiB";
      ok = false;
    }
  }
  ::close(fd);
  return ok;
}

/// The options whose value from the file is a ceiling the environment may only tighten: the
/// caps, what a cap counts, and what a bad value does (`open` would run uncapped).
bool is_ceiling(Id id) {
  return id == Id::CUWARDEN_LIMIT || id == Id::CUWARDEN_JOB_LIMIT || id == Id::CUWARDEN_CAP_SCOPE ||
         id == Id::CUWARDEN_ON_ERROR;
}

/// Whether `asked` allows more than `site` on some device, as far as the texts tell (a share
/// against bytes needs the device's size: lowest_cap settles it when the device is known).
bool above(const LimitSpec& asked, const LimitSpec& site) {
  for (int d = 0; d < 64; ++d) {
    const auto s = site.for_device(d), a = asked.for_device(d);
    if (s && a && a->percent == s->percent && (a->percent ? a->share > s->share : a->bytes > s->bytes)) return true;
  }
  return false;
}

/// The note for a raise the site refused: `variable`='asked' against the site's value, a cap
/// (`cap`) or a setting that decides enforcement.
std::string refused_note(const char* variable, const std::string& asked, const std::string& site,
                         const std::string& where, bool cap = true) {
  return std::string(variable) + "='" + asked + "' is refused: " + where + " sets '" + site +
         (cap ? "', a ceiling the environment may only lower; the lower applies"
              : "', which the environment may make stricter, never looser; '" + site + "' applies");
}

/// The environment's value `v` of ceiling option b.id is in `c`; the file's `fv` (from
/// `where`) holds it: the stricter of the two stays in `c`, and a raise is noted.
void hold_to_file(const Binding& b, const char* v, const char* fv, const std::string& where, Config& c,
                  std::vector<std::string>& notes) {
  Config site = c;
  std::string why;
  const char* variable = options::get(b.id).variable;
  if (!b.parse(fv, site, &why)) {
    c.errors.push_back(quoted(variable, fv) + " (" + where + "): " + why);
    return;
  }
  bool raised = false;
  switch (b.id) {
    case Id::CUWARDEN_LIMIT: {
      std::string ignored;
      const auto asked = parse_limit(v, &ignored), given = parse_limit(fv, &ignored);
      raised = asked && given && above(*asked, *given);
      c.limits = std::move(site.limits);  // both apply: the lowest on each device
      break;
    }
    case Id::CUWARDEN_JOB_LIMIT:
      raised = c.job_limit > site.job_limit;
      c.job_limit = std::min(c.job_limit, site.job_limit);
      break;
    case Id::CUWARDEN_CAP_SCOPE:
      raised = !c.cap_scope_process && site.cap_scope_process;
      c.cap_scope_process = c.cap_scope_process || site.cap_scope_process;
      break;
    case Id::CUWARDEN_ON_ERROR:
      raised = c.fail_open && !site.fail_open;
      c.fail_open = c.fail_open && site.fail_open;
      break;
    default: break;
  }
  if (raised)
    notes.push_back(refused_note(variable, v, fv, where, b.id == Id::CUWARDEN_LIMIT || b.id == Id::CUWARDEN_JOB_LIMIT));
}

/// The Slurm job's ceiling file (cuw/site_cap.hpp), when the process belongs to a Slurm job:
/// its caps join the environment's, the lower applying, and a raise past them is noted.
void hold_to_slurm(Config& c, std::vector<std::string>& notes) {
  uint32_t job = site_cap::slurm_job_of_cgroup(0);
  if (!job) job = site_cap::slurm_job_of_name(c.job);
  if (!job) return;
  const std::string path = site_cap::slurm_file(c.run_dir, job);
  site_cap::Ceiling ceiling;
  std::string why;
  const site_cap::Read r = site_cap::read(path, &ceiling, &why);
  if (r == site_cap::Read::refused) notes.push_back(why + "; not a ceiling, ignored");
  if (r != site_cap::Read::ok) return;
  const std::string where = "this Slurm job's ceiling " + path;
  const options::Option& lo = options::get(Id::CUWARDEN_LIMIT);
  if (ceiling.limit) {
    std::string ignored;
    const char* v = env(lo.variable);
    const auto asked = v ? parse_limit(v, &ignored) : std::nullopt;
    // Unset with no outer cap either (`cuwarden run` moves it there): the plugin's was dropped.
    if (!v && !env(options::get(Id::CUWARDEN_OUTER_LIMIT).variable))
      notes.push_back(std::string(lo.variable) + " is unset: " + where + " sets '" + ceiling.limit_text + "'");
    else if (asked && above(*asked, *ceiling.limit))
      notes.push_back(refused_note(lo.variable, v, ceiling.limit_text, where));
    c.limits.push_back(*ceiling.limit);
  }
  const options::Option& jo = options::get(Id::CUWARDEN_JOB_LIMIT);
  if (ceiling.job_limit) {
    if (c.job.empty()) c.job = "slurm-" + std::to_string(job);
    if (const char* v = env(jo.variable); v && c.job_limit > *ceiling.job_limit)
      notes.push_back(refused_note(jo.variable, v, ceiling.job_limit_text, where));
    c.job_limit = std::min(c.job_limit, *ceiling.job_limit);
  }
  // What the plugin decides for enforcement holds with its ceiling (cluster/slurm).
  if (c.fail_open) {
    notes.push_back(std::string(options::get(Id::CUWARDEN_ON_ERROR).variable) + "='open' is refused: " + where +
                      " holds this job's caps; 'fail' applies");
    c.fail_open = false;
  }
}

}  // namespace

FileValues parse_config_text(std::string_view text, std::vector<std::string>* errors) {
  FileValues f;
  f.value.resize(options::kCount);
  f.line.resize(options::kCount);
  int number = 0;
  while (!text.empty()) {
    const std::size_t nl = text.find('\n');
    const std::string_view raw = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view{} : text.substr(nl + 1);
    ++number;
    const std::string at = "line " + std::to_string(number) + ": ";
    const std::string_view line = trim(raw);
    if (line.empty() || line.front() == '#') continue;
    if (line.find('\0') != std::string_view::npos) {
      errors->push_back(at + "holds a NUL byte");
      continue;
    }
    const std::size_t eq = line.find('=');
    if (eq == std::string_view::npos) {
      errors->push_back(at + "expected CUWARDEN_NAME=value");
      continue;
    }
    const std::string_view name = trim(line.substr(0, eq));
    std::string_view value = trim(line.substr(eq + 1));
    if (value.size() >= 2 && (value.front() == '"' || value.front() == '\'') && value.back() == value.front())
      value = value.substr(1, value.size() - 2);
    std::size_t id = options::kCount;
    for (std::size_t i = 0; i < options::kCount; ++i)
      if (name == options::kOptions[i].variable) id = i;
    if (id == options::kCount) {
      errors->push_back(at + "'" + std::string(name) + "' is not a CUWARDEN_ variable");
    } else if (id == static_cast<std::size_t>(Id::CUWARDEN_CONFIG)) {
      errors->push_back(at + "CUWARDEN_CONFIG names the file; it cannot be set inside it");
    } else if (f.line[id]) {
      errors->push_back(at + std::string(name) + " is already set on line " + std::to_string(f.line[id]));
    } else {
      f.value[id] = value;
      f.line[id] = number;
    }
  }
  return f;
}

Config load_config(std::vector<std::string>* notes_out) {
  Config c;
  std::vector<std::string> notes;
  // The file first: every other row may fall back to it. Its own errors come first.
  FileValues file;
  file.value.resize(options::kCount);
  file.line.resize(options::kCount);
  const options::Option& co = options::get(Id::CUWARDEN_CONFIG);
  const char* path = env(co.variable) ? env(co.variable) : co.default_value;
  if (std::strcmp(path, "off") != 0) {
    std::string text, why;
    std::vector<std::string> lines;
    if (!read_small_file(path, std::strcmp(path, co.default_value) == 0, &text, &why)) lines.push_back(why);
    else file = parse_config_text(text, &lines);
    for (const std::string& l : lines) c.errors.push_back(quoted(co.variable, path) + ": " + l);
  }
  for (const Binding& b : kBindings) {
    const options::Option& o = options::get(b.id);
    std::string why;
    // The default first, by the same parser (one source for defaults), so that a value that
    // is refused leaves the default in place. Without one the field keeps its "nothing".
    if (*o.default_value && !b.parse(o.default_value, c, &why))
      c.errors.push_back(quoted(o.variable, o.default_value) + ": " + why + " (the built-in default)");
    const std::size_t i = static_cast<std::size_t>(b.id);
    if (const char* v = env(o.variable)) {
      if (!b.parse(v, c, &why)) c.errors.push_back(quoted(o.variable, v) + ": " + why);
      else if (is_ceiling(b.id) && !file.value[i].empty())
        hold_to_file(b, v, file.value[i].c_str(), std::string(path) + " line " + std::to_string(file.line[i]), c,
                     notes);
    } else if (!file.value[i].empty()) {
      const char* fv = file.value[i].c_str();
      if (!b.parse(fv, c, &why))
        c.errors.push_back(quoted(o.variable, fv) + " (" + path + " line " + std::to_string(file.line[i]) +
                           "): " + why);
    }
  }
  hold_to_slurm(c, notes);
  if (notes_out) *notes_out = std::move(notes);
  return c;
}

}  // namespace cuw::core

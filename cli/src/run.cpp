// cuwarden CLI: `cuwarden run` — set the CUWARDEN_* environment, preload the interposer,
// and exec the command (with --tensors, each framework's per-buffer switch too:
// tensors_mode.cpp). Everything is checked before exec: a typo in a size must fail here,
// with a clear message, not later inside the application.
#include <limits.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "client.hpp"
#include "commands.hpp"
#include "cuw/job.hpp"
#include "cuw/options.hpp"
#include "cuw/size.hpp"
#include "tensors_mode.hpp"

namespace cuw::cli {

namespace {

bool readable_file(const std::string& p) { return !p.empty() && access(p.c_str(), R_OK) == 0; }

std::string absolute(const std::string& p) {
  char buf[PATH_MAX];
  return realpath(p.c_str(), buf) ? std::string(buf) : p;
}

/// --lib, else $CUWARDEN_LIB, else beside this executable: installed (bin/ and
/// lib/<triplet>/cuwarden/, whatever the prefix), or a build tree (build/bin and build/lib).
/// Empty + *tried on failure.
std::string find_library(const std::string& flag, std::string* tried) {
  if (!flag.empty()) {
    *tried = flag + " (--lib)";
    return readable_file(flag) ? absolute(flag) : "";
  }
  if (const char* env = std::getenv("CUWARDEN_LIB"); env && *env) {
    *tried = std::string(env) + " ($CUWARDEN_LIB)";
    return readable_file(env) ? absolute(env) : "";
  }
  char exe[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) {
    exe[n] = '\0';
    std::string dir(exe);
    dir = dir.substr(0, dir.rfind('/'));
    for (const char* rel : {"/../" CUW_INSTALL_LIBDIR "/libcuwarden.so", "/../lib/libcuwarden.so", "/libcuwarden.so"}) {
      const std::string cand = dir + rel;
      *tried += (tried->empty() ? "" : ", ") + cand;
      if (readable_file(cand)) return absolute(cand);
    }
  }
  return "";
}

int run_usage_error(const std::string& msg) {
  std::fprintf(stderr, "cuwarden run: %s\n", msg.c_str());
  return kExitUsage;
}

/// An option's words as a sentence lists them: "off, cache or vmm" (the options table's).
std::string words_of(cuw::options::Id id) {
  std::vector<std::string_view> w;
  cuw::options::for_each_literal(id, [&](std::string_view s) { w.push_back(s); });
  std::string out;
  for (std::size_t i = 0; i < w.size(); ++i) {
    if (i) out += i + 1 == w.size() ? " or " : ", ";
    out += w[i];
  }
  return out;
}

/// A variable of the environment `cuwarden run` started in: what it inherits ("" if unset).
std::string inherited(cuw::options::Id id) {
  const char* v = std::getenv(cuw::options::get(id).variable);
  return v ? v : "";
}

/// One refusal to loosen, on stderr.
void note(const std::string& msg) {
  std::fprintf(stderr, "cuwarden run: %s (cuwarden run never loosens what it inherits)\n", msg.c_str());
}

/// Whether cap `asked` may be above one of `caps` on some device: on a device where one of
/// them applies, `asked` sets none, or a larger one of the same kind, or one of the other
/// kind (a share against bytes: the device decides, and the interposer takes the lower).
bool may_raise(const LimitSpec& asked, const std::vector<LimitSpec>& caps) {
  std::vector<int> keys = {-1};  // -1: the devices without an override
  for (const auto& [d, s] : asked.per_device) keys.push_back(d);
  for (const auto& c : caps)
    for (const auto& [d, s] : c.per_device) keys.push_back(d);
  for (int k : keys) {
    const auto a = k < 0 ? asked.all : asked.for_device(k);
    for (const auto& c : caps) {
      const auto b = k < 0 ? c.all : c.for_device(k);
      if (!b) continue;
      if (!a || a->percent != b->percent) return true;
      if (a->percent ? a->share > b->share : a->bytes > b->bytes) return true;
    }
  }
  return false;
}

/// The variables a run sets, tightened against what it inherits: the caps of --limit apply
/// with the inherited ones (CUWARDEN_OUTER_LIMIT collects them; the interposer takes the
/// lowest on each device, resolving shares); a job cap is the lower of the two; an inherited
/// job is kept; the cap scope only widens to process; and a run that inherits a cap fails
/// closed on a bad variable. Returns false (with *why) when an inherited value is malformed.
bool tighten(const RunOptions& o, std::vector<std::pair<cuw::options::Id, std::string>>* set, std::string* why) {
  using cuw::options::Id;
  const std::string in_limit = inherited(Id::CUWARDEN_LIMIT), in_outer = inherited(Id::CUWARDEN_OUTER_LIMIT);
  const std::string in_job = inherited(Id::CUWARDEN_JOB), in_job_limit = inherited(Id::CUWARDEN_JOB_LIMIT);
  std::string err;
  std::vector<LimitSpec> caps;
  for (const auto& [id, text] :
       {std::pair{Id::CUWARDEN_LIMIT, in_limit}, std::pair{Id::CUWARDEN_OUTER_LIMIT, in_outer}}) {
    if (text.empty()) continue;
    auto specs = parse_limits(text, &err);
    if (!specs) {
      *why = std::string("the inherited ") + cuw::options::get(id).variable + "='" + text + "' is not valid: " + err;
      return false;
    }
    caps.insert(caps.end(), specs->begin(), specs->end());
  }
  if (!o.limit.empty()) {
    set->emplace_back(Id::CUWARDEN_LIMIT, o.limit);
    std::string outer = in_outer;
    if (!in_limit.empty() && in_limit != o.limit) outer += (outer.empty() ? "" : ";") + in_limit;
    if (!outer.empty()) set->emplace_back(Id::CUWARDEN_OUTER_LIMIT, outer);
    if (!caps.empty() && may_raise(*parse_limit(o.limit, &err), caps))
      note("--limit " + o.limit + " applies together with the inherited cap " +
           (in_limit.empty() ? in_outer : in_outer.empty() ? in_limit : in_limit + ";" + in_outer) +
           ": the lowest applies on each device");
  }
  if (!o.job.empty()) {
    if (!in_job.empty() && in_job != o.job)
      note("keeps the job '" + in_job + "' it inherits (CUWARDEN_JOB), not --job " + o.job);
    else
      set->emplace_back(Id::CUWARDEN_JOB, o.job);
  }
  if (!o.job_limit.empty()) {
    const uint64_t asked = parse_cap(o.job_limit, false, &err)->bytes;
    std::optional<SizeSpec> had;
    if (!in_job_limit.empty() && !(had = parse_cap(in_job_limit, false, &err))) {
      *why = "the inherited CUWARDEN_JOB_LIMIT='" + in_job_limit + "' is not valid: " + err;
      return false;
    }
    if (had && had->bytes < asked)
      note("keeps the job cap " + in_job_limit + " it inherits, not --job-limit " + o.job_limit);
    else
      set->emplace_back(Id::CUWARDEN_JOB_LIMIT, o.job_limit);
  }
  if (!o.cap_scope.empty()) {
    if (inherited(Id::CUWARDEN_CAP_SCOPE) == "process" && o.cap_scope != "process")
      note("keeps the cap scope 'process' it inherits (CUWARDEN_CAP_SCOPE), not --cap-scope " + o.cap_scope);
    else set->emplace_back(Id::CUWARDEN_CAP_SCOPE, o.cap_scope);
  }
  // open runs uncapped when a variable is bad: that would lift the caps it inherits.
  if (inherited(Id::CUWARDEN_ON_ERROR) == "open" && (!caps.empty() || !in_job_limit.empty())) {
    note("CUWARDEN_ON_ERROR=open would run without the caps it inherits if a variable were bad: fail applies");
    set->emplace_back(Id::CUWARDEN_ON_ERROR, "fail");
  }
  return true;
}

}  // namespace

int cmd_run(const RunOptions& o) {
  std::string err;
  if (!o.limit.empty() && !parse_limit(o.limit, &err)) return run_usage_error("bad --limit '" + o.limit + "': " + err);
  if (!o.job_limit.empty()) {
    if (o.job.empty() && inherited(cuw::options::Id::CUWARDEN_JOB).empty())
      return run_usage_error("--job-limit needs --job NAME");
    if (!parse_cap(o.job_limit, false, &err))
      return run_usage_error("bad --job-limit '" + o.job_limit + "': " +
                         (o.job_limit.find('%') != std::string::npos ? "job caps take a size, not a share of a device"
                                                                     : err));
  }
  if (!o.job.empty() && !cuw::job::valid_job_name(o.job, &err)) return run_usage_error("bad --job '" + o.job + "': " + err);
  using cuw::options::Id;
  if (!o.cap_scope.empty() && !cuw::options::is_literal(Id::CUWARDEN_CAP_SCOPE, o.cap_scope))
    return run_usage_error("bad --cap-scope '" + o.cap_scope + "': use " + words_of(Id::CUWARDEN_CAP_SCOPE));
  if (!o.pool.empty() && !cuw::options::is_literal(Id::CUWARDEN_POOL, o.pool))
    return run_usage_error("bad --pool '" + o.pool + "': use " + words_of(Id::CUWARDEN_POOL));
  if (!o.callsites.empty()) {
    const bool digits = o.callsites.size() <= 2 && o.callsites.find_first_not_of("0123456789") == std::string::npos;
    if (!digits || std::stoi(o.callsites) > 64) return run_usage_error("bad --callsites '" + o.callsites + "': use 0..64");
  }
  const EnvLookup env = [](const char* name) -> const char* { return std::getenv(name); };
  const std::optional<bool> tensors = tensors_mode(o.tensors, env, &err);
  if (!tensors) return run_usage_error(err);
  if (o.command.empty()) return run_usage_error("no command given (cuwarden run [options] -- CMD ...)");
  // Decided on the environment as inherited, before this run sets anything in it.
  const TensorsPlan plan = plan_tensors(*tensors, o.pool, o.tensors ? "--tensors" : "CUWARDEN_TENSORS=1", env);

  std::string tried;
  const std::string lib = find_library(o.lib, &tried);
  if (lib.empty()) {
    std::fprintf(stderr,
                 "cuwarden run: cannot find libcuwarden.so (tried %s). Pass --lib PATH or set CUWARDEN_LIB.\n",
                 tried.c_str());
    return kExitFailure;
  }
  // The dynamic loader splits LD_PRELOAD at spaces and colons: such a path would be ignored
  // (a warning from ld.so) and the program would run uncapped.
  if (lib.find_first_of(" \t:") != std::string::npos) {
    std::fprintf(stderr,
                 "cuwarden run: %s: the dynamic loader cannot preload a path with a space or a colon; "
                 "install or copy libcuwarden.so where its path has none, and pass --lib\n",
                 lib.c_str());
    return kExitFailure;
  }

  using options::Id;
  const auto set = [](Id id, const std::string& value) { setenv(options::get(id).variable, value.c_str(), 1); };
  std::vector<std::pair<Id, std::string>> tight;
  if (!tighten(o, &tight, &err)) {
    std::fprintf(stderr, "cuwarden run: %s\n", err.c_str());
    return kExitUsage;
  }
  for (const auto& [id, value] : tight) set(id, value);
  if (!o.pool.empty()) set(Id::CUWARDEN_POOL, o.pool);
  if (!o.callsites.empty()) set(Id::CUWARDEN_CALLSITES, o.callsites);

  // Ours first (its symbols must win), then every existing entry but a duplicate of ours.
  std::string preload = lib;
  if (const char* old = std::getenv("LD_PRELOAD"); old && *old) {
    std::string entry;
    std::stringstream ss(old);
    while (std::getline(ss, entry, ':')) {
      std::stringstream words(entry);
      std::string w;
      while (words >> w)
        if (w != lib) preload += ":" + w;
    }
  }
  setenv("LD_PRELOAD", preload.c_str(), 1);
  for (const auto& [name, value] : plan.set) setenv(name.c_str(), value.c_str(), 1);
  for (const std::string& line : plan.lines) std::fprintf(stderr, "cuwarden run: %s\n", line.c_str());

  std::vector<char*> argv;
  for (const auto& a : o.command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  execvp(argv[0], argv.data());
  const int e = errno;
  if (e == ENOENT) {
    std::fprintf(stderr, "cuwarden run: %s: command not found\n", argv[0]);
    return 127;
  }
  std::fprintf(stderr, "cuwarden run: cannot run %s: %s\n", argv[0], std::strerror(e));
  return 126;
}

}  // namespace cuw::cli

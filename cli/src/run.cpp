// cuwarden CLI: `cuwarden run` — set the CUWARDEN_* environment, preload the interposer,
// and exec the command. Everything is checked before exec: a typo in a size must fail
// here, with a clear message, not later inside the application.
#include <limits.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "client.hpp"
#include "commands.hpp"
#include "cuw/job.hpp"
#include "cuw/options.hpp"
#include "cuw/size.hpp"

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

int usage_error(const std::string& msg) {
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

}  // namespace

int cmd_run(const RunOptions& o) {
  std::string err;
  if (!o.limit.empty() && !parse_limit(o.limit, &err)) return usage_error("bad --limit '" + o.limit + "': " + err);
  if (!o.job_limit.empty()) {
    if (o.job.empty()) return usage_error("--job-limit needs --job NAME");
    if (!parse_cap(o.job_limit, false, &err))
      return usage_error("bad --job-limit '" + o.job_limit + "': " +
                         (o.job_limit.find('%') != std::string::npos ? "job caps take a size, not a share of a device"
                                                                     : err));
  }
  if (!o.job.empty() && !cuw::job::valid_job_name(o.job, &err)) return usage_error("bad --job '" + o.job + "': " + err);
  using cuw::options::Id;
  if (!o.cap_scope.empty() && !cuw::options::is_literal(Id::CUWARDEN_CAP_SCOPE, o.cap_scope))
    return usage_error("bad --cap-scope '" + o.cap_scope + "': use " + words_of(Id::CUWARDEN_CAP_SCOPE));
  if (!o.pool.empty() && !cuw::options::is_literal(Id::CUWARDEN_POOL, o.pool))
    return usage_error("bad --pool '" + o.pool + "': use " + words_of(Id::CUWARDEN_POOL));
  if (!o.callsites.empty()) {
    const bool digits = o.callsites.size() <= 2 && o.callsites.find_first_not_of("0123456789") == std::string::npos;
    if (!digits || std::stoi(o.callsites) > 64) return usage_error("bad --callsites '" + o.callsites + "': use 0..64");
  }
  if (o.command.empty()) return usage_error("no command given (cuwarden run [options] -- CMD ...)");

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
  if (!o.limit.empty()) set(Id::CUWARDEN_LIMIT, o.limit);
  if (!o.job.empty()) set(Id::CUWARDEN_JOB, o.job);
  if (!o.job_limit.empty()) set(Id::CUWARDEN_JOB_LIMIT, o.job_limit);
  if (!o.pool.empty()) set(Id::CUWARDEN_POOL, o.pool);
  if (!o.cap_scope.empty()) set(Id::CUWARDEN_CAP_SCOPE, o.cap_scope);
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

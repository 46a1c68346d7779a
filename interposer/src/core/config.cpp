// cuwarden interposer: parsing of CUWARDEN_* variables (see config.hpp).
#include "core/config.hpp"

#include "cuw/job.hpp"

#include <cstdlib>
#include <cstring>

namespace cuw::core {

namespace {
const char* env(const char* name) {
  const char* v = secure_getenv(name);
  return (v && *v) ? v : nullptr;
}
std::string quoted(const char* name, const char* value) {
  return std::string(name) + "='" + value + "'";
}
}  // namespace

Config load_config() {
  Config c;
  if (const char* v = env("CUWARDEN_ON_ERROR")) {
    if (!std::strcmp(v, "open")) c.fail_open = true;
    else if (std::strcmp(v, "fail") != 0)
      c.errors.push_back(quoted("CUWARDEN_ON_ERROR", v) + ": expected 'fail' or 'open'");
  }
  if (const char* v = env("CUWARDEN_LIMIT")) {
    std::string why;
    if (auto spec = parse_limit(v, &why)) c.limit = *spec;
    else c.errors.push_back(quoted("CUWARDEN_LIMIT", v) + ": " + why);
  }
  if (const char* v = env("CUWARDEN_JOB")) {
    std::string why;
    if (job::valid_job_name(v, &why)) c.job = v;
    else c.errors.push_back(quoted("CUWARDEN_JOB", v) + ": " + why);
  }
  if (const char* v = env("CUWARDEN_JOB_LIMIT")) {
    std::string why;
    if (auto spec = parse_cap(v, false, &why)) {
      c.job_limit = spec->bytes;
      if (!env("CUWARDEN_JOB"))
        c.errors.push_back(quoted("CUWARDEN_JOB_LIMIT", v) + ": needs CUWARDEN_JOB (the job it caps)");
    } else {
      if (std::strchr(v, '%')) why = "job caps take a size (bytes, K/M/G/T), not a share of a device";
      c.errors.push_back(quoted("CUWARDEN_JOB_LIMIT", v) + ": " + why);
    }
  }
  if (const char* v = env("CUWARDEN_POOL")) {
    if (!std::strcmp(v, "off")) c.pool = "off";
    else if (!std::strcmp(v, "cache")) c.pool = "cache";
    else if (!std::strcmp(v, "vmm"))
      c.errors.push_back(quoted("CUWARDEN_POOL", v) + ": this backend is not available in this build yet (use off)");
    else c.errors.push_back(quoted("CUWARDEN_POOL", v) + ": expected off, cache or vmm");
  }
  if (const char* v = env("CUWARDEN_CALLSITES")) {
    char* end = nullptr;
    long n = std::strtol(v, &end, 10);
    if (!end || *end || n < 0 || n > 64) c.errors.push_back(quoted("CUWARDEN_CALLSITES", v) + ": expected 0..64");
    else c.callsites = static_cast<int>(n);
  }
  if (const char* v = env("CUWARDEN_CAP_SCOPE")) {
    if (!std::strcmp(v, "process")) c.cap_scope_process = true;
    else if (std::strcmp(v, "allocations") != 0)
      c.errors.push_back(quoted("CUWARDEN_CAP_SCOPE", v) + ": expected 'allocations' or 'process'");
  }
  if (const char* v = env("CUWARDEN_MEMINFO")) {
    if (!std::strcmp(v, "physical")) c.meminfo_physical = true;
    else if (std::strcmp(v, "limit") != 0)
      c.errors.push_back(quoted("CUWARDEN_MEMINFO", v) + ": expected 'limit' or 'physical'");
  }
  if (const char* v = env("CUWARDEN_CLOCK")) {
    using fast_clock::Mode;
    if (!std::strcmp(v, "coarse")) c.clock = Mode::coarse;
    else if (!std::strcmp(v, "fine") || !std::strcmp(v, "auto")) c.clock = Mode::fine;  // auto: its former name
    else if (!std::strcmp(v, "syscall")) c.clock = Mode::syscall;
    else c.errors.push_back(quoted("CUWARDEN_CLOCK", v) + ": expected 'coarse', 'fine' or 'syscall'");
  }
  if (const char* v = env("CUWARDEN_LOG")) {
    static constexpr const char* kLevels[] = {"trace", "debug", "info", "warn", "error", "critical", "off"};
    int lvl = -1;
    for (int i = 0; i < 7; ++i)
      if (!std::strcmp(v, kLevels[i])) lvl = i;
    if (lvl < 0) c.errors.push_back(quoted("CUWARDEN_LOG", v) + ": expected trace, debug, info, warn, error or off");
    else c.log_level = lvl;
  }
  if (const char* v = env("CUWARDEN_LOG_FILE")) c.log_file = v;
  return c;
}

}  // namespace cuw::core

// cuwarden interposer: parsing of CUWARDEN_* variables (see config.hpp).
#include "config.hpp"

#include <cstdlib>
#include <cstring>

namespace cuw::ipc {

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
    c.job = v;
    if (c.job.size() > 63) c.errors.push_back(quoted("CUWARDEN_JOB", v) + ": longer than 63 bytes");
  }
  if (const char* v = env("CUWARDEN_JOB_LIMIT")) {
    std::string why;
    if (!parse_size(v, true, &why)) c.errors.push_back(quoted("CUWARDEN_JOB_LIMIT", v) + ": " + why);
    else c.errors.push_back(quoted("CUWARDEN_JOB_LIMIT", v) + ": job caps are not available in this build yet");
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
  if (const char* v = env("CUWARDEN_MEMINFO")) {
    if (!std::strcmp(v, "physical")) c.meminfo_physical = true;
    else if (std::strcmp(v, "limit") != 0)
      c.errors.push_back(quoted("CUWARDEN_MEMINFO", v) + ": expected 'limit' or 'physical'");
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

}  // namespace cuw::ipc

// cuwarden interposer: minimal log (see log.hpp).
#include "base/log.hpp"

#include "cuw/options.hpp"

#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace cuw::log {

namespace {
// Both are settled at the first line written, from CUWARDEN_LOG and CUWARDEN_LOG_FILE (or
// by init()): lines come from hooks, so no file is opened before the first CUDA call, and
// lines written before the tracker reads its configuration (the entry-point lookups of the
// runtime's start) reach the same destination as the rest.
std::atomic<int> g_level{-1};  // -1: not read yet
std::atomic<int> g_fd{-1};     // -1: not settled yet
std::atomic<bool> g_to_file{false};

int level() {
  int lvl = g_level.load(std::memory_order_relaxed);
  if (__builtin_expect(lvl < 0, 0)) {
    // Before the configuration is read a bad value means the default, which the
    // configuration then reports.
    const options::Option& o = options::get(options::Id::CUWARDEN_LOG);
    const char* v = secure_getenv(o.variable);
    lvl = v ? parse_level(v) : -1;
    if (lvl < 0) lvl = parse_level(o.default_value);
    g_level.store(lvl, std::memory_order_relaxed);
  }
  return lvl;
}

/// Opens `file` as the destination unless one was settled; the first to settle wins.
void settle(const char* file) {
  if (g_fd.load(std::memory_order_acquire) >= 0) return;
  int fd = -1;
  if (file && *file) fd = ::open(file, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0644);
  const bool to_file = fd >= 0;
  if (!to_file) fd = 2;
  int expected = -1;
  if (g_fd.compare_exchange_strong(expected, fd, std::memory_order_acq_rel)) {
    g_to_file.store(to_file, std::memory_order_release);
  } else if (to_file) {
    ::close(fd);
  }
}

int destination() {
  if (__builtin_expect(g_fd.load(std::memory_order_acquire) < 0, 0))
    settle(secure_getenv(options::get(options::Id::CUWARDEN_LOG_FILE).variable));
  return g_fd.load(std::memory_order_acquire);
}

void vwrite(const char* fmt, va_list ap) {
  const int fd = destination();
  char buf[1024];
  int n = 0;
  if (g_to_file.load(std::memory_order_acquire)) {
    // A file holds lines of many processes: each says when (UTC) and which process.
    timespec ts{};
    clock_gettime(CLOCK_REALTIME, &ts);
    tm t{};
    gmtime_r(&ts.tv_sec, &t);
    n = std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ [%d] ", t.tm_year + 1900, t.tm_mon + 1,
                      t.tm_mday, t.tm_hour, t.tm_min, t.tm_sec, ts.tv_nsec / 1000000, static_cast<int>(getpid()));
    if (n < 0) n = 0;
  }
  const int m = std::vsnprintf(buf + n, sizeof buf - 1 - static_cast<size_t>(n), fmt, ap);
  if (m < 0) return;
  n += m;
  if (n > static_cast<int>(sizeof buf) - 2) n = static_cast<int>(sizeof buf) - 2;
  buf[n++] = '\n';
  ssize_t w = ::write(fd, buf, static_cast<size_t>(n));
  (void)w;
}
}  // namespace

int parse_level(const char* name) noexcept {
  static constexpr const char* kLevels[] = {"trace", "debug", "info", "warn", "error", "critical", "off"};
  int lvl = -1;
  for (int i = 0; i < 7; ++i)
    if (!std::strcmp(name, kLevels[i])) lvl = i;
  return lvl;
}

void init(int lvl, const std::string& file) {
  g_level.store(lvl, std::memory_order_relaxed);
  settle(file.c_str());
}

bool debug_enabled() noexcept { return level() <= 1; }

#define CUW_LOG_FN(name, lvl)        \
  void name(const char* fmt, ...) {  \
    if (level() > (lvl)) return;     \
    va_list ap;                      \
    va_start(ap, fmt);               \
    vwrite(fmt, ap);                 \
    va_end(ap);                      \
  }
CUW_LOG_FN(debug, 1)
CUW_LOG_FN(info, 2)
CUW_LOG_FN(warn, 3)
#undef CUW_LOG_FN

void always(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vwrite(fmt, ap);
  va_end(ap);
}

}  // namespace cuw::log

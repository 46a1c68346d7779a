// cuwarden interposer: minimal log (see log.hpp).
#include "base/log.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace cuw::log {

namespace {
int g_level = -1;  // -1: not set yet; read CUWARDEN_LOG on first use (no file is opened)
int g_fd = 2;

int level() {
  if (__builtin_expect(g_level < 0, 0)) {
    static constexpr const char* kLevels[] = {"trace", "debug", "info", "warn", "error", "critical", "off"};
    const char* v = secure_getenv("CUWARDEN_LOG");
    int lvl = 3;
    for (int i = 0; v && i < 7; ++i)
      if (!std::strcmp(v, kLevels[i])) lvl = i;
    g_level = lvl;
  }
  return g_level;
}

void vwrite(const char* fmt, va_list ap) {
  char buf[1024];
  int n = std::vsnprintf(buf, sizeof buf - 1, fmt, ap);
  if (n < 0) return;
  if (n > static_cast<int>(sizeof buf) - 2) n = static_cast<int>(sizeof buf) - 2;
  buf[n++] = '\n';
  ssize_t w = ::write(g_fd, buf, static_cast<size_t>(n));
  (void)w;
}
}  // namespace

void init(int level, const std::string& file) {
  g_level = level;
  if (!file.empty()) {
    int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd >= 0) g_fd = fd;
  }
}

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

// cuwarden interposer core: the line a resumed process prints (see resume_notice.hpp).
#include "core/resume_notice.hpp"

#include <unistd.h>

#include <cstdio>

namespace cuw::core {

void print_resume_notice(const ring::RingHeader& h, uint64_t n) noexcept {
  uint64_t seen = detail::g_resumes_seen.load(std::memory_order_relaxed);
  do {
    if (seen == n) return;
  } while (!detail::g_resumes_seen.compare_exchange_weak(seen, n, std::memory_order_relaxed));
  char by[sizeof h.suspended_by + 1] = {};
  for (std::size_t i = 0; i < sizeof h.suspended_by && h.suspended_by[i]; ++i) {
    const char c = h.suspended_by[i];
    by[i] = c >= 0x20 && c < 0x7f ? c : '?';  // the daemon's bytes, shown on the user's terminal
  }
  char line[128];
  const int len = std::snprintf(line, sizeof line, "cuwarden: suspended %llu s by %s; resumed\n",
                                static_cast<unsigned long long>((h.suspended_ns + 500'000'000ULL) / 1'000'000'000ULL),
                                by[0] ? by : "?");
  if (len > 0) (void)!::write(2, line, static_cast<std::size_t>(len) < sizeof line ? static_cast<std::size_t>(len) : sizeof line - 1);
}

}  // namespace cuw::core

// Interposer tests: what test_pyframes.py calls through ctypes, linked with the product's
// objects into libcuwarden_pyframes_test.so (never into libcuwarden.so). ctypes.CDLL calls
// release the GIL around these (PyTorch's case in a hook), ctypes.PyDLL calls keep it.
#include <pthread.h>
#include <time.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>

#include "core/callsites/pyframes.hpp"
#include "core/callsites/pyframes_detail.hpp"

namespace pf = cuw::core::pyframes;

#define CUWT_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

/// frames[0, n) as "file:function:line\n" lines into buf (NUL-terminated): n, -1 when buf is
/// too small, -2 when a frame names a code the table does not know.
int format(const pf::Frame* frames, int n, char* buf, int len) {
  int at = 0;
  if (len > 0) buf[0] = '\0';
  for (int i = 0; i < n; ++i) {
    const pf::Code* c = pf::code(frames[i].code);
    if (!c) return -2;
    const int w = std::snprintf(buf + at, static_cast<size_t>(len - at), "%s:%s:%u\n", c->file, c->function,
                                frames[i].line);
    if (w < 0 || w >= len - at) return -1;
    at += w;
  }
  return n;
}

double now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) * 1e9 + static_cast<double>(ts.tv_nsec);
}

}  // namespace

/// The calling thread's Python frames, at most `max`, as lines into buf (format() above).
CUWT_EXPORT int cuw_test_pyframes_max(char* buf, int len, int max) {
  pf::Frame frames[256];
  const int n = pf::capture(frames, max);
  return format(frames, n, buf, len);
}

/// The calling thread's Python frames (all, up to 256) as "file:function:line" lines.
CUWT_EXPORT int cuw_test_pyframes(char* buf, int len) { return cuw_test_pyframes_max(buf, len, 256); }

/// The frames as captured: code ids and lines.
CUWT_EXPORT int cuw_test_pyframes_raw(uint32_t* codes, uint32_t* lines, int max) {
  pf::Frame frames[256];
  const int n = pf::capture(frames, max > 256 ? 256 : max);
  for (int i = 0; i < n; ++i) {
    codes[i] = frames[i].code;
    lines[i] = frames[i].line;
  }
  return n;
}

/// Code `id` as "file:function:first_line" into buf; -1 if unknown or buf too small.
CUWT_EXPORT int cuw_test_pyframes_code(uint32_t id, char* buf, int len) {
  const pf::Code* c = pf::code(id);
  if (!c) return -1;
  const int w = std::snprintf(buf, static_cast<size_t>(len), "%s:%s:%u", c->file, c->function, c->first_line);
  return w < 0 || w >= len ? -1 : 0;
}

CUWT_EXPORT int cuw_test_pyframes_available() { return pf::available() ? 1 : 0; }
CUWT_EXPORT uint32_t cuw_test_pyframes_count() { return pf::count(); }

/// What a thread without a Python thread state captures (a driver or framework thread).
CUWT_EXPORT int cuw_test_pyframes_foreign_thread() {
  int n = -1;
  pthread_t t;
  auto body = [](void* arg) -> void* {
    pf::Frame frames[16];
    *static_cast<int*>(arg) = pf::capture(frames, 16);
    return nullptr;
  };
  if (pthread_create(&t, nullptr, body, &n) != 0) return -1;
  pthread_join(t, nullptr);
  return n;
}

/// Calls `cb` (a Python callback through ctypes): frames of Python, then C, then Python.
CUWT_EXPORT int cuw_test_pyframes_call(int (*cb)()) { return cb(); }

/// Nanoseconds per capture of at most `max` frames, the best of `rounds` rounds of
/// `iterations` captures each; *frames gets the count captured.
CUWT_EXPORT double cuw_test_pyframes_bench(int rounds, int iterations, int max, int* frames) {
  pf::Frame out[256];
  double best = 1e30;
  int n = 0;
  for (int r = 0; r < rounds; ++r) {
    const double t0 = now_ns();
    for (int i = 0; i < iterations; ++i) n = pf::capture(out, max);
    const double per = (now_ns() - t0) / iterations;
    if (per < best) best = per;
  }
  *frames = n;
  return best;
}

/// The line-table decoder alone (detail::line_for), for comparison with code.co_lines().
CUWT_EXPORT int cuw_test_pyframes_line(const uint8_t* table, int n, int first_line, int addr, int format) {
  return pf::detail::line_for(table, static_cast<size_t>(n), first_line, addr, format);
}

/// Nanoseconds per capture of at most `max` frames with cold caches: the median of `rounds`
/// captures, each after writing a buffer larger than the last-level cache.
CUWT_EXPORT double cuw_test_pyframes_bench_cold(int rounds, int max, int* frames) {
  static constexpr size_t kEvict = 64u << 20;
  static unsigned char* evict = new unsigned char[kEvict];
  pf::Frame out[256];
  double times[64];
  if (rounds > 64) rounds = 64;
  for (int r = 0; r < rounds; ++r) {
    for (size_t i = 0; i < kEvict; i += 64) evict[i] = static_cast<unsigned char>(i + r);
    const double t0 = now_ns();
    *frames = pf::capture(out, max);
    times[r] = now_ns() - t0;
  }
  std::sort(times, times + rounds);
  return times[rounds / 2];
}

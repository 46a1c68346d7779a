// fakecuda: call counting and tracing of cu* entry points, error names, the counter test API.
#include "internal.hpp"  // before fakecuda.h: it sets up cuda.h for the driver side
#include "../fakecuda.h"

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>


namespace fc {
namespace {

// Counters register themselves on first call; a fixed array keeps registration lock-free to
// read. 2048 is well above the number of exported entry points (~640).
constexpr size_t kMaxCounters = 2048;
std::atomic<CallCounter*> g_counters[kMaxCounters];
std::atomic<size_t> g_counter_count{0};

bool name_matches(const char* counter, const char* query) {
  size_t n = std::strlen(query);
  if (std::strncmp(counter, query, n) != 0) return false;
  const char* rest = counter + n;
  if (*rest == 0) return true;
  // A base name also matches its variants: _v<digits>, _ptds, _ptsz and combinations.
  while (*rest == '_') {
    ++rest;
    if (rest[0] == 'v' && rest[1] >= '0' && rest[1] <= '9') {
      ++rest;
      while (*rest >= '0' && *rest <= '9') ++rest;
    } else if (std::strncmp(rest, "ptds", 4) == 0 || std::strncmp(rest, "ptsz", 4) == 0) {
      rest += 4;
    } else {
      return false;
    }
  }
  return *rest == 0;
}

}  // namespace

CallCounter::CallCounter(const char* n) : name(n) {
  size_t i = g_counter_count.fetch_add(1);
  if (i < kMaxCounters) g_counters[i].store(this, std::memory_order_release);
}

void CallCounter::hit() noexcept {
  count.fetch_add(1, std::memory_order_relaxed);
  if (trace_level() >= 2) trace("call %s", name);
}

void thrash_caches() noexcept {
  static const size_t bytes = [] {
    const char* v = std::getenv("FAKECUDA_THRASH_KB");
    return v ? static_cast<size_t>(std::strtoull(v, nullptr, 10)) * 1024 : size_t{0};
  }();
  if (bytes == 0) return;
  static char* buf = static_cast<char*>(std::calloc(bytes, 1));
  if (!buf) return;
  for (size_t i = 0; i < bytes; i += 64) buf[i] = static_cast<char>(buf[i] + 1);
#if defined(__x86_64__)
  // 4096 eight-byte nops: 32 KiB of instructions, the size of an L1 instruction cache.
  __asm__ volatile(".rept 4096\n\t.byte 0x0f, 0x1f, 0x84, 0x00, 0x00, 0x00, 0x00, 0x00\n\t.endr" ::: "memory");
#endif
}

int trace_level() {
  static const int level = [] {
    const char* v = std::getenv("FAKECUDA_TRACE");
    return v ? std::atoi(v) : 0;
  }();
  return level;
}

void trace(const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  std::fprintf(stderr, "[fakecuda] %s\n", buf);
}

}  // namespace fc

namespace {

struct ErrorName {
  CUresult code;
  const char* name;
  const char* text;
};

#define FC_ERR(code, text) {code, #code, text}
const ErrorName kErrors[] = {
    FC_ERR(CUDA_SUCCESS, "no error"),
    FC_ERR(CUDA_ERROR_INVALID_VALUE, "invalid argument"),
    FC_ERR(CUDA_ERROR_OUT_OF_MEMORY, "out of memory"),
    FC_ERR(CUDA_ERROR_NOT_INITIALIZED, "initialization error"),
    FC_ERR(CUDA_ERROR_DEINITIALIZED, "driver shutting down"),
    FC_ERR(CUDA_ERROR_NO_DEVICE, "no CUDA-capable device is detected"),
    FC_ERR(CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal"),
    FC_ERR(CUDA_ERROR_INVALID_IMAGE, "device kernel image is invalid"),
    FC_ERR(CUDA_ERROR_INVALID_CONTEXT, "invalid device context"),
    FC_ERR(CUDA_ERROR_NO_BINARY_FOR_GPU, "no kernel image is available for execution on the device"),
    FC_ERR(CUDA_ERROR_INVALID_HANDLE, "invalid resource handle"),
    FC_ERR(CUDA_ERROR_ILLEGAL_STATE, "the operation cannot be performed in the present state"),
    FC_ERR(CUDA_ERROR_NOT_FOUND, "named symbol not found"),
    FC_ERR(CUDA_ERROR_NOT_READY, "device not ready"),
    FC_ERR(CUDA_ERROR_ILLEGAL_ADDRESS, "an illegal memory access was encountered"),
    FC_ERR(CUDA_ERROR_CONTEXT_IS_DESTROYED, "context is destroyed"),
    FC_ERR(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "part or all of the requested memory range is already mapped"),
    FC_ERR(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "pointer does not correspond to a registered memory region"),
    FC_ERR(CUDA_ERROR_NOT_PERMITTED, "operation not permitted"),
    FC_ERR(CUDA_ERROR_NOT_SUPPORTED, "operation not supported"),
    FC_ERR(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "operation not permitted when stream is capturing"),
    FC_ERR(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "operation failed due to a previous error during capture"),
    FC_ERR(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, "capture was not initiated in this stream"),
    FC_ERR(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, "operation would make the legacy stream depend on a capturing blocking stream"),
    FC_ERR(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, "attempt to terminate a thread-local capture sequence from another thread"),
    FC_ERR(CUDA_ERROR_UNKNOWN, "unknown error"),
};
#undef FC_ERR

}  // namespace

FC_API CUresult cuGetErrorName(CUresult error, const char** pStr) {
  FC_ENTER();
  if (!pStr) return CUDA_ERROR_INVALID_VALUE;
  for (const auto& e : kErrors) {
    if (e.code == error) {
      *pStr = e.name;
      return CUDA_SUCCESS;
    }
  }
  *pStr = nullptr;
  return CUDA_ERROR_INVALID_VALUE;
}

FC_API CUresult cuGetErrorString(CUresult error, const char** pStr) {
  FC_ENTER();
  if (!pStr) return CUDA_ERROR_INVALID_VALUE;
  for (const auto& e : kErrors) {
    if (e.code == error) {
      *pStr = e.text;
      return CUDA_SUCCESS;
    }
  }
  *pStr = nullptr;
  return CUDA_ERROR_INVALID_VALUE;
}

FC_API void fakecuda_reset_counters(void) {
  size_t n = std::min(fc::g_counter_count.load(), fc::kMaxCounters);
  for (size_t i = 0; i < n; ++i) {
    if (auto* c = fc::g_counters[i].load(std::memory_order_acquire)) c->count.store(0);
  }
}

FC_API uint64_t fakecuda_call_count(const char* name) {
  if (!name) return 0;
  uint64_t total = 0;
  size_t n = std::min(fc::g_counter_count.load(), fc::kMaxCounters);
  for (size_t i = 0; i < n; ++i) {
    auto* c = fc::g_counters[i].load(std::memory_order_acquire);
    if (c && fc::name_matches(c->name, name)) total += c->count.load();
  }
  return total;
}

namespace fc {
namespace {
struct PausePoint {
  std::atomic<bool> armed{false};  // checked first: the points lie on the frees' path
  std::mutex mu;
  std::string name;
  void (*fn)(void*) = nullptr;
  void* arg = nullptr;
};
PausePoint& pause_state() {
  static auto* p = new PausePoint;  // never destroyed: driver calls may run during exit
  return *p;
}
}  // namespace

void pause_point(const char* name) {
  void (*fn)(void*) = nullptr;
  void* arg = nullptr;
  {
    PausePoint& p = pause_state();
    if (!p.armed.load(std::memory_order_acquire)) return;
    std::lock_guard lock(p.mu);
    if (!p.fn || p.name != name) return;
    fn = p.fn;
    arg = p.arg;
    p.fn = nullptr;
    p.armed.store(false, std::memory_order_release);
  }
  fn(arg);
}
}  // namespace fc

FC_API void fakecuda_pause_in(const char* name, void (*fn)(void*), void* arg) {
  fc::PausePoint& p = fc::pause_state();
  std::lock_guard lock(p.mu);
  p.name = name ? name : "";
  p.fn = name ? fn : nullptr;
  p.arg = arg;
  p.armed.store(p.fn != nullptr, std::memory_order_release);
}

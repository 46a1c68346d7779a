// fakecuda: call counters and tracing; free of cuda.h so generated stubs can use it too.
#pragma once

#include <atomic>
#include <cstdint>

namespace fc {

struct CallCounter {
  explicit CallCounter(const char* name);
  void hit() noexcept;
  const char* name;
  std::atomic<uint64_t> count{0};
};

/// FAKECUDA_THRASH_KB=N (benchmarks only): each allocation and free entry point first
/// writes N KiB of private memory and runs 32 KiB of code, as a real driver call evicts its
/// caller's cache lines (L1 data, L1 instruction and part of L2). Unset or 0: nothing.
void thrash_caches() noexcept;

int trace_level();  // FAKECUDA_TRACE: 0 off, 1 stubs/export tables/misses, 2 every call
void trace(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// Every exported cu* entry point starts with FC_ENTER(): counts the call (one relaxed atomic
// add after the first call) and prints it when FAKECUDA_TRACE=2.
#define FC_ENTER()                                  \
  static ::fc::CallCounter fc_counter_{__func__}; \
  fc_counter_.hit()

// What cuGetProcAddress resolves from (proc_table.cpp, generated rows).
struct RawProc {
  const char* base;
  int version;
  int kind;  // 0 plain, 1 ptds, 2 ptsz
  const char* name;
  void* fn;
};
const RawProc* proc_rows(unsigned long* count);

}  // namespace fc

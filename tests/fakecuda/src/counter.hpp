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

// The call gate of the checkpoint API (checkpoint.cpp). One word: the number of calls inside
// the driver, and two flags. cuCheckpointProcessLock sets kGateClosed: a call that arrives
// waits until the process is unlocked, and the lock waits for the calls already inside to
// return (the count reaches 0). kGateFailed: a FAILED process's calls return at once.
// Count and flags share the word so that one atomic add both counts a call and reads the gate.
inline constexpr uint32_t kGateClosed = 1u << 31;
inline constexpr uint32_t kGateFailed = 1u << 30;
inline constexpr uint32_t kGateCount = kGateFailed - 1;
extern std::atomic<uint32_t> g_calls;
int gate_wait() noexcept;       // the gate was not open: 0 once inside, else a CUresult (still counted)
void gate_last_out() noexcept;  // wakes a lock waiting for the calls inside to return

// About 6 instructions while the gate is open: an atomic add and a compare on entry and on return.
struct ApiCall {
  int rc = 0;
  ApiCall() noexcept {
    if (g_calls.fetch_add(1) >= kGateFailed) rc = gate_wait();
  }
  ~ApiCall() {
    if (g_calls.fetch_sub(1) == (kGateClosed | 1)) gate_last_out();
  }
  ApiCall(const ApiCall&) = delete;
  ApiCall& operator=(const ApiCall&) = delete;
};

// Every exported cu* entry point starts with FC_ENTER(): counts the call (one relaxed atomic
// add after the first call), prints it when FAKECUDA_TRACE=2, and passes the call gate. The
// checkpoint entry points use FC_COUNT() instead: they are not gated (a process may lock
// itself, and a controller's own calls never wait for another process).
#define FC_COUNT()                                  \
  static ::fc::CallCounter fc_counter_{__func__}; \
  fc_counter_.hit()
#define FC_ENTER()        \
  FC_COUNT();             \
  ::fc::ApiCall fc_call_; \
  if (fc_call_.rc != 0) return static_cast<CUresult>(fc_call_.rc)

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

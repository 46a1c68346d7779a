// Unit tests of the call sites' stack walk (test_unwind.cpp): call chains built with chosen
// flags (unwind_chains_nofp.cpp, unwind_chains_fp.cpp, unwind_lib.c), each ending in take().
#pragma once

/// backtrace()'s signature: the walk under test, or glibc's own.
using Unwinder = int (*)(void**, int);

struct Capture {
  static constexpr int kMax = 64;
  void* frames[kMax];
  int n = 0;
};

/// What each chain passes down: the unwinder and where its frames go.
struct Job {
  Unwinder fn;
  Capture* out;
};

/// The bottom of every chain: fn(out) from one call instruction (test_unwind.cpp).
int take(Job* job);

// Without frame pointers (-O2 -fomit-frame-pointer): four frames of different sizes.
int chain_nofp(Job* job);
// Frames whose CFA is found from RBP: two alloca'ed frames (GCC keeps a frame pointer in such
// functions whatever the flags), then chain_nofp.
int chain_alloca(Job* job, int bytes);
// With frame pointers (-O2 -fno-omit-frame-pointer): four frames.
int chain_fp(Job* job);

extern "C" {
/// unwind_lib.c (a shared library, -fomit-frame-pointer): cb(arg) two frames down, the second
/// reached through the library's own PLT.
int cuwt_lib_outer(int (*cb)(void*), void* arg);
/// An assembler frame whose CFA is a DWARF expression (test_unwind.cpp): cb(arg).
int cuwt_expr_frame(int (*cb)(void*), void* arg);
}

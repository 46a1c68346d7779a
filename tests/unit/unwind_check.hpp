// Unit tests of the call sites' stack walk: the comparison test_unwind.cpp and
// test_unwind_table.cpp make, the walk against glibc's backtrace() from one call instruction.
#pragma once

#include <catch2/catch.hpp>
#include <execinfo.h>

#include <string>
#include <vector>

#include "core/callsites/unwind.hpp"
#include "unwind_chains.hpp"

/// The walk, then backtrace() if it fell back: what CallSites::capture() does.
int walk_or_backtrace(void** out, int max);

/// The frames a capture holds (none when it fell back).
std::vector<void*> frames_of(const Capture& c);

/// backtrace()'s frames less those of a sanitizer's interceptor of it, which the ASan and
/// TSan builds put on top.
std::vector<void*> reference(const Capture& c);

/// One line a frame, named by dladdr, for a failed comparison's message.
std::string describe(const std::vector<void*>& v);

/// Runs `run(job)` twice from one call instruction (the loop's count is read at run time, so
/// it is not unrolled): once with the walk, once with backtrace(). [0] walk, [1] backtrace.
template <class Run>
__attribute__((noinline)) void both(Run run, Capture* out) {
  static volatile int rounds = 2;
  for (int i = 0; i < rounds; ++i) {
    Job job{i == 0 ? &cuw::core::unwind::walk : &backtrace, &out[i]};
    run(&job);
    __asm__ volatile("" ::: "memory");
  }
}

/// The walk did not fall back, and gave backtrace()'s frames, at least four.
void require_same(const Capture* c);

/// Walks through a library loaded for it (CUWT_UNWIND_DL), unloads it, and walks again
/// through another; each walk must equal backtrace()'s. Returns the walk's statistics from
/// just before the unload; *frames_after (if given): the frames of the walk after it.
cuw::core::unwind::Stats walk_across_an_unload(int* frames_after = nullptr);

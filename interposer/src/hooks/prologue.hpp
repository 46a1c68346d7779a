// cuwarden interposer: what every hook starts with (after LLVM compiler-rt's INTERCEPTOR).
//
// How to add a hook:
//   1. A row in base/hook_table.hpp (see its recipe) and the name in interposer/exports.map.in.
//   2. The definition, in the hooks/ file of its family (allocations, memory, queries,
//      contexts, lookup), named hook_<name>:
//        CUW_EXPORT CUresult hook_cuFoo(CUbar* out, size_t n) {
//          CUW_PROLOGUE(cuFoo, out, n);  // `real`: the driver's cuFoo; nested calls pass through
//          core::Tracker& t = core::Tracker::get();
//          ...                          // arguments; the backend or core::record; real(out, n)
//        }
//   3. A test under tests/interposer that calls it through every path a program would
//      (the symbol, dlsym, cuGetProcAddress: test_resolution.cpp covers every table row).
// A hook handles arguments and calls the driver; counting, caps and events are the core's
// (core/record.hpp), pools the backend's (backends/start.hpp: with_backend).
#pragma once

#include <cuda.h>

#include "base/real.hpp"
#include "core/tracker.hpp"

/// Exported under the driver's name (base/real.hpp declares hook_<name> with that symbol).
#define CUW_EXPORT extern "C" __attribute__((visibility("default")))
/// The same for entry points on the allocation hot path: grouped with the core's hot code
/// (cuw/attrs.hpp).
#define CUW_EXPORT_HOT extern "C" __attribute__((visibility("default"), hot))

namespace cuw::hooks {
/// A driver entry point we hook but cannot find: behave like a driver that lacks it.
inline constexpr CUresult kNoDriver = CUDA_ERROR_NOT_INITIALIZED;
}  // namespace cuw::hooks

/// `real`: the driver's `name` (base/real.hpp: REAL), or return kNoDriver. Enough for a hook
/// that keeps no state across its driver call (the work hooks, captures, entry-point lookup).
#define CUW_REAL(name)                        \
  auto real = REAL(name);                     \
  if (__builtin_expect(real == nullptr, 0)) { \
    return ::cuw::hooks::kNoDriver;           \
  }

/// CUW_REAL, then the re-entry guard: a hook entered from inside another hook on the same
/// thread (a driver calling its own exported entry point) returns real(args...) untouched.
/// Costs a thread-local increment and decrement.
#define CUW_PROLOGUE(name, ...)            \
  CUW_REAL(name)                           \
  ::cuw::core::Reentry cuw_reentry_;       \
  if (cuw_reentry_.nested()) {             \
    return real(__VA_ARGS__);              \
  }

// cuwarden: function attributes for the hot path.
//
// A hooked call runs right after (or right before) the driver did a lot of its own work, so
// cuwarden's code is usually not in the instruction cache. CUW_HOT functions are placed
// together (GCC and Clang put them in .text.hot, which the linker groups), so the hot path
// of an alloc or free spans few cache lines; CUW_COLD keeps rare paths out of them.
#pragma once

#define CUW_HOT __attribute__((hot))
#define CUW_COLD __attribute__((cold, noinline))
// A piece of the hot path that must be inlined into each hook that uses it, so that the
// hook's path is one stretch of code instead of calls into lines spread over the library.
#define CUW_INLINE inline __attribute__((always_inline))
// The same for a lambda: [&](auto& b) CUW_LAMBDA_INLINE { ... } (after the parameters).
#define CUW_LAMBDA_INLINE __attribute__((always_inline))

/* Interposer tests: queries of the interposer's internals that no hooked entry point answers
   (the backend's blocks and pool statistics), exported by libcuwarden_testing.so only: the
   product's objects and testing_api.cpp. A test finds them with dlsym(RTLD_DEFAULT, ...). */
#ifndef CUWARDEN_TESTING_API_H
#define CUWARDEN_TESTING_API_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* backends::pool_stats of device `ordinal`, in bytes. */
typedef struct {
  uint64_t reserved, cached, largest_free;
} cuwt_pool_stats;

/* backends::block_info; state 0 live, 1 free, 2 pending. */
typedef struct {
  uint64_t address, bytes, requested;
  int32_t ordinal, state;
} cuwt_block;

/* 0 and *out filled; -1 when no backend has started (no tracker yet). */
typedef int (*cuwt_pool_stats_fn)(int ordinal, cuwt_pool_stats* out);
/* Every block the backend holds: up to `cap` into `out`; returns how many there are. */
typedef size_t (*cuwt_blocks_fn)(cuwt_block* out, size_t cap);
/* CUWARDEN_POOL as the backend chosen at start names itself: "off" (passthrough) or "cache";
   NULL when none has started. */
typedef const char* (*cuwt_backend_name_fn)(void);

/* Runtime calls (cudaMalloc, cudaFree, cudaFreeAsync of a shared runtime) the pool answered on
   the calling thread without the runtime (interposer/src/hooks/runtime.cpp). */
typedef uint64_t (*cuwt_runtime_answers_fn)(void);
/* Device `ordinal`'s refusals counter (the ring's "ooms"); -1 when it has no slot yet. */
typedef int64_t (*cuwt_refusals_fn)(int ordinal);
/* Take (`hold` 1) or release (0) the hooks' lock (`book` -1: Tracker::lock()) or device
   `book`'s pool book lock, as the interposer's own threads do; -1 when no tracker exists. */
typedef int (*cuwt_hold_lock_fn)(int book, int hold);

#ifdef __cplusplus
}
#endif

#endif

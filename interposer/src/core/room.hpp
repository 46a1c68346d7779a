// cuwarden interposer core: asking the daemon for room when the GPU, not a cap, is out of
// memory (docs/suspend.md, "By policy").
//
// The daemon may suspend lower-priority processes to make room. The process asks only when
// the failure is real: the same request failed twice on this thread within a short window (a
// framework's allocator gives back its cache and tries again, PyTorch's does), or cuwarden's
// own pool has just given back what it keeps. It asks over the daemon's socket, from the
// allocating thread (no thread of its own), holding none of cuwarden's locks, never during a
// stream capture, never when no daemon listens (the connect fails at once), and waits at most
// the policy's room_wait (the ring header's room_wait_ms, which the daemon writes; 30 s
// before it has) plus a little for the answer to travel. The core notes the driver's refusal
// where it counts it (count_driver_error, a pool's last try). Every hooked allocation of
// device memory asks on CUDA_ERROR_OUT_OF_MEMORY and makes its call once more when room was
// made: cuMemAlloc and cuMemAllocAsync through backends/start.hpp (allocate_after_room, the
// backend once more), the core's own (pitched, managed, cuMemCreate, the program's pools)
// through again_after_room.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "core/tracker.hpp"
#include "cuw/attrs.hpp"

namespace cuw::core {

/// Notes that the driver refused `bytes` on device `ordinal` for lack of memory in the calling
/// thread's allocation (its CUDA_ERROR_OUT_OF_MEMORY, not a cap's refusal); `gave_back`:
/// cuwarden's pool gave back what it kept before that try. Read by retry_after_room().
/// Thread-local; cold.
CUW_COLD void note_driver_oom(int ordinal, uint64_t bytes, bool gave_back) noexcept;

/// A hooked allocation of `bytes` returned CUDA_ERROR_OUT_OF_MEMORY: whether to try it once
/// more, because the driver refused it (note_driver_oom) and the daemon made room
/// (room_granted). Consumes the note. Blocks up to the policy's room_wait. Cold.
CUW_COLD bool retry_after_room(Tracker& t, uint64_t bytes) noexcept;

/// again_after_room()'s rare path, out of line (with its second copy of the call).
template <class Again>
CUW_COLD CUresult again_after_room_slow(Tracker& t, uint64_t bytes, Again& again) {
  return retry_after_room(t, bytes) ? again() : CUDA_ERROR_OUT_OF_MEMORY;
}

/// A hooked allocation of `bytes` (as the core counted it: the estimate, for a pitched one)
/// returned `r`: on CUDA_ERROR_OUT_OF_MEMORY that retry_after_room() grants, `again()` (the
/// whole tracked call once more); otherwise `r`. The caller holds none of cuwarden's locks.
/// Blocks up to the policy's room_wait. Inline: one untaken branch on success.
template <class Again>
CUW_INLINE CUresult again_after_room(Tracker& t, uint64_t bytes, CUresult r, Again&& again) {
  if (__builtin_expect(r != CUDA_ERROR_OUT_OF_MEMORY, 1)) return r;
  return again_after_room_slow(t, bytes, again);
}

/// How close two failures of the same request must come for the second to ask, in ns.
inline constexpr uint64_t kRoomRepeatWindowNs = 5'000'000'000ULL;

/// After the driver refused `bytes` on device `ordinal` for lack of memory (its
/// CUDA_ERROR_OUT_OF_MEMORY, with the caller holding no cuwarden lock): whether to try the
/// allocation once more because the daemon made room. Asks only on the thread's second
/// failure of the same (ordinal, bytes) within kRoomRepeatWindowNs, or at once when
/// `pool_gave_back` (cuwarden's pool gave back what it kept and the retry failed too). Blocks
/// up to the policy's room_wait. Never throws; false on any error (no daemon, a refusal, a
/// capture in progress). Thread-safe; cold.
CUW_COLD bool room_granted(Tracker& t, int ordinal, uint64_t bytes, bool pool_gave_back) noexcept;

}  // namespace cuw::core

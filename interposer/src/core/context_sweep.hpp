// cuwarden interposer core: the context sweep. When the driver destroys a context (cuCtxDestroy,
// a primary context's reset or last release) it frees the memory allocated in it; the counters
// and the caps must let go of it too. The hooks take a snapshot of the context's arrays just
// before the driver call (arrays_of) and sweep after it (forget_driver_freed); the queries
// below tell whether a primary context is the one a call destroys.
#pragma once

#include <cuda.h>

#include "core/array_owners.hpp"
#include "core/tracker.hpp"

namespace cuw::core {

/// After the driver destroyed a context: the allocations and pinned host memory it freed
/// with it are counted as freed (uncharged; free / host_free events with api cuCtxDestroy),
/// so that the counters and the cap do not keep memory the program can no longer free.
/// Which ones: the tracked cuMemAlloc / pitch / managed allocations and pinned host blocks
/// the driver no longer knows (cuPointerGetAttribute answers CUDA_ERROR_INVALID_VALUE).
/// Stream-ordered and graph allocations are not asked: pools outlive a context, and the
/// driver does not know a graph's memory until the graph runs (measured on an H200). CUDA
/// arrays are handles and cannot be asked: those in `arrays` (the context's, taken by
/// arrays_of() before the driver call) are counted freed (forget_arrays_of). VMM handles
/// (cuMemCreate) outlive a context and stay counted until released. Every key is asked
/// without the tracker's lock; one that looks gone is asked again and taken under it, so
/// that an address the driver has handed out again meanwhile (known again) is left to its
/// new owner. Not once cuwarden's atexit handler has run (Tracker::exiting: nothing is
/// capped any more). Cold: one driver query per live record.
void forget_driver_freed(Tracker& t, const ArrayOwners::Snapshot& arrays);

/// The arrays of context `ctx` (key, serial), taken just before the driver call that may
/// destroy it, for forget_arrays_of() after it. An array created by another thread between
/// this and the driver call, in the same context, is not in it (it stays counted: an
/// over-count, for a program that creates arrays in a context it is destroying); one created
/// after the call, in a context that took the handle over, is never in it. Empty if memory
/// ran out (the arrays then stay counted until destroyed). Cold: walks every array.
ArrayOwners::Snapshot arrays_of(Tracker& t, CUcontext ctx) noexcept;

/// Device `dev`'s primary context if it is active (only an active one can hold pooled
/// memory; retaining it then creates nothing), else nullptr.
CUcontext active_primary(CUdevice dev);
/// Context `ctx`'s ID (CUDA driver API: cuCtxGetId, CUDA 12.0): unique to one context for
/// the process's life, so a primary context destroyed and made active again, which keeps its
/// handle, has a new one (measured on an H200). 0 when not known (the call is missing or
/// fails, e.g. for a destroyed context).
unsigned long long context_id(CUcontext ctx);
/// Whether device `dev`'s primary context is inactive (destroyed) now.
bool primary_gone(CUdevice dev);

}  // namespace cuw::core

// cuwarden interposer: IPC of pooled memory. A legacy handle (cuIpcGetMemHandle) names a whole
// driver allocation, and none names mapped memory: a block packed with others (the cache's
// slabs) or mapped from granules (vmm) has no handle of its own. For such a block the
// exporter hands out a handle of ours, which names the exporting process, a nonce and the
// block, and starts a listener (one thread, at its first such export) on an abstract unix
// socket. An importer under cuwarden (any CUWARDEN_POOL) that opens the handle asks that
// listener, which checks the block is still live and answers with what maps it:
//   - legacy: the legacy handle of the driver allocation that holds the block, and the
//     block's offset in it (the importer opens that allocation once, however many of its
//     blocks it imports);
//   - granules: the granules the block lies in, as file descriptors
//     (cuMemExportToShareableHandle) passed with SCM_RIGHTS, which the importer maps into a
//     range of its own (cuMemImportFromShareableHandle, cuMemMap, cuMemSetAccess).
// A socket, not pidfd_getfd: that needs ptrace rights, which a child lacks over its parent
// under Yama; the listener answers only processes of the same user (SO_PEERCRED) or root.
// An importer without cuwarden gets CUDA_ERROR_INVALID_VALUE from the driver (the exporter
// says so in its log once).
//
// Like PyTorch's caching allocator, whose CUDA IPC shares blocks the same way: an exporter
// that frees a block may reuse its memory; keep it allocated while others use it
// (torch.multiprocessing counts references for this).
#pragma once

#include <cuda.h>

#include <cstdint>

#include "backends/backend.hpp"

namespace cuw::backends::ipc {

/// Fills `out` with a handle of ours for the live block at `p` (`bytes` requested), which
/// `backend` describes when an importer asks (backend::ipc_describe). Starts the listener at
/// the first call (a thread; a socket). CUDA_SUCCESS, or CUDA_ERROR_OPERATING_SYSTEM when the
/// listener cannot start (logged). Thread-safe.
CUresult make_handle(CUipcMemHandle* out, CUdeviceptr p, uint64_t bytes, backend* exporter);

/// Whether `h` is one of our handles (make_handle in some process). No allocation; thread-safe.
bool is_ours(const CUipcMemHandle& h) noexcept;

/// cuIpcOpenMemHandle of one of our handles, in the calling thread's current context:
/// CUDA_SUCCESS and *p (the block's first byte), or CUDA_ERROR_INVALID_VALUE (bad arguments),
/// CUDA_ERROR_INVALID_CONTEXT (no current context), CUDA_ERROR_INVALID_HANDLE (the exporter
/// is gone, or the block is not live any more), CUDA_ERROR_MAP_FAILED, or the driver's error.
/// Thread-safe; blocks on the exporter's listener, at most a few seconds.
CUresult open(CUdeviceptr* p, const CUipcMemHandle& h, unsigned flags);

/// If `p` was returned by open(): undoes that mapping, sets *result, and returns true; false
/// for any other address. Thread-safe.
bool close(CUdeviceptr p, CUresult* result);

/// If `p` lies in a block open() mapped: true and its range (the block). One atomic load when
/// nothing is imported. Thread-safe.
bool imported(CUdeviceptr p, range* out);

}  // namespace cuw::backends::ipc

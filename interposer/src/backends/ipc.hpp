// cuwarden interposer: IPC of pooled memory. A legacy handle (cuIpcGetMemHandle) names a whole
// driver allocation, and none names mapped memory: a block packed with others (the cache's
// slabs) or mapped from granules (vmm) has no handle of its own. For such a block the
// exporter hands out a handle of ours, which names the exporting process, a nonce and the
// block, remembers the export, and starts a listener (one thread, at its first such export)
// on an abstract unix socket named after its user, pid and nonce. An importer under cuwarden
// (any CUWARDEN_POOL) that opens the handle asks that listener, which checks that the block
// is the one exported and still live, and answers with what maps it:
//   - legacy: the legacy handle of the slab that holds the block, and the block's offset in
//     it (the importer opens the slab once per context, however many of its blocks it
//     imports);
//   - granules: the granules the block lies in, as file descriptors
//     (cuMemExportToShareableHandle) passed with SCM_RIGHTS, which the importer maps into a
//     range of its own (cuMemImportFromShareableHandle, cuMemMap, cuMemSetAccess).
// A socket, not pidfd_getfd: that needs ptrace rights, which a child lacks over its parent
// under Yama. Each side checks the other's credentials (same effective user, or root). An
// importer without cuwarden gets CUDA_ERROR_INVALID_VALUE from the driver (the exporter says
// so in its log once).
//
// Like PyTorch's caching allocator, whose CUDA IPC shares blocks the same way: an exporter
// that frees a block may reuse its memory; keep it allocated while others use it
// (torch.multiprocessing counts references for this). A handle of a block freed since opens
// nothing.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "backends/backend.hpp"

namespace cuw::backends::ipc {

/// Fills `out` with a handle of ours for the live block `span` describes (ipc_span::block,
/// requested, generation; for a slab its legacy handle), which `exporter` describes again
/// when an importer asks (backend::ipc_describe). Starts the listener at the first call (a
/// thread; a socket). CUDA_SUCCESS, CUDA_ERROR_NOT_SUPPORTED (granules not created
/// exportable), or CUDA_ERROR_OUT_OF_MEMORY (the export cannot be remembered, or the
/// listener cannot start: logged). Thread-safe.
CUresult make_handle(CUipcMemHandle* out, const ipc_span& span, backend* exporter);

/// Whether `h` is one of our handles (make_handle in some process). No allocation; thread-safe.
bool is_ours(const CUipcMemHandle& h) noexcept;

/// cuIpcOpenMemHandle of one of our handles, in the calling thread's current context: the
/// same handle opened again in the same context answers the same address (counted, as the
/// driver does). CUDA_SUCCESS and *p (the block's first byte), or CUDA_ERROR_INVALID_VALUE
/// (bad arguments; `flags` other than CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS, as the driver), CUDA_ERROR_INVALID_CONTEXT (no current context, or the handle is this
/// process's own), CUDA_ERROR_INVALID_HANDLE (the exporter is gone, does not answer within
/// 10 s, answers wrongly, or the block is no longer the one exported), CUDA_ERROR_MAP_FAILED,
/// CUDA_ERROR_OUT_OF_MEMORY, or the driver's error. Thread-safe; waits for the exporter's
/// listener, at most 10 s in all.
CUresult open(CUdeviceptr* p, const CUipcMemHandle& h, unsigned flags);

/// If `p` was returned by open(), or lies in a slab open() mapped: undoes one open of it (the
/// mapping goes with the last, after the context's work is done) and sets *result; an
/// address inside such a mapping that no open returned is CUDA_ERROR_INVALID_VALUE (the
/// driver would unmap the other blocks). Returns false for any other address. Thread-safe.
bool close(CUdeviceptr p, CUresult* result);

/// If `p` lies in a block open() mapped: true and its range (the block). One atomic load when
/// nothing is imported. Thread-safe.
bool imported(CUdeviceptr p, range* out);

/// Whether anything open() mapped is still open. One atomic load; thread-safe.
bool has_imports() noexcept;

/// Context `ctx` was destroyed: the driver unmapped its legacy imports; its granule imports
/// (which outlive contexts) are unmapped here. One atomic load when nothing is imported.
/// Thread-safe.
void context_gone(CUcontext ctx) noexcept;

}  // namespace cuw::backends::ipc

/* fakecuda: test-only extension API of the simulated CUDA driver (libcuda.so.1 in build/fakecuda).
 *
 * These functions exist only in the simulated driver. A test that uses them links the
 * `fakecuda` target (or resolves them with dlsym on the libcuda handle it already has).
 * All are thread-safe. Device ordinals are as the process sees them (after
 * CUDA_VISIBLE_DEVICES). Streams follow the driver's rules: 0 / CU_STREAM_LEGACY is the
 * legacy default stream of the current context, CU_STREAM_PER_THREAD the per-thread one.
 *
 * CUDA arrays: cuArrayCreate/cuArray3DCreate/cuMipmappedArrayCreate take device memory from the
 * same arena as cuMemAlloc (see fakecuda_array_bytes for the size rule).
 *
 * Environment read by the simulated driver (once, at first use):
 *   CUWARDEN_FAKE_DEVICES  number of physical devices (default 1)
 *   CUWARDEN_FAKE_MEMORY   bytes per device: "16G" or a list "1G,512M" (K/M/G/T = powers of
 *                          1024; a shorter list repeats its last value) (default 16G)
 *   CUWARDEN_FAKE_UUIDS    optional comma list "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" by physical
 *                          index; an empty entry keeps that device's default
 *                          (GPU-c0dafa7e-5a1e-4000-8000-0000000000NN, NN = physical index)
 *   CUWARDEN_FAKE_NAME     device name (default "cuwarden simulated GPU")
 *   CUWARDEN_FAKE_NAMES    optional comma list of names by physical index; an empty or
 *                          missing entry keeps CUWARDEN_FAKE_NAME (a restore onto another GPU
 *                          needs the same name: the same chip)
 *   CUWARDEN_FAKE_CONTEXT_MEMORY  bytes the driver takes from the device for each live
 *                          context (default 0), counted as the context's own: in cuMemGetInfo
 *                          and NVML's per-process figure, never in an allocation
 *   CUDA_VISIBLE_DEVICES   as the real driver: indices or (prefixes of) UUIDs, reordering,
 *                          stops at the first invalid entry; "" hides every device
 *   CUWARDEN_FAKE_NO_VMM   set: devices say they lack virtual memory management (the
 *                          attribute is 0; the entry points still work)
 *   CUWARDEN_FAKE_MPS      set: the process is an MPS client (CU_DEVICE_ATTRIBUTE_MPS_ENABLED
 *                          is 1 on every device); a checkpoint of it fails, leaving it FAILED
 *   CUWARDEN_FAKE_DIR      optional directory shared by cooperating processes (unset: each
 *                          process has devices of its own, as before). Set, it turns on:
 *                          - one device shared by every process naming the same UUID: the
 *                            file DIR/device-<UUID> holds each process's bytes, allocations
 *                            fail when the processes together would exceed the capacity (the
 *                            first process's CUWARDEN_FAKE_MEMORY), cuMemGetInfo and the
 *                            simulated NVML count every live process;
 *                          - the checkpoint API across processes: cuInit creates
 *                            DIR/proc-<pid> (0600) and a service thread that runs the
 *                            cuCheckpointProcess* requests of other processes
 *                            (src/checkpoint.hpp describes the channel).
 *                          It must let every process that uses it create files (01777 for
 *                          several users). The checkpoint API on the caller's own pid works
 *                          without it.
 *   FAKECUDA_TRACE         1: log unimplemented entry points, export tables, lookup misses;
 *                          2: also every cu* call
 */
#ifndef CUWARDEN_FAKECUDA_H
#define CUWARDEN_FAKECUDA_H

#include <cuda.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Queues a sleep of `ms` milliseconds on `stream`: later work on it waits.
 *  Returns CUDA_SUCCESS, or the driver's error for a bad stream / no context. */
CUresult fakecuda_stream_delay(CUstream stream, unsigned ms);

/** Queues, on `stream`, a sleep of `delay_ms` followed by setting `bytes` bytes at `dptr` to
 *  `value` (a slow "kernel" writing memory). The write happens on the stream's worker
 *  thread, in stream order. Returns CUDA_SUCCESS or the driver's error. */
CUresult fakecuda_stream_fill_async(CUstream stream, CUdeviceptr dptr, unsigned char value,
                                    size_t bytes, unsigned delay_ms);

/** Fault injection for races in the simulated driver itself: while the gate is closed
 *  (`closed` != 0), an event recorded on an idle stream (which the caller completes at once,
 *  as on an idle device) waits between taking its place in the stream and completing, where
 *  a preempted thread would be. Opening it (0) lets every such caller go on. */
void fakecuda_inline_gate(int closed);

/** The number of callers waiting at the closed gate, once at least one is or after
 *  `timeout_ms` milliseconds. */
int fakecuda_inline_gate_waiting(unsigned timeout_ms);

/** Decodes an IPC handle made by cuIpcGetMemHandle: the driver allocation it exports (its
 *  base address and size; an interior pointer exports the whole allocation, as on the
 *  driver). Returns 0, or -1 for a handle the simulated driver did not make. */
int fakecuda_ipc_handle_range(const CUipcMemHandle* handle, CUdeviceptr* base, size_t* size);

/** 1 if context `from` has enabled peer access to context `to` (cuCtxEnablePeerAccess), else 0. */
int fakecuda_peer_access_enabled(CUcontext from, CUcontext to);

/** Sets every cu* call counter to zero. */
void fakecuda_reset_counters(void);

/** Number of calls since the last reset. An exact exported name ("cuMemAlloc_v2") counts that
 *  entry point only; a base name ("cuMemAlloc") also counts its ABI and per-thread variants
 *  (cuMemAlloc_v2, ..._ptds, ..._ptsz). Calls the driver makes internally are not counted.
 *  "cuMemMap bytes" and "cuMemUnmap bytes" answer the bytes mapped and unmapped (on the GPU
 *  their cost grows with the bytes, not the calls). */
uint64_t fakecuda_call_count(const char* name);

/** cuMemFree_v2 under a name no interposer hooks: memory freed where cuwarden does not see
 *  it (as the driver frees a destroyed context's memory). Same results as cuMemFree_v2. */
CUresult fakecuda_free_unseen(CUdeviceptr dptr);

/** Test hook: `fn(arg)` runs once, on the calling thread with no lock of the simulated
 *  driver held, inside the next call that reaches point `name`, then the point is disarmed:
 *  "cuArrayDestroy" (on entry, before the array is looked up), "cuArrayDestroy refused"
 *  (the handle names no array: before it returns CUDA_ERROR_INVALID_HANDLE),
 *  "cuDevicePrimaryCtxRelease" (after the last release destroyed the primary context,
 *  before it returns; a primary context made active again after its last release keeps its
 *  handle and gets a new cuCtxGetId, as on the real driver), "cuDevicePrimaryCtxGetState"
 *  (after it found the primary context inactive, before it returns), "cuMemFree freed"
 *  (cuMemFree of a cuMemAlloc or managed block: after its addresses went back to the arena,
 *  before it returns) or "cuCtxDestroy destroyed" (cuCtxDestroy_v2: after the context and
 *  its memory are gone, before it returns). Lets a test run another thread's calls at an
 *  exact moment of a driver call (for races between an interposer's bookkeeping and the
 *  driver). `fn` NULL disarms.
 *  One point is armed at a time; arming another replaces it (`fn` may arm the next). */
void fakecuda_pause_in(const char* name, void (*fn)(void*), void* arg);

/** Bytes currently counted against device `ordinal`'s capacity (what cuMemGetInfo subtracts):
 *  cuMemAlloc blocks (512-byte granules), memory-pool reserve, VMM handles, graph memory.
 *  Returns 0 for an unknown ordinal. */
size_t fakecuda_live_bytes(int ordinal);

/** Number of distinct free blocks in device `ordinal`'s arena (fragmentation probe). */
size_t fakecuda_free_block_count(int ordinal);

/** Bytes CUDA array `array` takes from its device (what cuMemGetInfo dropped by when it was
 *  created): round_up(Width * max(Height,1) * max(Depth,1) * element bytes, 512), element bytes =
 *  format bytes * NumChannels. 0 for an unknown handle and for arrays created with
 *  CUDA_ARRAY3D_SPARSE or CUDA_ARRAY3D_DEFERRED_MAPPING (they take no memory). For a level of a
 *  mipmapped array (cuMipmappedArrayGetLevel): that level's share of the mipmapped array. */
size_t fakecuda_array_bytes(CUarray array);

/** Bytes mipmapped array `array` takes from its device: the sum over its levels of each level's
 *  bytes as above (every non-zero extent halved per level, at least 1; the layer count of a
 *  layered or cubemap array is not halved), each level rounded up to 512 on its own.
 *  0 for an unknown handle or a sparse / deferred-mapping one. */
size_t fakecuda_mipmapped_array_bytes(CUmipmappedArray array);

/** One simulated physical device, as NVML sees it (not affected by CUDA_VISIBLE_DEVICES). */
typedef struct fakecuda_physical_device {
  char uuid[96];               /**< "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" */
  char name[96];               /**< CUWARDEN_FAKE_NAME */
  unsigned char uuid_bytes[16];
  size_t capacity;             /**< bytes (CUWARDEN_FAKE_MEMORY) */
  size_t live_bytes;           /**< bytes this process has on it now (see fakecuda_live_bytes) */
  int pci_domain, pci_bus, pci_device;
  int ordinal;                 /**< CUDA ordinal in this process, -1 if hidden by CUDA_VISIBLE_DEVICES */
} fakecuda_physical_device;

/** The driver's own memory of the calling thread's current context grows by `bytes`, as when
 *  the real driver loads a module lazily at a kernel's first launch. CUDA_SUCCESS, or
 *  CUDA_ERROR_INVALID_CONTEXT without a current context. */
CUresult fakecuda_context_grow(size_t bytes);

/** Number of simulated physical devices (CUWARDEN_FAKE_DEVICES), visible or not. */
int fakecuda_physical_count(void);

/** Fills `*out` for physical device `physical_index`; 0 on success, -1 if out of range. */
int fakecuda_physical_info(int physical_index, fakecuda_physical_device* out);

/** Bytes counted against physical device `physical_index` (0 if out of range). */
size_t fakecuda_physical_live_bytes(int physical_index);

/** Bytes counted on physical device `physical_index`: every live process's under
 *  CUWARDEN_FAKE_DIR, else this process's (fakecuda_physical_live_bytes). 0 if out of range. */
size_t fakecuda_physical_used_bytes(int physical_index);

/** One process's bytes on a device. */
typedef struct fakecuda_process_usage {
  int pid;
  size_t bytes;
} fakecuda_process_usage;

/** The processes with bytes on physical device `physical_index` (every live process under
 *  CUWARDEN_FAKE_DIR; else this process, when it has any): fills up to `max` entries of `out`
 *  and returns how many there are. A checkpointed process holds none. */
int fakecuda_physical_processes(int physical_index, fakecuda_process_usage* out, int max);

/** What the checkpoint API knows of a process, beyond cuCheckpointProcessGetState. */
typedef struct fakecuda_checkpoint_info {
  int state;                /**< CUprocessState */
  unsigned blocked_calls;   /**< its CUDA calls waiting at the closed gate now */
  size_t host_bytes;        /**< device bytes it holds on the host while CHECKPOINTED */
  int restore_tid;          /**< its service thread (cuCheckpointProcessGetRestoreThreadId), 0 if none */
} fakecuda_checkpoint_info;

/** Fills `*out` for process `pid` (this process, or one reachable under CUWARDEN_FAKE_DIR).
 *  0, or -1 when the process has no channel. Never waits for the process. */
int fakecuda_process_checkpoint_info(int pid, fakecuda_checkpoint_info* out);

/** Kind of an entry of fakecuda_proc_table(). */
enum fakecuda_proc_kind {
  FAKECUDA_PROC_PLAIN = 0, /**< default / legacy-stream variant */
  FAKECUDA_PROC_PTDS = 1,  /**< per-thread default stream variant of a synchronous call */
  FAKECUDA_PROC_PTSZ = 2   /**< per-thread default stream variant of an asynchronous call */
};

/** One ABI variant that cuGetProcAddress can return. */
typedef struct fakecuda_proc_entry {
  const char* base_name;     /**< what callers pass as `symbol`, e.g. "cuMemAlloc" */
  int version;               /**< CUDA version that introduced this variant, e.g. 3020 */
  int kind;                  /**< enum fakecuda_proc_kind */
  const char* exported_name; /**< the symbol it resolves to, e.g. "cuMemAlloc_v2" */
} fakecuda_proc_entry;

/** The whole table cuGetProcAddress resolves from (static storage; never freed).
 *  `*count` receives the number of entries. */
const fakecuda_proc_entry* fakecuda_proc_table(size_t* count);

/** Parses a CUDA_VISIBLE_DEVICES value the way the driver does, for `physical_count` devices
 *  whose UUID strings ("GPU-...") are `uuids`. Writes up to `max` physical indices to `out`
 *  and returns how many devices are visible. `spec` NULL means unset (all devices). */
int fakecuda_parse_visible_devices(const char* spec, int physical_count,
                                   const char* const* uuids, int* out, int max);

#ifdef __cplusplus
}
#endif

#endif /* CUWARDEN_FAKECUDA_H */

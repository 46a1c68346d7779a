// fakecuda: private declarations shared by the simulated driver's files (never installed).
//
// How the pieces fit:
//   devices.cpp   device list from the environment, CUDA_VISIBLE_DEVICES, device queries, cuInit
//   context.cpp   contexts (primary and created), the per-thread context stack
//   arena.cpp     per-device first-fit arena: the "physical" device memory
//   memory.cpp    cuMemAlloc & co., host memory, pointer queries, the allocation table
//   arrays.cpp    CUDA arrays and mipmapped arrays (arena memory, validated handles)
//   streams.cpp   streams, events, copies and memsets executed by per-stream worker threads
//   mempool.cpp   stream-ordered allocator (cuMemAllocAsync, memory pools)
//   graph.cpp     stream capture and a minimal graph (memory alloc/free nodes, captured work)
//   vmm.cpp       virtual memory management (cuMemCreate/Map/...), backed by memfds
//   modules.cpp   modules/libraries: accepted and empty (no kernels run here)
//   procaddress.cpp cuGetProcAddress over the generated table (proc_table.inc)
//   proc_table.cpp  the table's addresses, and a weak NOT_SUPPORTED stub per unimplemented export
//   export_tables.cpp cuGetExportTable: the private tables NVIDIA's runtime requires
//   counters.cpp  call counting, tracing, error names, the counter test API
//   shared_device.cpp  a device's capacity shared between processes (CUWARDEN_FAKE_DIR)
//   checkpoint.cpp  the process's side of the checkpoint API: the call gate, lock, checkpoint,
//                 restore, unlock, and the thread that serves other processes' requests
//   checkpoint_channel.cpp  the controller's side: cuCheckpointProcess* on another pid
//
// Rule: an exported cu* function never calls another exported cu* function (so that an
// interposer sees exactly the calls the application made, and call counts stay exact); they
// all call the fc:: functions below. The library is also linked -Bsymbolic.
#pragma once

// Exposes the legacy (pre-_v2) prototypes and the _ptds/_ptsz names, which the driver
// itself must define, and undoes cuda.h's `#define cuMemAlloc cuMemAlloc_v2` renames.
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "counter.hpp"

#define FC_API extern "C" __attribute__((visibility("default")))

namespace fc {

// ---------------------------------------------------------------- arena.cpp
// First-fit allocator over one contiguous host mapping. Offsets and sizes are multiples of
// kAlign; adjacent free blocks coalesce. Thread-safe.
class Arena {
 public:
  static constexpr size_t kAlign = 512;
  explicit Arena(size_t capacity);
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  // Returns the address of a block of at least `bytes` (rounded up to kAlign), or 0.
  uintptr_t allocate(size_t bytes);
  // Returns the size the block had, or 0 if `addr` is not the start of a live block.
  size_t release(uintptr_t addr);
  uintptr_t base() const { return base_; }
  size_t capacity() const { return capacity_; }
  // The memfd the arena maps (another process maps an IPC-exported block from it), or -1
  // in a forked child.
  int fd() const { return fd_; }
  size_t largest_free() const;
  size_t free_block_count() const;
  // For the checkpoint: the live blocks (address, length), and dropping every page (the
  // contents read as zero afterwards; the addresses stay reserved).
  std::vector<std::pair<uintptr_t, size_t>> used_blocks() const;
  void discard();

 private:
  uintptr_t base_ = 0;
  size_t capacity_ = 0;
  int fd_ = -1;
  mutable std::mutex mu_;
  std::map<size_t, size_t> free_;  // offset -> length, address order
  std::map<size_t, size_t> used_;  // offset -> length
};

// ---------------------------------------------------------------- devices.cpp
struct Context;
struct MemPool;
struct SharedDevice;

struct Device {
  int ordinal = 0;   // as the process sees it (after CUDA_VISIBLE_DEVICES)
  int physical = 0;  // index among CUWARDEN_FAKE_DEVICES
  std::string name;
  CUuuid uuid{};
  std::string uuid_string;  // "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
  size_t capacity = 0;
  int pci_bus = 0;

  // Bytes this process has counted against capacity: arena blocks (incl. pool reserve), VMM
  // device handles, graph allocations, the driver's memory for contexts. reserve() fails
  // instead of exceeding capacity (the shared device's, with every process's bytes, when
  // `shared` is set); charge() never fails (the driver's own memory).
  std::atomic<size_t> used{0};
  SharedDevice* shared = nullptr;  // CUWARDEN_FAKE_DIR: the file every process shares
  bool reserve(size_t bytes);
  void charge(size_t bytes);
  void unreserve(size_t bytes);
  // Bytes in use on the device: every process's when shared, else this process's.
  size_t device_used() const;

  Arena& arena();  // created on first use (the mapping is large but lazy)
  std::once_flag arena_once;
  std::unique_ptr<Arena> arena_;

  // Primary context.
  std::mutex primary_mu;
  Context* primary = nullptr;  // created once, kept for the process lifetime
  int primary_refs = 0;
  unsigned primary_flags = 0;

  // Memory pools.
  std::mutex pool_mu;
  MemPool* default_pool = nullptr;
  MemPool* current_pool = nullptr;
};

bool initialized();
void ensure_devices();  // parses the environment once
int device_count();
Device* device(int ordinal);  // nullptr if out of range
CUresult check_device(CUdevice dev);
size_t parse_size(const char* text, bool* ok);
// A restore onto other GPUs (cuCheckpointProcessRestore's gpuPairs): every device the process
// sees moves to the simulated device its pair names, keeping its ordinal and its addresses;
// cuDeviceGetUuid, the name and the shared capacity file follow the new device. Checks
// first, changing nothing when they fail: CUDA_ERROR_INVALID_VALUE for a pair that names no
// simulated device, a visible device named twice or left out, or a new device named twice;
// CUDA_ERROR_NOT_SUPPORTED for a device of another name (chip).
CUresult remap_devices(const CUcheckpointGpuPair* pairs, unsigned count);

// ---------------------------------------------------------------- context.cpp
struct Stream;

struct Context {
  int ordinal = 0;
  unsigned flags = 0;
  bool is_primary = false;
  std::atomic<bool> alive{true};
  size_t driver_bytes = 0;  // the driver's own memory for it (CUWARDEN_FAKE_CONTEXT_MEMORY, modules)
  Stream* legacy = nullptr;
  std::mutex streams_mu;
  std::vector<Stream*> streams;  // every live stream of this context, incl. legacy and per-thread
  std::vector<Stream*> draining;  // destroyed streams whose queued work may still run
  std::atomic<uint64_t> id{0};
};

Context* current_context();          // nullptr if none
CUresult require_context(Context** out);  // CUDA_ERROR_NOT_INITIALIZED / INVALID_CONTEXT
Context* context_from_handle(CUcontext h);  // validates; nullptr if unknown
void context_attach_stream(Context* ctx, Stream* s);
void context_detach_stream(Context* ctx, Stream* s);
CUresult context_synchronize(Context* ctx);
CUresult primary_retain(CUcontext* pctx, CUdevice dev);

// ---------------------------------------------------------------- memory.cpp
enum class AllocKind { device, managed, host, registered, pool, graph, vmm, ipc };

struct Allocation {
  uintptr_t base = 0;
  size_t size = 0;       // what the user asked for, rounded as the driver reports it
  size_t block = 0;      // bytes taken from the arena / mapping
  AllocKind kind = AllocKind::device;
  int ordinal = 0;
  Context* ctx = nullptr;
  MemPool* pool = nullptr;
  uint64_t buffer_id = 0;
  unsigned host_flags = 0;
  bool exported = false;  // a legacy IPC handle names it (cuIpcGetMemHandle)
};

// The process-wide table of every range the driver knows about.
void table_insert(const Allocation& a);
bool table_erase(uintptr_t base, Allocation* out);  // exact start address
bool table_find(uintptr_t addr, Allocation* out);   // any address inside
// ipc_peer.cpp: unmaps an IPC import already out of the table (its context went away).
void ipc_unmap(const Allocation& a);
bool table_find_range(uintptr_t addr, size_t bytes, Allocation* out);
bool table_overlaps(uintptr_t addr, size_t bytes);
/// The VMM granularity (minimum and recommended), as on the H200.
inline constexpr size_t kVmmGranularity = size_t{2} << 20;
/// The address reservation (cuMemAddressReserve) that holds `addr`: true and its base and size.
bool vmm_reservation_of(uintptr_t addr, uintptr_t* base, size_t* size);
// Frees every cuMemAlloc / cuMemAllocManaged allocation and every array of `ctx` (its
// destruction, a primary context's reset or last release).
void table_free_context(Context* ctx);
/// Destroy every CUDA array and mipmapped array created in `ctx` (the driver frees them
/// with their context); arrays.cpp.
void arrays_free_context(Context* ctx);

// Device memory from the arena, accounted against capacity.
CUresult device_alloc(Device* d, size_t bytes, uintptr_t* out, size_t* block);
void device_free_block(Device* d, uintptr_t addr);
// Capture-safety gate for calls that the driver forbids during a global-mode capture.
CUresult capture_unsafe_call_check();

// ---------------------------------------------------------------- streams.cpp
using OpFn = std::function<void()>;

struct Graph;

struct Stream {
  Context* ctx = nullptr;
  unsigned flags = 0;
  int priority = 0;
  bool legacy = false;
  bool per_thread = false;
  uint64_t id = 0;
  std::atomic<bool> alive{true};

  std::mutex mu;
  std::condition_variable cv;
  struct Op {
    OpFn fn;
    std::vector<std::pair<Stream*, uint64_t>> deps;
    uint64_t seq;
  };
  std::deque<Op> queue;
  uint64_t submitted = 0;
  uint64_t completed = 0;
  uint64_t inline_running = 0;  // seq of an op run by its caller (an idle stream's marker), or 0
  bool worker_started = false;

  // Capture state (guarded by mu).
  CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
  CUstreamCaptureMode capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
  Graph* capture_graph = nullptr;
  uint64_t capture_id = 0;
  uint64_t capture_thread = 0;
};

// Resolves a handle as the API sees it: 0 means the legacy stream, or the per-thread stream
// for _ptsz/_ptds entry points; CU_STREAM_LEGACY and CU_STREAM_PER_THREAD are honoured.
CUresult resolve_stream(CUstream h, bool per_thread_default, Stream** out);
Stream* stream_create(Context* ctx, unsigned flags, int priority, bool legacy, bool per_thread);
// Queues `fn`; returns its sequence number, 0 when the stream is capturing (recorded instead),
// or an error through `err` (capture rules).
uint64_t stream_enqueue(Stream* s, OpFn fn, CUresult* err);
void stream_wait(Stream* s, uint64_t seq);
bool stream_done(Stream* s, uint64_t seq);
uint64_t stream_submitted(Stream* s);
CUresult stream_synchronize(Stream* s);
bool stream_is_capturing(Stream* s);

// ---------------------------------------------------------------- mempool.cpp
MemPool* device_default_pool(Device* d);
void pools_trim_to_threshold();  // at synchronization points, like the driver
CUresult pool_free_async(const Allocation& a, Stream* s);

// ---------------------------------------------------------------- graph.cpp
// Called by stream_enqueue for a capturing stream (s->mu held).
void graph_capture_op(Graph* g, OpFn fn);
CUresult graph_capture_alloc(Stream* s, size_t bytes, int ordinal, CUdeviceptr* out);
CUresult graph_capture_free(Stream* s, CUdeviceptr ptr);
bool graph_free_outside(const Allocation& a, Stream* s, CUresult* rc);
// Thread capture mode (cuThreadExchangeStreamCaptureMode).
CUstreamCaptureMode& thread_capture_mode();
// Invalidates every capture that a prohibited call from this thread breaks; returns true if
// the call is prohibited.
bool capture_prohibits_unsafe_call();
bool any_blocking_stream_capturing(Context* ctx);
void invalidate_captures_of(Context* ctx);

uint64_t thread_token();

// ---------------------------------------------------------------- shared_device.cpp
// CUWARDEN_FAKE_DIR, or nullptr when unset (each process then has devices of its own).
const char* shared_dir();
// The shared record of physical device `uuid` (created on first use), or nullptr without
// CUWARDEN_FAKE_DIR. Aborts when the directory cannot hold it (a test set-up error).
SharedDevice* shared_device_open(const std::string& uuid, size_t capacity);
// Adds `bytes` to this process's share; with `check`, refuses (false) beyond capacity.
bool shared_device_add(SharedDevice* s, size_t bytes, bool check);
void shared_device_sub(SharedDevice* s, size_t bytes);
size_t shared_device_used(SharedDevice* s);  // every live process's bytes
// Live processes with bytes on the device: up to `max` (pid, bytes) pairs; returns how many.
int shared_device_processes(SharedDevice* s, int* pids, size_t* bytes, int max);
// /proc/PID/stat's start time (clock ticks after boot), or 0 for a process that is gone or
// a zombie (the GPU has its memory back once the process has exited).
uint64_t process_start_time(int pid);

// ---------------------------------------------------------------- checkpoint.cpp
// Starts the thread that serves other processes' checkpoint requests (CUWARDEN_FAKE_DIR
// only); called by cuInit. Idempotent per process (a forked child starts its own).
void checkpoint_service_start();
// This process's side of the API (pid == getpid(), or a request from the channel).
CUresult process_lock(unsigned timeout_ms);
CUresult process_checkpoint();
// `pairs` (count 0: none) remap the devices first (remap_devices).
CUresult process_restore(const CUcheckpointGpuPair* pairs = nullptr, unsigned count = 0);
CUresult process_unlock();
CUprocessState process_state();
int process_restore_tid();
// Calls of this process waiting at the closed gate.
unsigned process_blocked_calls();
size_t process_host_bytes();  // held on the host while checkpointed
// A live cuMemAlloc / IPC table entry the checkpoint cannot carry: managed memory, an
// imported IPC mapping or an exported allocation (memory.cpp); a VMM handle exported or
// imported (vmm.cpp). Each returns a short reason, or nullptr.
const char* table_uncarryable();
const char* vmm_uncarryable();
/// Whether the process plays an MPS client (CUWARDEN_FAKE_MPS set): the checkpoint cannot carry it.
bool mps_client();
bool table_mark_exported(uintptr_t base);
// Device memory of VMM handles, for the checkpoint's copy: (memfd, size) pairs.
std::vector<std::pair<int, size_t>> vmm_device_handles();
// Every stream of every live context, for the lock's wait for submitted work.
std::vector<Stream*> all_streams();
bool stream_wait_until(Stream* s, uint64_t seq, std::chrono::steady_clock::time_point deadline);

// ---------------------------------------------------------------- counters.cpp
// Runs the test hook armed for point `name` (fakecuda_pause_in), once. Call with no lock held.
void pause_point(const char* name);

}  // namespace fc

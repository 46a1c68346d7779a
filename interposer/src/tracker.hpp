// cuwarden interposer core: caps, exact counters, the live-allocation table and the event
// producer, behind a small API the hooks call. Hooks never touch the ring directly.
//
// Counters live in the process's ring header (shared memory) so that the daemon reads the
// authoritative numbers; when no ring can be created they live in an anonymous mapping of
// the same layout and enforcement is unchanged.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>

#include <cuda.h>

#include "config.hpp"
#include "live_table.hpp"
#include "spin_lock.hpp"
#include "cuw/job.hpp"
#include "cuw/ring.hpp"

namespace cuw::mr {
class cache_registry;
}

namespace cuw::ipc {

/// Add to / take from a device counter with a plain relaxed load and store (no locked
/// instruction). Only under Tracker::counters_lock of the counter's device.
inline void locked_add(std::atomic<uint64_t>& c, uint64_t v) noexcept {
  c.store(c.load(std::memory_order_relaxed) + v, std::memory_order_relaxed);
}
inline void locked_sub(std::atomic<uint64_t>& c, uint64_t v) noexcept {
  c.store(c.load(std::memory_order_relaxed) - v, std::memory_order_relaxed);
}

/// The per-process core. One instance, created at the first CUDA call (Tracker::get()).
class Tracker {
 public:
  /// The instance; creates it on first use: reads the configuration (exits with 78 on bad
  /// configuration unless CUWARDEN_ON_ERROR=open), creates the ring. Thread-safe.
  static Tracker& get();

  /// The instance if one was created, else nullptr (used at exit). Lock-free.
  static Tracker* instance_if_created() noexcept;

  /// Device slot for a CUDA ordinal, filled on first use (UUID, name, physical memory, cap).
  /// nullptr when the ordinal is outside 0..ring::kMaxDevices-1 (then nothing is counted).
  ring::DeviceSlot* device(int ordinal);

  /// Ordinal of the calling thread's current context, or -1 (no context / driver error).
  int current_device();

  /// Try to count `bytes` against `dev`'s cap and, in a job, the job's cap on that GPU.
  /// Exact under any number of threads and processes: a CAS loop that never lets `used`
  /// pass `limit` and never refuses because of another allocation's failed attempt, then
  /// the job segment's reserve-then-validate (cuw/job.hpp). Updates `peak`. Returns false
  /// when over either cap (the refusal is counted and a refuse / job_refuse event
  /// emitted). Cost: one load, one CAS, one peak check; in a job also one locked add and
  /// a read of each member's slot.
  bool charge(ring::DeviceSlot& dev, int ordinal, uint64_t bytes, ring::Api api);

  /// The lock that serializes this process's writes of device `d`'s counters other than
  /// used / peak / limit (those are lock-free: CAS and locked adds): live_allocations,
  /// alloc_count, free_count, reserved, cached, pool_hits, pool_waits, driver_errors,
  /// host_bytes, refusals, and the stream-ordered pools' live bytes. A writer holds it and
  /// updates them with locked_add / locked_sub: one locked instruction for any number of
  /// counters. Readers (the daemon, cuMemGetInfo) load each counter atomically, no lock.
  /// The cache backend guards its free lists with the same lock, so a pooled allocation or
  /// free takes one lock for everything. Never held across a driver or system call.
  spin_lock& counters_lock(const ring::DeviceSlot& d) noexcept { return counters_mu_[d.ordinal & (ring::kMaxDevices - 1)]; }

  /// A successful driver allocation of `bytes` (counted by charge()) on `d`: live
  /// allocations, allocations, and reserved (or, for a stream-ordered one, the pools' live
  /// bytes). One lock.
  void note_alloc(ring::DeviceSlot& d, uint64_t bytes, bool pooled) noexcept;
  /// A successful free of such an allocation (after uncharge()). One lock.
  void note_free(ring::DeviceSlot& d, uint64_t bytes, bool pooled) noexcept;
  /// The driver failed an allocation: counted (one lock).
  void note_driver_error(ring::DeviceSlot& d) noexcept;

  /// Count bytes that are already allocated, cap or not (a pitch larger than estimated).
  void force_charge(ring::DeviceSlot& dev, uint64_t bytes) noexcept;

  /// Give back bytes counted by charge() (a failed driver call, or a free).
  void uncharge(ring::DeviceSlot& dev, uint64_t bytes) noexcept;

  /// The job's cap on `ordinal`'s GPU and what all members hold there (bytes). False when
  /// the process is in no job, or the job has no cap. Lock-free.
  bool job_view(int ordinal, uint64_t* cap, uint64_t* used) const noexcept;

  /// Stream-ordered pools: remember `pool` (nullptr = the device's default pool) as one
  /// that holds memory for `ordinal`, and refresh the device's `reserved` figure from the
  /// pools' CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT (what they keep from the driver, in use or
  /// cached). `force` = false refreshes at most once a millisecond per device (one coarse
  /// clock read otherwise). `discover` = false only refreshes pools already seen, and never
  /// asks the driver for a device's default pool (a program that never used stream-ordered
  /// allocation is left exactly as it was). Thread-safe.
  void refresh_pools(int ordinal, CUmemoryPool pool, bool force, bool discover = true) noexcept;

  /// After a stream-ordered allocation on `ordinal`'s pools (its bytes already counted in
  /// the pools' live bytes by note_alloc): the pools are refreshed at once when their live
  /// bytes passed what they were known to reserve (the pool grew), else at most once a
  /// millisecond. `stream` is the allocation's stream: while it is being captured into a
  /// graph the refresh is skipped (no driver query inside a capture), and done at a later one.
  void pooled_alloc(int ordinal, CUmemoryPool pool, CUstream stream) noexcept;

  /// Emit an event into the ring; never blocks (drops and counts when full).
  void emit(ring::EventKind kind, ring::Api api, int ordinal, uint64_t address, uint64_t bytes, uint64_t aux,
            uint32_t result) noexcept;

  /// CUWARDEN_POOL=cache: the caches (one per CUDA context); nullptr with the pool off.
  /// Lock-free (one load).
  mr::cache_registry* cache() noexcept { return cache_.get(); }

  LiveTable& pointers() noexcept { return pointers_; }
  LiveTable& handles() noexcept { return handles_; }  ///< VMM handles, arrays
  LiveTable& host() noexcept { return host_; }        ///< pinned / registered host memory
  const Config& config() const noexcept { return config_; }
  ring::RingHeader& header() noexcept { return *header_; }

  /// Mark the process exited in the ring (atexit). Never unmaps: CUDA calls made by other
  /// destructors after this still work.
  void on_exit() noexcept;

 private:
  Tracker();
  void create_ring();
  /// True when a daemon accepts connections on the run directory's socket (never blocks).
  bool daemon_listening() const noexcept;
  void fill_device(int ordinal, ring::DeviceSlot& d);
  /// Stamp time and thread on `e` and push it into the ring (never blocks).
  void push(ring::Event& e) noexcept;
  /// Join CUWARDEN_JOB's segment (constructor). Failure is a configuration error.
  void join_job();
  int job_gpu(int ordinal) const noexcept {
    return job_slot_ >= 0 && ordinal >= 0 && ordinal < static_cast<int>(ring::kMaxDevices) ? job_gpu_[ordinal] : -1;
  }

  Config config_;
  spin_lock counters_mu_[ring::kMaxDevices];
  ring::RingHeader* header_ = nullptr;
  ring::EventSlot* slots_ = nullptr;
  uint32_t slot_count_ = 0;
  bool ring_is_file_ = false;
  std::string ring_path_;
  std::mutex device_mu_;
  /// Per device: the stream-ordered pools seen and what they reserved at the last refresh.
  struct PoolSet {
    static constexpr int kMax = 8;
    std::atomic<CUmemoryPool> pools[kMax] = {};
    std::atomic<uint64_t> reserved{0};       ///< sum over pools, bytes
    std::atomic<uint64_t> live{0};           ///< bytes of live stream-ordered allocations (counters_lock)
    std::atomic<uint64_t> refreshed_ns{0};   ///< CLOCK_MONOTONIC_COARSE
    std::mutex mu;                           ///< serialises refreshes (never on the alloc path)
  };
  PoolSet pools_[ring::kMaxDevices];
  /// The job (CUWARDEN_JOB): segment, our slot (-1: no job), the job's GPU index of each
  /// ordinal (-1: not counted, e.g. the job's GPU table is full). Set before the device
  /// slot's `present` is published, read after it.
  job::Segment* job_ = nullptr;
  int job_slot_ = -1;
  int job_gpu_[ring::kMaxDevices];
  std::unique_ptr<mr::cache_registry> cache_;
  LiveTable pointers_;
  LiveTable handles_;
  LiveTable host_;
};

/// Thread-local re-entrancy guard: a hook entered from inside another hook on the same
/// thread (a driver calling its own exported entry point) passes straight through.
class Reentry {
 public:
  Reentry() noexcept : nested_(depth_ > 0) { ++depth_; }
  ~Reentry() { --depth_; }
  bool nested() const noexcept { return nested_; }

 private:
  // initial-exec: the library is preloaded, so its TLS is static; no __tls_get_addr call.
  static thread_local int depth_ __attribute__((tls_model("initial-exec")));
  bool nested_;
};

}  // namespace cuw::ipc

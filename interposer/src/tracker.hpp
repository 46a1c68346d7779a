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

/// Add to / take from a counter with a plain relaxed load and store (no locked
/// instruction). Only under Tracker::lock().
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

  /// The hot path's one lock. Held by a hooked call for one short critical section (two
  /// for an allocation that reaches the driver: before the call and after it), never across
  /// a driver or system call. It guards, for every device: used and peak (the cap), the
  /// counters (live_allocations, alloc_count, free_count, reserved, cached, pool_hits,
  /// pool_waits, driver_errors, host_bytes, refusals), the stream-ordered pools' live
  /// bytes; the live tables (pointers, handles, host); the ring's write position (events are
  /// pushed with ring::push_exclusive); the caches' free lists. So one locked instruction
  /// covers what took a CAS or locked add each. Counters are written with locked_add /
  /// locked_sub (plain relaxed load and store); readers outside the process (the daemon) and
  /// inside it (cuMemGetInfo) load each counter atomically, without the lock. The daemon
  /// writes only `limit`, atomically. The job segment (shared between processes) is
  /// lock-free and updated outside this lock.
  spin_lock& lock() noexcept { return mu_; }

  /// Try to count `bytes` against `dev`'s cap and, in a job, the job's cap on that GPU.
  /// Takes lock() (the caller must not hold it): under it `used` never passes `limit`, and
  /// `peak` follows; then, outside it, the job segment's reserve-then-validate
  /// (cuw/job.hpp). Returns false when over either cap (the refusal is counted and a
  /// refuse / job_refuse event emitted). Cost: one lock; in a job also one locked add and a
  /// read of each member's slot.
  bool charge(ring::DeviceSlot& dev, int ordinal, uint64_t bytes, ring::Api api);

  /// Give back bytes counted by charge() (a failed driver call, or a free): `used` under
  /// lock() (taken here), then the job's share.
  void uncharge(ring::DeviceSlot& dev, uint64_t bytes) noexcept;
  /// The same with lock() already held: `used` only; call job_uncharge() after unlocking.
  void uncharge_locked(ring::DeviceSlot& dev, uint64_t bytes) noexcept;
  /// Count bytes that are already allocated, cap or not (a pitch larger than estimated);
  /// lock() held; call job_force_charge() after unlocking.
  void force_charge_locked(ring::DeviceSlot& dev, uint64_t bytes) noexcept;
  /// The job's share of uncharge / force_charge (lock-free; no-op outside a job).
  void job_uncharge(const ring::DeviceSlot& dev, uint64_t bytes) noexcept;
  void job_force_charge(const ring::DeviceSlot& dev, uint64_t bytes) noexcept;

  /// With lock() held: a successful driver allocation of `bytes` (charged) on `d`: live
  /// allocations, allocations, and reserved (or, for a stream-ordered one, the pools' live
  /// bytes); and its free.
  void count_alloc_locked(ring::DeviceSlot& d, uint64_t bytes, bool pooled) noexcept;
  void count_free_locked(ring::DeviceSlot& d, uint64_t bytes, bool pooled) noexcept;

  /// The job's cap on `ordinal`'s GPU and what all members hold there (bytes). False when
  /// the process is in no job, or the job has no cap. Lock-free.
  bool job_view(int ordinal, uint64_t* cap, uint64_t* used) const noexcept;

  /// Stream-ordered pools: remember `pool` (nullptr = the device's default pool) as one
  /// that holds memory for `ordinal`, and refresh the device's `reserved` figure from the
  /// pools' CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT (what they keep from the driver, in use or
  /// cached). `force` = false refreshes at most once a millisecond per device. `discover` = false only refreshes pools already seen, and never
  /// asks the driver for a device's default pool (a program that never used stream-ordered
  /// allocation is left exactly as it was). Thread-safe.
  void refresh_pools(int ordinal, CUmemoryPool pool, bool force, bool discover = true) noexcept;

  /// After a stream-ordered allocation on `ordinal`'s pools (its bytes already counted in
  /// the pools' live bytes by count_alloc_locked): the pools are refreshed at once when their live
  /// bytes passed what they were known to reserve (the pool grew), else at most once a
  /// millisecond. `stream` is the allocation's stream: while it is being captured into a
  /// graph the refresh is skipped (no driver query inside a capture), and done at a later one.
  /// `now` is the allocation event's time (fast_clock::realtime_ns()).
  void pooled_alloc(int ordinal, CUmemoryPool pool, CUstream stream, uint64_t now) noexcept;

  /// Emit an event into the ring, stamped now; takes lock(). Never blocks on the consumer
  /// (drops and counts when full).
  void emit(ring::EventKind kind, ring::Api api, int ordinal, uint64_t address, uint64_t bytes, uint64_t aux,
            uint32_t result) noexcept;
  /// The same with lock() held and the time already read (fast_clock::realtime_ns(), read
  /// before locking to keep the critical section short). used_after is `ordinal`'s used.
  void emit_locked(ring::EventKind kind, ring::Api api, int ordinal, uint64_t address, uint64_t bytes, uint64_t aux,
                   uint32_t result, uint64_t time_ns) noexcept;

  /// CUWARDEN_POOL=cache: the caches (one per CUDA context); nullptr with the pool off.
  /// Lock-free (one load).
  mr::cache_registry* cache() noexcept { return cache_.get(); }

  /// The live tables; lock() held to use them.
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
  /// Stamp the thread on `e` (time already set) and push it into the ring; lock() held.
  void push_locked(ring::Event& e) noexcept;
  /// Join CUWARDEN_JOB's segment (constructor). Failure is a configuration error.
  void join_job();
  int job_gpu(int ordinal) const noexcept {
    return job_slot_ >= 0 && ordinal >= 0 && ordinal < static_cast<int>(ring::kMaxDevices) ? job_gpu_[ordinal] : -1;
  }

  Config config_;
  spin_lock mu_;
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
    std::atomic<uint64_t> live{0};           ///< bytes of live stream-ordered allocations (lock())
    std::atomic<uint64_t> refreshed_ns{0};   ///< fast_clock::realtime_ns() of the last refresh
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

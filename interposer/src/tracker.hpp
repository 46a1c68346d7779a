// cuwarden interposer core: caps, exact counters, the live-allocation table and the event
// producer, behind a small API the hooks call. Hooks never touch the ring directly.
//
// Counters live in the process's ring header (shared memory) so that the daemon reads the
// authoritative numbers; when no ring can be created they live in an anonymous mapping of
// the same layout and enforcement is unchanged.
#pragma once

#include <cstdint>
#include <mutex>

#include "config.hpp"
#include "live_table.hpp"
#include "cuw/ring.hpp"

namespace cuw::ipc {

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

  /// Try to count `bytes` against `dev`'s cap. Exact under any number of threads: a CAS
  /// loop that never lets `used` pass `limit` and never refuses because of another
  /// allocation's failed attempt. Updates `peak`. Returns false when over the cap (the
  /// refusal is counted and an event emitted). Cost: one load, one CAS, one peak check.
  bool charge(ring::DeviceSlot& dev, int ordinal, uint64_t bytes, ring::Api api);

  /// Count bytes that are already allocated, cap or not (a pitch larger than estimated).
  void force_charge(ring::DeviceSlot& dev, uint64_t bytes) noexcept;

  /// Give back bytes counted by charge() (a failed driver call, or a free).
  void uncharge(ring::DeviceSlot& dev, uint64_t bytes) noexcept;

  /// Emit an event into the ring; never blocks (drops and counts when full).
  void emit(ring::EventKind kind, ring::Api api, int ordinal, uint64_t address, uint64_t bytes, uint64_t aux,
            uint32_t result) noexcept;

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

  Config config_;
  ring::RingHeader* header_ = nullptr;
  ring::EventSlot* slots_ = nullptr;
  uint32_t slot_count_ = 0;
  bool ring_is_file_ = false;
  std::string ring_path_;
  std::mutex device_mu_;
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

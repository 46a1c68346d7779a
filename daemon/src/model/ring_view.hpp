// cuwarden daemon: one ring file, opened and mapped as untrusted input.
//
// open_ring() checks the file (regular, not a symlink, sane size, owner == the uid the ring
// claims, name == the pid/starttime it claims), maps it and validates the layout. After
// that, every read of the mapping goes through snapshot()/drain(), which copy what they
// need under the fault guard: the owner may scribble on or truncate the file at any time.
#pragma once

#include <sys/types.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "cuw/counters.hpp"
#include "cuw/ring.hpp"

namespace cuw::daemon {

#define CUW_SNAPSHOT_FIELD_(f, ...) uint64_t f = 0;
#define CUW_SNAPSHOT_VALUE_X_(f, ...) v[i++] = f;
#define CUW_SNAPSHOT_VALUE_D_(f, ...) v[i++] = derive_##f();
/// The counter part of a device snapshot for a counter list (counters.hpp): one field per
/// stored row, and values(): every row's value in the list's order, derived rows computed
/// by the snapshot's derive_<field>() (bytes or counts, as the row says).
#define CUW_SNAPSHOT_COUNTERS(LIST)                                                     \
  LIST(CUW_SNAPSHOT_FIELD_, CUW_COUNTER_NONE_)                                          \
  std::array<uint64_t, 0 LIST(CUW_COUNTER_ONE_, CUW_COUNTER_ONE_)> values() const noexcept { \
    std::array<uint64_t, 0 LIST(CUW_COUNTER_ONE_, CUW_COUNTER_ONE_)> v{};              \
    std::size_t i = 0;                                                                  \
    LIST(CUW_SNAPSHOT_VALUE_X_, CUW_SNAPSHOT_VALUE_D_)                                  \
    return v;                                                                           \
  }
#define CUW_COPY_COUNTER_(f, ...) o.f = s.f.load(std::memory_order_relaxed);
/// Copy slot `s`'s stored counters into snapshot `o`, one relaxed load each.
#define CUW_COPY_DEVICE_COUNTERS(LIST) LIST(CUW_COPY_COUNTER_, CUW_COUNTER_NONE_)

/// A copy of one DeviceSlot, taken field by field (one atomic load each).
struct DeviceSnapshot {
  bool present = false;
  uint8_t uuid[16] = {};
  char name[sizeof(ring::DeviceSlot::name)] = {};
  uint64_t physical_total = 0;
  CUW_SNAPSHOT_COUNTERS(CUW_DEVICE_COUNTERS)
  DeviceSnapshot() noexcept { limit = ring::kNoLimit; }
  /// What the program's allocations hold: used less what the pool caches. Hostile input:
  /// never underflows.
  uint64_t derive_in_use() const noexcept { return cached >= used ? 0 : used - cached; }
};

/// A copy of the header's fields; char fields are raw (use field_text()).
struct RingSnapshot {
  uint32_t pid = 0, uid = 0, state = 0, device_count = 0;
  uint32_t cap_scope = 0;  ///< ring::CapScope, unchecked (hostile input)
  uint64_t pidns = 0;      ///< RingHeader::pidns: the namespace `pid` is counted in (0: unknown)
  int32_t priority = 0;          ///< CUWARDEN_PRIORITY as asked (unchecked: hostile input)
  uint32_t priority_asked = 0;   ///< nonzero: the process asked for `priority`
  uint64_t start_time = 0, created_ns = 0, exited_ns = 0, heartbeat_ns = 0;
  uint64_t events_written = 0, events_dropped = 0, write_pos = 0, read_pos = 0;
  char comm[sizeof(ring::RingHeader::comm)] = {};
  char cmdline[sizeof(ring::RingHeader::cmdline)] = {};
  char job[sizeof(ring::RingHeader::job)] = {};
  char pool[sizeof(ring::RingHeader::pool)] = {};
  /// RingHeader::visible_devices, at most kMaxDevices (0: unknown); the `uuid` of each of
  /// these devices is copied, present or not.
  uint32_t visible_devices = 0;
  DeviceSnapshot devices[ring::kMaxDevices];
};

/// The few header words the daemon checks on every scan (RingView::status()).
struct RingStatus {
  uint32_t state = 0;           ///< ring::ProcessState
  uint64_t exited_ns = 0;       ///< the process's own clean-exit time, 0 before
  uint64_t events_dropped = 0;  ///< events the producer had no room for
};

/// Result of one drain() call.
struct DrainResult {
  bool ok = true;            ///< false: the ring faulted or changed geometry; drop it
  std::size_t events = 0;    ///< events copied out
  uint64_t lost = 0;         ///< claimed-but-never-published slots skipped
  uint64_t write_pos = 0;    ///< positions after the drain, for diagnostics
  uint64_t read_pos = 0;
  uint32_t present = 0;      ///< bit d: device slot d is present (read only when asked for)
};

class RingView {
 public:
  RingView(const RingView&) = delete;
  RingView& operator=(const RingView&) = delete;
  ~RingView();

  /// Copy the header. False if the mapping faulted.
  bool snapshot(RingSnapshot& out) const noexcept;
  /// Read the process state, exit time and drop count only (three words of the header's first
  /// lines). False if the mapping faulted.
  bool status(RingStatus& out) const noexcept;
  /// Copy up to `max` events into `out`. Read-only mappings drain nothing. See ring::drain for
  /// `stuck_skip`. `heartbeat_ns` (CLOCK_REALTIME) is written as the consumer heartbeat when
  /// events were drained, or always with `beat_idle` (a write to a line the producer reads,
  /// so an idle ring gets it only now and then). DrainResult::present is filled with
  /// `read_present` or when events were drained (one cache line per device slot: an idle
  /// ring's are read only now and then).
  DrainResult drain(ring::Event* out, std::size_t max, bool stuck_skip, uint64_t heartbeat_ns, bool beat_idle,
                    bool read_present) noexcept;

  /// Live cap change: replace device `d`'s limit (bytes, ring::kNoLimit = none) with one
  /// CAS from `expected`, so a concurrent writer is never overwritten unseen.
  enum class SetLimit { ok, changed, not_present, read_only, fault };
  /// On `changed`, *actual holds the value found. The interposer reads the new value on
  /// its next allocation; nothing already allocated is touched.
  SetLimit set_limit(uint32_t d, uint64_t expected, uint64_t desired, uint64_t* actual) noexcept;

  bool writable() const noexcept { return writable_; }
  /// Tell the process it was resumed after `suspended_ns` by `by` (ring.hpp, `resumes`): it
  /// prints one line on its stderr at its next CUDA call. False: read-only or faulted.
  bool notify_resumed(uint64_t suspended_ns, const std::string& by) noexcept;
  /// Tell the process how long its allocations may wait for room (ring.hpp, room_wait_ms).
  /// False: read-only or faulted.
  bool set_room_wait(uint32_t ms) noexcept;
  /// Hold the process's allocations back on the devices of `mask` (ring.hpp, held_back: bit
  /// per ordinal; 0 releases them). False: read-only or faulted.
  bool set_held_back(uint32_t mask) noexcept;
  /// The process was restored onto other GPUs: from now on snapshot() gives device
  /// `ordinal` the UUID `uuid` (what the driver gives it now), whatever the ring still says,
  /// until the interposer has rewritten it (then both agree). Loop thread only.
  void set_moved_uuid(uint32_t ordinal, const uint8_t (&uuid)[16]) noexcept;
  /// Tell the interposer its devices moved (ring.hpp: kDevicesMoved in held_back): it reads
  /// their UUIDs again before its next allocation. False: read-only or faulted.
  bool notify_moved() noexcept;
  uint32_t slot_count() const noexcept { return slot_count_; }
  uint64_t mapped_bytes() const noexcept { return size_; }
  dev_t dev() const noexcept { return dev_; }
  ino_t ino() const noexcept { return ino_; }

 private:
  friend struct RingOpener;
  RingView() = default;
  ring::RingHeader* header() const noexcept { return static_cast<ring::RingHeader*>(base_); }
  ring::EventSlot* slots() const noexcept {
    return reinterpret_cast<ring::EventSlot*>(static_cast<char*>(base_) + ring::kHeaderBytes);
  }

  void* base_ = nullptr;
  uint64_t size_ = 0;
  uint32_t slot_count_ = 0;
  bool writable_ = false;
  uint32_t moved_mask_ = 0;  ///< bit d: moved_uuid_[d] replaces the ring's UUID of device d
  uint8_t moved_uuid_[ring::kMaxDevices][16] = {};
  dev_t dev_ = 0;
  ino_t ino_ = 0;
};

/// Outcome of open_ring(): a view, or why not. `transient` marks failures that a ring being
/// created right now goes through (empty file, magic not written yet): the caller waits a
/// little before reporting them.
struct OpenResult {
  std::unique_ptr<RingView> view;
  std::string error;
  bool transient = false;
  /// The ring's writer runs in a pid namespace where no process this daemon sees has its
  /// pid: not judged (neither taken as exited nor removed), looked at again later.
  bool unmapped = false;
  /// The writer's pid in the daemon's own pid namespace (paths::host_pid), with a view.
  uint32_t host_pid = 0;
};

/// Open `name` inside the directory `dirfd`. `expect_pid`/`expect_start_time` come from
/// the file name (the pid as the writer's namespace counts it). Never follows symlinks, never blocks on FIFOs.
OpenResult open_ring(int dirfd, const std::string& name, uint32_t expect_pid, uint64_t expect_start_time);

}  // namespace cuw::daemon

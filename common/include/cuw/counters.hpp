// cuwarden: the per-device counters, declared once.
//
// One row per counter, in the order of the ring's DeviceSlot and of the daemon's state JSON.
// From this list come: the ring slot's fields (ring.hpp), the daemon's typed snapshot and
// its JSON keys, the CLI's --query-compute-apps fields and table titles, and the Prometheus
// metric names, types and help texts. Adding a counter is one row here plus the code that
// counts it in the interposer.
//
//   X(field, json, query, column, metric, type, unit, shown, help)   stored in the ring
//   D(field, json, query, column, metric, type, unit, shown, help)   derived by the daemon
//
//   field   the DeviceSlot member (stored rows) and the snapshot's name for it
//   json    key in each device entry of the state JSON ("ooms" is the public name of
//           `refusals`: public names never change)
//   query   --query-compute-apps field name ("" = none)
//   column  title when a table shows it
//   metric  Prometheus name after "cuwarden_" (ARCHITECTURE.md names the first ones);
//           counters end in _total (in bytes: _bytes_total), gauges in bytes in _bytes
//   type    gauge or counter (Prometheus)
//   unit    bytes or count
//   shown   plain; held (0 once the process exited: the driver freed what it held);
//           cap (null when kNoLimit: no cap)
//
// Ring ABI rule for stored rows (ring.hpp, kAbiVersion): a new row goes at the end of the
// stored rows, taking a reserved word, which older writers left zero, so a counter the
// writer does not know reads 0; rows are never removed, reordered or given another meaning
// (that needs a new kAbiVersion, which the daemon then reads beside the old one).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#define CUW_DEVICE_COUNTERS(X, D)                                                                                      \
  X(used, "used_bytes", "used_memory", "Used", "process_memory_used_bytes", gauge, bytes, held,                        \
    "Bytes counted against the cap right now")                                                                         \
  X(peak, "peak_bytes", "peak_memory", "Peak", "process_memory_peak_bytes", gauge, bytes, plain,                      \
    "High-water mark of used bytes")                                                                                   \
  X(limit, "limit_bytes", "limit", "Cap", "process_memory_limit_bytes", gauge, bytes, cap,                             \
    "The process's cap on the device (absent when uncapped)")                                                          \
  X(reserved, "reserved_bytes", "reserved_memory", "Reserved", "process_memory_reserved_bytes", gauge, bytes, held,   \
    "Bytes the process holds from the driver (at least used bytes with a pool)")                                       \
  X(live_allocations, "allocations", "allocations", "Allocs", "process_allocations", gauge, count, plain,              \
    "Allocations not yet freed")                                                                                       \
  X(alloc_count, "alloc_count", "alloc_count", "Allocs made", "allocations_total", counter, count, plain,              \
    "Successful allocations")                                                                                          \
  X(free_count, "free_count", "free_count", "Frees", "frees_total", counter, count, plain, "Frees")                    \
  X(refusals, "ooms", "ooms", "OOMs", "ooms_total", counter, count, plain,                                             \
    "Allocations refused by a process or job cap (out-of-memory errors cuwarden caused)")                                           \
  X(driver_errors, "driver_errors", "driver_errors", "Driver errors", "driver_errors_total", counter, count,           \
    plain, "Allocations the driver itself failed")                                                                     \
  X(host_bytes, "host_bytes", "host_memory", "Host", "process_host_memory_bytes", gauge, bytes, held,                 \
    "Pinned host memory allocated through the device's context")                                                       \
  X(cached, "cached_bytes", "cached_memory", "Cached", "process_memory_cached_bytes", gauge, bytes, held,             \
    "Bytes a pooling backend holds that no allocation of the program uses (part of used bytes)")                       \
  D(in_use, "in_use_bytes", "in_use_memory", "In use", "process_memory_in_use_bytes", gauge, bytes, held,              \
    "Bytes the program's allocations hold: used bytes less what the pool caches")                                      \
  X(pool_hits, "pool_hits", "pool_hits", "Pool hits", "pool_hits_total", counter, count, plain,                        \
    "Allocations a pooling backend served without calling the driver")                                                 \
  X(pool_waits, "pool_waits", "pool_waits", "Pool waits", "pool_waits_total", counter, count, plain,                   \
    "Times a pooling backend waited for earlier GPU work")                                                             \
  X(context_bytes, "context_bytes", "context_memory", "Context", "process_memory_context_bytes", gauge, bytes, held,  \
    "With CUWARDEN_CAP_SCOPE=process: the driver's memory for the context and modules, part of used bytes")            \
  X(pool_free, "pool_free_bytes", "pool_free_memory", "Pool free", "process_pool_free_bytes", gauge, bytes, held,      \
    "Of a pooling backend's cached bytes, its free blocks for large requests (over 1 MiB; vmm: any piece)")            \
  X(pool_largest_free, "pool_largest_free_bytes", "pool_largest_free_memory", "Largest free",                          \
    "process_pool_largest_free_bytes", gauge, bytes, held,                                                            \
    "The largest request a pooling backend serves from its free blocks (vmm: their whole granules, stitched)")     \
  X(managed_allocs, "managed_allocations", "managed_allocations", "Managed", "managed_allocations_total",     \
    counter, count, plain, "Managed-memory allocations made (the checkpoint API cannot carry them: no suspend)")      \
  X(ipc_handles, "ipc_handles", "ipc_handles", "IPC", "ipc_handles_total", counter, count, plain,             \
    "CUDA IPC handles made or opened (the checkpoint API cannot carry them: no suspend)")                           \
  X(shared_handles, "shared_handles", "shared_handles", "Shared", "shared_handles_total", counter, count, plain,      \
    "cuMem allocations made exportable as shareable handles, or imported from one (the checkpoint API cannot carry " \
    "them: no suspend)")                                                                                               \
  X(mps_client, "mps_client", "mps_client", "MPS", "process_mps_client", gauge, count, plain,                          \
    "1 when the process's contexts on the device go through an MPS server (the checkpoint API cannot carry an MPS "  \
    "client: no suspend)")                                                                                            \
  X(pool_driver_allocs, "pool_driver_allocations", "pool_driver_allocations", "Pool driver allocs",                   \
    "pool_driver_allocations_total", counter, count, plain,                                                            \
    "Driver calls a pooling backend made to take memory: cuMemAlloc (cache); cuMemCreate and cuMemMap (vmm)")        \
  X(pool_driver_frees, "pool_driver_frees", "pool_driver_frees", "Pool driver frees", "pool_driver_frees_total",      \
    counter, count, plain,                                                                                             \
    "Driver calls a pooling backend made to give memory back: cuMemFree (cache); cuMemUnmap and cuMemRelease (vmm)")

namespace cuw::counters {

enum class Unit : uint8_t { bytes, count };
enum class Type : uint8_t { gauge, counter };
enum class Shown : uint8_t { plain, held, cap };

/// What one row of a counter list says (see the top of this file).
struct Info {
  std::string_view field, json, query, column, metric;
  Type type;
  Unit unit;
  Shown shown;
  bool stored;  ///< in the ring (X rows); false: derived by the daemon (D rows)
  std::string_view help;
};

/// Expand a list into Info rows: `constexpr Info rows[] = {LIST(CUW_COUNTER_INFO_X, CUW_COUNTER_INFO_D)};`
#define CUW_COUNTER_INFO_(stored, f, j, q, c, m, t, u, s, h)                                                      \
  ::cuw::counters::Info{#f, j, q, c, m, ::cuw::counters::Type::t, ::cuw::counters::Unit::u, ::cuw::counters::Shown::s, \
                        stored, h},
#define CUW_COUNTER_INFO_X(...) CUW_COUNTER_INFO_(true, __VA_ARGS__)
#define CUW_COUNTER_INFO_D(...) CUW_COUNTER_INFO_(false, __VA_ARGS__)
#define CUW_COUNTER_NONE_(...)
#define CUW_COUNTER_ONE_(...) +1

/// Every row of CUW_DEVICE_COUNTERS, in order.
inline constexpr Info kDevice[] = {CUW_DEVICE_COUNTERS(CUW_COUNTER_INFO_X, CUW_COUNTER_INFO_D)};
inline constexpr std::size_t kDeviceCount = std::size(kDevice);
/// Rows stored in the ring.
inline constexpr std::size_t kDeviceStored = 0 CUW_DEVICE_COUNTERS(CUW_COUNTER_ONE_, CUW_COUNTER_NONE_);

/// Index of each row in kDevice: `Id::used` ... (snapshots keep their values in this order).
#define CUW_COUNTER_ID_(f, ...) f,
enum class Id : std::size_t { CUW_DEVICE_COUNTERS(CUW_COUNTER_ID_, CUW_COUNTER_ID_) };
#undef CUW_COUNTER_ID_

/// The Prometheus name of a row: "cuwarden_" + metric.
inline constexpr std::string_view kMetricPrefix = "cuwarden_";

}  // namespace cuw::counters

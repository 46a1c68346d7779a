// cuwarden daemon view: one device's counters as state JSON keys (see device_counters.hpp).
// Kept apart from state_json.cpp: this block follows the ring's counter list, the rest of
// the state does not.
#include "views/device_counters.hpp"

namespace cuw::daemon {

void put_device_counters(nlohmann::ordered_json& dev, const DeviceSnapshot& ds, bool exited) {
  using json = nlohmann::ordered_json;
  // An exited process holds nothing: the driver freed its memory at its exit, whatever
  // the counters said last (a program that leaves its frees to the driver's teardown).
  dev["used_bytes"] = exited ? 0 : ds.used;
  dev["peak_bytes"] = ds.peak;
  dev["limit_bytes"] = ds.limit == ring::kNoLimit ? json(nullptr) : json(ds.limit);
  dev["reserved_bytes"] = ds.reserved;
  dev["allocations"] = ds.live_allocations;
  dev["alloc_count"] = ds.alloc_count;
  dev["free_count"] = ds.free_count;
  dev["ooms"] = ds.refusals;
  dev["driver_errors"] = ds.driver_errors;
  dev["host_bytes"] = ds.host_bytes;
  // CUWARDEN_POOL=cache: of used_bytes (= reserved_bytes), what the pool keeps for reuse
  // and what the program's allocations hold. Hostile input: never underflow.
  dev["cached_bytes"] = ds.cached;
  dev["in_use_bytes"] = exited || ds.cached >= ds.used ? 0 : ds.used - ds.cached;
  dev["pool_hits"] = ds.pool_hits;
  dev["pool_waits"] = ds.pool_waits;
  // CUWARDEN_CAP_SCOPE=process: the driver's own memory for the process (context,
  // modules) as the interposer last measured it, inside used_bytes; 0 otherwise.
  dev["context_bytes"] = ds.context_bytes;
}

}  // namespace cuw::daemon

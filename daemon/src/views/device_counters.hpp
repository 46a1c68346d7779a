// cuwarden daemon view: one device's counters as state JSON keys.
#pragma once

#include <nlohmann/json.hpp>

#include "ring_view.hpp"

namespace cuw::daemon {

/// Append the counter keys of one device of a process to `dev`, "used_bytes" through
/// "context_bytes", in the documented order. `exited`: the process is gone, so what it
/// held reads 0 (the driver freed its memory at exit). Pure; thread-safe on distinct `dev`.
void put_device_counters(nlohmann::ordered_json& dev, const DeviceSnapshot& ds, bool exited);

}  // namespace cuw::daemon

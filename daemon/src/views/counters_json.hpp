// cuwarden daemon view: a device's counters as state JSON keys, generated from a counter list
// (counters.hpp), so that a row added there appears here with no other change.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "cuw/counters.hpp"
#include "cuw/ring.hpp"

namespace cuw::daemon {

/// Append one key per row of `rows` to `dev`, in the list's order, with `values` (the
/// snapshot's values(): bytes or counts). `exited`: the process is gone, so rows shown as
/// `held` read 0 (the driver freed what it held); rows shown as `cap` read null when
/// ring::kNoLimit (no cap). Pure; thread-safe on distinct `dev`.
template <std::size_t N>
void put_counters(nlohmann::ordered_json& dev, const counters::Info (&rows)[N], const std::array<uint64_t, N>& values,
                  bool exited) {
  for (std::size_t i = 0; i < N; ++i) {
    nlohmann::ordered_json& out = dev[std::string(rows[i].json)];
    switch (rows[i].shown) {
      case counters::Shown::held: out = exited ? 0 : values[i]; break;
      case counters::Shown::cap:
        out = values[i] == ring::kNoLimit ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(values[i]);
        break;
      case counters::Shown::plain: out = values[i]; break;
    }
  }
}

}  // namespace cuw::daemon

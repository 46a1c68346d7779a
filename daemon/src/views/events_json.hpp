// cuwarden daemon view: the event list (get_events, `cuwarden events`) from a State.
#pragma once

#include <nlohmann/json.hpp>

#include "model/state.hpp"

namespace cuw::daemon {

/// `request`: {"pid"?, "after"?, "max"?}. Without "after", the newest `max` events (default
/// 1000, clamped to 1..100000); with it, the oldest `max` events numbered above it. Reply:
/// {"events":[...], "next":SEQ, "latest":SEQ}. Throws std::invalid_argument for a malformed
/// request. Reads `st` (and user names, through base's thread-safe cache); any thread.
nlohmann::ordered_json events_json(const State& st, const nlohmann::json& request);

}  // namespace cuw::daemon

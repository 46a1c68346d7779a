// cuwarden daemon views: the suspend and resume commands' requests and replies as JSON
// (protocol.hpp, kSuspendKeys and the rows of suspend and resume).
#pragma once

#include <nlohmann/json.hpp>

#include "model/suspend.hpp"

namespace cuw::daemon {

/// The request in `body` (its key types already checked against the command's row), its
/// values checked. Throws std::invalid_argument with the reason a client is told.
SuspendRequest parse_suspend_request(const nlohmann::json& body, SuspendRequest::Action action);

/// The reply of a request that was carried out (outcome done). Pure.
nlohmann::ordered_json suspend_reply_json(const SuspendResult& r);

/// The error body of one that was not: {"error": "refused: ...", "refused": true} or
/// {"error": "..."}. Pure.
nlohmann::json suspend_error_json(const SuspendResult& r);

}  // namespace cuw::daemon

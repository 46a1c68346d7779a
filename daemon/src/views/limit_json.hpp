// cuwarden daemon view: set_limit on the wire — its request body as the model's LimitRequest,
// and a LimitResult as the reply (a change) or the error body (a refusal, a failure).
#pragma once

#include <nlohmann/json.hpp>

#include "model/control.hpp"

namespace cuw::daemon {

/// The request body of set_limit (protocol.hpp, kSetLimitKeys) as a LimitRequest. Throws
/// std::invalid_argument with the text that follows "bad request: " in the reply: the
/// table's text for a key of the wrong type or out of range, the one_of pair's for a missing
/// or doubled target or size, and the rules across keys (device and share with pid only,
/// user with job only, a valid job name). Pure; any thread.
LimitRequest parse_limit_request(const nlohmann::json& body);

/// The reply body of a change (r.outcome == changed): the pid or job shape protocol.hpp's
/// set_limit row gives, caps in bytes, null for none. Pure; any thread.
nlohmann::ordered_json limit_reply_json(const LimitResult& r);

/// The error body of a refusal, {"error": "refused: <why>", "refused": true}, or of a
/// failure, {"error": "<why>"}. Pure; any thread.
nlohmann::json limit_error_json(const LimitResult& r);

}  // namespace cuw::daemon

// cuwarden daemon: one request of the unix-socket protocol -> one reply. Split from main.cpp
// so that tests and the fuzzers (tests/fuzz) call exactly what the daemon runs.
#pragma once

#include <cstdint>
#include <string>

#include "registry.hpp"
#include "server.hpp"

namespace cuw::daemon {

/// Answer `command` (a proto::Command value) with `body` (untrusted JSON, possibly empty)
/// from `peer` (its SO_PEERCRED credentials decide what set_limit may do).
/// Never throws for bad input: malformed requests get a Command::error reply; a refusal
/// by the authorization rules is {"error": "refused: ...", "refused": true}.
Server::Reply handle_request(Registry& reg, const Peer& peer, uint16_t command, const std::string& body);

}  // namespace cuw::daemon

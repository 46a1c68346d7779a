// cuwarden daemon transport: one request of the protocol -> one reply. The request is
// parsed and checked against its command's row of the protocol's command table
// (cuw/protocol.hpp: key types, one_of pairs, privileged) before anything reads it, then
// dispatched through the daemon's table (commands/table.hpp), whose handler answers it.
// Split from the socket code so that tests and the fuzzers (tests/fuzz) run the same
// dispatch; they reach the model directly (the Registry& overload), not through the loop
// thread's queue.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "commands/backend.hpp"
#include "cuw/protocol.hpp"
#include "model/peer.hpp"
#include "model/registry.hpp"
#include "transports/server.hpp"

namespace cuw::daemon {

/// Whether `v` is one of `type`'s JSON types, a RequestKey::type of protocol.hpp ("uint",
/// "number", "string", "null", '|'-separated; "uint" is an integer >= 0). An unknown type
/// word matches nothing. Pure.
bool fits_type(std::string_view type, const nlohmann::json& v);

/// "" when `body` fits `info`'s row of the command table, else what the reply says after
/// "bad request: ". A row with no keys and no one_of takes any body; otherwise the body is
/// an object, each one_of pair has exactly one key present, and each key of the row that is
/// present (or required) has one of its types, checked in the row's order. Keys not in the
/// row are ignored (the protocol's version rule). Pure.
std::string check_request(const proto::CommandInfo& info, const nlohmann::json& body);

/// Whether `command` may take seconds (its row of commands/table.cpp says so: get_snapshot,
/// get_ooms name frames in a worker process): the server runs it on its pool, never on the
/// thread that answers limits and state. Pure.
bool slow_command(uint16_t command) noexcept;

/// Answer `command` (a proto::Command value) with `body` (untrusted JSON, possibly empty)
/// from `peer` (its SO_PEERCRED credentials decide what set_limit may do).
/// Never throws for bad input: malformed requests get a Command::error reply; a refusal
/// by the authorization rules is {"error": "refused: ...", "refused": true}.
/// Thread-safety: whatever backend.set_limit allows; the rest reads only the store.
Server::Reply handle_request(const Backend& backend, const Peer& peer, uint16_t command, const std::string& body);

/// The same, single-threaded, straight on `reg` (tests, fuzzers): a query publishes first,
/// so that it sees the rings as they are now; get_history answers from that one State.
/// `symbolize`: how frames are named (null: they keep their addresses).
Server::Reply handle_request(Registry& reg, const Peer& peer, uint16_t command, const std::string& body,
                             const SymbolizeOptions* symbolize = nullptr);

}  // namespace cuw::daemon

// cuwarden daemon transport: one request of the protocol -> one reply, dispatched through
// the protocol's command table (cuw/protocol.hpp): a request is checked against its
// command's row (key types, one_of pairs) before anything reads it. Queries are answered
// from a published State on the caller's thread; changes go to the model through
// Backend::set_limit.
// Split from the socket code so that tests and the fuzzers (tests/fuzz) run the same
// dispatch; they reach the model directly (the Registry& overload), not through the loop
// thread's queue.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "cuw/protocol.hpp"
#include "model/control.hpp"
#include "model/peer.hpp"
#include "model/registry.hpp"
#include "model/series.hpp"
#include "model/state.hpp"
#include "model/symbolize_worker.hpp"
#include "transports/server.hpp"

namespace cuw::daemon {

/// What a transport needs from the daemon.
struct Backend {
  /// The published States (read-only, any thread).
  const StateStore* store = nullptr;
  /// Called before a query: makes the store hold a State built after this call began (the
  /// socket promises counters as they are at the query). Empty: the last State will do.
  std::function<void()> refresh;
  /// Registry::set_limit run where the model lives (the loop thread); what it throws
  /// becomes an error reply. Empty: this transport carries no privileged command.
  std::function<LimitResult(const Peer&, const LimitRequest&)> set_limit;
  /// How snapshots' native frames are named (in a worker process). Null: frames keep their
  /// addresses.
  const SymbolizeOptions* symbolize = nullptr;
  /// The history (thread-safe). Null: get_history says there is none.
  const SeriesStore* series = nullptr;
};

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

/// Whether `command` may take seconds (it names frames in a worker process: get_snapshot,
/// get_ooms): the transports run it on their pool, never on the thread that answers limits
/// and state. Pure.
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

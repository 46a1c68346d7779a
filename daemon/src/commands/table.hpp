// cuwarden daemon commands: the one table of commands and HTTP routes. A transport frames
// bytes, authenticates its caller, then dispatches here: the socket by command number (its
// request already checked against the command's row of proto::kCommands), HTTP by path.
// The row's entry reads the arguments and calls the command's handler (handlers.hpp).
//
// How to add a command (protocol.hpp's recipe has the protocol's side):
//   1. its handler in handlers.hpp and one of this folder's files: arguments as values, their
//      values checked (bad_value words a refusal for each transport), the view picked;
//   2. its row in table.cpp's kRows, with an entry that reads its kCommands keys from the
//      body; for HTTP too, a row in kRoutes with an entry that reads the path and query;
//   3. nothing in transports/: they dispatch through these tables.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "commands/answer.hpp"
#include "commands/backend.hpp"
#include "cuw/protocol.hpp"
#include "model/peer.hpp"

namespace cuw::daemon {

/// One command of the socket protocol, beside its row of proto::kCommands.
struct CommandRow {
  proto::Command command;
  /// May take seconds (names frames in a worker process): the transport runs it on its
  /// pool, never on the thread that answers limits and state.
  bool slow;
  /// Answers `request`, a body that fits the command's kCommands row, from `peer`.
  Answer (*socket)(const Backend& b, const Peer& peer, const nlohmann::json& request);
};

/// What a route's entry reads of an HTTP request.
struct RouteRequest {
  std::optional<uint32_t> pid;                     ///< the path's PID (a route with "{pid}")
  const std::map<std::string, std::string>* query;  ///< decoded query parameters
};

/// One path of the HTTP API (docs/http.md) answered by a command's handler.
struct Route {
  std::string_view path;  ///< exact, or with one "{pid}" segment: a process id
  bool slow;              ///< as CommandRow::slow
  /// Shows a program's code paths, files and functions: HTTP, which cannot tell who asks,
  /// serves it only where the daemon was told to (--http-snapshots).
  bool shows_code;
  Answer (*http)(const Backend& b, const RouteRequest& request);
};

/// The row of command number `number`; null when there is none. Every kCommands row has
/// one (tests/integration/protocol_tests.cpp sends each command through the socket's
/// dispatch, where a missing row answers "unknown command"). Pure.
const CommandRow* find_command_row(uint16_t number) noexcept;

/// Every route, in docs/http.md's order. Pure.
std::span<const Route> routes() noexcept;

/// A route that `path` matches, and its pid.
struct RouteMatch {
  const Route* route = nullptr;  ///< null: no route has this shape
  std::optional<uint32_t> pid;   ///< the "{pid}" segment, when it is a process id
};
/// The route of `table` whose shape `path` has, segment by segment: each literal segment the
/// same, and "{pid}" one segment of any text, .pid when that text is a process id (the
/// caller answers 404 when not). Where several match, the one with the most literal
/// segments wins, whatever their order. Pure.
RouteMatch match_route(std::span<const Route> table, std::string_view path) noexcept;
/// match_route over routes(). Pure.
RouteMatch match_route(std::string_view path) noexcept;

}  // namespace cuw::daemon

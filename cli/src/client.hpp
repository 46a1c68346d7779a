// cuwarden CLI: asking the daemon, and saying plainly when there is none.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "cuw/protocol.hpp"

namespace cuw::cli {

/// Exit codes shared by the commands.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;   ///< no daemon, daemon error
inline constexpr int kExitUsage = 2;     ///< bad arguments (sizes, fields, ...)
inline constexpr int kExitRefused = 3;   ///< the daemon refused a control request (not allowed)

/// Why ask() failed, for commands whose exit status depends on it.
struct AskError {
  bool refused = false;     ///< the daemon's authorization rules said no
  bool no_daemon = false;   ///< nothing answered at the socket
  bool quiet_no_daemon = false;  ///< in: print nothing when nothing answers (the caller waits)
  /// in: print nothing at all (a full-screen view shows `message` in its own lines instead).
  bool quiet = false;
  std::string message;  ///< out: the reason, as it would have been printed (without "cuwarden: ")
};

/// Send one request. On success returns the reply body; otherwise prints the reason to
/// stderr ("no daemon is running ..." or the daemon's error) and returns nullopt.
/// A refusal by the authorization rules is printed as "cuwarden: refused: ...".
/// `timeout_ms`: how long to wait for the reply (a suspend waits for the driver).
std::optional<nlohmann::ordered_json> ask(const std::string& socket, proto::Command cmd, const nlohmann::ordered_json& body,
                                          AskError* error = nullptr, int timeout_ms = 10000);

}  // namespace cuw::cli

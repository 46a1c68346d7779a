// cuwarden daemon commands: one handler per command. Each takes its arguments as values
// (the transport's entry in table.cpp has read them from a JSON body or a query string),
// checks their values, reads the model and picks the view; `via` says how to word the
// answer. Queries read the published State only, so any thread may call them; set_limit
// goes through Backend::set_limit.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "commands/answer.hpp"
#include "commands/backend.hpp"
#include "model/peer.hpp"

namespace cuw::daemon {

/// get_snapshot's arguments (protocol.hpp kGetSnapshotKeys; HTTP: the path's pid and the
/// format and top parameters).
struct SnapshotArgs {
  uint64_t pid = 0;
  std::optional<std::string> format;  ///< absent: text on the socket, json over HTTP
  std::optional<uint64_t> top;        ///< call sites and allocations listed (HTTP: 1..100000)
  std::optional<uint64_t> oom;        ///< the snapshot of the process's report this many back
  bool leaks = false;                 ///< the call sites that only grew instead (text or json)
  bool full = false;                  ///< text: every frame of a call site, not its printed form
  std::optional<uint64_t> leak_warmup_s;  ///< leaks: samples this long after the first allocation left out
  std::optional<uint64_t> since_s;    ///< what changed since the sample this many seconds back instead
  /// How call sites are grouped: "user" (absent: the same) merges those whose user frames
  /// are equal (views/snapshot_views.hpp merge_sites_by_user_frames), "native" keeps one per
  /// native stack, as captured; anything else is refused.
  std::optional<std::string> by;
};

/// The snapshot of process `args.pid` (or of one of its out-of-memory reports), its frames
/// named, in the format asked for. `who`: the caller, who sees only the processes it owns
/// (root: all) and numbers them in its own pid namespace; null: a transport that has already
/// allowed its caller every process of the daemon's namespace (HTTP with --http-snapshots).
/// May take seconds (naming frames in a worker process).
Answer get_snapshot(const Backend& b, const Peer* who, const SnapshotArgs& args, Via via);

/// The out-of-memory reports `peer` may see (of `pid` only, when given), oldest first, each
/// with its call sites named. May take seconds.
Answer get_ooms(const Backend& b, const Peer& peer, std::optional<uint32_t> pid);

/// The state document (views/state_json.hpp).
Answer get_state(const Backend& b, Via via);

/// The memory events `request` asks for (views/events_json.hpp).
Answer get_events(const Backend& b, const nlohmann::json& request);

/// get_history's arguments.
struct HistoryArgs {
  std::optional<uint64_t> pid;       ///< one process only (1..2^31-1)
  std::optional<std::string> range;  ///< "hour" (default) or "day"
};
/// The history document, of every process or of `args.pid`.
Answer get_history(const Backend& b, const HistoryArgs& args, Via via);

/// Change a cap as `peer` asks in `request` (a body that fits set_limit's row), on the
/// model's thread; a refusal carries the reason in its body.
Answer set_limit(const Backend& b, const Peer& peer, const nlohmann::json& request);

/// Suspend or resume (`action`) as `peer` asks in `request` (a body that fits the command's
/// row), through Backend::suspend; a refusal carries the reason in its body. May take seconds.
Answer suspend(const Backend& b, const Peer& peer, const nlohmann::json& request, SuspendRequest::Action action);

/// Make room for the asking process (`peer`, its own interposer) as `request` (a body that fits
/// room's row) says, through Backend::room: {"granted", "reason", "shortfall_bytes",
/// "suspended"}. May take up to the requester's room_wait.
Answer room(const Backend& b, const Peer& peer, const nlohmann::json& request);

/// Prometheus' text exposition of the State (views/metrics_text.hpp).
Answer metrics(const Backend& b);

}  // namespace cuw::daemon
